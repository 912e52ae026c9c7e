//! The virtio-net device model as the transport sees it.

use virtqueue::queue::{Queue, MAX_QUEUE_SIZE};
use vm_memory::GuestMemoryMmap;

use super::backend::NetBackend;
use super::worker::NetWorker;
use super::{mac_text, VIRTIO_ID_NET, VIRTIO_NET_F_MAC};
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

    /// One RARP from the device's MAC, broadcast, as QEMU's self-announce sends after a
    /// migration: a bridge or switch on the way moves the address to this port at once, rather
    /// than sending the VM's frames to where it was until the entry ages out.
    fn announce(&mut self) {
        let Some(backend) = self.backend.as_mut() else { return };
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&self.config[..6]);
        let mut frame = rarp_announcement(mac);
        let part = [libc::iovec { iov_base: frame.as_mut_ptr().cast(), iov_len: frame.len() }];
        if let Err(e) = backend.write_frame(&part) {
            log::warn!("could not announce the NIC's address {} after the restore: {e}", mac_text(mac));
        }
    }

    fn deactivate(&mut self, workers: Workers) {
        if let Some(Some(Worker::Net(worker))) = workers.into_iter().next() {
            self.backend = Some(worker.into_backend());
        }
    }
}

/// The frame QEMU's self-announce sends (`qemu_announce_self`): a broadcast RARP "reverse
/// request" (RFC 903) from and about `mac`, padded to the 60-byte minimum.
pub fn rarp_announcement(mac: [u8; 6]) -> [u8; 60] {
    const ETH_P_RARP: u16 = 0x8035;
    const ARPHRD_ETHER: u16 = 1;
    const ETH_P_IP: u16 = 0x0800;
    const RARP_REQUEST_REVERSE: u16 = 3;
    let mut frame = [0u8; 60];
    frame[..6].fill(0xff);
    frame[6..12].copy_from_slice(&mac);
    frame[12..14].copy_from_slice(&ETH_P_RARP.to_be_bytes());
    frame[14..16].copy_from_slice(&ARPHRD_ETHER.to_be_bytes());
    frame[16..18].copy_from_slice(&ETH_P_IP.to_be_bytes());
    frame[18] = 6; // hardware address length
    frame[19] = 4; // protocol address length
    frame[20..22].copy_from_slice(&RARP_REQUEST_REVERSE.to_be_bytes());
    frame[22..28].copy_from_slice(&mac); // sender's hardware address; its IP (0) follows
    frame[32..38].copy_from_slice(&mac); // target's hardware address; its IP (0) follows
    frame
}
