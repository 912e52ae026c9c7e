//! glibc's malloc opens a file the first time it sizes its arenas or shrinks a thread arena's
//! heap, on whichever thread that happens (`sandbox::settle_allocator`'s doc). Regression: a
//! daemon's IOCore died of SIGSYS for that `openat` now and then when it stopped with an RBD disk
//! open. Each case runs in a child process (this test binary again), where glibc has not read
//! those files yet: the child settles the allocator as exitless's `main` does, then a confined
//! thread does what reads them.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

use sandbox::{Filter, SeccompMode, ThreadKind};

/// Set in the child: the case to run, and whether to settle the allocator first (`1`/`0`).
const CHILD_ENV: &str = "SANDBOX_MALLOC_CHILD";
const DONE: &str = "done under the filter";

/// Run `case` in a child process, the allocator settled first if `settle`: how it ended and
/// what it printed.
fn run_child(case: &str, settle: bool) -> (std::process::ExitStatus, String) {
    let exe = std::env::current_exe().expect("the test binary's path");
    let output = Command::new(exe)
        .args(["--exact", case, "--nocapture"])
        .env(CHILD_ENV, if settle { "1" } else { "0" })
        .output()
        .expect("the child test process starts");
    (output.status, String::from_utf8_lossy(&output.stdout).into_owned())
}

/// In the suite: runs `case` as a child and checks that it ended well. In the child: `None`
/// after settling the allocator if asked, and the case's body runs.
fn parent_or_child(case: &str) -> Option<()> {
    match std::env::var(CHILD_ENV) {
        Err(_) => {
            let (status, stdout) = run_child(case, true);
            assert_eq!(status.signal(), None, "the child died of a signal: {stdout}");
            assert!(status.success() && stdout.contains(DONE), "{status:?}: {stdout}");
            Some(())
        }
        Ok(settle) => {
            if settle == "1" {
                sandbox::settle_allocator();
            }
            None
        }
    }
}

#[test]
fn a_confined_threads_first_malloc_makes_no_forbidden_call() {
    if parent_or_child("a_confined_threads_first_malloc_makes_no_forbidden_call").is_some() {
        return;
    }
    // glibc sizes its arenas the first time a thread needs a new one while more than
    // M_ARENA_TEST exist: with a test of 1, the next new thread's (this process has the main
    // thread's arena and this test thread's).
    // SAFETY: mallopt takes two integers.
    assert_eq!(unsafe { libc::mallopt(libc::M_ARENA_TEST, 1) }, 1);
    let filter = Filter::new(ThreadKind::IoCore, SeccompMode::Kill).expect("the filter builds");
    // A bare pthread: Rust's own thread start-up allocates before the thread's code runs.
    let allocated = run_on_bare_thread(move || {
        filter.install().expect("the filter installs");
        std::hint::black_box(vec![2u8; 4096]).len()
    });
    assert_eq!(allocated, 4096);
    println!("{DONE}");
}

#[test]
fn a_confined_thread_may_shrink_another_threads_heap() {
    if parent_or_child("a_confined_thread_may_shrink_another_threads_heap").is_some() {
        return;
    }
    // Blocks from another thread's arena, below the mmap threshold and together above the trim
    // threshold: freeing them all shrinks that arena's heap.
    let blocks =
        std::thread::spawn(|| (0..8).map(|_| std::hint::black_box(vec![1u8; 64 << 10])).collect::<Vec<_>>())
            .join()
            .unwrap();
    let filter = Filter::new(ThreadKind::IoCore, SeccompMode::Kill).expect("the filter builds");
    let freed = std::thread::spawn(move || {
        filter.install().expect("the filter installs");
        let count = blocks.len();
        drop(std::hint::black_box(blocks));
        count
    });
    assert_eq!(freed.join().unwrap(), 8);
    println!("{DONE}");
}

/// Run `body` on a new thread made with `pthread_create` alone, and return what it returned.
fn run_on_bare_thread(body: impl FnOnce() -> usize + Send + 'static) -> usize {
    extern "C" fn start(arg: *mut libc::c_void) -> *mut libc::c_void {
        // SAFETY: `arg` is the box `run_on_bare_thread` leaked for this thread alone.
        let body = unsafe { Box::from_raw(arg.cast::<Box<dyn FnOnce() -> usize + Send>>()) };
        body() as *mut libc::c_void
    }
    let body: Box<Box<dyn FnOnce() -> usize + Send>> = Box::new(Box::new(body));
    let mut thread: libc::pthread_t = 0;
    // SAFETY: `start` takes ownership of the leaked box; the thread is joined below.
    let rc =
        unsafe { libc::pthread_create(&mut thread, std::ptr::null(), start, Box::into_raw(body).cast()) };
    assert_eq!(rc, 0, "pthread_create");
    let mut result: *mut libc::c_void = std::ptr::null_mut();
    // SAFETY: `thread` was created above and is joined once.
    assert_eq!(unsafe { libc::pthread_join(thread, &mut result) }, 0);
    result as usize
}
