//! A virtio-blk disk on the VM's virtio-mmio bus whose data path is a vhost-user daemon
//! (`exitless vhost-user-blk`, or any vhost-user-blk backend): the guest sees the same device as
//! a local disk, but requests go from its ring straight to the daemon's IOCore.
//!
//! - Set-up, when the VM is built: connect and negotiate ([`super::link`]).
//! - DRIVER_OK (on the vCPU, in the Status write's exit): GET_INFLIGHT_FD where the daemon keeps
//!   its requests in flight in shared memory, then SET_INFLIGHT_FD, SET_FEATURES with the
//!   driver's features, SET_MEM_TABLE and the queue's SET_VRING_*. The kick is the queue's
//!   ioeventfd on QueueNotify (a notification never leaves the kernel), the call its irqfd (KVM
//!   injects the daemon's interrupts itself).
//! - Device reset: GET_VRING_BASE stops the ring in the daemon.
//! - While it runs, a thread watches the ring's error eventfd and the connection, and connects
//!   to the next daemon when this one goes away: see [`super::watch`].
//!
//! The daemon is not trusted: offered features are cut to those this transport can honour,
//! replies are checked (see [`super::frontend`]), and every wait has a time limit.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sandbox::Filter;
use virtio::block::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX,
    VIRTIO_BLK_F_SIZE_MAX, VIRTIO_BLK_F_WRITE_ZEROES, VIRTIO_ID_BLOCK,
};
use virtqueue::queue::MAX_QUEUE_SIZE;
use vmm_sys_util::eventfd::EventFd;

use super::link::Profile;
use super::{Connected, VhostUserDevice, VhostUserError};

/// Bytes of configuration space asked for (struct virtio_blk_config up to `num_queues` and
/// beyond; the driver reads what its features name).
const CONFIG_SIZE: u32 = 60;

/// What a disk's link asks of its daemon: its configuration space, whose first 8 bytes (the
/// capacity) a restarted daemon must report unchanged, and its in-flight region.
fn profile() -> Profile {
    Profile {
        what: "disk",
        config_size: Some(CONFIG_SIZE),
        fixed_config: 0..8,
        inflight: true,
        announces: false,
    }
}

/// A disk served by the vhost-user daemon listening at `socket` (`--disk vhost-user=SOCKET`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VhostUserDisk {
    /// The daemon's socket for this disk.
    pub socket: PathBuf,
    /// How long to keep trying to connect to a new daemon on the socket when the daemon goes
    /// away (zero: fail the device at once).
    pub reconnect: Duration,
    /// A user the daemon may run as besides the VMM's own and root (`daemon-uid=UID`): the
    /// connection carries the guest's memory, so nobody else who listens there is served.
    pub daemon_uid: Option<u32>,
}

impl VhostUserDisk {
    /// How long a disk waits for its daemon to come back unless told otherwise: enough for a
    /// daemon restarted by a supervisor.
    pub const DEFAULT_RECONNECT: Duration = Duration::from_secs(10);
}

/// virtio-blk feature bits passed on from the daemon (besides the ring features below): those
/// that need nothing of the transport or the VMM (DISCARD and WRITE_ZEROES are requests the
/// daemon serves, their limits in the configuration space read with GET_CONFIG). Not MQ: this
/// device has one queue.
const BLK_FEATURES: [u32; 7] = [
    VIRTIO_BLK_F_SIZE_MAX,
    VIRTIO_BLK_F_SEG_MAX,
    VIRTIO_BLK_F_RO,
    VIRTIO_BLK_F_BLK_SIZE,
    VIRTIO_BLK_F_FLUSH,
    VIRTIO_BLK_F_DISCARD,
    VIRTIO_BLK_F_WRITE_ZEROES,
];
/// VIRTIO_BLK_F_GEOMETRY and VIRTIO_BLK_F_TOPOLOGY: read-only configuration fields.
const BLK_CONFIG_FEATURES: [u32; 2] = [4, 10];

/// The features offered to the driver: the daemon's, cut to what this transport supports.
fn passed_on(daemon: u64) -> u64 {
    super::passed_on(daemon, BLK_FEATURES.iter().chain(&BLK_CONFIG_FEATURES))
}

/// Connect to the daemon of `disk` and negotiate what can be before the driver starts: the
/// device model, its configuration and features from the daemon. `kick` is the queue's
/// ioeventfd, `call` the device's irqfd; `filter` confines the watcher thread.
pub fn connect(
    disk: &VhostUserDisk,
    kick: Arc<EventFd>,
    call: Arc<EventFd>,
    filter: Filter,
) -> Result<VhostUserDevice, VhostUserError> {
    let connected = Connected::connect(
        &disk.socket,
        profile(),
        (disk.daemon_uid, disk.reconnect),
        vec![kick],
        call,
        filter,
    )?;
    let features = passed_on(connected.offer().features);
    let config = connected.offer().config.clone();
    Ok(VhostUserDevice {
        connected,
        device_id: VIRTIO_ID_BLOCK,
        features,
        config,
        queue_sizes: vec![MAX_QUEUE_SIZE],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vhost_user_protocol::features::VHOST_USER_F_PROTOCOL_FEATURES;
    use virtio::VIRTIO_F_VERSION_1;

    #[test]
    fn only_features_the_transport_honours_are_passed_on() {
        let everything = u64::MAX;
        let passed = passed_on(everything);
        assert_ne!(passed & 1 << VIRTIO_F_VERSION_1, 0);
        assert_ne!(passed & 1 << VIRTIO_BLK_F_FLUSH, 0);
        // Not protocol features, multi-queue, packed rings or platform access.
        for bit in [VHOST_USER_F_PROTOCOL_FEATURES, 12, 33, 34, 63] {
            assert_eq!(passed & 1 << bit, 0, "bit {bit}");
        }
    }
}
