//! `probe.workload=blk-hostile`: the probe plays the misbehaving guest. It submits, one at a
//! time, requests and queue states that break the virtio rules, and reports per case what the
//! device did: the request's status byte, the device's Status register, and an outcome
//! (`ok`, `ioerr`, `unsupp`, `no_status` for a completion that left the status byte alone,
//! `bad_status`, `needs_reset`, `no_response`). The VMM's tests judge whether each outcome is
//! right; this workload only has to survive them all. After a case that broke the device it
//! resets the device and sets it up again. At the end, 100 valid requests (writes read back,
//! or reads on a read-only disk) must succeed.
//!
//! Parameters: those of every block workload (`blkdev::Common`); `probe.timeout_ms=` bounds
//! each case (default 2000).

use super::blkdev::{self, check_pattern, fill_pattern, Common, XorShift};
use super::pipeline::{self, Job, Limit};
use crate::deadline::Deadline;
use crate::json::Str;
use crate::virtio::blk::{
    BlockDevice, HEADER_LEN, SECTOR_SIZE, STATUS_UNWRITTEN, S_IOERR, S_OK, S_UNSUPP, T_IN, T_OUT,
};
use crate::virtio::device_status::NEEDS_RESET;
use crate::virtio::queue::{Descriptor, DESC_F_NEXT, DESC_F_WRITE};
use crate::{print, println, Env};
use probe_abi::status;

const PROBE: &str = "blk-hostile";
const TIMEOUT_MS: u64 = 2000;
const BLOCK: u32 = 4096;
const VALID_REQUESTS: u64 = 100;
/// The one slot the cases use.
const SLOT: usize = 0;
/// Far above any guest RAM, but a sane 48-bit physical address.
const OUTSIDE_RAM: u64 = 0xffff_f000_0000;
/// With a length of 0x2000, this address wraps past 2^64.
const WRAPPING: u64 = 0xffff_ffff_ffff_f000;
const UNKNOWN_TYPE: u32 = 0x1234;
/// How many polls of the used ring per read of the Status register (each read is an exit).
const POLLS_PER_STATUS_READ: u32 = 64;
/// How long to keep watching after a case's first completion.
const SETTLE_MS: u64 = 50;

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
}

const CASES: [Case; 9] = [
    Case::AddrOutsideRam,
    Case::AddrLenWraps,
    Case::DescriptorLoop,
    Case::ShortHeader,
    Case::StatusReadOnly,
    Case::WriteReadOnlyDisk,
    Case::SectorPastEnd,
    Case::AvailIndexJump,
    Case::UnknownType,
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
        }
    }
}

/// What the device did with one case.
struct Observed {
    /// (used id, bytes written) of the first completion, if any.
    used: Option<(u32, u32)>,
    /// Completions seen in all: more than one means the device took chains that were never
    /// offered (after an avail index jump).
    used_count: u32,
    status_byte: u8,
    device_status: u32,
}

impl Observed {
    fn outcome(&self) -> &'static str {
        if self.device_status & NEEDS_RESET != 0 {
            return "needs_reset";
        }
        match (self.used, self.status_byte) {
            (None, _) => "no_response",
            (Some(_), S_OK) => "ok",
            (Some(_), S_IOERR) => "ioerr",
            (Some(_), S_UNSUPP) => "unsupp",
            (Some(_), STATUS_UNWRITTEN) => "no_status",
            (Some(_), _) => "bad_status",
        }
    }

    /// Can the queue go on as it is? Only after the one chain came back and nothing else did.
    fn queue_intact(&self) -> bool {
        self.device_status & NEEDS_RESET == 0 && matches!(self.used, Some((0, _))) && self.used_count == 1
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
        Case::SectorPastEnd | Case::UnknownType | Case::AvailIndexJump => {
            write_chain(dev, &[header_d, read_into(buffer, BLOCK), status_d])
        }
    }
    let queue = dev.queue_mut();
    if case == Case::AvailIndexJump {
        let size = queue.size();
        queue.publish_raw_avail_idx(queue.avail_idx().wrapping_add(size).wrapping_add(5));
    } else {
        queue.push(0);
        queue.publish();
    }
    // Always notify: the point is that the device looks.
    dev.notify();
}

/// Wait for a completion, DEVICE_NEEDS_RESET, or the deadline; after the first completion,
/// keep watching for `SETTLE_MS` for more completions or a late DEVICE_NEEDS_RESET.
fn observe(dev: &mut BlockDevice, mut deadline: Deadline, tsc_khz: u64) -> Observed {
    let mut polls = 0u32;
    let mut used = None;
    let mut used_count = 0;
    let mut status_byte = STATUS_UNWRITTEN;
    loop {
        while let Some(entry) = dev.queue_mut().pop_used() {
            if used.is_none() {
                used = Some(entry);
                // Read now: a device that reruns the chain may rewrite it later.
                status_byte = dev.status_byte(SLOT);
                deadline = Deadline::after_ms(tsc_khz, SETTLE_MS);
            }
            used_count += 1;
        }
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(POLLS_PER_STATUS_READ)
            && (dev.transport().status() & NEEDS_RESET != 0 || deadline.passed())
        {
            break;
        }
        core::hint::spin_loop();
    }
    Observed { used, used_count, status_byte, device_status: dev.transport().status() }
}

fn report(case: Case, observed: &Observed, reset: bool) {
    print!("{{\"probe\":\"blk-hostile\",\"case\":{},\"status\":", Str(case.name()));
    match observed.used {
        Some(_) if observed.status_byte != STATUS_UNWRITTEN => print!("{}", observed.status_byte),
        _ => print!("null"),
    }
    print!(",\"device_status\":{},\"outcome\":{}", observed.device_status, Str(observed.outcome()));
    match observed.used {
        Some((id, len)) => print!(",\"used_id\":{},\"used_len\":{}", id, len),
        None => print!(",\"used_id\":null,\"used_len\":null"),
    }
    print!(",\"used_count\":{}", observed.used_count);
    println!(",\"reset\":{}}}", reset);
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
    let common = blkdev::common_params(env, TIMEOUT_MS);
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
        let observed = observe(&mut dev, common.deadline(env), env.tsc_khz);
        let reset = !observed.queue_intact() || case == Case::AvailIndexJump;
        report(case, &observed, reset);
        if reset {
            resets += 1;
            if let Err(error) = dev.restart(common.deadline(env)) {
                blkdev::fail(PROBE, error, Some(dev.transport()));
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
    let stats = result.unwrap_or_else(|error| blkdev::fail(PROBE, error, Some(dev.transport())));
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
