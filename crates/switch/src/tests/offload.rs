//! Offloads: a driver that takes checksums left and super-frames gets them as sent, over merged
//! receive buffers; one that does not gets them finished and cut by the switch.

use super::*;
use af_packet::checksum::{fold, ones_complement_sum};

use crate::offload::{Segmentation, OFFERED};
use crate::segment::tests::{super_frame, tcp_checksum_verifies};

/// A receive chain of one page, as Linux posts them with merged buffers.
const PAGE: u32 = 4096;
/// The headers' length in `super_frame` over IPv4: Ethernet, IPv4, TCP.
const HEADERS: usize = 14 + 20 + 20;
/// `super_frame`'s header over IPv4: its checksum left, segments of 1,400 payload bytes.
pub(super) const TSO4: NetHeader =
    NetHeader { checksum: Some((34, 16)), segmentation: Some(Segmentation::Tcp4 { mss: 1400 }) };

/// Guest 0 sends; guest 1's driver takes every offload; guest 2's none.
fn rig_of_three() -> Rig {
    let all = Offloads::from_features(OFFERED);
    let ports = [all, all, Offloads::default()].map(|offloads| (PortPolicy::default(), offloads));
    rig_of(ports.into_iter(), None)
}

#[test]
fn a_super_frame_arrives_whole_over_merged_buffers_or_cut_into_segments_that_verify() {
    let mut rig = rig_of_three();
    let payload: Vec<u8> = (0..6000u32).map(|i| (i * 13 % 251) as u8).collect();
    let frame = super_frame(false, &payload);
    for i in 0..8 {
        rig.guests[1].post_rx(i, &[4096]);
        rig.guests[2].post_rx(i, &[2048]);
    }
    // To an address nobody has sent from yet: both receivers get it.
    rig.guests[0].transmit_with(0, TSO4, &frame, &[NET_HDR_LEN, 100]);
    rig.poll();

    // Guest 1: the header as sent, with num_buffers, and the frame over two chains.
    let chains = rig.guests[1].used_chains(&[PAGE]);
    assert_eq!(chains.iter().map(|c| c.1).collect::<Vec<_>>(), [4096, NET_HDR_LEN + frame.len() - 4096]);
    assert_whole(&chains, TSO4, &frame);

    // Guest 2: five segments, each in a chain of its own.
    let segments = rig.guests[2].received(&[2048]);
    assert_eq!(segments.len(), 5);
    assert_cut(&segments, &payload);
    let sender = rig.counters(0);
    assert_eq!((sender.tx_frames, sender.tx_segmented, sender.tx_malformed), (1, 1, 0));
    assert_eq!((rig.counters(1).rx_buffers, rig.counters(2).rx_buffers), (2, 5));
    assert_eq!((rig.counters(1).rx_frames, rig.counters(2).rx_frames), (1, 5));
}

/// The super-frame `frame` arrived whole over merged `chains`: `header` as sent, with the
/// chains' count as `num_buffers`, then the frame.
pub(super) fn assert_whole(chains: &[(u32, usize, Vec<u8>)], header: NetHeader, frame: &[u8]) {
    let got: [u8; NET_HDR_LEN] = chains[0].2[..NET_HDR_LEN].try_into().unwrap();
    assert_eq!(got, header.to_bytes(u16::try_from(chains.len()).unwrap()), "the header as sent");
    let joined: Vec<u8> = chains.iter().flat_map(|c| c.2.iter().copied()).skip(NET_HDR_LEN).collect();
    assert_eq!(joined, frame);
}

/// `segments` are `super_frame(false, payload)` cut for a receiver that takes no super-frame:
/// at most 1,400 bytes of payload each, checksummed, in order.
pub(super) fn assert_cut(segments: &[Vec<u8>], payload: &[u8]) {
    let mut rebuilt = Vec::new();
    for segment in segments {
        assert!(segment.len() <= HEADERS + 1400);
        assert!(tcp_checksum_verifies(segment, false));
        rebuilt.extend_from_slice(&segment[HEADERS..]);
    }
    assert_eq!(rebuilt, payload);
}

#[test]
fn a_checksum_left_is_passed_on_to_a_driver_that_takes_it_and_filled_in_for_one_that_does_not() {
    let mut rig = rig_of_three();
    let mut frame = super_frame(false, &[0x5a; 500]);
    // Where the checksum goes, the sender leaves the pseudo-header's sum.
    let pseudo = fold(u64::from(ones_complement_sum(&frame[26..34])) + 6 + (frame.len() - 34) as u64);
    frame[50..52].copy_from_slice(&pseudo.to_be_bytes());
    let partial = NetHeader { checksum: Some((34, 16)), segmentation: None };
    rig.guests[1].post_rx(0, &[2048]);
    rig.guests[2].post_rx(0, &[2048]);
    rig.guests[0].transmit_with(0, partial, &frame, &[]);
    rig.poll();
    let chains = rig.guests[1].used_chains(&[PAGE]);
    assert_eq!(chains.len(), 1);
    assert_eq!(chains[0].2[..NET_HDR_LEN], partial.to_bytes(1));
    assert_eq!(chains[0].2[NET_HDR_LEN..], frame[..], "as sent, its checksum left");
    let finished = rig.guests[2].received(&[2048]);
    assert_eq!(finished.len(), 1);
    assert!(tcp_checksum_verifies(&finished[0], false));
    assert_eq!(finished[0][..50], frame[..50]);
    assert_eq!(finished[0][52..], frame[52..], "only the checksum changed");
    assert_eq!(rig.counters(0).tx_checksummed, 1, "filled in once, for guest 2");
}

#[test]
fn a_merged_frame_that_runs_out_of_chains_is_dropped_and_its_chains_serve_the_next() {
    let mut rig = rig_of_three();
    let frame = super_frame(false, &vec![1u8; 9000]);
    // Two chains of 4 KiB cannot hold 9 KiB: the frame is dropped, both chains wait.
    rig.guests[1].post_rx(0, &[4096]);
    rig.guests[1].post_rx(1, &[4096]);
    rig.guests[0].transmit_with(0, TSO4, &frame, &[]);
    rig.poll();
    assert!(rig.guests[1].used_chains(&[PAGE]).is_empty());
    assert_eq!(rig.counters(1).rx_no_buffer, 1);
    // A small frame takes the first staged chain; the second waits on.
    let small = frame_to(guest_mac(1), guest_mac(0), 200);
    rig.guests[0].transmit(1, &small, &[]);
    rig.poll();
    let chains = rig.guests[1].used_chains(&[PAGE]);
    assert_eq!(chains.iter().map(|c| (c.0, c.1)).collect::<Vec<_>>(), [(0, NET_HDR_LEN + 200)]);
    // Then a third chain comes, and a frame of 6 KiB fills the second and the third.
    rig.guests[1].post_rx(2, &[4096]);
    let mid = super_frame(false, &vec![2u8; 6000]);
    rig.guests[0].transmit_with(2, TSO4, &mid, &[]);
    rig.poll();
    let chains = rig.guests[1].used_chains(&[PAGE]);
    assert_eq!(chains.iter().map(|c| c.0).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(rig.counters(1).rx_frames, 2);
}

#[test]
fn headers_that_lie_are_dropped_and_counted_and_the_switch_goes_on() {
    let mut rig = rig_of_three();
    for i in 0..8 {
        rig.guests[1].post_rx(i, &[4096]);
        rig.guests[2].post_rx(i, &[2048]);
    }
    let tcp = super_frame(false, &[3; 3000]);
    let mut udp = tcp.clone();
    udp[23] = 17;
    let lies = [
        // A super-frame that is not TCP: passed to the driver that takes super-frames as it is
        // (it checks it), never cut.
        (TSO4, udp.clone()),
        // A checksum outside the frame.
        (NetHeader { checksum: Some((34, 3000)), segmentation: None }, tcp[..1000].to_vec()),
        // A plain frame over 1518 bytes.
        (NetHeader::default(), tcp.clone()),
    ];
    for (i, (header, frame)) in lies.iter().enumerate() {
        rig.guests[0].transmit_with(i as u16, *header, frame, &[]);
    }
    // ECN, which is not offered.
    let mut ecn = TSO4.to_bytes(0);
    ecn[1] |= 0x80;
    let mut bytes = ecn.to_vec();
    bytes.extend_from_slice(&tcp);
    rig.guests[0].mem.write_slice(&bytes, GuestAddress(TX_BUFFERS + 0x8000)).unwrap();
    rig.guests[0].desc(TX.0, 3, TX_BUFFERS + 0x8000, bytes.len() as u32, 0, 0);
    rig.guests[0].make_available(false, 3);
    rig.poll();
    let sender = rig.counters(0);
    assert_eq!(sender.tx_malformed, 3, "three headers");
    assert_eq!(sender.tx_bad_offload, 1, "the UDP super-frame, for guest 2");
    assert_eq!(rig.guests[1].used_chains(&[PAGE]).len(), 1, "guest 1 took the UDP super-frame");
    assert!(rig.guests[2].received(&[2048]).is_empty());
    // And a frame that tells the truth still goes through.
    rig.guests[0].transmit_with(4, TSO4, &tcp, &[]);
    rig.poll();
    assert_eq!(rig.guests[2].received(&[2048]).len(), 3);
}

fn frame_to(to: MacAddr, from: MacAddr, len: usize) -> Vec<u8> {
    frame(to, from, len, 9)
}
