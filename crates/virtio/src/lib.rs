//! virtio for exitless: split virtqueues over untrusted guest memory, and the virtio-blk device
//! model. The device models do not know which I/O mode drives them.

pub mod block;
pub mod interrupt;
pub mod queue;

pub const VIRTIO_F_EVENT_IDX: u32 = 29;
pub const VIRTIO_F_VERSION_1: u32 = 32;
