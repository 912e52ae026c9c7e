//! An idle-class IOCore finds that a busy thread holds it off its core only once it runs again,
//! and behind a busy thread an idle-class thread gets the core for a moment about once a
//! second: a request that arrives then waits that long. A watcher thread looks at the IOCore
//! every [`WATCH_EVERY`]: when it has made no pass since the last look, wants to run and has
//! not run, the watcher moves it to its fallback class itself, which gets it its share of the
//! core within a slice. The IOCore then counts the hold as its own (`IdleClass`). The watcher
//! sleeps between looks, reads two small /proc files while the IOCore is in the idle class, and
//! is never on a request's path.

use std::fs::File;
use std::marker::PhantomData;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::contention::RunDelay;

/// How often the watcher looks; a held-off IOCore waits at most about twice this. Longer than
/// the kernel's own work holds an IOCore off, which is not a busy thread (docs/tuning.md).
const WATCH_EVERY: Duration = Duration::from_millis(20);

/// What the IOCore and its watcher share.
#[derive(Default)]
struct Shared {
    /// The IOCore's passes, as it counts them (it stores the count on each pass).
    passes: AtomicU32,
    /// The IOCore is in the idle class: the only time the watcher acts.
    idle_class: AtomicBool,
    /// The watcher moved the IOCore out of the idle class; the IOCore takes it back.
    moved: AtomicBool,
    stop: AtomicBool,
}

/// The watcher of the calling IOCore thread; stopped and joined on drop. Not `Send`: it stays on
/// the thread it watches, so it is joined before that thread ends.
pub(crate) struct Watcher {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    _on_the_watched_thread: PhantomData<*const ()>,
}

impl Watcher {
    /// Watch the calling thread, which is in the idle class and leaves it for `fallback`. Call it
    /// before the thread's own seccomp filter (it opens the thread's /proc files and starts a
    /// thread); the watcher confines itself with `filter`. `None` where it cannot start (no
    /// /proc, no thread): the IOCore then finds holds only when it runs again.
    pub(crate) fn start(fallback: libc::c_int, filter: sandbox::Filter) -> Option<Watcher> {
        let stat = File::open("/proc/thread-self/stat").ok()?;
        let schedstat = RunDelay::for_current_thread()?;
        // SAFETY: gettid has no arguments and cannot fail.
        let tid = unsafe { libc::gettid() };
        let shared = Arc::new(Shared { idle_class: AtomicBool::new(true), ..Shared::default() });
        let watched = shared.clone();
        let thread = std::thread::Builder::new()
            .name("iocore-watch".into())
            .spawn(move || {
                if filter.install().is_ok() {
                    watch(&watched, tid, fallback, &stat, &schedstat);
                }
            })
            .ok()?;
        Some(Watcher { shared, thread: Some(thread), _on_the_watched_thread: PhantomData })
    }

    /// One pass of the IOCore (a relaxed store to a line only it writes).
    #[inline]
    pub(crate) fn pass(&self, passes: u32) {
        self.shared.passes.store(passes, Ordering::Relaxed);
    }

    /// The IOCore enters (`true`) or leaves the idle class.
    pub(crate) fn idle_class(&self, idle: bool) {
        self.shared.idle_class.store(idle, Ordering::Release);
    }

    /// Did the watcher move the IOCore out of the idle class since the last call?
    pub(crate) fn took_it_off(&self) -> bool {
        self.shared.moved.swap(false, Ordering::AcqRel)
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            // Joined before the IOCore thread ends, so its id is never reused under the watcher.
            let _ = thread.join();
        }
    }
}

fn watch(shared: &Shared, tid: libc::pid_t, fallback: libc::c_int, stat: &File, schedstat: &RunDelay) {
    let mut last: Option<(u32, u64)> = None;
    while !shared.stop.load(Ordering::Acquire) {
        std::thread::sleep(WATCH_EVERY);
        if !shared.idle_class.load(Ordering::Acquire) {
            last = None;
            continue;
        }
        let passes = shared.passes.load(Ordering::Relaxed);
        let Some(ran) = schedstat.running() else { return };
        let now = (passes, ran);
        let Some((passes_before, ran_before)) = last.replace(now) else { continue };
        // No pass, and less than half the look's time on a CPU: not a long pass.
        let stalled = passes == passes_before
            && u128::from(ran.saturating_sub(ran_before)) < WATCH_EVERY.as_nanos() / 2;
        if stalled && wants_to_run(stat) && !shared.stop.load(Ordering::Acquire) {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: `tid` is the watched IOCore thread, alive until this thread is joined
            // (`Watcher::drop`, which runs on that thread: a Watcher cannot leave it), so the id
            // names no other thread; `param` is a valid sched_param.
            if unsafe { libc::sched_setscheduler(tid, fallback, &param) } == 0 {
                shared.idle_class.store(false, Ordering::Release);
                shared.moved.store(true, Ordering::Release);
            }
            last = None;
        }
    }
}

/// Is the thread whose /proc stat file this is runnable ('R'), as opposed to asleep?
fn wants_to_run(stat: &File) -> bool {
    let mut buf = [0u8; 512];
    // SAFETY: the descriptor is open for as long as `stat`; `buf` is writable for its length.
    let n = unsafe { libc::pread(stat.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    let Some(text) = usize::try_from(n).ok().and_then(|n| buf.get(..n)) else { return false };
    // "tid (name) S ...": the name may hold spaces and parentheses, the state follows the last ')'.
    let after_name = text.iter().rposition(|&b| b == b')').map_or(&[][..], |at| &text[at + 1..]);
    after_name.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'R')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_a_thread_that_runs_from_one_asleep() {
        let own = File::open("/proc/thread-self/stat").unwrap();
        assert!(wants_to_run(&own), "this thread, reading its own state, runs");
        let (file_tx, file_rx) = std::sync::mpsc::channel();
        let (wake_tx, wake_rx) = std::sync::mpsc::channel::<()>();
        let sleeper = std::thread::spawn(move || {
            file_tx.send(File::open("/proc/thread-self/stat").unwrap()).unwrap();
            let _ = wake_rx.recv();
        });
        let other = file_rx.recv().unwrap();
        // It sleeps on the channel soon after sending (allow it a while to get there).
        let asleep = (0..500).any(|_| {
            std::thread::sleep(Duration::from_millis(2));
            !wants_to_run(&other)
        });
        wake_tx.send(()).unwrap();
        sleeper.join().unwrap();
        assert!(asleep, "a thread waiting on a channel is asleep");
    }
}
