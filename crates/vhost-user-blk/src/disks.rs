//! The daemon's disks while it runs: opened at start from `--disk`, and added, re-limited and
//! removed through the control API. Only the control (main) thread changes the set; each disk's
//! connection thread serves its socket until its own stop descriptor fires, so removing one
//! disk leaves the others' frontends and rings alone.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use iocore::IoCore;
use rate_limiter::{Limits, RateLimiter};
use sandbox::{SeccompMode, ThreadKind};
use serde_json::{json, Value};
use thiserror::Error;
use unix_socket::Access;
use vhost_user::handover::{port, Adopted, Handle as HandoverHandle, Port};
use vhost_user::server::Listen;
use virtio::block::{Block, BlockWorker};
use virtio::DeviceStats;
use virtqueue::WorkerHost;

use crate::api_dirs::{self, ApiDiskDirs, DiskDirError};
use crate::placement::Placement;
use crate::spec::VhostDisk;
use crate::stats::DiskFigures;

/// Why a disk could not be added, changed or removed; [`DiskError::status`] is the control
/// API's answer.
#[derive(Debug, Error)]
pub enum DiskError {
    #[error("a disk named {0} exists already")]
    NameTaken(String),
    #[error("disk {name} is served on {socket} already")]
    SocketTaken { name: String, socket: String },
    #[error("no disk is named {0}")]
    NotFound(String),
    #[error(
        "a frontend is connected to disk {0}: detach the disk from its VM (or stop the VM) before removing it"
    )]
    InUse(String),
    #[error("cannot open the disk of {what}: {reason}")]
    Open { what: String, reason: String },
    /// The control API named a file the operator did not allow (`--api-disk-dir`).
    #[error("{0}")]
    NotAllowed(#[from] DiskDirError),
    #[error("{what}: the queues disagree on its size (was it resized while opening?)")]
    Size { what: String },
    #[error("{0}")]
    Socket(#[from] ::vhost_user::Error),
    #[error("cannot start {what}'s connection thread: {source}")]
    Thread { what: String, source: std::io::Error },
    #[error(
        "opening the disk of {what} did not answer within {} s (a FUSE or NFS file system that does not answer?): it is not added; try again once its file system answers",
        OPEN_LIMIT.as_secs()
    )]
    OpenTimeout { what: String },
}

/// How long opening a disk (its file, its io_uring, its checks) may take: past it the disk is
/// not added, and an open that ends later is closed again. The control thread, and the API
/// client waiting for its answer, are never held longer by a file system that does not answer.
pub const OPEN_LIMIT: Duration = Duration::from_secs(30);

/// Who named a disk: the operator (`--disk`), whose files are opened as named, or a client of
/// the control API, whose files are opened only inside the operator's `--api-disk-dir`s.
#[derive(Clone)]
enum Origin {
    Operator,
    Api(Arc<ApiDiskDirs>),
}

/// Open `disk` `count` times (a backend per queue) on a thread of its own, waiting at most
/// `limit` for it. The allow-list's lookup runs on that thread too, so a file system that does
/// not answer holds neither of them past `limit`.
fn open_within(
    disk: &storage::DiskSpec,
    count: usize,
    what: &str,
    limit: Duration,
    origin: Origin,
) -> Result<Vec<Box<dyn storage::Backend>>, DiskError> {
    let (opened, result) = mpsc::channel();
    let disk = disk.clone();
    let named = what.to_owned();
    std::thread::Builder::new()
        .name("disk-open".into())
        // A late open finds nobody waiting: what it opened is dropped (closed) here.
        .spawn(move || drop(opened.send(open_disk(&disk, count, &named, &origin))))
        .map_err(|source| DiskError::Thread { what: what.to_owned(), source })?;
    match result.recv_timeout(limit) {
        Ok(backends) => backends,
        Err(mpsc::RecvTimeoutError::Timeout) => Err(DiskError::OpenTimeout { what: what.to_owned() }),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            Err(DiskError::Open { what: what.to_owned(), reason: "the opening thread failed".into() })
        }
    }
}

/// Open `disk` `count` times; a file an API client named only through the descriptor
/// `--api-disk-dir`'s lookup found, so that what is opened is what was checked.
fn open_disk(
    disk: &storage::DiskSpec,
    count: usize,
    what: &str,
    origin: &Origin,
) -> Result<Vec<Box<dyn storage::Backend>>, DiskError> {
    let open_error = |reason: String| DiskError::Open { what: what.to_owned(), reason };
    let (Origin::Api(dirs), Some(path)) = (origin, api_dirs::path_of(disk)) else {
        return disk.open_queues(count).map_err(|e| open_error(e.to_string()));
    };
    let file = dirs.resolve(path)?;
    // Opening the descriptor's /proc link opens the very file the lookup found, afresh with
    // the disk's own flags (read-write or not, O_DIRECT), and checks its type as any disk's.
    let through = format!("/proc/self/fd/{}", file.as_raw_fd());
    let opened = api_dirs::with_path(disk, PathBuf::from(&through)).open_queues(count);
    drop(file);
    // Errors name the file as the client did, not the descriptor.
    opened.map_err(|e| open_error(e.to_string().replace(&through, &path.display().to_string())))
}

impl DiskError {
    /// The HTTP status that answers it.
    pub fn status(&self) -> u16 {
        match self {
            DiskError::NotAllowed(refused) => refused.status(),
            DiskError::NameTaken(_) | DiskError::SocketTaken { .. } | DiskError::InUse(_) => 409,
            DiskError::Socket(vhost_user::Error::Socket(unix_socket::ListenError::SocketInUse {
                ..
            })) => 409,
            DiskError::NotFound(_) => 404,
            DiskError::Thread { .. } => 500,
            DiskError::OpenTimeout { .. } => 504,
            DiskError::Open { .. } | DiskError::Size { .. } | DiskError::Socket(_) => 400,
        }
    }
}

/// One disk being served.
pub struct Disk {
    pub spec: VhostDisk,
    pub queues: u16,
    /// The serial number the guest reads (GET_ID).
    pub serial: String,
    pub figures: DiskFigures,
    frontend: Arc<AtomicBool>,
    /// Written to stop the disk's connection thread.
    stop: File,
    thread: Option<JoinHandle<()>>,
    /// Asks the connection thread for the disk's state, to hand it over to a successor.
    handover: Option<HandoverHandle>,
}

impl Disk {
    /// Is a frontend connected?
    pub fn frontend_connected(&self) -> bool {
        self.frontend.load(Ordering::Acquire)
    }

    /// What `GET /disks` shows of it.
    pub fn describe(&self) -> Value {
        let f = &self.figures;
        json!({
            "name": f.name,
            "index": f.index,
            "socket": f.socket.display().to_string(),
            "disk": storage_json(&self.spec.disk),
            "queues": self.queues,
            "serial": self.serial,
            "reset_timeout_s": self.spec.reset_timeout.unwrap_or(virtio::block::worker::RESET_WAIT).as_secs_f64(),
            "iocore": f.iocore,
            "frontend_connected": self.frontend_connected(),
            "figures": f.counts(),
            "queue_requests": &f.stats.snapshot().per_queue[..usize::from(self.queues).min(virtio::STATS_QUEUES)],
        })
    }

    /// The control thread's end of the disk's hand-over (with `--handover-socket`).
    pub fn handover(&self) -> Option<&HandoverHandle> {
        self.handover.as_ref()
    }

    /// How it compares with a successor's disk: what a hand-over must find the same.
    pub fn identity(&self) -> Value {
        identity(&self.spec, &self.figures.socket, self.queues, &self.serial)
    }

    /// Stop its connection thread (ending a frontend's connection) and wait for it.
    fn stop(&mut self) {
        let _ = self.stop.write_all(&1u64.to_ne_bytes());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A disk as a hand-over compares it: socket, storage, queues and serial number.
pub fn identity(spec: &VhostDisk, socket: &std::path::Path, queues: u16, serial: &str) -> Value {
    json!({
        "socket": socket.display().to_string(),
        "disk": storage_json(&spec.disk),
        "queues": queues,
        "serial": serial,
    })
}

fn storage_json(disk: &storage::DiskSpec) -> Value {
    match disk {
        storage::DiskSpec::File { path, read_only, direct, .. } => {
            json!({"path": path.display().to_string(), "readonly": read_only, "direct": direct})
        }
        storage::DiskSpec::Ram { size, .. } => json!({"ram": size}),
        storage::DiskSpec::RamFile { path, read_only, .. } => {
            json!({"ram": true, "path": path.display().to_string(), "readonly": read_only})
        }
        storage::DiskSpec::Null { size, read_only } => json!({"null": size, "readonly": read_only}),
        storage::DiskSpec::Rbd(spec) => json!({
            "rbd": format!("{}/{}", spec.pool, spec.image),
            "conf": spec.conf.as_ref().map(|c| c.display().to_string()),
            "id": spec.user(),
            "readonly": spec.read_only,
        }),
    }
}

/// Every disk, and what a new one needs: the IOCores and how to place it on them.
pub struct Disks {
    iocores: Vec<Arc<IoCore<BlockWorker>>>,
    placement: Placement,
    /// `--queues`, for a disk whose spec names none.
    default_queues: u16,
    seccomp: SeccompMode,
    /// Give every disk a rate limiter, so the control API may limit one later.
    limit_every_disk: bool,
    mode: String,
    next_index: usize,
    disks: BTreeMap<String, Disk>,
    /// Give every disk a hand-over port (`--handover-socket`).
    handover: bool,
    /// Where the control API's disks may open their files (`--api-disk-dir`).
    api_dirs: Arc<ApiDiskDirs>,
    /// Who may use the disks' sockets (`--socket-owner`, `--socket-mode`).
    access: Access,
}

impl Disks {
    pub fn new(
        iocores: Vec<Arc<IoCore<BlockWorker>>>,
        default_queues: u16,
        seccomp: SeccompMode,
        limit_every_disk: bool,
        mode: String,
    ) -> Disks {
        let placement = Placement::new(iocores.len());
        Disks {
            iocores,
            placement,
            default_queues,
            seccomp,
            limit_every_disk,
            mode,
            next_index: 0,
            disks: BTreeMap::new(),
            handover: false,
            access: Access::owner_only(),
            api_dirs: Arc::default(),
        }
    }

    /// Let the control API's disks open files inside these directories (none by default).
    pub fn with_api_disk_dirs(mut self, dirs: ApiDiskDirs) -> Disks {
        self.api_dirs = Arc::new(dirs);
        self
    }

    /// Give every disk's socket added from now on this access (mode, owner, peers served).
    pub fn with_access(mut self, access: Access) -> Disks {
        self.access = access;
        self
    }

    /// Let every disk added from now on be handed over to a successor.
    pub fn with_handover(mut self) -> Disks {
        self.handover = true;
        self
    }

    /// `--queues`, for a disk whose spec names none.
    pub fn default_queues(&self) -> u16 {
        self.default_queues
    }

    /// The disks in the order they were added.
    pub fn in_order(&self) -> Vec<&Disk> {
        let mut disks: Vec<&Disk> = self.disks.values().collect();
        disks.sort_by_key(|d| d.figures.index);
        disks
    }

    pub fn iocores(&self) -> &[Arc<IoCore<BlockWorker>>] {
        &self.iocores
    }

    pub fn get(&self, name: &str) -> Option<&Disk> {
        self.disks.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Disk> {
        self.disks.values()
    }

    pub fn figures_mut(&mut self) -> impl Iterator<Item = &mut DiskFigures> {
        let mut disks: Vec<&mut Disk> = self.disks.values_mut().collect();
        disks.sort_by_key(|d| d.figures.index);
        disks.into_iter().map(|d| &mut d.figures)
    }

    /// Open `spec`'s disk, the operator's own, listen on `socket` and serve it from a thread
    /// of its own.
    pub fn add(&mut self, spec: VhostDisk, socket: PathBuf) -> Result<&Disk, DiskError> {
        self.add_on(spec, socket, Listen::Bind)
    }

    /// As `add`, for a disk a control API client named: a file it names is opened only inside
    /// an `--api-disk-dir` (403 otherwise, and nothing is opened).
    pub fn add_from_api(&mut self, spec: VhostDisk, socket: PathBuf) -> Result<&Disk, DiskError> {
        let origin = Origin::Api(self.api_dirs.clone());
        self.add_with(spec, socket, Listen::Bind, origin)
    }

    /// Open `spec`'s disk, the operator's own, and serve it from a thread of its own, on
    /// `socket` or, as `listen` says, on the socket (and frontend) a predecessor handed over.
    pub fn add_on(&mut self, spec: VhostDisk, socket: PathBuf, listen: Listen) -> Result<&Disk, DiskError> {
        self.add_with(spec, socket, listen, Origin::Operator)
    }

    fn add_with(
        &mut self,
        spec: VhostDisk,
        socket: PathBuf,
        listen: Listen,
        origin: Origin,
    ) -> Result<&Disk, DiskError> {
        let index = self.next_index;
        let name = spec.name.clone().unwrap_or_else(|| format!("disk{index}"));
        if self.disks.contains_key(&name) {
            return Err(DiskError::NameTaken(name));
        }
        if let Some(other) = self.disks.values().find(|d| d.figures.socket == socket) {
            let socket = socket.display().to_string();
            return Err(DiskError::SocketTaken { name: other.figures.name.clone(), socket });
        }
        let queues = spec.queues.unwrap_or(self.default_queues);
        let iocore = self.placement.place(usize::from(queues));
        let disk = self.open((index, &name), &spec, socket, (queues, iocore), listen, origin);
        let disk = match disk {
            Ok(disk) => disk,
            Err(e) => {
                self.placement.remove(iocore, usize::from(queues));
                return Err(e);
            }
        };
        self.next_index += 1;
        log::info!(
            "listening on {} (disk {index}, {name}, {queues} queue{}, IOCore {iocore} of {}, {} mode)",
            disk.figures.socket.display(),
            if queues == 1 { "" } else { "s" },
            self.iocores.len(),
            self.mode,
        );
        Ok(self.disks.entry(name).or_insert(disk))
    }

    fn open(
        &self,
        (index, name): (usize, &str),
        spec: &VhostDisk,
        socket: PathBuf,
        (queues, iocore): (u16, usize),
        listen: Listen,
        origin: Origin,
    ) -> Result<Disk, DiskError> {
        let what = format!("disk {index} ({})", socket.display());
        let backends = open_within(&spec.disk, usize::from(queues), &what, OPEN_LIMIT, origin)?;
        let serial = spec.serial.clone().unwrap_or_else(|| format!("vhost-user-disk{index}"));
        let mut block =
            Block::with_queues(backends, &serial).ok_or_else(|| DiskError::Size { what: what.clone() })?;
        // A read-only disk takes no writes, so it has no cache mode to switch: it stays without
        // CONFIG_WCE and the driver sees it write back, as with a fixed cache.
        if !block.read_only() {
            block = block.with_writeback_switch();
        }
        if let Some(timeout) = spec.reset_timeout {
            block = block.with_reset_timeout(timeout);
        }
        let stats = Arc::new(DeviceStats::new(what.clone()));
        let host: Arc<dyn WorkerHost<BlockWorker>> = self.iocores[iocore].clone();
        let mut device = ::vhost_user::VhostUserBlk::new(block, host).with_stats(stats.clone());
        let limiter =
            (self.limit_every_disk || spec.limits.any()).then(|| Arc::new(RateLimiter::new(spec.limits)));
        if let Some(limiter) = &limiter {
            device = device.with_rate_limiter(limiter.clone());
        }
        let (server, adopted) = ::vhost_user::Server::open(&socket, self.access.clone(), listen)?;
        let frontend = server.frontend_connected();
        let (stop, stop_reader) =
            stop_event().map_err(|source| DiskError::Thread { what: what.clone(), source })?;
        let (handover, port) = match self.handover {
            true => {
                let (handle, port) =
                    port().map_err(|source| DiskError::Thread { what: what.clone(), source })?;
                (Some(handle), Some(port))
            }
            false => (None, None),
        };
        let seccomp = self.seccomp;
        let serving = Serving { index, server, stop: stop_reader, port, adopted };
        let thread = std::thread::Builder::new()
            .name(format!("vhost-user-{index}"))
            .spawn(move || serve_disk(device, serving, seccomp))
            .map_err(|source| DiskError::Thread { what, source })?;
        let figures = DiskFigures::new((index, name.to_owned()), socket, stats, limiter, iocore);
        Ok(Disk {
            spec: spec.clone(),
            queues,
            serial,
            figures,
            frontend,
            stop,
            thread: Some(thread),
            handover,
        })
    }

    /// New limits for a disk, in force for its next requests.
    pub fn set_limits(&mut self, name: &str, limits: Limits) -> Result<&Disk, DiskError> {
        let disk = self.disks.get_mut(name).ok_or_else(|| DiskError::NotFound(name.to_owned()))?;
        match &disk.figures.limiter {
            Some(limiter) => limiter.set(limits),
            // Every disk has a limiter when the control API runs; none can be changed otherwise.
            None => return Err(DiskError::NotFound(name.to_owned())),
        }
        disk.spec.limits = limits;
        log::info!("disk {name}: limits now iops={:?} bw={:?}", limits.iops, limits.bandwidth);
        Ok(disk)
    }

    /// Stop serving a disk no frontend is connected to, close it and remove its socket.
    pub fn remove(&mut self, name: &str) -> Result<(), DiskError> {
        let disk = self.disks.get(name).ok_or_else(|| DiskError::NotFound(name.to_owned()))?;
        if disk.frontend_connected() {
            return Err(DiskError::InUse(name.to_owned()));
        }
        let Some(mut disk) = self.disks.remove(name) else { return Ok(()) };
        disk.stop();
        self.placement.remove(disk.figures.iocore, usize::from(disk.queues));
        log::info!("disk {name} removed; {} no longer served", disk.figures.socket.display());
        Ok(())
    }

    /// Stop every disk's connection thread.
    pub fn stop_all(&mut self) {
        for disk in self.disks.values_mut() {
            let _ = disk.stop.write_all(&1u64.to_ne_bytes());
        }
        for disk in self.disks.values_mut() {
            disk.stop();
        }
    }
}

/// An eventfd to stop a connection thread: the writing end, and the one the thread polls.
fn stop_event() -> std::io::Result<(File, OwnedFd)> {
    // SAFETY: eventfd takes no pointer; the descriptor it returns is checked, then owned.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let reader = fd.try_clone()?;
    Ok((File::from(fd), reader))
}

/// What a disk's connection thread serves.
struct Serving {
    index: usize,
    server: ::vhost_user::Server,
    stop: OwnedFd,
    port: Option<Port>,
    adopted: Option<Adopted>,
}

/// One disk's connection thread: frontends one after another until its stop descriptor fires
/// or the disk is handed over.
fn serve_disk(mut device: ::vhost_user::VhostUserBlk, serving: Serving, seccomp: SeccompMode) {
    let Serving { index, server, stop, port, adopted } = serving;
    // This thread reads the disk's frontends' messages (and a predecessor's) from here on.
    if let Err(e) = sandbox::install(ThreadKind::VhostUserConnection, seccomp) {
        log::error!("disk {index}: {e}; not served");
        if let Some(adopted) = adopted {
            let _ = adopted.replayed.send(Err(e.to_string()));
        }
        return;
    }
    if let Err(e) = server.serve_with(&mut device, Some(stop.as_fd()), port.as_ref(), adopted) {
        log::error!("disk {index} ({}): {e}; no longer served", server.path().display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_null_disk_is_shown_as_the_keys_that_make_it_again() {
        let disk = storage::DiskSpec::Null { size: 64 << 20, read_only: true };
        let mut shown = storage_json(&disk);
        assert_eq!(shown, json!({"null": 64 << 20, "readonly": true}));
        shown["socket"] = json!("/tmp/n.sock");
        assert_eq!(crate::spec::from_json("n", &shown).unwrap().disk, disk);
    }
}
