//! The switch: one `QueueWorker` an IOCore polls, serving every attached port's rings. Each pass
//! takes frames off the transmit rings, learns where their senders are, and copies each frame
//! into the receive ring of the port its destination was seen on, or of every other port for a
//! group or unknown address, and the uplink's likewise. Nothing on this path allocates or locks;
//! its one system call is the uplink's flush, once per pass that queued frames for the host.
//! Ports come and go through [`SwitchControl`], which the pass looks at only when it has news.
//! Polled, the switch asks no driver to notify; on an IOCore that sleeps, the ports' transmit
//! kicks, the mailbox and the uplink wake it ([`Wakers`]).
//!
//! A daemon with several IOCores runs a switch on each, every port on one of them: a frame for
//! a port (or the uplink) another switch serves is handed to it through a ring ([`handoff`]),
//! which that switch empties on its next pass. Frames cross in their plain form: the sender
//! fills in a checksum left, and cuts a super-frame into segments, before they go.
//!
//! [`handoff`]: crate::handoff

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use af_packet::{checksum, PacketRing};
use virtqueue::QueueWorker;
use vm_memory::VolatileSlice;

use crate::chain::{At, Chain};
use crate::control::{Command, Links, SwitchControl};
use crate::counters::{PortCounters, SharedUplinkCounters, UplinkCounters};
use crate::delivery::{deliver, Frame};
use crate::ethernet::{flow_of, Addresses, MacAddr, FLOW_BYTES};
use crate::handoff::{Record, FLOOD};
use crate::host::{from_host, Destinations};
use crate::mac_table::MacTable;
use crate::offload::{NetHeader, NET_HDR_LEN};
use crate::port::Port;
use crate::rework::Rework;
use crate::segment::{self, NotForHost, MAX_HEADERS_LEN};
use crate::uplink::Uplink;
use crate::wake::Wakers;

/// Ports one switch serves at most.
pub const MAX_PORTS: usize = 64;
/// Frames taken from one transmit ring per pass, so every port gets its turn.
pub const TX_BATCH: usize = 64;
/// A frame's bytes besides its payload: an Ethernet header and a VLAN tag.
pub const FRAME_OVERHEAD: usize = 18;
/// A port's MTU unless its policy says otherwise, and the uplink's.
pub const DEFAULT_MTU: u16 = 1500;
/// The largest MTU a port may have (jumbo frames).
pub const MAX_MTU: u16 = 9000;
/// The longest frame switched on a port of the default MTU, and on the uplink, but a
/// super-frame: 1500 bytes of payload, an Ethernet header and a VLAN tag.
pub const MAX_FRAME_LEN: usize = DEFAULT_MTU as usize + FRAME_OVERHEAD;
/// The longest frame switched on any port, but a super-frame.
pub const MAX_JUMBO_FRAME_LEN: usize = MAX_MTU as usize + FRAME_OVERHEAD;
/// The longest TCP super-frame (segmentation offload): 64 KiB of IP packet, an Ethernet header
/// and a VLAN tag.
pub const MAX_SUPER_FRAME_LEN: usize = (64 << 10) + 18;
/// The shortest frame switched: an Ethernet header.
pub const MIN_FRAME_LEN: usize = 14;
/// The mac table's port number for addresses seen on the uplink.
pub(crate) const UPLINK: usize = MAX_PORTS;

/// The switch's data path.
pub struct Switch {
    /// Its number among the switches that share `control` (one per IOCore).
    index: usize,
    pub(crate) ports: Vec<Option<Box<Port>>>,
    uplink: Option<Uplink>,
    control: Arc<SwitchControl>,
    /// The rings to and from the other switches.
    links: Links,
    /// The switches this pass handed frames to, by index: woken at its end.
    handed_to: Vec<bool>,
    /// The frame being switched: a transmit chain's segments, and its header.
    frame: Chain,
    header: NetHeader,
    /// Its flow (`ethernet::flow_of`), for the receive queue it goes to.
    flow: u32,
    /// The frame changed for receivers that do not take its offloads.
    rework: Rework,
    polling: bool,
    /// The last pass left frames in a ring for a rate limit: no kick announces when they may go.
    throttled: bool,
    /// A port has a transmit ring without a kick (as of the last attach or detach).
    unannounced: bool,
    /// What wakes the switch when its IOCore sleeps.
    wakers: Wakers,
}

impl Switch {
    /// Switch `index` of those `control` serves (0 with one IOCore), with no port yet. Fails if
    /// the epoll instance that wakes it cannot be made, or if there is no such switch or it was
    /// made already.
    pub fn new(control: Arc<SwitchControl>, index: usize) -> std::io::Result<Switch> {
        let links = control.take_links(index).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("switch {index} exists already, or too many"),
            )
        })?;
        Ok(Switch {
            index,
            ports: (0..MAX_PORTS).map(|_| None).collect(),
            uplink: None,
            wakers: Wakers::new(&control, index)?,
            handed_to: vec![false; control.switches()],
            links,
            control,
            frame: Chain::default(),
            header: NetHeader::default(),
            flow: 0,
            rework: Rework::new(),
            polling: false,
            throttled: false,
            unannounced: false,
        })
    }

    /// Frames to addresses not on a NIC go to the host through `ring`, and the host's frames
    /// come in through it; what it does is published in `shared`.
    pub fn with_uplink(
        mut self,
        ring: PacketRing,
        shared: Arc<SharedUplinkCounters>,
    ) -> std::io::Result<Switch> {
        self.wakers.add_uplink(ring.as_raw_fd())?;
        self.uplink = Some(Uplink::new(ring, shared));
        self.control.set_uplink_home(self.index);
        Ok(self)
    }

    /// What port `id` did so far; `None` when no port is attached there.
    pub fn port_counters(&self, id: usize) -> Option<PortCounters> {
        self.ports.get(id)?.as_ref().map(|port| port.counters)
    }

    /// What the uplink did so far; `None` without one.
    pub fn uplink_counters(&self) -> Option<UplinkCounters> {
        self.uplink.as_ref().map(|uplink| uplink.counters)
    }

    /// Carry out the commands sent since the last pass; how many frames that sent.
    fn apply_commands(&mut self) -> usize {
        let mut sent = 0;
        for command in self.control.take_commands(self.index) {
            match command {
                Command::Attach(id, mut port) => {
                    port.set_notifications(!self.polling);
                    self.wakers.add_port(id, &port);
                    if let Some(mac) = port.mac {
                        if !self.control.table.pin(mac, id) {
                            log::warn!("port {id}: its address {mac} could not be pinned (the table is full of pinned ones)");
                        }
                    }
                    self.ports[id] = Some(port);
                }
                Command::Announce(id, mac) => sent += usize::from(self.announce(id, mac)),
                Command::Detach(id, reply) => {
                    self.control.table.forget_port(id);
                    let port = self.ports[id].take();
                    if let Some(port) = &port {
                        self.wakers.remove_port(port);
                    }
                    let _ = reply.send(port);
                }
            }
        }
        self.unannounced = self.ports.iter().flatten().any(|port| port.needs_polling());
        sent
    }

    /// A broadcast RARP from `mac` as if port `id` sent it (its frontend asked, for a guest
    /// that moved here in a live migration and does not announce itself): learnt on the port,
    /// if it may send from `mac`, and flooded as the port's frames are, so that the other
    /// switches, the uplink's host and the network beyond learn where the guest is now.
    /// Whether it went.
    fn announce(&mut self, id: usize, mac: MacAddr) -> bool {
        let Some(port) = self.ports[id].as_deref_mut() else { return false };
        let own = port.isolated_to.is_none_or(|own| own == mac);
        if mac.is_group() || !own || !self.control.table.learn(mac, id) {
            port.counters.tx_spoofed += 1;
            return false;
        }
        let isolated = port.isolated_to.is_some();
        let frame = virtio::net::rarp_announcement(mac.0);
        let record = Record { to: FLOOD, from: id, isolated, flow: flow_of(&frame) };
        // This switch's other ports and its uplink hear it as a frame handed in.
        let sender = self.ports[id].take();
        handed_in(record, &frame, &mut self.ports, self.uplink.as_mut());
        self.ports[id] = sender;
        let homes = flood_homes(&self.control, self.links.to.len(), self.index, isolated);
        for home in (0..self.links.to.len()).filter(|home| homes & 1 << home != 0) {
            if let Some(link) = self.links.to[home].as_mut() {
                self.handed_to[home] |= link.push(record, frame.len(), |into| {
                    into.copy_from_slice(&frame);
                    true
                });
            }
        }
        log::info!("port {id}: announced {mac} with a RARP, for its frontend");
        true
    }

    /// Switch up to [`TX_BATCH`] frames from each transmit ring of port `source`, as its rate
    /// limit allows; how many.
    fn transmit(&mut self, source: usize) -> usize {
        let pairs = self.ports[source].as_deref().map_or(0, |port| port.pairs.len());
        (0..pairs).map(|pair| self.transmit_from(source, pair)).sum()
    }

    /// [`Switch::transmit`] for the transmit ring of queue pair `pair`.
    fn transmit_from(&mut self, source: usize, pair: usize) -> usize {
        let mut taken = 0;
        while taken < TX_BATCH {
            let Some(port) = self.ports[source].as_deref_mut().filter(|p| !p.broken) else { break };
            if port.limiter.as_ref().is_some_and(|limiter| !limiter.allows()) {
                // The frames wait in the ring for the bucket to refill.
                port.counters.tx_rate_limited += 1;
                self.throttled = true;
                break;
            }
            let tx = &mut port.pairs[pair].tx;
            let head = match tx.pop_avail() {
                Ok(Some(head)) => head,
                Ok(None) => break,
                Err(why) => {
                    port.break_ring(pair, false, why);
                    break;
                }
            };
            taken += 1;
            match self.frame.gather(tx, head, false) {
                Err(why) => {
                    port.break_ring(pair, false, why);
                    break;
                }
                Ok(true) => self.switch_frame(source),
                Ok(false) => port.counters.tx_malformed += 1,
            }
            if let Some(port) = self.ports[source].as_deref_mut() {
                port.pairs[pair].tx_done(head);
            }
        }
        taken
    }

    /// Send the gathered frame from `source` where its destination is.
    fn switch_frame(&mut self, source: usize) {
        let Some(port) = self.ports[source].as_deref_mut() else { return };
        let frame_len = self.frame.len.wrapping_sub(NET_HDR_LEN);
        let (mut header, mut start) = ([0u8; NET_HDR_LEN], [0u8; FLOW_BYTES]);
        let start = &mut start[..frame_len.min(FLOW_BYTES)];
        let mem = port.memory();
        let parsed = match self.frame.len >= NET_HDR_LEN + MIN_FRAME_LEN
            && self.frame.read(mem, 0, &mut header)
            && self.frame.read(mem, NET_HDR_LEN, start)
        {
            true => NetHeader::parse(&header),
            false => None,
        };
        let longest = match parsed.and_then(|header| header.segmentation) {
            Some(_) => MAX_SUPER_FRAME_LEN,
            None => port.max_frame_len,
        };
        let Some(header) = parsed.filter(|header| frame_len <= longest && header.fits(frame_len)) else {
            port.counters.tx_malformed += 1;
            return;
        };
        self.header = header;
        self.flow = flow_of(start);
        self.rework.next_frame();
        // At least MIN_FRAME_LEN bytes were read.
        let Some(Addresses { destination, source: sender }) = Addresses::parse(start) else { return };
        // From an address not its own while isolated, or from another NIC's own address.
        if port.isolated_to.is_some_and(|own| own != sender) || !self.control.table.learn(sender, source) {
            port.counters.tx_spoofed += 1;
            return;
        }
        port.counters.tx_frames += 1;
        if let Some(limiter) = &port.limiter {
            limiter.consume(frame_len as u64);
        }
        match destination_of(&self.control.table, destination) {
            Some(to) if to == source => port.counters.tx_to_self += 1,
            Some(UPLINK) => {
                match self.uplink.is_some() {
                    true => self.send_to_uplink(source, frame_len),
                    false => self.hand_off(source, UPLINK, frame_len, true),
                };
            }
            Some(to) => {
                match self.ports[to].is_some() {
                    true => self.send_to_port(source, to, frame_len, true),
                    false => self.hand_off(source, to, frame_len, true),
                };
            }
            None => {
                let mut heard = false;
                for to in (0..MAX_PORTS).filter(|&to| to != source) {
                    heard |= self.send_to_port(source, to, frame_len, false);
                }
                heard |= self.send_to_uplink(source, frame_len);
                heard |= self.hand_off(source, FLOOD, frame_len, false);
                if !heard {
                    if let Some(port) = self.ports[source].as_deref_mut() {
                        port.counters.tx_unheard += 1;
                    }
                }
            }
        }
    }

    /// Deliver the gathered frame from port `from` to port `to`, if their policies let them
    /// talk (`unicast`: count the frame dropped when they do not); whether it went to `to`.
    fn send_to_port(&mut self, from: usize, to: usize, frame_len: usize, unicast: bool) -> bool {
        let Some((sender, receiver)) = pair(&mut self.ports, from, to) else { return false };
        if !sender.may_reach(receiver) {
            if unicast {
                sender.counters.tx_isolated += 1;
            }
            return false;
        }
        let (header, flow, mem) = (self.header, self.flow, sender.memory());
        // Longer than its MTU (a jumbo frame for a port without them), as a Linux bridge drops.
        if header.segmentation.is_none() && frame_len > receiver.max_frame_len {
            receiver.counters.rx_too_big += 1;
            return true;
        }
        if receiver.offloads.take(&header) {
            let frame = At { chain: &self.frame, mem, offset: NET_HDR_LEN };
            deliver(receiver, Frame::Guest(frame), frame_len, header, flow);
            return true;
        }
        let plain = NetHeader::default();
        let each = |frame: &[u8]| match frame.len() > receiver.max_frame_len {
            true => {
                receiver.counters.rx_too_big += 1;
                false
            }
            false => deliver(receiver, Frame::Bytes(frame), frame.len(), plain, flow),
        };
        let load = |into: &mut [u8]| self.frame.read(mem, NET_HDR_LEN, into);
        let counter = match self.rework.frames(load, header, frame_len, each) {
            false => &mut sender.counters.tx_bad_offload,
            true if header.segmentation.is_some() => &mut sender.counters.tx_segmented,
            true => &mut sender.counters.tx_checksummed,
        };
        *counter += 1;
        true
    }

    /// Queue the gathered frame from port `from` on the uplink: its checksum filled in, or a
    /// super-frame whole, for the host to cut; whether there is an uplink.
    fn send_to_uplink(&mut self, from: usize, frame_len: usize) -> bool {
        let (Some(uplink), Some(sender)) = (self.uplink.as_mut(), self.ports[from].as_deref_mut()) else {
            return false;
        };
        let (frame, header, mem) = (&self.frame, self.header, sender.memory());
        if header.segmentation.is_some() {
            let mut start = [0u8; MAX_HEADERS_LEN];
            let start = &mut start[..frame_len.min(MAX_HEADERS_LEN)];
            let checked = match frame.read(mem, NET_HDR_LEN, start) {
                true => segment::host_header(start, header, uplink.max_frame_len),
                false => Err(NotForHost::Malformed),
            };
            let counter = match checked {
                Ok(vnet_header) => {
                    let whole = |into: &VolatileSlice<'_>| frame.read_volatile(mem, NET_HDR_LEN, into);
                    if uplink.queue(frame_len, Some(vnet_header), whole) {
                        uplink.counters.tx_super_frames += 1;
                    }
                    return true;
                }
                Err(NotForHost::TooBig) => &mut uplink.counters.tx_too_big,
                Err(NotForHost::Malformed) => &mut sender.counters.tx_bad_offload,
                Err(NotForHost::Tagged) => {
                    let each = |segment: &[u8]| {
                        uplink.queue(segment.len(), None, |into| {
                            into.copy_from(segment);
                            true
                        })
                    };
                    let load = |into: &mut [u8]| frame.read(mem, NET_HDR_LEN, into);
                    match self.rework.frames(load, header, frame_len, each) {
                        true => &mut sender.counters.tx_segmented,
                        false => &mut sender.counters.tx_bad_offload,
                    }
                }
            };
            *counter += 1;
            return true;
        }
        // Copied straight from the chain; a checksum left is filled in in the ring's slot.
        let _ = uplink.queue(frame_len, None, |into| {
            let copied = frame.read_volatile(mem, NET_HDR_LEN, into);
            match header.checksum {
                Some((start, offset)) => copied && checksum::finish(into, start.into(), offset.into()),
                None => copied,
            }
        });
        if header.checksum.is_some() {
            sender.counters.tx_checksummed += 1;
        }
        true
    }

    /// Hand the gathered frame from port `from` to the switch that serves `to` (a port, the
    /// uplink, or with [`FLOOD`] every other switch's ports), in its plain form; whether a
    /// switch was there to take it (`unicast`: count the frame dropped when the two may not
    /// talk).
    fn hand_off(&mut self, from: usize, to: usize, frame_len: usize, unicast: bool) -> bool {
        let Some(sender) = self.ports[from].as_deref_mut() else { return false };
        let (control, links, handed_to) = (&*self.control, &mut self.links, &mut self.handed_to);
        let isolated = sender.isolated_to.is_some();
        let homes: u64 = match to {
            // An isolated sender's flood is for the uplink only.
            FLOOD => flood_homes(control, links.to.len(), self.index, isolated),
            UPLINK => control.uplink_home().map_or(0, |home| 1 << home),
            port => {
                if isolated || control.is_isolated(port) {
                    if unicast {
                        sender.counters.tx_isolated += 1;
                    }
                    return false;
                }
                control.home_of(port).map_or(0, |home| 1 << home)
            }
        };
        if homes == 0 {
            return false;
        }
        let record = Record { to, from, isolated, flow: self.flow };
        let (frame, header, mem) = (&self.frame, self.header, sender.memory());
        let mut full = 0;
        let mut each = |bytes: Option<&[u8]>| {
            for home in (0..links.to.len()).filter(|home| homes & 1 << home != 0) {
                let Some(link) = links.to[home].as_mut() else { continue };
                let len = bytes.map_or(frame_len, <[u8]>::len);
                let pushed = link.push(record, len, |into| match bytes {
                    Some(bytes) => {
                        into.copy_from_slice(bytes);
                        true
                    }
                    None => frame.read(mem, NET_HDR_LEN, into),
                });
                handed_to[home] |= pushed;
                full += u64::from(!pushed);
            }
            true
        };
        if header.checksum.is_none() && header.segmentation.is_none() {
            each(None);
        } else {
            let load = |into: &mut [u8]| frame.read(mem, NET_HDR_LEN, into);
            let counter = match self.rework.frames(load, header, frame_len, |bytes| each(Some(bytes))) {
                false => &mut sender.counters.tx_bad_offload,
                true if header.segmentation.is_some() => &mut sender.counters.tx_segmented,
                true => &mut sender.counters.tx_checksummed,
            };
            *counter += 1;
        }
        sender.counters.tx_handoff_full += full;
        true
    }

    /// Switch up to [`TX_BATCH`] frames the host sent on the uplink; how many.
    fn receive_from_uplink(&mut self) -> usize {
        let Some(Uplink { ring, counters, .. }) = self.uplink.as_mut() else { return 0 };
        let mut to = Destinations {
            index: self.index,
            control: &self.control,
            ports: &mut self.ports,
            links: &mut self.links,
            handed_to: &mut self.handed_to,
            rework: &mut self.rework,
        };
        let mut taken = 0;
        while taken < TX_BATCH && ring.receive(|got| from_host(got, counters, &mut to)) {
            taken += 1;
        }
        taken
    }

    /// Deliver up to [`TX_BATCH`] frames from each other switch; how many.
    fn receive_hand_offs(&mut self) -> usize {
        let mut taken = 0;
        for link in self.links.from.iter_mut().flatten() {
            let mut n = 0;
            while n < TX_BATCH
                && link.pop(|record, frame| handed_in(record, frame, &mut self.ports, self.uplink.as_mut()))
            {
                n += 1;
            }
            taken += n;
        }
        taken
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        if let Some(uplink) = &self.uplink {
            uplink.log_counters();
        }
    }
}

/// Deliver a frame with no offload (from the host, or another switch) to `port`, unless it is
/// longer than the port's MTU takes (a jumbo frame for a port without them), as a Linux bridge
/// drops it.
pub(crate) fn deliver_plain(port: &mut Port, frame: Frame<'_>, frame_len: usize, flow: u32) {
    match frame_len > port.max_frame_len {
        true => port.counters.rx_too_big += 1,
        false => {
            deliver(port, frame, frame_len, NetHeader::default(), flow);
        }
    }
}

/// The switches (a bit each) other than `index`, of `switches`, that a flood from a port of
/// `index` goes to: those with ports, unless the sender is isolated, and the uplink's.
fn flood_homes(control: &SwitchControl, switches: usize, index: usize, isolated: bool) -> u64 {
    (0..switches)
        .filter(|&home| home != index)
        .filter(|&home| (!isolated && control.has_ports(home)) || control.uplink_home() == Some(home))
        .fold(0, |set, home| set | 1 << home)
}

/// Deliver `frame`, handed off by another switch as `record` says, to this switch's ports or
/// its uplink.
fn handed_in(record: Record, frame: &[u8], ports: &mut [Option<Box<Port>>], uplink: Option<&mut Uplink>) {
    let deliver_to = |port: &mut Port| deliver_plain(port, Frame::Bytes(frame), frame.len(), record.flow);
    let to_uplink = |uplink: &mut Uplink| {
        let _ = uplink.queue(frame.len(), None, |into| {
            into.copy_from(frame);
            true
        });
    };
    match record.to {
        UPLINK => {
            if let Some(uplink) = uplink {
                to_uplink(uplink);
            }
        }
        FLOOD => {
            // An isolated sender's frames reach only the uplink; an isolated port hears only it.
            let from_uplink = record.from == UPLINK;
            if !record.isolated {
                for port in
                    ports.iter_mut().flatten().filter(|port| from_uplink || port.isolated_to.is_none())
                {
                    deliver_to(port);
                }
            }
            if let Some(uplink) = uplink.filter(|_| !from_uplink) {
                to_uplink(uplink);
            }
        }
        id => {
            if let Some(port) = ports.get_mut(id).and_then(|port| port.as_deref_mut()) {
                deliver_to(port);
            }
        }
    }
}

/// The one port a frame to `mac` goes to; `None`: everywhere (a group address, or one not seen).
pub(crate) fn destination_of(table: &MacTable, mac: MacAddr) -> Option<usize> {
    match mac.is_group() {
        true => None,
        false => table.lookup(mac),
    }
}

/// The ports `from` and `to` (different) of `ports`, both attached.
fn pair(ports: &mut [Option<Box<Port>>], from: usize, to: usize) -> Option<(&mut Port, &mut Port)> {
    if from == to {
        return None;
    }
    let (sender, receiver) = match from < to {
        true => {
            let (low, high) = ports.split_at_mut(to);
            (low[from].as_deref_mut(), high[0].as_deref_mut())
        }
        false => {
            let (low, high) = ports.split_at_mut(from);
            (high[0].as_deref_mut(), low[to].as_deref_mut())
        }
    };
    Some((sender?, receiver?))
}

impl QueueWorker for Switch {
    fn poll(&mut self) -> usize {
        let announced = match self.control.take_news(self.index) {
            true => self.apply_commands(),
            false => 0,
        };
        // Read once per pass, and only if a port has a rate limit.
        let mut now = None;
        self.throttled = false;
        let mut work = announced + self.receive_from_uplink() + self.receive_hand_offs();
        for source in 0..MAX_PORTS {
            if let Some(port) = self.ports[source].as_deref() {
                if let Some(limiter) = &port.limiter {
                    limiter.refill(*now.get_or_insert_with(clock::ticks));
                }
                work += self.transmit(source);
            }
        }
        if work > 0 {
            for port in self.ports.iter_mut().flatten() {
                port.publish();
                if !self.polling {
                    // Notified: a kick for whatever the driver offers after what was taken.
                    port.set_notifications(true);
                }
            }
            if let Some(uplink) = self.uplink.as_mut() {
                if uplink.ring.flush().is_err() {
                    uplink.counters.tx_errors += 1;
                }
                uplink.shared.publish(&uplink.counters);
            }
            for (home, handed) in self.handed_to.iter_mut().enumerate().filter(|(_, handed)| **handed) {
                self.control.wake(home);
                *handed = false;
            }
        }
        work
    }

    fn set_polling(&mut self, polling: bool) {
        self.polling = polling;
        self.control.set_asleep(self.index, !polling);
        for port in self.ports.iter_mut().flatten() {
            port.set_notifications(!polling);
        }
    }

    fn in_flight(&self) -> usize {
        0
    }

    fn has_pending(&self) -> bool {
        self.control.has_news(self.index)
            || self.links.from.iter().flatten().any(|link| link.has_frames())
            || self.uplink.as_ref().is_some_and(|uplink| uplink.ring.has_received())
            || self.ports.iter().flatten().any(|port| port.has_avail())
    }

    fn backend_fd(&self) -> Option<RawFd> {
        Some(self.wakers.fd())
    }

    fn backend_fd_fired(&mut self) {
        self.wakers.clear(&self.control, self.index, &self.ports);
    }

    /// Frames wait for a rate limit: a sleeping IOCore looks again after a moment.
    fn throttled(&self) -> bool {
        self.throttled
    }

    /// A port has no kick to announce its frames: a sleeping IOCore looks again after a moment.
    fn unannounced(&self) -> bool {
        self.unannounced
    }
}
