//! virtio for exitless: the virtio-mmio transport and the virtio-blk and virtio-net device
//! models, over the queues of the `virtqueue` crate. Device models do not know which I/O mode
//! drives them: a worker (`virtqueue::QueueWorker`) is polled by whoever owns it (the vCPU
//! thread in `trap` mode, an IOCore thread otherwise).

#![deny(missing_docs)]
#![cfg_attr(not(test), warn(clippy::cast_possible_truncation, clippy::cast_sign_loss))]

pub mod block;
pub mod device;
pub mod interrupt;
pub mod mmio;
pub mod net;
mod worker;

pub use device::{
    ActivateError, DeviceSignals, DeviceStats, DeviceStatsSnapshot, RequestCounters, VirtioDevice, Workers,
    STATS_QUEUES,
};
pub use worker::Worker;

/// Feature bit: descriptors may point to tables of descriptors.
pub const VIRTIO_F_INDIRECT_DESC: u32 = 28;
/// Feature bit: used_event / avail_event notification suppression.
pub const VIRTIO_F_EVENT_IDX: u32 = 29;
/// Feature bit: the device follows virtio 1.x, not the legacy interface (virtio 1.x §6); the
/// mmio transport refuses FEATURES_OK to a driver that does not accept it.
pub const VIRTIO_F_VERSION_1: u32 = 32;
