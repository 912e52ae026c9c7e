//! The files of a snapshot directory. A snapshot holds all of guest RAM, so the directory is
//! this user's and mode 0700 (made so when exitless creates it; refused otherwise), every file
//! in it is created new (O_CREAT | O_EXCL) with mode 0600, and no symbolic link is followed: a
//! name another user planted cannot redirect a write or expose a byte.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::SnapshotError;

/// An open snapshot directory; names inside it are resolved from its descriptor.
pub struct SnapshotDir {
    fd: OwnedFd,
    path: PathBuf,
}

fn c_name(name: &str) -> CString {
    // The names are this module's constants, without NUL.
    CString::new(name).unwrap_or_default()
}

fn last_error<T>(done: libc::c_int, ok: T) -> std::io::Result<T> {
    match done {
        -1 => Err(std::io::Error::last_os_error()),
        _ => Ok(ok),
    }
}

impl SnapshotDir {
    /// Open `path` for writing a snapshot: created with mode 0700 if missing (its parents with
    /// the usual modes); refused if it is a symbolic link, not a directory, another user's, or
    /// open to others (group or world bits).
    pub fn create(path: &Path) -> Result<SnapshotDir, SnapshotError> {
        let unsafe_dir = |reason: String| SnapshotError::UnsafeDir { path: path.to_path_buf(), reason };
        let file_err = |what| {
            let path = path.to_path_buf();
            move |source| SnapshotError::File { what, path, source }
        };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(file_err("create the parent of"))?;
        }
        match std::fs::DirBuilder::new().mode(0o700).create(path) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(file_err("create")(e)),
            _ => {}
        }
        let fd = Self::open_dir(path).map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => unsafe_dir("it is a symbolic link".into()),
            Some(libc::ENOTDIR) => unsafe_dir("it is not a directory".into()),
            _ => file_err("open")(e),
        })?;
        let dir = SnapshotDir { fd, path: path.to_path_buf() };
        let meta = dir.file_ref().metadata().map_err(file_err("look at"))?;
        // SAFETY: geteuid has no arguments and cannot fail.
        let own = unsafe { libc::geteuid() };
        if meta.uid() != own {
            return Err(unsafe_dir(format!(
                "it belongs to uid {}, not to this process's uid {own}",
                meta.uid()
            )));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(unsafe_dir(format!("its mode is {:04o}", meta.mode() & 0o7777)));
        }
        Ok(dir)
    }

    /// Open `path` to read a snapshot from.
    pub fn open(path: &Path) -> Result<SnapshotDir, SnapshotError> {
        let fd = Self::open_dir(path).map_err(|source| SnapshotError::File {
            what: "open",
            path: path.to_path_buf(),
            source,
        })?;
        Ok(SnapshotDir { fd, path: path.to_path_buf() })
    }

    fn open_dir(path: &Path) -> std::io::Result<OwnedFd> {
        let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: a NUL-terminated path that lives across the call; the descriptor returned is
        // new and owned by nobody else.
        let fd = unsafe { libc::open(c.as_ptr(), flags) };
        // SAFETY: `fd` is a new, open descriptor (checked above), owned from here on.
        last_error(fd, fd).map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// The directory as a `File`, borrowed for metadata.
    fn file_ref(&self) -> std::mem::ManuallyDrop<File> {
        // SAFETY: the descriptor is open while `self` lives; ManuallyDrop never closes it.
        std::mem::ManuallyDrop::new(unsafe { File::from_raw_fd(self.fd.as_raw_fd()) })
    }

    /// The path of `name` in the directory, for messages.
    pub fn path_of(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    fn err(&self, what: &'static str, name: &str) -> impl FnOnce(std::io::Error) -> SnapshotError {
        let path = self.path_of(name);
        move |source| SnapshotError::File { what, path, source }
    }

    /// Create `name` new, mode 0600, for writing; a file or link already there is refused.
    pub fn create_new(&self, name: &str) -> Result<File, SnapshotError> {
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        self.openat(name, flags, 0o600).map_err(self.err("create", name))
    }

    /// Open `name` for reading, without following a symbolic link.
    pub fn open_file(&self, name: &str) -> Result<File, SnapshotError> {
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        self.openat(name, flags, 0).map_err(self.err("open", name))
    }

    fn openat(&self, name: &str, flags: libc::c_int, mode: libc::mode_t) -> std::io::Result<File> {
        let c = c_name(name);
        // SAFETY: a NUL-terminated name that lives across the call, resolved from an open
        // directory descriptor; the descriptor returned is new and owned by nobody else.
        let fd = unsafe { libc::openat(self.fd.as_raw_fd(), c.as_ptr(), flags, libc::c_uint::from(mode)) };
        // SAFETY: `fd` is a new, open descriptor (checked), owned by the File from here on.
        last_error(fd, fd).map(|fd| unsafe { File::from_raw_fd(fd) })
    }

    /// Remove `name` if it is there (a link is removed, never followed).
    pub fn remove(&self, name: &str) -> Result<(), SnapshotError> {
        let c = c_name(name);
        // SAFETY: a NUL-terminated name that lives across the call, from an open directory.
        let done = unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) };
        match last_error(done, ()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(self.err("remove", name)(e)),
            _ => Ok(()),
        }
    }

    /// Rename `from` to `to` inside the directory (replacing `to`).
    pub fn rename(&self, from: &str, to: &str) -> Result<(), SnapshotError> {
        let (c_from, c_to) = (c_name(from), c_name(to));
        let fd = self.fd.as_raw_fd();
        // SAFETY: NUL-terminated names that live across the call, both in one open directory.
        let done = unsafe { libc::renameat(fd, c_from.as_ptr(), fd, c_to.as_ptr()) };
        last_error(done, ()).map_err(self.err("rename", from))
    }

    /// Flush the directory's entries to disk.
    pub fn sync(&self) -> Result<(), SnapshotError> {
        self.file_ref().sync_all().map_err(self.err("sync", "."))
    }
}
