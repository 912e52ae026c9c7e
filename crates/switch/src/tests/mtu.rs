//! MTUs: jumbo frames between ports that take them; dropped and counted for a port of a smaller
//! MTU, as a Linux bridge drops them; malformed from a port beyond its own.

use super::*;

/// A receive chain of three pages: room for a jumbo frame without merged buffers.
const PAGES: [u32; 3] = [4096, 4096, 4096];

#[test]
fn a_jumbo_frame_reaches_ports_of_its_mtu_only() {
    let jumbo = PortPolicy { mtu: Some(MAX_MTU), ..PortPolicy::default() };
    let mut rig = rig_with(&[jumbo, jumbo, PortPolicy::default()], None);
    for g in &mut rig.guests {
        g.post_rx(0, &PAGES);
        g.post_rx(3, &PAGES);
    }
    let (a, b, c) = (rig.guests[0].mac, rig.guests[1].mac, rig.guests[2].mac);
    // B and C make themselves known.
    rig.guests[1].transmit(0, &frame(MacAddr::BROADCAST, b, 60, 0), &[]);
    rig.guests[2].transmit(0, &frame(MacAddr::BROADCAST, c, 60, 0), &[]);
    rig.poll();
    let heard: Vec<usize> = rig.guests.iter_mut().map(|g| g.received(&PAGES).len()).collect();
    assert_eq!(heard, [2, 1, 1]);

    // The longest frame of a 9000-byte MTU, from A to B, in three descriptors.
    let big = frame(b, a, MAX_JUMBO_FRAME_LEN, 1);
    rig.guests[0].transmit(0, &big, &[4000, 8000]);
    // One byte over C's MTU: dropped and counted on C, whose chain waits for the next frame.
    rig.guests[0].transmit(3, &frame(c, a, MAX_FRAME_LEN + 1, 2), &[]);
    rig.poll();
    assert_eq!(rig.guests[1].received(&PAGES), vec![big]);
    assert_eq!(rig.counters(2).rx_too_big, 1);
    assert_eq!(rig.guests[2].received(&PAGES).len(), 0, "a frame over C's MTU reached it");
    let fits = frame(c, a, MAX_FRAME_LEN, 3);
    rig.guests[0].transmit(4, &fits, &[]);
    rig.poll();
    assert_eq!(rig.guests[2].received(&PAGES), vec![fits]);

    // One byte over A's own MTU: malformed, and the switch goes on.
    rig.guests[0].transmit(5, &frame(b, a, MAX_JUMBO_FRAME_LEN + 1, 4), &[4000, 8000]);
    rig.poll();
    assert_eq!(rig.counters(0).tx_malformed, 1);
    assert_eq!(rig.counters(0).tx_frames, 3);
    assert_eq!(rig.guests[1].received(&PAGES).len(), 0);
}

/// For a jumbo port that takes no offload, the switch fills in a jumbo frame's checksum (past a
/// ring slot's 2 KiB: this once failed as a bad offload, and a TCP stream between two guests of
/// a 9000-byte MTU stalled) and cuts a super-frame into segments of a jumbo MSS.
#[test]
fn a_jumbo_frame_gets_its_checksum_filled_and_a_super_frame_cut_into_jumbo_segments() {
    use crate::offload::Segmentation;
    use crate::segment::tests::{super_frame, tcp_checksum_verifies};
    use af_packet::checksum::{fold, ones_complement_sum};

    let jumbo = PortPolicy { mtu: Some(MAX_MTU), ..PortPolicy::default() };
    let mut rig = rig_with(&[jumbo, jumbo], None);
    let cuts: Vec<usize> = (1..8).map(|i| i * 4000).collect();
    let mut frame = super_frame(false, &[0x5a; 8900]);
    let pseudo = fold(u64::from(ones_complement_sum(&frame[26..34])) + 6 + (frame.len() - 34) as u64);
    frame[50..52].copy_from_slice(&pseudo.to_be_bytes());
    rig.guests[1].post_rx(0, &PAGES);
    let partial = NetHeader { checksum: Some((34, 16)), segmentation: None };
    rig.guests[0].transmit_with(0, partial, &frame, &cuts);
    rig.poll();
    let got = rig.guests[1].received(&PAGES);
    assert_eq!(got.len(), 1, "{:?}", rig.counters(0));
    assert!(tcp_checksum_verifies(&got[0], false));
    assert_eq!(rig.counters(0).tx_checksummed, 1);

    // Three segments' worth at Linux's MSS for a 9000-byte MTU with TCP timestamps.
    let mss = 8948;
    let payload: Vec<u8> = (0..3 * mss - 100).map(|i| (i % 251) as u8).collect();
    let tso =
        NetHeader { checksum: Some((34, 16)), segmentation: Some(Segmentation::Tcp4 { mss: mss as u16 }) };
    for head in [3, 6, 9] {
        rig.guests[1].post_rx(head, &PAGES);
    }
    rig.guests[0].transmit_with(3, tso, &super_frame(false, &payload), &cuts);
    rig.poll();
    let segments = rig.guests[1].received(&PAGES);
    let lengths: Vec<usize> = segments.iter().map(Vec::len).collect();
    assert_eq!(lengths, [54 + mss, 54 + mss, 54 + mss - 100], "{:?}", rig.counters(0));
    assert!(segments.iter().all(|segment| tcp_checksum_verifies(segment, false)));
    assert_eq!(rig.counters(0).tx_segmented, 1);
}
