//! `probe.workload=blk-hostile`: the probe plays the misbehaving guest. It submits, one at a
//! time, requests and queue states that break the virtio rules, and reports per case what the
//! device did: the request's status byte, the device's Status register, whether it raised a
//! configuration-change interrupt (`config_interrupt`), and an outcome
//! (`ok`, `ioerr`, `unsupp`, `no_status` for a completion that left the status byte alone,
//! `bad_status`, `needs_reset`, `no_response`). The VMM's tests judge whether each outcome is
//! right; this workload only has to survive them all. After a case that broke the device, and
//! always after an avail index jump or a head offered twice (`duplicate_head`), it resets the
//! device and sets it up again. At the end, 100 valid requests (writes read back,
//! or reads on a read-only disk) must succeed.
//!
//! Parameters: those of every block workload (`blkdev::Common`) but `probe.indirect`: the cases
//! write direct chains into the ring, so the valid requests use them too; `probe.timeout_ms=`
//! bounds each case (default 2000).

use super::blkdev::{self, check_pattern, fill_pattern, Common, XorShift};
use super::hostile::{self, Observed, Offer, Target, OUTSIDE_RAM, WRAPPING};
use super::pipeline::{self, Job, Limit};
use crate::json::{OrNull, Str};
use crate::virtio::blk::{
    BlockDevice, HEADER_LEN, SECTOR_SIZE, STATUS_UNWRITTEN, S_IOERR, S_OK, S_UNSUPP, T_IN, T_OUT,
};
use crate::virtio::mmio::Transport;
use crate::virtio::queue::{Descriptor, SplitQueue, DESC_F_NEXT, DESC_F_WRITE};
use crate::{println, Env};
use probe_abi::status;

const PROBE: &str = "blk-hostile";
const TIMEOUT_MS: u64 = 2000;
const BLOCK: u32 = 4096;
const VALID_REQUESTS: u64 = 100;
/// The one slot the cases use.
const SLOT: usize = 0;
const UNKNOWN_TYPE: u32 = 0x1234;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Case {
    AddrOutsideRam,
    AddrLenWraps,
    DescriptorLoop,
    ShortHeader,
    StatusReadOnly,
    WriteReadOnlyDisk,
    SectorPastEnd,
    AvailIndexJump,
    UnknownType,
    DuplicateHead,
}

const CASES: [Case; 10] = [
    Case::AddrOutsideRam,
    Case::AddrLenWraps,
    Case::DescriptorLoop,
    Case::ShortHeader,
    Case::StatusReadOnly,
    Case::WriteReadOnlyDisk,
    Case::SectorPastEnd,
    Case::AvailIndexJump,
    Case::UnknownType,
    Case::DuplicateHead,
];

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::AddrOutsideRam => "addr_outside_ram",
            Case::AddrLenWraps => "addr_len_wraps",
            Case::DescriptorLoop => "descriptor_loop",
            Case::ShortHeader => "short_header",
            Case::StatusReadOnly => "status_read_only",
            Case::WriteReadOnlyDisk => "write_read_only_disk",
            Case::SectorPastEnd => "sector_past_end",
            Case::AvailIndexJump => "avail_index_jump",
            Case::UnknownType => "unknown_type",
            Case::DuplicateHead => "duplicate_head",
        }
    }

    fn offer(self) -> Offer {
        match self {
            Case::AvailIndexJump => Offer::AvailIndexJump,
            Case::DuplicateHead => Offer::HeadTwice,
            _ => Offer::Head,
        }
    }
}

/// The cases go on the request queue.
impl Target for BlockDevice {
    fn queue(&mut self) -> &mut SplitQueue {
        self.queue_mut()
    }

    fn transport(&self) -> &Transport {
        BlockDevice::transport(self)
    }

    fn notify(&mut self) {
        BlockDevice::notify(self);
    }
}

/// What the device did with the case, given the status byte it left at the first completion.
fn outcome(observed: &Observed, status_byte: u8) -> &'static str {
    if observed.needs_reset() {
        return "needs_reset";
    }
    match (observed.used, status_byte) {
        (None, _) => "no_response",
        (Some(_), S_OK) => "ok",
        (Some(_), S_IOERR) => "ioerr",
        (Some(_), S_UNSUPP) => "unsupp",
        (Some(_), STATUS_UNWRITTEN) => "no_status",
        (Some(_), _) => "bad_status",
    }
}

/// Write `descriptors` from index 0, each pointing at the next unless it says otherwise.
fn write_chain(dev: &mut BlockDevice, descriptors: &[Descriptor]) {
    for (i, d) in descriptors.iter().enumerate() {
        let next = if d.flags & DESC_F_NEXT != 0 && d.next == 0 { i as u16 + 1 } else { d.next };
        dev.queue_mut().set_descriptor(i as u16, Descriptor { next, ..*d });
    }
}

/// Build and publish the case's request (head 0) and notify the device.
fn submit_case(dev: &mut BlockDevice, case: Case) {
    let header = dev.header_addr(SLOT);
    let buffer = dev.buffer_addr(SLOT);
    let status = dev.status_addr(SLOT);
    let capacity = dev.disk.capacity_sectors;
    let d = |addr, len, flags| Descriptor { addr, len, flags, next: 0 };
    let header_d = d(header, HEADER_LEN, DESC_F_NEXT);
    let read_into = |addr, len| d(addr, len, DESC_F_NEXT | DESC_F_WRITE);
    let status_d = d(status, 1, DESC_F_WRITE);
    let (kind, sector) = match case {
        Case::WriteReadOnlyDisk => (T_OUT, 0),
        Case::SectorPastEnd => (T_IN, capacity + 8),
        Case::UnknownType => (UNKNOWN_TYPE, 0),
        _ => (T_IN, 0),
    };
    dev.write_header(SLOT, kind, sector);
    match case {
        Case::AddrOutsideRam => write_chain(dev, &[header_d, read_into(OUTSIDE_RAM, BLOCK), status_d]),
        Case::AddrLenWraps => write_chain(dev, &[header_d, read_into(WRAPPING, 0x2000), status_d]),
        Case::DescriptorLoop => {
            // 0 -> 1 -> 0 -> ...: a chain longer than any queue. Both device-readable, so only
            // the length gives it away (not the order of readable and writable parts).
            let back = d(buffer, BLOCK, DESC_F_NEXT);
            dev.queue_mut().set_descriptor(0, Descriptor { next: 1, ..header_d });
            dev.queue_mut().set_descriptor(1, back);
        }
        Case::ShortHeader => {
            write_chain(dev, &[d(header, HEADER_LEN / 2, DESC_F_NEXT), read_into(buffer, BLOCK), status_d])
        }
        Case::StatusReadOnly => write_chain(dev, &[header_d, read_into(buffer, BLOCK), d(status, 1, 0)]),
        Case::WriteReadOnlyDisk => write_chain(dev, &[header_d, d(buffer, BLOCK, DESC_F_NEXT), status_d]),
        Case::SectorPastEnd | Case::UnknownType | Case::AvailIndexJump | Case::DuplicateHead => {
            write_chain(dev, &[header_d, read_into(buffer, BLOCK), status_d])
        }
    }
    hostile::publish(dev, case.offer());
}

/// Watch the case as `hostile::observe` does; returns also the status byte at the first
/// completion (a device that reruns the chain may rewrite it later).
fn observe(dev: &mut BlockDevice, env: &Env, common: &Common) -> (Observed, u8) {
    let mut status_byte = STATUS_UNWRITTEN;
    let observed =
        hostile::observe(dev, common.deadline(env), env.tsc_khz, |dev| status_byte = dev.status_byte(SLOT));
    (observed, status_byte)
}

fn report(case: Case, observed: &Observed, status_byte: u8, reset: bool) {
    let status = Some(status_byte).filter(|&s| observed.used.is_some() && s != STATUS_UNWRITTEN);
    println!(
        "{{\"probe\":\"blk-hostile\",\"case\":{},\"status\":{},\"device_status\":{},\"config_interrupt\":{},\"outcome\":{},\"used_id\":{},\"used_len\":{},\"used_count\":{},\"reset\":{}}}",
        Str(case.name()),
        OrNull(status),
        observed.device_status,
        observed.config_interrupt(),
        Str(outcome(observed, status_byte)),
        OrNull(observed.used_id()),
        OrNull(observed.used_len()),
        observed.used_count,
        reset
    );
}

/// Valid traffic after the abuse: each write is read back and checked (reads only on a
/// read-only disk).
struct ReadBack {
    seed: u64,
    rng: XorShift,
    blocks: u64,
    sector: u64,
    read_only: bool,
    mismatches: u64,
}

impl Job for ReadBack {
    fn prepare(&mut self, index: u64, buffer: &mut [u8]) -> (u32, u64, u32) {
        let buffer = &mut buffer[..BLOCK as usize];
        let write = index.is_multiple_of(2) && !self.read_only;
        if write || self.read_only {
            self.sector = self.rng.below(self.blocks) * (BLOCK as u64 / SECTOR_SIZE);
        }
        if write {
            fill_pattern(self.seed, self.sector, buffer);
            (T_OUT, self.sector, BLOCK)
        } else {
            buffer.fill(0);
            (T_IN, self.sector, BLOCK)
        }
    }

    fn complete(&mut self, index: u64, status: u8, buffer: &[u8]) {
        let checked = index % 2 == 1 && !self.read_only;
        if checked && status == S_OK && !check_pattern(self.seed, self.sector, &buffer[..BLOCK as usize]) {
            self.mismatches += 1;
        }
    }
}

pub fn run(env: &Env) -> u8 {
    let common = Common { indirect: false, ..blkdev::common_params(env, TIMEOUT_MS) };
    let mut dev = blkdev::open(env, PROBE, &common, BLOCK, 1);
    let mut resets = 0;
    for case in CASES {
        if case == Case::WriteReadOnlyDisk && !dev.disk.read_only {
            println!(
                "{{\"probe\":\"blk-hostile\",\"case\":{},\"skipped\":\"the disk is writable (no VIRTIO_BLK_F_RO)\"}}",
                Str(case.name())
            );
            continue;
        }
        submit_case(&mut dev, case);
        let (observed, status_byte) = observe(&mut dev, env, &common);
        let reset = observed.reset_needed(case.offer());
        report(case, &observed, status_byte, reset);
        if reset {
            resets += 1;
            if let Err(error) = dev.restart(common.deadline(env)) {
                blkdev::fail(PROBE, error, &dev);
            }
        }
    }
    valid_after(env, &common, &mut dev, resets)
}

fn valid_after(env: &Env, common: &Common, dev: &mut BlockDevice, resets: u32) -> u8 {
    let blocks = dev.disk.capacity_sectors / (BLOCK as u64 / SECTOR_SIZE);
    if blocks == 0 {
        println!("{{\"probe\":\"blk-hostile\",\"error\":\"the disk is smaller than one block\"}}");
        return status::FAILED;
    }
    let mut job = ReadBack {
        seed: common.seed,
        rng: XorShift::new(common.seed),
        blocks,
        sector: 0,
        read_only: dev.disk.read_only,
        mismatches: 0,
    };
    let result =
        pipeline::run(dev, &mut job, Limit::Requests(VALID_REQUESTS), None, env.tsc_khz, common.timeout_ms);
    let stats = result.unwrap_or_else(|error| blkdev::fail(PROBE, error, dev));
    let ok = stats.ops == VALID_REQUESTS && stats.errors == 0 && job.mismatches == 0;
    println!(
        "{{\"probe\":\"blk-hostile\",\"case\":\"valid_after\",\"completion\":{},\"ops\":{},\"errors\":{},\"mismatches\":{},\"resets\":{},\"outcome\":{}}}",
        Str(common.completion.name()),
        stats.ops,
        stats.errors,
        job.mismatches,
        resets,
        Str(if ok { "ok" } else { "failed" })
    );
    if ok {
        status::OK
    } else {
        status::FAILED
    }
}
