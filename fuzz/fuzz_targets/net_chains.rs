//! virtio-net: the net worker's transmit chain parsing (header + frame over 1-3 descriptors)
//! and receive buffer filling, with frames of every length arriving from a real datagram socket
//! pair, between a hostile driver's writes. While the queues are not broken, every chain the
//! device took has exactly one used entry; every frame sent reached the wire; every frame that
//! arrived is delivered, dropped with a count, or still waiting.
#![no_main]

use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, Ordering};

use arbitrary::{Result, Unstructured};
use exitless_fuzz::{address, guest_memory, queue_config, signals, DriverRing, MAX_STEPS};
use libfuzzer_sys::fuzz_target;
use virtio::net::{NetCounters, NetWorker, MAX_FRAME_LEN, MIN_FRAME_LEN, NET_HDR_LEN};
use virtqueue::queue::{Descriptor, Queue, VIRTQ_DESC_F_WRITE};
use virtqueue::QueueWorker;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// The device's end and the network's end of one socket pair per thread.
fn sockets() -> (UnixDatagram, UnixDatagram) {
    thread_local! {
        static PAIR: (UnixDatagram, UnixDatagram) = {
            let (device, wire) = UnixDatagram::pair().expect("socketpair");
            device.set_nonblocking(true).expect("non-blocking device end");
            wire.set_nonblocking(true).expect("non-blocking wire end");
            (device, wire)
        };
    }
    PAIR.with(|(device, wire)| (device.try_clone().expect("dup"), wire.try_clone().expect("dup")))
}

/// Receive and count every datagram waiting on `socket`, checking each against `check`.
fn drain(socket: &UnixDatagram, buffer: &mut [u8], check: impl Fn(usize)) -> u64 {
    let mut count = 0;
    while let Ok(n) = socket.recv(buffer) {
        check(n);
        count += 1;
    }
    count
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});

fn run(u: &mut Unstructured) -> Result<()> {
    let (device_end, wire) = sockets();
    let mut buffer = vec![0u8; 1 << 17];
    // Whatever an earlier input left in the sockets.
    drain(&wire, &mut buffer, |_| {});
    drain(&device_end, &mut buffer, |_| {});

    let mem = guest_memory();
    let event_idx = u.arbitrary()?;
    let (rx_config, rx_laid_out) = queue_config(u, 0)?;
    let (tx_config, tx_laid_out) = queue_config(u, 1)?;
    let (Ok(rx), Ok(tx)) = (Queue::new(&mem, rx_config, event_idx), Queue::new(&mem, tx_config, event_idx))
    else {
        return Ok(());
    };
    let (signals, needs_reset) = signals();
    let backend = device_end.try_clone().expect("dup");
    let mut worker = NetWorker::new(rx, tx, mem.clone(), Box::new(backend), signals);
    worker.set_polling(u.arbitrary()?);
    let mut rx_ring = DriverRing::new(rx_config, rx_laid_out);
    let mut tx_ring = DriverRing::new(tx_config, tx_laid_out);
    let mut on_wire = 0u64;
    let mut injected = 0u64;
    let mut used_index_covered = false;
    for _ in 0..MAX_STEPS {
        if u.is_empty() {
            break;
        }
        match u.int_in_range(0..=9)? {
            0 => rx_ring.driver_step(u, &mem)?,
            1 => tx_ring.driver_step(u, &mem)?,
            2 | 3 => rx_ring.net_receive_chain(u, &mem)?,
            4 | 5 => post_transmit_chain(u, &mem, &mut tx_ring)?,
            6 => {
                let len = frame_len(u)?;
                let frame = &mut buffer[..len];
                u.fill_buffer(frame)?;
                if wire.send(frame).is_ok() {
                    injected += 1;
                }
            }
            7 => worker.set_polling(u.arbitrary()?),
            _ => {
                let was_broken = needs_reset.load(Ordering::Acquire);
                used_index_covered |= receive_buffer_covers_a_used_index(&mem, &rx_ring, &tx_ring);
                let served = worker.poll();
                used_index_covered |= receive_buffer_covers_a_used_index(&mem, &rx_ring, &tx_ring);
                assert!(!was_broken || served == 0, "a broken device served {served} packets");
                on_wire += drain(&wire, &mut buffer, |n| {
                    assert!((MIN_FRAME_LEN..=MAX_FRAME_LEN).contains(&n), "a {n}-byte frame sent")
                });
                let rings = (!used_index_covered).then_some((&rx_ring, &tx_ring));
                check(&worker.counters, on_wire, &mem, rings, &needs_reset);
            }
        }
    }
    let waiting = drain(&device_end, &mut buffer, |_| {});
    let c = worker.counters;
    if !needs_reset.load(Ordering::Acquire) {
        let accounted = c.rx_frames + c.rx_no_buffer + c.rx_too_big + c.rx_truncated + waiting;
        assert_eq!(accounted, injected, "frames lost: {c:?}, {waiting} waiting");
    }
    Ok(())
}

/// A frame length: mostly what Ethernet carries, sometimes runts or jumbo frames.
fn frame_len(u: &mut Unstructured) -> Result<usize> {
    Ok(match u.int_in_range(0..=7)? {
        0 => u.int_in_range(0..=MIN_FRAME_LEN + 1)?,
        1 => u.int_in_range(MAX_FRAME_LEN - 2..=MAX_FRAME_LEN + 2)?,
        2 => u.int_in_range(MAX_FRAME_LEN..=70_000)?,
        _ => u.int_in_range(MIN_FRAME_LEN..=MAX_FRAME_LEN)?,
    })
}

/// A transmit chain: a virtio-net header and a frame (fuzz bytes), over 1-3 buffers.
fn post_transmit_chain(u: &mut Unstructured, mem: &GuestMemoryMmap, ring: &mut DriverRing) -> Result<()> {
    let total = NET_HDR_LEN + frame_len(u)?.min(4096);
    let count = u.int_in_range(1..=3)?;
    let mut parts = [(0, 0, 0); 3];
    let mut left = total;
    for (i, part) in parts[..count].iter_mut().enumerate() {
        let len = if i + 1 == count { left } else { u.int_in_range(0..=left)? };
        left -= len;
        let addr = address(u)?;
        let mut bytes = [0u8; 64];
        u.fill_buffer(&mut bytes)?;
        // The first bytes of each piece from the input, the rest whatever RAM holds.
        ring.write(mem, addr, &bytes[..len.min(64)]);
        let flags = if u.ratio(1, 16)? { VIRTQ_DESC_F_WRITE } else { 0 };
        *part = (addr, len as u32, flags);
    }
    ring.chain(u, mem, &parts[..count])
}

/// Every frame sent is on the wire; while no queue broke, each ring's used index counts exactly
/// the chains the device took (`rings`: `None` once a frame may have been written over one).
fn check(
    c: &NetCounters,
    on_wire: u64,
    mem: &GuestMemoryMmap,
    rings: Option<(&DriverRing, &DriverRing)>,
    needs_reset: &AtomicBool,
) {
    assert_eq!(on_wire, c.tx_frames, "frames on the wire vs sent");
    let Some((rx, tx)) = rings else { return };
    // Rings put anywhere may overlap the other queue's used ring.
    if needs_reset.load(Ordering::Acquire) || !(rx.laid_out && tx.laid_out) {
        return;
    }
    let used = |ring: &DriverRing| ring.used_idx(mem).map(u64::from);
    let wrap = |n: u64| Some(n % (1 << 16));
    assert_eq!(used(tx), wrap(c.tx_frames + c.tx_malformed + c.tx_errors), "transmit used entries: {c:?}");
    assert_eq!(used(rx), wrap(c.rx_frames + c.rx_malformed), "receive used entries: {c:?}");
}

/// Does a device-writable descriptor in the receive ring's table cover either ring's used index?
/// The driver may hand the device any guest memory as a receive buffer: a frame written there
/// (even one then dropped) stands in that index until its ring publishes again. Indirect
/// descriptors are not negotiated, so the table holds every buffer the device may fill.
fn receive_buffer_covers_a_used_index(mem: &GuestMemoryMmap, rx: &DriverRing, tx: &DriverRing) -> bool {
    let words = [rx.config.used, tx.config.used].map(|used| used.wrapping_add(2));
    (0..u64::from(rx.config.size)).any(|index| {
        let at = rx.config.desc.wrapping_add(16 * index);
        let Ok(raw) = mem.read_obj::<[u8; 16]>(GuestAddress(at)) else { return false };
        let d = Descriptor::from_le_bytes(raw);
        let end = d.addr.saturating_add(u64::from(d.len));
        d.is_write_only() && words.iter().any(|&word| d.addr < word.saturating_add(2) && word < end)
    })
}
