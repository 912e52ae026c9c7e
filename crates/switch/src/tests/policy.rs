//! Port policies: isolation, spoofing and rate limits.

use rate_limiter::Limits;

use super::*;

#[test]
fn an_isolated_nic_reaches_no_other_nic_and_sends_only_from_its_own_address() {
    isolated_nic_and_two_others(rig_with(&isolation_policies(), None));
}

/// Guest 0 isolated, guests 1 and 2 not.
pub(super) fn isolation_policies() -> [PortPolicy; 3] {
    let isolated = PortPolicy { isolated_to: Some(guest_mac(0)), ..PortPolicy::default() };
    [isolated, PortPolicy::default(), PortPolicy::default()]
}

/// Guest 0 (isolated) hears no other NIC and reaches none, and sends only from its address.
pub(super) fn isolated_nic_and_two_others(mut rig: Rig) {
    for g in &mut rig.guests {
        g.post_rx(0, &[2048]);
        g.post_rx(1, &[2048]);
    }
    let (a, b, c) = (rig.guests[0].mac, rig.guests[1].mac, rig.guests[2].mac);
    // B makes itself known; the isolated A does not hear it.
    rig.guests[1].transmit(0, &frame(MacAddr::BROADCAST, b, 60, 1), &[]);
    rig.poll();
    assert_eq!(rig.guests[0].received(&[2048]).len(), 0, "a broadcast reached an isolated NIC");
    assert_eq!(rig.guests[2].received(&[2048]).len(), 1);
    // A to B: dropped and counted. A's broadcast reaches no NIC.
    rig.guests[0].transmit(0, &frame(b, a, 60, 2), &[]);
    rig.guests[0].transmit(1, &frame(MacAddr::BROADCAST, a, 60, 3), &[]);
    rig.poll();
    assert_eq!(rig.counters(0).tx_isolated, 1);
    // B to A, now that A is known: dropped and counted on B.
    rig.guests[1].transmit(1, &frame(a, b, 60, 4), &[]);
    // A from C's address: spoofed.
    rig.guests[0].transmit(2, &frame(b, c, 60, 5), &[]);
    rig.poll();
    assert_eq!(rig.counters(1).tx_isolated, 1);
    assert_eq!(rig.counters(0).tx_spoofed, 1);
    assert_eq!(rig.counters(0).tx_frames, 2, "what was not spoofed counts as sent");
    for g in 0..3 {
        assert_eq!(rig.guests[g].received(&[2048]).len(), 0, "guest {g} got a frame");
    }
    assert_eq!(rig.guests[0].used_index(false), 3, "every chain went back");
}

#[test]
fn a_nic_over_its_frame_rate_leaves_its_frames_in_the_ring() {
    let limited = PortPolicy { limits: Limits { iops: Some(1), bandwidth: None }, ..PortPolicy::default() };
    let mut rig = rig_with(&[limited, PortPolicy::default()], None);
    let (a, b) = (rig.guests[0].mac, rig.guests[1].mac);
    for head in 0..3 {
        rig.guests[1].post_rx(head, &[2048]);
        rig.guests[0].transmit(head, &frame(b, a, 60, head as u8), &[]);
    }
    // A one-second burst of one frame: one goes in this pass, the others wait for the bucket
    // (it refills at the start of a pass, so within one pass nothing more can go).
    rig.poll();
    assert_eq!(rig.guests[1].received(&[2048]).len(), 1);
    assert_eq!(rig.guests[0].used_index(false), 1, "the others are still in the ring");
    assert!(rig.counters(0).tx_rate_limited >= 1);
}

#[test]
fn a_nic_sending_from_another_nics_address_diverts_nothing() {
    let own = |i| PortPolicy { mac: Some(guest_mac(i)), ..PortPolicy::default() };
    let mut rig = rig_with(&[own(0), own(1), own(2)], None);
    for g in &mut rig.guests {
        g.post_rx(0, &[2048]);
    }
    let (a, b, c) = (rig.guests[0].mac, rig.guests[1].mac, rig.guests[2].mac);
    // B claims A's address: dropped, and the table still has A where A is.
    rig.guests[1].transmit(0, &frame(c, a, 60, 1), &[]);
    rig.poll();
    assert_eq!(rig.counters(1).tx_spoofed, 1);
    assert_eq!(rig.guests[2].received(&[2048]).len(), 0, "the spoofed frame went nowhere");
    let to_a = frame(a, c, 60, 2);
    rig.guests[2].transmit(0, &to_a, &[]);
    rig.poll();
    assert_eq!(rig.guests[0].received(&[2048]), vec![to_a], "A's frames still go to A");
    assert_eq!(rig.guests[1].received(&[2048]).len(), 0, "and not to B");
    // Its own address is B's to send from.
    rig.guests[1].transmit(1, &frame(c, b, 60, 3), &[]);
    rig.poll();
    assert_eq!(rig.counters(1).tx_frames, 1);
}
