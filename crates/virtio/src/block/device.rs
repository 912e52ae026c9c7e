//! The virtio-blk device model as the transport sees it: features, configuration space, and
//! the worker it starts when the driver is ready.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use storage::{Backend, MAX_SEGMENTS, SECTOR_SIZE};
use virtqueue::queue::{Queue, MAX_QUEUE_SIZE};
use virtqueue::QueueWorker;
use vm_memory::GuestMemoryMmap;

use super::request::{ID_LEN, MAX_RANGES, MAX_RANGE_SECTORS};
use super::worker::{BlockWorker, DiskInfo, RESET_WAIT};
use super::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_CONFIG_WCE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH,
    VIRTIO_BLK_F_MQ, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_SIZE_MAX, VIRTIO_BLK_F_TOPOLOGY,
    VIRTIO_BLK_F_WRITE_ZEROES, VIRTIO_ID_BLOCK,
};
use crate::device::{read_config_bytes, ActivateError, DeviceSignals, VirtioDevice, Workers};
use crate::worker::Worker;
use crate::{VIRTIO_F_EVENT_IDX, VIRTIO_F_INDIRECT_DESC, VIRTIO_F_VERSION_1};

/// The largest data descriptor the driver may use (`size_max`). SeaBIOS's virtio-blk driver
/// takes `size_max * seg_max / blk_size` as its sectors per request in 16 bits: with 1 MiB that
/// was 2^18, 0 once truncated, and it read the disk at boot with a zero-length buffer (refused,
/// so it could not boot from the disk). 128 KiB x 128 / 512 = 32768 fits; 256 KiB would not.
pub const SIZE_MAX: u32 = 128 << 10;
/// The most data descriptors per request (`seg_max`, storage's MAX_SEGMENTS).
const SEG_MAX: u32 = 128;
const _: () = assert!(SEG_MAX as usize == MAX_SEGMENTS);
/// The logical block size (`blk_size`).
const BLK_SIZE: u32 = 512;
const _: () = assert!(BLK_SIZE as u64 == SECTOR_SIZE);
/// The most queues a device offers (VIRTIO_BLK_F_MQ); each has its own backend.
pub const MAX_QUEUES: usize = 16;
/// Configuration space (virtio 1.2 §5.2.4, struct virtio_blk_config): capacity (u64, sectors)
/// at 0, size_max 8, seg_max 12, geometry 16, blk_size 20, topology 24 (physical_block_exp u8,
/// alignment_offset u8, min_io_size u16, opt_io_size u32), writeback 32, num_queues 34,
/// max_discard_sectors 36, max_discard_seg 40, discard_sector_alignment 44,
/// max_write_zeroes_sectors 48, max_write_zeroes_seg 52, write_zeroes_may_unmap 56; the
/// secure-erase fields after it are not offered.
const CONFIG_LEN: usize = 60;
const CONFIG_TOPOLOGY: usize = 24;
/// Where `writeback` lies in configuration space: the one byte VIRTIO_BLK_F_CONFIG_WCE lets
/// the driver write (offsetof(struct virtio_blk_config, wce) in QEMU).
pub const CONFIG_WRITEBACK: usize = 32;
const CONFIG_NUM_QUEUES: usize = 34;
const CONFIG_DISCARD: usize = 36;
const CONFIG_WRITE_ZEROES: usize = 48;

/// The most requests an IOCore takes off one ring per pass, in the VMM and in the vhost-user
/// daemon ([`Block::with_batch_limit`]). Every other ring the IOCore serves waits for at most
/// this many of a deep ring's requests. It also keeps the guest busy while the device works: a
/// driver at depth 32 that posts its whole queue at once gets its first 16 completions back
/// while the device takes the next 16, instead of waiting for all 32 (docs/tuning.md).
pub const FAIR_BATCH: usize = 16;

/// The virtio-blk device model: features and configuration space, and one backend per queue
/// that it lends to the queue's worker while the queue runs.
pub struct Block {
    /// One per queue: the queue's worker owns it while the queue runs (`None` then).
    backends: Vec<Option<Box<dyn Backend>>>,
    /// Workers a reset gave up on (`BlockWorker::into_backend`), kept with the guest memory
    /// the kernel may still write until their backends finish; by queue.
    abandoned: Vec<(usize, BlockWorker)>,
    queue_sizes: Vec<u16>,
    /// How long a queue's reset waits for its backend before it cancels what the disk holds.
    reset_timeout: std::time::Duration,
    /// The most requests a queue's worker takes off its ring per pass (`with_batch_limit`).
    batch_limit: usize,
    disk: DiskInfo,
    features: u64,
    config: [u8; CONFIG_LEN],
}

impl Block {
    /// A one-queue device over `backend`; `id` is the GET_ID answer (truncated to 20 bytes).
    pub fn new(backend: Box<dyn Backend>, id: &str) -> Block {
        Self::build(vec![backend], id)
    }

    /// A device with one queue per backend (1 to `MAX_QUEUES`), offering VIRTIO_BLK_F_MQ when
    /// there is more than one. The backends must be the same disk (same capacity and
    /// read-only flag: the first one's are reported), each opened on its own, since a queue's
    /// worker owns its backend. Its queues are started one by one (`start_queue`); `None` if
    /// the count or the backends do not fit.
    pub fn with_queues(backends: Vec<Box<dyn Backend>>, id: &str) -> Option<Block> {
        let first = backends.first()?;
        let same_disk =
            backends.iter().all(|b| b.capacity() == first.capacity() && b.read_only() == first.read_only());
        (backends.len() <= MAX_QUEUES && same_disk).then(|| Self::build(backends, id))
    }

    fn build(backends: Vec<Box<dyn Backend>>, id: &str) -> Block {
        let capacity = backends[0].capacity();
        let read_only = backends[0].read_only();
        let capabilities = backends[0].capabilities();
        let queues = backends.len();
        let mut id_bytes = [0u8; ID_LEN];
        let n = id.len().min(ID_LEN);
        id_bytes[..n].copy_from_slice(&id.as_bytes()[..n]);
        let mut features = 1 << VIRTIO_F_VERSION_1
            | 1 << VIRTIO_F_EVENT_IDX
            | 1 << VIRTIO_F_INDIRECT_DESC
            | 1 << VIRTIO_BLK_F_SIZE_MAX
            | 1 << VIRTIO_BLK_F_SEG_MAX
            | 1 << VIRTIO_BLK_F_BLK_SIZE
            | 1 << VIRTIO_BLK_F_FLUSH
            | 1 << VIRTIO_BLK_F_TOPOLOGY;
        // A backend that cannot do them says so (a file system without hole punching); the
        // driver then does without (Linux writes zeros itself).
        let discard = capabilities.discard && !read_only;
        let write_zeroes = capabilities.write_zeroes && !read_only;
        if discard {
            features |= 1 << VIRTIO_BLK_F_DISCARD;
        }
        if write_zeroes {
            features |= 1 << VIRTIO_BLK_F_WRITE_ZEROES;
        }
        if read_only {
            features |= 1 << VIRTIO_BLK_F_RO;
        }
        if queues > 1 {
            features |= 1 << VIRTIO_BLK_F_MQ;
        }
        let mut config = [0u8; CONFIG_LEN];
        config[0..8].copy_from_slice(&(capacity / SECTOR_SIZE).to_le_bytes());
        config[8..12].copy_from_slice(&SIZE_MAX.to_le_bytes());
        config[12..16].copy_from_slice(&SEG_MAX.to_le_bytes());
        config[20..24].copy_from_slice(&BLK_SIZE.to_le_bytes());
        // Write back: completed writes are durable after a FLUSH (FileDisk: fdatasync).
        config[CONFIG_WRITEBACK] = 1;
        // Topology: logical blocks per physical block as a power of two, and the physical block
        // as the smallest I/O that needs no read-modify-write; no alignment offset, no optimum.
        let blocks_per_physical = (capabilities.physical_block_size / BLK_SIZE).max(1);
        let exponent = u8::try_from(blocks_per_physical.trailing_zeros()).unwrap_or(0);
        config[CONFIG_TOPOLOGY] = exponent;
        let min_io = u16::try_from(blocks_per_physical).unwrap_or(1);
        config[CONFIG_TOPOLOGY + 2..CONFIG_TOPOLOGY + 4].copy_from_slice(&min_io.to_le_bytes());
        let ranges = u32::try_from(MAX_RANGES).unwrap_or(1);
        if discard {
            let at = CONFIG_DISCARD;
            config[at..at + 4].copy_from_slice(&MAX_RANGE_SECTORS.to_le_bytes());
            config[at + 4..at + 8].copy_from_slice(&ranges.to_le_bytes());
            // Discard granularity: the physical block (a file system block for files).
            config[at + 8..at + 12].copy_from_slice(&blocks_per_physical.to_le_bytes());
        }
        if write_zeroes {
            let at = CONFIG_WRITE_ZEROES;
            config[at..at + 4].copy_from_slice(&MAX_RANGE_SECTORS.to_le_bytes());
            config[at + 4..at + 8].copy_from_slice(&ranges.to_le_bytes());
            config[at + 8] = 1; // write_zeroes_may_unmap
        }
        // `with_queues` allows at most MAX_QUEUES.
        let num_queues = u16::try_from(queues).unwrap_or(u16::MAX);
        config[CONFIG_NUM_QUEUES..CONFIG_NUM_QUEUES + 2].copy_from_slice(&num_queues.to_le_bytes());
        Block {
            backends: backends.into_iter().map(Some).collect(),
            abandoned: Vec::new(),
            queue_sizes: vec![MAX_QUEUE_SIZE; queues],
            reset_timeout: RESET_WAIT,
            batch_limit: usize::MAX,
            disk: DiskInfo {
                capacity,
                read_only,
                id: id_bytes,
                discard,
                write_zeroes,
                write_through: Arc::new(AtomicBool::new(false)),
            },
            features,
            config,
        }
    }

    /// Serve only the request types the driver took (`features`, those it acked): a DISCARD or
    /// WRITE_ZEROES from a driver that did not negotiate it is answered UNSUPP, as QEMU does.
    /// Transports call it when the driver's features are set (virtio-mmio on activation,
    /// vhost-user on SET_FEATURES); queues started later serve what it allows.
    pub fn driver_features(&mut self, features: u64) {
        let taken = |bit: u32| self.features & features & 1 << bit != 0;
        self.disk.discard = taken(VIRTIO_BLK_F_DISCARD);
        self.disk.write_zeroes = taken(VIRTIO_BLK_F_WRITE_ZEROES);
    }

    /// Offer VIRTIO_BLK_F_CONFIG_WCE: the driver may switch the cache between write back and
    /// write through by writing `writeback` in configuration space. Only for a transport that
    /// passes configuration writes on (virtio-mmio's registers, vhost-user's SET_CONFIG).
    pub fn with_writeback_switch(mut self) -> Block {
        self.features |= 1 << VIRTIO_BLK_F_CONFIG_WCE;
        self
    }

    /// Let a queue's reset wait `timeout` (default 5 s) for the requests its disk holds before
    /// it cancels them and, if the cancels do not end them, quarantines them with their guest
    /// memory (`BlockWorker::into_backend`).
    pub fn with_reset_timeout(mut self, timeout: std::time::Duration) -> Block {
        self.reset_timeout = timeout;
        self
    }

    /// Let each queue's worker take at most `limit` requests off its ring per pass (see
    /// `BlockWorker::with_batch_limit`; default: no limit). Only for queues served by an owner
    /// that polls again while requests are left, as the IOCore does; [`FAIR_BATCH`] is the
    /// IOCore's share.
    pub fn with_batch_limit(mut self, limit: usize) -> Block {
        self.batch_limit = limit;
        self
    }

    /// Is VIRTIO_BLK_F_CONFIG_WCE offered (`with_writeback_switch`)?
    pub fn has_writeback_switch(&self) -> bool {
        self.features & 1 << VIRTIO_BLK_F_CONFIG_WCE != 0
    }

    /// Is the disk read-only (VIRTIO_BLK_F_RO)?
    pub fn read_only(&self) -> bool {
        self.disk.read_only
    }

    /// Write back (the default) or through; see `DiskInfo::write_through`.
    fn set_writeback(&mut self, writeback: bool) {
        self.config[CONFIG_WRITEBACK] = u8::from(writeback);
        self.disk.write_through.store(!writeback, Ordering::Relaxed);
    }

    /// How many queues the device offers.
    pub fn num_queues(&self) -> usize {
        self.backends.len()
    }

    /// Start serving queue `index` (already validated against guest memory): a worker that owns the
    /// queue's backend until `stop_queue` takes it back.
    pub fn start_queue(
        &mut self,
        index: usize,
        queue: Queue,
        signals: DeviceSignals,
    ) -> Result<BlockWorker, ActivateError> {
        self.release_abandoned();
        let slot = self.backends.get_mut(index).ok_or(ActivateError::NoSuchQueue { index })?;
        let backend = match slot.take() {
            Some(backend) => backend,
            // Its last reset gave up on a disk that did not answer: the disk opened again.
            None => self
                .abandoned
                .iter()
                .find(|(queue, _)| *queue == index)
                .ok_or(ActivateError::NoBackend)?
                .1
                .reopen_backend()
                .map_err(ActivateError::Reopen)?,
        };
        Ok(BlockWorker::new(queue, backend, self.disk.clone(), signals)
            .for_queue(index)
            .with_reset_timeout(self.reset_timeout)
            .with_batch_limit(self.batch_limit))
    }

    /// Take queue `index`'s backend back from its worker (requests in flight finish first, or
    /// within `into_backend`'s bound the worker is kept aside with them, and the queue's next
    /// start opens the disk again).
    pub fn stop_queue(&mut self, index: usize, worker: BlockWorker) {
        match worker.into_backend() {
            Ok(backend) => {
                if let Some(slot) = self.backends.get_mut(index) {
                    *slot = Some(backend);
                }
            }
            Err(worker) => self.abandoned.push((index, *worker)),
        }
        self.release_abandoned();
    }

    /// Requests abandoned by resets that their disks still hold (reaping those finished).
    pub fn abandoned_requests(&mut self) -> usize {
        self.release_abandoned();
        self.abandoned.iter().map(|(_, worker)| worker.in_flight()).sum()
    }

    /// Requests abandoned by resets of queue `index` that its disk still holds (reaping those
    /// finished). While there are any, the disk may still carry out a request the driver was
    /// never answered for: a write resubmitted for it could be overwritten by the late original.
    pub fn abandoned_requests_of(&mut self, index: usize) -> usize {
        self.release_abandoned();
        self.abandoned.iter().filter(|(queue, _)| *queue == index).map(|(_, worker)| worker.in_flight()).sum()
    }

    /// Drop the abandoned workers whose disks have finished with them (reaped without a system
    /// call; a worker's drop then frees its guest memory). A queue that has no backend (its
    /// reset gave up, and it has not started since) takes the worker's back: nothing holds it now.
    fn release_abandoned(&mut self) {
        let mut at = 0;
        while at < self.abandoned.len() {
            let worker = &mut self.abandoned[at].1;
            worker.complete();
            if worker.in_flight() > 0 {
                at += 1;
                continue;
            }
            let (index, worker) = self.abandoned.swap_remove(at);
            log::warn!(
                "{}: the disk finished the last request quarantined at queue {index}'s reset; \
                 its old guest memory is released",
                worker.device_name()
            );
            if let Some(slot @ None) = self.backends.get_mut(index) {
                *slot = worker.into_backend().ok();
            }
        }
    }
}

impl Drop for Block {
    /// The device goes with requests a disk still holds: their workers are leaked rather than
    /// dropped, since a backend's drop waits for the kernel (for ever, for a disk that does not
    /// answer) and their guest memory must stay mapped while the kernel may write it.
    fn drop(&mut self) {
        self.release_abandoned();
        for (_, worker) in self.abandoned.drain(..) {
            std::mem::forget(worker);
        }
    }
}

impl VirtioDevice for Block {
    fn device_id(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn features(&self) -> u64 {
        self.features
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_sizes
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data)
    }

    /// Only `writeback` is the driver's to write, and only with VIRTIO_BLK_F_CONFIG_WCE
    /// offered: 0 writes through, anything else back.
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        if !self.has_writeback_switch() {
            return;
        }
        if let (Ok(CONFIG_WRITEBACK), [value]) = (usize::try_from(offset), data) {
            self.set_writeback(*value != 0);
        }
    }

    fn worker_count(&self) -> usize {
        self.backends.len()
    }

    /// One worker per queue: a notification goes to its queue's.
    fn worker_of_queue(&self, queue: u32) -> Option<usize> {
        usize::try_from(queue).ok().filter(|&index| index < self.backends.len())
    }

    /// A worker for each queue the driver made ready: all of them with VIRTIO_BLK_F_MQ (a
    /// driver may use fewer than offered, as Linux does with fewer CPUs), queue 0 without.
    fn activate(
        &mut self,
        _mem: &GuestMemoryMmap,
        queues: Vec<Option<Queue>>,
        features: u64,
        signals: DeviceSignals,
    ) -> Result<Workers, ActivateError> {
        self.driver_features(features);
        let multi_queue = features & self.features & 1 << VIRTIO_BLK_F_MQ != 0;
        let mut workers: Workers = Vec::with_capacity(queues.len());
        for (index, queue) in queues.into_iter().enumerate() {
            // Without MQ the driver knows of queue 0 only.
            let Some(queue) = queue.filter(|_| multi_queue || index == 0) else {
                workers.push(None);
                continue;
            };
            match self.start_queue(index, queue, signals.clone()) {
                Ok(worker) => workers.push(Some(worker.into())),
                Err(e) => {
                    self.deactivate(workers);
                    return Err(e);
                }
            }
        }
        if workers.iter().all(Option::is_none) {
            return Err(ActivateError::NoQueue);
        }
        Ok(workers)
    }

    fn deactivate(&mut self, workers: Workers) {
        for (index, worker) in workers.into_iter().enumerate() {
            if let Some(Worker::Block(worker)) = worker {
                self.stop_queue(index, *worker);
            }
        }
        // A reset device writes back again, as the next driver finds it.
        self.set_writeback(true);
    }
}
