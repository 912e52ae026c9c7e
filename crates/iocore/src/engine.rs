//! The IOCore thread's loop.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::Instant;

use virtio::QueueWorker;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use crate::{Command, IoCoreError, IoCoreStats, Policy, Shared};

/// Idle spins between two looks at the clock (adaptive policy).
const SPINS_PER_CLOCK_CHECK: u32 = 64;
/// The epoll token of the wake-up eventfd; queues use their index, and their backends' fds their
/// index with this bit set.
const WAKE_TOKEN: u64 = u64::MAX;
const BACKEND_TOKEN: u64 = 1 << 32;
const MAX_EVENTS: usize = 64;
/// How long an idle IOCore sleeps when the only requests left wait for a rate limit's tokens
/// (a bucket refills at its rate; the next pass takes what it earned).
const THROTTLED_WAIT_MS: i32 = 1;

struct Entry {
    id: u64,
    worker: Box<dyn QueueWorker>,
    notify: Option<Arc<EventFd>>,
}

pub(crate) struct Engine {
    policy: Policy,
    shared: Arc<Shared>,
    entries: Vec<Entry>,
    epoll: Epoll,
    events: [EpollEvent; MAX_EVENTS],
    stats: IoCoreStats,
}

impl Engine {
    pub(crate) fn new(policy: Policy, shared: Arc<Shared>) -> std::io::Result<Engine> {
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
        })
    }

    /// The thread body: pins itself, confines itself with `filter`, reports its CPU clock (or
    /// why it could not start), then serves until told to stop.
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
        if let Err(e) = filter.install() {
            let _ = started.send(Err(e.into()));
            return self.stats;
        }
        let _ = started.send(current_thread_clock().map_err(IoCoreError::Clock));
        drop(started);

        let mut idle_since: Option<Instant> = None;
        let mut idle_spins = 0u32;
        loop {
            if self.shared.pending.load(Ordering::Acquire) && !self.commands() {
                return self.stats;
            }
            let work = self.poll_all();
            match self.policy {
                Policy::Polling => {
                    if work == 0 {
                        std::hint::spin_loop();
                    }
                }
                Policy::Notified => {
                    if work == 0 && !self.in_flight() {
                        self.sleep(self.wait_limit());
                    }
                }
                Policy::Adaptive { idle } => {
                    if work > 0 || self.in_flight() {
                        idle_since = None;
                        continue;
                    }
                    idle_spins = idle_spins.wrapping_add(1);
                    if !idle_spins.is_multiple_of(SPINS_PER_CLOCK_CHECK) {
                        std::hint::spin_loop();
                        continue;
                    }
                    let now = Instant::now();
                    let since = *idle_since.get_or_insert(now);
                    if now.duration_since(since) >= idle {
                        // Ask for notifications, then look once more: a request the driver made
                        // before it saw that would otherwise wait for the next one.
                        self.set_polling(false);
                        if !self.pending() {
                            self.sleep(self.wait_limit());
                        }
                        self.set_polling(true);
                        idle_since = None;
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
    fn wait_limit(&self) -> i32 {
        if self.entries.iter().any(|e| e.worker.throttled()) {
            THROTTLED_WAIT_MS
        } else {
            -1
        }
    }

    fn set_polling(&mut self, polling: bool) {
        for entry in &mut self.entries {
            entry.worker.set_polling(polling);
        }
    }

    /// Wait in epoll for a notification or a command (at most `timeout_ms`, -1: no limit), then
    /// clear what fired.
    fn sleep(&mut self, timeout_ms: i32) {
        self.stats.sleeps += 1;
        let Ok(n) = self.epoll.wait(timeout_ms, &mut self.events) else { return };
        for i in 0..n {
            let event = self.events[i];
            let fd = match event.data() {
                WAKE_TOKEN => Some(&self.shared.wake),
                // The worker's `poll` empties its backend; nothing to clear here.
                token if token & BACKEND_TOKEN != 0 => None,
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
