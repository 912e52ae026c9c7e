//! A switch whose IOCore sleeps: what it asks the drivers, and what makes its descriptor
//! (`QueueWorker::backend_fd`) readable.

use std::os::fd::RawFd;

use super::*;

/// The used ring's flags word (VRING_USED_F_NO_NOTIFY is bit 0).
fn used_flags(guest: &Guest, rx: bool) -> u16 {
    let used = if rx { RX.2 } else { TX.2 };
    guest.mem.read_obj(GuestAddress(used)).unwrap()
}

fn readable(fd: RawFd) -> bool {
    let mut poll = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd, for the duration of the call.
    unsafe { libc::poll(&mut poll, 1, 0) == 1 }
}

#[test]
fn notified_it_asks_for_transmit_kicks_only_and_a_kick_or_news_wakes_it() {
    let mut rig = rig(2);
    rig.switch.set_polling(false);
    rig.poll();
    for guest in &rig.guests {
        assert_eq!(used_flags(guest, false), 0, "the transmit ring asks for kicks");
        assert_eq!(used_flags(guest, true), 1, "the receive ring does not");
    }
    let fd = rig.switch.backend_fd().expect("a descriptor to sleep on");
    assert!(readable(fd), "the ports' attaching woke it");
    rig.switch.backend_fd_fired();
    assert!(!readable(fd), "nothing has happened since");

    let (a, b) = (rig.guests[0].mac, rig.guests[1].mac);
    rig.guests[1].post_rx(0, &[2048]);
    rig.guests[0].transmit(0, &frame(b, a, 60, 3), &[]);
    assert!(rig.switch.has_pending());
    rig.guests[0].kick.write(1).unwrap();
    assert!(readable(fd), "the kick wakes it");
    rig.switch.backend_fd_fired();
    assert!(!readable(fd), "cleared once it woke");
    rig.poll();
    assert_eq!(rig.guests[1].received(&[2048]), vec![frame(b, a, 60, 3)]);
    assert!(!rig.switch.has_pending());

    // A port attached while it sleeps: the mailbox's news wakes it.
    rig.control.attach(kickless_port()).unwrap();
    assert!(readable(fd), "the news wakes it");
    rig.switch.backend_fd_fired();
    assert!(!readable(fd));
    assert!(rig.switch.has_pending(), "the news waits for the next pass");
}

/// A port in memory of its own whose frontend gave no transmit kick.
fn kickless_port() -> Port {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
    let error = Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap());
    Port::new(queue_pair(&mem, &error, None))
}

/// No kick announces that port's frames: an IOCore that sleeps wakes after a moment to look.
#[test]
fn a_port_without_a_kick_keeps_a_sleeping_switch_looking() {
    let mut rig = rig(1);
    rig.switch.set_polling(false);
    rig.poll();
    assert!(!rig.switch.unannounced());
    rig.control.attach(kickless_port()).unwrap();
    rig.poll();
    assert!(rig.switch.unannounced(), "nothing would wake it for that port");
}
