//! A port's announcement of an address (its frontend's SEND_RARP, for a guest that moved to it
//! in a live migration): a broadcast RARP from the address, as if the port sent it, that every
//! other port hears (on its own switch and on the others) and that moves the address to it.

use super::*;

const MOVED: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 0x42]);

/// The RARP every other guest hears, and a frame to the address going to the announcing port
/// only from then on; with two switches, across the ring between them too.
fn announced(switches: usize) {
    let mut rig = rig_on(switches, (0..3).map(|_| (PortPolicy::default(), Offloads::default())), None);
    for g in 0..3 {
        rig.guests[g].post_rx(0, &[2048]);
        rig.guests[g].post_rx(1, &[2048]);
    }
    // The address was guest 1's; it moves to guest 0.
    rig.guests[1].transmit(0, &frame(guest_mac(2), MOVED, 60, 1), &[]);
    rig.poll();
    for g in [0, 2] {
        assert_eq!(rig.guests[g].received(&[2048]).len(), 1, "the first frame floods");
    }
    rig.control.announce(rig.guests[0].port, MOVED);
    rig.poll();
    let rarp = virtio::net::rarp_announcement(MOVED.0).to_vec();
    for g in [1, 2] {
        assert_eq!(
            rig.guests[g].received(&[2048]),
            std::slice::from_ref(&rarp),
            "guest {g} hears the announcement"
        );
    }
    assert!(rig.guests[0].received(&[2048]).is_empty(), "not back to its own port");
    let to_moved = frame(MOVED, guest_mac(2), 60, 2);
    rig.guests[2].transmit(0, &to_moved, &[]);
    rig.poll();
    assert_eq!(rig.guests[0].received(&[2048]), [to_moved]);
    assert!(rig.guests[1].received(&[2048]).is_empty(), "the address left guest 1's port");
}

#[test]
fn an_announcement_floods_a_rarp_and_moves_the_address() {
    announced(1);
}

#[test]
fn an_announcement_crosses_to_the_other_iocores() {
    announced(2);
}

/// An isolated port announces its own address only, and no port another NIC's pinned one:
/// nothing is sent, and it counts as spoofed.
#[test]
fn a_port_announces_no_address_it_may_not_send_from() {
    let pinned = |i: usize| PortPolicy { mac: Some(guest_mac(i)), ..PortPolicy::default() };
    let isolated = PortPolicy { isolated_to: Some(guest_mac(0)), ..pinned(0) };
    let mut rig = rig_with(&[isolated, pinned(1), pinned(2)], None);
    for g in 0..3 {
        rig.guests[g].post_rx(0, &[2048]);
    }
    rig.poll();
    rig.control.announce(rig.guests[0].port, MOVED);
    rig.control.announce(rig.guests[1].port, guest_mac(2));
    rig.control.announce(rig.guests[1].port, MacAddr::BROADCAST);
    rig.poll();
    for g in 0..3 {
        assert!(rig.guests[g].received(&[2048]).is_empty(), "guest {g} heard a refused announcement");
    }
    assert_eq!((rig.counters(0).tx_spoofed, rig.counters(1).tx_spoofed), (1, 2));
}
