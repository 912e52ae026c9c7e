//! The contract between the probe guest (`guest/`, no_std) and the host side of exitless: the
//! test device's registers, the command-line parameters and the exit statuses.
#![deny(missing_docs)]
#![no_std]

/// Exit statuses the probe writes to the isa-debug-exit port. exitless turns a write of `V` into
/// process status `V`; QEMU reports `(V << 1) | 1`.
pub mod status {
    /// The workload ran to its end and found nothing wrong.
    pub const OK: u8 = 0;
    /// The workload ran and found something wrong (e.g. a verification mismatch).
    pub const FAILED: u8 = 1;
    /// A parameter on the command line was missing or malformed.
    pub const BAD_CMDLINE: u8 = 2;
    /// An unexpected exception or a panic in the probe.
    pub const CRASH: u8 = 3;
}

/// Command-line parameters.
pub mod param {
    /// Which workload to run (`hello`, `exitcost`, ...).
    pub const WORKLOAD: &str = "probe.workload";
    /// TSC frequency in kHz, given by the runner so the probe can report nanoseconds.
    pub const TSC_KHZ: &str = "probe.tsc_khz";
    /// Physical address of the exitless test device; absent under other VMMs.
    pub const TESTDEV: &str = "exitless.testdev";
}

/// exitless's test device: one page of MMIO registers that the `exitcost` workload uses to
/// measure exits and that lets the probe mark phases for exact exit accounting.
pub mod testdev {
    /// Where exitless maps it, in the 3-4 GiB hole (unassigned in QEMU's microvm map, so writes
    /// there exit to QEMU's user space too).
    pub const DEFAULT_BASE: u64 = 0xfe00_0000;
    /// Length of the register page, in bytes.
    pub const SIZE: u64 = 0x1000;
    /// Write: a plain exit to the VMM's user space, otherwise ignored.
    pub const USER_EXIT: u64 = 0x00;
    /// Write: an ioeventfd doorbell, completed inside KVM.
    pub const DOORBELL: u64 = 0x08;
    /// Write (64-bit): guest-physical address of a [`PingPong`] area; the VMM starts a host
    /// thread that answers every request there through shared memory.
    pub const PINGPONG: u64 = 0x10;
    /// Write (32-bit): a label; the VMM records a snapshot of the vCPU's exit statistics.
    pub const MARK: u64 = 0x18;
    /// Write (64-bit): like [`PINGPONG`], but the host thread answers each request with an
    /// interrupt on IOAPIC pin [`IRQ_PIN`] (through an irqfd) instead of an acknowledgement.
    pub const PINGPONG_IRQ: u64 = 0x20;
    /// The IOAPIC input the test device's interrupt arrives on.
    pub const IRQ_PIN: u32 = 5;

    // The ping-pong area: the guest writes a u32 sequence number at `PINGPONG_REQUEST`, the host
    // copies it to `PINGPONG_ACK` (each on its own cache line) or raises an interrupt.

    /// Byte offset in the ping-pong area of the guest's request (a u32 sequence number).
    pub const PINGPONG_REQUEST: u64 = 0;
    /// Byte offset in the ping-pong area where the host copies the request it answered, on a
    /// cache line of its own.
    pub const PINGPONG_ACK: u64 = 64;
    /// Length of the ping-pong area, in bytes; the VMM ignores an area not wholly in guest RAM.
    pub const PINGPONG_LEN: u64 = 128;
    /// The request that ends the host thread; it is always acknowledged at [`PINGPONG_ACK`], even
    /// under [`PINGPONG_IRQ`].
    pub const STOP: u32 = u32::MAX;

    // Request and acknowledgement on separate cache lines, both inside the area.
    const _: () = assert!(PINGPONG_ACK - PINGPONG_REQUEST >= 64 && PINGPONG_ACK + 4 <= PINGPONG_LEN);
}

/// How the host steers `probe.workload=blk-faults`: it writes these little-endian u64 words at
/// the start of sector 0 of the control disk, and the probe reads them between rounds of I/O.
pub mod fault_control {
    /// Word 0: set once the rest is valid.
    pub const MAGIC: u64 = 0x6578_6974_6c65_7373; // "exitless"
    /// Word 1: the step number; the probe starts a step whenever it changes.
    pub const STEP: usize = 1;
    /// Word 2: first 4 KiB block each round writes.
    pub const WRITE_FIRST: usize = 2;
    /// Word 3: number of 4 KiB blocks each round writes (0: none).
    pub const WRITE_BLOCKS: usize = 3;
    /// Word 4: first 4 KiB block each round reads back and checks.
    pub const READ_FIRST: usize = 4;
    /// Word 5: number of 4 KiB blocks each round reads back and checks (0: none).
    pub const READ_BLOCKS: usize = 5;
    /// The step that ends the workload.
    pub const STOP: u64 = u64::MAX;
    /// Number of words in the control block, [`MAGIC`] included.
    pub const WORDS: usize = 6;
}

/// How the host lets `probe.rw=verify` with `probe.gate_block=N` go on from writing to reading
/// back: it writes this little-endian u64 at the start of block N.
pub mod verify_gate {
    /// The value that opens the gate; anything else at the start of block N keeps it shut.
    pub const OPEN: u64 = 0x6e65_706f_6574_6167; // "gateopen"
}

/// The data the block workloads write and verify: the host checks a disk with the same function.
pub mod pattern {
    /// The unit the pattern is laid out in, in bytes: each sector's words depend on its number.
    pub const SECTOR_SIZE: u64 = 512;
    const WORDS_PER_SECTOR: u64 = SECTOR_SIZE / 8;

    /// The SplitMix64 mixing function, the pattern's source of pseudo-random words (not a
    /// cryptographic hash); the probe's workloads also use it for their other random values.
    pub fn splitmix64(x: u64) -> u64 {
        let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Word `word` (0..64) of sector `sector`: `splitmix64(seed * 0x9e3779b97f4a7c15 ^ (sector * 64
    /// + word))`, stored little-endian.
    pub fn word(seed: u64, sector: u64, word: u64) -> u64 {
        splitmix64(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (sector.wrapping_mul(WORDS_PER_SECTOR) + word))
    }

    /// Fill `buffer` (whole sectors) with the pattern of the sectors starting at `first_sector`.
    pub fn fill(seed: u64, first_sector: u64, buffer: &mut [u8]) {
        for (i, chunk) in buffer.chunks_exact_mut(8).enumerate() {
            let i = i as u64;
            chunk.copy_from_slice(
                &word(seed, first_sector + i / WORDS_PER_SECTOR, i % WORDS_PER_SECTOR).to_le_bytes(),
            );
        }
    }

    /// The seed of generation `generation` of a workload that rewrites blocks again and again
    /// (`blk-durable`): a block's data then tells both its sector and its generation.
    pub fn generation_seed(seed: u64, generation: u64) -> u64 {
        splitmix64(seed ^ generation.rotate_left(32))
    }

    /// Does `buffer` hold the pattern of the sectors starting at `first_sector`?
    pub fn check(seed: u64, first_sector: u64, buffer: &[u8]) -> bool {
        buffer.chunks_exact(8).enumerate().all(|(i, chunk)| {
            let i = i as u64;
            chunk == word(seed, first_sector + i / WORDS_PER_SECTOR, i % WORDS_PER_SECTOR).to_le_bytes()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::testdev::*;

    #[test]
    fn test_device_registers_fit_and_do_not_overlap() {
        let registers = [USER_EXIT, DOORBELL, PINGPONG, MARK, PINGPONG_IRQ];
        for (i, a) in registers.iter().enumerate() {
            assert!(a + 8 <= SIZE);
            for b in &registers[i + 1..] {
                assert!(a.abs_diff(*b) >= 8, "registers {a:#x} and {b:#x} overlap");
            }
        }
    }
}
