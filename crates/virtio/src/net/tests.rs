//! The virtio-net data path against a hostile driver and a hostile network, without a VM: rings
//! laid out by hand in real guest memory, frames through a real datagram socket pair.

use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use virtqueue::queue::{Queue, QueueConfig, VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE};
use virtqueue::QueueWorker;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::*;
use crate::device::DeviceSignals;
use crate::interrupt::InterruptLine;

const MEM: usize = 1 << 20;
const SIZE: u16 = 16;
/// (descriptors, avail, used) of the receive and the transmit queue.
const RX: (u64, u64, u64) = (0x1000, 0x2000, 0x3000);
const TX: (u64, u64, u64) = (0x4000, 0x5000, 0x6000);
const BUFFERS: u64 = 0x10000;

struct Rig {
    mem: GuestMemoryMmap,
    worker: NetWorker,
    /// The network's end of the socket pair.
    wire: UnixDatagram,
    rx_avail: u16,
    tx_avail: u16,
    needs_reset: Arc<AtomicBool>,
}

fn queue(mem: &GuestMemoryMmap, (desc, avail, used): (u64, u64, u64)) -> Queue {
    Queue::new(mem, QueueConfig { size: SIZE, desc, avail, used }, false).unwrap()
}

fn rig() -> Rig {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
    let (device_end, wire) = UnixDatagram::pair().unwrap();
    device_end.set_nonblocking(true).unwrap();
    wire.set_nonblocking(true).unwrap();
    let needs_reset = Arc::new(AtomicBool::new(false));
    let signals =
        DeviceSignals::new(InterruptLine::new(Arc::new(AtomicU32::new(0)), None), needs_reset.clone());
    let mut worker =
        NetWorker::new(queue(&mem, RX), queue(&mem, TX), mem.clone(), Box::new(device_end), signals);
    worker.set_polling(true);
    Rig { mem, worker, wire, rx_avail: 0, tx_avail: 0, needs_reset }
}

fn frame(len: usize, fill: u8) -> Vec<u8> {
    let mut frame = vec![fill; len];
    frame[12..14].copy_from_slice(&[0x08, 0x00]);
    frame
}

impl Rig {
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

    /// Post a receive chain of one writable buffer of `len` bytes at descriptor `head`.
    fn post_rx(&mut self, head: u16, len: u32) {
        self.desc(RX.0, head, BUFFERS + head as u64 * 0x1000, len, VIRTQ_DESC_F_WRITE, 0);
        self.make_available(true, head);
    }

    /// Transmit `frame` (after a zero header) from descriptor `head`, split in two descriptors.
    fn transmit(&mut self, head: u16, frame: &[u8]) {
        let addr = BUFFERS + 0x80000 + head as u64 * 0x1000;
        self.mem.write_slice(&[0u8; NET_HDR_LEN], GuestAddress(addr)).unwrap();
        self.mem.write_slice(frame, GuestAddress(addr + NET_HDR_LEN as u64)).unwrap();
        self.desc(TX.0, head, addr, NET_HDR_LEN as u32, VIRTQ_DESC_F_NEXT, head + 1);
        self.desc(TX.0, head + 1, addr + NET_HDR_LEN as u64, frame.len() as u32, 0, 0);
        self.make_available(false, head);
    }

    fn used(&self, queue: (u64, u64, u64)) -> (u16, u32, u32) {
        let idx: u16 = self.mem.read_obj(GuestAddress(queue.2 + 2)).unwrap();
        let slot = (idx.wrapping_sub(1) % SIZE) as u64;
        let id: u32 = self.mem.read_obj(GuestAddress(queue.2 + 4 + 8 * slot)).unwrap();
        let len: u32 = self.mem.read_obj(GuestAddress(queue.2 + 8 + 8 * slot)).unwrap();
        (idx, id, len)
    }

    fn received(&self, head: u16, len: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; len];
        self.mem.read_slice(&mut bytes, GuestAddress(BUFFERS + head as u64 * 0x1000)).unwrap();
        bytes
    }

    fn wire_frame(&self) -> Option<Vec<u8>> {
        let mut buffer = [0u8; 4096];
        self.wire.recv(&mut buffer).ok().map(|n| buffer[..n].to_vec())
    }

    /// A full round trip still works: a frame out, a frame in.
    fn assert_still_works(&mut self) {
        let out = frame(60, 0x11);
        self.transmit(0, &out);
        self.worker.poll();
        assert_eq!(self.wire_frame().as_deref(), Some(&out[..]));
        self.post_rx(9, 2048);
        let back = frame(70, 0x22);
        self.wire.send(&back).unwrap();
        self.worker.poll();
        assert_eq!(self.used(RX).2, (NET_HDR_LEN + 70) as u32);
        assert_eq!(&self.received(9, NET_HDR_LEN + 70)[NET_HDR_LEN..], &back[..]);
    }
}

#[test]
fn frames_go_out_and_come_in_with_a_header() {
    let mut rig = rig();
    let out = frame(100, 0xab);
    rig.transmit(0, &out);
    rig.post_rx(3, 2048);
    let back = frame(200, 0xcd);
    rig.wire.send(&back).unwrap();
    rig.worker.poll();
    assert_eq!(rig.wire_frame().unwrap(), out, "the header is stripped, the frame gathered");
    assert_eq!(rig.used(TX), (1, 0, 0));
    assert_eq!(rig.used(RX), (1, 3, (NET_HDR_LEN + 200) as u32));
    let received = rig.received(3, NET_HDR_LEN + 200);
    assert_eq!(&received[..NET_HDR_LEN], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0], "num_buffers = 1");
    assert_eq!(&received[NET_HDR_LEN..], &back[..]);
    assert_eq!((rig.worker.counters.tx_frames, rig.worker.counters.rx_frames), (1, 1));
}

#[test]
fn hostile_transmit_chains_are_returned_unsent() {
    let mut rig = rig();
    // Outside guest RAM.
    rig.desc(TX.0, 0, MEM as u64 - 8, 64, 0, 0);
    rig.make_available(false, 0);
    // A length that wraps around the address space.
    rig.desc(TX.0, 1, u64::MAX - 16, 64, 0, 0);
    rig.make_available(false, 1);
    // Larger than any frame.
    rig.desc(TX.0, 2, BUFFERS, (NET_HDR_LEN + MAX_FRAME_LEN + 1) as u32, 0, 0);
    rig.make_available(false, 2);
    // Shorter than the header.
    rig.desc(TX.0, 3, BUFFERS, 8, 0, 0);
    rig.make_available(false, 3);
    // Device-writable: the wrong direction for transmission.
    rig.desc(TX.0, 4, BUFFERS, 100, VIRTQ_DESC_F_WRITE, 0);
    rig.make_available(false, 4);
    rig.worker.poll();
    assert_eq!(rig.worker.counters.tx_malformed, 5);
    assert_eq!(rig.used(TX).0, 5, "every chain is given back");
    assert!(rig.wire_frame().is_none(), "nothing reached the network");
    rig.assert_still_works();
}

#[test]
fn a_transmit_loop_needs_a_reset() {
    let mut rig = rig();
    rig.desc(TX.0, 0, BUFFERS, 64, VIRTQ_DESC_F_NEXT, 1);
    rig.desc(TX.0, 1, BUFFERS, 64, VIRTQ_DESC_F_NEXT, 0);
    rig.make_available(false, 0);
    assert_eq!(rig.worker.poll(), 0);
    assert!(rig.needs_reset.load(Ordering::Acquire));
    assert_eq!(rig.worker.poll(), 0, "a broken device serves nothing until reset");
}

#[test]
fn hostile_network_frames_are_dropped_and_counted() {
    let mut rig = rig();
    // No receive buffer posted.
    rig.wire.send(&frame(60, 1)).unwrap();
    rig.worker.poll();
    assert_eq!(rig.worker.counters.rx_no_buffer, 1);
    // Larger than the posted buffer, then truncated (shorter than an Ethernet header): both
    // dropped, and the buffer still takes the next good frame.
    rig.post_rx(5, (NET_HDR_LEN + 100) as u32);
    rig.wire.send(&frame(101, 2)).unwrap();
    rig.wire.send(&[0u8; 5]).unwrap();
    let good = frame(100, 3);
    rig.wire.send(&good).unwrap();
    rig.worker.poll();
    assert_eq!((rig.worker.counters.rx_too_big, rig.worker.counters.rx_truncated), (1, 1));
    assert_eq!(rig.used(RX), (1, 5, (NET_HDR_LEN + 100) as u32));
    assert_eq!(&rig.received(5, NET_HDR_LEN + 100)[NET_HDR_LEN..], &good[..]);
    rig.assert_still_works();
}

#[test]
fn hostile_receive_chains_are_returned_empty() {
    let mut rig = rig();
    // Read-only receive buffer.
    rig.desc(RX.0, 0, BUFFERS, 2048, 0, 0);
    rig.make_available(true, 0);
    // Outside RAM.
    rig.desc(RX.0, 1, MEM as u64, 2048, VIRTQ_DESC_F_WRITE, 0);
    rig.make_available(true, 1);
    // Too small for a header and an Ethernet header.
    rig.desc(RX.0, 2, BUFFERS, 20, VIRTQ_DESC_F_WRITE, 0);
    rig.make_available(true, 2);
    rig.wire.send(&frame(60, 4)).unwrap();
    rig.worker.poll();
    assert_eq!(rig.worker.counters.rx_malformed, 3);
    assert_eq!(rig.used(RX), (3, 2, 0));
    rig.assert_still_works();
}

#[test]
fn a_header_split_over_descriptors_is_written_across_them() {
    let mut rig = rig();
    rig.desc(RX.0, 0, BUFFERS, 5, VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT, 1);
    rig.desc(RX.0, 1, BUFFERS + 0x100, 2048, VIRTQ_DESC_F_WRITE, 0);
    rig.make_available(true, 0);
    let back = frame(64, 9);
    rig.wire.send(&back).unwrap();
    rig.worker.poll();
    let mut tail = vec![0u8; 7 + 64];
    rig.mem.read_slice(&mut tail, GuestAddress(BUFFERS + 0x100)).unwrap();
    assert_eq!(tail[5], 1, "num_buffers lands in the second descriptor");
    assert_eq!(&tail[7..], &back[..]);
}

#[test]
fn a_chain_offered_twice_before_it_was_returned_needs_a_reset() {
    let mut rig = rig();
    let out = frame(60, 0x33);
    rig.transmit(0, &out);
    rig.make_available(false, 0); // the same chain again, in the same batch
    rig.worker.poll();
    assert!(rig.needs_reset.load(Ordering::Acquire));
    assert_eq!(rig.wire_frame().as_deref(), Some(&out[..]), "sent once");
    assert_eq!(rig.wire_frame(), None, "not twice");

    // A receive chain still waiting for a frame, offered again: found when the device looks
    // for the next chain after filling it.
    let mut rig = self::rig();
    rig.post_rx(4, 2048);
    rig.worker.poll();
    rig.make_available(true, 4);
    rig.wire.send(&frame(60, 0x44)).unwrap();
    rig.worker.poll();
    assert!(rig.needs_reset.load(Ordering::Acquire));
}

#[test]
fn while_a_migration_logs_the_pages_a_received_frame_lands_in_and_the_used_rings_are_marked() {
    let mut rig = rig();
    let bitmap = virtqueue::dirty::DirtyBitmap::new(MEM as u64);
    assert!(rig.worker.set_dirty_log(Some(bitmap.log())));
    // A chain of two buffers on separate pages: the header and the frame's start in the first,
    // the rest of the frame in the second.
    let (first, second) = (BUFFERS + 0x1000, BUFFERS + 0x3000);
    rig.desc(RX.0, 1, first, 100, VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT, 2);
    rig.desc(RX.0, 2, second, 2000, VIRTQ_DESC_F_WRITE, 0);
    rig.make_available(true, 1);
    rig.transmit(4, &frame(80, 0x33));
    rig.wire.send(&frame(500, 0x44)).unwrap();
    rig.worker.poll();
    assert_eq!(rig.used(RX), (1, 1, (NET_HDR_LEN + 500) as u32));
    let log = bitmap.log();
    for (what, gpa) in [
        ("the header's page", first),
        ("the frame's second part", second),
        ("rx used", RX.2),
        ("tx used", TX.2),
    ] {
        assert!(log.is_marked(gpa), "{what} is not marked");
    }
    for (what, gpa) in
        [("a page between the parts", BUFFERS + 0x2000), ("the transmitted frame", BUFFERS + 0x84000)]
    {
        assert!(!log.is_marked(gpa), "{what} is marked, yet the device did not write it");
    }

    // Logging off: a frame received later marks nothing.
    rig.worker.set_dirty_log(None);
    rig.post_rx(9, 2048);
    rig.wire.send(&frame(60, 0x55)).unwrap();
    rig.worker.poll();
    assert_eq!(rig.used(RX).1, 9);
    assert!(!log.is_marked(BUFFERS + 9 * 0x1000));
}

#[test]
fn a_restored_nic_announces_its_address_with_a_broadcast_rarp() {
    use crate::VirtioDevice;
    let (device_end, wire) = UnixDatagram::pair().unwrap();
    let mac = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
    let mut net = Net::new(Box::new(device_end), mac);
    net.announce();
    let mut buffer = [0u8; 128];
    let n = wire.recv(&mut buffer).unwrap();
    let frame = &buffer[..n];
    assert_eq!(n, 60);
    assert_eq!(&frame[..6], &[0xff; 6], "broadcast");
    assert_eq!(&frame[6..12], &mac, "from the NIC");
    assert_eq!(&frame[12..14], &[0x80, 0x35], "RARP");
    assert_eq!(&frame[14..22], &[0, 1, 0x08, 0x00, 6, 4, 0, 3], "Ethernet/IPv4, reverse request");
    assert_eq!((&frame[22..28], &frame[32..38]), (&mac[..], &mac[..]), "about the NIC's address");
}
