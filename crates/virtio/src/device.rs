//! What a virtio device model offers its transport, and how its data path is driven.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use metrics::latency::{Histogram, SharedHistogram};
use thiserror::Error;
use virtqueue::queue::{Queue, QueueError};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use crate::interrupt::{InterruptLine, INT_CONFIG_CHANGE};
use crate::worker::Worker;

/// Request counts of a device's data path (virtio-blk), as its worker keeps them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RequestCounters {
    /// Requests that completed with VIRTIO_BLK_S_OK.
    pub completed: u64,
    /// Requests the backend failed (VIRTIO_BLK_S_IOERR from the disk).
    pub io_errors: u64,
    /// Malformed or unsupported requests, answered without reaching the backend.
    pub rejected: u64,
    /// Interrupts sent to the driver.
    pub interrupts: u64,
    /// Data bytes of the requests that completed with VIRTIO_BLK_S_OK (read or written).
    pub bytes: u64,
}

/// What a device did, for the operator (`exitless run --stats`): the worker adds its counts once
/// per batch of completions (a few relaxed atomic adds, no lock), anyone may read them at any
/// time. One per device, kept by its transport across resets.
#[derive(Debug)]
pub struct DeviceStats {
    name: String,
    completed: AtomicU64,
    io_errors: AtomicU64,
    rejected: AtomicU64,
    interrupts: AtomicU64,
    bytes: AtomicU64,
    needs_reset: AtomicU64,
    first_reset_reason: OnceLock<String>,
    /// Resets that waited longer than their bound for the disk (see [`DeviceStats::reset_timed_out`]).
    reset_timeouts: AtomicU64,
    /// Requests such resets cancelled (they completed once cancelled).
    reset_cancelled: AtomicU64,
    /// Requests such resets left with the disk, quarantined with their guest memory: a gauge.
    quarantined: AtomicU64,
    /// Service times (taken off the ring to put in the used ring), in clock ticks.
    latency: SharedHistogram,
    /// Requests answered, per queue (the first [`STATS_QUEUES`]).
    per_queue: [AtomicU64; STATS_QUEUES],
}

/// How many queues a device's stats count separately (virtio-blk's most).
pub const STATS_QUEUES: usize = 16;

/// A copy of a device's [`DeviceStats`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DeviceStatsSnapshot {
    /// Requests answered, by outcome, with the interrupts sent and the bytes moved.
    pub requests: RequestCounters,
    /// Times the driver broke a queue and the device set DEVICE_NEEDS_RESET.
    pub needs_reset: u64,
    /// Why, the first time.
    pub first_reset_reason: Option<String>,
    /// Resets (a frontend leaving, a ring stopped, a driver's reset) that waited longer than the
    /// disk's bound for its requests and cancelled them.
    pub reset_timeouts: u64,
    /// Requests those resets cancelled (answered VIRTIO_BLK_S_IOERR where the ring still ran).
    pub reset_cancelled: u64,
    /// Requests the disk still holds that no cancel ended: kept, with the guest memory and the
    /// io_uring they use, until the disk finishes them.
    pub quarantined: u64,
    /// Service times of the requests answered, in ticks of the `clock` crate.
    pub latency: Histogram,
    /// Requests answered per queue.
    pub per_queue: [u64; STATS_QUEUES],
}

impl DeviceStats {
    /// Stats for the device called `name` in logs ("virtio-blk 0", a socket path).
    pub fn new(name: impl Into<String>) -> DeviceStats {
        DeviceStats {
            name: name.into(),
            completed: AtomicU64::new(0),
            io_errors: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            interrupts: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            needs_reset: AtomicU64::new(0),
            first_reset_reason: OnceLock::new(),
            reset_timeouts: AtomicU64::new(0),
            reset_cancelled: AtomicU64::new(0),
            quarantined: AtomicU64::new(0),
            latency: SharedHistogram::default(),
            per_queue: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// The device's name in logs.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Add `delta` (what a worker did since it last reported).
    pub fn add(&self, delta: &RequestCounters) {
        self.completed.fetch_add(delta.completed, Ordering::Relaxed);
        self.io_errors.fetch_add(delta.io_errors, Ordering::Relaxed);
        self.rejected.fetch_add(delta.rejected, Ordering::Relaxed);
        self.interrupts.fetch_add(delta.interrupts, Ordering::Relaxed);
        if delta.bytes != 0 {
            self.bytes.fetch_add(delta.bytes, Ordering::Relaxed);
        }
    }

    /// Add `delta` as the work of queue `queue`: the device's counts, and the queue's own.
    pub fn add_for_queue(&self, queue: usize, delta: &RequestCounters) {
        self.add(delta);
        let answered = delta.completed + delta.io_errors + delta.rejected;
        if let Some(count) = self.per_queue.get(queue).filter(|_| answered != 0) {
            count.fetch_add(answered, Ordering::Relaxed);
        }
    }

    /// Where workers add their service times.
    pub fn latency(&self) -> &SharedHistogram {
        &self.latency
    }

    /// A reset waited longer than its bound for the disk: it cancelled `cancelled` requests and
    /// quarantined `quarantined` more (never on the request path).
    pub fn reset_timed_out(&self, cancelled: u64, quarantined: u64) {
        self.reset_timeouts.fetch_add(1, Ordering::Relaxed);
        self.reset_cancelled.fetch_add(cancelled, Ordering::Relaxed);
        self.quarantined.fetch_add(quarantined, Ordering::Relaxed);
    }

    /// `count` quarantined requests finished at last (reaped by their abandoned worker).
    pub fn quarantine_released(&self, count: u64) {
        // Saturating: a release is never counted before its quarantine, but never wrap if so.
        let _ = self
            .quarantined
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| Some(held.saturating_sub(count)));
    }

    /// Count a NEEDS_RESET and log why; a driver that breaks its queue again after every reset
    /// is logged the first `LOGGED_RESETS` times only, so it cannot flood the host's log.
    fn record_reset(&self, why: QueueError) {
        self.record_needs_reset("the driver broke a queue, the device needs a reset", &why.to_string());
    }

    fn record_needs_reset(&self, what: &str, why: &str) {
        const LOGGED_RESETS: u64 = 10;
        let earlier = self.needs_reset.fetch_add(1, Ordering::Relaxed);
        let _ = self.first_reset_reason.set(why.to_string());
        if earlier < LOGGED_RESETS {
            let more =
                if earlier + 1 == LOGGED_RESETS { " (further resets are counted, not logged)" } else { "" };
            log::warn!("{}: {what}: {why}{more}", self.name);
        }
    }

    /// Read every count now. Each is read on its own, so two counts may be a worker's batch
    /// apart.
    pub fn snapshot(&self) -> DeviceStatsSnapshot {
        DeviceStatsSnapshot {
            requests: RequestCounters {
                completed: self.completed.load(Ordering::Relaxed),
                io_errors: self.io_errors.load(Ordering::Relaxed),
                rejected: self.rejected.load(Ordering::Relaxed),
                interrupts: self.interrupts.load(Ordering::Relaxed),
                bytes: self.bytes.load(Ordering::Relaxed),
            },
            needs_reset: self.needs_reset.load(Ordering::Relaxed),
            first_reset_reason: self.first_reset_reason.get().cloned(),
            reset_timeouts: self.reset_timeouts.load(Ordering::Relaxed),
            reset_cancelled: self.reset_cancelled.load(Ordering::Relaxed),
            quarantined: self.quarantined.load(Ordering::Relaxed),
            latency: self.latency.snapshot(),
            per_queue: std::array::from_fn(|q| self.per_queue[q].load(Ordering::Relaxed)),
        }
    }
}

impl RequestCounters {
    /// What changed since `earlier`.
    pub fn since(&self, earlier: &RequestCounters) -> RequestCounters {
        RequestCounters {
            completed: self.completed - earlier.completed,
            io_errors: self.io_errors - earlier.io_errors,
            rejected: self.rejected - earlier.rejected,
            interrupts: self.interrupts - earlier.interrupts,
            bytes: self.bytes - earlier.bytes,
        }
    }
}

/// How a worker tells the driver about used buffers and about a broken queue, and the operator
/// what it did.
#[derive(Clone)]
pub struct DeviceSignals {
    pub(crate) interrupt: InterruptLine,
    needs_reset: Arc<AtomicBool>,
    /// Where a broken queue is reported instead of a config-change interrupt (vhost-user's
    /// vring error eventfd).
    error: Option<Arc<EventFd>>,
    stats: Arc<DeviceStats>,
}

impl DeviceSignals {
    /// Signals for an unnamed device with stats of its own (see `with_stats`).
    pub fn new(interrupt: InterruptLine, needs_reset: Arc<AtomicBool>) -> Self {
        let stats = Arc::new(DeviceStats::new("virtio device"));
        DeviceSignals { interrupt, needs_reset, error: None, stats }
    }

    /// Count into `stats` (the device's, kept across resets) and name the device in logs after it.
    pub fn with_stats(mut self, stats: Arc<DeviceStats>) -> Self {
        self.stats = stats;
        self
    }

    /// Flag used buffers and interrupt the driver (for a worker outside this crate).
    pub fn signal_used_buffers(&self) {
        self.interrupt.signal_used_buffer();
    }

    /// Where the worker reports what it did.
    pub fn stats(&self) -> &DeviceStats {
        &self.stats
    }

    /// Report a broken queue by writing `error` (vhost-user's SET_VRING_ERR eventfd) rather than
    /// by a config-change interrupt, which only a virtio transport can give meaning to.
    pub fn with_error_notifier(mut self, error: Arc<EventFd>) -> Self {
        self.error = Some(error);
        self
    }

    /// The device's backend failed (a vhost-user daemon reported an error or went away): set
    /// DEVICE_NEEDS_RESET, raise a configuration-change interrupt, log `why` once and count it.
    pub fn backend_failed(&self, why: &str) {
        self.interrupt.raise_status(INT_CONFIG_CHANGE);
        if self.needs_reset.swap(true, Ordering::AcqRel) {
            return;
        }
        self.stats.record_needs_reset("the device needs a reset", why);
        self.interrupt.fire();
    }

    /// The driver broke the queue, but the device is being reset before it could say so: log
    /// why and count it, without telling a driver that is resetting it anyway.
    pub fn queue_broken_at_reset(&self, why: QueueError) {
        if !self.needs_reset.load(Ordering::Acquire) {
            self.stats.record_reset(why);
        }
    }

    /// The driver broke the queue: set DEVICE_NEEDS_RESET and tell it (config-change interrupt,
    /// or the error notifier); log why, once per reset, and count it.
    pub fn queue_broken(&self, why: QueueError) {
        if self.needs_reset.load(Ordering::Acquire) {
            return;
        }
        // A driver that polls rather than takes interrupts reads the status and then
        // InterruptStatus: flag the configuration change before the status shows NEEDS_RESET.
        if self.error.is_none() {
            self.interrupt.raise_status(INT_CONFIG_CHANGE);
        }
        if self.needs_reset.swap(true, Ordering::AcqRel) {
            return;
        }
        self.stats.record_reset(why);
        match &self.error {
            // Fails only if the counter would overflow, when the error is pending anyway.
            Some(error) => {
                let _ = error.write(1);
            }
            None => self.interrupt.fire(),
        }
    }
}

/// Why a device's `activate` could not start its data path (the virtio-mmio transport then sets
/// DEVICE_NEEDS_RESET).
#[derive(Debug, Error)]
#[allow(missing_docs)] // Each variant's message says what it is.
pub enum ActivateError {
    #[error("queue {index}: {source}")]
    Queue { index: usize, source: QueueError },
    #[error("the device's backend is gone (an earlier reset could not take it back)")]
    NoBackend,
    #[error("a reset gave up on the disk's requests, and the disk cannot be opened again: {0}")]
    Reopen(storage::BackendError),
    #[error("queue {index} does not exist or is already running")]
    NoSuchQueue { index: usize },
    #[error("queue {index} is needed but the driver did not make it ready")]
    QueueNotReady { index: usize },
    #[error("the driver made none of the queues the device serves ready (queue 0 without multi-queue)")]
    NoQueue,
}

/// What a device's `activate` starts: one slot per worker the device runs (its
/// [`VirtioDevice::worker_count`]), `None` for a worker whose queue the driver left unready.
pub type Workers = Vec<Option<Worker>>;

/// Copy `config[offset..]` into `data`; bytes beyond the configuration space read as 0.
pub fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    data.fill(0);
    let Some(start) = usize::try_from(offset).ok().filter(|&start| start < config.len()) else { return };
    let n = data.len().min(config.len() - start);
    data[..n].copy_from_slice(&config[start..start + n]);
}

/// A virtio device model as its transport sees it.
pub trait VirtioDevice: Send {
    /// The device type the transport shows in DeviceID (virtio 1.x §5): 2 for a disk, 1 for a
    /// network card.
    fn device_id(&self) -> u32;
    /// Feature bits offered to the driver.
    fn features(&self) -> u64;
    /// The largest size of each queue; the length is the number of queues.
    fn queue_max_sizes(&self) -> &[u16];
    /// Read device configuration space at `offset`; bytes beyond it read as 0.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// The driver writes `data` at `offset` in configuration space; what the device does not
    /// let the driver change is ignored (the default: all of it).
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}
    /// How many workers the device's data path has, each served on its own (a multi-queue
    /// disk: one per queue, so queues run apart); the transport gives each a notification.
    fn worker_count(&self) -> usize {
        1
    }
    /// Which worker a notification of queue `queue` (the driver's QueueNotify value) is for;
    /// `None`: no queue of the device, ignored.
    fn worker_of_queue(&self, _queue: u32) -> Option<usize> {
        Some(0)
    }
    /// Start the data path over the queues the driver set up, by index (already validated;
    /// `None`: left unready, which the device refuses or does without).
    fn activate(
        &mut self,
        mem: &GuestMemoryMmap,
        queues: Vec<Option<Queue>>,
        features: u64,
        signals: DeviceSignals,
    ) -> Result<Workers, ActivateError>;
    /// Take back what `activate` handed out (device reset).
    fn deactivate(&mut self, workers: Workers);
    /// InterruptStatus bits the transport shows as set while the device runs, whatever the
    /// driver acknowledged: for a device whose used-buffer interrupts bypass the transport (a
    /// vhost-user daemon writes the irqfd itself, so the transport never learns of them).
    fn interrupt_status_while_active(&self) -> u32 {
        0
    }
    /// The VM was just restored here from a snapshot or a migration, and the device has not
    /// run yet: tell the network where it now is (a NIC sends a frame from its address, so that
    /// switches learn its new port). Most devices have nothing to say.
    fn announce(&mut self) {}
    /// The VM pauses, its device running: a device whose data path is not the transport's
    /// workers (a vhost-user daemon's) stops it, so that guest memory holds still (for a
    /// snapshot). The transport's own workers are drained by the transport.
    fn pause(&mut self) {}
    /// The VM resumes after [`VirtioDevice::pause`]: the data path starts again where it stopped.
    fn resume(&mut self) {}
}
