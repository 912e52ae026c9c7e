//! The dirty log of a live migration (VHOST_F_LOG_ALL with VHOST_USER_PROTOCOL_F_LOG_SHMFD):
//! a bitmap, one bit per 4 KiB page of guest-physical memory, in a memory file the frontend
//! shares with SET_LOG_BASE. Rings started while logging is on mark in it every guest page
//! their worker writes (`virtqueue::dirty`).
//!
//! SET_LOG_BASE is the frontend's word: it is refused, before anything is mapped, unless its
//! size is not 0 and a whole number of 64-bit words (the log is accessed only in 64-bit words,
//! see `virtqueue::dirty`), its offset is page-aligned, and its descriptor is a memory file sealed
//! against shrinking (QEMU's is: so no access can raise SIGBUS) that reaches that far. Whether
//! the log covers guest memory is checked against the memory table (`Session`).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use virtqueue::dirty::{DirtyLog, LOG_WORD};

use crate::error::Error;
use crate::shm::SharedMapping;

/// The largest log accepted: enough for 64 TiB of guest memory.
pub const MAX_LOG_SIZE: u64 = 1 << 31;

/// A mapped dirty log, accessed only atomically and only in 64-bit words (through `DirtyLog`).
pub struct LogRegion {
    /// The handle every worker gets a clone of; it holds the mapping.
    log: DirtyLog,
    /// The frontend's memory file, kept to hand the log to a successor daemon.
    file: OwnedFd,
    /// SET_LOG_BASE's `mmap_size` and `mmap_offset`.
    placement: (u64, u64),
}

fn bad(why: impl Into<String>) -> Error {
    Error::BadLog(why.into())
}

impl LogRegion {
    /// SET_LOG_BASE: check and map `mmap_size` bytes at `mmap_offset` of `fd`. The descriptor
    /// is kept, so that a hand-over can give the log to the successor.
    pub fn map(mmap_size: u64, mmap_offset: u64, fd: OwnedFd) -> Result<Arc<LogRegion>, Error> {
        if mmap_size == 0 || mmap_size > MAX_LOG_SIZE {
            return Err(bad(format!("mmap_size {mmap_size:#x}: give 1 to {MAX_LOG_SIZE:#x} bytes")));
        }
        if !mmap_size.is_multiple_of(LOG_WORD as u64) {
            return Err(bad(format!(
                "mmap_size {mmap_size:#x} is not a multiple of 8 bytes: the log is accessed in 64-bit words"
            )));
        }
        // SAFETY: sysconf has no side effects.
        let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        if !mmap_offset.is_multiple_of(page) {
            return Err(bad(format!("mmap_offset {mmap_offset:#x} is not a multiple of the page size")));
        }
        // SAFETY: an all-zero stat is valid; fstat fills it for a descriptor we own.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open (owned); `stat` is a valid out-pointer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
            return Err(Error::Log { what: "fstat", source: std::io::Error::last_os_error() });
        }
        if stat.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(bad("its descriptor is not a memory file"));
        }
        // SAFETY: F_GET_SEALS on a descriptor we own (fails on files that are not memfds).
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(bad(
                "its file is not a memfd sealed against shrinking (F_SEAL_SHRINK), so it could vanish under the daemon",
            ));
        }
        let end = mmap_offset.checked_add(mmap_size);
        if end.is_none_or(|end| u64::try_from(stat.st_size).is_ok_and(|file| file < end)) {
            return Err(bad(format!(
                "offset {mmap_offset:#x} + {mmap_size:#x} bytes reach past the end of its file ({:#x} bytes)",
                stat.st_size
            )));
        }
        let len = usize::try_from(mmap_size).map_err(|_| bad("too large"))?;
        let offset = libc::off_t::try_from(mmap_offset).map_err(|_| bad("its offset is too large"))?;
        let mapping = Arc::new(
            SharedMapping::map(&fd, len, offset).map_err(|source| Error::Log { what: "mmap", source })?,
        );
        // SAFETY: the mapping's `len` bytes stay mapped until the last `Arc` of it drops, and
        // the handle holds one (as does each clone a worker gets); in this process they are
        // accessed only through `DirtyLog`, atomically in 64-bit words. The frontend writes them
        // from its own process; whatever it writes is just bits, and the sealed file cannot
        // shrink under the mapping.
        let log = unsafe { DirtyLog::new(mapping.addr(), mapping.len(), mapping.clone()) }
            .map_err(|layout| bad(layout.to_string()))?;
        Ok(Arc::new(LogRegion { log, file: fd, placement: (mmap_size, mmap_offset) }))
    }

    /// The memory file the frontend shared the log in.
    pub fn file(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// SET_LOG_BASE's `mmap_size` and `mmap_offset`, as the frontend gave them.
    pub fn placement(&self) -> (u64, u64) {
        self.placement
    }

    /// The bytes of guest-physical address space the log covers, from 0.
    pub fn covers(&self) -> u64 {
        self.log.covers()
    }

    /// A handle for a worker, which keeps the log mapped.
    pub fn dirty_log(&self) -> DirtyLog {
        self.log.clone()
    }
}
