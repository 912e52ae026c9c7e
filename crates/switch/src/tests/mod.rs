//! The switch against hostile drivers, without a VM: each guest is real guest memory with its
//! receive and transmit rings laid out by hand, as a virtio-net driver lays them out.

use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::Arc;

use virtio::interrupt::InterruptLine;
use virtio::DeviceSignals;
use virtqueue::queue::{Queue, QueueConfig, VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE};
use virtqueue::QueueWorker;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::*;

mod announce;
mod iocores;
mod mtu;
mod offload;
mod pairs;
mod policy;
mod uplink;
mod wake;

const MEM: usize = 1 << 20;
const SIZE: u16 = 16;
/// (descriptors, avail, used) of the receive and the transmit ring.
const RX: (u64, u64, u64) = (0x1000, 0x2000, 0x3000);
const TX: (u64, u64, u64) = (0x4000, 0x5000, 0x6000);
/// Receive buffers: one page per descriptor; transmit buffers after them.
const RX_BUFFERS: u64 = 0x10000;
const TX_BUFFERS: u64 = 0x40000;

/// One guest on the switch: its memory, its driver's view of its rings, its port's number.
struct Guest {
    mem: GuestMemoryMmap,
    mac: MacAddr,
    rx_avail: u16,
    tx_avail: u16,
    rx_used_seen: u16,
    /// The rings' error eventfd (SET_VRING_ERR's).
    error: Arc<EventFd>,
    /// The transmit ring's kick.
    kick: Arc<EventFd>,
    port: usize,
}

fn signals(error: &Arc<EventFd>) -> DeviceSignals {
    DeviceSignals::new(
        InterruptLine::new(Arc::new(AtomicU32::new(0)), None),
        Arc::new(AtomicBool::new(false)),
    )
    .with_error_notifier(error.clone())
}

fn queue(mem: &GuestMemoryMmap, (desc, avail, used): (u64, u64, u64)) -> Queue {
    Queue::new(mem, QueueConfig { size: SIZE, desc, avail, used }, false).unwrap()
}

/// The rig's one queue pair in `mem`, its rings' errors to `error`, kicked by `tx_kick`.
fn queue_pair(mem: &GuestMemoryMmap, error: &Arc<EventFd>, tx_kick: Option<Arc<EventFd>>) -> QueuePair {
    QueuePair {
        rx: queue(mem, RX),
        tx: queue(mem, TX),
        rx_signals: signals(error),
        tx_signals: signals(error),
        tx_kick,
    }
}

struct Rig {
    control: Arc<SwitchControl>,
    /// Switch 0, which has the uplink if there is one.
    switch: Switch,
    /// The other switches (one per IOCore of a daemon with several).
    others: Vec<Switch>,
    guests: Vec<Guest>,
}

fn rig(guests: usize) -> Rig {
    rig_with(&vec![PortPolicy::default(); guests], None)
}

/// The address of guest `i`.
fn guest_mac(i: usize) -> MacAddr {
    MacAddr([0x52, 0x54, 0, 0, 0, i as u8 + 1])
}

/// A switch with a guest for each policy, and `uplink` if given.
fn rig_with(policies: &[PortPolicy], uplink: Option<af_packet::PacketRing>) -> Rig {
    rig_of(policies.iter().map(|&policy| (policy, Offloads::default())), uplink)
}

/// A switch with a guest for each policy and the offloads its driver takes, and `uplink`.
fn rig_of(ports: impl Iterator<Item = (PortPolicy, Offloads)>, uplink: Option<af_packet::PacketRing>) -> Rig {
    rig_on(1, ports, uplink)
}

/// [`rig_of`] on `switches` switches, as a daemon with as many IOCores runs them: guest `i` on
/// switch `i % switches`, the uplink on switch 0.
fn rig_on(
    switches: usize,
    ports: impl Iterator<Item = (PortPolicy, Offloads)>,
    uplink: Option<af_packet::PacketRing>,
) -> Rig {
    let control = Arc::new(SwitchControl::with_switches(switches).unwrap());
    let mut switch = Switch::new(control.clone(), 0).unwrap();
    if let Some(ring) = uplink {
        switch = switch.with_uplink(ring, Arc::default()).unwrap();
    }
    switch.set_polling(true);
    let others: Vec<Switch> = (1..switches)
        .map(|index| {
            let mut other = Switch::new(control.clone(), index).unwrap();
            other.set_polling(true);
            other
        })
        .collect();
    let guests = ports
        .enumerate()
        .map(|(i, (policy, offloads))| {
            let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
            let error = Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap());
            let kick = Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap());
            let port = Port::new(queue_pair(&mem, &error, Some(kick.clone())));
            let port = control.attach(port.with_policy(policy).with_offloads(offloads)).unwrap();
            Guest { mem, mac: guest_mac(i), rx_avail: 0, tx_avail: 0, rx_used_seen: 0, error, kick, port }
        })
        .collect();
    Rig { control, switch, others, guests }
}

/// An Ethernet frame of `len` bytes from `from` to `to`, its payload counting up from `seed`.
fn frame(to: MacAddr, from: MacAddr, len: usize, seed: u8) -> Vec<u8> {
    let mut frame: Vec<u8> = (0..len).map(|i| seed.wrapping_add(i as u8)).collect();
    frame[..6].copy_from_slice(&to.0);
    frame[6..12].copy_from_slice(&from.0);
    frame[12..14].copy_from_slice(&[0x08, 0x00]);
    frame
}

impl Guest {
    fn desc(&self, table: u64, index: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let at = table + 16 * index as u64;
        self.mem.write_obj(addr, GuestAddress(at)).unwrap();
        self.mem.write_obj(len, GuestAddress(at + 8)).unwrap();
        self.mem.write_obj(flags, GuestAddress(at + 12)).unwrap();
        self.mem.write_obj(next, GuestAddress(at + 14)).unwrap();
    }

    fn make_available(&mut self, rx: bool, head: u16) {
        let (avail, idx) = if rx { (RX.1, &mut self.rx_avail) } else { (TX.1, &mut self.tx_avail) };
        self.mem.write_obj(head, GuestAddress(avail + 4 + 2 * (*idx % SIZE) as u64)).unwrap();
        *idx = idx.wrapping_add(1);
        self.mem.write_obj(*idx, GuestAddress(avail + 2)).unwrap();
    }

    /// Post a receive chain at descriptor `head`: buffers of the lengths in `parts`.
    fn post_rx(&mut self, head: u16, parts: &[u32]) {
        for (i, &len) in parts.iter().enumerate() {
            let index = head + i as u16;
            let last = i + 1 == parts.len();
            let flags = VIRTQ_DESC_F_WRITE | if last { 0 } else { VIRTQ_DESC_F_NEXT };
            self.desc(RX.0, index, RX_BUFFERS + index as u64 * 0x1000, len, flags, index + 1);
        }
        self.make_available(true, head);
    }

    /// Transmit `frame` after a zero header from descriptor `head`, cut at `cuts` (offsets into
    /// header and frame together).
    fn transmit(&mut self, head: u16, frame: &[u8], cuts: &[usize]) {
        self.transmit_with(head, NetHeader::default(), frame, cuts);
    }

    /// `transmit` after `header`.
    fn transmit_with(&mut self, head: u16, header: NetHeader, frame: &[u8], cuts: &[usize]) {
        let mut bytes = header.to_bytes(0).to_vec();
        bytes.extend_from_slice(frame);
        let mut bounds = vec![0];
        bounds.extend(cuts.iter().copied().filter(|&c| c > 0 && c < bytes.len()));
        bounds.push(bytes.len());
        for (i, piece) in bounds.windows(2).enumerate() {
            let index = head + i as u16;
            let addr = TX_BUFFERS + index as u64 * 0x1000;
            self.mem.write_slice(&bytes[piece[0]..piece[1]], GuestAddress(addr)).unwrap();
            let last = i + 2 == bounds.len();
            let flags = if last { 0 } else { VIRTQ_DESC_F_NEXT };
            self.desc(TX.0, index, addr, (piece[1] - piece[0]) as u32, flags, index + 1);
        }
        self.make_available(false, head);
    }

    fn used_index(&self, rx: bool) -> u16 {
        let used = if rx { RX.2 } else { TX.2 };
        self.mem.read_obj(GuestAddress(used + 2)).unwrap()
    }

    /// The receive chains used since the last call, each laid out as `chain_parts` (as
    /// `post_rx` posted them): (head, used length, the bytes written, header included).
    fn used_chains(&mut self, chain_parts: &[u32]) -> Vec<(u32, usize, Vec<u8>)> {
        let mut chains = Vec::new();
        while self.rx_used_seen != self.used_index(true) {
            let slot = RX.2 + 4 + 8 * (self.rx_used_seen % SIZE) as u64;
            let head: u32 = self.mem.read_obj(GuestAddress(slot)).unwrap();
            let len: u32 = self.mem.read_obj(GuestAddress(slot + 4)).unwrap();
            self.rx_used_seen = self.rx_used_seen.wrapping_add(1);
            let mut bytes = Vec::new();
            let mut left = len as usize;
            for (i, &part) in chain_parts.iter().enumerate() {
                let n = left.min(part as usize);
                let mut piece = vec![0u8; n];
                let addr = RX_BUFFERS + (head as u64 + i as u64) * 0x1000;
                self.mem.read_slice(&mut piece, GuestAddress(addr)).unwrap();
                bytes.extend(piece);
                left -= n;
            }
            chains.push((head, len as usize, bytes));
        }
        chains
    }

    /// The frames delivered since the last call, one per chain: each chain read back, its
    /// header checked (no offload, one buffer) and stripped; an empty chain as an empty frame.
    fn received(&mut self, chain_parts: &[u32]) -> Vec<Vec<u8>> {
        let chains = self.used_chains(chain_parts);
        chains
            .into_iter()
            .map(|(_, len, bytes)| match len {
                0 => Vec::new(),
                _ => {
                    assert_eq!(&bytes[..NET_HDR_LEN], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0], "the header");
                    bytes[NET_HDR_LEN..].to_vec()
                }
            })
            .collect()
    }
}

impl Rig {
    /// A pass of every switch; with several, two, so a frame handed from one to another arrives.
    fn poll(&mut self) {
        let rounds = if self.others.is_empty() { 1 } else { 2 };
        for _ in 0..rounds {
            self.switch.poll();
            for other in &mut self.others {
                other.poll();
            }
        }
    }

    /// The switch that serves guest `guest`.
    fn home(&self, guest: usize) -> &Switch {
        match self.control.home_of(self.guests[guest].port) {
            Some(0) | None => &self.switch,
            Some(index) => &self.others[index - 1],
        }
    }

    fn counters(&self, guest: usize) -> PortCounters {
        self.home(guest).ports[self.guests[guest].port].as_ref().unwrap().counters
    }
}

#[test]
fn a_broadcast_floods_and_the_answer_goes_only_to_the_sender() {
    let mut rig = rig(3);
    for g in &mut rig.guests {
        g.post_rx(0, &[2048]);
        g.post_rx(1, &[2048]);
    }
    let (a, b) = (rig.guests[0].mac, rig.guests[1].mac);
    let hello = frame(MacAddr::BROADCAST, a, 60, 1);
    rig.guests[0].transmit(0, &hello, &[]);
    rig.poll();
    assert_eq!(rig.guests[0].received(&[2048]), Vec::<Vec<u8>>::new(), "no echo to the sender");
    assert_eq!(rig.guests[1].received(&[2048]), vec![hello.clone()]);
    assert_eq!(rig.guests[2].received(&[2048]), vec![hello]);
    let answer = frame(a, b, 98, 7);
    rig.guests[1].transmit(0, &answer, &[]);
    rig.poll();
    assert_eq!(rig.guests[0].received(&[2048]), vec![answer], "learnt: A is on port 0");
    assert_eq!(rig.guests[2].received(&[2048]), Vec::<Vec<u8>>::new(), "not flooded");
    assert_eq!(rig.guests[0].used_index(false), 1, "the transmit chain went back");
    assert_eq!(rig.counters(0).tx_frames, 1);
    assert_eq!(rig.counters(0).rx_frames, 1);
}

#[test]
fn frames_cut_anywhere_arrive_whole_in_chains_cut_elsewhere() {
    let mut rig = rig(2);
    let (a, b) = (rig.guests[0].mac, rig.guests[1].mac);
    let parts = [5u32, 13, 700, 2000];
    for (head, len) in [(0u16, 14usize), (4, 60), (8, 1518)] {
        rig.guests[1].post_rx(head, &parts);
        let sent = frame(b, a, len, head as u8);
        rig.guests[0].transmit(head, &sent, &[1, 11, 12, 13, 20, 333, 334]);
        rig.poll();
        assert_eq!(rig.guests[1].received(&parts), vec![sent], "a frame of {len} bytes");
    }
}

#[test]
fn a_frame_to_its_own_sender_is_dropped_and_counted() {
    let mut rig = rig(2);
    rig.guests[0].post_rx(0, &[2048]);
    rig.guests[1].post_rx(0, &[2048]);
    let a = rig.guests[0].mac;
    rig.guests[0].transmit(0, &frame(MacAddr::BROADCAST, a, 60, 0), &[]);
    rig.poll();
    rig.guests[0].transmit(1, &frame(a, a, 60, 0), &[]);
    rig.poll();
    assert_eq!(rig.counters(0).tx_to_self, 1);
    assert_eq!(rig.guests[0].received(&[2048]).len(), 0);
    assert_eq!(rig.guests[1].received(&[2048]).len(), 1, "only the broadcast");
}

#[test]
fn no_receive_buffer_or_too_short_a_one_drops_the_frame_and_keeps_the_chain() {
    let mut rig = rig(2);
    let (a, b) = (rig.guests[0].mac, rig.guests[1].mac);
    rig.guests[0].transmit(0, &frame(b, a, 100, 0), &[]);
    rig.poll();
    assert_eq!(rig.counters(1).rx_no_buffer, 1);
    // A chain of 12 + 50 bytes: a 100-byte frame does not fit; a 50-byte one does, later.
    rig.guests[1].post_rx(0, &[62]);
    rig.guests[0].transmit(1, &frame(b, a, 100, 0), &[]);
    rig.poll();
    assert_eq!(rig.counters(1).rx_too_big, 1);
    assert_eq!(rig.guests[1].received(&[62]).len(), 0, "the chain waits");
    let short = frame(b, a, 50, 3);
    rig.guests[0].transmit(2, &short, &[]);
    rig.poll();
    assert_eq!(rig.guests[1].received(&[62]), vec![short]);
}

#[test]
fn malformed_transmit_chains_are_returned_and_counted_and_the_switch_goes_on() {
    let mut rig = rig(2);
    let (a, b) = (rig.guests[0].mac, rig.guests[1].mac);
    rig.guests[1].post_rx(0, &[2048]);
    let guest = &mut rig.guests[0];
    // Shorter than header and Ethernet header.
    guest.transmit(0, &frame(b, a, 14, 0)[..10], &[]);
    // Longer than the longest frame.
    guest.transmit(1, &frame(b, a, MAX_FRAME_LEN + 1, 0), &[]);
    // A descriptor outside guest memory.
    guest.desc(TX.0, 2, MEM as u64 - 8, 64, 0, 0);
    guest.make_available(false, 2);
    // A writable descriptor in the transmit ring.
    guest.desc(TX.0, 3, TX_BUFFERS, 64, VIRTQ_DESC_F_WRITE, 0);
    guest.make_available(false, 3);
    rig.poll();
    assert_eq!(rig.counters(0).tx_malformed, 4);
    assert_eq!(rig.guests[0].used_index(false), 4, "every chain went back");
    let good = frame(b, a, 64, 9);
    rig.guests[0].transmit(4, &good, &[]);
    rig.poll();
    assert_eq!(rig.guests[1].received(&[2048]), vec![good]);
}

#[test]
fn a_broken_ring_stops_its_port_and_tells_its_frontend_while_the_others_go_on() {
    let mut rig = rig(3);
    let (b, c) = (rig.guests[1].mac, rig.guests[2].mac);
    rig.guests[2].post_rx(0, &[2048]);
    // Guest 0's avail index jumps past the ring's size.
    rig.guests[0].mem.write_obj(SIZE + 5, GuestAddress(TX.1 + 2)).unwrap();
    rig.poll();
    assert!(rig.switch.ports[rig.guests[0].port].as_ref().unwrap().broken);
    assert_eq!(rig.guests[0].error.read().unwrap(), 1, "the error eventfd was written");
    let sent = frame(c, b, 60, 2);
    rig.guests[1].transmit(0, &sent, &[]);
    rig.poll();
    assert_eq!(rig.guests[2].received(&[2048]), vec![sent]);
}

#[test]
fn a_detached_port_gets_its_rings_back_where_they_stopped_and_frames_no_longer_reach_it() {
    let mut rig = rig(2);
    let (a, b) = (rig.guests[0].mac, rig.guests[1].mac);
    rig.guests[0].post_rx(0, &[2048]);
    rig.guests[1].transmit(0, &frame(a, b, 60, 0), &[]);
    rig.poll();
    let control = rig.control.clone();
    let port = rig.guests[0].port;
    let detach = std::thread::spawn(move || control.detach(port));
    while !detach.is_finished() {
        rig.poll();
    }
    let parts = detach.join().unwrap().unwrap().into_parts();
    assert_eq!((parts.pairs[0].rx.next_avail(), parts.pairs[0].tx.next_avail()), (1, 0));
    rig.guests[1].transmit(1, &frame(a, b, 60, 0), &[]);
    rig.poll();
    assert_eq!(rig.counters(1).tx_frames, 2, "switched, flooded to nobody");
    assert_eq!(rig.counters(1).tx_unheard, 1, "the frame to the forgotten address");
}
