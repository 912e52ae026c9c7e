//! The IOCore: one host thread that owns the queues of every device of a VM and serves them.
//!
//! How it waits for work is its [`Policy`]: sleep until a queue's ioeventfd fires (an I/O
//! thread, as QEMU and Firecracker run), spin over the rings with notifications suppressed (the
//! sidecore: no exit per request), or spin while requests keep coming and fall back to
//! notifications after an idle budget (adaptive). Devices are attached and detached through a
//! command list the thread looks at only when a flag says it changed, so the serving loop
//! takes no lock, allocates nothing and makes no system call while there is work.

#![deny(missing_docs)]

mod backend_threads;
mod busy;
mod contention;
mod engine;
mod idle;
mod idle_class;
mod wait;
mod watch;

pub use backend_threads::backend_thread_set_up;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use thiserror::Error;
use virtqueue::{QueueWorker, WorkerHost};
use vmm_sys_util::eventfd::EventFd;

/// How long `detach` waits for the IOCore to hand a worker back.
const DETACH_TIMEOUT: Duration = Duration::from_secs(10);
/// The default idle budget of the adaptive policy.
pub const DEFAULT_IDLE_BUDGET: Duration = Duration::from_micros(50);

/// How the IOCore waits for requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Sleep in epoll on the queues' ioeventfds; serve when the driver notifies.
    Notified,
    /// Spin over the rings forever; the driver is asked never to notify.
    Polling,
    /// Spin while there is traffic; after `idle` without a request, ask for notifications again
    /// and sleep until one comes.
    Adaptive {
        /// How long to spin without a request before sleeping.
        idle: Duration,
    },
}

/// Why an IOCore could not start.
#[derive(Debug, Error)]
#[allow(missing_docs)] // Each variant's message says what it is.
pub enum IoCoreError {
    #[error("cannot set up the IOCore's wake-up eventfd or epoll: {0}")]
    Setup(#[source] std::io::Error),
    #[error("cannot start the IOCore thread: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("cannot pin the IOCore thread to CPU {cpu}: {source}")]
    Pin { cpu: usize, source: std::io::Error },
    #[error("cannot make the IOCore thread a batch thread (SCHED_BATCH): {0}")]
    Schedule(#[source] std::io::Error),
    #[error("{0}")]
    Seccomp(#[from] sandbox::SandboxError),
    #[error("cannot read the IOCore thread's CPU clock: {0}")]
    Clock(#[source] std::io::Error),
}

enum Command<W> {
    Attach { id: u64, worker: W, notify: Option<Arc<EventFd>> },
    Detach { id: u64, reply: SyncSender<Option<W>> },
}

/// What the serving thread and its handle share.
struct Shared<W> {
    /// Set when `commands` has something, or the IOCore should stop.
    pending: AtomicBool,
    stop: AtomicBool,
    commands: Mutex<Vec<Command<W>>>,
    /// Wakes the thread from epoll when a command arrives.
    wake: EventFd,
    /// Where the thread's time went (see [`IoCore::times`]).
    times: busy::SharedTimes,
}

/// Where an IOCore's time went since it started (see [`IoCore::times`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IoCoreTimes {
    /// In passes over its queues that started or finished a request, and what followed them
    /// until the next pass.
    pub busy: Duration,
    /// In passes that found nothing to do, spinning, yielding or asleep.
    pub idle: Duration,
}

/// Counts the thread keeps, read after it stopped.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IoCoreStats {
    /// Times it went to sleep waiting for a notification.
    pub sleeps: u64,
    /// Times it slept while only backends had work (requests in flight, nothing else to do).
    pub disk_sleeps: u64,
    /// Requests started or finished.
    pub work: u64,
    /// Passes of a disk wait on which it yielded its core to io_uring's workers (see
    /// `storage::Backend::waits_on_submitter_workers`).
    pub worker_yields: u64,
    /// Times an adaptive IOCore found other threads waiting for its core and began to sleep
    /// sooner when idle.
    pub yields: u64,
    /// Times another thread held an idle-class IOCore off its core and it went back to being a
    /// batch thread for a while (see `idle_class`).
    pub held_off: u64,
}

/// A thread that serves the queues of one or more virtio devices (their `QueueWorker`s, all of
/// type `W`): the IOCore, or sidecore, of the papers. Workers are attached and detached while it
/// runs (`WorkerHost`); how it waits for work is its `Policy`.
pub struct IoCore<W> {
    shared: Arc<Shared<W>>,
    thread: Mutex<Option<JoinHandle<IoCoreStats>>>,
    /// The thread's CPU-time clock, to measure how much of a core it used.
    clock: libc::clockid_t,
}

impl<W: QueueWorker + 'static> IoCore<W> {
    /// Start the IOCore thread, pinned to `cpu` if given, with no seccomp filter.
    pub fn spawn(policy: Policy, cpu: Option<usize>) -> Result<IoCore<W>, IoCoreError> {
        IoCore::spawn_confined(policy, cpu, sandbox::Filter::off(sandbox::ThreadKind::IoCore))
    }

    /// Start the IOCore thread, pinned to `cpu` if given; once pinned, before it serves a queue,
    /// the thread confines itself with `filter`.
    pub fn spawn_confined(
        policy: Policy,
        cpu: Option<usize>,
        filter: sandbox::Filter,
    ) -> Result<IoCore<W>, IoCoreError> {
        let shared = Arc::new(Shared {
            pending: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            commands: Mutex::new(Vec::new()),
            wake: EventFd::new(libc::EFD_NONBLOCK).map_err(IoCoreError::Setup)?,
            times: busy::SharedTimes::default(),
        });
        let (started_tx, started_rx) = mpsc::sync_channel(1);
        let engine = engine::Engine::new(policy, shared.clone()).map_err(IoCoreError::Setup)?;
        let thread = std::thread::Builder::new()
            .name("iocore".into())
            .spawn(move || engine.run(cpu, &filter, started_tx))
            .map_err(IoCoreError::Spawn)?;
        let clock = match started_rx.recv() {
            Ok(Ok(clock)) => clock,
            Ok(Err(error)) => {
                let _ = thread.join();
                return Err(error);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(IoCoreError::Spawn(std::io::Error::other("the IOCore thread died at start")));
            }
        };
        Ok(IoCore { shared, thread: Mutex::new(Some(thread)), clock })
    }
}

impl<W> IoCore<W> {
    /// CPU time the IOCore thread has used so far; `None` once it has stopped.
    pub fn cpu_time(&self) -> Option<Duration> {
        // Held across the clock read: `stop` joins the thread only under this lock.
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner());
        thread.as_ref()?;
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `clock` is the CPU clock of the IOCore thread, which has not been joined: its
        // handle is still in `thread`, whose lock we hold, and only `stop` takes it out (under
        // the lock) to join it. `ts` is a valid out-pointer.
        let rc = unsafe { libc::clock_gettime(self.clock, &mut ts) };
        drop(thread);
        (rc == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }

    /// Where the thread's time went so far: busy serving requests, or idle. Read while it runs,
    /// without stopping it, up to now.
    pub fn times(&self) -> IoCoreTimes {
        let (busy, idle) = self.shared.times.read();
        IoCoreTimes { busy, idle }
    }

    /// Stop the thread (workers still attached are dropped) and return its counts.
    pub fn stop(&self) -> Option<IoCoreStats> {
        let mut thread = self.thread.lock().unwrap_or_else(|p| p.into_inner());
        let handle = thread.take()?;
        self.shared.stop.store(true, Ordering::Release);
        self.shared.pending.store(true, Ordering::Release);
        let _ = self.shared.wake.write(1);
        handle.join().ok()
    }

    fn send(&self, command: Command<W>) {
        self.shared.commands.lock().unwrap_or_else(|p| p.into_inner()).push(command);
        self.shared.pending.store(true, Ordering::Release);
        let _ = self.shared.wake.write(1);
    }
}

impl<W: QueueWorker> WorkerHost<W> for IoCore<W> {
    fn attach(&self, id: u64, worker: W, notify: Option<Arc<EventFd>>) {
        self.send(Command::Attach { id, worker, notify });
    }

    fn detach(&self, id: u64) -> Option<W> {
        let (reply, answer): (_, Receiver<_>) = mpsc::sync_channel(1);
        self.send(Command::Detach { id, reply });
        answer.recv_timeout(DETACH_TIMEOUT).ok().flatten()
    }
}

impl<W> Drop for IoCore<W> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Pin the calling thread to host CPU `cpu` (the IOCore, vCPU threads, benchmark helpers).
pub fn pin_current_thread(cpu: usize) -> std::io::Result<()> {
    place_current_thread(&[cpu])
}

/// Let the calling thread, and the threads it starts from now on, run on host CPUs `cpus` only.
pub fn place_current_thread(cpus: &[usize]) -> std::io::Result<()> {
    if cpus.is_empty() || cpus.iter().any(|&cpu| cpu >= libc::CPU_SETSIZE as usize) {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it (every CPU
    // checked above) and sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in cpus {
            libc::CPU_SET(cpu, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Keep the calling thread off host CPU `cpu` (a vCPU not pinned anywhere, off the IOCore's
/// CPU): it may run on any other CPU it was allowed. Does nothing when `cpu` is the only one.
pub fn keep_current_thread_off(cpu: usize) -> std::io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills it, CPU_CLR and
    // CPU_COUNT stay inside it (cpu checked above) and sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        libc::CPU_CLR(cpu, &mut set);
        if libc::CPU_COUNT(&set) > 0
            && libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Make the calling thread a batch thread (SCHED_BATCH): its wake-ups no longer preempt the
/// task running on its core. Its time slice and its share of the core are unchanged.
///
/// An IOCore shares its core with the kernel work that finishes its requests: the disk's
/// interrupt and, for every O_DIRECT write to a file (and all I/O of a loop device), a kworker
/// on the interrupt's core. Each request that kworker finishes wakes the IOCore. Woken as a
/// normal thread, the IOCore preempted the kworker after every item, took that one completion,
/// and its guest posted one new request: writes at queue depth 8 reached the disk one at a time.
/// A batch IOCore runs once the kworker has finished them all, and takes their completions at
/// once. That happened with the VMM at raised priority (a nice -20 autogroup); at normal
/// priority the kworker held its own and both ran alike, so this guards a VMM its operator
/// prioritises (docs/tuning.md). Polling and
/// notified IOCores are batch threads, and pinned ones then move on to the idle class
/// (`idle_class`); adaptive ones are not (see `Idle::enter`).
pub fn schedule_as_batch() -> std::io::Result<()> {
    set_scheduling_class(libc::SCHED_BATCH)
}

/// Set the calling thread's scheduling class (a non-real-time one: its nice value stays).
fn set_scheduling_class(policy: libc::c_int) -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param for the call.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
