//! The IOCore thread's loop.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::Duration;

use virtqueue::QueueWorker;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use crate::busy::BusyClock;
use crate::contention::{thread_cpu_time, Contention, WakeCost};
use crate::idle_class::IdleClass;
use crate::wait::{DiskWait, IdleClock, WorkerWait};
use crate::{Command, IoCoreError, IoCoreStats, Policy, Shared};

/// The epoll token of the wake-up eventfd; queues use their index, and their backends' fds their
/// index with this bit set.
const WAKE_TOKEN: u64 = u64::MAX;
const BACKEND_TOKEN: u64 = 1 << 32;
const MAX_EVENTS: usize = 64;
/// How long an idle IOCore sleeps when the only requests left wait for a rate limit's tokens
/// (a bucket refills at its rate; the next pass takes what it earned).
const THROTTLED_WAIT: Duration = Duration::from_millis(1);

/// What the requests in flight wait for, when the thread has nothing else to do.
#[derive(Clone, Copy, PartialEq, Eq)]
enum BackendWait {
    /// The kernel (io_uring): spinning may pay, as `DiskWait` settles.
    Kernel,
    /// Only the backends' own threads (librbd's): the thread sleeps at once.
    OwnThreads,
}

struct Entry<W> {
    id: u64,
    worker: W,
    notify: Option<Arc<EventFd>>,
}

pub(crate) struct Engine<W> {
    policy: Policy,
    shared: Arc<Shared<W>>,
    entries: Vec<Entry<W>>,
    epoll: Epoll,
    events: [EpollEvent; MAX_EVENTS],
    stats: IoCoreStats,
    /// What an adaptive IOCore's sleeps cost it.
    wake_cost: WakeCost,
}

impl<W: QueueWorker> Engine<W> {
    pub(crate) fn new(policy: Policy, shared: Arc<Shared<W>>) -> std::io::Result<Engine<W>> {
        let epoll = Epoll::new()?;
        epoll.ctl(
            ControlOperation::Add,
            shared.wake.as_raw_fd(),
            EpollEvent::new(EventSet::IN, WAKE_TOKEN),
        )?;
        Ok(Engine {
            policy,
            shared,
            entries: Vec::new(),
            epoll,
            events: [EpollEvent::default(); MAX_EVENTS],
            stats: IoCoreStats::default(),
            wake_cost: WakeCost::new(),
        })
    }

    /// The thread body: pins itself, becomes a batch thread (`schedule_as_batch`) unless it is
    /// adaptive, and then, if pinned, an idle-class one (`IdleClass`), confines itself with
    /// `filter`, reports its CPU clock (or why it could not start), then serves until told to
    /// stop.
    pub(crate) fn run(
        mut self,
        cpu: Option<usize>,
        filter: &sandbox::Filter,
        started: SyncSender<Result<libc::clockid_t, IoCoreError>>,
    ) -> IoCoreStats {
        if let Some(cpu) = cpu {
            if let Err(source) = crate::pin_current_thread(cpu) {
                let _ = started.send(Err(IoCoreError::Pin { cpu, source }));
                return self.stats;
            }
        }
        // Not an adaptive one: it leaves its core to other threads by sleeping early when it
        // waits for the core, and as a batch thread, woken late, it stayed behind a busy thread
        // and spun, leaving that thread less of the core (docs/tuning.md).
        let batch = !matches!(self.policy, Policy::Adaptive { .. });
        if batch {
            if let Err(source) = crate::schedule_as_batch() {
                let _ = started.send(Err(IoCoreError::Schedule(source)));
                return self.stats;
            }
        }
        // Pinned, it owns its core: it may spin there as long as the kernel's work comes first.
        let fallback = if self.policy == Policy::Notified { libc::SCHED_OTHER } else { libc::SCHED_BATCH };
        let mut idle_class = match batch && cpu.is_some() {
            true => IdleClass::enter(fallback, filter.for_kind(sandbox::ThreadKind::IoCoreWatch).ok()),
            false => None,
        };
        // Opened before the filter, which allows reading it but not opening files.
        let mut contention = Contention::for_current_thread();
        if let Err(e) = filter.install() {
            let _ = started.send(Err(e.into()));
            return self.stats;
        }
        let _ = started.send(current_thread_clock().map_err(IoCoreError::Clock));
        drop(started);

        let mut idle_clock = IdleClock::default();
        let mut disk_wait = DiskWait::new();
        let mut worker_wait = WorkerWait::default();
        let mut yielding = false;
        let mut busy_clock = BusyClock::new();
        loop {
            busy_clock.pass(&self.shared.times);
            if self.shared.pending.load(Ordering::Acquire) && !self.commands() {
                self.stats.yields = contention.found;
                self.stats.held_off = idle_class.map_or(0, |class| class.held_off);
                return self.stats;
            }
            let work = self.poll_all();
            busy_clock.worked(work > 0, &self.shared.times);
            let idle = idle_class.as_mut().is_some_and(IdleClass::pass);
            if let (0, Some(wait)) = (work, self.backend_wait()) {
                if wait == BackendWait::OwnThreads {
                    // Spinning, in any class, would take the core those threads need.
                    self.disk_sleep(&mut disk_wait);
                    continue;
                }
                let known_workers = self.waits_on_submitter_workers();
                if idle {
                    // Whatever the kernel has to do on this core preempts an idle-class thread,
                    // but for io_uring's workers, of the thread's own class.
                    if worker_wait.should_yield(known_workers) {
                        self.stats.worker_yields += 1;
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                    continue;
                }
                if !disk_wait.spun_enough(self.stats.work) {
                    if known_workers {
                        // A batch worker does not preempt a batch thread that spins.
                        self.stats.worker_yields += 1;
                        std::thread::yield_now();
                    }
                    continue;
                }
                self.disk_sleep(&mut disk_wait);
                continue;
            }
            disk_wait.reset();
            worker_wait.reset();
            match self.policy {
                Policy::Polling => {
                    if work == 0 {
                        std::hint::spin_loop();
                    }
                }
                Policy::Notified => {
                    if work == 0 && !self.in_flight() {
                        if let Some(class) = idle_class.as_mut() {
                            class.sleeping();
                        }
                        self.sleep(self.wait_limit());
                        if let Some(class) = idle_class.as_mut() {
                            class.woke();
                        }
                    }
                }
                Policy::Adaptive { idle } => {
                    if work > 0 || self.in_flight() {
                        idle_clock.reset();
                        continue;
                    }
                    // A yielding thread's budget is a few passes: look at the clock each time.
                    let Some((now, idle_for)) = idle_clock.pass(yielding) else { continue };
                    yielding = contention.yielding(now);
                    // Sharing the core: spin no longer than a sleep would cost.
                    let budget = if yielding { self.wake_cost.spin(idle) } else { idle };
                    if idle_for >= budget {
                        // Ask for notifications, then look once more: a request the driver made
                        // before it saw that would otherwise wait for the next one.
                        self.set_polling(false);
                        if !self.pending() {
                            self.sleep(self.wait_limit());
                        }
                        self.set_polling(true);
                        idle_clock.reset();
                    }
                }
            }
        }
    }

    fn poll_all(&mut self) -> usize {
        let mut work = 0;
        for entry in &mut self.entries {
            work += entry.worker.poll();
        }
        self.stats.work += work as u64;
        work
    }

    fn in_flight(&self) -> bool {
        self.entries.iter().any(|e| e.worker.in_flight() > 0)
    }

    /// Has a queue requests waiting that the next pass can take (not held back by a rate limit)?
    fn pending(&self) -> bool {
        self.entries.iter().any(|e| e.worker.has_pending() && !e.worker.throttled())
    }

    /// How long a sleep may last: for ever (until a notification), or a moment when a queue's
    /// requests wait for its rate limit, which no notification announces.
    fn wait_limit(&self) -> Option<Duration> {
        self.entries.iter().any(|e| e.worker.throttled()).then_some(THROTTLED_WAIT)
    }

    fn set_polling(&mut self, polling: bool) {
        for entry in &mut self.entries {
            entry.worker.set_polling(polling);
        }
    }

    /// Does a backend hold requests that io_uring runs in workers created from this thread?
    fn waits_on_submitter_workers(&self) -> bool {
        self.entries.iter().any(|e| e.worker.waits_on_submitter_workers())
    }

    /// What the requests in flight wait for, when all of them are in backends that signal their
    /// completions on a file descriptor (so the thread may sleep on them); `None` when nothing
    /// is in flight or a request is not of that kind.
    fn backend_wait(&self) -> Option<BackendWait> {
        let mut wait = None;
        for entry in self.entries.iter().filter(|entry| entry.worker.in_flight() > 0) {
            entry.worker.backend_fd()?;
            wait = match (wait, entry.worker.waits_on_backend_threads()) {
                (None | Some(BackendWait::OwnThreads), true) => Some(BackendWait::OwnThreads),
                _ => Some(BackendWait::Kernel),
            };
        }
        wait
    }

    /// Sleep while only the backends have work, until a completion, a notification or a
    /// command: notifications wake a notified thread, while a polling one must look at its
    /// rings again soon (`DiskWait::polled_sleep`).
    fn disk_sleep(&mut self, disk_wait: &mut DiskWait) {
        let timeout = match self.policy {
            Policy::Notified => self.wait_limit(),
            _ => Some(disk_wait.polled_sleep()),
        };
        self.stats.disk_sleeps += 1;
        self.wait(timeout);
    }

    /// Wait in epoll for a notification or a command (at most `timeout`, if given), then clear
    /// what fired. An adaptive IOCore also measures what the sleep cost it in CPU time (two
    /// clock reads per sleep, a sleep being a system call anyway; never per request).
    fn sleep(&mut self, timeout: Option<Duration>) {
        self.stats.sleeps += 1;
        if !matches!(self.policy, Policy::Adaptive { .. }) {
            self.wait(timeout);
            return;
        }
        let before = thread_cpu_time();
        self.wait(timeout);
        if let Some(cost) =
            thread_cpu_time().zip(before).and_then(|(after, before)| after.checked_sub(before))
        {
            self.wake_cost.record(cost);
        }
    }

    /// Wait in epoll for a notification, a backend's completion or a command, at most
    /// `timeout` if given, then clear what fired.
    fn wait(&mut self, timeout: Option<Duration>) {
        let timespec = timeout.map(|t| libc::timespec {
            tv_sec: libc::time_t::try_from(t.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: t.subsec_nanos().into(),
        });
        let timespec_ptr = timespec.as_ref().map_or(std::ptr::null(), std::ptr::from_ref);
        // SAFETY: the epoll fd is open for as long as `self`; `events` holds MAX_EVENTS entries
        // of EpollEvent, a repr(transparent) epoll_event; the timespec outlives the call.
        let n = unsafe {
            libc::epoll_pwait2(
                self.epoll.as_raw_fd(),
                self.events.as_mut_ptr().cast(),
                MAX_EVENTS as i32,
                timespec_ptr,
                std::ptr::null(),
            )
        };
        let Ok(n) = usize::try_from(n) else { return };
        for i in 0..n {
            let event = self.events[i];
            let fd = match event.data() {
                WAKE_TOKEN => Some(&self.shared.wake),
                token if token & BACKEND_TOKEN != 0 => {
                    // The worker's `poll` empties its backend; some backends clear their fd first.
                    let index = (token & !BACKEND_TOKEN) as usize;
                    if let Some(entry) = self.entries.get_mut(index) {
                        entry.worker.backend_fd_fired();
                    }
                    None
                }
                index if hung_up(event.event_set()) => {
                    self.drop_notifier(index as usize);
                    None
                }
                index => self.entries.get(index as usize).and_then(|e| e.notify.as_deref()),
            };
            if let Some(fd) = fd {
                // Non-blocking: empties the counter so the next epoll_wait sleeps.
                let _ = fd.read();
            }
        }
    }

    /// Stop listening to a queue's notifier that hung up or failed: epoll would report it again
    /// on every wait, and the thread would spin. An eventfd never does this; a notifier that
    /// does can no longer notify, so its queue is served only when something else wakes the
    /// thread (its owner detaches it and gives a new one).
    fn drop_notifier(&mut self, index: usize) {
        if let Some(notify) = self.entries.get_mut(index).and_then(|e| e.notify.take()) {
            let _ = self.epoll.ctl(ControlOperation::Delete, notify.as_raw_fd(), EpollEvent::default());
        }
    }

    /// Carry out attach/detach commands; `false` when the IOCore should stop.
    fn commands(&mut self) -> bool {
        self.shared.pending.store(false, Ordering::Release);
        let commands = std::mem::take(&mut *self.shared.commands.lock().unwrap_or_else(|p| p.into_inner()));
        for command in commands {
            match command {
                Command::Attach { id, mut worker, notify } => {
                    worker.set_polling(self.policy != Policy::Notified);
                    self.entries.push(Entry { id, worker, notify });
                }
                Command::Detach { id, reply } => {
                    let entry = self
                        .entries
                        .iter()
                        .position(|e| e.id == id)
                        .map(|index| self.entries.swap_remove(index));
                    let worker = entry.map(|entry| {
                        let fds = entry.notify.as_ref().map(|fd| fd.as_raw_fd()).into_iter();
                        for fd in fds.chain(entry.worker.backend_fd()) {
                            let _ = self.epoll.ctl(ControlOperation::Delete, fd, EpollEvent::default());
                        }
                        entry.worker
                    });
                    let _ = reply.send(worker);
                }
            }
        }
        self.register_notifiers();
        !self.shared.stop.load(Ordering::Acquire)
    }

    /// Re-register every queue's ioeventfd and backend fd under its current index.
    fn register_notifiers(&mut self) {
        for (index, entry) in self.entries.iter().enumerate() {
            let notify = entry.notify.as_ref().map(|fd| (fd.as_raw_fd(), index as u64));
            let backend = entry.worker.backend_fd().map(|fd| (fd, index as u64 | BACKEND_TOKEN));
            for (fd, token) in notify.into_iter().chain(backend) {
                let event = EpollEvent::new(EventSet::IN, token);
                if self.epoll.ctl(ControlOperation::Modify, fd, event).is_err() {
                    let _ = self.epoll.ctl(ControlOperation::Add, fd, event);
                }
            }
        }
    }
}

/// Does epoll say the descriptor hung up or failed (it then stays ready for good)?
fn hung_up(events: EventSet) -> bool {
    events.intersects(EventSet::HANG_UP | EventSet::ERROR | EventSet::READ_HANG_UP)
}

fn current_thread_clock() -> std::io::Result<libc::clockid_t> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: pthread_self() is the calling thread; `clock` is a valid out-pointer.
    let rc = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok(clock)
}
