//! `--api-disk-dir DIR`: the directories in which a disk added through the control API may
//! open its file (docs/security.md, "Paths from others").
//!
//! The API's client names a file (`path`, or `ram` with `path`), and the daemon, often root,
//! would open whatever it names. So a disk that names a file is opened only if the file lies
//! inside a directory the operator allowed, and the check is on the file opened, not on the
//! text: each directory is opened once at start, the path under it is resolved by `openat2`
//! with RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS (the kernel refuses `..`, an absolute symbolic
//! link or a relative one that leads out of the directory, as it walks), and the disk is then
//! opened through the descriptor that walk gave (`/proc/self/fd/N`), so a path changed
//! meanwhile cannot swap the file. Without any directory no such disk is added; `ram=SIZE`
//! and `null=SIZE` open no file and are always allowed. `--disk` is the operator's own and is
//! not checked here.

use std::ffi::CString;
use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use storage::DiskSpec;
use thiserror::Error;

/// Why the control API refuses, or cannot find, a disk's file.
#[derive(Debug, Error)]
pub enum DiskDirError {
    /// An `--api-disk-dir` could not be opened at start.
    #[error("--api-disk-dir {dir}: {source}; give an existing directory the daemon can open")]
    OpenDir { dir: PathBuf, source: std::io::Error },
    /// The daemon's working directory, against which relative paths are taken, is unknown.
    #[error("cannot find the daemon's working directory, against which --api-disk-dir and the API's relative paths are taken: {0}")]
    WorkingDirectory(std::io::Error),
    /// The daemon allows the API no file at all.
    #[error(
        "{path}: the control API adds a disk that opens a file only if the daemon was started with \
         --api-disk-dir DIR and the file lies inside DIR; without it only ram=SIZE and null=SIZE \
         disks may be added (or give the disk to the daemon with --disk)"
    )]
    NoDirs { path: PathBuf },
    /// The path does not name a file under any allowed directory.
    #[error(
        "{path} is not inside any --api-disk-dir ({dirs}): the control API opens only files in \
         those directories; give the file's path inside one of them"
    )]
    Outside { path: PathBuf, dirs: String },
    /// The path starts inside an allowed directory but leads out of it.
    #[error(
        "{path} leads out of --api-disk-dir {dir} (through `..` or a symbolic link): the control \
         API opens only files inside it; give the file's own path inside the directory"
    )]
    Escapes { path: PathBuf, dir: PathBuf },
    /// The path is under an allowed directory, but there is no such file (or it cannot be
    /// looked up).
    #[error("cannot open {path} in --api-disk-dir {dir}: {source}")]
    Lookup { path: PathBuf, dir: PathBuf, source: std::io::Error },
}

impl DiskDirError {
    /// The control API's answer: 403 for a file the operator did not allow, 400 for one that
    /// is allowed but not there.
    pub fn status(&self) -> u16 {
        match self {
            DiskDirError::NoDirs { .. } | DiskDirError::Outside { .. } | DiskDirError::Escapes { .. } => 403,
            DiskDirError::Lookup { .. } => 400,
            DiskDirError::OpenDir { .. } | DiskDirError::WorkingDirectory(_) => 500,
        }
    }
}

/// One allowed directory: held open from the start, so what it is cannot change, and known by
/// the name the operator gave and by its real name (symbolic links resolved), so that a client
/// may use either.
#[derive(Debug)]
struct AllowedDir {
    given: PathBuf,
    real: PathBuf,
    fd: OwnedFd,
}

/// The directories `--api-disk-dir` allows (none: the API opens no file).
#[derive(Debug, Default)]
pub struct ApiDiskDirs {
    dirs: Vec<AllowedDir>,
    /// The daemon's working directory, which a relative path in a request is taken against,
    /// as `--disk`'s are.
    cwd: PathBuf,
}

impl ApiDiskDirs {
    /// Open each of `dirs` (relative ones against the working directory).
    pub fn open(dirs: &[PathBuf]) -> Result<ApiDiskDirs, DiskDirError> {
        if dirs.is_empty() {
            return Ok(ApiDiskDirs::default());
        }
        let cwd = std::env::current_dir().map_err(DiskDirError::WorkingDirectory)?;
        let dirs = dirs
            .iter()
            .map(|dir| {
                let given = cwd.join(dir);
                let open_error = |source| DiskDirError::OpenDir { dir: dir.clone(), source };
                let file = OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
                    .open(&given)
                    .map_err(open_error)?;
                // The name of the directory actually opened, whatever links led to it.
                let real =
                    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).map_err(open_error)?;
                Ok(AllowedDir { given, real, fd: file.into() })
            })
            .collect::<Result<_, DiskDirError>>()?;
        Ok(ApiDiskDirs { dirs, cwd })
    }

    /// The directories, for messages.
    fn names(&self) -> String {
        let names: Vec<String> = self.dirs.iter().map(|d| d.given.display().to_string()).collect();
        names.join(", ")
    }

    /// Find `path` beneath an allowed directory without opening it for I/O: an `O_PATH`
    /// descriptor of the file it names, which the disk is then opened through.
    pub fn resolve(&self, path: &Path) -> Result<OwnedFd, DiskDirError> {
        if self.dirs.is_empty() {
            return Err(DiskDirError::NoDirs { path: path.to_owned() });
        }
        let absolute = self.cwd.join(path);
        let mut refusal = None;
        for dir in &self.dirs {
            // The prefix only says which directory to resolve beneath: the kernel's walk from
            // that directory's descriptor decides what the file is.
            let rest = [&dir.given, &dir.real].into_iter().find_map(|name| absolute.strip_prefix(name).ok());
            let Some(rest) = rest else { continue };
            match open_beneath(&dir.fd, rest) {
                Ok(fd) => return Ok(fd),
                Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                    refusal.get_or_insert(DiskDirError::Escapes {
                        path: path.to_owned(),
                        dir: dir.given.clone(),
                    });
                }
                Err(source) => {
                    refusal.get_or_insert(DiskDirError::Lookup {
                        path: path.to_owned(),
                        dir: dir.given.clone(),
                        source,
                    });
                }
            }
        }
        Err(refusal.unwrap_or_else(|| DiskDirError::Outside { path: path.to_owned(), dirs: self.names() }))
    }
}

/// The file `disk` opens, if it opens one. Every kind of disk is named, so a new kind that
/// opens a path has to say so here.
pub fn path_of(disk: &DiskSpec) -> Option<&Path> {
    match disk {
        DiskSpec::File { path, .. } | DiskSpec::RamFile { path, .. } => Some(path),
        // The cluster's configuration file, which names the keyring librbd reads: without
        // `conf=`, librados' system-wide one (/etc/ceph/ceph.conf), which the operator set up.
        DiskSpec::Rbd(spec) => spec.conf.as_deref(),
        DiskSpec::Ram { .. } | DiskSpec::Null { .. } => None,
    }
}

/// `disk`, opening `path` instead of the file it names.
pub fn with_path(disk: &DiskSpec, path: PathBuf) -> DiskSpec {
    match disk.clone() {
        DiskSpec::File { read_only, direct, .. } => DiskSpec::File { path, read_only, direct },
        DiskSpec::RamFile { read_only, .. } => DiskSpec::RamFile { path, read_only },
        DiskSpec::Rbd(spec) => DiskSpec::Rbd(storage::RbdSpec { conf: Some(path), ..spec }),
        other => other,
    }
}

/// `openat2(dir, rest, O_PATH | O_CLOEXEC, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`: the file
/// `rest` names, if its walk from `dir` never leaves `dir` (EXDEV otherwise). O_PATH opens no
/// file for I/O: a FIFO does not block it and a device sees nothing.
fn open_beneath(dir: &OwnedFd, rest: &Path) -> std::io::Result<OwnedFd> {
    let rest = if rest.as_os_str().is_empty() { Path::new(".") } else { rest };
    let name = CString::new(rest.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path holds a NUL byte"))?;
    // SAFETY: open_how is plain integers, for which zero is valid (no flags).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    loop {
        // SAFETY: `name` is NUL-terminated and `how` a valid open_how of the size given; both
        // outlive the call, which writes to neither. The result is checked before it is owned.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                name.as_ptr(),
                std::ptr::addr_of!(how),
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd >= 0 {
            let fd = i32::try_from(fd).map_err(|_| std::io::Error::from_raw_os_error(libc::EBADF))?;
            // SAFETY: a new descriptor nothing else owns.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let error = std::io::Error::last_os_error();
        // EAGAIN: a rename elsewhere raced the walk's `..` checks; the kernel asks to retry.
        if !matches!(error.raw_os_error(), Some(libc::EAGAIN | libc::EINTR)) {
            return Err(error);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs(allowed: &Path) -> ApiDiskDirs {
        ApiDiskDirs::open(&[allowed.to_owned()]).unwrap()
    }

    #[test]
    fn finds_a_file_inside_and_refuses_every_way_out() {
        let top = tempfile::tempdir().unwrap();
        let allowed = top.path().join("allowed");
        std::fs::create_dir(&allowed).unwrap();
        std::fs::create_dir(allowed.join("sub")).unwrap();
        std::fs::write(allowed.join("in.img"), b"x").unwrap();
        std::fs::write(top.path().join("out.img"), b"x").unwrap();
        std::os::unix::fs::symlink(top.path().join("out.img"), allowed.join("abs-link")).unwrap();
        std::os::unix::fs::symlink("../out.img", allowed.join("rel-link")).unwrap();
        std::os::unix::fs::symlink("../in.img", allowed.join("sub/in-link")).unwrap();
        let dirs = dirs(&allowed);
        for inside in ["in.img", "sub/../in.img", "sub/in-link", "./in.img"] {
            assert!(dirs.resolve(&allowed.join(inside)).is_ok(), "{inside} refused");
        }
        for escape in ["abs-link", "rel-link", "../out.img", "sub/../../out.img"] {
            let error = dirs.resolve(&allowed.join(escape)).unwrap_err();
            assert!(matches!(error, DiskDirError::Escapes { .. }), "{escape}: {error}");
            assert_eq!(error.status(), 403);
        }
        let error = dirs.resolve(&top.path().join("out.img")).unwrap_err();
        assert!(matches!(error, DiskDirError::Outside { .. }), "{error}");
        let error = dirs.resolve(Path::new("/etc/passwd")).unwrap_err();
        assert!(error.to_string().contains("--api-disk-dir"), "{error}");
        let error = dirs.resolve(&allowed.join("missing")).unwrap_err();
        assert_eq!(error.status(), 400, "{error}");
    }

    #[test]
    fn without_directories_no_path_is_allowed() {
        let error = ApiDiskDirs::default().resolve(Path::new("/tmp/x.img")).unwrap_err();
        assert_eq!(error.status(), 403);
        assert!(error.to_string().contains("--api-disk-dir"), "{error}");
        let ram = DiskSpec::Ram { size: 1 << 20 };
        assert_eq!(path_of(&ram), None);
        let file = DiskSpec::RamFile { path: "/dev/shm/a".into(), read_only: true };
        assert_eq!(path_of(&file), Some(Path::new("/dev/shm/a")));
    }

    #[test]
    fn a_directory_that_is_not_there_is_an_error_at_start() {
        let error = ApiDiskDirs::open(&["/nonexistent/disks".into()]).unwrap_err();
        assert!(error.to_string().contains("/nonexistent/disks"), "{error}");
    }
}
