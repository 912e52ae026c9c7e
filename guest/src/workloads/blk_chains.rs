//! `probe.workload=blk-chains`: the shapes of chain Linux's virtio_blk sends, one request at a
//! time, each in one indirect table: `seg_max` (128) data segments, so a table of 130
//! descriptors, longer than a 128-entry queue (`probe.queue_size=128`, what QEMU gives Linux on
//! a vhost-user-blk device); 512-byte segments; 4 KiB pages out of order; the same guest page
//! many times in one chain (Linux's zero page when it zeroes a range); and one data segment more
//! than `seg_max`. Every write is read back and checked.
//!
//! One JSON line per case: `outcome` is what the device did (`ok`, `ioerr`, `needs_reset`,
//! `no_response`, `bad_status`) and `verified` whether the data read back is right. The cases
//! within `seg_max` must be `ok` and verified for the workload to pass; the host's tests judge
//! `too_many_segments` (a device may serve it or answer IOERR, never break its queue).
//!
//! Parameters: those of every block workload (`blkdev::Common`; `probe.indirect` must stay on).

use core::ptr::addr_of_mut;

use super::blkdev::{self, check_pattern, fill_pattern, Common};
use super::hostile::{self, Observed, Offer};
use crate::json::{OrNull, Str};
use crate::virtio::blk::{
    BlockDevice, HEADER_LEN, SECTOR_SIZE, STATUS_UNWRITTEN, S_IOERR, S_OK, T_IN, T_OUT,
};
use crate::virtio::queue::{Descriptor, DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_WRITE};
use crate::virtio::{phys, DmaStatic};
use crate::{println, Env};
use probe_abi::status;

const PROBE: &str = "blk-chains";
const TIMEOUT_MS: u64 = 2000;
/// Linux's segments per request on these devices (the device's `seg_max`).
const SEGMENTS: usize = 128;
const PAGE: usize = 4096;
const SECTOR: usize = SECTOR_SIZE as usize;
/// The one request slot (header and status byte) the cases use.
const SLOT: usize = 0;
/// The most descriptors a table here holds: virtio's largest indirect table.
const TABLE_LEN: usize = 1024;

/// What the device reads from and writes to: one indirect table and two areas of 128 pages.
#[repr(C, align(4096))]
struct Chains {
    table: [Descriptor; TABLE_LEN],
    data: [u8; SEGMENTS * PAGE],
    back: [u8; SEGMENTS * PAGE],
}

static CHAINS: DmaStatic<Chains> = DmaStatic::new(Chains {
    table: [Descriptor::EMPTY; TABLE_LEN],
    data: [0; SEGMENTS * PAGE],
    back: [0; SEGMENTS * PAGE],
});

/// The written area (`data`) or the read-back area (`back`). Only between requests (each one
/// completed, or the workload stopped), one slice of an area at a time.
fn area(back: bool) -> &'static mut [u8] {
    // SAFETY: callers hold a slice only between requests: every request came back from the
    // device (`completed`) before the next slice is made, or the workload stopped without
    // touching the areas again; each slice is gone before another of the same area is made,
    // and the probe is single-threaded, so no other reference to the area lives.
    unsafe {
        let chains = CHAINS.get();
        if back {
            &mut *addr_of_mut!((*chains).back)
        } else {
            &mut *addr_of_mut!((*chains).data)
        }
    }
}

fn area_addr(back: bool) -> u64 {
    // SAFETY: only an address is computed.
    unsafe {
        let chains = CHAINS.get();
        if back {
            phys(addr_of_mut!((*chains).back))
        } else {
            phys(addr_of_mut!((*chains).data))
        }
    }
}

/// One request of `kind` at `sector` over `segments` (physical address, length): header,
/// segments and status in the table, ring descriptor 0 pointing to it, offered once. Waits for
/// what the device does; returns it and the status byte at its completion.
fn request(
    dev: &mut BlockDevice,
    env: &Env,
    common: &Common,
    kind: u32,
    sector: u64,
    segments: &mut dyn Iterator<Item = (u64, u32)>,
) -> (Observed, u8) {
    dev.write_header(SLOT, kind, sector);
    let table = CHAINS.get();
    let data_flags = DESC_F_NEXT | if kind == T_IN { DESC_F_WRITE } else { 0 };
    let set = |index: usize, descriptor: Descriptor| {
        // SAFETY: `index < TABLE_LEN` (checked by the indexing); the device reads the table only
        // once the request is offered, and it is volatile because it reads by physical address.
        unsafe { addr_of_mut!((*table).table[index]).write_volatile(descriptor) }
    };
    set(0, Descriptor { addr: dev.header_addr(SLOT), len: HEADER_LEN, flags: DESC_F_NEXT, next: 1 });
    let mut count = 1;
    for (addr, len) in segments.take(TABLE_LEN - 2) {
        set(count, Descriptor { addr, len, flags: data_flags, next: count as u16 + 1 });
        count += 1;
    }
    set(count, Descriptor { addr: dev.status_addr(SLOT), len: 1, flags: DESC_F_WRITE, next: 0 });
    count += 1;
    // SAFETY: only an address is computed.
    let table_addr = phys(unsafe { addr_of_mut!((*table).table) });
    let len = (count * core::mem::size_of::<Descriptor>()) as u32;
    dev.queue_mut().set_descriptor(0, Descriptor { addr: table_addr, len, flags: DESC_F_INDIRECT, next: 0 });
    hostile::publish(dev, Offer::Head);
    let mut status_byte = STATUS_UNWRITTEN;
    let observed =
        hostile::observe(dev, common.deadline(env), env.tsc_khz, |dev| status_byte = dev.status_byte(SLOT));
    (observed, status_byte)
}

fn outcome(observed: &Observed, status_byte: u8) -> &'static str {
    if observed.needs_reset() {
        return "needs_reset";
    }
    match (observed.used, status_byte) {
        (None, _) => "no_response",
        (Some(_), S_OK) => "ok",
        (Some(_), S_IOERR) => "ioerr",
        (Some(_), _) => "bad_status",
    }
}

/// One line for a case: what the device did with its write (or only request) and its read.
fn report(
    name: &str,
    segments: usize,
    write: (&Observed, u8),
    read: Option<(&Observed, u8)>,
    verified: Option<bool>,
) {
    let read_outcome = read.map(|(observed, status)| Str(outcome(observed, status)));
    println!(
        "{{\"probe\":\"blk-chains\",\"case\":{},\"segments\":{},\"descriptors\":{},\"outcome\":{},\"read_outcome\":{},\"verified\":{}}}",
        Str(name),
        segments,
        segments + 2,
        Str(outcome(write.0, write.1)),
        OrNull(read_outcome),
        OrNull(verified)
    );
}

pub fn run(env: &Env) -> u8 {
    let common = blkdev::common_params(env, TIMEOUT_MS);
    // One 4 KiB request of the driver's own fits any device; the cases build their own chains.
    let mut dev = blkdev::open(env, PROBE, &common, PAGE as u32, 1);
    if !dev.disk.indirect {
        println!(
            "{{\"probe\":\"blk-chains\",\"error\":\"no indirect descriptors (VIRTIO_F_INDIRECT_DESC not offered, or probe.indirect=off)\"}}"
        );
        return status::FAILED;
    }
    let needed = (2 * SEGMENTS * PAGE / SECTOR) as u64;
    if dev.disk.read_only || dev.disk.capacity_sectors < needed || dev.disk.seg_max < SEGMENTS as u32 {
        println!(
            "{{\"probe\":\"blk-chains\",\"error\":\"needs a writable disk of at least {} sectors with seg_max 128 or more\",\"capacity_sectors\":{},\"seg_max\":{}}}",
            needed,
            dev.disk.capacity_sectors,
            dev.disk.seg_max
        );
        return status::FAILED;
    }
    println!(
        "{{\"probe\":\"blk-chains\",\"queue_size\":{},\"seg_max\":{}}}",
        dev.queue_mut().size(),
        dev.disk.seg_max
    );
    let seed = common.seed;
    let (data, back) = (area_addr(false), area_addr(true));
    let mut all_ok = true;

    // 1. 128 segments of one sector each: 64 KiB at sector 0, read back into the segments in
    //    reverse order.
    fill_pattern(seed, 0, &mut area(false)[..SEGMENTS * SECTOR]);
    let sectors = |base: u64| (0..SEGMENTS).map(move |i| (base + (i * SECTOR) as u64, SECTOR as u32));
    let reversed =
        |base: u64| (0..SEGMENTS).map(move |i| (base + ((SEGMENTS - 1 - i) * SECTOR) as u64, SECTOR as u32));
    let Some(verified) = write_and_read(
        (&mut dev, env, &common),
        "sectors_512",
        0,
        &mut sectors(data),
        &mut reversed(back),
        |back| {
            (0..SEGMENTS).all(|i| {
                let at = (SEGMENTS - 1 - i) * SECTOR;
                check_pattern(seed, i as u64, &back[at..at + SECTOR])
            })
        },
    ) else {
        return status::FAILED;
    };
    all_ok &= verified;

    // 2. 128 pages of 4 KiB taken out of order (page 37 * i mod 128): 512 KiB at sector 128.
    let first = SEGMENTS as u64;
    let shuffled =
        |base: u64| (0..SEGMENTS).map(move |i| (base + ((37 * i) % SEGMENTS * PAGE) as u64, PAGE as u32));
    let written = area(false);
    for i in 0..SEGMENTS {
        let at = (37 * i) % SEGMENTS * PAGE;
        fill_pattern(seed, first + (i * PAGE / SECTOR) as u64, &mut written[at..at + PAGE]);
    }
    let Some(verified) = write_and_read(
        (&mut dev, env, &common),
        "pages_4k_out_of_order",
        first,
        &mut shuffled(data),
        &mut shuffled(back),
        |back| {
            (0..SEGMENTS).all(|i| {
                let at = (37 * i) % SEGMENTS * PAGE;
                check_pattern(seed, first + (i * PAGE / SECTOR) as u64, &back[at..at + PAGE])
            })
        },
    ) else {
        return status::FAILED;
    };
    all_ok &= verified;

    // 3. The same page 128 times in one chain: a write of one sector's bytes 128 times (as Linux
    //    zeroes a range), then a read of the 64 KiB into the same page 128 times.
    let page = [0xa5u8; SECTOR];
    area(false)[..SECTOR].copy_from_slice(&page);
    let same = |base: u64| (0..SEGMENTS).map(move |_| (base, SECTOR as u32));
    let Some(verified) = write_and_read(
        (&mut dev, env, &common),
        "same_page_128_times",
        0,
        &mut same(data),
        &mut same(back),
        |back| back[..SECTOR] == page && back[SECTOR..].iter().all(|&b| b == 0),
    ) else {
        return status::FAILED;
    };
    all_ok &= verified;

    // 4. One data segment more than seg_max (if a table holds it): reported, judged by the host.
    let too_many = dev.disk.seg_max as usize + 1;
    if too_many + 2 <= TABLE_LEN && too_many * SECTOR <= SEGMENTS * PAGE {
        let mut segments = (0..too_many).map(|i| (back + (i * SECTOR) as u64, SECTOR as u32));
        let read = request(&mut dev, env, &common, T_IN, 0, &mut segments);
        report("too_many_segments", too_many, (&read.0, read.1), None, None);
    }
    if all_ok {
        status::OK
    } else {
        status::FAILED
    }
}

/// Both came back from the device, which gave up neither: the areas are the probe's again.
fn completed((observed, _): &(Observed, u8)) -> bool {
    observed.used.is_some() && !observed.needs_reset()
}

/// A case: a write of `written` (in the `data` area) at `sector`, then a read of it into
/// `read_into` (in the `back` area, zeroed first), `verify` judging the `back` area. Reports the
/// case; returns whether both were served OK and verified, or `None` when the device did not
/// give a request back (the workload stops: the device may still own the areas).
fn write_and_read(
    (dev, env, common): (&mut BlockDevice, &Env, &Common),
    name: &str,
    sector: u64,
    written: &mut dyn Iterator<Item = (u64, u32)>,
    read_into: &mut dyn Iterator<Item = (u64, u32)>,
    verify: impl FnOnce(&[u8]) -> bool,
) -> Option<bool> {
    let write = request(dev, env, common, T_OUT, sector, written);
    if !completed(&write) {
        report(name, SEGMENTS, (&write.0, write.1), None, None);
        return None;
    }
    area(true).fill(0);
    let read = request(dev, env, common, T_IN, sector, read_into);
    if !completed(&read) {
        report(name, SEGMENTS, (&write.0, write.1), Some((&read.0, read.1)), None);
        return None;
    }
    let verified = verify(area(true));
    report(name, SEGMENTS, (&write.0, write.1), Some((&read.0, read.1)), Some(verified));
    Some(write.1 == S_OK && read.1 == S_OK && verified)
}
