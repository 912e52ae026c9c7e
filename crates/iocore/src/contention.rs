//! Does the IOCore share its core with other work? Read from the scheduler's own account of the
//! thread (`/proc/thread-self/schedstat`: time on the CPU, time runnable but waiting for it),
//! at most once per [`PROBE_WINDOW`] and only on idle passes: no system call per request.
//!
//! A spinning thread that waits for its core while it wants to run is taking turns with other
//! runnable threads there: the scheduler gives each its fair share, so spinning through an idle
//! budget takes that share from work that had something to do (an echo responder, the guest's
//! other threads, a build). The IOCore then "yields": it sleeps sooner when idle (see `idle`),
//! for a hold time that doubles while the contention is found again each time the hold ends, so
//! a competitor that stays costs it one probe window per hold.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// How much time one look at the thread's figures covers.
const PROBE_WINDOW: Duration = Duration::from_millis(1);
/// The core counts as contended when the thread waited for it at least 1/`CONTENDED_SHARE` of a
/// window (others ran while it wanted to): a short kernel worker or an interrupt's softirq now
/// and then is not contention, a thread taking turns with it is (about half; docs/tuning.md).
const CONTENDED_SHARE: u64 = 4;
/// How long the IOCore yields after it found contention, at first...
const HOLD_MIN: Duration = Duration::from_millis(10);
/// ...and at most, doubling each time the contention is still there when the hold ends.
const HOLD_MAX: Duration = Duration::from_secs(1);

/// Watches the thread's scheduler figures and says when it should leave its core to others.
pub(crate) struct Contention {
    /// The IOCore thread's run delay; `None` where the kernel does not give it (then the IOCore
    /// never yields).
    run_delay: Option<RunDelay>,
    /// When the current window began, and the time the thread had waited for a CPU by then.
    window_start: Option<(Instant, u64)>,
    yield_until: Option<Instant>,
    hold: Duration,
    /// When the last hold ended: contention found again within a hold's time doubles the next.
    hold_ended: Option<Instant>,
    /// Times contention was found.
    pub(crate) found: u64,
}

impl Contention {
    /// Open the calling thread's scheduler statistics (before its seccomp filter is installed).
    pub(crate) fn for_current_thread() -> Contention {
        Contention {
            run_delay: RunDelay::for_current_thread(),
            window_start: None,
            yield_until: None,
            hold: HOLD_MIN,
            hold_ended: None,
            found: 0,
        }
    }

    /// Should the idle thread leave its core to others now? Called on idle passes with the
    /// time; reads the figures once the current window is over (one `pread`).
    pub(crate) fn yielding(&mut self, now: Instant) -> bool {
        if let Some(until) = self.yield_until {
            if now < until {
                return true;
            }
            self.yield_until = None;
            self.hold_ended = Some(until);
            self.window_start = None;
        }
        let Some((start, before)) = self.window_start else {
            self.window_start = self.waited().map(|waited| (now, waited));
            return false;
        };
        if now.duration_since(start) < PROBE_WINDOW {
            return false;
        }
        let Some(total) = self.waited() else {
            self.window_start = None;
            return false;
        };
        self.window_start = Some((now, total));
        // Against the window's wall time, not the running time the file gives: the kernel adds
        // that at its ticks, so over a millisecond it jumps. Time the thread slept in the window
        // only makes contention look smaller.
        let waited = total.saturating_sub(before);
        let window = u64::try_from(now.duration_since(start).as_nanos()).unwrap_or(u64::MAX);
        let contended = waited.saturating_mul(CONTENDED_SHARE) >= window;
        if !contended {
            return false;
        }
        self.hold = match self.hold_ended.take() {
            Some(ended) if now.duration_since(ended) < self.hold => (self.hold * 2).min(HOLD_MAX),
            _ => HOLD_MIN,
        };
        self.found += 1;
        self.yield_until = Some(now + self.hold);
        true
    }

    fn waited(&self) -> Option<u64> {
        self.run_delay.as_ref()?.total()
    }
}

/// The calling thread's scheduler figures (`/proc/thread-self/schedstat`): its run delay, the
/// time it has waited for a CPU while runnable, and its time on a CPU.
pub(crate) struct RunDelay {
    /// Opened by the thread it describes (before its seccomp filter, which allows reading it but
    /// not opening files).
    schedstat: File,
}

impl RunDelay {
    /// `None` where the kernel does not have the file.
    pub(crate) fn for_current_thread() -> Option<RunDelay> {
        File::open("/proc/thread-self/schedstat").ok().map(|schedstat| RunDelay { schedstat })
    }

    /// Nanoseconds waited so far, from "running_ns waiting_ns timeslices" (one `pread`).
    pub(crate) fn total(&self) -> Option<u64> {
        self.field(1)
    }

    /// Nanoseconds on a CPU so far (one `pread`).
    pub(crate) fn running(&self) -> Option<u64> {
        self.field(0)
    }

    fn field(&self, index: usize) -> Option<u64> {
        let file = &self.schedstat;
        let mut buf = [0u8; 96];
        // SAFETY: the descriptor is open for as long as `file`; `buf` is writable for its length.
        let n = unsafe { libc::pread(file.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        let text = buf.get(..usize::try_from(n).ok()?)?;
        text.split(|b| b.is_ascii_whitespace()).nth(index).and_then(parse_u64)
    }
}

/// What one sleep costs the IOCore in CPU time: the system calls, the switch away and back, the
/// wake-up (a few microseconds on a machine; 8-35 here, in a nested VM). An idle thread that
/// shares its core spins at most that long before it sleeps (the ski-rental rule: it never
/// spends more than twice what the best choice in hindsight would have), so the budget follows
/// the machine without being tuned for it.
pub(crate) struct WakeCost {
    /// Moving average, in nanoseconds.
    average_ns: u64,
}

impl WakeCost {
    /// Until the first sleep is measured.
    const INITIAL: Duration = Duration::from_micros(5);
    /// Shortest spin: a burst's next request, a moment after a completion, still finds the thread
    /// spinning.
    const MIN: Duration = Duration::from_micros(1);

    pub(crate) fn new() -> WakeCost {
        WakeCost { average_ns: Self::INITIAL.as_nanos() as u64 }
    }

    /// Add one sleep's CPU time (1/8 weight).
    pub(crate) fn record(&mut self, cost: Duration) {
        let cost = u64::try_from(cost.as_nanos()).unwrap_or(u64::MAX);
        self.average_ns = self.average_ns - self.average_ns / 8 + cost / 8;
    }

    /// How long a yielding thread spins before it sleeps, at most `budget`.
    pub(crate) fn spin(&self, budget: Duration) -> Duration {
        Duration::from_nanos(self.average_ns).max(Self::MIN).min(budget)
    }
}

/// CPU time of the calling thread (a system call: only around sleeps).
pub(crate) fn thread_cpu_time() -> Option<Duration> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer; the clock id is a constant the kernel knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// A decimal number, without allocating.
fn parse_u64(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        d.is_ascii_digit().then(|| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_threads_figures() {
        let contention = Contention::for_current_thread();
        assert!(contention.waited().is_some(), "/proc/thread-self/schedstat");
        assert_eq!(parse_u64(b"123"), Some(123));
        assert_eq!(parse_u64(b""), None);
        assert_eq!(parse_u64(b"1x"), None);
    }

    #[test]
    fn the_spin_follows_the_measured_wake_cost_within_bounds() {
        let mut cost = WakeCost::new();
        for _ in 0..64 {
            cost.record(Duration::from_micros(16));
        }
        let spin = cost.spin(Duration::from_micros(50));
        assert!(spin > Duration::from_micros(15) && spin <= Duration::from_micros(16), "{spin:?}");
        assert_eq!(cost.spin(Duration::from_micros(10)), Duration::from_micros(10));
        for _ in 0..64 {
            cost.record(Duration::ZERO);
        }
        assert_eq!(cost.spin(Duration::from_micros(50)), WakeCost::MIN);
    }
}
