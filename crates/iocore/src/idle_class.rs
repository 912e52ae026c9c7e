//! A pinned polling or notified IOCore runs in the idle scheduling class (SCHED_IDLE), so that
//! the kernel's own work on its core preempts it the moment it wakes, and spins through its disk
//! waits instead of sleeping.
//!
//! On a real disk the kernel finishes requests on the core that took the disk's interrupt,
//! which is often the IOCore's: ext4 completes every async O_DIRECT write in a kworker, and a
//! loop device runs all its I/O in one. In the normal class the IOCore has to sleep to let them
//! run, and while it sleeps it sees neither the guest's next requests (a polled driver does not
//! notify) nor the completions those workers post: the core idled with requests waiting. In the
//! idle class any normal thread that wakes on the core runs at once, and the IOCore, when it
//! gets the core back, has never stopped looking (the runs against fio are in docs/tuning.md).
//!
//! The price: any other busy thread on the core holds an idle-class thread off almost entirely,
//! for most of a second at a time. A pinned polling IOCore is meant to own its core; when it
//! finds it does not, it leaves the idle class for a hold that doubles while it keeps finding
//! that, and then tries the idle class again. A polling IOCore finds it from a pass that came
//! more than `HELD_OFF` after the one before, and goes back to the batch class. A notified one
//! sleeps between requests, so those gaps fall in its sleeps: it finds it from a wake-up that
//! waited more than `WAKE_HELD_OFF` for its core, and goes to the normal class, whose wake-ups
//! preempt (a batch thread woken behind a busy one waits for the next tick). Both find it only
//! once they run again; a watcher thread (`watch`) moves them sooner, and they take its move as
//! a hold of their own.

use std::time::{Duration, Instant};

use crate::contention::RunDelay;
use crate::set_scheduling_class;
use crate::watch::Watcher;

/// Passes between two looks at the clock.
const PASSES_PER_LOOK: u32 = 64;
/// A gap between two looks longer than this means another thread held the core: the kernel's
/// work takes far less at a time, while a busy thread keeps an idle-class one off for most of a
/// second (docs/tuning.md).
const HELD_OFF: Duration = Duration::from_millis(50);
/// How long the IOCore stays in the batch class after it was held off, at first...
const HOLD_MIN: Duration = Duration::from_secs(1);
/// ...and at most, doubling each time it is held off again soon after a hold ended.
const HOLD_MAX: Duration = Duration::from_secs(64);
/// A wake-up that waited longer than this for the core waited for another thread: the kernel's
/// own work preempts an idle-class thread in well under a millisecond, while a busy thread holds
/// a woken one off for milliseconds (docs/tuning.md).
const WAKE_HELD_OFF: Duration = Duration::from_millis(1);
/// How often, at most, a sleep's wake-up is measured (two `pread`s of the scheduler's figures):
/// a notified IOCore sleeps once per request at low depth, and one held off waits milliseconds
/// per wake-up, so sampling finds it within a few requests without a system call per request.
const WAKE_SAMPLE_EVERY: Duration = Duration::from_millis(10);

/// The IOCore thread's scheduling class while it may use the idle class, and when to try it
/// again after another thread held it off.
pub(crate) struct IdleClass {
    passes: u32,
    last_look: Option<Instant>,
    /// When a batch thread, held off, tries the idle class again; `None` while in it.
    back_at: Option<Instant>,
    hold: Duration,
    /// When the last hold ended: held off again within a hold's time doubles the next one.
    hold_ended: Option<Instant>,
    /// Times another thread held the IOCore off and it left the idle class.
    pub(crate) held_off: u64,
    /// The class it serves in while held off: batch for a thread that spins, normal for one that
    /// sleeps until notified (see the module's doc).
    fallback: libc::c_int,
    /// The thread's run delay, to measure its wake-ups; `None` where the kernel does not give it.
    run_delay: Option<RunDelay>,
    /// The run delay when the current sleep began, if this sleep's wake-up is measured.
    run_delay_before_sleep: Option<u64>,
    /// When a wake-up was last measured.
    last_wake_sample: Option<Instant>,
    /// Moves the thread out of the idle class while a busy thread holds it off, without
    /// waiting for it to run again (`watch`).
    watcher: Option<Watcher>,
}

impl IdleClass {
    /// Move the calling thread, a batch thread, to the idle class, if it will be allowed back
    /// (see `may_leave_idle_class`); `None` if it stays a batch thread. `fallback` is the class
    /// it serves in while another thread holds it off; `watch`, the filter of the thread that
    /// watches for that (`watch`; `None`: no watcher). Call it before the thread's seccomp
    /// filter: it opens the thread's scheduler figures and starts the watcher.
    pub(crate) fn enter(fallback: libc::c_int, watch: Option<sandbox::Filter>) -> Option<IdleClass> {
        if !may_leave_idle_class() || set_scheduling_class(libc::SCHED_IDLE).is_err() {
            return None;
        }
        Some(IdleClass {
            watcher: watch.and_then(|filter| Watcher::start(fallback, filter)),
            passes: 0,
            last_look: None,
            back_at: None,
            hold: HOLD_MIN,
            hold_ended: None,
            held_off: 0,
            fallback,
            run_delay: RunDelay::for_current_thread(),
            run_delay_before_sleep: None,
            last_wake_sample: None,
        })
    }

    /// One pass of the serving loop; every `PASSES_PER_LOOK` passes it reads the clock and
    /// changes class if it must. Returns whether the thread is in the idle class (its disk
    /// waits may spin).
    pub(crate) fn pass(&mut self) -> bool {
        self.passes = self.passes.wrapping_add(1);
        if let Some(watcher) = &self.watcher {
            watcher.pass(self.passes);
        }
        if self.passes.is_multiple_of(PASSES_PER_LOOK) {
            self.look(Instant::now());
        }
        self.idle()
    }

    /// In the idle class now (else a batch thread, holding until `back_at`).
    fn idle(&self) -> bool {
        self.back_at.is_none()
    }

    /// The thread is about to sleep until notified: note its run delay if this sleep's
    /// wake-up is to be measured.
    pub(crate) fn sleeping(&mut self) {
        if !self.idle() {
            return;
        }
        let now = Instant::now();
        if self.last_wake_sample.is_some_and(|last| now.duration_since(last) < WAKE_SAMPLE_EVERY) {
            return;
        }
        self.last_wake_sample = Some(now);
        self.run_delay_before_sleep = self.run_delay.as_ref().and_then(RunDelay::total);
    }

    /// The thread woke from a sleep of its own: the time until its next look is not a gap, but
    /// the time its wake-up waited for the core may be.
    pub(crate) fn woke(&mut self) {
        let before = self.run_delay_before_sleep.take();
        let after = before.and_then(|_| self.run_delay.as_ref()?.total());
        let waited =
            before.zip(after).map(|(before, after)| Duration::from_nanos(after.saturating_sub(before)));
        self.woke_after(waited, Instant::now());
    }

    /// `woke`, given how long the wake-up waited for the core if it was measured.
    fn woke_after(&mut self, waited: Option<Duration>, now: Instant) {
        self.last_look = None;
        let moved = self.watcher.as_ref().is_some_and(Watcher::took_it_off);
        let waited = waited.unwrap_or_default();
        if moved || waited > WAKE_HELD_OFF {
            self.fall_back(waited, now);
        }
    }

    fn look(&mut self, now: Instant) {
        let last = self.last_look.replace(now);
        if self.idle() {
            let gap = last.map_or(Duration::ZERO, |last| now.duration_since(last));
            let moved = self.watcher.as_ref().is_some_and(Watcher::took_it_off);
            if moved || gap > HELD_OFF {
                self.fall_back(gap, now);
            }
        } else if self.back_at.is_some_and(|at| now >= at) && set_scheduling_class(libc::SCHED_IDLE).is_ok() {
            self.hold_ended = self.back_at.take();
            if let Some(watcher) = &self.watcher {
                watcher.idle_class(true);
            }
        }
    }

    /// Another thread held the IOCore off for `gap`: leave the idle class for a hold.
    fn fall_back(&mut self, gap: Duration, now: Instant) {
        if set_scheduling_class(self.fallback).is_err() {
            return;
        }
        if let Some(watcher) = &self.watcher {
            watcher.idle_class(false);
        }
        self.held_off += 1;
        self.hold = match self.hold_ended.take() {
            Some(ended) if now.duration_since(ended) < self.hold => (self.hold * 2).min(HOLD_MAX),
            _ => HOLD_MIN,
        };
        self.back_at = Some(now + self.hold);
        let class = if self.fallback == libc::SCHED_BATCH { "batch" } else { "normal" };
        // Rare (at most once a hold), and the operator's to act on: not a hot-path write.
        log::warn!(
            "another thread held the IOCore off its CPU for {} ms; it serves as a \
             {class} thread for {} s (a pinned IOCore should have its CPU to itself)",
            gap.as_millis(),
            self.hold.as_secs()
        );
    }
}

/// May the calling thread leave the idle class for the batch class at its nice value? Linux
/// lets it with CAP_SYS_NICE, or when RLIMIT_NICE allows that nice value; a thread that could
/// not would stay held off for good.
fn may_leave_idle_class() -> bool {
    // SAFETY: plain queries of the calling thread, with valid out-pointers.
    unsafe {
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, 0);
        if nice == -1 && *libc::__errno_location() != 0 {
            return false;
        }
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        let allowed = libc::getrlimit(libc::RLIMIT_NICE, &mut limit) == 0
            && u64::try_from(20 - nice).is_ok_and(|needed| limit.rlim_cur >= needed);
        allowed || has_cap_sys_nice()
    }
}

/// Is CAP_SYS_NICE in the calling thread's effective set?
fn has_cap_sys_nice() -> bool {
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    const CAP_SYS_NICE: u32 = 23;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
    let mut data = [Data { effective: 0, permitted: 0, inheritable: 0 }; 2];
    // SAFETY: capget reads the header and writes two Data records (version 3), both valid here.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    rc == 0 && data[0].effective & (1 << CAP_SYS_NICE) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class() -> libc::c_int {
        // SAFETY: a query of the calling thread.
        unsafe { libc::sched_getscheduler(0) }
    }

    #[test]
    fn a_long_gap_between_passes_sends_it_back_to_batch_until_the_hold_ends() {
        std::thread::spawn(|| {
            set_scheduling_class(libc::SCHED_BATCH).unwrap();
            let mut class_state =
                IdleClass::enter(libc::SCHED_BATCH, None).expect("root may leave the idle class");
            assert_eq!(class(), libc::SCHED_IDLE);
            let start = Instant::now();
            class_state.look(start);
            class_state.look(start + Duration::from_millis(10));
            assert!(class_state.idle(), "a short gap is the kernel's work");
            class_state.look(start + Duration::from_millis(70));
            assert!(!class_state.idle());
            assert_eq!((class(), class_state.held_off), (libc::SCHED_BATCH, 1));
            class_state.look(start + Duration::from_millis(500));
            assert!(!class_state.idle(), "holds for a second");
            let back = start + Duration::from_millis(1100);
            class_state.look(back);
            assert_eq!(class(), libc::SCHED_IDLE);
            // Held off again soon after: the next hold is twice as long.
            class_state.look(back + Duration::from_millis(1));
            class_state.look(back + Duration::from_millis(60));
            assert_eq!(class_state.hold, 2 * HOLD_MIN);
            assert_eq!(class(), libc::SCHED_BATCH);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_wake_up_that_waited_for_the_core_sends_a_sleeping_thread_to_the_normal_class() {
        std::thread::spawn(|| {
            set_scheduling_class(libc::SCHED_BATCH).unwrap();
            let mut class_state =
                IdleClass::enter(libc::SCHED_OTHER, None).expect("root may leave the idle class");
            let start = Instant::now();
            class_state.look(start);
            // Its own sleep of 200 ms, woken at once: not a gap, not held off.
            class_state.woke_after(Some(Duration::from_micros(20)), start + Duration::from_millis(200));
            class_state.look(start + Duration::from_millis(201));
            class_state.woke_after(None, start + Duration::from_millis(400));
            class_state.look(start + Duration::from_millis(401));
            assert!(class_state.idle());
            assert_eq!((class(), class_state.held_off), (libc::SCHED_IDLE, 0));
            // Woken, it waited 5 ms for the core.
            class_state.woke_after(Some(Duration::from_millis(5)), start + Duration::from_millis(600));
            assert!(!class_state.idle());
            assert_eq!((class(), class_state.held_off), (libc::SCHED_OTHER, 1));
            class_state.look(start + Duration::from_millis(1700));
            assert_eq!(class(), libc::SCHED_IDLE, "back after the hold");
        })
        .join()
        .unwrap();
    }
}
