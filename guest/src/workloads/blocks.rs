//! A job over a range of 4 KiB blocks: write the pattern, or read it back and check it, counting
//! each request's outcome. What the fault and durability workloads share.

use super::blkdev::{check_pattern, fill_pattern};
use super::pipeline::Job;
use crate::virtio::blk::{SECTOR_SIZE, S_IOERR, S_OK, T_FLUSH, T_IN, T_OUT};

pub const BLOCK_BYTES: u32 = 4096;
pub const SECTORS_PER_BLOCK: u64 = BLOCK_BYTES as u64 / SECTOR_SIZE;
/// What a read buffer holds before the device fills it, so a read that writes nothing cannot
/// pass the check with stale data.
const POISON: u8 = 0x5a;

/// Outcomes by status byte.
#[derive(Clone, Copy, Default)]
pub struct Outcomes {
    pub ok: u64,
    /// VIRTIO_BLK_S_IOERR.
    pub ioerr: u64,
    /// Any other status (UNSUPP, or a byte the device never wrote).
    pub other: u64,
    /// Reads answered OK whose data is not the pattern.
    pub mismatches: u64,
}

impl Outcomes {
    pub fn count(&mut self, status: u8) {
        match status {
            S_OK => self.ok += 1,
            S_IOERR => self.ioerr += 1,
            _ => self.other += 1,
        }
    }

    pub fn add(&mut self, other: &Outcomes) {
        self.ok += other.ok;
        self.ioerr += other.ioerr;
        self.other += other.other;
        self.mismatches += other.mismatches;
    }
}

/// Request `index` writes (`Op::Write`) or reads and checks (`Op::Check`) block `first + index`
/// with the pattern of `seed`; `Op::Flush` is a single FLUSH.
pub struct Blocks {
    pub op: Op,
    pub first: u64,
    pub seed: u64,
    pub outcomes: Outcomes,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Write,
    Check,
    Flush,
}

impl Blocks {
    pub fn new(op: Op, first: u64, seed: u64) -> Blocks {
        Blocks { op, first, seed, outcomes: Outcomes::default() }
    }

    fn sector(&self, index: u64) -> u64 {
        (self.first + index) * SECTORS_PER_BLOCK
    }
}

impl Job for Blocks {
    fn prepare(&mut self, index: u64, buffer: &mut [u8]) -> (u32, u64, u32) {
        let sector = self.sector(index);
        let data = &mut buffer[..BLOCK_BYTES as usize];
        match self.op {
            Op::Write => fill_pattern(self.seed, sector, data),
            Op::Check => data.fill(POISON),
            Op::Flush => return (T_FLUSH, 0, 0),
        }
        let kind = if self.op == Op::Write { T_OUT } else { T_IN };
        (kind, sector, BLOCK_BYTES)
    }

    fn complete(&mut self, index: u64, status: u8, buffer: &[u8]) {
        self.outcomes.count(status);
        let sector = self.sector(index);
        if status == S_OK
            && self.op == Op::Check
            && !check_pattern(self.seed, sector, &buffer[..BLOCK_BYTES as usize])
        {
            self.outcomes.mismatches += 1;
        }
    }
}
