//! The bench's real disk: a file in a scratch directory on a real file system (not tmpfs or
//! ramfs), filled with data once and kept for later runs, served with O_DIRECT.

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use thiserror::Error;

/// `statfs` f_type of tmpfs (and /dev/shm).
pub(super) const TMPFS_MAGIC: i64 = 0x0102_1994;
/// `statfs` f_type of ramfs.
const RAMFS_MAGIC: i64 = 0x8584_58f6;

/// Why the scratch directory cannot hold the bench's real disk.
#[derive(Debug, Error)]
pub enum ScratchError {
    #[error("--scratch {0}: no such directory (create it, or name a directory on a real disk)")]
    Missing(PathBuf),
    #[error("--scratch {0}: not a directory")]
    NotADirectory(PathBuf),
    #[error("--scratch {0}: cannot inspect it: {1}")]
    Inspect(PathBuf, #[source] std::io::Error),
    #[error("--scratch {0}: the file system is read-only (name a writable directory on a real disk)")]
    ReadOnly(PathBuf),
    #[error(
        "--scratch {0}: on {1}, which is memory, not a disk (name a directory on a real disk, e.g. \
         --scratch /var/tmp, or measure only the RAM disk with --disk ram=1G)"
    )]
    InMemory(PathBuf, &'static str),
    #[error("--scratch {dir}: {free} MiB free, the real disk needs {needed} MiB (free some, or use --disk scratch=SIZE)")]
    NoSpace { dir: PathBuf, free: u64, needed: u64 },
    #[error("--scratch {0}: cannot write the disk file {1}: {2}")]
    Write(PathBuf, PathBuf, #[source] std::io::Error),
    #[error("--scratch {0}: the file system does not take O_DIRECT ({1}); name a directory on a real disk")]
    NoDirectIo(PathBuf, #[source] std::io::Error),
}

/// Checks that `dir` can hold a real disk: an existing, writable directory on a file system that
/// is not memory.
pub fn check(dir: &Path) -> Result<(), ScratchError> {
    let meta = match std::fs::metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(ScratchError::Missing(dir.into())),
        Err(e) => return Err(ScratchError::Inspect(dir.into(), e)),
    };
    if !meta.is_dir() {
        return Err(ScratchError::NotADirectory(dir.into()));
    }
    let fs_type = file_system(dir).map_err(|e| ScratchError::Inspect(dir.into(), e))?;
    let (read_only, _) = space(dir).map_err(|e| ScratchError::Inspect(dir.into(), e))?;
    if read_only {
        return Err(ScratchError::ReadOnly(dir.into()));
    }
    match fs_type {
        TMPFS_MAGIC => Err(ScratchError::InMemory(dir.into(), "tmpfs")),
        RAMFS_MAGIC => Err(ScratchError::InMemory(dir.into(), "ramfs")),
        _ => Ok(()),
    }
}

/// The disk file of `size` bytes in `dir`: reused if an earlier run left it complete, written
/// otherwise (non-zero data, then synced and dropped from the page cache). Calls `filling` before
/// it writes.
pub fn prepare(dir: &Path, size: u64, filling: impl FnOnce(&Path)) -> Result<PathBuf, ScratchError> {
    prepare_as(dir, "exitless-bench", size, filling)
}

/// [`prepare`], the file named `<stem>-<size>M.img` (several disks of one size side by side).
pub fn prepare_as(
    dir: &Path,
    stem: &str,
    size: u64,
    filling: impl FnOnce(&Path),
) -> Result<PathBuf, ScratchError> {
    check(dir)?;
    let path = dir.join(format!("{stem}-{}M.img", size >> 20));
    let complete = std::fs::metadata(&path)
        .is_ok_and(|m| m.is_file() && m.len() == size && m.blocks().saturating_mul(512) >= size);
    if !complete {
        let (_, free) = space(dir).map_err(|e| ScratchError::Inspect(dir.into(), e))?;
        if free < size {
            return Err(ScratchError::NoSpace { dir: dir.into(), free: free >> 20, needed: size >> 20 });
        }
        filling(&path);
        let partial = dir.join(format!("{stem}-{}M.img.partial-{}", size >> 20, std::process::id()));
        let written = fill(&partial, size)
            .and_then(|()| drop_cached(&partial))
            .and_then(|()| std::fs::rename(&partial, &path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&partial);
            return Err(ScratchError::Write(dir.into(), path, e));
        }
    }
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .map_err(|e| ScratchError::NoDirectIo(dir.into(), e))?;
    Ok(path)
}

/// Writes `size` bytes of non-zero data to a new file at `path` and syncs it: reads of
/// never-written blocks (or tmpfs pages) are cheaper than reads of real data, which would flatter
/// every side.
pub fn fill(path: &Path, size: u64) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    let mut chunk = vec![0u8; 1 << 20];
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for byte in chunk.iter_mut() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        *byte = state as u8 | 1;
    }
    let mut left = size;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        file.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    file.sync_all()
}

/// What the bench makes of a disk file's pages in the host's page cache before every run (fio's
/// or a guest's), so that each run finds the cache as its row says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageCache {
    /// Nothing: the disk's I/O bypasses the cache (O_DIRECT), or the disk is memory.
    AsIs,
    /// The whole file is read into it: every read hits (the backend matrix's `buffered` disk).
    Warm,
    /// Its dirty pages are written back and all of them dropped: reads go to the disk (`cold`).
    Cold,
}

impl PageCache {
    /// Bring `path`'s pages to this state; a failure is reported, and the run goes on.
    pub fn prepare(self, path: &Path) {
        let done = match self {
            PageCache::AsIs => return,
            PageCache::Warm => read_through(path),
            PageCache::Cold => drop_page_cache(path),
        };
        if let Err(e) = done {
            super::progress(format_args!("cannot make {}'s page cache {self:?}: {e}", path.display()));
        }
    }
}

/// Reads all of `path`, so that its pages are in the page cache (a cached file costs a copy).
fn read_through(path: &Path) -> std::io::Result<()> {
    let mut file = std::fs::File::open(path)?;
    let mut chunk = vec![0u8; 1 << 20];
    while file.read(&mut chunk)? != 0 {}
    Ok(())
}

/// Writes `path`'s dirty pages back and drops all of its pages from the page cache: the next
/// reads go to the disk.
fn drop_page_cache(path: &Path) -> std::io::Result<()> {
    std::fs::File::open(path)?.sync_data()?;
    drop_cached(path)
}

/// Drops a synced file on a real disk from the page cache, so the first O_DIRECT reads find it
/// on the device and the cache holds no gigabyte of it (not for tmpfs, where the cache is the
/// file).
fn drop_cached(path: &Path) -> std::io::Result<()> {
    let file = std::fs::File::open(path)?;
    // SAFETY: an advisory call on a descriptor we own; no memory is passed.
    let status = unsafe {
        libc::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(&file), 0, 0, libc::POSIX_FADV_DONTNEED)
    };
    match status {
        0 => Ok(()),
        errno => Err(std::io::Error::from_raw_os_error(errno)),
    }
}

/// `dir`'s file system type (statfs f_type); any path will do.
pub(super) fn file_system(dir: &Path) -> std::io::Result<i64> {
    let path = c_path(dir)?;
    // SAFETY: statfs is plain old data; all-zero is a valid value.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `fs` is a valid, writable statfs.
    if unsafe { libc::statfs(path.as_ptr(), &mut fs) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fs.f_type as i64)
}

/// Whether `dir`'s file system is mounted read-only, and the bytes an unprivileged writer may
/// still use in it.
fn space(dir: &Path) -> std::io::Result<(bool, u64)> {
    let path = c_path(dir)?;
    // SAFETY: statvfs is plain old data; all-zero is a valid value.
    let mut vfs: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `vfs` is a valid, writable statvfs.
    if unsafe { libc::statvfs(path.as_ptr(), &mut vfs) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let read_only = vfs.f_flag & libc::ST_RDONLY != 0;
    Ok((read_only, (vfs.f_bavail as u64).saturating_mul(vfs.f_frsize as u64)))
}

fn c_path(path: &Path) -> std::io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "path holds a NUL byte"))
}

/// A 16 MiB file of data in /var/tmp, which must be on a real file system (on tmpfs the cache
/// is the file), just written and synced: the file and its length.
#[cfg(test)]
pub(crate) fn file_on_disk() -> (tempfile::NamedTempFile, usize) {
    let dir = Path::new("/var/tmp");
    assert_ne!(file_system(dir).unwrap(), TMPFS_MAGIC, "{} is on tmpfs", dir.display());
    let file = tempfile::Builder::new().prefix("exitless-page-cache").tempfile_in(dir).unwrap();
    let len = 16 << 20;
    file.as_file().write_all(&vec![0x5a; len]).unwrap();
    file.as_file().sync_all().unwrap();
    (file, len)
}

/// The share of `file`'s pages in the page cache (mincore over a mapping of it).
#[cfg(test)]
pub(crate) fn cached_share(file: &std::fs::File, len: usize) -> f64 {
    use std::os::fd::AsRawFd;
    let page = 4096;
    let mut resident = vec![0u8; len.div_ceil(page)];
    // SAFETY: a fresh read-only shared mapping of `len` bytes of an open file, at an address
    // the kernel chooses; only mincore reads it, and it is unmapped before returning.
    unsafe {
        let base =
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0);
        assert_ne!(base, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        assert_eq!(libc::mincore(base, len, resident.as_mut_ptr()), 0);
        libc::munmap(base, len);
    }
    resident.iter().filter(|&&page| page & 1 == 1).count() as f64 / resident.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_cache_makes_a_file_cached_or_not_before_a_run() {
        let (file, len) = file_on_disk();
        PageCache::Cold.prepare(file.path());
        assert!(cached_share(file.as_file(), len) < 0.1, "dropped");
        PageCache::Warm.prepare(file.path());
        assert!(cached_share(file.as_file(), len) > 0.9, "read into the cache");
        PageCache::AsIs.prepare(file.path());
        assert!(cached_share(file.as_file(), len) > 0.9, "left alone");
    }

    #[test]
    fn refuses_memory_and_missing_directories() {
        assert!(matches!(check(Path::new("/dev/shm")), Err(ScratchError::InMemory(_, "tmpfs"))));
        assert!(matches!(check(Path::new("/nonexistent/exitless")), Err(ScratchError::Missing(_))));
        assert!(matches!(check(Path::new("/proc/self/status")), Err(ScratchError::NotADirectory(_))));
    }

    /// /var/tmp is on the root file system (ext4) on these machines, as on most.
    #[test]
    fn makes_the_file_once_and_reuses_it() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let mut filled = 0;
        let path = prepare(dir.path(), 4 << 20, |_| filled += 1).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 4 << 20);
        assert!(std::fs::read(&path).unwrap().iter().all(|&b| b != 0));
        assert_eq!(prepare(dir.path(), 4 << 20, |_| filled += 1).unwrap(), path);
        assert_eq!(filled, 1, "the second run reuses the file");
    }
}
