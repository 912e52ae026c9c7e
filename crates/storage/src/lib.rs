//! Block backends for exitless's virtio-blk device.
//!
//! A backend takes requests whose data lives in guest RAM (host pointers the device model has
//! already bounds-checked) and completes them, possibly later. The hot path (submit, poll)
//! allocates nothing, takes no lock and, for the RAM disk, makes no system call.

pub mod ram;

use thiserror::Error;

/// What a request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Read from the disk into the segments.
    Read,
    /// Write the segments to the disk.
    Write,
    /// Make earlier completed writes durable (fdatasync for files).
    Flush,
}

/// One piece of a request's data in host memory (a bounds-checked slice of guest RAM).
#[derive(Debug, Clone, Copy)]
pub struct Segment {
    pub addr: *mut u8,
    pub len: u32,
}

// SAFETY: a Segment is a plain address into guest RAM, which outlives every request; the device
// model guarantees no other request uses the same bytes while one is in flight.
unsafe impl Send for Segment {}

/// A finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The caller's tag from `submit`.
    pub tag: u32,
    /// Bytes transferred (0 for Flush), or the backend error.
    pub result: Result<u32, IoError>,
}

/// Why a request failed: answered to the guest as VIRTIO_BLK_S_IOERR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum IoError {
    #[error("request beyond the end of the disk")]
    OutOfRange,
    #[error("write to a read-only disk")]
    ReadOnly,
    #[error("I/O error (errno {0})")]
    Errno(i32),
    #[error("short transfer")]
    Short,
}

#[derive(Debug, Error)]
pub enum BackendError {
    #[error("cannot open {path}: {source}")]
    Open { path: String, source: std::io::Error },
    #[error("{0}")]
    Other(String),
}

/// A block backend. One is owned by one IOCore thread; not shared.
pub trait Backend: Send {
    /// Size in bytes (a multiple of 512).
    fn capacity(&self) -> u64;
    fn read_only(&self) -> bool;
    /// How many requests may be in flight at once; `submit` beyond that returns `false`.
    fn max_in_flight(&self) -> usize;
    /// Start `op` at byte `offset` over `segments` (at most `MAX_SEGMENTS`). Returns `false`,
    /// doing nothing, when `max_in_flight` requests are already in flight. A backend may complete
    /// the request at once (the RAM disk does); the completion is then returned by the next
    /// `poll`. Range and read-only checks happen here and fail the request through its
    /// completion, not a panic.
    fn submit(&mut self, tag: u32, op: Op, offset: u64, segments: &[Segment]) -> bool;
    /// Push submitted work to the kernel, if the backend batches it (one system call per batch).
    fn kick(&mut self) {}
    /// Hand every finished request to `done`; returns how many.
    fn poll(&mut self, done: &mut dyn FnMut(Completion)) -> usize;
}

/// The most segments one request may have (the device's `seg_max`).
pub const MAX_SEGMENTS: usize = 128;
pub const SECTOR_SIZE: u64 = 512;
