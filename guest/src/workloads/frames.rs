//! `probe.workload=frames-send` and `frames-count`: a 64-byte frame rate between two guests,
//! one sending as fast as its transmit ring takes frames, the other counting what arrives.
//!
//! Every frame is a UDP datagram of 18 payload bytes (a 60-byte frame, 64 with the FCS, as
//! frame rates are counted) from `probe.ip=` to `probe.dst=`:`probe.port=` (default 9): its
//! sequence number (u64, little-endian), then zeroes.
//!
//! - `frames-send` resolves its peer's MAC with ARP (up to `probe.max_timeouts=` requests,
//!   default 10), then sends for `probe.duration_ms=` (needs `probe.tsc_khz=`) between marks 0
//!   and 1, answering ARP now and then. Result: `{"probe":"frames-send","ops","fps","ms",
//!   "size","notifies","mac","ip","dst"}`; `ops` is frames sent.
//! - `frames-count` answers ARP and counts, for `probe.duration_ms=` between marks 0 and 1, the
//!   datagrams from its peer to its port. Result: `{"probe":"frames-count","ops","fps",
//!   "active_ms","lost","rx_ignored","rx_dropped","mac","ip","dst"}`: `ops` frames counted,
//!   `fps` their rate from the first to the last, `lost` the sequence numbers that never came
//!   (up to the highest seen).
//!
//! `probe.completion=` and `probe.event_idx=` as for `udp-rr`. Status OK unless the device
//! fails or the peer never answers ARP.

use super::netdev::{self, Addresses, Station};
use crate::deadline::Deadline;
use crate::inet::MacText;
use crate::{bad_parameter, cmdline, println, x86, Env};
use probe_abi::status;

/// UDP payload bytes: with Ethernet, IPv4 and UDP headers, a 60-byte frame.
const PAYLOAD: usize = 18;
/// Frame bytes, without the FCS.
const FRAME: usize = 60;
/// The sender looks for ARP requests every this many frames.
const RECEIVE_EVERY: u64 = 256;
/// How long the counter waits for a frame before it looks at the clock again.
const WAIT_MS: u64 = 10;

struct Params {
    port: u16,
    /// Start of the measured phase to its end, in TSC cycles.
    cycles: u64,
    max_timeouts: u64,
}

fn params(env: &Env) -> Params {
    let number =
        |key, default| cmdline::get_u64(env.cmdline, key, default).unwrap_or_else(|k| bad_parameter(k));
    let port = match number("probe.port", 9) {
        p @ 1..=65535 => p as u16,
        _ => bad_parameter("probe.port"),
    };
    let ms = match cmdline::get(env.cmdline, "probe.duration_ms").map(cmdline::parse_u64) {
        Some(Some(ms)) if ms > 0 && env.tsc_khz > 0 => ms,
        _ => bad_parameter("probe.duration_ms"),
    };
    Params { port, cycles: ms * env.tsc_khz, max_timeouts: number("probe.max_timeouts", 10) }
}

/// `probe.workload=frames-send`.
pub fn send(env: &Env) -> u8 {
    const PROBE: &str = "frames-send";
    let common = netdev::common_params(env, 1000);
    let p = params(env);
    let mut station = Station::new(netdev::open(env, PROBE, &common), env, &common);
    let resolved =
        station.resolve(p.max_timeouts.max(1)).unwrap_or_else(|e| netdev::fail(PROBE, e, &station.dev));
    if !resolved {
        println!(
            "{{\"probe\":\"{PROBE}\",\"error\":\"no ARP reply from the peer (probe.dst)\",{},\"mac\":{}}}",
            Addresses(&station),
            MacText(station.dev.mac)
        );
        return status::FAILED;
    }
    station.dev.counters = Default::default();
    env.mark(0);
    let start = x86::rdtsc();
    let end = start + p.cycles;
    let mut sent = 0u64;
    while x86::rdtsc() < end {
        let seq = sent;
        let fill = |payload: &mut [u8]| {
            payload[..8].copy_from_slice(&seq.to_le_bytes());
            payload[8..].fill(0);
        };
        if let Err(e) = station.send_udp(p.port, p.port, PAYLOAD, fill) {
            netdev::fail(PROBE, e, &station.dev);
        }
        sent += 1;
        if sent.is_multiple_of(RECEIVE_EVERY) {
            if let Err(e) = station.receive(|_| false) {
                netdev::fail(PROBE, e, &station.dev);
            }
        }
    }
    let cycles = x86::rdtsc() - start;
    env.mark(1);
    println!(
        "{{\"probe\":\"{PROBE}\",\"ops\":{sent},\"fps\":{},\"ms\":{},\"size\":{FRAME},\"notifies\":{},\"mac\":{},{}}}",
        env.ops_per_second(sent, cycles),
        cycles / env.tsc_khz.max(1),
        station.dev.counters.notifies,
        MacText(station.dev.mac),
        Addresses(&station)
    );
    status::OK
}

/// `probe.workload=frames-count`.
pub fn count(env: &Env) -> u8 {
    const PROBE: &str = "frames-count";
    let common = netdev::common_params(env, WAIT_MS);
    let p = params(env);
    let mut station = Station::new(netdev::open(env, PROBE, &common), env, &common);
    let (peer, port) = (station.peer_ip, p.port);
    env.mark(0);
    let end = x86::rdtsc() + p.cycles;
    let (mut counted, mut highest, mut first, mut last) = (0u64, None::<u64>, 0u64, 0u64);
    while x86::rdtsc() < end {
        let received = station.receive(|udp| {
            if udp.src_ip != peer || udp.dport != port || udp.payload.len() != PAYLOAD {
                return false;
            }
            let mut seq = [0u8; 8];
            seq.copy_from_slice(&udp.payload[..8]);
            let seq = u64::from_le_bytes(seq);
            highest = Some(highest.map_or(seq, |h| h.max(seq)));
            last = x86::rdtsc();
            if counted == 0 {
                first = last;
            }
            counted += 1;
            true
        });
        match received {
            Ok(0) => {
                if let Err(e) = station.dev.rx_wait(Deadline::after_ms(env.tsc_khz, WAIT_MS)) {
                    netdev::fail(PROBE, e, &station.dev);
                }
            }
            Ok(_) => {}
            Err(e) => netdev::fail(PROBE, e, &station.dev),
        }
    }
    env.mark(1);
    let active = last - first;
    println!(
        "{{\"probe\":\"{PROBE}\",\"ops\":{counted},\"fps\":{},\"active_ms\":{},\"lost\":{},\"rx_ignored\":{},\"rx_dropped\":{},\"mac\":{},{}}}",
        env.ops_per_second(counted.saturating_sub(1), active),
        active / env.tsc_khz.max(1),
        highest.map_or(0, |h| (h + 1).saturating_sub(counted)),
        station.counters.rx_ignored,
        station.dev.counters.rx_dropped,
        MacText(station.dev.mac),
        Addresses(&station)
    );
    status::OK
}
