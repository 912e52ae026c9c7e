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

/// The switch's data path.
pub struct Switch {
    pub(crate) ports: Vec<Option<Box<Port>>>,
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
            table: MacTable::default(),
            control,
            frame: Chain::default(),
            polling: false,
        }
    }

    /// What port `id` did so far; `None` when no port is attached there.
    pub fn port_counters(&self, id: usize) -> Option<PortCounters> {
        self.ports.get(id)?.as_ref().map(|port| port.counters)
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

    /// Switch up to [`TX_BATCH`] frames from port `source`'s transmit ring; how many.
    fn transmit(&mut self, source: usize) -> usize {
        let mut taken = 0;
        while taken < TX_BATCH {
            let Some(port) = self.ports[source].as_deref_mut().filter(|p| !p.broken) else { break };
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
        port.counters.tx_frames += 1;
        let Addresses { destination, source: sender } = Addresses::parse(&start);
        self.table.learn(sender, source);
        match self.destination(destination) {
            Some(to) if to == source => {
                if let Some(port) = self.ports[source].as_deref_mut() {
                    port.counters.tx_to_self += 1;
                }
            }
            Some(to) => self.deliver(source, to, frame_len),
            None => {
                for to in (0..MAX_PORTS).filter(|&to| to != source) {
                    self.deliver(source, to, frame_len);
                }
            }
        }
    }

    /// The one port a frame to `mac` goes to; `None`: every other port.
    fn destination(&self, mac: MacAddr) -> Option<usize> {
        match mac.is_group() {
            true => None,
            false => self.table.lookup(mac),
        }
    }

    /// Copy the gathered frame from port `from` into port `to`'s next receive chain.
    fn deliver(&mut self, from: usize, to: usize, frame_len: usize) {
        let Some((sender, receiver)) = pair(&mut self.ports, from, to) else { return };
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
        let Some(head) = receiver.staged else { return };
        let Port { rx, staged_chain, log, .. } = &*receiver;
        let mark = |gpa: u64, len: usize| {
            if let Some(log) = log {
                log.mark(gpa, len as u64);
            }
        };
        // No offload was negotiated: all fields 0 but `num_buffers`, 1.
        let mut header = [0u8; NET_HDR_LEN];
        header[10] = 1;
        let mem = rx.memory();
        let copied = staged_chain.write(mem, 0, &header, mark)
            && copy(
                At { chain: staged_chain, mem, offset: NET_HDR_LEN },
                At { chain: &self.frame, mem: sender.tx.memory(), offset: NET_HDR_LEN },
                frame_len,
                mark,
            );
        receiver.staged = None;
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
}

/// The ports `from` and `to` (different) of `ports`, both attached.
fn pair(ports: &mut [Option<Box<Port>>], from: usize, to: usize) -> Option<(&Port, &mut Port)> {
    if from == to {
        return None;
    }
    let (sender, receiver) = match from < to {
        true => {
            let (low, high) = ports.split_at_mut(to);
            (low[from].as_deref(), high[0].as_deref_mut())
        }
        false => {
            let (low, high) = ports.split_at_mut(from);
            (high[0].as_deref(), low[to].as_deref_mut())
        }
    };
    Some((sender?, receiver?))
}

impl QueueWorker for Switch {
    fn poll(&mut self) -> usize {
        if self.control.pending.swap(false, Ordering::Acquire) {
            self.apply_commands();
        }
        let mut work = 0;
        for source in 0..MAX_PORTS {
            if self.ports[source].is_some() {
                work += self.transmit(source);
            }
        }
        if work > 0 {
            for port in self.ports.iter_mut().flatten() {
                port.publish();
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
            || self.ports.iter().flatten().any(|p| !p.broken && p.tx.has_avail().unwrap_or(false))
    }
}
