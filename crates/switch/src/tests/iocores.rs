//! Two switches, as a daemon with two IOCores runs them: frames between ports on different
//! switches cross through the rings between them, with the same policies as on one.

use std::os::fd::RawFd;

use super::*;

/// Guests 0 and 2 on switch 0, guest 1 on switch 1.
fn two_iocores(policies: &[PortPolicy]) -> Rig {
    let rig = rig_on(2, policies.iter().map(|&policy| (policy, Offloads::default())), None);
    for (i, guest) in rig.guests.iter().enumerate() {
        assert_eq!(rig.control.home_of(guest.port), Some(i % 2), "guest {i} went to the emptier switch");
    }
    rig
}

fn readable(fd: RawFd) -> bool {
    let mut poll = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd, for the duration of the call.
    unsafe { libc::poll(&mut poll, 1, 0) == 1 }
}

#[test]
fn frames_cross_between_the_switches_of_two_iocores_both_ways() {
    let mut rig = two_iocores(&[PortPolicy::default(); 3]);
    for g in &mut rig.guests {
        for head in 0..4 {
            g.post_rx(head * 4, &[5, 13, 700, 2000]);
        }
    }
    let parts = [5u32, 13, 700, 2000];
    let (a, b) = (rig.guests[0].mac, rig.guests[1].mac);
    let hello = frame(MacAddr::BROADCAST, a, 60, 1);
    rig.guests[0].transmit(0, &hello, &[]);
    rig.poll();
    assert_eq!(rig.guests[1].received(&parts), vec![hello.clone()], "flooded to the other switch");
    assert_eq!(rig.guests[2].received(&parts), vec![hello], "and on its own");
    // Learnt on switch 0, looked up on switch 1: B's answer goes to A only.
    for (head, len) in [(0u16, 14usize), (4, 98), (8, 1518)] {
        let answer = frame(a, b, len, head as u8);
        rig.guests[1].transmit(head, &answer, &[1, 11, 20, 333]);
        rig.poll();
        assert_eq!(rig.guests[0].received(&parts), vec![answer], "{len} bytes");
    }
    assert_eq!(rig.guests[2].received(&parts).len(), 0, "not flooded once learnt");
    let back = frame(b, a, 1000, 9);
    rig.guests[0].transmit(1, &back, &[]);
    rig.poll();
    assert_eq!(rig.guests[1].received(&parts), vec![back]);
    assert_eq!((rig.counters(1).tx_frames, rig.counters(1).rx_frames), (3, 2));
    assert_eq!((rig.counters(0).tx_frames, rig.counters(0).rx_frames), (2, 3));
    assert_eq!(rig.counters(0).tx_handoff_full + rig.counters(1).tx_handoff_full, 0);
}

/// As `an_isolated_nic_reaches_no_other_nic_and_sends_only_from_its_own_address`, with the
/// isolated NIC's peer on another IOCore.
#[test]
fn an_isolated_nic_reaches_no_nic_on_another_iocore() {
    super::policy::isolated_nic_and_two_others(two_iocores(&super::policy::isolation_policies()));
}

/// A switch that does not keep up: the frames its ring has no room for are dropped and
/// counted on their sender, and frames cross again once it took what was there.
#[test]
fn a_full_ring_to_another_iocore_drops_and_counts_and_frames_cross_again_once_it_drains() {
    let mut rig = two_iocores(&[PortPolicy::default(); 2]);
    let (a, b) = (rig.guests[0].mac, rig.guests[1].mac);
    rig.guests[1].post_rx(0, &[2048]);
    rig.guests[1].transmit(0, &frame(MacAddr::BROADCAST, b, 60, 0), &[]);
    rig.poll();
    // Switch 1 stops; switch 0 hands it more than its ring holds.
    let rounds = 2 * handoff::RING_BYTES / MAX_FRAME_LEN / usize::from(SIZE);
    let sent = rounds * usize::from(SIZE);
    for round in 0..rounds {
        for head in 0..SIZE {
            rig.guests[0].transmit(head, &frame(b, a, MAX_FRAME_LEN, (round + head as usize) as u8), &[]);
        }
        rig.switch.poll();
    }
    let dropped = rig.counters(0).tx_handoff_full;
    assert!(dropped > 0 && dropped < sent as u64, "{dropped} of {sent} dropped");
    assert_eq!(rig.counters(0).tx_frames, sent as u64, "every frame was taken and switched");
    // Switch 1 catches up: what it cannot deliver (no receive buffer) goes, then frames cross.
    for _ in 0..sent {
        rig.others[0].poll();
    }
    rig.guests[1].received(&[2048]);
    for head in 0..4 {
        rig.guests[1].post_rx(head + 4, &[2048]);
    }
    let last = frame(b, a, 60, 0xee);
    rig.guests[0].transmit(0, &last, &[]);
    rig.poll();
    assert_eq!(rig.guests[1].received(&[2048]), vec![last]);
}

/// Frames handed to a switch whose IOCore sleeps wake it; while it polls, nothing is signalled.
#[test]
fn frames_handed_to_a_sleeping_switch_wake_it() {
    let mut rig = two_iocores(&[PortPolicy::default(); 2]);
    let (a, b) = (rig.guests[0].mac, rig.guests[1].mac);
    rig.guests[1].post_rx(0, &[2048]);
    rig.guests[1].post_rx(1, &[2048]);
    rig.guests[1].transmit(0, &frame(MacAddr::BROADCAST, b, 60, 0), &[]);
    rig.poll();
    let fd = rig.others[0].backend_fd().expect("a descriptor to sleep on");
    rig.others[0].backend_fd_fired();
    assert!(!readable(fd));
    rig.guests[0].transmit(0, &frame(b, a, 60, 1), &[]);
    rig.switch.poll();
    assert!(!readable(fd), "a polling switch is not signalled");
    assert!(rig.others[0].has_pending(), "but it has frames to take");
    rig.others[0].poll();
    rig.others[0].set_polling(false);
    rig.guests[0].transmit(1, &frame(b, a, 60, 2), &[]);
    rig.switch.poll();
    assert!(readable(fd), "the hand-off woke it");
    rig.others[0].backend_fd_fired();
    rig.others[0].poll();
    assert_eq!(rig.guests[1].received(&[2048]).len(), 2);
}
