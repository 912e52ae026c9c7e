//! A vhost-user connection's state machine, driving a [`Device`] by a frontend's messages instead
//! of a virtio transport's registers.
//!
//! The device outlives connections. A [`Session`] is one connection's state: negotiated
//! features, the memory table, and per vring its size, addresses, base, eventfds and whether it
//! runs. A ring runs (the device's worker serving it, waiting on the kick eventfd and raising
//! the call eventfd) once it is started (SET_VRING_KICK), enabled, set up and memory is mapped;
//! GET_VRING_BASE, disabling it, a new kick descriptor, a new memory table or the end of the
//! session stop it, and the device takes the ring back (a disk's in-flight requests finish
//! first, so the next connection finds every acknowledged write on the disk).

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::Arc;

use virtio::interrupt::InterruptLine;
use virtio::{DeviceSignals, VIRTIO_F_EVENT_IDX, VIRTIO_F_INDIRECT_DESC};
use virtqueue::queue::{Queue, QueueConfig, MAX_QUEUE_SIZE};
use vmm_sys_util::eventfd::EventFd;

use crate::device::{Device, Ring};
use crate::error::Error;
use crate::inflight::InflightRegion;
use crate::log::LogRegion;
use crate::memory::GuestMemoryTable;
use vhost_user_protocol::features::{protocol, VHOST_F_LOG_ALL, VHOST_USER_F_PROTOCOL_FEATURES};
use vhost_user_protocol::message::{Message, Request, VringAddr, MAX_CONFIG_SIZE, VRING_F_LOG};

/// The protocol features every device is served with: several rings, live migration's dirty
/// log, and acknowledged requests.
pub const BASE_PROTOCOL_FEATURES: u64 =
    1 << protocol::MQ | 1 << protocol::LOG_SHMFD | 1 << protocol::REPLY_ACK;

/// The protocol features the block device offers: the base ones, configuration space (its
/// cache-mode switch) and in-flight tracking (a restarted daemon resubmits what it held).
pub const OFFERED_PROTOCOL_FEATURES: u64 =
    BASE_PROTOCOL_FEATURES | 1 << protocol::CONFIG | 1 << protocol::INFLIGHT_SHMFD;

/// The virtio features a session offers for `device` (GET_FEATURES' answer): the device model's,
/// protocol features, and dirty logging for live migration.
pub fn offered_features(device: &dyn Device) -> u64 {
    device.features() | 1 << VHOST_USER_F_PROTOCOL_FEATURES | 1 << VHOST_F_LOG_ALL
}

/// One vring's state in a session.
#[derive(Default)]
pub(crate) struct Vring {
    /// 0 until SET_VRING_NUM.
    pub(crate) size: u16,
    pub(crate) addr: Option<VringAddr>,
    /// The next avail index to serve: set by SET_VRING_BASE, updated when the ring stops.
    pub(crate) base: u16,
    /// Set by SET_VRING_KICK (`Some(None)`: no descriptor, the IOCore must poll); `None` while
    /// the ring is stopped.
    pub(crate) kick: Option<Option<Arc<EventFd>>>,
    /// The call and error eventfds the worker writes. Their descriptor numbers stay fixed for
    /// the session; a new SET_VRING_CALL/ERR duplicates the frontend's descriptor onto them
    /// (dup3 replaces it atomically), so a running worker follows the change with no
    /// synchronisation on its path.
    pub(crate) call: Option<Arc<EventFd>>,
    pub(crate) err: Option<Arc<EventFd>>,
    /// SET_VRING_ENABLE's last word; before it, the protocol's default applies.
    pub(crate) enabled: Option<bool>,
    /// The worker is with the IOCore.
    pub(crate) running: bool,
    /// The ring waits to start until its disk finishes the requests quarantined at its last
    /// reset (see `Session::try_start`).
    awaiting_quarantine: bool,
}

/// One connection's protocol state. Dropping it stops every running ring.
pub struct Session<'a> {
    pub(crate) device: &'a mut dyn Device,
    pub(crate) protocol_features: u64,
    /// Acked virtio features (SET_FEATURES).
    pub(crate) features: Option<u64>,
    pub(crate) memory: Option<GuestMemoryTable>,
    pub(crate) vrings: Vec<Vring>,
    /// See [`Session::set_up`].
    set_up: bool,
    /// The in-flight tracking region (SET_INFLIGHT_FD, or GET_INFLIGHT_FD's own).
    pub(crate) inflight: Option<Arc<InflightRegion>>,
    /// The dirty log (SET_LOG_BASE); rings log into it while VHOST_F_LOG_ALL is acked.
    log: Option<Arc<LogRegion>>,
    /// A descriptor to send with the reply to the message just handled.
    reply_fd: Option<std::os::fd::RawFd>,
    /// Rings are not started while held (see [`Session::hold`]).
    held: bool,
    /// The session went to a successor, which serves its rings (and in-flight region) now.
    handed_over: bool,
}

/// Replace the descriptor behind `slot` with `fd` (or a fresh eventfd nobody reads, for "no
/// descriptor"), creating the slot on first use.
fn install_fd(slot: &mut Option<Arc<EventFd>>, fd: Option<OwnedFd>) -> Result<(), Error> {
    let fd = match fd {
        Some(fd) => fd,
        None => {
            let event = EventFd::new(libc::EFD_NONBLOCK).map_err(Error::EventFd)?;
            // SAFETY: `into_raw_fd` hands over the open descriptor the EventFd owned.
            unsafe { OwnedFd::from_raw_fd(event.into_raw_fd()) }
        }
    };
    match slot {
        None => {
            // SAFETY: `fd` is an open descriptor we own; the EventFd takes over its ownership.
            let event = unsafe { EventFd::from_raw_fd(fd.into_raw_fd()) };
            *slot = Some(Arc::new(event));
        }
        Some(event) => {
            // SAFETY: both descriptors are open; dup3 atomically makes `event`'s number refer
            // to `fd`'s file (closing the old one), and `fd` is closed when dropped below.
            let rc = unsafe { libc::dup3(fd.as_raw_fd(), event.as_raw_fd(), libc::O_CLOEXEC) };
            if rc < 0 {
                return Err(Error::EventFd(std::io::Error::last_os_error()));
            }
        }
    }
    Ok(())
}

/// Check that a descriptor the frontend gave as a ring's kick, call or error notifier is an
/// eventfd, and make it non-blocking. The IOCore reads and writes these on its serving path: a
/// pipe nobody reads would block it, a hung-up socket would wake it for ever, and even a real
/// eventfd blocks a writer once the frontend has run its counter up to the maximum.
fn frontend_eventfd(fd: OwnedFd, index: usize, what: &'static str) -> Result<OwnedFd, Error> {
    check_eventfd(&fd).map_err(|found| Error::NotAnEventFd { index, what, found })?;
    // SAFETY: F_GETFL/F_SETFL on a descriptor we own.
    let rc = unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags < 0 {
            flags
        } else {
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK)
        }
    };
    if rc < 0 {
        return Err(Error::EventFd(std::io::Error::last_os_error()));
    }
    Ok(fd)
}

/// Is `fd` an eventfd? `Err`: what it is instead.
fn check_eventfd(fd: &OwnedFd) -> Result<(), String> {
    let target = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|e| format!("unknown: /proc/self/fd says {e}"))?;
    if target.as_os_str() != "anon_inode:[eventfd]" {
        return Err(target.display().to_string());
    }
    Ok(())
}

impl<'a> Session<'a> {
    /// Start a connection's state for `device`.
    pub fn new(device: &'a mut dyn Device) -> Session<'a> {
        let queues = device.num_queues();
        // Until this frontend's SET_FEATURES, it has taken no optional request type.
        device.driver_features(0);
        Session {
            device,
            protocol_features: 0,
            features: None,
            memory: None,
            vrings: (0..queues).map(|_| Vring::default()).collect(),
            set_up: false,
            inflight: None,
            log: None,
            reply_fd: None,
            held: false,
            handed_over: false,
        }
    }

    fn offered_features(&self) -> u64 {
        offered_features(self.device)
    }

    /// Has the frontend negotiated its features (SET_PROTOCOL_FEATURES or SET_FEATURES) or
    /// shared its memory? The server drops a connection that has not within its set-up time.
    pub fn set_up(&self) -> bool {
        self.set_up
    }

    /// Becomes readable when the frontend's memory shrank under a mapped region (see
    /// [`crate::memory`]); `None` before SET_MEM_TABLE.
    pub fn memory_fault(&self) -> Option<BorrowedFd<'_>> {
        self.memory.as_ref().map(GuestMemoryTable::fault)
    }

    /// The frontend's memory shrank: tell it through every ring's error eventfd (the device
    /// needs a reset) and return the error that ends the connection.
    pub fn memory_shrank(&mut self) -> Error {
        for err in self.vrings.iter().filter_map(|v| v.err.as_ref()) {
            let _ = err.write(1);
        }
        Error::MemoryShrank
    }

    /// The protocol features the frontend set (SET_PROTOCOL_FEATURES); 0 before.
    pub fn protocol_features(&self) -> u64 {
        self.protocol_features
    }

    /// The descriptor to attach to the reply `handle` just returned (GET_INFLIGHT_FD's region),
    /// valid while the session lives.
    pub fn take_reply_fd(&mut self) -> Option<std::os::fd::RawFd> {
        self.reply_fd.take()
    }

    /// The in-flight tracking region, once set.
    pub fn inflight_region(&self) -> Option<&Arc<InflightRegion>> {
        self.inflight.as_ref()
    }

    /// The dirty log the frontend gave (SET_LOG_BASE), whether or not logging is on.
    pub(crate) fn dirty_log(&self) -> Option<&Arc<LogRegion>> {
        self.log.as_ref()
    }

    /// Is dirty logging on: VHOST_F_LOG_ALL acked and a log given? Rings started then mark
    /// every guest page they write.
    pub fn logging(&self) -> bool {
        self.log.is_some() && self.features.is_some_and(|f| f & 1 << VHOST_F_LOG_ALL != 0)
    }

    /// Does the log (if logging) cover every guest-physical address of the memory table?
    fn check_log_covers_memory(&self) -> Result<(), Error> {
        let (Some(log), Some(memory)) = (&self.log, &self.memory) else { return Ok(()) };
        let needed = memory
            .regions()
            .iter()
            .map(|r| r.guest_phys_addr.saturating_add(r.memory_size))
            .max()
            .unwrap_or(0);
        if log.covers() < needed {
            return Err(Error::LogTooSmall { covers: log.covers(), needed });
        }
        Ok(())
    }

    /// Stop and start again the running rings `which` picks, so that their workers take the
    /// session's current memory and log; each resumes where it stopped.
    fn restart(&mut self, which: impl Fn(usize) -> bool) -> Result<(), Error> {
        let running: Vec<usize> =
            (0..self.vrings.len()).filter(|&i| self.vrings[i].running && which(i)).collect();
        for &index in &running {
            self.stop(index)?;
        }
        for index in running {
            self.try_start(index)?;
        }
        Ok(())
    }

    fn inflight_negotiated(&self) -> bool {
        self.protocol_features & 1 << protocol::INFLIGHT_SHMFD != 0
    }

    /// Did the frontend negotiate REPLY_ACK?
    pub fn reply_ack(&self) -> bool {
        self.protocol_features & 1 << protocol::REPLY_ACK != 0
    }

    /// Is vring `index` being served?
    pub fn running(&self, index: usize) -> bool {
        self.vrings.get(index).is_some_and(|v| v.running)
    }

    fn vring_index(&self, index: u64) -> Result<usize, Error> {
        match usize::try_from(index) {
            Ok(i) if i < self.vrings.len() => Ok(i),
            _ => Err(Error::BadVringIndex { index, queues: self.vrings.len() }),
        }
    }

    /// Handle one message; `Some(payload)` is the reply to send.
    pub fn handle(&mut self, message: Message) -> Result<Option<Vec<u8>>, Error> {
        let u64_reply = |v: u64| Ok(Some(v.to_le_bytes().to_vec()));
        self.reply_fd = None;
        match message.request {
            Request::GetInflightFd(info) => {
                if !self.inflight_negotiated() {
                    return Err(Error::InflightNotNegotiated("GET_INFLIGHT_FD"));
                }
                let (region, reply) = InflightRegion::create(info, self.vrings.len())?;
                self.reply_fd = Some(region.fd().as_raw_fd());
                // Rings started from now on track into it; running ones keep their region.
                self.inflight = Some(region);
                Ok(Some(reply.to_bytes().to_vec()))
            }
            Request::SetInflightFd(info, fd) => {
                if !self.inflight_negotiated() {
                    return Err(Error::InflightNotNegotiated("SET_INFLIGHT_FD"));
                }
                if let Some(index) = self.vrings.iter().position(|v| v.running) {
                    return Err(Error::RingRunning(index));
                }
                self.inflight = Some(InflightRegion::map(info, fd, self.vrings.len())?);
                Ok(None)
            }
            Request::GetFeatures => u64_reply(self.offered_features()),
            Request::SetFeatures(features) => {
                let offered = self.offered_features();
                if features & !offered != 0 {
                    return Err(Error::FeaturesNotOffered { requested: features, offered });
                }
                let was_logging = self.logging();
                self.features = Some(features);
                self.device.driver_features(features);
                self.set_up = true;
                // Migration starts or ends: running rings switch logging on or off.
                if self.logging() != was_logging {
                    self.restart(|_| true)?;
                }
                Ok(None)
            }
            Request::GetProtocolFeatures => u64_reply(self.device.protocol_features()),
            Request::SetProtocolFeatures(features) => {
                let offered = self.device.protocol_features();
                if features & !offered != 0 {
                    return Err(Error::ProtocolFeaturesNotOffered { requested: features, offered });
                }
                self.protocol_features = features;
                self.set_up = true;
                Ok(None)
            }
            Request::NetSetMtu(mtu) => {
                if self.protocol_features & 1 << protocol::NET_MTU == 0 {
                    return Err(Error::MtuNotNegotiated);
                }
                self.device.check_mtu(mtu)?;
                Ok(None)
            }
            Request::SendRarp(mac) => {
                if self.protocol_features & 1 << protocol::RARP == 0 {
                    return Err(Error::RarpNotNegotiated);
                }
                self.device.announce(mac)?;
                Ok(None)
            }
            Request::SetLogBase { mmap_size, mmap_offset, fd } => {
                if self.protocol_features & 1 << protocol::LOG_SHMFD == 0 {
                    return Err(Error::LogNotNegotiated("SET_LOG_BASE"));
                }
                let log = LogRegion::map(mmap_size, mmap_offset, fd)?;
                let old = self.log.replace(log);
                if let Err(e) = self.check_log_covers_memory() {
                    self.log = old;
                    return Err(e);
                }
                // Rings logging into the old log move to the new one (the old stays mapped
                // until their workers let go of it).
                if self.logging() {
                    self.restart(|_| true)?;
                }
                // QEMU waits for this reply (libvhost-user sends a u64 0) before it drops the
                // old log.
                u64_reply(0)
            }
            Request::SetLogFd(fd) => {
                // The backend does not signal it (the frontend reads the log when it syncs),
                // but checks it and closes it.
                check_eventfd(&fd).map_err(|found| Error::LogFdNotEventFd { found })?;
                Ok(None)
            }
            Request::SetOwner => Ok(None),
            Request::ResetOwner => {
                self.stop_all()?;
                self.features = None;
                self.protocol_features = 0;
                self.memory = None;
                self.inflight = None;
                self.log = None;
                self.vrings.iter_mut().for_each(|v| *v = Vring::default());
                Ok(None)
            }
            Request::GetQueueNum => u64_reply(self.vrings.len() as u64),
            Request::SetMemTable(table) => {
                let memory = GuestMemoryTable::map(table)?;
                self.set_up = true;
                self.memory = Some(memory);
                // Running rings move to the new mapping (their workers hold the old one until
                // they stop), where they were.
                self.restart(|_| true)?;
                Ok(None)
            }
            Request::SetVringNum { index, num } => {
                let index = self.vring_index(index as u64)?;
                let valid = num > 0 && num <= MAX_QUEUE_SIZE as u32 && num.is_power_of_two();
                if !valid {
                    return Err(Error::BadRingSize { index, size: num, max: MAX_QUEUE_SIZE });
                }
                let vring = &mut self.vrings[index];
                if vring.running && vring.size as u32 != num {
                    return Err(Error::RingRunning(index));
                }
                // Checked above: at most MAX_QUEUE_SIZE.
                vring.size = u16::try_from(num).unwrap_or(MAX_QUEUE_SIZE);
                Ok(None)
            }
            Request::SetVringAddr(addr) => {
                let index = self.vring_index(addr.index as u64)?;
                if addr.flags & !VRING_F_LOG != 0 {
                    return Err(Error::BadVringFlags { index, flags: addr.flags });
                }
                let vring = &mut self.vrings[index];
                let same_rings =
                    |old: &VringAddr| (old.desc, old.avail, old.used) == (addr.desc, addr.avail, addr.used);
                if vring.running && !vring.addr.as_ref().is_some_and(same_rings) {
                    return Err(Error::RingRunning(index));
                }
                // A running ring may start or stop logging its used ring (migration).
                let log_changed =
                    vring.addr.is_some_and(|old| (old.flags, old.log) != (addr.flags, addr.log));
                vring.addr = Some(addr);
                if log_changed && self.logging() {
                    self.restart(|i| i == index)?;
                }
                Ok(None)
            }
            Request::SetVringBase { index, num } => {
                let index = self.vring_index(index as u64)?;
                let base = u16::try_from(num).map_err(|_| Error::BadRingBase { index, base: num })?;
                let vring = &mut self.vrings[index];
                if vring.running {
                    return Err(Error::RingRunning(index));
                }
                vring.base = base;
                Ok(None)
            }
            Request::GetVringBase { index } => {
                let index = self.vring_index(index as u64)?;
                self.stop(index)?;
                let vring = &mut self.vrings[index];
                vring.kick = None;
                let mut reply = Vec::with_capacity(8);
                // `vring_index` took it from a u32.
                reply.extend_from_slice(&u32::try_from(index).unwrap_or(u32::MAX).to_le_bytes());
                reply.extend_from_slice(&(vring.base as u32).to_le_bytes());
                Ok(Some(reply))
            }
            Request::SetVringKick { index, fd } => {
                let index = self.vring_index(index)?;
                let kick = match fd {
                    Some(fd) => {
                        let fd = frontend_eventfd(fd, index, "kick")?;
                        // SAFETY: `fd` is an open descriptor we own; the EventFd takes it over.
                        let event = unsafe { EventFd::from_raw_fd(fd.into_raw_fd()) };
                        Some(Arc::new(event))
                    }
                    None => None,
                };
                // A running ring takes the new descriptor by being attached again.
                self.stop(index)?;
                self.vrings[index].kick = Some(kick);
                self.try_start(index)?;
                Ok(None)
            }
            Request::SetVringCall { index, fd } => {
                let index = self.vring_index(index)?;
                let fd = fd.map(|fd| frontend_eventfd(fd, index, "call")).transpose()?;
                install_fd(&mut self.vrings[index].call, fd)?;
                Ok(None)
            }
            Request::SetVringErr { index, fd } => {
                let index = self.vring_index(index)?;
                let fd = fd.map(|fd| frontend_eventfd(fd, index, "error")).transpose()?;
                install_fd(&mut self.vrings[index].err, fd)?;
                Ok(None)
            }
            Request::SetVringEnable { index, num } => {
                let index = self.vring_index(index as u64)?;
                let enable = match num {
                    0 => false,
                    1 => true,
                    value => return Err(Error::BadEnable { index, value }),
                };
                self.vrings[index].enabled = Some(enable);
                if enable {
                    self.try_start(index)?;
                } else {
                    self.stop(index)?;
                }
                Ok(None)
            }
            Request::GetConfig { offset, size, flags } => {
                if offset.checked_add(size).is_none_or(|end| end > MAX_CONFIG_SIZE) {
                    return Err(Error::ConfigRange { offset, size });
                }
                let mut reply = vec![0u8; 12 + size as usize];
                reply[0..4].copy_from_slice(&offset.to_le_bytes());
                reply[4..8].copy_from_slice(&size.to_le_bytes());
                reply[8..12].copy_from_slice(&flags.to_le_bytes());
                self.device.read_config(offset as u64, &mut reply[12..]);
                Ok(Some(reply))
            }
            Request::SetConfig { offset, flags, data } => {
                self.set_config(offset, flags, &data)?;
                Ok(None)
            }
        }
    }

    /// SET_CONFIG: the device says what, if anything, is writable.
    fn set_config(&mut self, offset: u32, flags: u32, data: &[u8]) -> Result<(), Error> {
        if self.protocol_features & 1 << protocol::CONFIG == 0 {
            return Err(Error::ConfigNotNegotiated);
        }
        self.device.write_config(offset, flags, data)
    }

    /// Is the ring enabled? Without protocol features rings start enabled; with them, disabled
    /// until SET_VRING_ENABLE.
    fn enabled(&self, index: usize) -> bool {
        let protocol = self.features.is_some_and(|f| f & 1 << VHOST_USER_F_PROTOCOL_FEATURES != 0);
        self.vrings[index].enabled.unwrap_or(!protocol)
    }

    /// Start no ring until [`Session::release`]: a successor rebuilding the session a
    /// predecessor hands over replays its messages while the predecessor may still take the
    /// rings back.
    pub fn hold(&mut self) {
        self.held = true;
    }

    /// Start every ring that can start (after [`Session::hold`], or after they were stopped
    /// for a hand-over that did not happen), and wake each once: a kick the frontend sent while
    /// the rings changed hands may have been taken by the IOCore that stopped serving them.
    pub fn release(&mut self) -> Result<(), Error> {
        self.held = false;
        for index in 0..self.vrings.len() {
            self.try_start(index)?;
            if let Some(Some(kick)) = self.vrings[index].kick.as_ref().filter(|_| self.vrings[index].running)
            {
                let _ = kick.write(1);
            }
        }
        Ok(())
    }

    /// Stop every ring, each finishing the requests it holds (within the disk's reset
    /// timeout), keeping what restarts them; logs what the in-flight region still marks.
    pub(crate) fn stop_rings(&mut self) -> Result<(), Error> {
        self.stop_all()?;
        if let Some(region) = &self.inflight {
            log::info!(
                "{}: rings stopped for a hand-over; the in-flight region marks {} request(s) in flight",
                self.device.stats().name(),
                region.count_in_flight()
            );
        }
        Ok(())
    }

    /// The successor has the session: its rings and in-flight region are no longer this
    /// session's to report on.
    pub(crate) fn set_handed_over(&mut self) {
        self.handed_over = true;
    }

    /// Start serving ring `index` if everything it needs is there.
    fn try_start(&mut self, index: usize) -> Result<(), Error> {
        if self.held {
            return Ok(());
        }
        let enabled = self.enabled(index);
        let vring = &self.vrings[index];
        let (Some(memory), Some(addr), Some(kick)) = (&self.memory, vring.addr, &vring.kick) else {
            return Ok(());
        };
        if vring.running || !enabled || vring.size == 0 {
            return Ok(());
        }
        let size = vring.size as u64;
        let translate = |what, addr: u64, len: u64| {
            memory.translate(addr, len).ok_or(Error::Unmapped { index, what, addr })
        };
        let config = QueueConfig {
            size: vring.size,
            desc: translate("descriptor", addr.desc, 16 * size)?,
            avail: translate("available", addr.avail, 6 + 2 * size)?,
            used: translate("used", addr.used, 6 + 8 * size)?,
        };
        let acked = |bit: u32| self.features.is_some_and(|f| f & 1 << bit != 0);
        let mem = memory.memory();
        let mut queue = Queue::new(mem, config, acked(VIRTIO_F_EVENT_IDX))
            .map_err(|source| Error::BadQueue { index, source })?
            .with_indirect_descriptors(acked(VIRTIO_F_INDIRECT_DESC));
        // While logging, every guest page the worker writes is marked: the used ring's at
        // `log_guest_addr` (VHOST_VRING_F_LOG), the rest by the worker.
        let log = match &self.log {
            Some(log) if self.logging() => {
                self.check_log_covers_memory()?;
                Some(log.dirty_log())
            }
            _ => None,
        };
        let used_logged = addr.flags & VRING_F_LOG != 0;
        if let Some(log) = log.clone().filter(|_| used_logged) {
            queue = queue.with_used_log(log, addr.log);
        }
        queue.resume(vring.base);
        let mut tracked = self.inflight_negotiated().then_some(self.inflight.as_ref()).flatten();
        if let Some(region) = tracked.filter(|region| region.queue_size() < vring.size) {
            // QEMU sizes the region by its queue-size property, but lets a driver pick a larger
            // ring (up to 1024 on virtio-mmio): serve it, untracked, rather than not at all.
            log::warn!(
                "{}: vring {index} has {} descriptors, more than the in-flight region's {}: its requests are not tracked, and a restart of the daemon may lose those in flight",
                self.device.stats().name(), vring.size, region.queue_size()
            );
            tracked = None;
        }
        let area = tracked.and_then(|region| region.area(index));
        if area.as_ref().is_some_and(|area| area.count_in_flight() > 0) {
            // The region asks for requests to be resubmitted that a reset may have left with
            // the disk: were one resubmitted and answered, the driver could write the block
            // again, and the late original would then overwrite that newer write (or a late
            // read land in memory no log marked). The ring waits for the disk instead.
            let quarantined = self.device.quarantined(index);
            if quarantined > 0 {
                if !self.vrings[index].awaiting_quarantine {
                    log::warn!(
                        "{}: vring {index} waits to start until the disk finishes the {quarantined} request(s) quarantined at its reset: the in-flight region asks for requests to be resubmitted, which the late originals could overwrite",
                        self.device.stats().name()
                    );
                }
                self.vrings[index].awaiting_quarantine = true;
                return Ok(());
            }
        }
        let mut resubmits = 0;
        if let Some(area) = area {
            match queue.track_inflight(area) {
                Ok(recovery) => {
                    resubmits = recovery.count;
                    if recovery.count > 0 || recovery.next_avail != vring.base {
                        log::info!(
                            "{}: vring {index} resumes at avail index {} (the frontend said {}), resubmitting {} request(s) in flight",
                            self.device.stats().name(), recovery.next_avail, vring.base, recovery.count
                        );
                    }
                }
                Err(why) => {
                    // The frontend (or a predecessor) left a region that cannot be trusted: the
                    // ring is not served, and the frontend hears of it as of a broken queue.
                    log::error!(
                        "{}: vring {index}: {why}; the ring is not served",
                        self.device.stats().name()
                    );
                    if let Some(err) = &vring.err {
                        let _ = err.write(1);
                    }
                    return Ok(());
                }
            }
        }
        let kick = kick.clone();
        // A ring may start before the frontend gave a call or error descriptor: the worker
        // then signals an eventfd nobody reads, until SET_VRING_CALL replaces it.
        let vring = &mut self.vrings[index];
        install_missing(&mut vring.call)?;
        install_missing(&mut vring.err)?;
        let (Some(call), Some(err)) = (vring.call.clone(), vring.err.clone()) else {
            return Ok(());
        };
        let interrupt = InterruptLine::new(
            Arc::new(AtomicU32::new(0)),
            Some(call as Arc<dyn virtio::interrupt::Trigger>),
        );
        let signals = DeviceSignals::new(interrupt, Arc::new(AtomicBool::new(false)))
            .with_error_notifier(err)
            .with_stats(self.device.stats().clone());
        if log.is_some() {
            log::info!(
                "{}: vring {index} logs the guest pages it writes{} (live migration)",
                self.device.stats().name(),
                if used_logged { ", the used ring's at its log address" } else { "" }
            );
        }
        // Resubmitted requests need no new avail entry: wake the worker for them.
        if let (Some(kick), true) = (&kick, resubmits > 0) {
            let _ = kick.write(1);
        }
        self.device.start_ring(index, Ring { queue, signals, log, kick })?;
        self.vrings[index].running = true;
        if std::mem::take(&mut self.vrings[index].awaiting_quarantine) {
            log::info!(
                "{}: vring {index} starts: the disk finished the requests quarantined at its reset",
                self.device.stats().name()
            );
        }
        Ok(())
    }

    /// Start the rings that wait for their disk to finish the requests quarantined at a reset
    /// (see [`Session::try_start`]) once it has; the server calls it each time it wakes.
    pub fn start_awaiting(&mut self) -> Result<(), Error> {
        for index in 0..self.vrings.len() {
            if self.vrings[index].awaiting_quarantine {
                self.try_start(index)?;
            }
        }
        Ok(())
    }

    /// Requests the disk still holds from resets of this session's rings (or earlier ones').
    pub(crate) fn quarantined(&mut self) -> usize {
        self.device.reap_quarantined()
    }

    /// Stop serving ring `index`: the device takes it back (a disk's in-flight requests finish
    /// first), and the ring resumes where it stopped.
    fn stop(&mut self, index: usize) -> Result<(), Error> {
        let vring = &mut self.vrings[index];
        if !vring.running {
            return Ok(());
        }
        vring.running = false;
        vring.base = self.device.stop_ring(index)?;
        Ok(())
    }

    fn stop_all(&mut self) -> Result<(), Error> {
        let mut result = Ok(());
        for index in 0..self.vrings.len() {
            if let Err(e) = self.stop(index) {
                result = Err(e);
            }
        }
        result
    }
}

fn install_missing(slot: &mut Option<Arc<EventFd>>) -> Result<(), Error> {
    if slot.is_none() {
        install_fd(slot, None)?;
    }
    Ok(())
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        // A worker the IOCore does not give back keeps its backend; nothing more can be done.
        if let Err(e) = self.stop_all() {
            log::error!("{e}");
        }
        // Every ring stopped has finished its requests: what is still marked was abandoned by
        // a disk that did not answer, and the next daemon resubmits it. (After a hand-over the
        // successor's requests are marked there.)
        if let Some(region) = self.inflight.as_ref().filter(|_| !self.handed_over) {
            log::info!(
                "{}: the in-flight region marks {} request(s) in flight as the connection ends",
                self.device.stats().name(),
                region.count_in_flight()
            );
        }
    }
}
