//! A raw disk image (or block device) driven through io_uring.
//!
//! `submit` writes a submission queue entry (for a file on a file system with O_DIRECT it also
//! hands every second one to the kernel: see `FILE_KICK_BATCH`); `kick` hands over what is left
//! in one `io_uring_enter`; `poll` reaps finished entries from the completion queue without
//! blocking. Every request owns one slot of a table allocated at open: its tag, its expected
//! length and its iovecs, which stay put until the kernel reports the request done.

mod flushes;

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::path::Path;

use io_uring::{opcode, squeue, types, IoUring};

use self::flushes::{Arrival, CompletedWrites, Flushes};
use crate::completions::CompletionRing;
use crate::open::{open_without_blocking, FileKind, OpenError, Wanted};
use crate::validate::validate;
use crate::{
    Backend, BackendError, Capabilities, Completion, IoError, Op, Segment, DEFAULT_MAX_IN_FLIGHT,
    MAX_SEGMENTS, SECTOR_SIZE,
};

/// The deepest queue `FileDiskOptions::max_in_flight` accepts (the iovec table is
/// `max_in_flight * MAX_SEGMENTS * 16` bytes: 8 MiB here).
pub const MAX_QUEUE_DEPTH: usize = 4096;

/// The most requests `submit` queues for a regular file opened with O_DIRECT before it hands
/// them to the kernel itself. io_uring holds the block I/O of a larger batch in a plug until it
/// has prepared the batch's last request (it plugs for more than two), and a file system
/// prepares each request slowly, so the disk idles meanwhile. A block device prepares a request
/// quickly and, a loop device at least, does better with the whole batch, since each call wakes
/// its worker, and buffered I/O mostly completes inside the call: both keep one call per batch.
/// The runs that chose 2, and larger groups, are in docs/tuning.md.
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

/// What a slot's request is to the FLUSH bookkeeping (see `flushes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A read: nothing to count.
    Read,
    /// A write, Discard or WriteZeroes: counted as it completes.
    Write,
    /// A FLUSH whose fdatasync runs in this slot.
    Sync,
    /// A FLUSH waiting for the running fdatasync, not in the kernel: it needs the writes
    /// counted up to `needs`.
    Waiting { needs: u64 },
}

/// The request that owns a slot, while the kernel works on it (or it waits to be handed over).
#[derive(Debug, Clone, Copy)]
struct Slot {
    tag: u32,
    role: Role,
    /// Completion queue entries still to come: 2 for a range request written through (its
    /// fallocate and the fdatasync linked after it), 1 otherwise.
    pending: u8,
    /// The first error one of its entries reported.
    error: Option<IoError>,
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
    /// Writes carry RWF_DSYNC and range requests an fdatasync (`Backend::set_write_through`).
    write_through: bool,
    /// The kernel refused a cancel of everything at once (IORING_ASYNC_CANCEL_ANY, Linux 5.19):
    /// `cancel_all` cancels request by request instead.
    cancel_each: bool,
    /// The fdatasync this disk runs for FLUSHes, and what is durable.
    flushes: Flushes,
    /// fdatasyncs handed to the kernel for FLUSHes.
    fdatasyncs: u64,
}

/// The user_data of `cancel_all`'s entries: above every slot index (a u32), so `reap` never
/// takes their completions for a request's.
const CANCEL_USER_DATA: u64 = u64::MAX;

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
    /// How Discard and WriteZeroes are done, where they can be.
    fallocate: FallocateModes,
    /// Reported as the disk's physical block size.
    physical_block_size: u32,
}

/// The fallocate(2) mode that does each range operation on this file, if one does.
///
/// - A regular file: DISCARD punches a hole (PUNCH_HOLE | KEEP_SIZE), if the file system can:
///   tried at open on the range just past the end of the file, which holds nothing. WRITE_ZEROES
///   is ZERO_RANGE | KEEP_SIZE on the file systems known to have it (ext4, XFS; trying it would
///   allocate blocks), and a punched hole where the driver allows unmapping or the file system
///   has no ZERO_RANGE (tmpfs): a hole reads back as zeros.
/// - A block device (the kernel's `blkdev_fallocate`): ZERO_RANGE | KEEP_SIZE is a zero-out that
///   writes zeros where the device cannot offload it, so WRITE_ZEROES always works;
///   PUNCH_HOLE | KEEP_SIZE is a zero-out that may unmap and fails (EOPNOTSUPP) on a device
///   without a write-zeroes command, so it serves DISCARD and unmapping WRITE_ZEROES only where
///   the device has one (`queue/write_zeroes_max_bytes`). A true discard (NO_HIDE_STALE) is
///   refused by current kernels.
/// - A read-only disk: none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct FallocateModes {
    discard: Option<i32>,
    zeroes: Option<i32>,
    zeroes_unmap: Option<i32>,
}

impl FallocateModes {
    const PUNCH_HOLE: i32 = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    const ZERO_RANGE: i32 = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;

    /// Find out what `file` (of `kind`, `size` bytes) can do; see the type's documentation.
    fn probe(file: &File, kind: FileKind, size: u64) -> FallocateModes {
        match kind {
            FileKind::BlockDevice => {
                let offloads = block_queue_limit(file, "write_zeroes_max_bytes").is_some_and(|max| max > 0);
                let punch = offloads.then_some(Self::PUNCH_HOLE);
                FallocateModes {
                    discard: punch,
                    zeroes: Some(Self::ZERO_RANGE),
                    zeroes_unmap: punch.or(Some(Self::ZERO_RANGE)),
                }
            }
            FileKind::Regular => {
                let punch = punches_holes(file, size).then_some(Self::PUNCH_HOLE);
                let zero = zeroes_ranges(file).then_some(Self::ZERO_RANGE);
                FallocateModes { discard: punch, zeroes: zero.or(punch), zeroes_unmap: punch.or(zero) }
            }
            _ => FallocateModes::default(),
        }
    }

    fn mode(self, op: Op) -> Option<i32> {
        match op {
            Op::Discard { .. } => self.discard,
            Op::WriteZeroes { unmap: false, .. } => self.zeroes,
            Op::WriteZeroes { unmap: true, .. } => self.zeroes_unmap,
            Op::Read | Op::Write | Op::Flush => None,
        }
    }
}

/// Does the file system punch holes? Asked by punching one past the end of the file, where
/// there is nothing to lose (file systems return at once there, or EOPNOTSUPP).
fn punches_holes(file: &File, size: u64) -> bool {
    let Ok(offset) = libc::off_t::try_from(size) else { return false };
    // SAFETY: fallocate on a descriptor `file` owns; no memory is involved.
    unsafe { libc::fallocate(file.as_raw_fd(), FallocateModes::PUNCH_HOLE, offset, 4096) == 0 }
}

/// Is the file on a file system known to have FALLOC_FL_ZERO_RANGE (ext4, XFS)?
fn zeroes_ranges(file: &File) -> bool {
    const EXT4_SUPER_MAGIC: libc::c_long = 0xef53;
    const XFS_SUPER_MAGIC: libc::c_long = 0x5846_5342;
    file_system_magic(file).is_ok_and(|magic| matches!(magic, EXT4_SUPER_MAGIC | XFS_SUPER_MAGIC))
}

/// A block device's queue limit `name` (/sys/dev/block/MAJOR:MINOR/queue/NAME), if readable.
fn block_queue_limit(file: &File, name: &str) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let device = file.metadata().ok()?.rdev();
    // The dev_t encoding of glibc's major() and minor().
    let major = ((device >> 8) & 0xfff) | ((device >> 32) & !0xfff);
    let minor = (device & 0xff) | ((device >> 12) & !0xff);
    let text = std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/queue/{name}")).ok()?;
    text.trim().parse().ok()
}

/// The physical block size to report: a block device's own, a file's file system block size;
/// 512 if that is not a power of two from 512 to 64 KiB.
fn physical_block_size(file: &File, kind: FileKind) -> u32 {
    use std::os::unix::fs::MetadataExt;
    let size = match kind {
        FileKind::BlockDevice => block_queue_limit(file, "physical_block_size"),
        _ => file.metadata().ok().map(|m| m.blksize()),
    };
    size.and_then(|size| u32::try_from(size).ok())
        .filter(|size| size.is_power_of_two() && (512..=65536).contains(size))
        .unwrap_or(512)
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
        Self::open_counting(path.as_ref(), options, CompletedWrites::new())
    }

    /// Open `path` `count` times (at least once), one backend per queue of a multi-queue device,
    /// each with its own io_uring: a FLUSH on one queue covers the writes completed on all.
    pub fn open_queues(
        path: impl AsRef<Path>,
        options: FileDiskOptions,
        count: usize,
    ) -> Result<Vec<FileDisk>, BackendError> {
        let writes = CompletedWrites::new();
        (0..count.max(1)).map(|_| Self::open_counting(path.as_ref(), options, writes.clone())).collect()
    }

    /// `open_with`, counting completed writes in `writes` (shared with the disk's other backends).
    fn open_counting(
        path: &Path,
        options: FileDiskOptions,
        writes: CompletedWrites,
    ) -> Result<FileDisk, BackendError> {
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
        let kind = FileKind::of(&file)
            .map_err(|source| BackendError::Open { path: path.display().to_string(), source })?;
        let regular = kind == FileKind::Regular;
        let fallocate = if options.read_only {
            FallocateModes::default()
        } else {
            FallocateModes::probe(&file, kind, size)
        };

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
            fallocate,
            physical_block_size: physical_block_size(&file, kind),
        };
        Ok(FileDisk::on_ring(file, ring, ring_depth, shape, writes))
    }

    /// A FileDisk on `file` and `ring` (of `depth` entries), with every slot idle, counting
    /// completed writes in `writes`.
    fn on_ring(file: File, ring: IoUring, depth: u32, shape: Shape, writes: CompletedWrites) -> FileDisk {
        let idle_slot = Slot {
            tag: 0,
            role: Role::Read,
            pending: 0,
            error: None,
            expected: 0,
            busy: false,
            on_workers: false,
        };
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
            write_through: false,
            cancel_each: false,
            flushes: Flushes::new(writes),
            fdatasyncs: 0,
        }
    }

    /// A 1 MiB "disk" whose file is `pipe`, the read end of a pipe, on a ring of 8: a read waits
    /// until someone writes to the pipe (io_uring parks it on the pipe's poll queue), so it is
    /// a request a disk holds, but one a cancel ends (`testing::disk_on_a_pipe`).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn on_pipe(pipe: File) -> std::io::Result<FileDisk> {
        let shape = Shape {
            capacity: 1 << 20,
            read_only: false,
            direct: false,
            kick_batch: usize::MAX,
            rw_on_workers: false,
            sqpoll_idle_ms: None,
            fallocate: FallocateModes::default(),
            physical_block_size: 512,
        };
        Ok(FileDisk::on_ring(pipe, new_ring(8, None)?, 8, shape, CompletedWrites::new()))
    }

    /// Whether the file is really open with O_DIRECT (false after a fallback to buffered I/O).
    pub fn direct(&self) -> bool {
        self.shape.direct
    }

    /// How many fdatasyncs this disk has handed to the kernel for FLUSHes: fewer than the
    /// FLUSHes when some found their writes durable already (see `flushes`).
    pub fn fdatasyncs(&self) -> u64 {
        self.fdatasyncs
    }

    fn in_flight(&self) -> usize {
        self.slots.len() - self.free_slots.len() + self.immediate.len()
    }

    /// The submission queue entry for `op` in `slot`, its iovecs written into the slot's table.
    fn prepare(&mut self, slot: usize, op: Op, offset: u64, segments: &[Segment]) -> squeue::Entry {
        let fd = types::Fd(self.file.as_raw_fd());
        let entry = match op {
            Op::Flush => opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build(),
            Op::Discard { len } | Op::WriteZeroes { len, .. } => {
                // `submit` found the mode before it took the slot.
                let mode = self.shape.fallocate.mode(op).unwrap_or(0);
                opcode::Fallocate::new(fd, len).offset(offset).mode(mode).build()
            }
            Op::Read | Op::Write => {
                let table = &mut self.iovecs[slot * MAX_SEGMENTS..(slot + 1) * MAX_SEGMENTS];
                let mut count = 0;
                // `validate` allowed at most MAX_SEGMENTS segments: they fit the table.
                for (iovec, segment) in table.iter_mut().zip(segments.iter().filter(|s| !s.is_empty())) {
                    *iovec = libc::iovec { iov_base: segment.addr().cast(), iov_len: segment.len() as usize };
                    count += 1;
                }
                let iovecs = table.as_ptr();
                if op == Op::Read {
                    opcode::Readv::new(fd, iovecs, count).offset(offset).build()
                } else {
                    // Written through: durable before it completes, as with O_DSYNC.
                    let flags = if self.write_through { libc::RWF_DSYNC } else { 0 };
                    opcode::Writev::new(fd, iovecs, count).offset(offset).rw_flags(flags).build()
                }
            }
        };
        entry.user_data(slot as u64)
    }

    /// Take every completion the kernel has posted; returns how many were handed to `done`
    /// (FLUSHes that waited for an fdatasync that ended included).
    fn reap(&mut self, done: &mut dyn FnMut(Completion)) -> usize {
        let mut count = 0;
        let mut cancel_refused = false;
        // The fdatasync that ended, if one did (one runs at a time): its result.
        let mut synced = None;
        for entry in self.ring.completion() {
            // Slots are numbered below the ring depth, a u32.
            let Ok(index) = u32::try_from(entry.user_data()) else {
                // A cancel's own completion (`cancel_all`): EINVAL from a kernel without
                // IORING_ASYNC_CANCEL_ANY, which is then asked once per request.
                cancel_refused |= entry.user_data() == CANCEL_USER_DATA && entry.result() == -libc::EINVAL;
                continue;
            };
            let Some(slot) = self.slots.get_mut(index as usize).filter(|slot| slot.busy) else {
                continue; // Not ours: cannot happen, and must not free a slot twice.
            };
            let result = match u32::try_from(entry.result()) {
                Err(_) => Err(IoError::Errno(entry.result().saturating_neg())),
                Ok(moved) if moved < slot.expected => Err(IoError::Short),
                Ok(_) => Ok(slot.expected),
            };
            // A fallocate's linked fdatasync is cancelled (ECANCELED) when the fallocate fails:
            // the first error is the one to report.
            slot.error = slot.error.or(result.err());
            slot.pending = slot.pending.saturating_sub(1);
            if slot.pending > 0 {
                continue;
            }
            slot.busy = false;
            if slot.on_workers {
                self.in_flight_on_workers -= 1;
            }
            self.free_slots.push(index);
            let result = match slot.error {
                Some(error) => Err(error),
                None => Ok(slot.expected),
            };
            match slot.role {
                // Counted before the driver hears of it, so its next FLUSH covers it.
                Role::Write => self.flushes.writes().add(),
                Role::Sync => synced = Some(result),
                Role::Read | Role::Waiting { .. } => {}
            }
            done(Completion { tag: slot.tag, result });
            count += 1;
        }
        if let Some(result) = synced {
            count += self.end_sync(result, done);
        }
        if cancel_refused && !self.cancel_each {
            self.cancel_each = true;
            self.cancel_all();
        }
        count
    }

    /// The running fdatasync ended with `result`: the waiting FLUSHes it covers complete with
    /// it, and the others share a new one. Returns how many completed.
    fn end_sync(&mut self, result: Result<u32, IoError>, done: &mut dyn FnMut(Completion)) -> usize {
        let covers = self.flushes.synced(result.is_ok());
        let mut count = 0;
        let mut still_waiting = None;
        for index in self.slot_indices() {
            let slot = &mut self.slots[index as usize];
            let Role::Waiting { needs } = slot.role else { continue };
            if !slot.busy {
                continue;
            }
            if needs > covers {
                still_waiting = still_waiting.or(Some(index as usize));
                continue;
            }
            slot.busy = false;
            self.free_slots.push(index);
            done(Completion { tag: slot.tag, result: result.map(|_| 0) });
            count += 1;
        }
        if let Some(index) = still_waiting {
            // The fdatasync runs in one waiting FLUSH's slot and covers every one still waiting.
            let entry = self.prepare(index, Op::Flush, 0, &[]);
            let covers = self.flushes.covered_now();
            // SAFETY: an fsync entry points at no memory.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                self.flushes.started(covers);
                self.fdatasyncs += 1;
                let slot = &mut self.slots[index];
                (slot.role, slot.pending, slot.on_workers) = (Role::Sync, 1, true);
                self.in_flight_on_workers += 1;
                self.kick();
            } else {
                // Cannot happen (the queue has room for two entries per slot): the FLUSHes fail
                // rather than wait for ever (the next `poll` hands them over).
                self.end_waiting(IoError::Errno(libc::EBUSY));
            }
        }
        count
    }

    /// Complete every FLUSH waiting for the running fdatasync with `error`, through `immediate`
    /// (they are not in the kernel). Returns how many.
    fn end_waiting(&mut self, error: IoError) -> usize {
        let mut count = 0;
        for index in self.slot_indices() {
            let slot = &mut self.slots[index as usize];
            if slot.busy && matches!(slot.role, Role::Waiting { .. }) {
                slot.busy = false;
                self.free_slots.push(index);
                self.immediate.push(Completion { tag: slot.tag, result: Err(error) });
                count += 1;
            }
        }
        count
    }

    /// Every slot's index (slots are numbered below the ring depth, a u32).
    fn slot_indices(&self) -> std::ops::Range<u32> {
        0..u32::try_from(self.slots.len()).unwrap_or(u32::MAX)
    }

    /// Queue a cancel of every request with `user_data` (`CANCEL_USER_DATA`: of every request),
    /// handing the queue to the kernel first if it is full. `false` if it stayed full.
    fn push_cancel(&mut self, entry: squeue::Entry) -> bool {
        let entry = entry.user_data(CANCEL_USER_DATA);
        for _ in 0..2 {
            // SAFETY: a cancel names requests by user_data or file and points at no memory.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return true;
            }
            let _ = self.ring.submit();
        }
        false
    }
}

/// An io_uring for `depth` requests. A request takes at most two submission queue entries (a
/// range request written through: its fallocate and an fdatasync), so a submission queue of
/// `2 * depth` never finds a push full; the completion queue is twice that, so it never
/// overflows.
fn new_ring(depth: u32, sqpoll_idle_ms: Option<u32>) -> std::io::Result<IoUring> {
    let mut builder = IoUring::builder();
    if let Some(idle) = sqpoll_idle_ms {
        builder.setup_sqpoll(idle);
    }
    builder.build(depth.saturating_mul(2))
}

/// Is `file` on a file system kept in memory (tmpfs, ramfs)? Its reads and writes have no
/// asynchronous path, so io_uring runs every one in a worker thread, O_DIRECT or not.
pub(crate) fn on_memory_file_system(file: &File) -> std::io::Result<bool> {
    // ramfs's magic number (linux/magic.h), which the libc crate lacks.
    const RAMFS_MAGIC: libc::c_long = 0x8584_58f6;
    Ok(matches!(file_system_magic(file)?, libc::TMPFS_MAGIC | RAMFS_MAGIC))
}

/// The magic number of the file system `file` is on (statfs's f_type).
fn file_system_magic(file: &File) -> std::io::Result<libc::c_long> {
    // SAFETY: an all-zero statfs is a valid value of the plain C struct, which fstatfs fills.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: the descriptor is open for as long as `file`; `stat` is a valid out-pointer.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(stat.f_type)
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

    fn capabilities(&self) -> Capabilities {
        let modes = self.shape.fallocate;
        Capabilities {
            discard: modes.discard.is_some(),
            write_zeroes: modes.zeroes.is_some() && modes.zeroes_unmap.is_some(),
            physical_block_size: self.shape.physical_block_size,
        }
    }

    fn max_in_flight(&self) -> usize {
        self.slots.len()
    }

    fn submit(&mut self, tag: u32, op: Op, offset: u64, segments: &[Segment]) -> bool {
        if self.in_flight() >= self.slots.len() {
            return false;
        }
        let nothing_to_do = |expected| match op.range_len() {
            Some(len) => len == 0,
            None => expected == 0 && op != Op::Flush,
        };
        let expected = match validate(op, offset, segments, self.shape.capacity, self.shape.read_only) {
            Err(error) => return self.immediate.push(Completion { tag, result: Err(error) }),
            Ok(expected) if nothing_to_do(expected) => {
                return self.immediate.push(Completion { tag, result: Ok(0) })
            }
            Ok(_) if op.range_len().is_some() && self.shape.fallocate.mode(op).is_none() => {
                return self.immediate.push(Completion { tag, result: Err(IoError::Unsupported) })
            }
            Ok(expected) => expected,
        };
        // An fdatasync this FLUSH starts, and what it covers.
        let mut sync_covers = None;
        let role = match op {
            Op::Read => Role::Read,
            Op::Flush => match self.flushes.arrive() {
                Arrival::Durable => return self.immediate.push(Completion { tag, result: Ok(0) }),
                Arrival::Wait { needs } => Role::Waiting { needs },
                Arrival::Sync { covers } => {
                    sync_covers = Some(covers);
                    Role::Sync
                }
            },
            Op::Write | Op::Discard { .. } | Op::WriteZeroes { .. } => Role::Write,
        };
        let Some(index) = self.free_slots.pop() else {
            return false; // Cannot happen: fewer than max_in_flight are in flight.
        };
        let slot = index as usize;
        if let Role::Waiting { .. } = role {
            // Not in the kernel: the running fdatasync's completion ends it or starts its own.
            self.slots[slot] =
                Slot { tag, role, pending: 0, error: None, expected: 0, busy: true, on_workers: false };
            return true;
        }
        let entry = self.prepare(slot, op, offset, segments);
        // io_uring hands every fsync and fallocate to a worker.
        let on_workers = op == Op::Flush || op.range_len().is_some() || self.shape.rw_on_workers;
        // Written through, a range request is followed by an fdatasync that runs only once it
        // succeeded (IO_LINK); a write carries RWF_DSYNC instead (`prepare`).
        let sync_after = self.write_through && op.range_len().is_some();
        let entries = if sync_after {
            let sync = opcode::Fsync::new(types::Fd(self.file.as_raw_fd()))
                .flags(types::FsyncFlags::DATASYNC)
                .build()
                .user_data(slot as u64);
            [entry.flags(squeue::Flags::IO_LINK), sync]
        } else {
            [entry.clone(), entry]
        };
        let entries = &entries[..1 + usize::from(sync_after)];
        let pending = 1 + u8::from(sync_after);
        self.slots[slot] = Slot { tag, role, pending, error: None, expected, busy: true, on_workers };
        // SAFETY: the entries' iovecs live in this slot's part of `iovecs`, which is neither
        // freed nor rewritten until the slot is freed by its completion (or Drop waits for it);
        // the buffers they name are guest RAM the caller keeps valid until the completion.
        if unsafe { self.ring.submission().push_multiple(entries) }.is_err() {
            // The submission queue holds max_in_flight entries: full means a broken invariant,
            // so refuse the request rather than lose it.
            self.slots[slot].busy = false;
            self.free_slots.push(index);
            return false;
        }
        self.in_flight_on_workers += usize::from(on_workers);
        if let Some(covers) = sync_covers {
            self.flushes.started(covers);
            self.fdatasyncs += 1;
        }
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

    fn set_write_through(&mut self, write_through: bool) {
        self.write_through = write_through;
    }

    fn completion_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.ring.as_raw_fd())
    }

    fn waits_on_submitter_workers(&self) -> bool {
        self.in_flight_on_workers > 0
    }

    /// One IORING_OP_ASYNC_CANCEL with IORING_ASYNC_CANCEL_ANY (every request on the ring,
    /// Linux 5.19 and later); where the kernel refuses it (`reap` sees EINVAL), one per request,
    /// by its slot (the fdatasync linked after a range request written through is cancelled
    /// with it, by the link).
    /// io_uring cancels a request waiting to be polled at once, and interrupts one its worker
    /// thread runs (the wait then ends if it is interruptible); the cancel's own completion is
    /// ignored. Kicks.
    fn cancel_all(&mut self) -> usize {
        let in_flight = self.slots.len() - self.free_slots.len();
        if in_flight == 0 {
            return 0;
        }
        // FLUSHes waiting for the running fdatasync are not in the kernel: they end here.
        self.end_waiting(IoError::Errno(libc::ECANCELED));
        self.kick();
        if self.cancel_each {
            for index in 0..self.slots.len() {
                if self.slots[index].busy {
                    let builder = types::CancelBuilder::user_data(index as u64);
                    self.push_cancel(opcode::AsyncCancel2::new(builder).build());
                }
            }
        } else {
            self.push_cancel(opcode::AsyncCancel2::new(types::CancelBuilder::any()).build());
        }
        // The kernel takes the cancels now: the caller only polls from here on.
        self.kick_failed = self.ring.submit().is_err();
        in_flight
    }

    fn reopen(&self) -> Result<Box<dyn Backend>, BackendError> {
        let reopen = |source| BackendError::Reopen { source };
        // The same open file (and so the same O_DIRECT choice and page cache), a ring of its own.
        let file = self.file.try_clone().map_err(reopen)?;
        let depth =
            u32::try_from(self.slots.len()).map_err(|_| reopen(std::io::ErrorKind::InvalidInput.into()))?;
        let ring = new_ring(depth, self.shape.sqpoll_idle_ms).map_err(reopen)?;
        let writes = self.flushes.writes().clone();
        Ok(Box::new(FileDisk::on_ring(file, ring, depth, self.shape, writes)))
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
        self.end_waiting(IoError::Errno(libc::ECANCELED));
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
