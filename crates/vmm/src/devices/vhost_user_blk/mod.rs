//! A virtio-blk disk on the VM's virtio-mmio bus whose data path is a vhost-user daemon
//! (`exitless vhost-user-blk`, or any vhost-user-blk backend): the guest sees the same device as
//! a local disk, but requests go from its ring straight to the daemon's IOCore.
//!
//! - Set-up, when the VM is built: connect and negotiate ([`link`]).
//! - DRIVER_OK (on the vCPU, in the Status write's exit): GET_INFLIGHT_FD where the daemon keeps
//!   its requests in flight in shared memory, then SET_INFLIGHT_FD, SET_FEATURES with the
//!   driver's features, SET_MEM_TABLE and the queue's SET_VRING_*. The kick is the queue's
//!   ioeventfd on QueueNotify (a notification never leaves the kernel), the call its irqfd (KVM
//!   injects the daemon's interrupts itself).
//! - Device reset: GET_VRING_BASE stops the ring in the daemon.
//! - While it runs, a thread watches the ring's error eventfd and the connection, and connects
//!   to the next daemon when this one goes away: see [`watch`].
//!
//! The daemon is not trusted: offered features are cut to those this transport can honour,
//! replies are checked (see [`frontend`]), and every wait has a time limit.

pub mod frontend;
pub mod link;
pub mod watch;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandbox::Filter;
use thiserror::Error;
use virtio::block::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX,
    VIRTIO_BLK_F_SIZE_MAX, VIRTIO_BLK_F_WRITE_ZEROES, VIRTIO_ID_BLOCK,
};
use virtio::device::read_config_bytes;
use virtio::interrupt::INT_USED_BUFFER;
use virtio::{
    ActivateError, DeviceSignals, VirtioDevice, Worker, Workers, VIRTIO_F_EVENT_IDX, VIRTIO_F_INDIRECT_DESC,
    VIRTIO_F_VERSION_1,
};
use virtqueue::queue::{Queue, MAX_QUEUE_SIZE};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use frontend::FrontendError;
use link::{Link, RingFds};
use watch::{Shared, Watcher};

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
    let ring = [VIRTIO_F_VERSION_1, VIRTIO_F_EVENT_IDX, VIRTIO_F_INDIRECT_DESC];
    let allowed = ring.iter().chain(&BLK_FEATURES).chain(&BLK_CONFIG_FEATURES).fold(0u64, |m, &b| m | 1 << b);
    daemon & allowed
}

/// Why a vhost-user disk could not be set up.
#[derive(Debug, Error)]
pub enum VhostUserError {
    #[error("{0}")]
    Frontend(#[from] FrontendError),
    #[error("cannot create the ring's error eventfd: {0}")]
    EventFd(#[source] std::io::Error),
    #[error("cannot start the thread that watches the vhost-user daemon: {0}")]
    Thread(#[source] std::io::Error),
    #[error("guest memory is not shared (no memfd behind region {0}): a vhost-user daemon cannot map it")]
    NotShared(usize),
    #[error("the new vhost-user daemon changed {0}")]
    Changed(&'static str),
}

/// What the VMM knows of a vhost-user disk, for `run --stats`: the daemon serves the requests
/// and raises the interrupts (through the irqfd, which KVM handles), so the VMM does not see
/// them; it sees set-up, reconnections and failures.
#[derive(Debug)]
pub struct VhostUserInfo {
    /// The daemon's socket.
    pub socket: PathBuf,
    /// Virtio features the driver accepted, last time it started the device.
    pub features: AtomicU64,
    /// Times the driver started the device and the daemon took the ring (DRIVER_OK).
    pub activations: AtomicU64,
    /// The daemon closed the connection while the VM ran, and no other daemon has taken over
    /// (set by the watcher, cleared when it reconnects).
    pub daemon_gone: AtomicBool,
    /// Times a new daemon took the disk over after the previous one went away.
    pub reconnections: AtomicU64,
}

/// The device model: configuration and features from the daemon, the data path with it.
pub struct VhostUserBlk {
    link: Arc<Link>,
    /// Features offered to the driver.
    features: u64,
    config: Vec<u8>,
    queue_sizes: [u16; 1],
    shared: Arc<Shared>,
    info: Arc<VhostUserInfo>,
    // Dropped last: stops the watcher, which holds `shared`.
    _watcher: Watcher,
}

impl VhostUserBlk {
    /// Connect to the daemon of `disk` and negotiate what can be before the driver starts.
    /// `kick` is the queue's ioeventfd, `call` the device's irqfd; `filter` confines the
    /// watcher thread.
    pub fn connect(
        disk: &VhostUserDisk,
        kick: Arc<EventFd>,
        call: Arc<EventFd>,
        filter: Filter,
    ) -> Result<VhostUserBlk, VhostUserError> {
        let err = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(VhostUserError::EventFd)?);
        let (link, offer) =
            Link::connect(&disk.socket, disk.daemon_uid, RingFds { kick, call, err: err.clone() })?;
        let link = Arc::new(link);
        let socket = link.stream().map_err(VhostUserError::Thread)?;
        let info = Arc::new(VhostUserInfo {
            socket: disk.socket.clone(),
            features: AtomicU64::new(0),
            activations: AtomicU64::new(0),
            daemon_gone: AtomicBool::new(false),
            reconnections: AtomicU64::new(0),
        });
        let features = passed_on(offer.features);
        let config = offer.config.clone();
        let shared = Arc::new(Shared {
            path: disk.socket.display().to_string(),
            signals: Mutex::new(None),
            info: info.clone(),
            link: link.clone(),
            offer,
            reconnect: disk.reconnect,
        });
        let watcher =
            Watcher::spawn(socket.into(), err, shared.clone(), filter).map_err(VhostUserError::Thread)?;
        Ok(VhostUserBlk {
            link,
            features,
            config,
            queue_sizes: [MAX_QUEUE_SIZE],
            shared,
            info,
            _watcher: watcher,
        })
    }

    /// What the VMM knows of the disk, kept up to date while it runs.
    pub fn info(&self) -> Arc<VhostUserInfo> {
        self.info.clone()
    }

    fn set_signals(&self, signals: Option<DeviceSignals>) {
        *self.shared.signals.lock().unwrap_or_else(|p| p.into_inner()) = signals;
    }
}

impl VirtioDevice for VhostUserBlk {
    fn device_id(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn features(&self) -> u64 {
        self.features
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_sizes
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data);
    }

    fn activate(
        &mut self,
        _mem: &GuestMemoryMmap,
        queues: Vec<Option<Queue>>,
        features: u64,
        signals: DeviceSignals,
    ) -> Result<Workers, ActivateError> {
        // The frontend offers one queue (`queue_max_sizes`).
        let Some(Some(queue)) = queues.into_iter().next() else {
            return Err(ActivateError::QueueNotReady { index: 0 });
        };
        if self.info.daemon_gone.load(Ordering::Acquire) {
            signals.backend_failed("the vhost-user daemon is gone; the disk cannot start");
            return Err(ActivateError::NoBackend);
        }
        if let Err(e) = self.link.start(queue, features) {
            signals.backend_failed(&format!("cannot start the disk: {e}"));
            return Err(ActivateError::NoBackend);
        }
        self.info.features.store(features, Ordering::Relaxed);
        self.info.activations.fetch_add(1, Ordering::Relaxed);
        self.set_signals(Some(signals));
        // The daemon does the work: the transport's worker has nothing to poll.
        Ok(vec![Some(Worker::Remote)])
    }

    fn deactivate(&mut self, _workers: Workers) {
        self.set_signals(None);
        // Also while the daemon is away: a daemon that takes over then gets no ring.
        self.link.stop();
    }

    fn interrupt_status_while_active(&self) -> u32 {
        // The daemon interrupts through the irqfd: any interrupt may be a used buffer.
        INT_USED_BUFFER
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vhost_user_protocol::features::VHOST_USER_F_PROTOCOL_FEATURES;

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
