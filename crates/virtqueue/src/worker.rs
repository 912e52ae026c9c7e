//! What a device's data path is to whoever serves it: a `QueueWorker`, polled by its owner, and
//! the `WorkerHost` that owns workers on a transport's behalf.

use std::os::fd::RawFd;
use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use crate::dirty::DirtyLog;

/// A device's data path once the driver has set it up: owns its queues and its backend.
pub trait QueueWorker: Send {
    /// Serve the queues once: start available requests, collect finished ones, publish them and
    /// interrupt the driver if it asked to be. Returns how many requests were started or
    /// finished (0: nothing to do). Never blocks; allocates nothing, takes no lock.
    fn poll(&mut self) -> usize;
    /// `true`: the owner polls, so ask the driver not to notify. `false`: the owner waits for
    /// notifications, so keep asking for them after every batch.
    fn set_polling(&mut self, polling: bool);
    /// Requests handed to the backend and not finished yet.
    fn in_flight(&self) -> usize;
    /// Has the driver made requests available that `poll` has not taken?
    fn has_pending(&self) -> bool;
    /// A file descriptor that becomes readable when the backend has work for `poll` (a tap
    /// with frames waiting): an idle owner waits on it besides the queue notifications.
    fn backend_fd(&self) -> Option<RawFd> {
        None
    }
    /// `backend_fd` woke an owner that slept on it: clear it before the next `poll` (see
    /// `storage::Backend::completion_fd_fired`).
    fn backend_fd_fired(&mut self) {}
    /// Does the backend hold requests that run in kernel worker threads started from the
    /// owner's thread, which inherit its CPU and scheduling class? A waiting owner must then
    /// yield its core rather than spin (see `storage::Backend::waits_on_submitter_workers`).
    fn waits_on_submitter_workers(&self) -> bool {
        false
    }
    /// Are the requests in flight finished by the backend's own threads, so that an owner
    /// waiting only for them should sleep rather than spin (see
    /// `storage::Backend::completes_on_own_threads`)?
    fn waits_on_backend_threads(&self) -> bool {
        false
    }
    /// Did the last `poll` leave requests in the ring for the device's rate limit? No
    /// notification announces when they may go: its owner then sleeps only a little before
    /// polling again, and does not spin for them either.
    fn throttled(&self) -> bool {
        false
    }
    /// Is a ring fed by a driver that never notifies (a vhost-user ring without a kick)? An
    /// owner that sleeps must look at it again after a moment, as for a rate limit; unlike
    /// throttled requests, requests waiting there are work for the next pass.
    fn unannounced(&self) -> bool {
        false
    }
    /// Mark every guest page the worker writes in `log` from now on (`None`: stop); called only
    /// on a drained worker. `false`: this worker cannot log (its device cannot be migrated).
    fn set_dirty_log(&mut self, _log: Option<DirtyLog>) -> bool {
        false
    }
}

/// Where a transport's workers run when it does not run them itself (the IOCore). A host holds
/// workers of one type, `W`, and `detach` hands back the worker of that type `attach` was given,
/// so the device model that made it takes its resources back without a downcast.
pub trait WorkerHost<W: QueueWorker>: Send + Sync {
    /// Serve `worker` from now on; `notify` is the queue's ioeventfd, to wait on when idle.
    fn attach(&self, id: u64, worker: W, notify: Option<Arc<EventFd>>);
    /// Stop serving worker `id` and hand it back, once its in-flight requests finished.
    fn detach(&self, id: u64) -> Option<W>;
}
