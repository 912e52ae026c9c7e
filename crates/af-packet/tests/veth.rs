//! Frames through a real veth pair: what one end's transmit ring sends arrives whole in the
//! other end's receive ring (it takes root, as the interfaces do).

use std::time::{Duration, Instant};

use af_packet::{Fill, PacketRing, MAX_TX_FRAME, VNET_HDR_LEN};
use test_infra::net::Veth;
use vm_memory::Bytes;

fn frame(len: usize, seed: u8) -> Vec<u8> {
    let mut frame: Vec<u8> = (0..len).map(|i| seed.wrapping_mul(31).wrapping_add(i as u8)).collect();
    frame[..6].copy_from_slice(&[0x52, 0x54, 0, 0, 0, 2]);
    frame[6..12].copy_from_slice(&[0x52, 0x54, 0, 0, 0, 1]);
    // A local experimental EtherType: nothing in the host's stack answers it.
    frame[12..14].copy_from_slice(&[0x88, 0xb5]);
    frame
}

#[test]
fn frames_sent_on_one_end_arrive_whole_on_the_other() {
    let veth = Veth::create();
    let mut a = PacketRing::open(&veth.ours).unwrap();
    let mut b = PacketRing::open(&veth.peer).unwrap();
    let sent: Vec<Vec<u8>> = (0..600).map(|i| frame(60 + (i * 37) % 1455, i as u8)).collect();
    let mut received = Vec::new();
    let mut next = 0;
    // More frames than a ring has slots: sending waits for slots the kernel frees. (The limit
    // only ends a test that would otherwise hang.)
    let give_up = Instant::now() + Duration::from_secs(30);
    while Instant::now() < give_up {
        while next < sent.len() {
            let frame = &sent[next];
            let queued = a.transmit(|slot| {
                slot.write_slice(frame, 0).unwrap();
                Fill::Frame(frame.len())
            });
            if !queued {
                break;
            }
            next += 1;
        }
        a.flush().unwrap();
        while b.receive(|got| {
            assert!(!got.truncated && !got.offload().segmented && got.vlan_tag.is_none());
            let mut bytes = vec![0; got.frame.len()];
            got.frame.read_slice(&mut bytes, 0).unwrap();
            received.push(bytes);
        }) {}
        if received.len() == sent.len() {
            break;
        }
    }
    assert_eq!(received.len(), sent.len(), "frames lost on a veth pair");
    assert!(received == sent, "a frame changed on the way");
}

#[test]
fn the_interface_must_exist_and_a_transmit_slot_holds_a_whole_frame() {
    assert!(PacketRing::open("xl-no-such-if").is_err());
    let veth = Veth::create();
    let mut a = PacketRing::open(&veth.ours).unwrap();
    // The closure gets at most MAX_TX_FRAME bytes of slot.
    assert!(a.transmit(|slot| {
        assert_eq!(slot.len(), MAX_TX_FRAME);
        Fill::Nothing
    }));
    a.flush().unwrap();
}

#[test]
fn a_ring_opened_while_another_interface_is_busy_holds_none_of_its_frames() {
    let (busy, quiet) = (Veth::create(), Veth::create());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = {
        let (stop, interface) = (stop.clone(), busy.ours.clone());
        std::thread::spawn(move || {
            let mut ring = PacketRing::open(&interface).unwrap();
            let bytes = frame(60, 1);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                ring.transmit(|slot| {
                    slot.write_slice(&bytes, 0).unwrap();
                    Fill::Frame(bytes.len())
                });
                let _ = ring.flush();
            }
        })
    };
    // Nothing is sent on the quiet pair: a frame in its ring came from the busy one.
    let strays = (0..50).filter(|_| PacketRing::open(&quiet.ours).unwrap().has_received()).count();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flood.join().unwrap();
    assert_eq!(strays, 0, "rings opened while another interface carried frames held its frames");
}

/// Every frame `ring` receives within 5 s or until `count` came (a limit that only ends a test
/// that would hang), with its virtio-net header.
fn receive(ring: &mut PacketRing, count: usize) -> Vec<([u8; VNET_HDR_LEN], Vec<u8>)> {
    let mut received = Vec::new();
    let give_up = Instant::now() + Duration::from_secs(5);
    while received.len() < count && Instant::now() < give_up {
        ring.receive(|got| {
            let mut bytes = vec![0; got.frame.len()];
            got.frame.read_slice(&mut bytes, 0).unwrap();
            received.push((got.vnet_header, bytes));
        });
    }
    received
}

/// A frame whose virtio-net header the kernel refuses is lost, and the frames queued after it
/// still go: the kernel does not stop at it (which would hold every frame behind it until its
/// slot was written again).
#[test]
fn a_frame_the_kernel_refuses_is_skipped_and_those_after_it_go() {
    let veth = Veth::create();
    let (mut a, mut b) = (PacketRing::open(&veth.ours).unwrap(), PacketRing::open(&veth.peer).unwrap());
    // Its checksum left at byte 2,000 of a 100-byte frame.
    let mut refused = [0u8; VNET_HDR_LEN];
    refused[0] = 1;
    refused[6..8].copy_from_slice(&2000u16.to_le_bytes());
    let (bad, good) = (frame(100, 1), frame(100, 2));
    assert!(a.transmit(|slot| {
        slot.write_slice(&bad, 0).unwrap();
        Fill::Offloaded { len: bad.len(), vnet_header: refused }
    }));
    assert!(a.transmit(|slot| {
        slot.write_slice(&good, 0).unwrap();
        Fill::Frame(good.len())
    }));
    a.flush().unwrap();
    let got = receive(&mut b, 2);
    assert_eq!(got.into_iter().map(|(_, f)| f).collect::<Vec<_>>(), [good]);
}

/// A TCP/IPv4 super-frame of `payload` bytes whose TCP header says it is `tcp_words` 32-bit
/// words long, and the virtio-net header that leaves its checksum and its segments (of 1,448
/// bytes) to the kernel.
fn super_frame(payload: usize, tcp_words: u8) -> (Vec<u8>, [u8; VNET_HDR_LEN]) {
    let mut frame = frame(14 + 40 + payload, 3);
    frame[12..14].copy_from_slice(&[0x08, 0x00]);
    // IPv4: 20 bytes, its length, TCP; then a 20-byte TCP header.
    let ip_len = u16::try_from(40 + payload).unwrap().to_be_bytes();
    frame[14..24].copy_from_slice(&[0x45, 0, ip_len[0], ip_len[1], 0, 0, 0x40, 0, 64, 6]);
    frame[26..34].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
    frame[46] = tcp_words << 4;
    let mut tso = [0u8; VNET_HDR_LEN];
    tso[..2].copy_from_slice(&[1, 1]);
    tso[2..4].copy_from_slice(&54u16.to_le_bytes());
    tso[4..6].copy_from_slice(&1448u16.to_le_bytes());
    tso[6..8].copy_from_slice(&34u16.to_le_bytes());
    tso[8..10].copy_from_slice(&16u16.to_le_bytes());
    (frame, tso)
}

/// A TCP super-frame of 60,000 bytes of payload queued with its virtio-net header goes through
/// the veth pair whole: the other end's ring takes it in one slot, as a super-frame still to
/// be cut, its bytes unchanged.
#[test]
fn a_super_frame_goes_whole_with_its_header() {
    let veth = Veth::create();
    let (mut a, mut b) = (PacketRing::open(&veth.ours).unwrap(), PacketRing::open(&veth.peer).unwrap());
    let (frame, tso) = super_frame(60_000, 5);
    assert!(a.transmit(|slot| {
        slot.write_slice(&frame, 0).unwrap();
        Fill::Offloaded { len: frame.len(), vnet_header: tso }
    }));
    a.flush().unwrap();
    let got = receive(&mut b, 1);
    assert_eq!(got.len(), 1, "the super-frame did not arrive whole");
    let (header, bytes) = &got[0];
    assert_eq!((header[1], &header[4..6]), (1, &1448u16.to_le_bytes()[..]), "{header:?}");
    assert!(*bytes == frame, "the super-frame changed on the way");
}

/// A super-frame the kernel takes from the ring but drops on its way to the interface (a TCP
/// header shorter than TCP's, which it finds as it checks the segments): the flush says so,
/// the frame is lost, and the frames queued after it go at the next flush, not never.
#[test]
fn a_frame_the_kernel_drops_on_the_way_out_does_not_hold_up_those_after_it() {
    let veth = Veth::create();
    let (mut a, mut b) = (PacketRing::open(&veth.ours).unwrap(), PacketRing::open(&veth.peer).unwrap());
    let (bad, tso) = super_frame(5_000, 3);
    let good = frame(100, 4);
    assert!(a.transmit(|slot| {
        slot.write_slice(&bad, 0).unwrap();
        Fill::Offloaded { len: bad.len(), vnet_header: tso }
    }));
    assert!(a.transmit(|slot| {
        slot.write_slice(&good, 0).unwrap();
        Fill::Frame(good.len())
    }));
    assert!(a.flush().is_err(), "the kernel dropped the super-frame");
    a.flush().unwrap();
    let got = receive(&mut b, 1);
    assert_eq!(got.into_iter().map(|(_, f)| f).collect::<Vec<_>>(), [good]);
}
