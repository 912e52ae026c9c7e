//! How the IOCore waits after a pass over its queues: the one place that decides whether to pass
//! again at once, spin, yield its core or sleep, from its `Policy`, what the pass did and what the
//! requests in flight wait for. The heuristics it weighs keep their own state in their modules:
//! the scheduling class (`idle_class`), other threads wanting the core (`contention`), and the
//! waits for the disk (`wait`).

use std::time::Duration;

use crate::contention::{thread_cpu_time, Contention, WakeCost};
use crate::idle_class::IdleClass;
use crate::wait::{DiskWait, IdleClock, WorkerWait};
use crate::{IoCoreError, IoCoreStats, Policy};

/// What the requests in flight wait for, when the thread has nothing else to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BackendWait {
    /// The kernel (io_uring): spinning may pay, as `DiskWait` settles.
    Kernel,
    /// Only the backends' own threads (librbd's): the thread sleeps at once.
    OwnThreads,
}

/// What the idle policy asks of the queues it waits for (the engine's workers and its epoll).
pub(crate) trait Queues {
    /// Requests started or finished since the thread started.
    fn served(&self) -> u64;
    /// Does a worker have requests in its backend?
    fn in_flight(&self) -> bool;
    /// Has a queue requests waiting that the next pass can take (not held back by a rate limit)?
    fn pending(&self) -> bool;
    /// What the requests in flight wait for, when all of them are in backends that signal their
    /// completions on a file descriptor (so the thread may sleep on them); `None` when nothing
    /// is in flight or a request is not of that kind.
    fn backend_wait(&self) -> Option<BackendWait>;
    /// Does a backend hold requests that io_uring runs in workers created from this thread?
    fn waits_on_submitter_workers(&self) -> bool;
    /// How long a sleep may last: for ever (until a notification), or a moment when a queue's
    /// requests wait for its rate limit, which no notification announces.
    fn wait_limit(&self) -> Option<Duration>;
    /// Ask every driver not to notify (`true`: the thread polls) or to notify.
    fn set_polling(&mut self, polling: bool);
    /// Sleep until a notification, a backend's completion or a command, at most `timeout`.
    fn sleep(&mut self, timeout: Option<Duration>);
}

/// How the IOCore thread waits between passes, and all it keeps to decide.
pub(crate) struct Idle {
    policy: Policy,
    /// A pinned polling or notified thread's idle scheduling class; `None`: not in it.
    class: Option<IdleClass>,
    /// Whether other threads wait for an adaptive thread's core.
    contention: Contention,
    /// The adaptive thread found contention, and sleeps sooner when idle.
    yielding: bool,
    /// What an adaptive thread's sleeps cost it.
    wake_cost: WakeCost,
    /// How long an adaptive thread has found nothing to do.
    idle_clock: IdleClock,
    /// Whether to spin or sleep while only the disk has work.
    disk_wait: DiskWait,
    /// When an idle-class thread waiting for the disk yields to io_uring's workers.
    worker_wait: WorkerWait,
    /// Counts for `IoCoreStats`.
    sleeps: u64,
    disk_sleeps: u64,
    worker_yields: u64,
}

impl Idle {
    /// Set the calling thread up for `policy`: a batch thread (`schedule_as_batch`) unless it
    /// is adaptive, and then, if `pinned`, an idle-class one (`IdleClass`, its watcher confined
    /// by `filter`'s rules for it). Call it before the thread's own seccomp filter: it opens the
    /// thread's scheduler figures and may start the watcher.
    pub(crate) fn enter(policy: Policy, pinned: bool, filter: &sandbox::Filter) -> Result<Idle, IoCoreError> {
        // Not an adaptive one: it leaves its core to other threads by sleeping early when it
        // waits for the core, and as a batch thread, woken late, it stayed behind a busy thread
        // and spun, leaving that thread less of the core (docs/tuning.md).
        let batch = !matches!(policy, Policy::Adaptive { .. });
        if batch {
            crate::schedule_as_batch().map_err(IoCoreError::Schedule)?;
        }
        // Pinned, it owns its core: it may spin there as long as the kernel's work comes first.
        let fallback = if policy == Policy::Notified { libc::SCHED_OTHER } else { libc::SCHED_BATCH };
        let class = match batch && pinned {
            true => IdleClass::enter(fallback, filter.for_kind(sandbox::ThreadKind::IoCoreWatch).ok()),
            false => None,
        };
        Ok(Idle::new(policy, class))
    }

    /// The policy in a thread whose scheduling class is set already (`class`).
    fn new(policy: Policy, class: Option<IdleClass>) -> Idle {
        Idle {
            policy,
            class,
            contention: Contention::for_current_thread(),
            yielding: false,
            wake_cost: WakeCost::new(),
            idle_clock: IdleClock::default(),
            disk_wait: DiskWait::new(),
            worker_wait: WorkerWait::default(),
            sleeps: 0,
            disk_sleeps: 0,
            worker_yields: 0,
        }
    }

    /// After a pass that started or finished `work` requests: wait as the policy says, if at all.
    pub(crate) fn wait(&mut self, work: usize, queues: &mut impl Queues) {
        // On every pass: the class finds another thread holding the core by the gaps between them.
        let idle_class = self.class.as_mut().is_some_and(IdleClass::pass);
        if work == 0 {
            if let Some(backends) = queues.backend_wait() {
                return self.wait_for_backends(backends, idle_class, queues);
            }
        }
        self.disk_wait.reset();
        self.worker_wait.reset();
        match self.policy {
            Policy::Polling => {
                if work == 0 {
                    std::hint::spin_loop();
                }
            }
            Policy::Notified => {
                if work == 0 && !queues.in_flight() {
                    self.sleep_until_notified(queues);
                }
            }
            Policy::Adaptive { idle } => self.adaptive(work, idle, queues),
        }
    }

    /// The thread's counts, `served` the requests it started or finished.
    pub(crate) fn stats(&self, served: u64) -> IoCoreStats {
        IoCoreStats {
            sleeps: self.sleeps,
            disk_sleeps: self.disk_sleeps,
            work: served,
            worker_yields: self.worker_yields,
            yields: self.contention.found,
            held_off: self.class.as_ref().map_or(0, |class| class.held_off),
        }
    }

    /// Only the backends have work: spin, yield the core to their workers, or sleep on their
    /// completion descriptors.
    fn wait_for_backends(&mut self, backends: BackendWait, idle_class: bool, queues: &mut impl Queues) {
        if backends == BackendWait::OwnThreads {
            // Spinning, in any class, would take the core those threads need.
            return self.disk_sleep(queues);
        }
        let known_workers = queues.waits_on_submitter_workers();
        if idle_class {
            // Whatever the kernel has to do on this core preempts an idle-class thread, but for
            // io_uring's workers, of the thread's own class.
            if self.worker_wait.should_yield(known_workers) {
                self.yield_to_workers();
            } else {
                std::hint::spin_loop();
            }
            return;
        }
        if self.disk_wait.spun_enough(queues.served()) {
            return self.disk_sleep(queues);
        }
        if known_workers {
            // A batch worker does not preempt a batch thread that spins.
            self.yield_to_workers();
        }
    }

    fn yield_to_workers(&mut self) {
        self.worker_yields += 1;
        std::thread::yield_now();
    }

    /// Sleep while only the backends have work, until a completion, a notification or a
    /// command: notifications wake a notified thread, while a polling one must look at its
    /// rings again soon (`DiskWait::polled_sleep`).
    fn disk_sleep(&mut self, queues: &mut impl Queues) {
        let timeout = match self.policy {
            Policy::Notified => queues.wait_limit(),
            _ => Some(self.disk_wait.polled_sleep()),
        };
        self.disk_sleeps += 1;
        queues.sleep(timeout);
    }

    /// A notified thread with nothing to do sleeps until a notification (its class measures
    /// the wake-up: one that waited for the core found another thread on it).
    fn sleep_until_notified(&mut self, queues: &mut impl Queues) {
        if let Some(class) = self.class.as_mut() {
            class.sleeping();
        }
        self.sleeps += 1;
        queues.sleep(queues.wait_limit());
        if let Some(class) = self.class.as_mut() {
            class.woke();
        }
    }

    /// An adaptive thread spins while there is work, and sleeps once it found none for `budget`
    /// (less while it shares its core).
    fn adaptive(&mut self, work: usize, budget: Duration, queues: &mut impl Queues) {
        if work > 0 || queues.in_flight() {
            self.idle_clock.reset();
            return;
        }
        // A yielding thread's budget is a few passes: look at the clock each time.
        let Some((now, idle_for)) = self.idle_clock.pass(self.yielding) else { return };
        self.yielding = self.contention.yielding(now);
        // Sharing the core: spin no longer than a sleep would cost.
        let budget = if self.yielding { self.wake_cost.spin(budget) } else { budget };
        if idle_for < budget {
            return;
        }
        // Ask for notifications, then look once more: a request the driver made before it saw
        // that would otherwise wait for the next one.
        queues.set_polling(false);
        if !queues.pending() {
            self.measured_sleep(queues);
        }
        queues.set_polling(true);
        self.idle_clock.reset();
    }

    /// Sleep until notified and note what the sleep cost in CPU time (two clock reads per
    /// sleep, a sleep being a system call anyway; never per request).
    fn measured_sleep(&mut self, queues: &mut impl Queues) {
        self.sleeps += 1;
        let before = thread_cpu_time();
        queues.sleep(queues.wait_limit());
        if let Some(cost) =
            thread_cpu_time().zip(before).and_then(|(after, before)| after.checked_sub(before))
        {
            self.wake_cost.record(cost);
        }
    }
}

#[cfg(test)]
mod tests;
