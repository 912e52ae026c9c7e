//! A virtio-blk disk on the VM's virtio-mmio bus whose data path is a vhost-user daemon
//! (`exitless vhost-user-blk`, or any vhost-user-blk backend): the guest sees the same device as
//! a local disk, but requests go from its ring straight to the daemon's IOCore.
//!
//! - Set-up, when the VM is built: connect, GET_FEATURES, GET_PROTOCOL_FEATURES (CONFIG is
//!   needed: the capacity and the rest of the configuration space come from GET_CONFIG),
//!   SET_PROTOCOL_FEATURES, SET_OWNER, GET_CONFIG.
//! - DRIVER_OK (on the vCPU, in the Status write's exit): SET_FEATURES with the driver's
//!   features, SET_MEM_TABLE (guest RAM is one memfd, see `memory::create_shared`), and for the
//!   queue SET_VRING_NUM/ADDR (addresses in the VMM's mapping)/BASE/CALL/ERR/KICK/ENABLE. The
//!   kick is the queue's ioeventfd on QueueNotify (a notification never leaves the kernel), the
//!   call its irqfd (KVM injects the daemon's interrupts itself).
//! - Device reset: GET_VRING_BASE stops the ring in the daemon.
//! - While it runs, a thread watches the ring's error eventfd and the connection: see [`watch`].
//!
//! The daemon is not trusted: offered features are cut to those this transport can honour,
//! replies are checked (see [`frontend`]), and every wait has a time limit.

pub mod frontend;
pub mod watch;

use std::any::Any;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sandbox::Filter;
use thiserror::Error;
use vhost_user_protocol::features::{protocol, VHOST_USER_F_PROTOCOL_FEATURES};
use vhost_user_protocol::message::{code, MemoryRegion, VringAddr};
use virtio::block::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX,
    VIRTIO_BLK_F_SIZE_MAX, VIRTIO_BLK_F_WRITE_ZEROES, VIRTIO_ID_BLOCK,
};
use virtio::device::read_config_bytes;
use virtio::interrupt::INT_USED_BUFFER;
use virtio::queue::{Queue, MAX_QUEUE_SIZE};
use virtio::{
    ActivateError, DeviceSignals, QueueWorker, VirtioDevice, Workers, VIRTIO_F_EVENT_IDX,
    VIRTIO_F_INDIRECT_DESC, VIRTIO_F_VERSION_1,
};
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use frontend::{Frontend, FrontendError};
use watch::{Shared, Watcher};

/// A disk served by the vhost-user daemon listening at `socket` (`--disk vhost-user=SOCKET`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VhostUserDisk {
    /// The daemon's socket for this disk.
    pub socket: PathBuf,
}

/// Bytes of configuration space asked for (struct virtio_blk_config up to `num_queues` and
/// beyond; the driver reads what its features name).
const CONFIG_SIZE: u32 = 60;
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
}

/// What the VMM knows of a vhost-user disk, for `run --stats`: the daemon serves the requests
/// and raises the interrupts (through the irqfd, which KVM handles), so the VMM does not see
/// them; it sees set-up and failures.
#[derive(Debug)]
pub struct VhostUserInfo {
    /// The daemon's socket.
    pub socket: PathBuf,
    /// Virtio features the driver accepted, last time it started the device.
    pub features: AtomicU64,
    /// Times the driver started the device and the daemon took the ring (DRIVER_OK).
    pub activations: AtomicU64,
    /// The daemon closed the connection while the VM ran (set by the watcher).
    pub daemon_gone: AtomicBool,
}

/// The device model: configuration and features from the daemon, the data path with it.
pub struct VhostUserBlk {
    frontend: Frontend,
    /// Features offered to the driver.
    features: u64,
    /// VHOST_USER_F_PROTOCOL_FEATURES, acknowledged back with the driver's features.
    protocol_bit: u64,
    config: Vec<u8>,
    queue_sizes: [u16; 1],
    kick: Arc<EventFd>,
    call: Arc<EventFd>,
    err: Arc<EventFd>,
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
        let mut frontend = Frontend::connect(&disk.socket)?;
        let missing = |what| FrontendError::Missing { path: disk.socket.clone(), what };
        let daemon_features = frontend.get_u64(code::GET_FEATURES)?;
        if daemon_features & 1 << VIRTIO_F_VERSION_1 == 0 {
            return Err(missing("VIRTIO_F_VERSION_1 (a virtio 1.x device)").into());
        }
        if daemon_features & 1 << VHOST_USER_F_PROTOCOL_FEATURES == 0 {
            return Err(missing("protocol features (VHOST_USER_F_PROTOCOL_FEATURES)").into());
        }
        let daemon_protocol = frontend.get_u64(code::GET_PROTOCOL_FEATURES)?;
        if daemon_protocol & 1 << protocol::CONFIG == 0 {
            return Err(
                missing("the CONFIG protocol feature (the disk's capacity comes from GET_CONFIG)").into()
            );
        }
        let protocol = daemon_protocol & (1 << protocol::CONFIG | 1 << protocol::REPLY_ACK);
        frontend.set_u64(code::SET_PROTOCOL_FEATURES, protocol)?;
        if protocol & 1 << protocol::REPLY_ACK != 0 {
            frontend.use_reply_ack();
        }
        frontend.set_owner()?;
        let config = frontend.get_config(CONFIG_SIZE)?;

        let err = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(VhostUserError::EventFd)?);
        let socket = frontend.stream().try_clone().map_err(VhostUserError::Thread)?;
        let info = Arc::new(VhostUserInfo {
            socket: disk.socket.clone(),
            features: AtomicU64::new(0),
            activations: AtomicU64::new(0),
            daemon_gone: AtomicBool::new(false),
        });
        let shared = Arc::new(Shared {
            path: disk.socket.display().to_string(),
            signals: Mutex::new(None),
            info: info.clone(),
        });
        let watcher = Watcher::spawn(socket.into(), err.clone(), shared.clone(), filter)
            .map_err(VhostUserError::Thread)?;
        Ok(VhostUserBlk {
            frontend,
            features: passed_on(daemon_features),
            protocol_bit: 1 << VHOST_USER_F_PROTOCOL_FEATURES,
            config,
            queue_sizes: [MAX_QUEUE_SIZE],
            kick,
            call,
            err,
            shared,
            info,
            _watcher: watcher,
        })
    }

    /// What the VMM knows of the disk, kept up to date while it runs.
    pub fn info(&self) -> Arc<VhostUserInfo> {
        self.info.clone()
    }

    /// Hand the daemon guest memory and the ring (see the module documentation).
    fn start(&mut self, mem: &GuestMemoryMmap, queue: &Queue, features: u64) -> Result<(), VhostUserError> {
        let mut regions = Vec::new();
        for (index, region) in mem.iter().enumerate() {
            let file = region.file_offset().ok_or(VhostUserError::NotShared(index))?;
            let table = MemoryRegion {
                guest_phys_addr: region.start_addr().0,
                memory_size: region.len(),
                userspace_addr: region.as_ptr() as u64,
                mmap_offset: file.start(),
            };
            regions.push((table, file.file().as_raw_fd()));
        }
        let f = &mut self.frontend;
        f.set_u64(code::SET_FEATURES, features | self.protocol_bit)?;
        f.set_mem_table(&regions)?;
        let (desc, avail, used) = queue.host_addresses();
        f.set_vring_state(code::SET_VRING_NUM, 0, u32::from(queue.size()))?;
        f.set_vring_addr(VringAddr { index: 0, flags: 0, desc, used, avail, log: 0 })?;
        f.set_vring_state(code::SET_VRING_BASE, 0, 0)?;
        f.set_vring_fd(code::SET_VRING_CALL, 0, self.call.as_raw_fd())?;
        f.set_vring_fd(code::SET_VRING_ERR, 0, self.err.as_raw_fd())?;
        f.set_vring_fd(code::SET_VRING_KICK, 0, self.kick.as_raw_fd())?;
        f.set_vring_state(code::SET_VRING_ENABLE, 0, 1)?;
        Ok(())
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
        mem: &GuestMemoryMmap,
        queues: Vec<Option<Queue>>,
        features: u64,
        signals: DeviceSignals,
    ) -> Result<Workers, ActivateError> {
        // The frontend offers one queue (`queue_max_sizes`).
        let Some(Some(queue)) = queues.first() else {
            return Err(ActivateError::QueueNotReady { index: 0 });
        };
        if self.info.daemon_gone.load(Ordering::Acquire) {
            signals.backend_failed("the vhost-user daemon is gone; the disk cannot start");
            return Err(ActivateError::NoBackend);
        }
        if let Err(e) = self.start(mem, queue, features) {
            signals.backend_failed(&format!("cannot start the disk: {e}"));
            return Err(ActivateError::NoBackend);
        }
        self.info.features.store(features, Ordering::Relaxed);
        self.info.activations.fetch_add(1, Ordering::Relaxed);
        self.set_signals(Some(signals));
        Ok(vec![Some(Box::new(Remote))])
    }

    fn deactivate(&mut self, _workers: Workers) {
        self.set_signals(None);
        if self.info.daemon_gone.load(Ordering::Acquire) || self.frontend.broken() {
            return;
        }
        match self.frontend.get_vring_base(0) {
            Ok(_) | Err(FrontendError::Closed(_)) => {}
            Err(e) => log::warn!("vhost-user disk {}: cannot stop the ring: {e}", self.shared.path),
        }
    }

    fn interrupt_status_while_active(&self) -> u32 {
        // The daemon interrupts through the irqfd: any interrupt may be a used buffer.
        INT_USED_BUFFER
    }
}

/// The transport's worker for a vhost-user disk: the daemon does the work, so there is nothing
/// to poll (the queue's notifications go to the daemon through the ioeventfd).
struct Remote;

impl QueueWorker for Remote {
    fn poll(&mut self) -> usize {
        0
    }

    fn set_polling(&mut self, _polling: bool) {}

    fn in_flight(&self) -> usize {
        0
    }

    fn has_pending(&self) -> bool {
        false
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
