//! How the IOCore waits while only the disk has work: it spins a little (when that pays) and
//! then sleeps on the backends' completion descriptors.

use std::time::{Duration, Instant};

/// Idle spins between two looks at the clock.
const SPINS_PER_CLOCK_CHECK: u32 = 64;
/// How long the thread spins, with requests in flight and nothing else to do, before it sleeps
/// on the backends' completion descriptors (when spinning pays: see `SpinTrial`). A thread
/// spinning on the core where the disk's completion work runs (its interrupt, then block-layer,
/// file-system and loop-device workers: every O_DIRECT write to an ext4 file finishes in a
/// kworker) starves that work for a whole scheduler slice (docs/tuning.md).
const DISK_SPIN: Duration = Duration::from_micros(20);
/// Sleeps under a polling policy start this short and double while the disk stays busy, up to
/// `DISK_SLEEP_MAX`: the driver of a polled queue does not notify, so a request it makes
/// meanwhile waits at most that long. A completion ends a sleep at once. Waking every 50 µs
/// through a long request costs the disk's own workers their core again (docs/tuning.md).
const DISK_SLEEP_MIN: Duration = Duration::from_micros(50);
const DISK_SLEEP_MAX: Duration = Duration::from_micros(200);
/// How long an idle-class IOCore spins through a disk wait in which no request is known to run
/// in one of io_uring's worker threads before it starts to yield its core, and how often it
/// yields after that. io_uring also hands an O_DIRECT request to a worker when it cannot start
/// it without blocking (a write into a hole of a sparse file, which must allocate), and that
/// worker, created from the IOCore's thread and so of its class, runs only when the IOCore
/// yields. The disk's own completions mostly come sooner than the grace, and a long wait makes
/// a system call only every `UNKNOWN_WORKER_PERIOD` (docs/tuning.md).
const UNKNOWN_WORKER_GRACE: Duration = Duration::from_micros(50);
const UNKNOWN_WORKER_PERIOD: Duration = Duration::from_micros(25);
/// Disk waits between two trials of spinning against sleeping at once.
const SPIN_TRIAL_EVERY: u32 = 8192;
/// Disk waits each half of a trial lasts.
const SPIN_TRIAL_WAITS: u32 = 512;

/// How long the thread has been idle, read from the clock only every `SPINS_PER_CLOCK_CHECK`
/// passes (or on each pass when asked): a spinning loop need not pay for a clock read per pass.
#[derive(Default)]
pub(crate) struct IdleClock {
    since: Option<Instant>,
    spins: u32,
}

impl IdleClock {
    /// One idle pass: either a spin (`None`) or, every `SPINS_PER_CLOCK_CHECK` passes or when
    /// `look`, the time and how long the thread has been idle.
    pub(crate) fn pass(&mut self, look: bool) -> Option<(Instant, Duration)> {
        self.spins = self.spins.wrapping_add(1);
        if !look && !self.spins.is_multiple_of(SPINS_PER_CLOCK_CHECK) {
            std::hint::spin_loop();
            return None;
        }
        let now = Instant::now();
        Some((now, now.duration_since(*self.since.get_or_insert(now))))
    }

    /// Something happened: idle time counts from the next idle pass.
    pub(crate) fn reset(&mut self) {
        self.since = None;
    }
}

/// Whether to spin before sleeping on the disk, settled by trial. Spinning keeps the core out
/// of its idle state, so a completion that the disk's interrupt finishes reaches the IOCore
/// without a wake-up from idle. Where a kernel thread must finish each request on this core (a
/// loop device's worker), the spin holds that thread off instead (docs/tuning.md).
/// Every `SPIN_TRIAL_EVERY` waits the IOCore spins for `SPIN_TRIAL_WAITS` waits, then sleeps at
/// once for as many, and keeps whichever did more work per second.
struct SpinTrial {
    waits: u32,
    phase: TrialPhase,
}

/// Where a `SpinTrial` stands: settled on spinning or not, or measuring one way (since when,
/// and the work done by then).
#[derive(Clone, Copy)]
enum TrialPhase {
    Settled { spin: bool },
    Spinning { since: Instant, work: u64 },
    Sleeping { since: Instant, work: u64, spinning: (u64, Duration) },
}

impl SpinTrial {
    fn new() -> SpinTrial {
        // The first wait starts a trial.
        SpinTrial { waits: SPIN_TRIAL_EVERY, phase: TrialPhase::Settled { spin: true } }
    }

    /// Does a wait spin, where the trial stands now?
    fn spin(&self) -> bool {
        match self.phase {
            TrialPhase::Settled { spin } => spin,
            TrialPhase::Spinning { .. } => true,
            TrialPhase::Sleeping { .. } => false,
        }
    }

    /// A disk wait begins, `work` units of work (requests started or finished) after the
    /// thread started: should it spin first? Reads `clock` only when a phase ends.
    fn begin_wait(&mut self, work: u64, clock: impl FnOnce() -> Instant) -> bool {
        self.waits += 1;
        let limit = match self.phase {
            TrialPhase::Settled { .. } => SPIN_TRIAL_EVERY,
            _ => SPIN_TRIAL_WAITS,
        };
        if self.waits < limit {
            return self.spin();
        }
        self.waits = 0;
        let now = clock();
        self.phase = match self.phase {
            TrialPhase::Settled { .. } => TrialPhase::Spinning { since: now, work },
            TrialPhase::Spinning { since, work: before } => {
                TrialPhase::Sleeping { since: now, work, spinning: (work - before, now - since) }
            }
            TrialPhase::Sleeping { since, work: before, spinning } => {
                TrialPhase::Settled { spin: does_more_per_second(spinning, (work - before, now - since)) }
            }
        };
        self.spin()
    }
}

/// Is `(work, time)` `a` at least as fast as `b`?
fn does_more_per_second(a: (u64, Duration), b: (u64, Duration)) -> bool {
    u128::from(a.0) * b.1.as_nanos() >= u128::from(b.0) * a.1.as_nanos()
}

/// Whether a thread waiting for the disk should yield its core to io_uring's workers, which are
/// created from its own thread and share its CPU and scheduling class: on every pass while a
/// request in flight is known to run in one (buffered I/O, tmpfs, FLUSH), now and then after
/// `UNKNOWN_WORKER_GRACE` otherwise. A spinning idle-class thread holds a worker of its own
/// class off until the scheduler's tick (docs/tuning.md); a yield lets it run at once, and
/// costs one system call when there is none.
#[derive(Default)]
pub(crate) struct WorkerWait {
    clock: IdleClock,
    last_yield: Option<Instant>,
}

impl WorkerWait {
    /// Something happened: the next wait starts afresh.
    pub(crate) fn reset(&mut self) {
        self.clock.reset();
        self.last_yield = None;
    }

    /// One pass of a disk wait (`known`: a request in flight runs in a worker): yield now?
    pub(crate) fn should_yield(&mut self, known: bool) -> bool {
        if known {
            return true;
        }
        let Some((now, waited)) = self.clock.pass(false) else { return false };
        let due = waited >= UNKNOWN_WORKER_GRACE
            && self.last_yield.is_none_or(|at| now.duration_since(at) >= UNKNOWN_WORKER_PERIOD);
        if due {
            self.last_yield = Some(now);
        }
        due
    }
}

/// Time spent with only the backends busy, to decide when to stop spinning for them and how
/// long to sleep.
pub(crate) struct DiskWait {
    idle: IdleClock,
    next_sleep: Duration,
    /// This wait spins before it sleeps; `None` between waits.
    spins: Option<bool>,
    trial: SpinTrial,
}

impl DiskWait {
    pub(crate) fn new() -> DiskWait {
        DiskWait {
            idle: IdleClock::default(),
            next_sleep: DISK_SLEEP_MIN,
            spins: None,
            trial: SpinTrial::new(),
        }
    }

    /// Something happened: the next wait decides afresh whether to spin, and sleeps briefly.
    pub(crate) fn reset(&mut self) {
        self.idle.reset();
        self.next_sleep = DISK_SLEEP_MIN;
        self.spins = None;
    }

    /// Called on each idle pass while requests are in flight, `work` units of work after the
    /// thread started: may the thread sleep now?
    pub(crate) fn spun_enough(&mut self, work: u64) -> bool {
        let trial = &mut self.trial;
        if !*self.spins.get_or_insert_with(|| trial.begin_wait(work, Instant::now)) {
            return true;
        }
        self.idle.pass(false).is_some_and(|(_, spun)| spun >= DISK_SPIN)
    }

    /// How long the next sleep of a polling thread may last.
    pub(crate) fn polled_sleep(&mut self) -> Duration {
        let sleep = self.next_sleep;
        self.next_sleep = (sleep * 2).min(DISK_SLEEP_MAX);
        sleep
    }
}

#[cfg(test)]
mod tests;
