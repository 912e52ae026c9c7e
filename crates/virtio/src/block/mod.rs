//! virtio-blk: the device model (features, configuration space) and its data path.

pub mod device;
pub mod request;
pub mod worker;

pub use device::{Block, FAIR_BATCH, MAX_QUEUES};
pub use worker::{BlockWorker, DiskInfo};

/// The virtio device ID of a block device (virtio 1.x §5).
pub const VIRTIO_ID_BLOCK: u32 = 2;
// Feature bits (virtio 1.x §5.2.3).
/// `size_max` in configuration space bounds one data segment.
pub const VIRTIO_BLK_F_SIZE_MAX: u32 = 1;
/// `seg_max` in configuration space bounds a request's data segments.
pub const VIRTIO_BLK_F_SEG_MAX: u32 = 2;
/// The disk is read-only: the device fails writes.
pub const VIRTIO_BLK_F_RO: u32 = 5;
/// `blk_size` in configuration space gives the disk's logical block size.
pub const VIRTIO_BLK_F_BLK_SIZE: u32 = 6;
/// The device takes FLUSH requests (its writes may be cached until one).
pub const VIRTIO_BLK_F_FLUSH: u32 = 9;
/// Configuration space gives the optimal I/O alignment and size.
pub const VIRTIO_BLK_F_TOPOLOGY: u32 = 10;
/// The driver may switch the cache between write back and write through (`writeback`).
pub const VIRTIO_BLK_F_CONFIG_WCE: u32 = 11;
/// More than one request queue; `num_queues` in configuration space says how many.
pub const VIRTIO_BLK_F_MQ: u32 = 12;
/// The device takes DISCARD requests, within `max_discard_sectors` and `max_discard_seg`.
pub const VIRTIO_BLK_F_DISCARD: u32 = 13;
/// The device takes WRITE_ZEROES requests, within `max_write_zeroes_sectors` and
/// `max_write_zeroes_seg`.
pub const VIRTIO_BLK_F_WRITE_ZEROES: u32 = 14;

#[cfg(test)]
mod tests;
