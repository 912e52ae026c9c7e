//! What a virtio device model offers its transport, and how its data path is driven.

use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use thiserror::Error;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use crate::interrupt::InterruptLine;
use crate::queue::{Queue, QueueError};

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
    /// Give the device model its resources back (downcast by the model that made the worker).
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
}

/// Where a transport's workers run when it does not run them itself (the IOCore).
pub trait WorkerHost: Send + Sync {
    /// Serve `worker` from now on; `notify` is the queue's ioeventfd, to wait on when idle.
    fn attach(&self, id: u64, worker: Box<dyn QueueWorker>, notify: Option<Arc<EventFd>>);
    /// Stop serving worker `id` and hand it back, once its in-flight requests finished.
    fn detach(&self, id: u64) -> Option<Box<dyn QueueWorker>>;
}

/// How a worker tells the driver about used buffers and about a broken queue.
#[derive(Clone)]
pub struct DeviceSignals {
    pub interrupt: InterruptLine,
    needs_reset: Arc<AtomicBool>,
}

impl DeviceSignals {
    pub fn new(interrupt: InterruptLine, needs_reset: Arc<AtomicBool>) -> Self {
        DeviceSignals { interrupt, needs_reset }
    }

    /// The driver broke the queue: set DEVICE_NEEDS_RESET and tell it (config-change interrupt).
    pub fn queue_broken(&self, _why: QueueError) {
        if !self.needs_reset.swap(true, Ordering::AcqRel) {
            self.interrupt.signal_config_change();
        }
    }
}

#[derive(Debug, Error)]
pub enum ActivateError {
    #[error("queue {index}: {source}")]
    Queue { index: usize, source: QueueError },
    #[error("the device's backend is gone (an earlier reset could not take it back)")]
    NoBackend,
}

/// A virtio device model as its transport sees it.
pub trait VirtioDevice: Send {
    fn device_id(&self) -> u32;
    /// Feature bits offered to the driver.
    fn features(&self) -> u64;
    /// The largest size of each queue; the length is the number of queues.
    fn queue_max_sizes(&self) -> &[u16];
    /// Read device configuration space at `offset`; bytes beyond it read as 0.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Start the data path over queues the driver made ready (already validated).
    fn activate(
        &mut self,
        mem: &GuestMemoryMmap,
        queues: Vec<Queue>,
        features: u64,
        signals: DeviceSignals,
    ) -> Result<Box<dyn QueueWorker>, ActivateError>;
    /// Take back what `activate` handed out (device reset).
    fn deactivate(&mut self, worker: Box<dyn QueueWorker>);
}
