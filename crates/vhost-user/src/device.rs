//! What a [`Session`](crate::Session) serves: a virtio device model whose rings a frontend starts
//! and stops. The session speaks the protocol and checks every message; the device decides what
//! a ring's worker is and where it runs.

use std::sync::Arc;

use virtio::{DeviceSignals, DeviceStats};
use virtqueue::dirty::DirtyLog;
use virtqueue::queue::Queue;
use vmm_sys_util::eventfd::EventFd;

use crate::error::Error;

/// A ring the session hands to its device to serve, everything about it checked.
pub struct Ring {
    /// The ring over the frontend's memory, resumed where it stopped, tracking its requests in
    /// the in-flight region when one is shared.
    pub queue: Queue,
    /// Where its worker signals completions (the call eventfd), errors (the error eventfd) and
    /// counts what it did.
    pub signals: DeviceSignals,
    /// The dirty log to mark every guest page the worker writes in, while a live migration runs.
    pub log: Option<DirtyLog>,
    /// The eventfd the frontend kicks; `None`: none was given, so the ring must be polled.
    pub kick: Option<Arc<EventFd>>,
}

/// A virtio device model served over vhost-user, across connections: it keeps its state (a
/// disk's storage backends, a NIC's port) between frontends. Called from its connection's
/// thread only; its rings' workers run wherever [`Device::start_ring`] puts them.
pub trait Device: Send {
    /// What the device did, across its rings and connections; named after the device in logs.
    fn stats(&self) -> &Arc<DeviceStats>;

    /// The virtio features of the device model (the session adds the vhost-user ones).
    fn features(&self) -> u64;

    /// The vhost-user protocol features it is served with (GET_PROTOCOL_FEATURES' answer).
    fn protocol_features(&self) -> u64;

    /// How many rings the device has (GET_QUEUE_NUM's answer).
    fn num_queues(&self) -> usize;

    /// The features the frontend acked, 0 until its SET_FEATURES.
    fn driver_features(&mut self, features: u64);

    /// Read configuration space from `offset` into `data` (zeros past its end).
    fn read_config(&self, offset: u64, data: &mut [u8]);

    /// A SET_CONFIG from the driver (`flags` as the frontend sent them), once the session
    /// checked that CONFIG was negotiated. Nothing is writable unless the device says so.
    fn write_config(&mut self, offset: u32, flags: u32, data: &[u8]) -> Result<(), Error> {
        let _ = flags;
        Err(Error::ConfigNotWritable { offset, size: data.len() })
    }

    /// The cache mode the driver chose, on a device with a switch for it (a disk's
    /// VIRTIO_BLK_F_CONFIG_WCE): it outlives connections, and a hand-over carries it.
    fn writeback(&self) -> Option<u8> {
        None
    }

    /// Set the cache mode a predecessor's driver chose (see [`Device::writeback`]).
    fn set_writeback(&mut self, value: u8) -> Result<(), Error> {
        let _ = value;
        Err(Error::NoWritebackSwitch)
    }

    /// The MTU a NIC's frontend gave its guest (NET_SET_MTU, on a device that offers
    /// VHOST_USER_PROTOCOL_F_NET_MTU): refused when the device does not take frames that long.
    fn check_mtu(&mut self, mtu: u64) -> Result<(), Error> {
        let _ = mtu;
        Err(Error::MtuNotNegotiated)
    }

    /// Announce address `mac` on the network for a NIC's guest that moved here in a live
    /// migration and does not announce itself (SEND_RARP, on a device that offers
    /// VHOST_USER_PROTOCOL_F_RARP).
    fn announce(&mut self, mac: [u8; 6]) -> Result<(), Error> {
        let _ = mac;
        Err(Error::RarpNotNegotiated)
    }

    /// Serve ring `index` until [`Device::stop_ring`].
    fn start_ring(&mut self, index: usize, ring: Ring) -> Result<(), Error>;

    /// Stop serving ring `index`, its requests finished or handed back to the device model;
    /// the avail index it stopped at.
    fn stop_ring(&mut self, index: usize) -> Result<u16, Error>;

    /// Requests that the last reset of ring `index` left with the device's backend, whose late
    /// completion could overwrite what a resubmitted copy did; 0 for a device with none.
    fn quarantined(&mut self, index: usize) -> usize {
        let _ = index;
        0
    }

    /// Reap the quarantined requests the backend has finished since; how many it still holds.
    fn reap_quarantined(&mut self) -> usize {
        0
    }
}
