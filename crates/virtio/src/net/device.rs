//! The virtio-net device model as the transport sees it.

use virtqueue::queue::{Queue, MAX_QUEUE_SIZE};
use vm_memory::GuestMemoryMmap;

use super::backend::NetBackend;
use super::worker::NetWorker;
use super::{VIRTIO_ID_NET, VIRTIO_NET_F_MAC};
use crate::device::{read_config_bytes, ActivateError, DeviceSignals, VirtioDevice, Workers};
use crate::worker::Worker;
use crate::{VIRTIO_F_EVENT_IDX, VIRTIO_F_VERSION_1};

/// Configuration space: the MAC address and the (unoffered) status word.
const CONFIG_LEN: usize = 8;

/// A virtio-net device: a MAC address in configuration space, a receive and a transmit queue
/// served by one [`NetWorker`], and frames moved through a [`NetBackend`].
pub struct Net {
    /// `None` while a worker has it.
    backend: Option<Box<dyn NetBackend>>,
    config: [u8; CONFIG_LEN],
}

impl Net {
    /// A device whose frames go through `backend` and which offers `mac` to the driver.
    pub fn new(backend: Box<dyn NetBackend>, mac: [u8; 6]) -> Net {
        let mut config = [0u8; CONFIG_LEN];
        config[..6].copy_from_slice(&mac);
        Net { backend: Some(backend), config }
    }
}

impl VirtioDevice for Net {
    fn device_id(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn features(&self) -> u64 {
        1 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_F_EVENT_IDX | 1 << VIRTIO_NET_F_MAC
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[MAX_QUEUE_SIZE, MAX_QUEUE_SIZE]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data)
    }

    fn activate(
        &mut self,
        mem: &GuestMemoryMmap,
        queues: Vec<Option<Queue>>,
        _features: u64,
        signals: DeviceSignals,
    ) -> Result<Workers, ActivateError> {
        // One worker serves both queues: the driver must have made both ready.
        let mut queues = queues.into_iter();
        let rx = queues.next().flatten().ok_or(ActivateError::QueueNotReady { index: 0 })?;
        let tx = queues.next().flatten().ok_or(ActivateError::QueueNotReady { index: 1 })?;
        let backend = self.backend.take().ok_or(ActivateError::NoBackend)?;
        Ok(vec![Some(NetWorker::new(rx, tx, mem.clone(), backend, signals).into())])
    }

    fn deactivate(&mut self, workers: Workers) {
        if let Some(Some(Worker::Net(worker))) = workers.into_iter().next() {
            self.backend = Some(worker.into_backend());
        }
    }
}
