//! Frames through a real veth pair: what one end's transmit ring sends arrives whole in the
//! other end's receive ring (it takes root, as the interfaces do).

use std::time::{Duration, Instant};

use af_packet::{Fill, PacketRing, MAX_TX_FRAME};
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
