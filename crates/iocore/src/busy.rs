//! Where an IOCore's time goes: each pass over its queues, with whatever follows it until the
//! next (a spin, a yield, a sleep), counts as busy when it started or finished a request and as
//! idle otherwise. A few relaxed stores per pass, to counters only this thread writes, which
//! the daemon's metrics read while it runs; a reader counts the pass still going on (a long
//! sleep, say) up to the moment it reads.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// What the IOCore publishes, in `clock` ticks.
#[derive(Default)]
pub(crate) struct SharedTimes {
    busy: AtomicU64,
    idle: AtomicU64,
    /// When the current pass began, and whether it found work.
    pass_start: AtomicU64,
    pass_busy: AtomicBool,
}

impl SharedTimes {
    /// Busy and idle time so far, the current pass included.
    pub(crate) fn read(&self) -> (Duration, Duration) {
        let (mut busy, mut idle) = (self.busy.load(Ordering::Relaxed), self.idle.load(Ordering::Relaxed));
        let start = self.pass_start.load(Ordering::Relaxed);
        if start != 0 {
            let open = clock::ticks().saturating_sub(start);
            if self.pass_busy.load(Ordering::Relaxed) {
                busy = busy.saturating_add(open);
            } else {
                idle = idle.saturating_add(open);
            }
        }
        (clock::to_duration(busy), clock::to_duration(idle))
    }
}

/// The IOCore thread's running split of its time.
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

    /// A pass begins: the time since the previous one goes to that pass's side.
    #[inline]
    pub(crate) fn pass(&mut self, shared: &SharedTimes) {
        let now = clock::ticks();
        let elapsed = now.saturating_sub(self.last);
        self.last = now;
        if self.last_busy {
            self.busy = self.busy.wrapping_add(elapsed);
            shared.busy.store(self.busy, Ordering::Relaxed);
        } else {
            self.idle = self.idle.wrapping_add(elapsed);
            shared.idle.store(self.idle, Ordering::Relaxed);
        }
        shared.pass_start.store(now, Ordering::Relaxed);
    }

    /// The pass that began last did (`true`) or did not start or finish a request.
    #[inline]
    pub(crate) fn worked(&mut self, work: bool, shared: &SharedTimes) {
        if work != self.last_busy {
            shared.pass_busy.store(work, Ordering::Relaxed);
        }
        self.last_busy = work;
    }
}
