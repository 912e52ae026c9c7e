//! A disk's connection to its daemon and what the ring was set up with, so that a new
//! connection can be set up the same way when the daemon restarts.
//!
//! The device (on the vCPU's thread: activation and reset) and the watcher (on its own thread:
//! reconnection) share one [`Link`]; its lock is taken only for set-up messages, never on the
//! data path, which is the daemon's.
//!
//! A restarted daemon gets what QEMU's vhost-user-blk gives one: the same features, memory table
//! and ring, started at the used ring's index (what the guest has been answered; every request
//! after it is offered again), and, when the daemon keeps its requests in flight in shared
//! memory (INFLIGHT_SHMFD), the region the old daemon kept, from which it resubmits what was in
//! flight behind a completed request.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use vhost_user_protocol::features::{protocol, VHOST_USER_F_PROTOCOL_FEATURES};
use vhost_user_protocol::message::{code, InflightInfo, MemoryRegion, VringAddr};
use virtio::VIRTIO_F_VERSION_1;
use virtqueue::queue::Queue;
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use super::frontend::{DaemonUsers, Frontend, FrontendError};
use super::VhostUserError;

/// Bytes of configuration space asked for (struct virtio_blk_config up to `num_queues` and
/// beyond; the driver reads what its features name).
pub const CONFIG_SIZE: u32 = 60;
/// The capacity: the first 8 bytes of the configuration space, which a restarted daemon must
/// report unchanged (the guest sized its disk by it).
const CAPACITY: std::ops::Range<usize> = 0..8;

/// What a daemon offers, learnt when connecting.
pub struct Offer {
    /// Its virtio features.
    pub features: u64,
    /// Its configuration space ([`CONFIG_SIZE`] bytes).
    pub config: Vec<u8>,
}

/// The eventfds of the disk's one ring: they outlive connections, so a new daemon gets the
/// same ones (the kick is the queue's ioeventfd, the call its irqfd, the error eventfd the
/// watcher's).
pub struct RingFds {
    pub kick: Arc<EventFd>,
    pub call: Arc<EventFd>,
    pub err: Arc<EventFd>,
}

/// The connection to a disk's daemon, replaced when the daemon restarts.
pub struct Link {
    path: PathBuf,
    /// Who the daemon may run as.
    users: DaemonUsers,
    fds: RingFds,
    state: Mutex<State>,
}

struct State {
    frontend: Frontend,
    /// Protocol features negotiated with this daemon.
    protocol: u64,
    /// The running ring, between activation and reset.
    ring: Option<Ring>,
}

/// What a running ring was set up with.
struct Ring {
    /// The queue as the driver set it up (and the guest memory it lives in, which it holds).
    queue: Queue,
    /// The driver's features.
    features: u64,
    /// The daemon's in-flight region (GET_INFLIGHT_FD), kept for the next daemon.
    inflight: Option<(InflightInfo, OwnedFd)>,
}

impl Link {
    /// Connect to the daemon at `path` (running as the VMM's user, root or `daemon_uid`) and
    /// negotiate what can be before the driver starts.
    pub fn connect(
        path: &Path,
        daemon_uid: Option<u32>,
        fds: RingFds,
    ) -> Result<(Link, Offer), FrontendError> {
        let users = DaemonUsers::of_this_process_and(daemon_uid);
        let (frontend, protocol, offer) = handshake(path, users)?;
        let state = Mutex::new(State { frontend, protocol, ring: None });
        Ok((Link { path: path.to_path_buf(), users, fds, state }, offer))
    }

    /// A second handle on the connection, for watching it for a hang-up.
    pub fn stream(&self) -> std::io::Result<UnixStream> {
        self.state().frontend.stream().try_clone()
    }

    /// Hand the daemon guest memory and the ring the driver set up (DRIVER_OK).
    pub fn start(&self, queue: Queue, features: u64) -> Result<(), VhostUserError> {
        let mut state = self.state();
        let State { frontend, protocol, ring } = &mut *state;
        *ring = None;
        let inflight = if *protocol & 1 << protocol::INFLIGHT_SHMFD != 0 {
            Some(frontend.get_inflight_fd(queue.size())?)
        } else {
            None
        };
        let started = ring.insert(Ring { queue, features, inflight });
        start_ring(frontend, started, &self.fds, 0)
    }

    /// Stop the ring in the daemon (the driver reset the device) and forget it.
    pub fn stop(&self) {
        let mut state = self.state();
        if state.ring.take().is_none() || state.frontend.broken() {
            return;
        }
        match state.frontend.get_vring_base(0) {
            Ok(_) | Err(FrontendError::Closed(_)) => {}
            Err(e) => log::warn!("vhost-user disk {}: cannot stop the ring: {e}", self.path.display()),
        }
    }

    /// One attempt to connect to a (new) daemon and set it up as the old one was: its offer
    /// must still hold the driver's features and the disk's capacity. Returns a handle on the
    /// new connection to watch, and the used index the ring resumed at, if one runs.
    pub fn reconnect(&self, expected: &Offer) -> Result<(UnixStream, Option<u16>), VhostUserError> {
        let (mut frontend, protocol, offer) = handshake(&self.path, self.users)?;
        if offer.config.get(CAPACITY) != expected.config.get(CAPACITY) {
            return Err(VhostUserError::Changed("the disk's capacity"));
        }
        let mut state = self.state();
        let resumed = match &mut state.ring {
            Some(ring) => {
                if offer.features & ring.features != ring.features {
                    return Err(VhostUserError::Changed("the features the driver took"));
                }
                if protocol & 1 << protocol::INFLIGHT_SHMFD == 0 {
                    ring.inflight = None;
                }
                let base = ring.queue.used_index();
                start_ring(&mut frontend, ring, &self.fds, base)?;
                Some(base)
            }
            None => None,
        };
        let stream = frontend.stream().try_clone().map_err(VhostUserError::Thread)?;
        state.frontend = frontend;
        state.protocol = protocol;
        Ok((stream, resumed))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Connect, GET_FEATURES, GET_PROTOCOL_FEATURES (CONFIG is needed: the capacity and the rest of
/// the configuration space come from GET_CONFIG), SET_PROTOCOL_FEATURES, SET_OWNER, GET_CONFIG.
fn handshake(path: &Path, users: DaemonUsers) -> Result<(Frontend, u64, Offer), FrontendError> {
    let mut frontend = Frontend::connect(path, users)?;
    let missing = |what| FrontendError::Missing { path: path.to_path_buf(), what };
    let features = frontend.get_u64(code::GET_FEATURES)?;
    if features & 1 << VIRTIO_F_VERSION_1 == 0 {
        return Err(missing("VIRTIO_F_VERSION_1 (a virtio 1.x device)"));
    }
    if features & 1 << VHOST_USER_F_PROTOCOL_FEATURES == 0 {
        return Err(missing("protocol features (VHOST_USER_F_PROTOCOL_FEATURES)"));
    }
    let offered = frontend.get_u64(code::GET_PROTOCOL_FEATURES)?;
    if offered & 1 << protocol::CONFIG == 0 {
        return Err(missing("the CONFIG protocol feature (the disk's capacity comes from GET_CONFIG)"));
    }
    let wanted = 1 << protocol::CONFIG | 1 << protocol::REPLY_ACK | 1 << protocol::INFLIGHT_SHMFD;
    let protocol = offered & wanted;
    frontend.set_u64(code::SET_PROTOCOL_FEATURES, protocol)?;
    if protocol & 1 << protocol::REPLY_ACK != 0 {
        frontend.use_reply_ack();
    }
    frontend.set_owner()?;
    let config = frontend.get_config(CONFIG_SIZE)?;
    Ok((frontend, protocol, Offer { features, config }))
}

/// Set the daemon up to serve `ring` from avail index `base`: its in-flight region first (as
/// QEMU does), then features, memory table (guest RAM is one memfd, see
/// `memory::create_shared`), and the ring (addresses in the VMM's mapping).
fn start_ring(frontend: &mut Frontend, ring: &Ring, fds: &RingFds, base: u16) -> Result<(), VhostUserError> {
    if let Some((info, fd)) = &ring.inflight {
        frontend.set_inflight_fd(*info, fd.as_raw_fd())?;
    }
    let mut regions = Vec::new();
    for (index, region) in ring.queue.memory().iter().enumerate() {
        let file = region.file_offset().ok_or(VhostUserError::NotShared(index))?;
        let table = MemoryRegion {
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: region.as_ptr() as u64,
            mmap_offset: file.start(),
        };
        regions.push((table, file.file().as_raw_fd()));
    }
    frontend.set_u64(code::SET_FEATURES, ring.features | 1 << VHOST_USER_F_PROTOCOL_FEATURES)?;
    frontend.set_mem_table(&regions)?;
    let (desc, avail, used) = ring.queue.host_addresses();
    frontend.set_vring_state(code::SET_VRING_NUM, 0, u32::from(ring.queue.size()))?;
    frontend.set_vring_addr(VringAddr { index: 0, flags: 0, desc, used, avail, log: 0 })?;
    frontend.set_vring_state(code::SET_VRING_BASE, 0, u32::from(base))?;
    frontend.set_vring_fd(code::SET_VRING_CALL, 0, fds.call.as_raw_fd())?;
    frontend.set_vring_fd(code::SET_VRING_ERR, 0, fds.err.as_raw_fd())?;
    frontend.set_vring_fd(code::SET_VRING_KICK, 0, fds.kick.as_raw_fd())?;
    frontend.set_vring_state(code::SET_VRING_ENABLE, 0, 1)?;
    Ok(())
}
