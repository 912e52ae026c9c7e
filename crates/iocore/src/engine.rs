//! The IOCore thread: its loop, one pass over every worker and then the wait its idle policy
//! (`idle`) chooses, and the workers it serves, with the epoll instance it sleeps in.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::Duration;

use virtqueue::QueueWorker;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use crate::busy::BusyClock;
use crate::idle::{BackendWait, Idle, Queues};
use crate::{Command, IoCoreError, IoCoreStats, Policy, Shared};

/// The epoll token of the wake-up eventfd; queues use their index, and their backends' fds their
/// index with this bit set.
const WAKE_TOKEN: u64 = u64::MAX;
const BACKEND_TOKEN: u64 = 1 << 32;
const MAX_EVENTS: usize = 64;
/// How long an idle IOCore sleeps when the only requests left wait for a rate limit's tokens
/// (a bucket refills at its rate; the next pass takes what it earned), or a ring has no
/// notification to announce its requests.
const LOOK_AGAIN: Duration = Duration::from_millis(1);

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
    /// Requests started or finished since the thread started.
    served: u64,
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
            served: 0,
        })
    }

    /// The thread body: sets itself up (`start`), reports its CPU clock (or why it could not
    /// start), then serves until told to stop: each turn is one pass over every worker, then
    /// whatever wait the idle policy chooses.
    pub(crate) fn run(
        mut self,
        cpu: Option<usize>,
        filter: &sandbox::Filter,
        started: SyncSender<Result<libc::clockid_t, IoCoreError>>,
    ) -> IoCoreStats {
        let mut idle = match self.start(cpu, filter) {
            Ok(idle) => idle,
            Err(error) => {
                let _ = started.send(Err(error));
                return IoCoreStats::default();
            }
        };
        let _ = started.send(current_thread_clock().map_err(IoCoreError::Clock));
        drop(started);

        let mut busy_clock = BusyClock::new();
        loop {
            busy_clock.pass(&self.shared.times);
            if self.shared.pending.load(Ordering::Acquire) && !self.commands() {
                return idle.stats(self.served);
            }
            let work = self.serve();
            busy_clock.worked(work > 0, &self.shared.times);
            idle.wait(work, &mut self);
        }
    }

    /// Pin the thread to `cpu` if given, put it in the scheduling class its idle policy wants,
    /// then confine it with `filter`.
    fn start(&self, cpu: Option<usize>, filter: &sandbox::Filter) -> Result<Idle, IoCoreError> {
        if let Some(cpu) = cpu {
            crate::pin_current_thread(cpu).map_err(|source| IoCoreError::Pin { cpu, source })?;
        }
        let idle = Idle::enter(self.policy, cpu.is_some(), filter)?;
        filter.install()?;
        Ok(idle)
    }

    /// One pass: every worker serves its queues once. Returns the requests started or finished.
    fn serve(&mut self) -> usize {
        let mut work = 0;
        for entry in &mut self.entries {
            work += entry.worker.poll();
        }
        self.served += work as u64;
        work
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

impl<W: QueueWorker> Queues for Engine<W> {
    fn served(&self) -> u64 {
        self.served
    }

    fn in_flight(&self) -> bool {
        self.entries.iter().any(|e| e.worker.in_flight() > 0)
    }

    fn pending(&self) -> bool {
        self.entries.iter().any(|e| e.worker.has_pending() && !e.worker.throttled())
    }

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

    fn waits_on_submitter_workers(&self) -> bool {
        self.entries.iter().any(|e| e.worker.waits_on_submitter_workers())
    }

    fn wait_limit(&self) -> Option<Duration> {
        let look_soon = |e: &Entry<W>| e.worker.throttled() || e.worker.unannounced();
        self.entries.iter().any(look_soon).then_some(LOOK_AGAIN)
    }

    fn set_polling(&mut self, polling: bool) {
        for entry in &mut self.entries {
            entry.worker.set_polling(polling);
        }
    }

    /// Wait in epoll, then clear what fired.
    fn sleep(&mut self, timeout: Option<Duration>) {
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
