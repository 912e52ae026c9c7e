//! One NIC on the switch: its guest's queue pairs (a receive and a transmit ring each), and
//! what it did.

use rate_limiter::{Limits, RateLimiter};
use virtio::DeviceSignals;
use virtqueue::dirty::DirtyLog;
use virtqueue::queue::{Queue, QueueError};
use vm_memory::GuestMemoryMmap;

use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use crate::chain::Chain;
use crate::counters::{PortCounters, SharedPortCounters};
use crate::ethernet::MacAddr;
use crate::offload::Offloads;
use crate::switch::{DEFAULT_MTU, FRAME_OVERHEAD, MAX_FRAME_LEN, MAX_MTU};

/// Receive chains one frame may span (MRG_RXBUF): a 64 KiB super-frame in the smallest
/// buffers Linux posts (1,536 bytes) takes 43.
pub const MAX_MERGED: usize = 64;

/// Receive chains taken from the ring and not filled yet, in the order taken: a frame that did
/// not fit (or found the ring empty half-way) was dropped, and they wait for the next.
pub(crate) struct Staged {
    pub(crate) heads: [u16; MAX_MERGED],
    pub(crate) chains: Box<[Chain]>,
    pub(crate) count: usize,
}

impl Staged {
    /// Room for the chains one frame may span: [`MAX_MERGED`] with merged receive buffers, one
    /// without.
    fn new(offloads: Offloads) -> Staged {
        let most = if offloads.merged_buffers { MAX_MERGED } else { 1 };
        let chains = (0..most).map(|_| Chain::default()).collect();
        Staged { heads: [0; MAX_MERGED], chains, count: 0 }
    }

    /// The most chains one frame may span.
    pub(crate) fn most(&self) -> usize {
        self.chains.len()
    }

    /// The bytes the staged chains hold.
    pub(crate) fn room(&self) -> usize {
        self.chains[..self.count].iter().map(|chain| chain.len).sum()
    }

    /// The first `used` chains were filled: the others move to the front.
    pub(crate) fn consume(&mut self, used: usize) {
        let used = used.min(self.count);
        self.heads[..self.count].rotate_left(used);
        self.chains[..self.count].rotate_left(used);
        self.count -= used;
    }
}

/// What a NIC may do on the switch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortPolicy {
    /// Its own address, pinned to it: a frame from this address on any other port (or the
    /// uplink) is dropped as spoofed, so nobody diverts its frames.
    pub mac: Option<MacAddr>,
    /// Isolated: it talks to the uplink only, never to another NIC, and only from this address
    /// (a frame from any other is dropped as spoofed).
    pub isolated_to: Option<MacAddr>,
    /// What it may send: frames (`iops`) and bytes per second. A frame over the limit waits in
    /// its transmit ring, as a disk's request does.
    pub limits: Limits,
    /// Its MTU, [`DEFAULT_MTU`] to [`MAX_MTU`]; `None`: [`DEFAULT_MTU`]. A frame longer than
    /// it takes (but a super-frame) is malformed from it and too long for it.
    pub mtu: Option<u16>,
}

impl PortPolicy {
    /// Its MTU.
    pub fn mtu(&self) -> u16 {
        self.mtu.unwrap_or(DEFAULT_MTU).clamp(DEFAULT_MTU, MAX_MTU)
    }

    /// The longest frame it sends and receives, but a super-frame: its MTU of payload, an
    /// Ethernet header and a VLAN tag.
    pub fn max_frame_len(&self) -> usize {
        usize::from(self.mtu()) + FRAME_OVERHEAD
    }
}

/// One receive and one transmit ring of a NIC (a virtio-net queue pair), in its guest's memory,
/// each with the signals of its own call and error eventfds.
pub struct QueuePair {
    /// The receive ring.
    pub rx: Queue,
    /// The transmit ring.
    pub tx: Queue,
    /// The receive ring's signals.
    pub rx_signals: DeviceSignals,
    /// The transmit ring's signals.
    pub tx_signals: DeviceSignals,
    /// The eventfd the driver kicks when it offers frames on the transmit ring, which wakes a
    /// switch that sleeps; `None`: the frontend gave none, so a switch that sleeps wakes every
    /// millisecond to look at the ring.
    pub tx_kick: Option<Arc<EventFd>>,
}

/// What [`Port::into_parts`] hands back.
pub struct PortParts {
    /// Its queue pairs, in the order it was given them, the rings where they stopped.
    pub pairs: Vec<QueuePair>,
    /// The dirty log it marked in.
    pub log: Option<DirtyLog>,
    /// What it did on the switch.
    pub counters: PortCounters,
}

/// A queue pair on the switch: the rings, and what the switch keeps for them.
pub(crate) struct Pair {
    pub(crate) rx: Queue,
    pub(crate) tx: Queue,
    rx_signals: DeviceSignals,
    tx_signals: DeviceSignals,
    pub(crate) tx_kick: Option<Arc<EventFd>>,
    /// Receive chains taken and not filled yet.
    pub(crate) staged: Staged,
    rx_used: usize,
    tx_used: usize,
}

impl Pair {
    fn new(pair: QueuePair, offloads: Offloads) -> Pair {
        let QueuePair { rx, tx, rx_signals, tx_signals, tx_kick } = pair;
        Pair {
            rx,
            tx,
            rx_signals,
            tx_signals,
            tx_kick,
            staged: Staged::new(offloads),
            rx_used: 0,
            tx_used: 0,
        }
    }

    /// A transmit chain was consumed.
    pub(crate) fn tx_done(&mut self, head: u16) {
        self.tx.add_used(head, 0);
        self.tx_used += 1;
    }

    /// A receive chain was filled with `written` bytes (0: returned unused).
    pub(crate) fn rx_done(&mut self, head: u16, written: u32) {
        self.rx.add_used(head, written);
        self.rx_used += 1;
    }

    /// Tell the driver it broke ring `rx` or `tx` (its error eventfd).
    fn report_break(&self, rx: bool, why: QueueError) {
        match rx {
            true => self.rx_signals.queue_broken(why),
            false => self.tx_signals.queue_broken(why),
        }
    }

    /// Publish what the switch used of both rings since the last call, and interrupt the
    /// driver where it asked to be; how many interrupts.
    fn publish(&mut self) -> u64 {
        let mut interrupts = 0;
        if std::mem::take(&mut self.tx_used) > 0 {
            self.tx.publish_used();
            if self.tx.needs_interrupt() {
                self.tx_signals.signal_used_buffers();
                interrupts += 1;
            }
        }
        if std::mem::take(&mut self.rx_used) > 0 {
            self.rx.publish_used();
            if self.rx.needs_interrupt() {
                self.rx_signals.signal_used_buffers();
                interrupts += 1;
            }
        }
        interrupts
    }

    /// Back to the device model, staged receive chains returned unused first.
    fn into_queue_pair(mut self) -> QueuePair {
        if self.staged.count > 0 {
            for &head in &self.staged.heads[..self.staged.count] {
                self.rx.add_used(head, 0);
            }
            self.staged.count = 0;
            self.rx.publish_used();
        }
        QueuePair {
            rx: self.rx,
            tx: self.tx,
            rx_signals: self.rx_signals,
            tx_signals: self.tx_signals,
            tx_kick: self.tx_kick,
        }
    }
}

/// A NIC's rings on the switch. Built by the device model once a queue pair runs, handed to the
/// switch through [`crate::SwitchControl::attach`], and handed back by `detach`.
pub struct Port {
    /// Its queue pairs, at least one: frames are taken from every transmit ring, and each flow
    /// is delivered to one receive ring (`rx_pair`).
    pub(crate) pairs: Vec<Pair>,
    /// Marks the guest pages frames are written into, while a live migration runs.
    pub(crate) log: Option<DirtyLog>,
    /// What its driver takes on receive.
    pub(crate) offloads: Offloads,
    /// The driver broke a ring: the port is not served until it is detached.
    pub(crate) broken: bool,
    /// Its own address, pinned to it in the switch's table.
    pub(crate) mac: Option<MacAddr>,
    /// Isolated to the uplink, sending only from this address.
    pub(crate) isolated_to: Option<MacAddr>,
    /// Its transmit limits, if it has any.
    pub(crate) limiter: Option<RateLimiter>,
    /// The longest frame it sends or receives, but a super-frame (`PortPolicy::max_frame_len`).
    pub(crate) max_frame_len: usize,
    /// What it did (since it was attached, or before too: see `with_shared_counters`).
    pub counters: PortCounters,
    /// Where `counters` are published for other threads, once per pass that did work.
    shared: Arc<SharedPortCounters>,
}

impl Port {
    /// A port of queue pair `first`; more come with [`Port::with_pair`].
    pub fn new(first: QueuePair) -> Port {
        Port {
            pairs: vec![Pair::new(first, Offloads::default())],
            log: None,
            offloads: Offloads::default(),
            broken: false,
            mac: None,
            isolated_to: None,
            limiter: None,
            max_frame_len: MAX_FRAME_LEN,
            counters: PortCounters::default(),
            shared: Arc::default(),
        }
    }

    /// Another queue pair, in the same guest's memory.
    pub fn with_pair(mut self, pair: QueuePair) -> Port {
        self.pairs.push(Pair::new(pair, self.offloads));
        self
    }

    /// Publish what it does in `shared`, counting on from what is there (a NIC's counters go on
    /// across its frontend's reconnections).
    pub fn with_shared_counters(mut self, shared: Arc<SharedPortCounters>) -> Port {
        self.counters = shared.read();
        self.shared = shared;
        self
    }

    /// Hold the port to `policy`.
    pub fn with_policy(mut self, policy: PortPolicy) -> Port {
        self.mac = policy.mac;
        self.isolated_to = policy.isolated_to;
        self.limiter = policy.limits.any().then(|| RateLimiter::new(policy.limits));
        self.max_frame_len = policy.max_frame_len();
        self
    }

    /// Hand its driver frames with the offloads it accepted (`Offloads::from_features`); the
    /// switch does the rest itself. Default: none (every frame whole, checksummed, in one chain).
    pub fn with_offloads(mut self, offloads: Offloads) -> Port {
        self.offloads = offloads;
        for pair in &mut self.pairs {
            pair.staged = Staged::new(offloads);
        }
        self
    }

    /// Mark every guest page the switch writes in `log`.
    pub fn with_dirty_log(mut self, log: Option<DirtyLog>) -> Port {
        self.log = log;
        self
    }

    /// Everything back, the rings where they stopped.
    pub fn into_parts(self) -> PortParts {
        PortParts {
            pairs: self.pairs.into_iter().map(Pair::into_queue_pair).collect(),
            log: self.log,
            counters: self.counters,
        }
    }

    /// The guest memory its rings and frames are in.
    pub(crate) fn memory(&self) -> &GuestMemoryMmap {
        self.pairs[0].tx.memory()
    }

    /// The queue pair whose receive ring takes the frames of flow `flow` (`ethernet::flow_of`).
    pub(crate) fn rx_pair(&self, flow: u32) -> usize {
        usize::try_from(flow).unwrap_or(0) % self.pairs.len()
    }

    /// May it talk to port `other`? Not if either is isolated.
    pub(crate) fn may_reach(&self, other: &Port) -> bool {
        self.isolated_to.is_none() && other.isolated_to.is_none()
    }

    /// Ask its driver to kick when it offers frames to send (`true`), or not. It never needs to
    /// kick for the buffers it offers to receive into: a frame that finds none is dropped at once.
    pub(crate) fn set_notifications(&mut self, enabled: bool) {
        for pair in &mut self.pairs {
            pair.tx.set_notifications(enabled);
            pair.rx.set_notifications(false);
        }
    }

    /// Must the switch look at it now and then, with no kick to wake it for some transmit ring?
    pub(crate) fn needs_polling(&self) -> bool {
        !self.broken && self.pairs.iter().any(|pair| pair.tx_kick.is_none())
    }

    /// Has a transmit ring frames waiting?
    pub(crate) fn has_avail(&self) -> bool {
        !self.broken && self.pairs.iter().any(|pair| pair.tx.has_avail().unwrap_or(false))
    }

    /// The driver broke ring `rx` or `tx` of pair `pair`: tell it and stop serving the port.
    pub(crate) fn break_ring(&mut self, pair: usize, rx: bool, why: QueueError) {
        self.broken = true;
        if let Some(pair) = self.pairs.get(pair) {
            pair.report_break(rx, why);
        }
    }

    /// Publish what the switch used of every ring since the last call, and interrupt the
    /// driver where it asked to be.
    pub(crate) fn publish(&mut self) {
        self.shared.publish(&self.counters);
        for pair in &mut self.pairs {
            self.counters.interrupts += pair.publish();
        }
    }
}
