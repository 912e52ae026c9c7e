//! Unix sockets exitless listens on, and whom they serve.
//!
//! Every socket a daemon or a VMM leaves on a host is an attack surface: whoever may connect
//! controls what it serves. [`listen`] makes the socket file its owner's alone from the moment
//! it exists (whatever the umask), gives it the owner and mode an operator asked for, and never
//! replaces anything but a stale socket of this user's. [`check_peer`] turns away, before a byte
//! is read, a connecting process [`Access`] does not admit (SO_PEERCRED).

#![deny(missing_docs)]
#![cfg_attr(not(test), warn(clippy::cast_possible_truncation, clippy::cast_sign_loss))]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

/// Why a socket could not be listened on.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// Something other than a socket is at the path; it is left alone.
    #[error("{path} exists and is not a socket (it is {found}): it is left alone; remove it or choose another socket path")]
    NotASocket {
        /// The socket's path.
        path: String,
        /// What is there instead ("a regular file", "a symbolic link", ...).
        found: &'static str,
    },
    /// Another user's socket is at the path; it is left alone.
    #[error("{path} is a socket of another user's (uid {uid}): it is left alone; remove it as that user or choose another socket path")]
    ForeignSocket {
        /// The socket's path.
        path: String,
        /// The user who owns the socket file.
        uid: u32,
    },
    /// The path does not fit in a `sockaddr_un` (or holds a NUL byte).
    #[error("{path} is too long for a Unix socket's address (at most 107 bytes): choose a shorter path")]
    PathTooLong {
        /// The socket's path.
        path: String,
    },
    /// The owner or mode asked for could not be given; the new socket file was removed.
    #[error("cannot give {path} the owner or mode asked for ({what}): {source}")]
    SocketAccess {
        /// The socket's path.
        path: String,
        /// What was being given: "owner UID:GID", "mode 0660", ...
        what: String,
        /// The system call's error.
        source: io::Error,
    },
    /// A live server answers on the socket at the path.
    #[error("{path} is in use by a running server: stop it or choose another socket path")]
    SocketInUse {
        /// The socket's path.
        path: String,
    },
    /// A system call failed: socket, bind, listen, or removing a stale socket.
    #[error("cannot listen on {path}: {source}")]
    Listen {
        /// The socket's path.
        path: String,
        /// The system call's error.
        source: io::Error,
    },
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
    let cred = peer_credentials(stream).map_err(|_| PeerRefused::Unknown)?;
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
pub fn listen(path: &Path, access: &Access) -> Result<UnixListener, ListenError> {
    let shown = || path.display().to_string();
    remove_stale(path, access)?;
    let listen_error = |source| ListenError::Listen { path: shown(), source };
    let address = socket_address(path).ok_or_else(|| ListenError::PathTooLong { path: shown() })?;
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
    let remove = |error: ListenError| {
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
fn remove_stale(path: &Path, access: &Access) -> Result<(), ListenError> {
    let shown = || path.display().to_string();
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(ListenError::Listen { path: shown(), source }),
    };
    if !meta.file_type().is_socket() {
        return Err(ListenError::NotASocket { path: shown(), found: kind_name(&meta.file_type()) });
    }
    if !access.owns(meta.uid()) {
        return Err(ListenError::ForeignSocket { path: shown(), uid: meta.uid() });
    }
    if UnixStream::connect(path).is_ok() {
        return Err(ListenError::SocketInUse { path: shown() });
    }
    std::fs::remove_file(path).map_err(|source| ListenError::Listen { path: shown(), source })
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
fn give_access(path: &Path, access: &Access) -> Result<(), ListenError> {
    let failed = |what: String| {
        move |source| ListenError::SocketAccess { path: path.display().to_string(), what, source }
    };
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

/// The connected process's credentials (SO_PEERCRED: as they were when it connected, or when it
/// listened, for the side that connected).
pub fn peer_credentials(stream: &UnixStream) -> io::Result<libc::ucred> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::ucred>())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
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
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred)
}

/// " (pid N)" for the connected process (SO_PEERCRED), or nothing, for the log.
pub fn pid_note(stream: &UnixStream) -> String {
    match peer_credentials(stream) {
        Ok(cred) if cred.pid > 0 => format!(" (pid {})", cred.pid),
        _ => String::new(),
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
