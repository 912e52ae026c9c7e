//! The virtio-blk device model as the transport sees it: features, configuration space, and
//! the worker it starts when the driver is ready.

use storage::{Backend, MAX_SEGMENTS, SECTOR_SIZE};
use vm_memory::GuestMemoryMmap;

use super::request::ID_LEN;
use super::worker::{BlockWorker, DiskInfo};
use super::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_SIZE_MAX,
    VIRTIO_ID_BLOCK,
};
use crate::device::{ActivateError, DeviceSignals, QueueWorker, VirtioDevice};
use crate::queue::{Queue, MAX_QUEUE_SIZE};
use crate::{VIRTIO_F_EVENT_IDX, VIRTIO_F_VERSION_1};

/// The largest data descriptor the driver may use (`size_max`).
pub const SIZE_MAX: u32 = 1 << 20;
/// Configuration space: capacity (u64, sectors), size_max, seg_max, geometry, blk_size.
const CONFIG_LEN: usize = 24;

pub struct Block {
    /// `None` while a worker has it.
    backend: Option<Box<dyn Backend>>,
    disk: DiskInfo,
    features: u64,
    config: [u8; CONFIG_LEN],
}

impl Block {
    /// A device over `backend`; `id` is the GET_ID answer (truncated to 20 bytes).
    pub fn new(backend: Box<dyn Backend>, id: &str) -> Block {
        let capacity = backend.capacity();
        let read_only = backend.read_only();
        let mut id_bytes = [0u8; ID_LEN];
        let n = id.len().min(ID_LEN);
        id_bytes[..n].copy_from_slice(&id.as_bytes()[..n]);
        let mut features = 1 << VIRTIO_F_VERSION_1
            | 1 << VIRTIO_F_EVENT_IDX
            | 1 << VIRTIO_BLK_F_SIZE_MAX
            | 1 << VIRTIO_BLK_F_SEG_MAX
            | 1 << VIRTIO_BLK_F_BLK_SIZE
            | 1 << VIRTIO_BLK_F_FLUSH;
        if read_only {
            features |= 1 << VIRTIO_BLK_F_RO;
        }
        let mut config = [0u8; CONFIG_LEN];
        config[0..8].copy_from_slice(&(capacity / SECTOR_SIZE).to_le_bytes());
        config[8..12].copy_from_slice(&SIZE_MAX.to_le_bytes());
        config[12..16].copy_from_slice(&(MAX_SEGMENTS as u32).to_le_bytes());
        config[20..24].copy_from_slice(&(SECTOR_SIZE as u32).to_le_bytes());
        Block {
            backend: Some(backend),
            disk: DiskInfo { capacity, read_only, id: id_bytes },
            features,
            config,
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
        &[MAX_QUEUE_SIZE]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let Ok(start) = usize::try_from(offset) else { return };
        if start >= CONFIG_LEN {
            return;
        }
        let n = data.len().min(CONFIG_LEN - start);
        data[..n].copy_from_slice(&self.config[start..start + n]);
    }

    fn activate(
        &mut self,
        mem: &GuestMemoryMmap,
        queues: Vec<Queue>,
        _features: u64,
        signals: DeviceSignals,
    ) -> Result<Box<dyn QueueWorker>, ActivateError> {
        let queue = queues.into_iter().next().ok_or(ActivateError::NoBackend)?;
        let backend = self.backend.take().ok_or(ActivateError::NoBackend)?;
        Ok(Box::new(BlockWorker::new(queue, mem.clone(), backend, self.disk.clone(), signals)))
    }

    fn deactivate(&mut self, worker: Box<dyn QueueWorker>) {
        if let Ok(worker) = worker.into_any().downcast::<BlockWorker>() {
            self.backend = Some(worker.into_backend());
        }
    }
}
