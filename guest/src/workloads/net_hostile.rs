//! `probe.workload=net-hostile`: the probe plays a misbehaving network driver. One after
//! another it puts on the transmit queue a descriptor outside guest RAM, an address and
//! length that wrap around, a descriptor loop (a chain longer than the queue), a frame larger
//! than a 1514-byte frame plus the 12-byte header (by 64 bytes), a buffer shorter than the
//! header (11 bytes), a
//! device-writable (wrong direction) descriptor, and an avail index that jumps by more than
//! the queue size. For each it records what the device did (`result`: `used` when it returned
//! the chain, `needs_reset` when it set DEVICE_NEEDS_RESET, `no_response` when neither,
//! `bad_used` when it returned something else or more than once). After a case that broke the
//! queue (and always after the avail index jump) it resets the device and sets it up again.
//! Then it checks that the device still works: a valid ARP request for `probe.dst` must come
//! back in the transmit used ring (`works_after`); whether an ARP reply arrived within
//! [`ARP_REPLY_WAIT_MS`] is reported too (`arp_reply`) but not required, as the peer may not
//! answer.
//!
//! One line: `{"probe":"net-hostile","cases":[{"case","result","device_status","used_len",
//! "used_count","reset","works_after","arp_reply"}, ...],"ok":..,"completion":..,"mac":..,
//! "resets":..}`; status OK only if the device worked after every case. The VMM's tests judge
//! whether each result is right; this workload only has to survive them all.
//!
//! Parameters: those of every network workload (`netdev::Common`); `probe.timeout_ms=` bounds
//! each wait (default 2000).

use super::netdev::{self, Station};
use crate::deadline::Deadline;
use crate::inet::{self, MacText, ETHERTYPE_EXPERIMENTAL};
use crate::json::Str;
use crate::virtio::device_status::NEEDS_RESET;
use crate::virtio::net::{NetDevice, HDR_LEN, MAX_FRAME, TX_QUEUE};
use crate::virtio::queue::{Descriptor, DESC_F_NEXT, DESC_F_WRITE};
use crate::{print, println, Env};
use probe_abi::status;

const PROBE: &str = "net-hostile";
const TIMEOUT_MS: u64 = 2000;
/// How long to wait for an ARP reply after each case.
pub const ARP_REPLY_WAIT_MS: u64 = 200;
/// Far above any guest RAM, but a sane 48-bit physical address.
const OUTSIDE_RAM: u64 = 0xffff_f000_0000;
/// With a length of 0x2000, this address wraps past 2^64.
const WRAPPING: u64 = 0xffff_ffff_ffff_f000;
/// A small frame: an Ethernet header and some payload.
const SMALL_FRAME: usize = 60;
/// How far the oversized frame exceeds [`MAX_FRAME`]: beyond a VLAN-tagged (1518) or
/// double-tagged (1522) frame too, so no device can take it for a valid one.
const OVERSIZE: usize = 64;
/// The transmit buffer the cases point into.
const SLOT: usize = 0;
/// How many polls of the used ring per read of the Status register (each read is an exit).
const POLLS_PER_STATUS_READ: u32 = 64;
/// How long to keep watching after a case's first completion.
const SETTLE_MS: u64 = 50;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Case {
    AddrOutsideRam,
    AddrLenWraps,
    DescriptorLoop,
    FrameTooLarge,
    ShorterThanHeader,
    DeviceWritable,
    AvailIndexJump,
}

const CASES: [Case; 7] = [
    Case::AddrOutsideRam,
    Case::AddrLenWraps,
    Case::DescriptorLoop,
    Case::FrameTooLarge,
    Case::ShorterThanHeader,
    Case::DeviceWritable,
    Case::AvailIndexJump,
];

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::AddrOutsideRam => "addr_outside_ram",
            Case::AddrLenWraps => "addr_len_wraps",
            Case::DescriptorLoop => "descriptor_loop",
            Case::FrameTooLarge => "frame_too_large",
            Case::ShorterThanHeader => "shorter_than_header",
            Case::DeviceWritable => "device_writable",
            Case::AvailIndexJump => "avail_index_jump",
        }
    }
}

/// What the device did with one case.
struct Observed {
    /// (used id, length) of the first completion, if any.
    used: Option<(u32, u32)>,
    /// Completions seen in all: more than one means the device took chains that were never
    /// offered.
    used_count: u32,
    device_status: u32,
}

impl Observed {
    fn result(&self) -> &'static str {
        if self.device_status & NEEDS_RESET != 0 {
            "needs_reset"
        } else if self.used.is_none() {
            "no_response"
        } else if self.queue_intact() {
            "used"
        } else {
            "bad_used"
        }
    }

    /// Can the queue go on as it is? Only after the one chain came back and nothing else did.
    fn queue_intact(&self) -> bool {
        self.device_status & NEEDS_RESET == 0 && matches!(self.used, Some((0, _))) && self.used_count == 1
    }
}

/// Write a frame nobody acts on (to our own MAC, local experimental EtherType) after a zero
/// header into the case's transmit buffer; returns header plus frame length.
fn write_frame(dev: &mut NetDevice, frame_len: usize) -> usize {
    let mac = dev.mac;
    let buffer = dev.tx_buffer(SLOT);
    buffer.fill(0);
    inet::ethernet(&mut buffer[HDR_LEN..], mac, mac, ETHERTYPE_EXPERIMENTAL);
    HDR_LEN + frame_len
}

/// Build the case's chain (head 0) in the idle transmit queue, publish it and notify.
fn submit_case(dev: &mut NetDevice, case: Case) {
    let buffer = dev.tx_buffer_addr(SLOT);
    let d = |addr, len: usize, flags| Descriptor { addr, len: len as u32, flags, next: 0 };
    let small = write_frame(dev, SMALL_FRAME);
    let queue = dev.tx_queue_mut();
    match case {
        Case::AddrOutsideRam => queue.set_descriptor(0, d(OUTSIDE_RAM, small, 0)),
        Case::AddrLenWraps => queue.set_descriptor(0, d(WRAPPING, 0x2000, 0)),
        Case::DescriptorLoop => {
            // 0 -> 1 -> 0 -> ...: a chain longer than any queue, all device-readable.
            queue.set_descriptor(0, Descriptor { next: 1, ..d(buffer, HDR_LEN, DESC_F_NEXT) });
            queue.set_descriptor(
                1,
                Descriptor { next: 0, ..d(buffer + HDR_LEN as u64, SMALL_FRAME, DESC_F_NEXT) },
            );
        }
        Case::FrameTooLarge => {
            let len = write_frame(dev, MAX_FRAME + OVERSIZE);
            dev.tx_queue_mut().set_descriptor(0, d(buffer, len, 0));
        }
        Case::ShorterThanHeader => queue.set_descriptor(0, d(buffer, HDR_LEN - 1, 0)),
        Case::DeviceWritable => queue.set_descriptor(0, d(buffer, small, DESC_F_WRITE)),
        Case::AvailIndexJump => queue.set_descriptor(0, d(buffer, small, 0)),
    }
    let queue = dev.tx_queue_mut();
    if case == Case::AvailIndexJump {
        let size = queue.size();
        queue.publish_raw_avail_idx(queue.avail_idx().wrapping_add(size).wrapping_add(5));
    } else {
        queue.push(0);
        queue.publish();
    }
    // Always notify: the point is that the device looks.
    dev.notify(TX_QUEUE);
}

/// Wait for a completion, DEVICE_NEEDS_RESET, or the deadline; after the first completion,
/// keep watching for `SETTLE_MS` for more completions or a late DEVICE_NEEDS_RESET.
fn observe(dev: &mut NetDevice, mut deadline: Deadline, tsc_khz: u64) -> Observed {
    let mut polls = 0u32;
    let mut used = None;
    let mut used_count = 0;
    loop {
        while let Some(entry) = dev.tx_queue_mut().pop_used() {
            if used.is_none() {
                used = Some(entry);
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
    Observed { used, used_count, device_status: dev.transport().status() }
}

/// After a case: does a valid frame still go out (its buffer comes back)? And did an ARP
/// reply come in?
fn check_works(station: &mut Station, env: &Env, timeout: Deadline) -> (bool, bool) {
    let replies = station.counters.arp_replies;
    let sent = station.send_arp_request().and_then(|()| station.dev.tx_drain(timeout));
    if sent.is_err() {
        return (false, false);
    }
    let wait = Deadline::after_ms(env.tsc_khz, ARP_REPLY_WAIT_MS);
    loop {
        if station.receive(|_| false).is_err() {
            return (true, false);
        }
        if station.counters.arp_replies != replies {
            return (true, true);
        }
        match station.dev.rx_wait(wait) {
            Ok(true) => continue,
            Ok(false) | Err(_) => return (true, false),
        }
    }
}

pub fn run(env: &Env) -> u8 {
    let common = netdev::common_params(env, TIMEOUT_MS);
    let dev = netdev::open(env, PROBE, &common);
    let mut station = Station::new(dev, env, &common);
    let mut ok = true;
    let mut resets = 0;
    print!("{{\"probe\":\"net-hostile\",\"cases\":[");
    for (i, case) in CASES.into_iter().enumerate() {
        // Start from an idle transmit queue: the cases build their chains from descriptor 0.
        if station.dev.tx_drain(common.deadline(env)).is_err() {
            resets += 1;
            if let Err(error) = station.dev.restart(common.deadline(env)) {
                println!("]}}");
                netdev::fail(PROBE, error, &station.dev);
            }
        }
        submit_case(&mut station.dev, case);
        let observed = observe(&mut station.dev, common.deadline(env), env.tsc_khz);
        let reset = !observed.queue_intact() || case == Case::AvailIndexJump;
        let restarted = !reset || station.dev.restart(common.deadline(env)).is_ok();
        resets += u32::from(reset);
        let (works, arp_reply) =
            if restarted { check_works(&mut station, env, common.deadline(env)) } else { (false, false) };
        ok &= works;
        print!(
            "{}{{\"case\":{},\"result\":{},\"device_status\":{},\"used_len\":",
            if i == 0 { "" } else { "," },
            Str(case.name()),
            Str(observed.result()),
            observed.device_status
        );
        match observed.used {
            Some((_, len)) => print!("{}", len),
            None => print!("null"),
        }
        print!(
            ",\"used_count\":{},\"reset\":{},\"works_after\":{},\"arp_reply\":{}}}",
            observed.used_count, reset, works, arp_reply
        );
        if !restarted {
            break;
        }
    }
    println!(
        "],\"ok\":{},\"completion\":{},\"mac\":{},\"resets\":{}}}",
        ok,
        Str(common.completion.name()),
        MacText(station.dev.mac),
        resets
    );
    if ok {
        status::OK
    } else {
        status::FAILED
    }
}
