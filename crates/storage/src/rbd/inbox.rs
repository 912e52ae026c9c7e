//! Where librbd's threads leave finished requests for the queue's owner: one bit per request
//! slot, and an eventfd that wakes an owner sleeping on it.
//!
//! librbd calls [`request_done`] on one of its own threads. That callback does none of the
//! request's work: it sets the slot's bit and signals the eventfd, and the owner answers the
//! request on its own thread at its next poll, taking every finished slot with one atomic swap
//! per 64 slots: no lock and no system call on the owner's side. (librbd's own completion queue,
//! `rbd_poll_io_events`, is one queue per image behind a mutex; the queues of one disk share an
//! image, so each needs an inbox of its own.)

use std::ffi::c_void;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::ffi;

/// The finished slots of one queue's backend.
pub struct Inbox {
    done: Box<[AtomicU64]>,
    wake: EventFd,
}

/// What librbd hands [`request_done`] for a request: its slot and its backend's inbox.
pub struct SlotTicket {
    inbox: *const Inbox,
    slot: usize,
}

// SAFETY: a ticket is an address and a slot number; it is dereferenced only by `request_done`,
// whose contract keeps the inbox alive, and an Inbox is Sync (atomics and an eventfd).
unsafe impl Send for SlotTicket {}

impl Inbox {
    /// An inbox for `slots` requests in flight.
    pub fn new(slots: usize) -> std::io::Result<Inbox> {
        let words = slots.div_ceil(64);
        Ok(Inbox { done: (0..words).map(|_| AtomicU64::new(0)).collect(), wake: EventFd::new(EFD_NONBLOCK)? })
    }

    /// The tickets for each slot, pointing at `self`: valid for as long as `self` does not move
    /// or go (the backend keeps it boxed until its last request is done).
    pub fn tickets(&self, slots: usize) -> Box<[SlotTicket]> {
        (0..slots).map(|slot| SlotTicket { inbox: self, slot }).collect()
    }

    /// The eventfd librbd's threads signal after marking a slot.
    pub fn fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    /// Empty the eventfd's counter: the owner woke up on it and polls next.
    pub fn clear_wake(&self) {
        let _ = self.wake.read();
    }

    /// Call `finished` with every slot marked since the last call.
    pub fn take(&self, mut finished: impl FnMut(usize)) {
        for (word_index, word) in self.done.iter().enumerate() {
            if word.load(Ordering::Relaxed) == 0 {
                continue;
            }
            // Acquire: librbd's writes into a read's buffers and the completion's return value
            // happen before the callback's Release below.
            let mut bits = word.swap(0, Ordering::Acquire);
            while bits != 0 {
                let bit = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                finished(word_index * 64 + bit);
            }
        }
    }

    fn mark(&self, slot: usize) {
        self.done[slot / 64].fetch_or(1 << (slot % 64), Ordering::Release);
        // A full counter (never reached: it is emptied at every wake) fails harmlessly.
        let _ = self.wake.write(1);
    }
}

/// librbd's completion callback (`rbd_callback_t`).
///
/// # Safety
/// `ticket` is a `SlotTicket` from [`Inbox::tickets`] whose inbox is alive: the backend that
/// owns both waits for every request it submitted before it frees them.
pub unsafe extern "C" fn request_done(_completion: ffi::Completion, ticket: *mut c_void) {
    // SAFETY: the caller's contract.
    let ticket = unsafe { &*ticket.cast::<SlotTicket>() };
    // SAFETY: as above: the inbox outlives the request.
    unsafe { &*ticket.inbox }.mark(ticket.slot);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marked_slots_are_taken_once_each_in_order() {
        let inbox = Inbox::new(130).unwrap();
        let tickets = inbox.tickets(130);
        for slot in [129, 0, 64, 63] {
            // SAFETY: the ticket's inbox is alive.
            unsafe {
                request_done(std::ptr::null_mut(), std::ptr::from_ref(&tickets[slot]).cast_mut().cast())
            };
        }
        let mut taken = Vec::new();
        inbox.take(|slot| taken.push(slot));
        assert_eq!(taken, [0, 63, 64, 129]);
        inbox.take(|slot| panic!("slot {slot} taken twice"));
        assert_eq!(inbox.wake.read().unwrap(), 4);
    }
}
