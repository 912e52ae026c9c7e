//! Block backends for exitless's virtio-blk device.
//!
//! A backend takes requests whose data lives in guest RAM (host pointers the device model has
//! already bounds-checked) and completes them, possibly later. The hot path (submit, poll)
//! allocates nothing, takes no lock and, for the RAM and null disks, makes no system call.

#![deny(missing_docs)]
#![cfg_attr(not(test), warn(clippy::cast_possible_truncation, clippy::cast_sign_loss))]

pub mod at_once;
mod completions;
pub mod file;
pub mod null;
pub mod open;
pub mod ram;
pub mod rbd;
pub mod spec;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod validate;
mod zeros;

use thiserror::Error;

pub use file::{FileDisk, FileDiskOptions};
pub use null::NullDisk;
pub use ram::RamDisk;
pub use rbd::{RbdDisk, RbdSpec};
pub use spec::DiskSpec;

/// What a request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Read from the disk into the segments.
    Read,
    /// Write the segments to the disk.
    Write,
    /// Make earlier completed writes durable (fdatasync for files).
    Flush,
    /// Let the disk forget `len` bytes at the offset (virtio-blk DISCARD): what they read back
    /// as afterwards is unspecified (zeros on every backend here). No segments.
    Discard {
        /// Bytes, from the request's offset.
        len: u64,
    },
    /// Make `len` bytes at the offset read back as zeros (virtio-blk WRITE_ZEROES); `unmap`:
    /// the disk may deallocate them to do so. No segments.
    WriteZeroes {
        /// Bytes, from the request's offset.
        len: u64,
        /// The driver allows deallocation (VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP).
        unmap: bool,
    },
}

impl Op {
    /// The byte range a Discard or WriteZeroes names; `None` for requests with data or none.
    pub fn range_len(self) -> Option<u64> {
        match self {
            Op::Discard { len } | Op::WriteZeroes { len, .. } => Some(len),
            Op::Read | Op::Write | Op::Flush => None,
        }
    }

    /// Does it change the disk (refused on a read-only one)?
    pub fn writes(self) -> bool {
        !matches!(self, Op::Read | Op::Flush)
    }
}

/// What a backend can do beyond reads, writes and flushes, and the shape it reports to drivers.
/// Found out when the backend opens (see each backend); the same for every backend of a disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// `Op::Discard` works.
    pub discard: bool,
    /// `Op::WriteZeroes` works.
    pub write_zeroes: bool,
    /// The disk's physical block size in bytes (a power of two, at least 512): the size below
    /// which writes cost a read-modify-write, reported as the device's topology.
    pub physical_block_size: u32,
}

impl Default for Capabilities {
    fn default() -> Capabilities {
        Capabilities { discard: false, write_zeroes: false, physical_block_size: 512 }
    }
}

/// One piece of a request's data in host memory (a bounds-checked slice of guest RAM). Making
/// one is `unsafe`: it is a promise that the bytes stay valid while a backend may use them,
/// which is what lets `Backend::submit` be safe.
#[derive(Debug, Clone, Copy)]
pub struct Segment {
    addr: *mut u8,
    len: u32,
}

impl Segment {
    /// A segment of no bytes, which no backend dereferences.
    pub const EMPTY: Segment = Segment { addr: std::ptr::null_mut(), len: 0 };

    /// The `len` bytes at `addr`.
    ///
    /// # Safety
    /// Unless `len` is 0, the bytes must be valid for reads and writes from now until every
    /// request given this segment has completed (returned by the backend's `poll`) or the
    /// backend has been dropped. They may be shared memory that others read and write
    /// concurrently (guest RAM, which the guest may also name in another request in flight):
    /// backends never make Rust references to them; they copy them with volatile accesses or
    /// hand them to the kernel.
    pub unsafe fn new(addr: *mut u8, len: u32) -> Segment {
        Segment { addr, len }
    }

    /// Where the bytes start (null for [`Segment::EMPTY`]); valid as promised to `new`.
    pub fn addr(&self) -> *mut u8 {
        self.addr
    }

    /// How many bytes.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Does it hold no bytes (so `addr` must not be used)?
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

// SAFETY: a Segment is an address and a length; what may be done with the bytes is the promise
// made in `Segment::new`, which does not depend on the thread that holds it.
unsafe impl Send for Segment {}

/// A finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The caller's tag from `submit`.
    pub tag: u32,
    /// Bytes transferred (0 for Flush), or the backend error.
    pub result: Result<u32, IoError>,
}

/// Why a request failed: answered to the guest as VIRTIO_BLK_S_IOERR (VIRTIO_BLK_S_UNSUPP for
/// [`IoError::Unsupported`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum IoError {
    /// The range ends past the disk's capacity, or the request has more than [`MAX_SEGMENTS`]
    /// segments or 4 GiB of data; nothing was done.
    #[error("request beyond the end of the disk")]
    OutOfRange,
    /// A request that changes the disk ([`Op::writes`]) on a read-only disk; nothing was done.
    #[error("write to a read-only disk")]
    ReadOnly,
    /// The host failed the request with this (positive) errno: the kernel's or librbd's, or
    /// ECANCELED after [`Backend::cancel_all`].
    #[error("I/O error (errno {0})")]
    Errno(i32),
    /// The host moved fewer bytes than the request asked for.
    #[error("short transfer")]
    Short,
    /// The disk cannot do this operation (see [`Capabilities`]).
    #[error("this disk cannot do that operation")]
    Unsupported,
}

/// Why a backend could not be set up (never raised on the request path).
#[derive(Debug, Error)]
pub enum BackendError {
    /// The disk's file could not be opened, inspected or sized.
    #[error("cannot open {path}: {source} (check that it exists and that we may read/write it)")]
    Open {
        /// The file as the user named it.
        path: String,
        /// The system's error.
        source: std::io::Error,
    },
    /// The path opens, but is not a regular file or block device (a FIFO, a directory...).
    #[error("{path} {kind_error}")]
    NotADisk {
        /// The file as the user named it.
        path: String,
        /// What it is instead.
        kind_error: open::OpenError,
    },
    /// A disk to be made (RAM, null) was given a size of 0 or not a whole number of sectors.
    #[error("disk size {size} bytes is not a non-zero multiple of 512: choose a size in whole sectors")]
    BadSize {
        /// The size asked for, in bytes.
        size: u64,
    },
    /// An existing disk image holds less than one sector.
    #[error("{path} is smaller than one 512-byte sector: give a disk image of at least 512 bytes")]
    TooSmall {
        /// The file as the user named it.
        path: String,
    },
    /// The RAM disk's file could not be mapped.
    #[error("cannot map {path} into memory: {source} (is there enough address space / memory?)")]
    Map {
        /// The file as the user named it.
        path: String,
        /// mmap's error.
        source: std::io::Error,
    },
    /// The backend's completion machinery (an io_uring, or the RBD disk's eventfd) could not be
    /// made.
    #[error("cannot set up io_uring: {source} (needs Linux 5.6 or later with io_uring enabled)")]
    Ring {
        /// The system's error.
        source: std::io::Error,
    },
    /// The requests in flight asked for are 0 or more than the backend can track.
    #[error("max_in_flight {requested} is out of range: choose 1 to {limit}")]
    BadQueueDepth {
        /// The depth asked for.
        requested: usize,
        /// The backend's largest.
        limit: usize,
    },
    /// [`Backend::reopen`] could not open the disk again.
    #[error("cannot open the disk again for the next driver: {source}")]
    Reopen {
        /// The system's error.
        source: std::io::Error,
    },
    /// [`Backend::reopen`] on a backend that has no need of it (it finishes its requests itself).
    #[error("this kind of disk cannot be opened again")]
    CannotReopen,
    /// An RBD image could not be opened.
    #[error(transparent)]
    Rbd(#[from] rbd::RbdError),
    /// Any other failure to set a disk up, as a message for the user.
    #[error("{0}")]
    Other(String),
}

impl BackendError {
    /// The error for `path` failing to open.
    pub fn opening(path: &std::path::Path, error: open::OpenError) -> BackendError {
        let path = path.display().to_string();
        match error {
            open::OpenError::Io(source) => BackendError::Open { path, source },
            kind_error => BackendError::NotADisk { path, kind_error },
        }
    }
}

/// A block backend. One is owned by one IOCore thread; not shared.
pub trait Backend: Send {
    /// Size in bytes (a multiple of 512).
    fn capacity(&self) -> u64;
    /// Are requests that change the disk refused (with `IoError::ReadOnly`)?
    fn read_only(&self) -> bool;
    /// What the disk can do beyond reads, writes and flushes; a request it cannot do fails
    /// with `IoError::Unsupported`.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }
    /// How many requests may be in flight at once; `submit` beyond that returns `false`.
    fn max_in_flight(&self) -> usize;
    /// Start `op` at byte `offset` over `segments` (at most `MAX_SEGMENTS`). Returns `false`,
    /// doing nothing, when `max_in_flight` requests are already in flight. A backend may complete
    /// the request at once (the RAM and null disks do); the completion is then returned by the next
    /// `poll`. Range and read-only checks happen here and fail the request through its
    /// completion, not a panic.
    fn submit(&mut self, tag: u32, op: Op, offset: u64, segments: &[Segment]) -> bool;
    /// Push submitted work to the kernel, if the backend batches it (one system call per batch).
    fn kick(&mut self) {}
    /// Write through (`true`) or back (`false`, the default): written through, a request that
    /// changes the disk (Write, Discard, WriteZeroes) completes only once it is durable, as
    /// after a Flush. Applies to requests submitted from now on. Backends without a volatile
    /// cache (the RAM and null disks, whose Flush does nothing either) ignore it.
    fn set_write_through(&mut self, _write_through: bool) {}
    /// Hand every finished request to `done`; returns how many.
    fn poll(&mut self, done: &mut dyn FnMut(Completion)) -> usize;
    /// A file descriptor that becomes readable when a request the kernel works on finishes (an
    /// io_uring's), so an owner waiting for the disk can sleep instead of spinning; `None` for
    /// a backend that finishes requests without the kernel.
    fn completion_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    /// The owner slept on `completion_fd` and it woke it: clear what made it readable, if
    /// polling does not (an eventfd's counter), before the next `poll`. Never per request.
    fn completion_fd_fired(&mut self) {}
    /// Are requests in flight that the kernel runs in worker threads it starts from the thread
    /// that submitted them (io_uring's io-wq: buffered I/O, files on tmpfs, every FLUSH)? Those
    /// threads inherit that thread's CPU and scheduling class, so an owner spinning on its core
    /// holds them off until the scheduler's tick (4 ms): it must yield the core while it waits
    /// for them. Other requests finish from the disk's interrupt or the kernel's own threads.
    fn waits_on_submitter_workers(&self) -> bool {
        false
    }
    /// Are requests finished by threads of the backend's own (librbd's messengers and
    /// finishers), which need a core to run on? An owner waiting only for them should sleep on
    /// `completion_fd` at once: spinning, it takes the core those threads (and, for a cluster on
    /// this host, its daemons) would finish the requests on.
    fn completes_on_own_threads(&self) -> bool {
        false
    }
    /// Ask the kernel to cancel every request in flight, for a device reset that has waited too
    /// long for them (a disk that does not answer); returns how many were in flight. Each
    /// cancelled request still completes through `poll`, with `IoError::Errno(ECANCELED)` (or
    /// EINTR, for one interrupted in a kernel worker); one the kernel cannot cancel (a FUSE
    /// request its server already took, an uninterruptible device wait) completes whenever the
    /// disk answers. Never on the request path. Backends that finish requests themselves hold
    /// none: the default does nothing.
    fn cancel_all(&mut self) -> usize {
        0
    }
    /// A new backend on the same disk, for a device reset that gave up waiting for this one's
    /// requests (a disk that does not answer them): this one keeps them until the kernel is
    /// done, while the device goes on with the new one, which sees every write this one
    /// completed. A backend that finishes requests itself never needs it.
    fn reopen(&self) -> Result<Box<dyn Backend>, BackendError> {
        Err(BackendError::CannotReopen)
    }
}

/// The most segments one request may have (the device's `seg_max`).
pub const MAX_SEGMENTS: usize = 128;
/// The unit of a disk's size and of virtio-blk's request offsets, in bytes.
pub const SECTOR_SIZE: u64 = 512;
/// Requests in flight per backend unless configured otherwise (the largest virtqueue is 256).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 256;
