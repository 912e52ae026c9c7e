//! A virtio-net NIC on the VM's virtio-mmio bus whose data path is a vhost-user daemon
//! (`exitless vhost-user-net`, or any vhost-user-net backend): the guest's receive and transmit
//! rings go to the daemon, which switches its frames. Set-up, start, reset and the watcher are
//! the disk's ([`super::Connected`]), with two rings, each kicked by its own ioeventfd.
//!
//! The MAC address is the VMM's (`--net vhost-user=SOCKET,mac=...`), in a configuration space
//! the VMM fills: give the daemon's NIC the same one (`exitless vhost-user-net --nic mac=`), as
//! QEMU's `-device virtio-net-...,mac=` must be.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sandbox::Filter;
use virtio::net::{VIRTIO_ID_NET, VIRTIO_NET_F_MAC};
use virtqueue::queue::MAX_QUEUE_SIZE;
use vmm_sys_util::eventfd::EventFd;

use super::link::Profile;
use super::{Connected, VhostUserDevice, VhostUserError};

/// A NIC served by the vhost-user daemon listening at `socket` (`--net vhost-user=SOCKET`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VhostUserNic {
    /// The daemon's socket for this NIC.
    pub socket: PathBuf,
    /// The address the driver reads.
    pub mac: [u8; 6],
    /// How long to keep trying to connect to a new daemon when the daemon goes away.
    pub reconnect: Duration,
    /// A user the daemon may run as besides the VMM's own and root.
    pub daemon_uid: Option<u32>,
}

/// The configuration space: the MAC address, then the status word (STATUS is not offered).
const CONFIG_LEN: usize = 8;

/// Connect to the daemon of `nic` and negotiate what can be before the driver starts: the
/// device model, the daemon's ring features with the VMM's address. `kicks` are the receive and
/// transmit queues' ioeventfds, `call` the device's irqfd; `filter` confines the watcher thread.
pub fn connect(
    nic: &VhostUserNic,
    kicks: [Arc<EventFd>; 2],
    call: Arc<EventFd>,
    filter: Filter,
) -> Result<VhostUserDevice, VhostUserError> {
    // No configuration space from the daemon, no in-flight region (a frame lost in a restart
    // is as a frame lost on a wire).
    let profile =
        Profile { what: "NIC", config_size: None, fixed_config: 0..0, inflight: false, announces: true };
    let connected = Connected::connect(
        &nic.socket,
        profile,
        (nic.daemon_uid, nic.reconnect),
        kicks.to_vec(),
        call,
        filter,
    )?;
    // The address is this VMM's, whatever the daemon offers.
    let features = super::passed_on(connected.offer().features, [].iter()) | 1 << VIRTIO_NET_F_MAC;
    let mut config = vec![0u8; CONFIG_LEN];
    config[..6].copy_from_slice(&nic.mac);
    Ok(VhostUserDevice {
        connected,
        device_id: VIRTIO_ID_NET,
        features,
        config,
        queue_sizes: vec![MAX_QUEUE_SIZE; 2],
    })
}
