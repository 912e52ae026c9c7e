//! The switch: one `QueueWorker` an IOCore polls, serving every attached port's rings. Each pass
//! takes frames off the transmit rings, learns where their senders are, and copies each frame
//! into the receive ring of the port its destination was seen on, or of every other port for a
//! group or unknown address. Nothing on this path allocates, locks or makes a system call;
//! ports come and go through [`SwitchControl`], which the pass looks at only when it has news.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use thiserror::Error;
use virtqueue::QueueWorker;

use af_packet::{Fill, PacketRing, Received};
use vm_memory::{Bytes, GuestMemoryMmap, VolatileSlice};

use crate::chain::{copy, At, Chain};
use crate::ethernet::{Addresses, MacAddr, ADDRESSES_LEN};
use crate::mac_table::MacTable;
use crate::port::{Port, PortCounters};

/// Ports one switch serves at most.
pub const MAX_PORTS: usize = 64;
/// Frames taken from one transmit ring per pass, so every port gets its turn.
pub const TX_BATCH: usize = 64;
/// The `virtio_net_hdr` before every frame (VERSION_1: with `num_buffers`).
pub const NET_HDR_LEN: usize = 12;
/// The longest frame switched: 1500 bytes of payload, an Ethernet header and a VLAN tag (no
/// segmentation offload is offered).
pub const MAX_FRAME_LEN: usize = 1518;
/// The shortest frame switched: an Ethernet header.
pub const MIN_FRAME_LEN: usize = 14;
/// How long `detach` waits for the switch to hand a port back.
const DETACH_LIMIT: Duration = Duration::from_secs(5);

/// Why a port could not be attached or detached.
#[derive(Debug, Error)]
pub enum SwitchError {
    /// Every port slot is taken.
    #[error("the switch has no free port (it serves at most {MAX_PORTS})")]
    Full,
    /// The switch did not hand the port back in time: its IOCore is not serving it.
    #[error("the switch did not hand port {0} back within {DETACH_LIMIT:?}")]
    DetachTimedOut(usize),
}

enum Command {
    Attach(usize, Box<Port>),
    Detach(usize, SyncSender<Option<Box<Port>>>),
}

/// How device models attach ports to a running switch and take them back: a mailbox the switch
/// reads between passes. Shared by the switch and every NIC on it.
#[derive(Default)]
pub struct SwitchControl {
    /// Commands are waiting: the only thing a pass reads of this without news.
    pending: AtomicBool,
    commands: Mutex<Vec<Command>>,
    /// Which port slots are taken: bit N for port N.
    taken: Mutex<u64>,
}

impl SwitchControl {
    fn send(&self, command: Command) {
        self.commands.lock().unwrap_or_else(|e| e.into_inner()).push(command);
        self.pending.store(true, Ordering::Release);
    }

    /// Put `port` on the switch; its number, for [`SwitchControl::detach`].
    pub fn attach(&self, port: Port) -> Result<usize, SwitchError> {
        let id = {
            let mut taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
            let id = (0..MAX_PORTS).find(|&id| *taken & 1 << id == 0).ok_or(SwitchError::Full)?;
            *taken |= 1 << id;
            id
        };
        self.send(Command::Attach(id, Box::new(port)));
        Ok(id)
    }

    /// Take port `id` off the switch, once the switch has finished the pass it is in.
    pub fn detach(&self, id: usize) -> Result<Port, SwitchError> {
        let (reply, answer): (_, Receiver<_>) = mpsc::sync_channel(1);
        self.send(Command::Detach(id, reply));
        let port = answer.recv_timeout(DETACH_LIMIT).map_err(|_| SwitchError::DetachTimedOut(id))?;
        *self.taken.lock().unwrap_or_else(|e| e.into_inner()) &= !(1 << id);
        port.map(|p| *p).ok_or(SwitchError::DetachTimedOut(id))
    }
}

/// The mac table's port number for addresses seen on the uplink.
const UPLINK: usize = MAX_PORTS;

/// What the uplink did, counted by the switch.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UplinkCounters {
    /// Frames from the host switched to NICs.
    pub rx_frames: u64,
    /// Frames from the host longer than [`MAX_FRAME_LEN`] (a segmentation-offload super-frame
    /// or a jumbo frame: turn those off on the interface): dropped.
    pub rx_too_big: u64,
    /// Frames from the host shorter than an Ethernet header, or with a checksum to fill in
    /// outside them: dropped.
    pub rx_malformed: u64,
    /// Frames from NICs queued for the host.
    pub tx_frames: u64,
    /// Frames for the host that found its transmit ring full: dropped.
    pub tx_ring_full: u64,
    /// Times the kernel refused to send what was queued (it goes with the next pass's).
    pub tx_errors: u64,
}

/// The host's side of the switch: an AF_PACKET socket's rings on a host interface.
struct Uplink {
    ring: PacketRing,
    counters: UplinkCounters,
}

/// The switch's data path.
pub struct Switch {
    pub(crate) ports: Vec<Option<Box<Port>>>,
    uplink: Option<Uplink>,
    table: MacTable,
    control: Arc<SwitchControl>,
    /// The frame being switched: a transmit chain's segments.
    frame: Chain,
    polling: bool,
}

impl Switch {
    /// A switch with no port yet, taking ports from `control`.
    pub fn new(control: Arc<SwitchControl>) -> Switch {
        Switch {
            ports: (0..MAX_PORTS).map(|_| None).collect(),
            uplink: None,
            table: MacTable::default(),
            control,
            frame: Chain::default(),
            polling: false,
        }
    }

    /// Frames to addresses not on a NIC go to the host through `ring`, and the host's frames
    /// come in through it.
    pub fn with_uplink(mut self, ring: PacketRing) -> Switch {
        self.uplink = Some(Uplink { ring, counters: UplinkCounters::default() });
        self
    }

    /// What port `id` did so far; `None` when no port is attached there.
    pub fn port_counters(&self, id: usize) -> Option<PortCounters> {
        self.ports.get(id)?.as_ref().map(|port| port.counters)
    }

    /// What the uplink did so far; `None` without one.
    pub fn uplink_counters(&self) -> Option<UplinkCounters> {
        self.uplink.as_ref().map(|uplink| uplink.counters)
    }

    fn apply_commands(&mut self) {
        let commands = std::mem::take(&mut *self.control.commands.lock().unwrap_or_else(|e| e.into_inner()));
        for command in commands {
            match command {
                Command::Attach(id, mut port) => {
                    port.tx.set_notifications(!self.polling);
                    port.rx.set_notifications(!self.polling);
                    self.ports[id] = Some(port);
                }
                Command::Detach(id, reply) => {
                    self.table.forget_port(id);
                    let _ = reply.send(self.ports[id].take());
                }
            }
        }
    }

    /// Switch up to [`TX_BATCH`] frames from port `source`'s transmit ring, as its rate limit
    /// allows; how many.
    fn transmit(&mut self, source: usize) -> usize {
        let mut taken = 0;
        while taken < TX_BATCH {
            let Some(port) = self.ports[source].as_deref_mut().filter(|p| !p.broken) else { break };
            if port.limiter.as_ref().is_some_and(|limiter| !limiter.allows()) {
                // The frames wait in the ring for the bucket to refill.
                port.counters.tx_rate_limited += 1;
                break;
            }
            let head = match port.tx.pop_avail() {
                Ok(Some(head)) => head,
                Ok(None) => break,
                Err(why) => {
                    port.break_ring(false, why);
                    break;
                }
            };
            taken += 1;
            match self.frame.gather(&port.tx, head, false) {
                Err(why) => {
                    port.break_ring(false, why);
                    break;
                }
                Ok(true) => self.switch_frame(source),
                Ok(false) => port.counters.tx_malformed += 1,
            }
            if let Some(port) = self.ports[source].as_deref_mut() {
                port.tx_done(head);
            }
        }
        taken
    }

    /// Send the gathered frame from `source` where its destination is.
    fn switch_frame(&mut self, source: usize) {
        let Some(port) = self.ports[source].as_deref_mut() else { return };
        let frame_len = self.frame.len.wrapping_sub(NET_HDR_LEN);
        let mut start = [0u8; ADDRESSES_LEN];
        if self.frame.len < NET_HDR_LEN + MIN_FRAME_LEN
            || frame_len > MAX_FRAME_LEN
            || !self.frame.read(port.tx.memory(), NET_HDR_LEN, &mut start)
        {
            port.counters.tx_malformed += 1;
            return;
        }
        let Addresses { destination, source: sender } = Addresses::parse(&start);
        if port.isolated_to.is_some_and(|own| own != sender) {
            port.counters.tx_spoofed += 1;
            return;
        }
        port.counters.tx_frames += 1;
        if let Some(limiter) = &port.limiter {
            limiter.consume(frame_len as u64);
        }
        self.table.learn(sender, source);
        match destination_of(&self.table, destination) {
            Some(to) if to == source => port.counters.tx_to_self += 1,
            Some(UPLINK) => self.send_to_uplink(source, frame_len),
            Some(to) => self.send_to_port(source, to, frame_len, true),
            None => {
                for to in (0..MAX_PORTS).filter(|&to| to != source) {
                    self.send_to_port(source, to, frame_len, false);
                }
                self.send_to_uplink(source, frame_len);
            }
        }
    }

    /// Deliver the gathered frame from port `from` to port `to`, if their policies let them
    /// talk (`unicast`: count the frame dropped when they do not).
    fn send_to_port(&mut self, from: usize, to: usize, frame_len: usize, unicast: bool) {
        let Some((sender, receiver)) = pair(&mut self.ports, from, to) else { return };
        if !sender.may_reach(receiver) {
            if unicast {
                sender.counters.tx_isolated += 1;
            }
            return;
        }
        let frame = At { chain: &self.frame, mem: sender.tx.memory(), offset: NET_HDR_LEN };
        deliver(receiver, Frame::Guest(frame), frame_len);
    }

    /// Queue the gathered frame from port `from` on the uplink, if there is one.
    fn send_to_uplink(&mut self, from: usize, frame_len: usize) {
        let (Some(uplink), Some(sender)) = (self.uplink.as_mut(), self.ports[from].as_deref()) else {
            return;
        };
        let (frame, mem) = (&self.frame, sender.tx.memory());
        let mut copied = false;
        let queued = uplink.ring.transmit(|slot| match slot.subslice(0, frame_len) {
            Ok(into) if frame.read_volatile(mem, NET_HDR_LEN, &into) => {
                copied = true;
                Fill::Frame(frame_len)
            }
            _ => Fill::Nothing,
        });
        match (queued, copied) {
            (false, _) => uplink.counters.tx_ring_full += 1,
            (true, true) => uplink.counters.tx_frames += 1,
            // The chain was checked when gathered: guest memory cannot shrink under it.
            (true, false) => {}
        }
    }

    /// Switch up to [`TX_BATCH`] frames the host sent on the uplink; how many.
    fn receive_from_uplink(&mut self) -> usize {
        let Some(Uplink { ring, counters }) = self.uplink.as_mut() else { return 0 };
        let (table, ports) = (&mut self.table, &mut self.ports);
        let mut taken = 0;
        while taken < TX_BATCH && ring.receive(|got| from_host(got, counters, table, ports)) {
            taken += 1;
        }
        taken
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        if let Some(Uplink { ring, counters: c }) = &self.uplink {
            log::info!(
                "uplink {}: {} frames from the host switched, {} sent to it; dropped: {} too long, \
                 {} malformed, {} with its transmit ring full; {} failed flushes",
                ring.interface(),
                c.rx_frames,
                c.tx_frames,
                c.rx_too_big,
                c.rx_malformed,
                c.tx_ring_full,
                c.tx_errors
            );
        }
    }
}

/// Switch frame `got` from the host to the NICs it is for.
fn from_host(
    got: &Received<'_>,
    counters: &mut UplinkCounters,
    table: &mut MacTable,
    ports: &mut [Option<Box<Port>>],
) {
    let frame_len = got.frame.len() + got.vlan_tag.map_or(0, |tag| tag.len());
    if got.truncated || got.offload.segmented || frame_len > MAX_FRAME_LEN {
        counters.rx_too_big += 1;
        return;
    }
    let mut start = [0u8; ADDRESSES_LEN];
    if got.frame.len() < MIN_FRAME_LEN
        || got.frame.read_slice(&mut start, 0).is_err()
        || (got.offload.needs_checksum && !got.finish_checksum())
    {
        counters.rx_malformed += 1;
        return;
    }
    let Addresses { destination, source } = Addresses::parse(&start);
    table.learn(source, UPLINK);
    counters.rx_frames += 1;
    let frame = Frame::Host { bytes: got.frame, vlan_tag: got.vlan_tag };
    match destination_of(table, destination) {
        // A frame between two of the host's own addresses is not ours to deliver.
        Some(UPLINK) => {}
        Some(to) => {
            if let Some(port) = ports[to].as_deref_mut() {
                deliver(port, frame, frame_len);
            }
        }
        None => {
            for port in ports.iter_mut().flatten() {
                deliver(port, frame, frame_len);
            }
        }
    }
}

/// The one port a frame to `mac` goes to; `None`: everywhere (a group address, or one not seen).
fn destination_of(table: &MacTable, mac: MacAddr) -> Option<usize> {
    match mac.is_group() {
        true => None,
        false => table.lookup(mac),
    }
}

/// Where the bytes of the frame being delivered are.
#[derive(Clone, Copy)]
enum Frame<'a> {
    /// In a NIC's transmit chain, after its header.
    Guest(At<'a>),
    /// In the uplink's receive ring, less the VLAN tag the interface took off, if any.
    Host { bytes: VolatileSlice<'a>, vlan_tag: Option<[u8; 4]> },
}

impl Frame<'_> {
    /// Copy the frame's `len` bytes after the header of `chain`, in `mem`; `false` if it is
    /// shorter. Calls `mark` with each guest range written.
    fn write_to(
        self,
        chain: &Chain,
        mem: &GuestMemoryMmap,
        len: usize,
        mut mark: impl FnMut(u64, usize),
    ) -> bool {
        let to = At { chain, mem, offset: NET_HDR_LEN };
        match self {
            Frame::Guest(from) => copy(to, from, len, mark),
            Frame::Host { bytes, vlan_tag: None } => chain.write_volatile(mem, NET_HDR_LEN, &bytes, mark),
            Frame::Host { bytes, vlan_tag: Some(mut tag) } => {
                // The tag goes back where it was: after the two addresses.
                let (Ok(addresses), Ok(rest)) =
                    (bytes.subslice(0, ADDRESSES_LEN), bytes.offset(ADDRESSES_LEN))
                else {
                    return false;
                };
                let tag = VolatileSlice::from(&mut tag[..]);
                chain.write_volatile(mem, NET_HDR_LEN, &addresses, &mut mark)
                    && chain.write_volatile(mem, NET_HDR_LEN + ADDRESSES_LEN, &tag, &mut mark)
                    && chain.write_volatile(mem, NET_HDR_LEN + ADDRESSES_LEN + tag.len(), &rest, &mut mark)
            }
        }
    }
}

/// Copy `frame`, of `frame_len` bytes, into `receiver`'s next receive chain.
fn deliver(receiver: &mut Port, frame: Frame<'_>, frame_len: usize) {
    if receiver.broken {
        return;
    }
    if receiver.staged.is_none() {
        let head = match receiver.rx.pop_avail() {
            Ok(Some(head)) => head,
            Ok(None) => {
                receiver.counters.rx_no_buffer += 1;
                return;
            }
            Err(why) => return receiver.break_ring(true, why),
        };
        match receiver.staged_chain.gather(&receiver.rx, head, true) {
            Err(why) => return receiver.break_ring(true, why),
            Ok(true) if receiver.staged_chain.len >= NET_HDR_LEN => receiver.staged = Some(head),
            Ok(_) => {
                receiver.counters.rx_malformed += 1;
                return receiver.rx_done(head, 0);
            }
        }
    }
    if frame_len > receiver.staged_chain.len - NET_HDR_LEN {
        // The chain waits for a shorter frame.
        receiver.counters.rx_too_big += 1;
        return;
    }
    let Some(head) = receiver.staged.take() else { return };
    let Port { rx, staged_chain, log, .. } = &*receiver;
    let mut mark = |gpa: u64, len: usize| {
        if let Some(log) = log {
            log.mark(gpa, len as u64);
        }
    };
    // No offload was negotiated: all fields 0 but `num_buffers`, 1.
    let mut header = [0u8; NET_HDR_LEN];
    header[10] = 1;
    let mem = rx.memory();
    let copied = staged_chain.write_volatile(mem, 0, &VolatileSlice::from(&mut header[..]), &mut mark)
        && frame.write_to(staged_chain, mem, frame_len, &mut mark);
    match copied {
        true => {
            receiver.counters.rx_frames += 1;
            receiver.rx_done(head, (NET_HDR_LEN + frame_len) as u32);
        }
        false => {
            receiver.counters.rx_malformed += 1;
            receiver.rx_done(head, 0);
        }
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
        if self.control.pending.swap(false, Ordering::Acquire) {
            self.apply_commands();
        }
        let now = clock::ticks();
        let mut work = self.receive_from_uplink();
        for source in 0..MAX_PORTS {
            if let Some(port) = self.ports[source].as_deref() {
                if let Some(limiter) = &port.limiter {
                    limiter.refill(now);
                }
                work += self.transmit(source);
            }
        }
        if work > 0 {
            for port in self.ports.iter_mut().flatten() {
                port.publish();
            }
            if let Some(uplink) = self.uplink.as_mut() {
                if uplink.ring.flush().is_err() {
                    uplink.counters.tx_errors += 1;
                }
            }
        }
        work
    }

    fn set_polling(&mut self, polling: bool) {
        self.polling = polling;
        for port in self.ports.iter_mut().flatten() {
            port.tx.set_notifications(!polling);
            port.rx.set_notifications(!polling);
        }
    }

    fn in_flight(&self) -> usize {
        0
    }

    fn has_pending(&self) -> bool {
        self.control.pending.load(Ordering::Acquire)
            || self.uplink.as_ref().is_some_and(|uplink| uplink.ring.has_received())
            || self.ports.iter().flatten().any(|p| !p.broken && p.tx.has_avail().unwrap_or(false))
    }
}
