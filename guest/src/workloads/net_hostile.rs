//! `probe.workload=net-hostile`: the probe plays a misbehaving network driver. One after
//! another it puts on the transmit queue a descriptor outside guest RAM, an address and
//! length that wrap around, a descriptor loop (a chain longer than the queue), a frame larger
//! than a 1514-byte frame plus the 12-byte header (by 64 bytes), a buffer shorter than the
//! header (11 bytes), a
//! device-writable (wrong direction) descriptor, an avail index that jumps by more than
//! the queue size, and one chain offered twice in one publish (`duplicate_head`). For each it records what the device did (`result`: `used` when it returned
//! the chain, `needs_reset` when it set DEVICE_NEEDS_RESET, `no_response` when neither,
//! `bad_used` when it returned something else or more than once). After a case that broke the
//! queue (and always after the avail index jump and the duplicate head) it resets the device and sets it up again.
//! Then it checks that the device still works: a valid ARP request for `probe.dst` must come
//! back in the transmit used ring (`works_after`); whether an ARP reply arrived within
//! [`ARP_REPLY_WAIT_MS`] is reported too (`arp_reply`) but not required, as the peer may not
//! answer.
//!
//! One line: `{"probe":"net-hostile","cases":[{"case","result","device_status",
//! "config_interrupt","used_len","used_count","reset","works_after","arp_reply"}, ...],"ok":..,"completion":..,"mac":..,
//! "resets":..}`; status OK only if the device worked after every case. The VMM's tests judge
//! whether each result is right; this workload only has to survive them all.
//!
//! Parameters: those of every network workload (`netdev::Common`); `probe.timeout_ms=` bounds
//! each wait (default 2000).

use super::hostile::{self, Observed, Offer, Target, OUTSIDE_RAM, WRAPPING};
use super::netdev::{self, Station};
use crate::deadline::Deadline;
use crate::inet::{self, MacText, ETHERTYPE_EXPERIMENTAL};
use crate::json::{OrNull, Str};
use crate::virtio::mmio::Transport;
use crate::virtio::net::{NetDevice, HDR_LEN, MAX_FRAME, TX_QUEUE};
use crate::virtio::queue::{Descriptor, SplitQueue, DESC_F_NEXT, DESC_F_WRITE};
use crate::{print, println, Env};
use probe_abi::status;

const PROBE: &str = "net-hostile";
const TIMEOUT_MS: u64 = 2000;
/// How long to wait for an ARP reply after each case.
pub const ARP_REPLY_WAIT_MS: u64 = 200;
/// A small frame: an Ethernet header and some payload.
const SMALL_FRAME: usize = 60;
/// How far the oversized frame exceeds [`MAX_FRAME`]: beyond a VLAN-tagged (1518) or
/// double-tagged (1522) frame too, so no device can take it for a valid one.
const OVERSIZE: usize = 64;
/// The transmit buffer the cases point into.
const SLOT: usize = 0;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Case {
    AddrOutsideRam,
    AddrLenWraps,
    DescriptorLoop,
    FrameTooLarge,
    ShorterThanHeader,
    DeviceWritable,
    AvailIndexJump,
    DuplicateHead,
}

const CASES: [Case; 8] = [
    Case::AddrOutsideRam,
    Case::AddrLenWraps,
    Case::DescriptorLoop,
    Case::FrameTooLarge,
    Case::ShorterThanHeader,
    Case::DeviceWritable,
    Case::AvailIndexJump,
    Case::DuplicateHead,
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

/// The cases go on the transmit queue.
impl Target for NetDevice {
    fn queue(&mut self) -> &mut SplitQueue {
        self.tx_queue_mut()
    }

    fn transport(&self) -> &Transport {
        NetDevice::transport(self)
    }

    fn notify(&mut self) {
        NetDevice::notify(self, TX_QUEUE);
    }
}

/// What the device did with the case: `needs_reset`, `no_response`, `used` (the one chain came
/// back), or `bad_used`.
fn result(observed: &Observed) -> &'static str {
    if observed.needs_reset() {
        "needs_reset"
    } else if observed.used.is_none() {
        "no_response"
    } else if observed.queue_intact() {
        "used"
    } else {
        "bad_used"
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
        Case::AvailIndexJump | Case::DuplicateHead => queue.set_descriptor(0, d(buffer, small, 0)),
    }
    hostile::publish(dev, case.offer());
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
        let observed = hostile::observe(&mut station.dev, common.deadline(env), env.tsc_khz, |_| {});
        let reset = observed.reset_needed(case.offer());
        let restarted = !reset || station.dev.restart(common.deadline(env)).is_ok();
        resets += u32::from(reset);
        let (works, arp_reply) =
            if restarted { check_works(&mut station, env, common.deadline(env)) } else { (false, false) };
        ok &= works;
        print!(
            "{}{{\"case\":{},\"result\":{},\"device_status\":{},\"config_interrupt\":{},\"used_len\":{},\"used_count\":{},\"reset\":{},\"works_after\":{},\"arp_reply\":{}}}",
            if i == 0 { "" } else { "," },
            Str(case.name()),
            Str(result(&observed)),
            observed.device_status,
            observed.config_interrupt(),
            OrNull(observed.used_len()),
            observed.used_count,
            reset,
            works,
            arp_reply
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
