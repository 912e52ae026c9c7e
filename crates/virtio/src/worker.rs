//! The workers of this crate's device models as one type, so that one host (a VM's IOCore)
//! serves every kind and hands each back as what it is: a device model takes its own kind back
//! by a match, not a downcast.

use std::os::fd::RawFd;

use virtqueue::dirty::DirtyLog;
use virtqueue::QueueWorker;

use crate::block::BlockWorker;
use crate::net::NetWorker;

/// A worker of one of this crate's device models, or of a device served elsewhere. Boxed: a
/// worker is kilobytes, moved between its transport and its host, and allocated once per start.
pub enum Worker {
    /// A virtio-blk queue's.
    Block(Box<BlockWorker>),
    /// A virtio-net device's (both its queues).
    Net(Box<NetWorker>),
    /// A device whose queues another process serves (a vhost-user daemon): nothing to poll.
    Remote,
}

impl From<BlockWorker> for Worker {
    fn from(worker: BlockWorker) -> Worker {
        Worker::Block(Box::new(worker))
    }
}

impl From<NetWorker> for Worker {
    fn from(worker: NetWorker) -> Worker {
        Worker::Net(Box::new(worker))
    }
}

impl QueueWorker for Worker {
    fn poll(&mut self) -> usize {
        match self {
            Worker::Block(worker) => QueueWorker::poll(&mut **worker),
            Worker::Net(worker) => QueueWorker::poll(&mut **worker),
            Worker::Remote => 0,
        }
    }

    fn set_polling(&mut self, polling: bool) {
        match self {
            Worker::Block(worker) => QueueWorker::set_polling(&mut **worker, polling),
            Worker::Net(worker) => QueueWorker::set_polling(&mut **worker, polling),
            Worker::Remote => {}
        }
    }

    fn in_flight(&self) -> usize {
        match self {
            Worker::Block(worker) => QueueWorker::in_flight(&**worker),
            Worker::Net(worker) => QueueWorker::in_flight(&**worker),
            Worker::Remote => 0,
        }
    }

    fn has_pending(&self) -> bool {
        match self {
            Worker::Block(worker) => QueueWorker::has_pending(&**worker),
            Worker::Net(worker) => QueueWorker::has_pending(&**worker),
            Worker::Remote => false,
        }
    }

    fn backend_fd(&self) -> Option<RawFd> {
        match self {
            Worker::Block(worker) => QueueWorker::backend_fd(&**worker),
            Worker::Net(worker) => QueueWorker::backend_fd(&**worker),
            Worker::Remote => None,
        }
    }

    fn backend_fd_fired(&mut self) {
        match self {
            Worker::Block(worker) => QueueWorker::backend_fd_fired(&mut **worker),
            Worker::Net(worker) => QueueWorker::backend_fd_fired(&mut **worker),
            Worker::Remote => {}
        }
    }

    fn waits_on_submitter_workers(&self) -> bool {
        match self {
            Worker::Block(worker) => QueueWorker::waits_on_submitter_workers(&**worker),
            Worker::Net(worker) => QueueWorker::waits_on_submitter_workers(&**worker),
            Worker::Remote => false,
        }
    }

    fn waits_on_backend_threads(&self) -> bool {
        match self {
            Worker::Block(worker) => QueueWorker::waits_on_backend_threads(&**worker),
            Worker::Net(worker) => QueueWorker::waits_on_backend_threads(&**worker),
            Worker::Remote => false,
        }
    }

    fn throttled(&self) -> bool {
        match self {
            Worker::Block(worker) => QueueWorker::throttled(&**worker),
            Worker::Net(worker) => QueueWorker::throttled(&**worker),
            Worker::Remote => false,
        }
    }

    fn unannounced(&self) -> bool {
        match self {
            Worker::Block(worker) => QueueWorker::unannounced(&**worker),
            Worker::Net(worker) => QueueWorker::unannounced(&**worker),
            Worker::Remote => false,
        }
    }

    fn set_dirty_log(&mut self, log: Option<DirtyLog>) -> bool {
        match self {
            Worker::Block(worker) => QueueWorker::set_dirty_log(&mut **worker, log),
            Worker::Net(worker) => QueueWorker::set_dirty_log(&mut **worker, log),
            Worker::Remote => false,
        }
    }
}
