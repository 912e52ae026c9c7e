//! The idle policy's decisions, over queues that only record what it asks of them.

use std::time::Instant;

use super::*;

/// Queues in a given state, and what the policy did to them.
#[derive(Default)]
struct Fake {
    in_flight: bool,
    pending: bool,
    backend_wait: Option<BackendWait>,
    submitter_workers: bool,
    wait_limit: Option<Duration>,
    served: u64,
    done: Vec<Did>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Did {
    SetPolling(bool),
    Sleep(Option<Duration>),
}

impl Queues for Fake {
    fn served(&self) -> u64 {
        self.served
    }

    fn in_flight(&self) -> bool {
        self.in_flight
    }

    fn pending(&self) -> bool {
        self.pending
    }

    fn backend_wait(&self) -> Option<BackendWait> {
        self.backend_wait
    }

    fn waits_on_submitter_workers(&self) -> bool {
        self.submitter_workers
    }

    fn wait_limit(&self) -> Option<Duration> {
        self.wait_limit
    }

    fn set_polling(&mut self, polling: bool) {
        self.done.push(Did::SetPolling(polling));
    }

    fn sleep(&mut self, timeout: Option<Duration>) {
        self.done.push(Did::Sleep(timeout));
    }
}

/// Idle passes until the policy does something to the queues, at most for a second.
fn idle_until_it_acts(idle: &mut Idle, queues: &mut Fake) {
    let deadline = Instant::now() + Duration::from_secs(1);
    while queues.done.is_empty() && Instant::now() < deadline {
        idle.wait(0, queues);
    }
}

#[test]
fn polling_spins_and_never_sleeps() {
    let mut idle = Idle::new(Policy::Polling, None);
    let mut queues = Fake { in_flight: true, ..Fake::default() };
    for _ in 0..10_000 {
        idle.wait(0, &mut queues);
    }
    assert_eq!(queues.done, []);
    assert_eq!(idle.stats(0).sleeps, 0);
}

#[test]
fn notified_sleeps_when_idle_and_only_as_long_as_a_rate_limit_allows() {
    let limit = Some(Duration::from_millis(1));
    let mut idle = Idle::new(Policy::Notified, None);
    let mut queues = Fake { wait_limit: limit, ..Fake::default() };
    idle.wait(1, &mut queues);
    assert_eq!(queues.done, [], "a pass that worked passes again");
    idle.wait(0, &mut queues);
    assert_eq!(queues.done, [Did::Sleep(limit)]);
    queues.in_flight = true;
    idle.wait(0, &mut queues);
    assert_eq!(queues.done.len(), 1, "a request in flight without a descriptor to sleep on: spin");
    assert_eq!(idle.stats(0).sleeps, 1);
}

#[test]
fn requests_finished_by_the_backends_own_threads_are_slept_on_at_once() {
    let mut idle = Idle::new(Policy::Polling, None);
    let mut queues = Fake { in_flight: true, backend_wait: Some(BackendWait::OwnThreads), ..Fake::default() };
    for _ in 0..4 {
        idle.wait(0, &mut queues);
    }
    // A polled driver does not notify: the sleeps are short, doubling to a bound.
    let micros = |us| Did::Sleep(Some(Duration::from_micros(us)));
    assert_eq!(queues.done, [micros(50), micros(100), micros(200), micros(200)]);
    assert_eq!((idle.stats(0).disk_sleeps, idle.stats(0).sleeps), (4, 0));
    // Work resets the sleeps.
    idle.wait(1, &mut queues);
    idle.wait(0, &mut queues);
    assert_eq!(queues.done.last(), Some(&micros(50)));
}

#[test]
fn a_notified_thread_sleeps_on_the_disk_until_notified() {
    let mut idle = Idle::new(Policy::Notified, None);
    let mut queues = Fake { in_flight: true, backend_wait: Some(BackendWait::OwnThreads), ..Fake::default() };
    idle.wait(0, &mut queues);
    assert_eq!(queues.done, [Did::Sleep(None)]);
}

#[test]
fn waiting_for_the_kernel_spins_a_moment_then_sleeps_and_yields_to_known_workers() {
    let mut idle = Idle::new(Policy::Polling, None);
    let mut queues = Fake {
        in_flight: true,
        backend_wait: Some(BackendWait::Kernel),
        submitter_workers: true,
        ..Fake::default()
    };
    idle.wait(0, &mut queues);
    assert_eq!(queues.done, [], "the first wait spins");
    assert_eq!(idle.stats(0).worker_yields, 1, "yielding to io_uring's workers as it spins");
    idle_until_it_acts(&mut idle, &mut queues);
    assert_eq!(queues.done, [Did::Sleep(Some(Duration::from_micros(50)))]);
}

#[test]
fn adaptive_asks_for_notifications_before_it_sleeps_and_looks_once_more() {
    let budget = Duration::from_micros(50);
    let mut idle = Idle::new(Policy::Adaptive { idle: budget }, None);
    let mut queues = Fake::default();
    let started = Instant::now();
    idle_until_it_acts(&mut idle, &mut queues);
    assert!(started.elapsed() >= budget, "spins through its budget first");
    assert_eq!(queues.done, [Did::SetPolling(false), Did::Sleep(None), Did::SetPolling(true)]);
    // A request made just before the driver saw the change: served, not slept on.
    queues.done.clear();
    queues.pending = true;
    idle_until_it_acts(&mut idle, &mut queues);
    assert_eq!(queues.done, [Did::SetPolling(false), Did::SetPolling(true)]);
    assert_eq!(idle.stats(0).sleeps, 1);
}

#[test]
fn adaptive_keeps_spinning_while_requests_are_in_flight() {
    let mut idle = Idle::new(Policy::Adaptive { idle: Duration::from_micros(1) }, None);
    let mut queues = Fake { in_flight: true, ..Fake::default() };
    let deadline = Instant::now() + Duration::from_millis(5);
    while Instant::now() < deadline {
        idle.wait(0, &mut queues);
    }
    assert_eq!(queues.done, []);
}
