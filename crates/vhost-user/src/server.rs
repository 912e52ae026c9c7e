//! The listening socket of one disk: one frontend at a time, each connection a [`Session`]. A
//! daemon serving several disks runs one `Server` per disk, each on its own thread, so a
//! frontend that stalls, misbehaves or goes away holds up only its own disk's set-up; their
//! rings share the IOCores. A connection
//! ends when the frontend closes it, when it sends a message the backend refuses (logged on one
//! line, answered with a failure where the frontend asked for acknowledgements), when it has not
//! negotiated its features within [`SETUP_TIMEOUT`], stalls inside a message or leaves its
//! replies unread for [`STALL_TIMEOUT`], or when its memory shrinks under us; either way the
//! session's rings stop, their backends go back to the device, and the next frontend is
//! accepted. A frontend that connects while another is being served is refused at once (its
//! connection closed, the reason logged), so nobody waits behind an idle frontend. Every wait
//! also watches the stop descriptor, so stopping never waits for a frontend.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vhost_user_protocol::message::{has_own_reply, request_name, Message, Wire, FLAG_NEED_REPLY};
use vhost_user_protocol::poll::first_ready;
use vhost_user_protocol::Error as ProtocolError;

use crate::backend::{Session, VhostUserBlk};
use crate::error::Error;
use crate::handover::{self, Adopted, DiskState, HandoverError, Outcome, Port};

/// How long a frontend may pause in the middle of a message, or leave its replies unread.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a new frontend has to negotiate its features. QEMU does it as it connects; the
/// margin is for a QEMU still starting on a loaded host.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the server reaps requests quarantined at a reset (a disk that did not answer) while
/// there are some: their memory is freed, and the operator's figures drop, soon after the disk
/// answers at last, not at the next connection.
const QUARANTINE_REAP: Duration = Duration::from_millis(100);

/// How a connection ended.
#[derive(Debug)]
pub enum Ending {
    /// The frontend closed it.
    Closed,
    /// The stop descriptor became readable.
    Stopped,
    /// The disk was handed over to a successor, which serves the connection on.
    HandedOver,
    /// A message was refused, the socket failed, the frontend broke a time limit or its memory
    /// shrank; the connection was closed. `request` names the message, when its header was
    /// read and its code is known.
    Refused {
        /// The refused message's request name; `None` when no known request was read.
        request: Option<&'static str>,
        /// Why the connection ended.
        error: Error,
    },
}

/// One disk's vhost-user socket, listening; the socket file is removed when it is dropped.
pub struct Server {
    listener: UnixListener,
    path: PathBuf,
    /// Is a frontend being served? Shared with whoever asks ([`Server::frontend_connected`]).
    frontend: Arc<AtomicBool>,
    /// Remove the socket file when dropped: not once the socket is handed over, nor while an
    /// adopted one may still be the predecessor's.
    remove_on_drop: AtomicBool,
    /// Who may connect: checked on every accepted connection before anything is read.
    access: Access,
}

impl Server {
    /// Listen on `path`. A socket file of this user's left there by a server that is gone is
    /// replaced; any other file, another user's socket, or a socket a live server answers on,
    /// is an error ([`listen`]).
    ///
    /// The socket is its owner's alone (mode 0600) and serves only this user's and root's
    /// processes; see [`Server::bind_with`].
    pub fn bind(path: impl AsRef<Path>) -> Result<Server, Error> {
        Server::bind_with(path, Access::owner_only())
    }

    /// [`Server::bind`], the socket file given `access`'s mode and owner, and a connecting
    /// process served only when `access` admits it ([`Access::admits`]).
    pub fn bind_with(path: impl AsRef<Path>, access: Access) -> Result<Server, Error> {
        let path = path.as_ref();
        let listener = listen(path, &access)?;
        Ok(Server {
            listener,
            path: path.to_path_buf(),
            frontend: Arc::new(AtomicBool::new(false)),
            remove_on_drop: AtomicBool::new(true),
            access,
        })
    }

    /// Serve on the listening socket a predecessor handed over, which must be a listening Unix
    /// socket bound to `path`, admitting the processes `access` admits. Its socket file is left
    /// alone until the predecessor commits.
    pub fn adopt(listener: OwnedFd, path: impl AsRef<Path>, access: Access) -> Result<Server, Error> {
        let path = path.as_ref();
        let shown = || path.display().to_string();
        let listener = UnixListener::from(listener);
        let bound = listener.local_addr().map_err(|source| Error::Listen { path: shown(), source })?;
        if bound.as_pathname() != Some(path) || !accepts_connections(listener.as_fd()) {
            let found =
                bound.as_pathname().map_or_else(|| "an unnamed socket".into(), |p| p.display().to_string());
            return Err(Error::NotTheSocket { path: shown(), found });
        }
        Ok(Server {
            listener,
            path: path.to_path_buf(),
            frontend: Arc::new(AtomicBool::new(false)),
            remove_on_drop: AtomicBool::new(false),
            access,
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A flag that is set while a frontend is served, for other threads to read.
    pub fn frontend_connected(&self) -> Arc<AtomicBool> {
        self.frontend.clone()
    }

    /// Serve frontends one after another until `stop` (if given) becomes readable. Each
    /// connection's end is logged on standard error.
    pub fn serve(&self, device: &mut VhostUserBlk, stop: Option<BorrowedFd>) -> Result<(), Error> {
        self.serve_with(device, stop, None, None)
    }

    /// [`Server::serve`], also handing the disk over to a successor when `port` asks (and
    /// returning once the successor has it), and first, with `adopted`, taking over the session
    /// and frontend a predecessor handed over (see [`crate::handover`]).
    pub fn serve_with(
        &self,
        device: &mut VhostUserBlk,
        stop: Option<BorrowedFd>,
        port: Option<&Port>,
        adopted: Option<Adopted>,
    ) -> Result<(), Error> {
        if let Some(adopted) = adopted {
            if self.take_over(device, stop, port, adopted) {
                return Ok(());
            }
        }
        loop {
            let reap = (device.reap_quarantined() > 0).then_some(QUARANTINE_REAP);
            let ready = wait(self.listener.as_fd(), stop, port.map(Port::fd), reap)
                .map_err(|source| self.listen_error(source))?;
            match (ready, port) {
                (Ready::Stop, _) => return Ok(()),
                (Ready::TimedOut, _) => continue,
                (Ready::Handover, Some(port)) => {
                    let attempt = port.take();
                    let state = handover::export_disk(self.listener.as_fd(), device.writeback(), None);
                    if self.hand_over(port, attempt, state) == Outcome::Commit {
                        return Ok(());
                    }
                    continue;
                }
                _ => {}
            }
            let stream = match self.listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => {
                    log::error!("cannot accept a frontend: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            // Another user's process is turned away before a byte of it is read.
            if let Err(refused) = check_peer(&stream, &self.access) {
                log::warn!("{}: {refused}; connection closed", self.path.display());
                continue;
            }
            log::info!("{}: frontend connected{}", self.path.display(), pid_note(&stream));
            // Replies must never block the server: a frontend that does not read them is
            // waited for (with the stop descriptor) for at most STALL_TIMEOUT.
            if let Err(e) = stream.set_nonblocking(true) {
                log::error!("cannot make the frontend's socket non-blocking: {e}; connection closed");
                continue;
            }
            self.frontend.store(true, Ordering::Release);
            let mut session = device.session();
            let ending = self.serve_connection(&stream, &mut session, stop, port, Instant::now());
            // The rings stop (and give their backends back) before the end is logged.
            drop(session);
            self.frontend.store(false, Ordering::Release);
            if self.ended(ending) {
                return Ok(());
            }
        }
    }

    /// Log how a connection ended; `true` when serving ends with it (stopped, or handed over).
    fn ended(&self, ending: Ending) -> bool {
        match ending {
            Ending::Closed => {
                log::info!("{}: frontend disconnected; waiting for the next one", self.path.display())
            }
            Ending::Refused { request: Some(request), error } => log::warn!(
                "{}: refused {request}: {error}; connection closed, waiting for the next frontend",
                self.path.display()
            ),
            Ending::Refused { request: None, error } => log::warn!(
                "{}: {error}; connection closed, waiting for the next frontend",
                self.path.display()
            ),
            Ending::Stopped | Ending::HandedOver => return true,
        }
        false
    }

    /// Give the control thread this disk's state for hand-over `attempt` and do what it decides:
    /// on a commit the successor owns the socket file; otherwise the caller serves on.
    fn hand_over(&self, port: &Port, attempt: u64, state: Result<DiskState, HandoverError>) -> Outcome {
        let outcome = port.hand_over(attempt, state);
        if outcome == Outcome::Commit {
            self.remove_on_drop.store(false, Ordering::Release);
            log::info!("{}: handed over to the successor", self.path.display());
        }
        outcome
    }

    /// Take over a predecessor's disk: rebuild its session (rings held), report, and on the
    /// predecessor's commit start the rings and serve its frontend's connection. `true` when
    /// serving ends (stopped, handed over again, or the predecessor kept the disk).
    fn take_over(
        &self,
        device: &mut VhostUserBlk,
        stop: Option<BorrowedFd>,
        port: Option<&Port>,
        adopted: Adopted,
    ) -> bool {
        if let Err(e) = adopted.apply_writeback(device) {
            let _ = adopted.replayed.send(Err(e.to_string()));
            return true;
        }
        let Adopted { connection, replayed, commit, .. } = adopted;
        let Some(connection) = connection else {
            let _ = replayed.send(Ok(()));
            return !self.committed(&commit);
        };
        let stream = UnixStream::from(connection.stream);
        let mut session = device.session();
        let rebuilt = stream
            .set_nonblocking(true)
            .map_err(HandoverError::Socket)
            .and_then(|()| handover::replay(&mut session, connection.messages));
        let refused = rebuilt.is_err();
        let _ = replayed.send(rebuilt.map_err(|e| e.to_string()));
        // Refused or not committed: nothing was started, and the predecessor keeps the disk.
        if refused || !self.committed(&commit) {
            return true;
        }
        self.frontend.store(true, Ordering::Release);
        let ending = match session.release() {
            Ok(()) => {
                log::info!(
                    "{}: took over the frontend's connection{}",
                    self.path.display(),
                    pid_note(&stream)
                );
                self.serve_connection(&stream, &mut session, stop, port, Instant::now())
            }
            Err(error) => Ending::Refused { request: None, error },
        };
        drop(session);
        self.frontend.store(false, Ordering::Release);
        self.ended(ending)
    }

    /// Wait for the predecessor's decision; on a commit the socket file is this server's.
    fn committed(&self, commit: &std::sync::mpsc::Receiver<bool>) -> bool {
        let committed = commit.recv().unwrap_or(false);
        if committed {
            self.remove_on_drop.store(true, Ordering::Release);
        }
        committed
    }

    fn listen_error(&self, source: io::Error) -> Error {
        Error::Listen { path: self.path.display().to_string(), source }
    }

    /// Serve one frontend on `stream` until it closes, a message is refused, it breaks a time
    /// limit, its memory shrinks, `stop` fires or the disk is handed over.
    fn serve_connection(
        &self,
        stream: &UnixStream,
        session: &mut Session,
        stop: Option<BorrowedFd>,
        port: Option<&Port>,
        connected: Instant,
    ) -> Ending {
        let wire = Wire::new(stream, STALL_TIMEOUT).with_stop(stop);
        loop {
            let setup_left = (!session.set_up()).then(|| SETUP_TIMEOUT.saturating_sub(connected.elapsed()));
            let reap = (session.device.reap_quarantined() > 0).then_some(QUARANTINE_REAP);
            if let Err(error) = session.start_awaiting() {
                return Ending::Refused { request: None, error };
            }
            let limit = match (setup_left, reap) {
                (Some(left), Some(reap)) => Some(left.min(reap)),
                (left, reap) => left.or(reap),
            };
            let watched = Watched {
                stop,
                fault: session.memory_fault(),
                handover: port.map(Port::fd),
                listener: self.listener.as_fd(),
            };
            match wait_connection(stream, watched, limit) {
                Ok(Some(Event::Stop)) => return Ending::Stopped,
                Ok(Some(Event::MemoryFault)) => {
                    return Ending::Refused { request: None, error: session.memory_shrank() };
                }
                // Between two messages: whatever the frontend sent since stays in the socket.
                Ok(Some(Event::Handover)) => {
                    let Some(port) = port else { continue };
                    let attempt = port.take();
                    let writeback = session.device.writeback();
                    let state = handover::export_disk(
                        self.listener.as_fd(),
                        writeback,
                        Some((stream, &mut *session)),
                    );
                    if self.hand_over(port, attempt, state) == Outcome::Commit {
                        session.set_handed_over();
                        return Ending::HandedOver;
                    }
                    // Not handed over: the rings start again where they stopped.
                    if let Err(error) = session.release() {
                        return Ending::Refused { request: None, error };
                    }
                    log::info!("{}: the hand-over did not happen; serving on", self.path.display());
                }
                Ok(Some(Event::Message)) => {
                    if let Some(ending) = serve_message(&wire, session) {
                        return ending;
                    }
                }
                Ok(Some(Event::Another)) => self.refuse_another(),
                // Time to reap the quarantine again.
                Ok(None) if session.set_up() || connected.elapsed() < SETUP_TIMEOUT => {}
                Ok(None) => {
                    let error = Error::SetupTimeout(SETUP_TIMEOUT.as_secs());
                    return Ending::Refused { request: None, error };
                }
                Err(e) => return Ending::Refused { request: None, error: ProtocolError::Read(e).into() },
            }
        }
    }

    /// Accept a frontend that connected while another is served, and close its connection.
    fn refuse_another(&self) {
        match self.listener.accept() {
            Ok((stream, _)) => log::warn!(
                "{}: refused a frontend{}: another frontend is connected to this disk",
                self.path.display(),
                pid_note(&stream)
            ),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                log::error!("cannot accept a frontend: {e}");
                // Out of descriptors, say: the listener stays readable; do not spin on it.
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Who may use a socket exitless listens on: the permission bits and owner its file is given,
/// and which connecting processes are served (SO_PEERCRED, checked before anything is read).
/// By default ([`Access::owner_only`]) the file is mode 0600 and only this process's user and
/// root are served; an operator may let one more user in ([`Access::new`]'s `owner`: the file
/// is given to that user, who is served too) or a group (`group`, with a mode that lets the
/// group write: processes whose group is that one are served too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    mode: u32,
    owner: Option<libc::uid_t>,
    group: Option<libc::gid_t>,
    /// This process's effective user and group, read when the `Access` is made (before any
    /// seccomp filter): its own processes are always served.
    own_uid: libc::uid_t,
    own_gid: libc::gid_t,
}

impl Access {
    /// Mode 0600, this process's user and group: only this user's processes and root's are
    /// served.
    pub fn owner_only() -> Access {
        Access::new(0o600, None, None)
    }

    /// The file's permission bits (`mode`, of which only the owner's and group's are kept: a
    /// socket is never open to every user), its owner and group when given; processes of
    /// `owner`'s user are served, and, when `mode` lets the group write, processes whose
    /// (effective) group is `group` (this process's when `None`).
    pub fn new(mode: u32, owner: Option<libc::uid_t>, group: Option<libc::gid_t>) -> Access {
        // SAFETY: geteuid and getegid have no preconditions and cannot fail.
        let (own_uid, own_gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Access { mode: mode & 0o770, owner, group, own_uid, own_gid }
    }

    /// The socket file's permission bits.
    pub fn mode(&self) -> u32 {
        self.mode
    }

    /// Is a process with these credentials served? This process's user, root, the named owner,
    /// and, when the mode lets the group write, the file's group.
    pub fn admits(&self, uid: libc::uid_t, gid: libc::gid_t) -> bool {
        uid == self.own_uid
            || uid == 0
            || Some(uid) == self.owner
            || (self.mode & 0o020 != 0 && gid == self.group.unwrap_or(self.own_gid))
    }

    /// Who is served, for the log: "uid 1000 or root", "uid 1000, uid 64055 or root", ...
    pub fn describe(&self) -> String {
        let mut who = vec![format!("uid {}", self.own_uid)];
        who.extend(self.owner.filter(|&uid| uid != self.own_uid && uid != 0).map(|uid| format!("uid {uid}")));
        if self.mode & 0o020 != 0 {
            who.push(format!("group {}", self.group.unwrap_or(self.own_gid)));
        }
        if self.own_uid != 0 {
            who.push("root".into());
        }
        who.join(", ")
    }

    /// May a stale socket file of `uid`'s at the path be removed? Only one this process (or a
    /// predecessor given the same access) made: owned by this user or by the named owner.
    fn owns(&self, uid: libc::uid_t) -> bool {
        uid == self.own_uid || Some(uid) == self.owner
    }
}

/// Why a connecting process was turned away (logged; its connection is closed unread).
#[derive(Debug, thiserror::Error)]
pub enum PeerRefused {
    /// Its user is not one the socket serves.
    #[error(
        "refused a connection from uid {uid} gid {gid} (pid {pid}): only {allowed} may connect to this socket"
    )]
    Stranger {
        /// The process's effective user, group and pid as it connected.
        uid: libc::uid_t,
        /// Its group.
        gid: libc::gid_t,
        /// Its pid.
        pid: libc::pid_t,
        /// Who may, as [`Access::describe`] says.
        allowed: String,
    },
    /// The kernel did not say who it is.
    #[error("refused a connection whose credentials cannot be read (SO_PEERCRED failed)")]
    Unknown,
}

/// Is the process at the other end of `stream` one `access` serves? Reads nothing from it.
pub fn check_peer(stream: &UnixStream, access: &Access) -> Result<(), PeerRefused> {
    let cred = peer_credentials(stream).ok_or(PeerRefused::Unknown)?;
    if access.admits(cred.uid, cred.gid) {
        return Ok(());
    }
    Err(PeerRefused::Stranger { uid: cred.uid, gid: cred.gid, pid: cred.pid, allowed: access.describe() })
}

/// Listen on the Unix socket `path`, its file given `access`'s mode and owner. A socket file
/// left there by a server of this user's that is gone is replaced; anything else (a regular
/// file, a symbolic link, a directory, another user's socket, a socket a live server answers
/// on) is left alone and is an error.
///
/// The file is never wider than 0600 while it exists: the socket's own mode is set to 0600
/// before `bind` makes the file (the kernel gives the file the socket's mode less the umask),
/// and only then are the operator's owner and mode given.
pub fn listen(path: &Path, access: &Access) -> Result<UnixListener, Error> {
    let shown = || path.display().to_string();
    remove_stale(path, access)?;
    let listen_error = |source| Error::Listen { path: shown(), source };
    let address = socket_address(path).ok_or_else(|| Error::PathTooLong { path: shown() })?;
    // SAFETY: socket takes no pointer; the descriptor it returns is checked, then owned.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(listen_error(io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a new descriptor nothing else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: fchmod on the socket we own; it takes no pointer.
    if unsafe { libc::fchmod(socket.as_raw_fd(), 0o600) } != 0 {
        return Err(listen_error(io::Error::last_os_error()));
    }
    let length = libc::socklen_t::try_from(std::mem::size_of::<libc::sockaddr_un>()).unwrap_or(0);
    // SAFETY: `address` is an initialised sockaddr_un of `length` bytes that outlives the call.
    let rc = unsafe { libc::bind(socket.as_raw_fd(), (&address as *const libc::sockaddr_un).cast(), length) };
    if rc != 0 {
        return Err(listen_error(io::Error::last_os_error()));
    }
    let listener = UnixListener::from(socket);
    // From here on the file is ours: removed again (if it still is) when anything below fails.
    let remove = |error: Error| {
        remove_socket(path, access);
        error
    };
    give_access(path, access).map_err(remove)?;
    // SAFETY: listen on the bound socket we own; it takes no pointer.
    if unsafe { libc::listen(listener.as_raw_fd(), libc::SOMAXCONN) } != 0 {
        return Err(remove(listen_error(io::Error::last_os_error())));
    }
    Ok(listener)
}

/// Remove a stale socket at `path`: only a socket (not followed if a symbolic link) of this
/// user's (or of `access`'s owner) that no live server answers on. Nothing there is fine.
fn remove_stale(path: &Path, access: &Access) -> Result<(), Error> {
    let shown = || path.display().to_string();
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(Error::Listen { path: shown(), source }),
    };
    if !meta.file_type().is_socket() {
        return Err(Error::NotASocket { path: shown(), found: kind_name(&meta.file_type()) });
    }
    if !access.owns(meta.uid()) {
        return Err(Error::ForeignSocket { path: shown(), uid: meta.uid() });
    }
    if UnixStream::connect(path).is_ok() {
        return Err(Error::SocketInUse { path: shown() });
    }
    std::fs::remove_file(path).map_err(|source| Error::Listen { path: shown(), source })
}

/// Remove the socket file at `path` as its server ends: only if it is still a socket `access`
/// owns (someone may have put something else there meanwhile, which is left alone).
pub fn remove_socket(path: &Path, access: &Access) {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() && access.owns(meta.uid()) => {
            let _ = std::fs::remove_file(path);
        }
        _ => {}
    }
}

/// Give the new socket file at `path` the owner and mode `access` names. The file is this
/// process's new socket (made by `bind` a moment ago, 0600); the owner is given without
/// following a symbolic link, and the mode only after checking it is still a socket.
fn give_access(path: &Path, access: &Access) -> Result<(), Error> {
    let failed =
        |what: String| move |source| Error::SocketAccess { path: path.display().to_string(), what, source };
    if access.owner.is_some() || access.group.is_some() {
        let what = format!(
            "owner {}:{}",
            access.owner.map_or_else(String::new, |u| u.to_string()),
            access.group.map_or_else(String::new, |g| g.to_string())
        );
        std::os::unix::fs::lchown(path, access.owner, access.group).map_err(failed(what))?;
    }
    let meta = std::fs::symlink_metadata(path).map_err(failed("lstat".into()))?;
    if !meta.file_type().is_socket() {
        return Err(failed("mode".into())(io::Error::from_raw_os_error(libc::EEXIST)));
    }
    // The umask may have narrowed the file (0600 less the umask); the operator's mode, exactly.
    if meta.mode() & 0o7777 != access.mode {
        let permissions = std::fs::Permissions::from_mode(access.mode);
        std::fs::set_permissions(path, permissions).map_err(failed(format!("mode {:04o}", access.mode)))?;
    }
    Ok(())
}

/// What a file that is not a socket is, for the error.
fn kind_name(kind: &std::fs::FileType) -> &'static str {
    if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_file() {
        "a regular file"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_block_device() || kind.is_char_device() {
        "a device node"
    } else {
        "another kind of file"
    }
}

/// `path` as a Unix socket address; `None` when it does not fit (or holds a NUL byte).
fn socket_address(path: &Path) -> Option<libc::sockaddr_un> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data, valid all zeroes.
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.is_empty() || bytes.len() >= address.sun_path.len() || bytes.contains(&0) {
        return None;
    }
    address.sun_family = libc::sa_family_t::try_from(libc::AF_UNIX).ok()?;
    for (slot, &byte) in address.sun_path.iter_mut().zip(bytes) {
        *slot = byte as libc::c_char;
    }
    Some(address)
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.remove_on_drop.load(Ordering::Acquire) {
            remove_socket(&self.path, &self.access);
        }
    }
}

/// Is `fd` a listening socket (SO_ACCEPTCONN)?
fn accepts_connections(fd: BorrowedFd) -> bool {
    let mut value: libc::c_int = 0;
    let Ok(mut len) = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>()) else { return false };
    // SAFETY: SO_ACCEPTCONN fills an int of `len` bytes at a valid pointer.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    rc == 0 && value == 1
}

/// The connected process's credentials (SO_PEERCRED, as they were when it connected).
pub fn peer_credentials(stream: &UnixStream) -> Option<libc::ucred> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::ucred>()).ok()?;
    // SAFETY: SO_PEERCRED fills a ucred of `len` bytes at a valid pointer.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred)
}

/// " (pid N)" for the connected process (SO_PEERCRED), or nothing, for the log.
pub fn pid_note(stream: &UnixStream) -> String {
    match peer_credentials(stream) {
        Some(cred) if cred.pid > 0 => format!(" (pid {})", cred.pid),
        _ => String::new(),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Ready {
    Fd,
    Stop,
    Handover,
    TimedOut,
}

/// Wait until `fd` is readable (or hung up), or `stop` or `handover` is, for at most `limit`.
fn wait(
    fd: BorrowedFd,
    stop: Option<BorrowedFd>,
    handover: Option<BorrowedFd>,
    limit: Option<Duration>,
) -> io::Result<Ready> {
    let watched: Vec<(BorrowedFd, Ready)> =
        [(stop, Ready::Stop), (handover, Ready::Handover), (Some(fd), Ready::Fd)]
            .into_iter()
            .filter_map(|(fd, ready)| Some((fd?, ready)))
            .collect();
    let fds: Vec<(BorrowedFd, i16)> = watched.iter().map(|&(fd, _)| (fd, libc::POLLIN)).collect();
    Ok(first_ready(&fds, limit)?.map_or(Ready::TimedOut, |index| watched[index].1))
}

/// What woke a connection's wait.
#[derive(Clone, Copy)]
enum Event {
    Stop,
    MemoryFault,
    /// The daemon asks for the disk's hand-over to a successor.
    Handover,
    /// A message (or the end of the connection) on the frontend's socket.
    Message,
    /// Another frontend is connecting.
    Another,
}

/// The descriptors a connection's wait watches besides the frontend's socket.
struct Watched<'a> {
    stop: Option<BorrowedFd<'a>>,
    fault: Option<BorrowedFd<'a>>,
    handover: Option<BorrowedFd<'a>>,
    listener: BorrowedFd<'a>,
}

/// Wait for what matters to a connection, most important first; `None` when `limit` passed.
fn wait_connection(
    stream: &UnixStream,
    watched: Watched,
    limit: Option<Duration>,
) -> io::Result<Option<Event>> {
    let watched = [
        (watched.stop, Event::Stop),
        (watched.fault, Event::MemoryFault),
        (watched.handover, Event::Handover),
    ]
    .into_iter()
    .filter_map(|(fd, event)| Some((fd?, event)))
    .chain([(stream.as_fd(), Event::Message), (watched.listener, Event::Another)]);
    let mut fds = Vec::with_capacity(5);
    let mut events = Vec::with_capacity(5);
    for (fd, event) in watched {
        fds.push((fd, libc::POLLIN));
        events.push(event);
    }
    Ok(first_ready(&fds, limit)?.map(|index| events[index]))
}

/// Receive one message on `wire`, handle it and reply; `Some` when the connection ends.
fn serve_message(wire: &Wire, session: &mut Session) -> Option<Ending> {
    let (header, payload, fds) = match wire.recv() {
        Ok(Some(parts)) => parts,
        Ok(None) => return Some(Ending::Closed),
        Err(ProtocolError::Stopping) => return Some(Ending::Stopped),
        Err(error) => return Some(Ending::Refused { request: None, error: error.into() }),
    };
    let request = request_name(header.request);
    // REPLY_ACK, negotiated and asked for, on a known request without a reply of its own.
    let ack = header.flags & FLAG_NEED_REPLY != 0
        && session.reply_ack()
        && request.is_some()
        && !has_own_reply(header.request);
    let result = Message::parse(header, &payload, fds)
        .map_err(Error::from)
        .and_then(|message| session.handle(message));
    let sent = match result {
        Ok(Some(reply)) => match session.take_reply_fd() {
            Some(fd) => wire.reply_with_fds(header.request, &reply, &[fd]),
            None => wire.reply(header.request, &reply),
        },
        Ok(None) if ack => wire.reply(header.request, &0u64.to_le_bytes()),
        Ok(None) => Ok(()),
        Err(error) => {
            // A failure acknowledgement first, so the frontend's own log says why.
            if ack {
                let _ = wire.reply(header.request, &1u64.to_le_bytes());
            }
            return Some(Ending::Refused { request, error });
        }
    };
    match sent {
        Ok(()) => None,
        Err(ProtocolError::Stopping) => Some(Ending::Stopped),
        Err(error) => Some(Ending::Refused { request, error: error.into() }),
    }
}

#[cfg(test)]
mod tests {
    use super::Access;

    #[test]
    fn access_serves_our_user_root_and_only_whom_the_operator_names() {
        let own = Access::owner_only();
        let (uid, gid) = (own.own_uid, own.own_gid);
        let stranger = uid.wrapping_add(4321);
        assert!(own.admits(uid, gid) && own.admits(0, 0));
        assert!(!own.admits(stranger, gid), "mode 0600 serves no one of our group");

        let owner = Access::new(0o600, Some(stranger), None);
        assert!(owner.admits(stranger, 999) && !owner.admits(stranger + 1, 999));
        assert!(owner.describe().contains(&format!("uid {stranger}")), "{}", owner.describe());

        let group = Access::new(0o660, None, Some(4242));
        assert!(group.admits(stranger, 4242) && !group.admits(stranger, 4243));
        // A group with no write bit lets nobody in by group.
        assert!(!Access::new(0o640, None, Some(4242)).admits(stranger, 4242));
        // Bits for other users are dropped: never a socket open to every user.
        assert_eq!(Access::new(0o666, None, None).mode(), 0o660);
    }
}
