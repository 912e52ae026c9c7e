//! What the network workloads share: their common parameters, finding and opening the
//! virtio-net device, error lines, and a minimal IPv4 station on top of the driver (answers
//! ARP requests for its address, learns its peer's MAC, sends and receives UDP).
//!
//! Common parameters: `probe.ip=` the probe's address (default 10.0.0.2), `probe.dst=` the
//! peer's (default 10.0.0.1), `probe.dev=` which virtio-net device in command-line order
//! (default 0), `probe.completion=poll|interrupt`, `probe.event_idx=on|off` (default on),
//! `probe.timeout_ms=`.

use super::blkdev;
use super::device::{self, Kind};
use crate::deadline::Deadline;
use crate::inet::{self, Arp, Ip, IpText, Mac, Packet, Udp, UdpAddrs, ARP_REPLY, ARP_REQUEST, BROADCAST};
use crate::virtio::net::{NetDevice, Options, DEVICE_ID};
use crate::virtio::{Completion, Error};
use crate::{bad_parameter, cmdline, Env};

pub const DEFAULT_IP: Ip = [10, 0, 0, 2];
pub const DEFAULT_DST: Ip = [10, 0, 0, 1];

/// Parameters every network workload takes.
pub struct Common {
    pub completion: Completion,
    pub event_idx: bool,
    pub timeout_ms: u64,
    pub dev: u64,
    pub ip: Ip,
    pub dst: Ip,
}

/// `default_timeout_ms` is the workload's default for `probe.timeout_ms=`.
pub fn common_params(env: &Env, default_timeout_ms: u64) -> Common {
    // Completion, EVENT_IDX, timeout and device index are spelled as for the block workloads.
    let shared = blkdev::common_params(env, default_timeout_ms);
    let address = |key, default| match cmdline::get(env.cmdline, key) {
        None => default,
        Some(text) => inet::parse_ip(text).unwrap_or_else(|| bad_parameter(key)),
    };
    Common {
        completion: shared.completion,
        event_idx: shared.event_idx,
        timeout_ms: shared.timeout_ms,
        dev: shared.dev,
        ip: address("probe.ip", DEFAULT_IP),
        dst: address("probe.dst", DEFAULT_DST),
    }
}

impl Common {
    pub fn deadline(&self, env: &Env) -> Deadline {
        Deadline::after_ms(env.tsc_khz, self.timeout_ms)
    }
}

/// Open the `common.dev`-th virtio-net device on the command line, or report why not and stop.
pub fn open(env: &Env, probe: &str, common: &Common) -> NetDevice {
    let kind = Kind { device_id: DEVICE_ID, name: "virtio-net", count_field: "net_devices" };
    let transport = device::find(env, probe, &kind, common.dev);
    let options = Options { completion: common.completion, event_idx: common.event_idx };
    NetDevice::open(transport, options, common.deadline(env))
        .unwrap_or_else(|error| device::fail(probe, error, &transport))
}

/// Report a driver error and stop with FAILED.
pub fn fail(probe: &str, error: Error, dev: &NetDevice) -> ! {
    device::fail(probe, error, dev.transport())
}

/// Frames the station received and did not use.
#[derive(Clone, Copy, Default)]
pub struct StationCounters {
    /// Frames not for us (other MAC, IP or port), of a kind the probe does not speak, malformed,
    /// with a wrong checksum, or UDP the workload did not want.
    pub rx_ignored: u64,
    /// ARP requests for our address that we answered.
    pub arp_answered: u64,
    /// ARP replies received (from anyone, for our address).
    pub arp_replies: u64,
}

/// An IPv4 host with one interface.
pub struct Station {
    pub dev: NetDevice,
    pub ip: Ip,
    pub peer_ip: Ip,
    /// The peer's MAC once an ARP packet from it was seen.
    pub peer_mac: Option<Mac>,
    pub counters: StationCounters,
    /// IPv4 identification of the next datagram.
    ident: u16,
    tsc_khz: u64,
    timeout_ms: u64,
}

impl Station {
    pub fn new(dev: NetDevice, env: &Env, common: &Common) -> Station {
        Station {
            dev,
            ip: common.ip,
            peer_ip: common.dst,
            peer_mac: None,
            counters: StationCounters::default(),
            ident: 0,
            tsc_khz: env.tsc_khz,
            timeout_ms: common.timeout_ms,
        }
    }

    fn deadline(&self) -> Deadline {
        Deadline::after_ms(self.tsc_khz, self.timeout_ms)
    }

    /// Handle every frame the device has received: answer ARP requests for our address, learn
    /// the peer's MAC from its ARP packets, and hand UDP datagrams for us to `on_udp`, which
    /// says whether it wanted them (unwanted ones count as ignored). Each buffer goes back to
    /// the device before anything is sent. Returns how many frames there were.
    pub fn receive(&mut self, mut on_udp: impl FnMut(&Udp) -> bool) -> Result<usize, Error> {
        let mut frames = 0;
        while let Some(rx) = self.dev.rx_pop()? {
            frames += 1;
            let mut answer = None;
            match inet::parse(self.dev.rx_frame(rx), &self.dev.mac, &self.ip) {
                Ok(Packet::Arp(arp)) => {
                    if arp.sender_ip == self.peer_ip {
                        self.peer_mac = Some(arp.sender_mac);
                    }
                    match arp.op {
                        ARP_REQUEST => answer = Some(arp),
                        ARP_REPLY => self.counters.arp_replies += 1,
                        _ => self.counters.rx_ignored += 1,
                    }
                }
                Ok(Packet::Udp(udp)) => {
                    if !on_udp(&udp) {
                        self.counters.rx_ignored += 1;
                    }
                }
                Err(_) => self.counters.rx_ignored += 1,
            }
            self.dev.rx_repost(rx);
            if let Some(request) = answer {
                self.counters.arp_answered += 1;
                let reply = Arp {
                    op: ARP_REPLY,
                    sender_mac: self.dev.mac,
                    sender_ip: self.ip,
                    target_mac: request.sender_mac,
                    target_ip: request.sender_ip,
                };
                let deadline = self.deadline();
                self.dev.tx_send(deadline, |buf| inet::write_arp(buf, request.sender_mac, &reply))?;
            }
        }
        Ok(frames)
    }

    /// Broadcast an ARP request for the peer's address.
    pub fn send_arp_request(&mut self) -> Result<(), Error> {
        let request = Arp {
            op: ARP_REQUEST,
            sender_mac: self.dev.mac,
            sender_ip: self.ip,
            target_mac: [0; 6],
            target_ip: self.peer_ip,
        };
        let deadline = self.deadline();
        self.dev.tx_send(deadline, |buf| inet::write_arp(buf, BROADCAST, &request))
    }

    /// Find the peer's MAC: an ARP request, then up to `timeout_ms` for the answer, up to
    /// `attempts` times. `Ok(false)` if no answer came.
    pub fn resolve(&mut self, attempts: u64) -> Result<bool, Error> {
        for _ in 0..attempts.max(1) {
            if self.peer_mac.is_some() {
                return Ok(true);
            }
            self.send_arp_request()?;
            let deadline = self.deadline();
            while self.peer_mac.is_none() {
                self.receive(|_| false)?;
                if self.peer_mac.is_some() || !self.dev.rx_wait(deadline)? {
                    break;
                }
            }
        }
        Ok(self.peer_mac.is_some())
    }

    /// Send a UDP datagram of `len` payload bytes, which `fill` writes, to the peer (whose MAC
    /// must be known) from port `sport` to port `dport`.
    pub fn send_udp(
        &mut self,
        sport: u16,
        dport: u16,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<(), Error> {
        let addrs = UdpAddrs {
            src_mac: self.dev.mac,
            dst_mac: self.peer_mac.unwrap_or(BROADCAST),
            src_ip: self.ip,
            dst_ip: self.peer_ip,
            sport,
            dport,
        };
        let ident = self.ident;
        self.ident = ident.wrapping_add(1);
        let deadline = self.deadline();
        self.dev.tx_send(deadline, |buf| inet::write_udp(buf, &addrs, ident, len, fill))
    }
}

/// `"ip":"..","dst":".."` for result lines.
pub struct Addresses<'a>(pub &'a Station);

impl core::fmt::Display for Addresses<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter) -> core::fmt::Result {
        write!(f, "\"ip\":{},\"dst\":{}", IpText(self.0.ip), IpText(self.0.peer_ip))
    }
}
