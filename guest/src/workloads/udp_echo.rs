//! `probe.workload=udp-echo`: the responder of a UDP request-response between two guests. It
//! answers ARP for its address (`probe.ip=`) and sends every datagram from its peer
//! (`probe.dst=`) to its port (`probe.port=`, default 7) back to where it came from, the same
//! payload, until `probe.duration_ms=` (needs `probe.tsc_khz=`) has passed, then prints
//! `{"probe":"udp-echo","echoed","dropped","rx_ignored","arp_answered","notifies","interrupts",
//! "completion","mac","ip","dst"}` and stops with OK. `dropped`: datagrams that came while one
//! was still to be echoed (a client with one request in flight never sends those).
//! `probe.completion=` and `probe.event_idx=` as for `udp-rr`.

use super::netdev::{self, Addresses, Station};
use crate::deadline::Deadline;
use crate::inet::{MacText, MAX_UDP_PAYLOAD};
use crate::json::Str;
use crate::{bad_parameter, cmdline, println, x86, Env};
use probe_abi::status;

const PROBE: &str = "udp-echo";
/// How long one wait for a frame lasts before the end of the run is checked again.
const WAIT_MS: u64 = 10;

pub fn run(env: &Env) -> u8 {
    let common = netdev::common_params(env, WAIT_MS);
    let port = match cmdline::get_u64(env.cmdline, "probe.port", 7) {
        Ok(p @ 1..=65535) => p as u16,
        _ => bad_parameter("probe.port"),
    };
    let end = match cmdline::get(env.cmdline, "probe.duration_ms").map(cmdline::parse_u64) {
        Some(Some(ms)) if ms > 0 && env.tsc_khz > 0 => x86::rdtsc() + ms * env.tsc_khz,
        _ => bad_parameter("probe.duration_ms"),
    };
    let dev = netdev::open(env, PROBE, &common);
    let mut station = Station::new(dev, env, &common);
    let (mut echoed, mut dropped) = (0u64, 0u64);
    // The datagram to echo: its source port and payload.
    let mut buffer = [0u8; MAX_UDP_PAYLOAD];
    let mut pending: Option<(u16, usize)> = None;
    while x86::rdtsc() < end {
        let peer = station.peer_ip;
        let received = station.receive(|udp| {
            if udp.src_ip != peer || udp.dport != port {
                return false;
            }
            match pending {
                Some(_) => dropped += 1,
                None => {
                    let len = udp.payload.len().min(MAX_UDP_PAYLOAD);
                    buffer[..len].copy_from_slice(&udp.payload[..len]);
                    pending = Some((udp.sport, len));
                }
            }
            true
        });
        if let Err(error) = received {
            netdev::fail(PROBE, error, &station.dev);
        }
        if let Some((sport, len)) = pending.take() {
            // Its ARP request taught us its MAC; without one, there is nobody to answer.
            if station.peer_mac.is_some() {
                let payload = &buffer[..len];
                if let Err(error) = station.send_udp(port, sport, len, |out| out.copy_from_slice(payload)) {
                    netdev::fail(PROBE, error, &station.dev);
                }
                echoed += 1;
            }
            continue;
        }
        if let Err(error) = station.dev.rx_wait(Deadline::after_ms(env.tsc_khz, WAIT_MS)) {
            netdev::fail(PROBE, error, &station.dev);
        }
    }
    let dev = &station.dev;
    println!(
        "{{\"probe\":\"udp-echo\",\"echoed\":{},\"dropped\":{},\"rx_ignored\":{},\"arp_answered\":{},\"notifies\":{},\"interrupts\":{},\"completion\":{},\"mac\":{},{}}}",
        echoed,
        dropped,
        station.counters.rx_ignored,
        station.counters.arp_answered,
        dev.counters.notifies,
        dev.counters.interrupts,
        Str(common.completion.name()),
        MacText(dev.mac),
        Addresses(&station)
    );
    status::OK
}
