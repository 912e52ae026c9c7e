//! The block device served over vhost-user: the virtio-blk device model (`virtio::block::Block`)
//! and, between connections, every queue's storage backend. A started ring is a `BlockWorker`
//! attached to the IOCore; a stopped one finishes its requests and gives its backend back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rate_limiter::RateLimiter;
use virtio::block::device::CONFIG_WRITEBACK;
use virtio::block::{Block, BlockWorker};
use virtio::{DeviceStats, VirtioDevice};
use virtqueue::WorkerHost;

use crate::device::{Device, Ring};
use crate::error::Error;

/// The most requests a ring's worker takes off the ring per IOCore pass, so that the rings of
/// every disk an IOCore serves get their turn.
pub use virtio::block::FAIR_BATCH;

/// SET_CONFIG's flags for a write by the driver (VHOST_SET_CONFIG_TYPE_FRONTEND, "MASTER" in
/// QEMU 7.2); 1 is live migration's, which this backend does not take.
const SET_CONFIG_FROM_DRIVER: u32 = 0;

/// Worker ids on the IOCore: this, plus 2^16 per device, plus the queue index, so devices can
/// share an IOCore (each serves one frontend at a time).
const WORKER_ID_BASE: u64 = 0x7668_0000_0000;

/// The block device served over vhost-user, across connections.
pub struct VhostUserBlk {
    block: Block,
    host: Arc<dyn WorkerHost<BlockWorker>>,
    worker_ids: u64,
    /// What the disk did, across its rings and connections.
    stats: Arc<DeviceStats>,
    /// The disk's QoS limits, shared by its rings; `None`: unlimited.
    limiter: Option<Arc<RateLimiter>>,
}

impl VhostUserBlk {
    /// Serve `block` (one storage backend per queue), with queue workers run by `host`.
    pub fn new(block: Block, host: Arc<dyn WorkerHost<BlockWorker>>) -> VhostUserBlk {
        static DEVICES: AtomicU64 = AtomicU64::new(0);
        let worker_ids = WORKER_ID_BASE + (DEVICES.fetch_add(1, Ordering::Relaxed) << 16);
        let stats = Arc::new(DeviceStats::new("vhost-user-blk"));
        VhostUserBlk { block: block.with_batch_limit(FAIR_BATCH), host, worker_ids, stats, limiter: None }
    }

    /// Count what the disk does into `stats` (named after the disk in logs).
    pub fn with_stats(mut self, stats: Arc<DeviceStats>) -> VhostUserBlk {
        self.stats = stats;
        self
    }

    /// Hold the disk's rings to `limiter`'s token buckets (one set for all its rings).
    pub fn with_rate_limiter(mut self, limiter: Arc<RateLimiter>) -> VhostUserBlk {
        self.limiter = Some(limiter);
        self
    }

    /// Start a connection's state.
    pub fn session(&mut self) -> crate::Session<'_> {
        crate::Session::new(self)
    }

    fn worker_id(&self, index: usize) -> u64 {
        self.worker_ids + index as u64
    }
}

impl Device for VhostUserBlk {
    fn stats(&self) -> &Arc<DeviceStats> {
        &self.stats
    }

    fn features(&self) -> u64 {
        self.block.features()
    }

    fn protocol_features(&self) -> u64 {
        crate::backend::OFFERED_PROTOCOL_FEATURES
    }

    fn num_queues(&self) -> usize {
        self.block.num_queues()
    }

    fn driver_features(&mut self, features: u64) {
        self.block.driver_features(features);
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        self.block.read_config(offset, data);
    }

    /// SET_CONFIG, as QEMU's vhost-user-blk sends it when its driver switches the cache mode
    /// (VIRTIO_BLK_F_CONFIG_WCE): the 1-byte `writeback` field, 0 (write through) or 1 (write
    /// back), from the driver (flags 0); nothing else in configuration space is writable. The
    /// mode is the disk's: every queue's worker takes it at its next pass, and it outlives the
    /// connection, since QEMU does not send it again when it reconnects.
    fn write_config(&mut self, offset: u32, flags: u32, data: &[u8]) -> Result<(), Error> {
        if !self.block.has_writeback_switch() {
            return Err(Error::NoWritebackSwitch);
        }
        let (&[value], Ok(CONFIG_WRITEBACK)) = (data, usize::try_from(offset)) else {
            return Err(Error::ConfigNotWritable { offset, size: data.len() });
        };
        if flags != SET_CONFIG_FROM_DRIVER {
            return Err(Error::ConfigWriteFlags(flags));
        }
        self.set_writeback(value)?;
        log::info!(
            "{}: the frontend switched the disk to write {}",
            self.stats.name(),
            if value == 1 { "back" } else { "through" }
        );
        Ok(())
    }

    /// The driver's cache mode, when the disk has the switch: 1 for write back, 0 for write
    /// through.
    fn writeback(&self) -> Option<u8> {
        if !self.block.has_writeback_switch() {
            return None;
        }
        let mut value = [0u8];
        self.block.read_config(CONFIG_WRITEBACK as u64, &mut value);
        Some(value[0])
    }

    fn set_writeback(&mut self, value: u8) -> Result<(), Error> {
        if !self.block.has_writeback_switch() {
            return Err(Error::NoWritebackSwitch);
        }
        if value > 1 {
            return Err(Error::BadWriteback(value));
        }
        self.block.write_config(CONFIG_WRITEBACK as u64, &[value]);
        Ok(())
    }

    fn start_ring(&mut self, index: usize, ring: Ring) -> Result<(), Error> {
        let Ring { queue, signals, log, kick } = ring;
        let mut worker =
            self.block.start_queue(index, queue, signals).map_err(|source| Error::Start { index, source })?;
        if let Some(limiter) = &self.limiter {
            worker = worker.with_rate_limiter(limiter.clone());
        }
        if let Some(log) = log {
            worker = worker.with_dirty_log(log);
        }
        if kick.is_none() {
            worker = worker.without_kicks();
        }
        self.host.attach(self.worker_id(index), worker, kick);
        Ok(())
    }

    fn stop_ring(&mut self, index: usize) -> Result<u16, Error> {
        let mut worker = self.host.detach(self.worker_id(index)).ok_or(Error::Detach(index))?;
        let next_avail = worker.queue_mut().next_avail();
        let c = worker.counters;
        self.block.stop_queue(index, worker);
        log::info!(
            "{}: vring {index} stopped at avail index {next_avail}: {} requests completed, {} I/O errors, {} refused, {} interrupts",
            self.stats.name(), c.completed, c.io_errors, c.rejected, c.interrupts
        );
        Ok(next_avail)
    }

    fn quarantined(&mut self, index: usize) -> usize {
        self.block.abandoned_requests_of(index)
    }

    /// Reap the requests quarantined at a reset that the disk has finished since (their
    /// memory and io_uring go with the last); how many it still holds.
    fn reap_quarantined(&mut self) -> usize {
        self.block.abandoned_requests()
    }
}
