//! Devices on the VM's virtio-mmio bus whose data path is a vhost-user daemon: a disk
//! ([`blk`], `exitless vhost-user-blk` or any vhost-user-blk backend) and a NIC ([`net`],
//! `exitless vhost-user-net` or any vhost-user-net backend). The guest sees the same device as a
//! local one; its rings go straight to the daemon's IOCore.
//!
//! What both share is here ([`Connected`]): the connection and its set-up ([`link`], over
//! [`frontend`]), DRIVER_OK handing the daemon the rings (kicks are the queues' ioeventfds, the
//! call the device's irqfd: neither leaves the kernel), a reset stopping them, and the thread
//! that watches the daemon and connects to the next one when it goes away ([`watch`]).
//!
//! The daemon is not trusted: offered features are cut to those this transport can honour,
//! replies are checked (see [`frontend`]), and every wait has a time limit.

pub mod blk;
pub mod frontend;
pub mod link;
pub mod net;
pub mod watch;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandbox::Filter;
use thiserror::Error;
use virtio::device::read_config_bytes;
use virtio::interrupt::INT_USED_BUFFER;
use virtio::{
    ActivateError, DeviceSignals, VirtioDevice, Worker, Workers, VIRTIO_F_EVENT_IDX, VIRTIO_F_INDIRECT_DESC,
    VIRTIO_F_VERSION_1,
};
use virtqueue::queue::Queue;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

pub use blk::VhostUserDisk;
use frontend::FrontendError;
use link::{Link, Offer, Profile, RingFds};
pub use net::VhostUserNic;
use watch::{Shared, Watcher};

/// Why a vhost-user device could not be set up.
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

/// What the VMM knows of a vhost-user device, for `run --stats`: the daemon serves the rings
/// and raises the interrupts (through the irqfd, which KVM handles), so the VMM does not see
/// them; it sees set-up, reconnections and failures.
#[derive(Debug)]
pub struct VhostUserInfo {
    /// The daemon's socket.
    pub socket: std::path::PathBuf,
    /// Virtio features the driver accepted, last time it started the device.
    pub features: AtomicU64,
    /// Times the driver started the device and the daemon took the rings (DRIVER_OK).
    pub activations: AtomicU64,
    /// The daemon closed the connection while the VM ran, and no other daemon has taken over
    /// (set by the watcher, cleared when it reconnects).
    pub daemon_gone: AtomicBool,
    /// Times a new daemon took the device over after the previous one went away.
    pub reconnections: AtomicU64,
}

/// The features offered to the driver: the daemon's, cut to the ring features this transport
/// supports and the device's `device` features.
fn passed_on<'a>(daemon: u64, device: impl Iterator<Item = &'a u32>) -> u64 {
    const RING: [u32; 3] = [VIRTIO_F_VERSION_1, VIRTIO_F_EVENT_IDX, VIRTIO_F_INDIRECT_DESC];
    let allowed = RING.iter().chain(device).fold(0u64, |m, &b| m | 1 << b);
    daemon & allowed
}

/// A device's connection to its daemon, and the thread that watches it.
pub struct Connected {
    link: Arc<Link>,
    shared: Arc<Shared>,
    info: Arc<VhostUserInfo>,
    /// An address for the daemon to announce once the rings run (a NIC's, restored here).
    announce: Option<[u8; 6]>,
    // Dropped last: stops the watcher, which holds `shared`.
    _watcher: Watcher,
}

impl Connected {
    /// Connect to the daemon on `socket` (running as us, root or `daemon_uid`), waiting up to
    /// `reconnect` for a new one when it goes away, for rings kicked by `kicks` (one per ring,
    /// the queues' ioeventfds) that interrupt through `call` (the device's irqfd); `filter`
    /// confines the watcher thread.
    pub fn connect(
        socket: &Path,
        profile: Profile,
        (daemon_uid, reconnect): (Option<u32>, Duration),
        kicks: Vec<Arc<EventFd>>,
        call: Arc<EventFd>,
        filter: Filter,
    ) -> Result<Connected, VhostUserError> {
        let err = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(VhostUserError::EventFd)?);
        let fds =
            kicks.into_iter().map(|kick| RingFds { kick, call: call.clone(), err: err.clone() }).collect();
        let (link, offer) = Link::connect(socket, profile, daemon_uid, fds)?;
        let link = Arc::new(link);
        let stream = link.stream().map_err(VhostUserError::Thread)?;
        let info = Arc::new(VhostUserInfo {
            socket: socket.to_path_buf(),
            features: AtomicU64::new(0),
            activations: AtomicU64::new(0),
            daemon_gone: AtomicBool::new(false),
            reconnections: AtomicU64::new(0),
        });
        let shared = Arc::new(Shared {
            path: socket.display().to_string(),
            signals: Mutex::new(None),
            info: info.clone(),
            link: link.clone(),
            offer,
            reconnect,
        });
        let watcher =
            Watcher::spawn(stream.into(), err, shared.clone(), filter).map_err(VhostUserError::Thread)?;
        Ok(Connected { link, shared, info, announce: None, _watcher: watcher })
    }

    /// What the first daemon offered.
    pub fn offer(&self) -> &Offer {
        &self.shared.offer
    }

    /// What the VMM knows of the device, kept up to date while it runs.
    pub fn info(&self) -> Arc<VhostUserInfo> {
        self.info.clone()
    }

    /// DRIVER_OK: hand the daemon the rings, every one of `queues` set up by the driver.
    pub fn activate(
        &mut self,
        queues: Vec<Option<Queue>>,
        features: u64,
        signals: DeviceSignals,
    ) -> Result<Workers, ActivateError> {
        let queues = queues
            .into_iter()
            .enumerate()
            .map(|(index, queue)| queue.ok_or(ActivateError::QueueNotReady { index }))
            .collect::<Result<Vec<_>, _>>()?;
        if self.info.daemon_gone.load(Ordering::Acquire) {
            signals.backend_failed(&format!(
                "the vhost-user daemon is gone; the {} cannot start",
                self.link.what()
            ));
            return Err(ActivateError::NoBackend);
        }
        // The daemon is told only of features it offered (the VMM may offer more: a NIC's
        // address is the VMM's).
        if let Err(e) = self.link.start(queues, features & self.shared.offer.features) {
            signals.backend_failed(&format!("cannot start the {}: {e}", self.link.what()));
            return Err(ActivateError::NoBackend);
        }
        if let Some(mac) = self.announce.take() {
            self.link.announce(mac);
        }
        self.info.features.store(features, Ordering::Relaxed);
        self.info.activations.fetch_add(1, Ordering::Relaxed);
        *self.shared.signals.lock().unwrap_or_else(|p| p.into_inner()) = Some(signals);
        // The daemon does the work: the transport has nothing to poll.
        Ok(vec![Some(Worker::Remote)])
    }

    /// Have the daemon announce `mac` once the rings run (SEND_RARP, where it offers it): the
    /// VM was restored here, and the network must learn where the guest now is.
    pub fn announce_when_started(&mut self, mac: [u8; 6]) {
        self.announce = Some(mac);
    }

    /// The VM pauses: the daemon stops the rings and lets go of guest memory.
    pub fn pause(&mut self) {
        self.link.pause();
    }

    /// The VM resumes: the daemon starts the rings again where it stopped them. A daemon gone
    /// meanwhile gets them from the watcher when a new one comes.
    pub fn resume(&mut self) {
        if let Err(e) = self.link.resume() {
            log::warn!("vhost-user {}: the rings did not start again after the pause: {e}", self.link.what());
            if let Some(signals) = &*self.shared.signals.lock().unwrap_or_else(|p| p.into_inner()) {
                signals.backend_failed(&format!("cannot start the {} again: {e}", self.link.what()));
            }
        }
    }

    /// The driver reset the device: stop the rings in the daemon.
    pub fn deactivate(&mut self) {
        *self.shared.signals.lock().unwrap_or_else(|p| p.into_inner()) = None;
        // Also while the daemon is away: a daemon that takes over then gets no ring.
        self.link.stop();
    }
}

/// A virtio device whose data path is a vhost-user daemon ([`blk::connect`], [`net::connect`]):
/// what the driver sees of it (its id, features, configuration space and queues) and the
/// connection that serves it.
pub struct VhostUserDevice {
    connected: Connected,
    device_id: u32,
    /// Features offered to the driver.
    features: u64,
    config: Vec<u8>,
    queue_sizes: Vec<u16>,
}

impl VhostUserDevice {
    /// What the VMM knows of the device, kept up to date while it runs.
    pub fn info(&self) -> Arc<VhostUserInfo> {
        self.connected.info()
    }
}

impl VirtioDevice for VhostUserDevice {
    fn device_id(&self) -> u32 {
        self.device_id
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
        self.connected.activate(queues, features, signals)
    }

    fn deactivate(&mut self, _workers: Workers) {
        self.connected.deactivate();
    }

    fn interrupt_status_while_active(&self) -> u32 {
        // The daemon interrupts through the irqfd: any interrupt may be a used buffer.
        INT_USED_BUFFER
    }

    /// A NIC's daemon announces its address (a disk has nothing to say).
    fn announce(&mut self) {
        if self.device_id == virtio::net::VIRTIO_ID_NET {
            let mut mac = [0u8; 6];
            mac.copy_from_slice(&self.config[..6]);
            self.connected.announce_when_started(mac);
        }
    }

    fn pause(&mut self) {
        self.connected.pause();
    }

    fn resume(&mut self) {
        self.connected.resume();
    }
}
