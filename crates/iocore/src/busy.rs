//! Where an IOCore's time goes: each pass over its queues, with whatever follows it until the
//! next (a spin, a yield, a sleep), counts as busy when it started or finished a request and as
//! idle otherwise. One TSC read and one relaxed store per pass, to counters only this thread
//! writes, which the daemon's metrics read while it runs.

use std::sync::atomic::{AtomicU64, Ordering};

/// The running split of one thread's time.
pub(crate) struct BusyClock {
    last: u64,
    last_busy: bool,
    busy: u64,
    idle: u64,
}

impl BusyClock {
    pub(crate) fn new() -> BusyClock {
        BusyClock { last: clock::ticks(), last_busy: false, busy: 0, idle: 0 }
    }

    /// A pass begins: the time since the previous one goes to that pass's side, and is
    /// published to `busy` or `idle`.
    #[inline]
    pub(crate) fn pass(&mut self, busy: &AtomicU64, idle: &AtomicU64) {
        let now = clock::ticks();
        let elapsed = now.saturating_sub(self.last);
        self.last = now;
        if self.last_busy {
            self.busy = self.busy.wrapping_add(elapsed);
            busy.store(self.busy, Ordering::Relaxed);
        } else {
            self.idle = self.idle.wrapping_add(elapsed);
            idle.store(self.idle, Ordering::Relaxed);
        }
    }

    /// The pass that began last did (`true`) or did not start or finish a request.
    #[inline]
    pub(crate) fn worked(&mut self, work: bool) {
        self.last_busy = work;
    }
}
