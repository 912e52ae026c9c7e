//! `probe.workload=udp-rr`: UDP request-response through the virtio-net driver, like netperf's
//! UDP_RR: one request in flight, timed from just before it is handed to the device until its
//! echo is seen.
//!
//! The probe resolves its peer's MAC with ARP (and answers ARP requests for its own address
//! throughout), then sends `probe.size=` bytes of UDP payload (8..=1472, default 64) from
//! port `probe.sport=` (default 40000) to `probe.dst=`:`probe.port=` (default 10.0.0.1:7) and
//! waits for the same datagram to come back. A payload is the request's sequence number (u64,
//! little-endian) followed by bytes derived from it (see [`pattern_byte`]); an echo with the
//! request's sequence number but another length or other bytes is a mismatch. Echoes of
//! earlier, timed-out requests are counted (`late`) and otherwise ignored, as is every frame
//! not for us (`rx_ignored`: another MAC, IP or port, a bad checksum, another protocol).
//!
//! Parameters: `probe.ops=` measured transactions (default 10000) or `probe.duration_ms=`
//! (needs `probe.tsc_khz=`), `probe.warmup=` unmeasured transactions first (default 100),
//! `probe.timeout_ms=` per transaction (default 1000): a request whose echo does not come in
//! time counts as a timeout and the next one goes out with a new sequence number; after more
//! than `probe.max_timeouts=` (default 10) timeouts in the whole run (ARP included) the probe
//! prints an error line and stops with FAILED. Also `probe.ip=`, `probe.dst=`, `probe.dev=`,
//! `probe.completion=poll|interrupt`, `probe.event_idx=on|off` (see `netdev`) and
//! `probe.pv_eoi=on|off` (as for `blk`).
//!
//! Marks 0 and 1 surround the measured phase. The result line:
//! `{"probe":"udp-rr","ops","errors","mismatches","tps","p50_ns","p99_ns","p999_ns","max_ns",
//! "completion","notifies","interrupts","timeouts","mac","rx_dropped", ...}` then `size`,
//! `port`, `sport`, `ip`, `dst`, `dst_mac`, `event_idx`, `cycles`, `p50_cycles`..`max_cycles`,
//! `late`, `rx_ignored`, `arp_answered`, `warmup_timeouts`, `pv_eoi`, `pv_eois`. All counters
//! but `warmup_timeouts` (ARP and warm-up) cover the measured phase. `errors` is the measured
//! transactions that failed: timeouts plus mismatches. Status OK unless there was a mismatch.
//! When the peer never answers ARP, or after too many timeouts, an error line instead (the
//! latter with the phase, `ops`, `late`, `rx_frames`, `tx_frames`, `rx_ignored`, `notifies`
//! and `interrupts` so far) and status FAILED.

use super::latency::Percentiles;
use super::netdev::{self, Addresses, Common, Station};
use crate::deadline::Deadline;
use crate::histogram::Histogram;
use crate::inet::{MacText, MAX_UDP_PAYLOAD};
use crate::json::Str;
use crate::pv_eoi::{self, Tally};
use crate::virtio::Error;
use crate::{bad_parameter, cmdline, print, println, x86, Env};
use probe_abi::pattern::splitmix64;
use probe_abi::status;

const PROBE: &str = "udp-rr";
const TIMEOUT_MS: u64 = 1000;
/// Bytes of the sequence number at the start of every payload.
const SEQ_LEN: usize = 8;

struct Params {
    size: usize,
    port: u16,
    sport: u16,
    ops: u64,
    duration_ms: Option<u64>,
    warmup: u64,
    max_timeouts: u64,
}

fn params(env: &Env) -> Params {
    let number =
        |key, default| cmdline::get_u64(env.cmdline, key, default).unwrap_or_else(|k| bad_parameter(k));
    let size = number("probe.size", 64);
    if !(SEQ_LEN as u64..=MAX_UDP_PAYLOAD as u64).contains(&size) {
        bad_parameter("probe.size");
    }
    let port = |key, default| match number(key, default) {
        p @ 1..=65535 => p as u16,
        _ => bad_parameter(key),
    };
    let duration_ms = cmdline::get(env.cmdline, "probe.duration_ms").map(|v| match cmdline::parse_u64(v) {
        Some(ms) if ms > 0 && env.tsc_khz > 0 => ms,
        _ => bad_parameter("probe.duration_ms"),
    });
    Params {
        size: size as usize,
        port: port("probe.port", 7),
        sport: port("probe.sport", 40000),
        ops: number("probe.ops", 10_000),
        duration_ms,
        warmup: number("probe.warmup", 100),
        max_timeouts: number("probe.max_timeouts", 10),
    }
}

/// Byte `i` (`i >= SEQ_LEN`) of the payload of request `seq`.
pub fn pattern_byte(word: u64, i: usize) -> u8 {
    (word >> ((i % 8) * 8)) as u8 ^ (i / 8) as u8
}

fn fill_payload(seq: u64, payload: &mut [u8]) {
    payload[..SEQ_LEN].copy_from_slice(&seq.to_le_bytes());
    let word = splitmix64(seq);
    for (i, byte) in payload.iter_mut().enumerate().skip(SEQ_LEN) {
        *byte = pattern_byte(word, i);
    }
}

fn payload_matches(seq: u64, size: usize, payload: &[u8]) -> bool {
    let word = splitmix64(seq);
    payload.len() == size
        && payload.iter().enumerate().skip(SEQ_LEN).all(|(i, &b)| b == pattern_byte(word, i))
}

#[derive(Clone, Copy)]
enum Limit {
    Transactions(u64),
    /// Start transactions until the TSC reaches this value.
    UntilTsc(u64),
}

/// Counts of one phase.
#[derive(Clone, Copy, Default)]
struct Stats {
    ops: u64,
    mismatches: u64,
    timeouts: u64,
    late: u64,
    cycles: u64,
}

enum Failure {
    Device(Error),
    /// More than `probe.max_timeouts` requests went unanswered.
    TooManyTimeouts,
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Failure::Device(error)
    }
}

struct Rr<'a> {
    station: Station,
    p: &'a Params,
    tsc_khz: u64,
    timeout_ms: u64,
    /// The last sequence number sent.
    seq: u64,
    /// Timeouts in the whole run so far (ARP included).
    timeouts: u64,
}

impl Rr<'_> {
    fn timed_out(&mut self) -> Result<(), Failure> {
        self.timeouts += 1;
        if self.timeouts > self.p.max_timeouts {
            return Err(Failure::TooManyTimeouts);
        }
        Ok(())
    }

    /// One transaction: a request, and its echo or a timeout (then the next request with a new
    /// sequence number, and so on until one is answered).
    fn transact(&mut self, stats: &mut Stats, latencies: Option<&mut Histogram>) -> Result<(), Failure> {
        let (size, port, sport) = (self.p.size, self.p.port, self.p.sport);
        loop {
            self.seq += 1;
            let seq = self.seq;
            let sent_at = x86::rdtsc();
            self.station.send_udp(sport, port, size, |payload| fill_payload(seq, payload))?;
            let deadline = Deadline::after_ms(self.tsc_khz, self.timeout_ms);
            // (TSC when the echo was seen, whether it matched)
            let mut echo: Option<(u64, bool)> = None;
            let peer = self.station.peer_ip;
            loop {
                let late = &mut stats.late;
                self.station.receive(|udp| {
                    let ours = udp.src_ip == peer && udp.sport == port && udp.dport == sport;
                    if !ours || udp.payload.len() < SEQ_LEN || echo.is_some() {
                        return false;
                    }
                    let mut bytes = [0u8; SEQ_LEN];
                    bytes.copy_from_slice(&udp.payload[..SEQ_LEN]);
                    let got = u64::from_le_bytes(bytes);
                    if got == seq {
                        let at = x86::rdtsc();
                        echo = Some((at, payload_matches(seq, size, udp.payload)));
                        true
                    } else if got < seq {
                        *late += 1;
                        true
                    } else {
                        false
                    }
                })?;
                if echo.is_some() || !self.station.dev.rx_wait(deadline)? {
                    break;
                }
            }
            match echo {
                Some((at, matched)) => {
                    stats.ops += 1;
                    if !matched {
                        stats.mismatches += 1;
                    }
                    if let Some(histogram) = latencies {
                        histogram.record(at - sent_at);
                    }
                    return Ok(());
                }
                None => {
                    stats.timeouts += 1;
                    self.timed_out()?;
                }
            }
        }
    }

    fn run(&mut self, limit: Limit, mut latencies: Option<&mut Histogram>) -> (Stats, Result<(), Failure>) {
        let mut stats = Stats::default();
        let start = x86::rdtsc();
        let mut result = Ok(());
        loop {
            let more = match limit {
                Limit::Transactions(n) => stats.ops < n,
                Limit::UntilTsc(end) => x86::rdtsc() < end,
            };
            if !more {
                break;
            }
            result = self.transact(&mut stats, latencies.as_deref_mut());
            if result.is_err() {
                break;
            }
        }
        stats.cycles = x86::rdtsc() - start;
        (stats, result)
    }
}

pub fn run(env: &Env) -> u8 {
    let common = netdev::common_params(env, TIMEOUT_MS);
    let p = params(env);
    pv_eoi::from_cmdline(env, PROBE);
    let dev = netdev::open(env, PROBE, &common);
    let mut rr = Rr {
        station: Station::new(dev, env, &common),
        p: &p,
        tsc_khz: env.tsc_khz,
        timeout_ms: common.timeout_ms,
        seq: 0,
        timeouts: 0,
    };

    // The peer's MAC, each unanswered ARP request counting as a timeout.
    let resolved = loop {
        match rr.station.resolve(1) {
            Ok(true) => break true,
            Ok(false) => {
                if rr.timed_out().is_err() {
                    break false;
                }
            }
            Err(error) => netdev::fail(PROBE, error, &rr.station.dev),
        }
    };
    if !resolved {
        println!(
            "{{\"probe\":\"udp-rr\",\"error\":\"no ARP reply from the peer (probe.dst)\",{},\"mac\":{},\"timeouts\":{}}}",
            Addresses(&rr.station),
            MacText(rr.station.dev.mac),
            rr.timeouts
        );
        return status::FAILED;
    }

    if p.warmup > 0 {
        let (stats, result) = rr.run(Limit::Transactions(p.warmup), None);
        if let Err(failure) = result {
            return failed(&rr, &common, failure, "warmup", &stats);
        }
    }
    let warmup_timeouts = rr.timeouts;
    let mut latencies = Histogram::new();
    rr.station.dev.counters = Default::default();
    rr.station.counters = Default::default();
    env.mark(0);
    // After the mark: under QEMU it idles `probe.mark_linger_ms` while the host samples, which
    // must not eat into the measured time (a run shorter than the linger measured nothing).
    let limit = match p.duration_ms {
        Some(ms) => Limit::UntilTsc(x86::rdtsc() + ms * env.tsc_khz),
        None => Limit::Transactions(p.ops),
    };
    let tally = Tally::now();
    let (stats, result) = rr.run(limit, Some(&mut latencies));
    let pv_eois = tally.pv_eois_since();
    env.mark(1);
    if let Err(failure) = result {
        return failed(&rr, &common, failure, "measured", &stats);
    }

    let dev = &rr.station.dev;
    let percentiles = Percentiles::of(&latencies);
    print!(
        "{{\"probe\":\"udp-rr\",\"ops\":{},\"errors\":{},\"mismatches\":{},\"tps\":{}",
        stats.ops,
        stats.timeouts + stats.mismatches,
        stats.mismatches,
        env.ops_per_second(stats.ops, stats.cycles)
    );
    percentiles.print_ns(env);
    print!(
        ",\"completion\":{},\"notifies\":{},\"interrupts\":{},\"timeouts\":{},\"mac\":{},\"rx_dropped\":{}",
        Str(common.completion.name()),
        dev.counters.notifies,
        dev.counters.interrupts,
        stats.timeouts,
        MacText(dev.mac),
        dev.counters.rx_dropped
    );
    print!(
        ",\"size\":{},\"port\":{},\"sport\":{},{},\"dst_mac\":{},\"event_idx\":{}",
        p.size,
        p.port,
        p.sport,
        Addresses(&rr.station),
        MacText(rr.station.peer_mac.unwrap_or_default()),
        dev.event_idx
    );
    print!(",\"cycles\":{}", stats.cycles);
    percentiles.print_cycles();
    println!(
        ",\"late\":{},\"rx_ignored\":{},\"arp_answered\":{},\"warmup_timeouts\":{},\"pv_eoi\":{},\"pv_eois\":{}}}",
        stats.late,
        rr.station.counters.rx_ignored,
        rr.station.counters.arp_answered,
        warmup_timeouts,
        pv_eoi::enabled(),
        pv_eois
    );
    if stats.mismatches > 0 {
        status::FAILED
    } else {
        status::OK
    }
}

/// Report why the run stopped in `phase` (with its counts so far) and return FAILED (or stop
/// there for a device error).
fn failed(rr: &Rr, common: &Common, failure: Failure, phase: &str, stats: &Stats) -> u8 {
    match failure {
        Failure::Device(error) => netdev::fail(PROBE, error, &rr.station.dev),
        Failure::TooManyTimeouts => {
            let dev = &rr.station.dev.counters;
            println!(
                "{{\"probe\":\"udp-rr\",\"error\":\"too many requests went unanswered (probe.max_timeouts)\",\"timeouts\":{},\"timeout_ms\":{},{},\"port\":{},\"completion\":{},\"phase\":{},\"ops\":{},\"late\":{},\"rx_frames\":{},\"tx_frames\":{},\"rx_ignored\":{},\"notifies\":{},\"interrupts\":{}}}",
                rr.timeouts,
                common.timeout_ms,
                Addresses(&rr.station),
                rr.p.port,
                Str(common.completion.name()),
                Str(phase),
                stats.ops,
                stats.late,
                dev.rx_frames,
                dev.tx_frames,
                rr.station.counters.rx_ignored,
                dev.notifies,
                dev.interrupts
            );
            status::FAILED
        }
    }
}
