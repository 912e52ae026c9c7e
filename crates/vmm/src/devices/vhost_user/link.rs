//! A device's connection to its daemon and what its rings were set up with, so that a new
//! connection can be set up the same way when the daemon restarts.
//!
//! The device (on the vCPU's thread: activation and reset) and the watcher (on its own thread:
//! reconnection) share one [`Link`]; its lock is taken only for set-up messages, never on the
//! data path, which is the daemon's.
//!
//! A restarted daemon gets what QEMU's vhost-user devices give one: the same features, memory
//! table and rings, each started at its used ring's index (what the guest has been answered;
//! every buffer after it is offered again), and, when the daemon keeps its requests in flight
//! in shared memory (INFLIGHT_SHMFD, a disk's), the region the old daemon kept, from which it
//! resubmits what was in flight behind a completed request.

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

/// What kind of device a link serves, as the handshake and a reconnection need to know.
#[derive(Clone)]
pub struct Profile {
    /// What the device is called in log lines: "disk", "NIC".
    pub what: &'static str,
    /// Bytes of configuration space read with GET_CONFIG (the CONFIG protocol feature is then
    /// required); `None`: the VMM fills the configuration space itself.
    pub config_size: Option<u32>,
    /// Bytes of the configuration space a restarted daemon must report unchanged (a disk's
    /// capacity: the guest sized its disk by it).
    pub fixed_config: std::ops::Range<usize>,
    /// Whether the daemon's in-flight region is asked for (INFLIGHT_SHMFD, one ring).
    pub inflight: bool,
    /// Whether the daemon is asked to announce an address (RARP: a NIC's, after a restore).
    pub announces: bool,
}

/// What a daemon offers, learnt when connecting.
pub struct Offer {
    /// Its virtio features.
    pub features: u64,
    /// Its configuration space (`Profile::config_size` bytes; empty without).
    pub config: Vec<u8>,
}

/// The eventfds of one ring: they outlive connections, so a new daemon gets the same ones (the
/// kick is the queue's ioeventfd, the call the device's irqfd, the error eventfd the
/// watcher's).
pub struct RingFds {
    pub kick: Arc<EventFd>,
    pub call: Arc<EventFd>,
    pub err: Arc<EventFd>,
}

/// The connection to a device's daemon, replaced when the daemon restarts.
pub struct Link {
    path: PathBuf,
    profile: Profile,
    /// Who the daemon may run as.
    users: DaemonUsers,
    /// Per ring, in ring order.
    fds: Vec<RingFds>,
    state: Mutex<State>,
}

struct State {
    frontend: Frontend,
    /// Protocol features negotiated with this daemon.
    protocol: u64,
    /// The running rings, between activation and reset.
    rings: Option<Rings>,
    /// The rings are stopped in the daemon for a pause (kept for when the VM resumes), at
    /// these avail indices.
    paused_at: Option<Vec<u16>>,
}

/// What the running rings were set up with.
struct Rings {
    /// The queues as the driver set them up (and the guest memory they live in, which they
    /// hold), in ring order.
    queues: Vec<Queue>,
    /// The driver's features.
    features: u64,
    /// The daemon's in-flight region (GET_INFLIGHT_FD), kept for the next daemon.
    inflight: Option<(InflightInfo, OwnedFd)>,
}

impl Link {
    /// Connect to the daemon at `path` (running as the VMM's user, root or `daemon_uid`) and
    /// negotiate what can be before the driver starts; `fds` are its rings'.
    pub fn connect(
        path: &Path,
        profile: Profile,
        daemon_uid: Option<u32>,
        fds: Vec<RingFds>,
    ) -> Result<(Link, Offer), FrontendError> {
        let users = DaemonUsers::of_this_process_and(daemon_uid);
        let (frontend, protocol, offer) = handshake(path, &profile, users)?;
        let state = Mutex::new(State { frontend, protocol, rings: None, paused_at: None });
        Ok((Link { path: path.to_path_buf(), profile, users, fds, state }, offer))
    }

    /// What the device is called in log lines.
    pub fn what(&self) -> &'static str {
        self.profile.what
    }

    /// A second handle on the connection, for watching it for a hang-up.
    pub fn stream(&self) -> std::io::Result<UnixStream> {
        self.state().frontend.stream().try_clone()
    }

    /// Hand the daemon guest memory and the rings the driver set up (DRIVER_OK), one queue per
    /// ring of `RingFds`.
    pub fn start(&self, queues: Vec<Queue>, features: u64) -> Result<(), VhostUserError> {
        let mut state = self.state();
        let State { frontend, protocol, rings, paused_at } = &mut *state;
        (*rings, *paused_at) = (None, None);
        let inflight = match (*protocol & 1 << protocol::INFLIGHT_SHMFD != 0, queues.first()) {
            (true, Some(queue)) => Some(frontend.get_inflight_fd(queue.size())?),
            _ => None,
        };
        // Where the driver left each ring: 0 for a new one, the snapshot's for a restored one.
        let bases: Vec<u16> = queues.iter().map(Queue::next_avail).collect();
        let started = rings.insert(Rings { queues, features, inflight });
        start_rings(frontend, started, &self.fds, |index| bases[index])
    }

    /// Stop the rings in the daemon for a pause (GET_VRING_BASE: it finishes what it took and
    /// lets go of guest memory), keeping them for [`Link::resume`].
    pub fn pause(&self) {
        let mut state = self.state();
        let State { frontend, rings: Some(rings), paused_at: paused_at @ None, .. } = &mut *state else {
            return;
        };
        *paused_at = Some(self.stop_rings(frontend, rings));
    }

    /// Start the rings again after [`Link::pause`], each where the daemon stopped it. A daemon
    /// gone meanwhile gets them from the watcher, as a new one connects.
    pub fn resume(&self) -> Result<(), VhostUserError> {
        let mut state = self.state();
        let State { frontend, rings, paused_at, .. } = &mut *state;
        let (Some(rings), Some(bases)) = (rings.as_ref(), paused_at.take()) else { return Ok(()) };
        if frontend.broken() {
            return Ok(());
        }
        start_rings(frontend, rings, &self.fds, |index| bases[index])
    }

    /// Ask the daemon to announce `mac` on its network (SEND_RARP), where it offers to; the
    /// guest's NIC was restored here and has not sent anything yet.
    pub fn announce(&self, mac: [u8; 6]) {
        let mut state = self.state();
        if state.protocol & 1 << protocol::RARP == 0 {
            return;
        }
        let mut word = [0u8; 8];
        word[..6].copy_from_slice(&mac);
        if let Err(e) = state.frontend.set_u64(code::SEND_RARP, u64::from_le_bytes(word)) {
            log::warn!("vhost-user {}: the daemon did not announce the address: {e}", self.profile.what);
        }
    }

    /// Stop the rings in the daemon (the driver reset the device) and forget them.
    pub fn stop(&self) {
        let mut state = self.state();
        let Some(rings) = state.rings.take() else { return };
        // Stopped for a pause already.
        if state.paused_at.take().is_none() {
            self.stop_rings(&mut state.frontend, &rings);
        }
    }

    /// Stop each of `rings` in the daemon (GET_VRING_BASE): where each stopped in its avail
    /// ring. A daemon that cannot say (gone) holds nothing: the used index, what the guest was
    /// answered, is where the ring stands.
    fn stop_rings(&self, frontend: &mut Frontend, rings: &Rings) -> Vec<u16> {
        let stop = |(index, queue): (usize, &Queue)| {
            if frontend.broken() {
                return queue.used_index();
            }
            match frontend.get_vring_base(index as u32) {
                Ok(base) => u16::try_from(base).unwrap_or_else(|_| queue.used_index()),
                Err(e) => {
                    if !matches!(e, FrontendError::Closed(_)) {
                        let (what, path) = (self.profile.what, self.path.display());
                        log::warn!("vhost-user {what} {path}: cannot stop ring {index}: {e}");
                    }
                    queue.used_index()
                }
            }
        };
        rings.queues.iter().enumerate().map(stop).collect()
    }

    /// One attempt to connect to a (new) daemon and set it up as the old one was: its offer
    /// must still hold the driver's features and the fixed part of the configuration space.
    /// Returns a handle on the new connection to watch, and the used index the first ring
    /// resumed at, if the rings run.
    pub fn reconnect(&self, expected: &Offer) -> Result<(UnixStream, Option<u16>), VhostUserError> {
        let (mut frontend, protocol, offer) = handshake(&self.path, &self.profile, self.users)?;
        let fixed = self.profile.fixed_config.clone();
        if offer.config.get(fixed.clone()) != expected.config.get(fixed) {
            return Err(VhostUserError::Changed("the device's configuration (a disk's capacity)"));
        }
        let mut state = self.state();
        let paused = state.paused_at.is_some();
        let resumed = match &mut state.rings {
            // Paused: the rings start when the VM resumes.
            Some(_) if paused => None,
            Some(rings) => {
                if offer.features & rings.features != rings.features {
                    return Err(VhostUserError::Changed("the features the driver took"));
                }
                if protocol & 1 << protocol::INFLIGHT_SHMFD == 0 {
                    rings.inflight = None;
                }
                let bases: Vec<u16> = rings.queues.iter().map(Queue::used_index).collect();
                start_rings(&mut frontend, rings, &self.fds, |index| bases[index])?;
                bases.first().copied()
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

/// Connect, GET_FEATURES, GET_PROTOCOL_FEATURES (CONFIG is needed where the configuration
/// space comes from the daemon: a disk's capacity), SET_PROTOCOL_FEATURES, SET_OWNER, and
/// GET_CONFIG where it does.
fn handshake(
    path: &Path,
    profile: &Profile,
    users: DaemonUsers,
) -> Result<(Frontend, u64, Offer), FrontendError> {
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
    if profile.config_size.is_some() && offered & 1 << protocol::CONFIG == 0 {
        return Err(missing("the CONFIG protocol feature (the disk's capacity comes from GET_CONFIG)"));
    }
    let mut wanted = 1 << protocol::REPLY_ACK;
    if profile.config_size.is_some() {
        wanted |= 1 << protocol::CONFIG;
    }
    if profile.inflight {
        wanted |= 1 << protocol::INFLIGHT_SHMFD;
    }
    if profile.announces {
        wanted |= 1 << protocol::RARP;
    }
    let protocol = offered & wanted;
    frontend.set_u64(code::SET_PROTOCOL_FEATURES, protocol)?;
    if protocol & 1 << protocol::REPLY_ACK != 0 {
        frontend.use_reply_ack();
    }
    frontend.set_owner()?;
    let config = match profile.config_size {
        Some(size) => frontend.get_config(size)?,
        None => Vec::new(),
    };
    Ok((frontend, protocol, Offer { features, config }))
}

/// Set the daemon up to serve `rings`, ring `i` from avail index `base(i)`: the in-flight
/// region first (as QEMU does), then features, memory table (guest RAM is one memfd, see
/// `memory::create_shared`), and each ring (addresses in the VMM's mapping).
fn start_rings(
    frontend: &mut Frontend,
    rings: &Rings,
    fds: &[RingFds],
    base: impl Fn(usize) -> u16,
) -> Result<(), VhostUserError> {
    if let Some((info, fd)) = &rings.inflight {
        frontend.set_inflight_fd(*info, fd.as_raw_fd())?;
    }
    let Some(first) = rings.queues.first() else { return Ok(()) };
    let mut regions = Vec::new();
    for (index, region) in first.memory().iter().enumerate() {
        let file = region.file_offset().ok_or(VhostUserError::NotShared(index))?;
        let table = MemoryRegion {
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: region.as_ptr() as u64,
            mmap_offset: file.start(),
        };
        regions.push((table, file.file().as_raw_fd()));
    }
    frontend.set_u64(code::SET_FEATURES, rings.features | 1 << VHOST_USER_F_PROTOCOL_FEATURES)?;
    frontend.set_mem_table(&regions)?;
    for (index, (queue, fds)) in rings.queues.iter().zip(fds).enumerate() {
        let ring = index as u32;
        let (desc, avail, used) = queue.host_addresses();
        frontend.set_vring_state(code::SET_VRING_NUM, ring, u32::from(queue.size()))?;
        frontend.set_vring_addr(VringAddr { index: ring, flags: 0, desc, used, avail, log: 0 })?;
        frontend.set_vring_state(code::SET_VRING_BASE, ring, u32::from(base(index)))?;
        frontend.set_vring_fd(code::SET_VRING_CALL, ring, fds.call.as_raw_fd())?;
        frontend.set_vring_fd(code::SET_VRING_ERR, ring, fds.err.as_raw_fd())?;
        frontend.set_vring_fd(code::SET_VRING_KICK, ring, fds.kick.as_raw_fd())?;
        frontend.set_vring_state(code::SET_VRING_ENABLE, ring, 1)?;
    }
    Ok(())
}
