//! A raw disk image (or block device) driven through io_uring.
//!
//! `submit` writes a submission queue entry (for a file on a file system with O_DIRECT it also
//! hands every second one to the kernel: see `FILE_KICK_BATCH`); `kick` hands over what is left
//! in one `io_uring_enter`; `poll` reaps finished entries from the completion queue without
//! blocking. Every request owns one slot of a table allocated at open: its tag, its expected
//! length and its iovecs, which stay put until the kernel reports the request done.

#![warn(missing_docs)]

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::path::Path;

use io_uring::{opcode, squeue, types, IoUring};

use crate::completions::CompletionRing;
use crate::open::{open_without_blocking, FileKind, OpenError, Wanted};
use crate::validate::validate;
use crate::{
    Backend, BackendError, Completion, IoError, Op, Segment, DEFAULT_MAX_IN_FLIGHT, MAX_SEGMENTS, SECTOR_SIZE,
};

/// The deepest queue `FileDiskOptions::max_in_flight` accepts (the iovec table is
/// `max_in_flight * MAX_SEGMENTS * 16` bytes: 8 MiB here).
pub const MAX_QUEUE_DEPTH: usize = 4096;

/// The most requests `submit` queues for a regular file opened with O_DIRECT before it hands
/// them to the kernel itself. io_uring holds the block I/O of a larger batch in a plug until it
/// has prepared the batch's last request (it plugs for more than two), and the file system's
/// part of preparing one is slow (about 5 µs per ext4 write here), so the disk idled meanwhile:
/// on an ext4 file at depth 32, 4 KiB writes ran at 92k IOPS handed over at once and 117k in
/// pairs, reads at 58k and 72k (one alternating run, normal priority). Groups of 3 to 8 ring
/// the disk's doorbell less often (each unplugged write rings it) but start later: faster for
/// writes at depth 32 in one run, slower for the other workloads, no better in another. A block
/// device prepares a request quickly and, a loop device at least, does better with the whole
/// batch, since each call wakes its worker (4 KiB writes at depth 32: 60k at once, 33k in
/// pairs; reads the same either way), and buffered I/O mostly completes inside the call: both
/// keep one call per batch.
const FILE_KICK_BATCH: usize = 2;

/// How to open a `FileDisk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileDiskOptions {
    /// Open read-only; writes fail with `IoError::ReadOnly`.
    pub read_only: bool,
    /// Ask for O_DIRECT (bypass the host page cache); falls back to buffered I/O where the file
    /// system refuses it. With O_DIRECT, buffers and offsets must suit the device's logical block
    /// size, or the request fails with `IoError::Errno(EINVAL)`.
    pub direct: bool,
    /// Requests in flight at once (1 to `MAX_QUEUE_DEPTH`).
    pub max_in_flight: usize,
    /// Let a kernel thread poll the submission queue (IORING_SETUP_SQPOLL), idling after this
    /// many milliseconds. Burns a host CPU; off by default.
    pub sqpoll_idle_ms: Option<u32>,
}

impl Default for FileDiskOptions {
    fn default() -> FileDiskOptions {
        FileDiskOptions {
            read_only: false,
            direct: false,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            sqpoll_idle_ms: None,
        }
    }
}

/// The request that owns a slot, while the kernel works on it.
#[derive(Debug, Clone, Copy)]
struct Slot {
    tag: u32,
    /// Bytes a complete transfer moves (0 for Flush).
    expected: u32,
    busy: bool,
    /// io_uring runs it in one of its worker threads (see `Backend::waits_on_submitter_workers`).
    on_workers: bool,
}

/// A disk image (a regular file or a block device) served through its own io_uring: requests
/// are submitted in batches (`kick`), completions reaped without a system call. Dropping it
/// waits for the kernel to finish every request, since the kernel writes into their buffers.
pub struct FileDisk {
    ring: IoUring,
    file: File,
    shape: Shape,
    slots: Box<[Slot]>,
    /// `MAX_SEGMENTS` iovecs per slot, read by the kernel until the slot's request completes.
    iovecs: Box<[libc::iovec]>,
    /// Indices of idle slots; allocated with room for all of them, so pushes never allocate.
    free_slots: Vec<u32>,
    /// Requests finished without reaching the kernel (range, read-only and empty requests).
    immediate: CompletionRing,
    /// Entries are queued that the last `kick` could not hand to the kernel.
    kick_failed: bool,
    /// Requests in flight that io_uring runs in its worker threads.
    in_flight_on_workers: usize,
}

/// What a FileDisk found out about its file when it opened it, and how it drives its ring: the
/// same for every FileDisk on that file (see `reopen`).
#[derive(Debug, Clone, Copy)]
struct Shape {
    capacity: u64,
    read_only: bool,
    direct: bool,
    /// `submit` kicks once this many entries are queued (`FILE_KICK_BATCH` or never).
    kick_batch: usize,
    /// Reads and writes go to io_uring's worker threads: buffered I/O, or a file on tmpfs,
    /// which has no asynchronous path even with O_DIRECT.
    rw_on_workers: bool,
    /// The ring's kernel polling thread's idle time, if it has one.
    sqpoll_idle_ms: Option<u32>,
}

// SAFETY: the raw pointers in `iovecs` point into guest RAM, which outlives every request, and
// are only used by the kernel on behalf of this FileDisk; the FileDisk (ring, file and tables)
// is used by one thread at a time through `&mut self`.
unsafe impl Send for FileDisk {}

impl FileDisk {
    /// Open `path` with default options, optionally read-only and with O_DIRECT.
    pub fn open(path: impl AsRef<Path>, read_only: bool, direct: bool) -> Result<FileDisk, BackendError> {
        Self::open_with(path, FileDiskOptions { read_only, direct, ..FileDiskOptions::default() })
    }

    /// Open `path` as `options` say: without blocking, refusing anything but a regular file or a
    /// block device.
    pub fn open_with(path: impl AsRef<Path>, options: FileDiskOptions) -> Result<FileDisk, BackendError> {
        let path = path.as_ref();
        let depth = options.max_in_flight;
        let bad_depth = BackendError::BadQueueDepth { requested: depth, limit: MAX_QUEUE_DEPTH };
        let ring_depth = u32::try_from(depth).map_err(|_| bad_depth)?;
        if depth == 0 || depth > MAX_QUEUE_DEPTH {
            return Err(BackendError::BadQueueDepth { requested: depth, limit: MAX_QUEUE_DEPTH });
        }
        let (mut file, direct) =
            open_file(path, options.read_only, options.direct).map_err(|e| BackendError::opening(path, e))?;
        // Seeking to the end sizes block devices too, whose metadata length is 0.
        let size = file
            .seek(SeekFrom::End(0))
            .map_err(|source| BackendError::Open { path: path.display().to_string(), source })?;
        let capacity = size / SECTOR_SIZE * SECTOR_SIZE;
        if capacity == 0 {
            return Err(BackendError::TooSmall { path: path.display().to_string() });
        }
        let regular = FileKind::of(&file)
            .map_err(|source| BackendError::Open { path: path.display().to_string(), source })?
            == FileKind::Regular;

        let ring =
            new_ring(ring_depth, options.sqpoll_idle_ms).map_err(|source| BackendError::Ring { source })?;
        let on_memory_file_system = on_memory_file_system(&file)
            .map_err(|source| BackendError::Open { path: path.display().to_string(), source })?;
        let shape = Shape {
            capacity,
            read_only: options.read_only,
            direct,
            kick_batch: if direct && regular { FILE_KICK_BATCH } else { usize::MAX },
            rw_on_workers: !direct || on_memory_file_system,
            sqpoll_idle_ms: options.sqpoll_idle_ms,
        };
        Ok(FileDisk::on_ring(file, ring, ring_depth, shape))
    }

    /// A FileDisk on `file` and `ring` (of `depth` entries), with every slot idle.
    fn on_ring(file: File, ring: IoUring, depth: u32, shape: Shape) -> FileDisk {
        let idle_slot = Slot { tag: 0, expected: 0, busy: false, on_workers: false };
        let idle_iovec = libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 };
        FileDisk {
            ring,
            file,
            shape,
            slots: vec![idle_slot; depth as usize].into_boxed_slice(),
            iovecs: vec![idle_iovec; depth as usize * MAX_SEGMENTS].into_boxed_slice(),
            free_slots: (0..depth).rev().collect(),
            immediate: CompletionRing::new(depth as usize),
            kick_failed: false,
            in_flight_on_workers: 0,
        }
    }

    /// Whether the file is really open with O_DIRECT (false after a fallback to buffered I/O).
    pub fn direct(&self) -> bool {
        self.shape.direct
    }

    fn in_flight(&self) -> usize {
        self.slots.len() - self.free_slots.len() + self.immediate.len()
    }

    /// The submission queue entry for `op` in `slot`, its iovecs written into the slot's table.
    fn prepare(&mut self, slot: usize, op: Op, offset: u64, segments: &[Segment]) -> squeue::Entry {
        let fd = types::Fd(self.file.as_raw_fd());
        let entry = match op {
            Op::Flush => opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build(),
            Op::Read | Op::Write => {
                let table = &mut self.iovecs[slot * MAX_SEGMENTS..(slot + 1) * MAX_SEGMENTS];
                let mut count = 0;
                // `validate` allowed at most MAX_SEGMENTS segments: they fit the table.
                for (iovec, segment) in table.iter_mut().zip(segments.iter().filter(|s| !s.is_empty())) {
                    *iovec = libc::iovec { iov_base: segment.addr().cast(), iov_len: segment.len() as usize };
                    count += 1;
                }
                let iovecs = table.as_ptr();
                match op {
                    Op::Read => opcode::Readv::new(fd, iovecs, count).offset(offset).build(),
                    _ => opcode::Writev::new(fd, iovecs, count).offset(offset).build(),
                }
            }
        };
        entry.user_data(slot as u64)
    }

    /// Take every completion the kernel has posted; returns how many were handed to `done`.
    fn reap(&mut self, done: &mut dyn FnMut(Completion)) -> usize {
        let mut count = 0;
        for entry in self.ring.completion() {
            // Slots are numbered below the ring depth, a u32.
            let Ok(index) = u32::try_from(entry.user_data()) else { continue };
            let Some(slot) = self.slots.get_mut(index as usize).filter(|slot| slot.busy) else {
                continue; // Not ours: cannot happen, and must not free a slot twice.
            };
            slot.busy = false;
            if slot.on_workers {
                self.in_flight_on_workers -= 1;
            }
            self.free_slots.push(index);
            let result = match u32::try_from(entry.result()) {
                Err(_) => Err(IoError::Errno(entry.result().saturating_neg())),
                Ok(moved) if moved < slot.expected => Err(IoError::Short),
                Ok(_) => Ok(slot.expected),
            };
            done(Completion { tag: slot.tag, result });
            count += 1;
        }
        count
    }
}

/// An io_uring of `depth` entries. The submission queue holds every request in flight, so a push
/// never finds it full; the completion queue is twice as large, so it never overflows.
fn new_ring(depth: u32, sqpoll_idle_ms: Option<u32>) -> std::io::Result<IoUring> {
    let mut builder = IoUring::builder();
    if let Some(idle) = sqpoll_idle_ms {
        builder.setup_sqpoll(idle);
    }
    builder.build(depth)
}

/// Is `file` on a file system kept in memory (tmpfs, ramfs)? Its reads and writes have no
/// asynchronous path, so io_uring runs every one in a worker thread, O_DIRECT or not.
fn on_memory_file_system(file: &File) -> std::io::Result<bool> {
    // SAFETY: an all-zero statfs is a valid value of the plain C struct, which fstatfs fills.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: the descriptor is open for as long as `file`; `stat` is a valid out-pointer.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // ramfs's magic number (linux/magic.h), which the libc crate lacks.
    const RAMFS_MAGIC: libc::c_long = 0x8584_58f6;
    Ok(matches!(stat.f_type, libc::TMPFS_MAGIC | RAMFS_MAGIC))
}

/// Open the file or block device, with O_DIRECT if asked and the file system takes it; returns
/// whether it did.
fn open_file(path: &Path, read_only: bool, direct: bool) -> Result<(File, bool), OpenError> {
    if direct {
        match open_without_blocking(path, read_only, libc::O_DIRECT, Wanted::Disk) {
            Ok(file) => return Ok((file, true)),
            // EINVAL: this file system has no O_DIRECT; buffered I/O still works.
            Err(OpenError::Io(error)) if error.raw_os_error() == Some(libc::EINVAL) => {}
            Err(error) => return Err(error),
        }
    }
    Ok((open_without_blocking(path, read_only, 0, Wanted::Disk)?, false))
}

impl Backend for FileDisk {
    fn capacity(&self) -> u64 {
        self.shape.capacity
    }

    fn read_only(&self) -> bool {
        self.shape.read_only
    }

    fn max_in_flight(&self) -> usize {
        self.slots.len()
    }

    fn submit(&mut self, tag: u32, op: Op, offset: u64, segments: &[Segment]) -> bool {
        if self.in_flight() >= self.slots.len() {
            return false;
        }
        let expected = match validate(op, offset, segments, self.shape.capacity, self.shape.read_only) {
            Err(error) => return self.immediate.push(Completion { tag, result: Err(error) }),
            Ok(0) if op != Op::Flush => return self.immediate.push(Completion { tag, result: Ok(0) }),
            Ok(expected) => expected,
        };
        let Some(index) = self.free_slots.pop() else {
            return false; // Cannot happen: fewer than max_in_flight are in flight.
        };
        let slot = index as usize;
        let entry = self.prepare(slot, op, offset, segments);
        // io_uring hands every fsync to a worker.
        let on_workers = op == Op::Flush || self.shape.rw_on_workers;
        self.slots[slot] = Slot { tag, expected, busy: true, on_workers };
        // SAFETY: the entry's iovecs live in this slot's part of `iovecs`, which is neither
        // freed nor rewritten until the slot is freed by its completion (or Drop waits for it);
        // the buffers they name are guest RAM the caller keeps valid until the completion.
        if unsafe { self.ring.submission().push(&entry) }.is_err() {
            // The submission queue holds max_in_flight entries: full means a broken invariant,
            // so refuse the request rather than lose it.
            self.slots[slot].busy = false;
            self.free_slots.push(index);
            return false;
        }
        self.in_flight_on_workers += usize::from(on_workers);
        if self.ring.submission().len() >= self.shape.kick_batch {
            self.kick();
        }
        true
    }

    fn kick(&mut self) {
        if self.ring.submission().is_empty() {
            return;
        }
        // An error (EINTR, EAGAIN, EBUSY) leaves the entries queued: `poll` tries again.
        self.kick_failed = self.ring.submit().is_err();
    }

    fn completion_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.ring.as_raw_fd())
    }

    fn waits_on_submitter_workers(&self) -> bool {
        self.in_flight_on_workers > 0
    }

    fn reopen(&self) -> Result<Box<dyn Backend>, BackendError> {
        let reopen = |source| BackendError::Reopen { source };
        // The same open file (and so the same O_DIRECT choice and page cache), a ring of its own.
        let file = self.file.try_clone().map_err(reopen)?;
        let depth =
            u32::try_from(self.slots.len()).map_err(|_| reopen(std::io::ErrorKind::InvalidInput.into()))?;
        let ring = new_ring(depth, self.shape.sqpoll_idle_ms).map_err(reopen)?;
        Ok(Box::new(FileDisk::on_ring(file, ring, depth, self.shape)))
    }

    fn poll(&mut self, done: &mut dyn FnMut(Completion)) -> usize {
        if self.kick_failed {
            self.kick();
        }
        self.immediate.drain(done) + self.reap(done)
    }
}

impl Drop for FileDisk {
    /// Wait for the kernel to finish with every slot, since it may still read the iovecs and
    /// write the buffers. Completions still owed are dropped (this is a device reset).
    fn drop(&mut self) {
        while self.free_slots.len() < self.slots.len() {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(error) if error.raw_os_error() == Some(libc::EINTR) => {}
                Err(_) => break, // The ring is broken; closing it cancels what is left.
            }
            self.reap(&mut |_| {});
        }
    }
}

#[cfg(test)]
mod tests;
