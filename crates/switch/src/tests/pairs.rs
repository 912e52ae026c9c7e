//! A NIC with several queue pairs: frames go out from every transmit ring, and each flow comes in
//! on one receive ring, the flows spread over them.

use super::*;
use crate::ethernet::flow_of;

/// Rings of guest 1's second queue pair, and its buffers.
const RX2: (u64, u64, u64) = (0x7000, 0x8000, 0x9000);
const TX2: (u64, u64, u64) = (0xa000, 0xb000, 0xc000);
const RX2_BUFFERS: u64 = 0x20000;
const TX2_BUFFERS: u64 = 0x60000;

/// A UDP/IPv4 frame from `from` to `to` on source port `port`.
fn udp(to: MacAddr, from: MacAddr, port: u16) -> Vec<u8> {
    let mut frame = frame(to, from, 80, 0);
    frame[14] = 0x45;
    frame[23] = 17;
    frame[26..34].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
    frame[34..36].copy_from_slice(&port.to_be_bytes());
    frame
}

#[test]
fn frames_leave_by_every_transmit_ring_and_each_flow_arrives_on_one_receive_ring() {
    let mut rig = rig(2);
    // Guest 1 gets a second queue pair: detached, given the pair, attached again.
    let (control, id) = (rig.control.clone(), rig.guests[1].port);
    let detach = std::thread::spawn(move || control.detach(id));
    while !detach.is_finished() {
        rig.poll();
    }
    let port = detach.join().unwrap().unwrap();
    let mem = &rig.guests[1].mem;
    let error = rig.guests[1].error.clone();
    let second = QueuePair {
        rx: queue(mem, RX2),
        tx: queue(mem, TX2),
        rx_signals: signals(&error),
        tx_signals: signals(&error),
        tx_kick: None,
    };
    rig.guests[1].port = rig.control.attach(port.with_pair(second)).unwrap();
    rig.poll();
    let (a, b) = (guest_mac(0), guest_mac(1));

    // Receive buffers on both of guest 1's receive rings: sixteen on the first (the rig's own
    // helper), sixteen on the second.
    for head in 0..16u16 {
        rig.guests[1].post_rx(head, &[2048]);
        let guest = &rig.guests[1];
        guest.desc(RX2.0, head, RX2_BUFFERS + u64::from(head) * 0x1000, 2048, VIRTQ_DESC_F_WRITE, 0);
        guest.mem.write_obj(head, GuestAddress(RX2.1 + 4 + 2 * u64::from(head))).unwrap();
    }
    rig.guests[1].mem.write_obj(16u16, GuestAddress(RX2.1 + 2)).unwrap();

    // Guest 1 sends from its second transmit ring first, so the switch learns where it is.
    let hello = frame(a, b, 60, 1);
    rig.guests[1].mem.write_slice(&[0u8; NET_HDR_LEN], GuestAddress(TX2_BUFFERS)).unwrap();
    rig.guests[1].mem.write_slice(&hello, GuestAddress(TX2_BUFFERS + NET_HDR_LEN as u64)).unwrap();
    rig.guests[1].desc(TX2.0, 0, TX2_BUFFERS, (NET_HDR_LEN + hello.len()) as u32, 0, 0);
    rig.guests[1].mem.write_obj(0u16, GuestAddress(TX2.1 + 4)).unwrap();
    rig.guests[1].mem.write_obj(1u16, GuestAddress(TX2.1 + 2)).unwrap();
    rig.guests[0].post_rx(0, &[2048]);
    rig.poll();
    assert_eq!(rig.guests[0].received(&[2048]), [hello], "from the second transmit ring");
    let tx2_used: u16 = rig.guests[1].mem.read_obj(GuestAddress(TX2.2 + 2)).unwrap();
    assert_eq!(tx2_used, 1);

    // Eight flows to guest 1, each twice: each flow's two frames land on the same ring, and
    // the flows on both rings, as their hashes say.
    let ports: Vec<u16> = (1000..1008).collect();
    for (i, &port) in ports.iter().chain(&ports).enumerate() {
        rig.guests[0].transmit(i as u16, &udp(b, a, port), &[]);
    }
    rig.poll();
    let on_second = |port: u16| flow_of(&udp(b, a, port)[..38]) % 2 == 1;
    let expected_second = ports.iter().filter(|&&port| on_second(port)).count() as u16 * 2;
    assert!(expected_second > 0 && expected_second < 16, "these flows spread over both rings");
    let rx2_used: u16 = rig.guests[1].mem.read_obj(GuestAddress(RX2.2 + 2)).unwrap();
    assert_eq!(rx2_used, expected_second);
    let first = rig.guests[1].received(&[2048]);
    assert_eq!(first.len(), 16 - usize::from(expected_second));
    for frame in &first {
        assert!(
            !on_second(u16::from_be_bytes([frame[34], frame[35]])),
            "a flow of the second ring on the first"
        );
    }
    assert_eq!(rig.counters(1).rx_frames, 16);
}
