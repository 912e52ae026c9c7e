//! virtio-blk: the device model (features, configuration space) and its data path.

pub mod device;
pub mod request;
pub mod worker;

pub use device::{Block, FAIR_BATCH, MAX_QUEUES};
pub use worker::{BlockWorker, DiskInfo};

pub const VIRTIO_ID_BLOCK: u32 = 2;
pub const VIRTIO_BLK_F_SIZE_MAX: u32 = 1;
pub const VIRTIO_BLK_F_SEG_MAX: u32 = 2;
pub const VIRTIO_BLK_F_RO: u32 = 5;
pub const VIRTIO_BLK_F_BLK_SIZE: u32 = 6;
pub const VIRTIO_BLK_F_FLUSH: u32 = 9;
pub const VIRTIO_BLK_F_TOPOLOGY: u32 = 10;
pub const VIRTIO_BLK_F_CONFIG_WCE: u32 = 11;
pub const VIRTIO_BLK_F_MQ: u32 = 12;
pub const VIRTIO_BLK_F_DISCARD: u32 = 13;
pub const VIRTIO_BLK_F_WRITE_ZEROES: u32 = 14;

#[cfg(test)]
mod tests;
