//! Parsing a virtio-blk request (virtio 1.x §5.2.6) out of an untrusted descriptor chain.
//!
//! Layout: a device-readable 16-byte header {type, reserved, sector}, data descriptors
//! (device-writable for IN and GET_ID, device-readable for OUT, DISCARD and WRITE_ZEROES), and a
//! device-writable status byte last. Every address and length is checked against guest RAM
//! here, before any byte moves.
//!
//! DISCARD and WRITE_ZEROES carry no data but an array of 16-byte ranges {sector u64,
//! num_sectors u32, flags u32} (the header's sector is unused). Their answers follow virtio 1.2
//! §5.2.6 and QEMU's virtio-blk: UNSUPP for a type the driver did not negotiate, for an unknown
//! flag, and for UNMAP on a DISCARD; IOERR for a payload that is not 1 to `MAX_RANGES` whole
//! ranges, a range beyond the disk or longer than the configured maximum, and a read-only disk.

use storage::{Segment, MAX_SEGMENTS, SECTOR_SIZE};
use virtqueue::queue::{Descriptor, Queue, QueueError};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use super::device::SIZE_MAX;
use super::worker::DiskInfo;
use vm_memory::VolatileSlice;

// Request types, the header's `type` (virtio 1.x §5.2.6).
/// Read sectors from the disk into the data descriptors.
pub const VIRTIO_BLK_T_IN: u32 = 0;
/// Write the data descriptors to the disk.
pub const VIRTIO_BLK_T_OUT: u32 = 1;
/// Make the writes completed so far durable (VIRTIO_BLK_F_FLUSH).
pub const VIRTIO_BLK_T_FLUSH: u32 = 4;
/// Answer the disk's ID string (its serial), at most [`ID_LEN`] bytes.
pub const VIRTIO_BLK_T_GET_ID: u32 = 8;
/// Tell the disk a range is unused (VIRTIO_BLK_F_DISCARD).
pub const VIRTIO_BLK_T_DISCARD: u32 = 11;
/// Zero a range, deallocating it if UNMAP is set (VIRTIO_BLK_F_WRITE_ZEROES).
pub const VIRTIO_BLK_T_WRITE_ZEROES: u32 = 13;
/// WRITE_ZEROES may deallocate; the only range flag defined.
pub const VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP: u32 = 1;
/// One DISCARD / WRITE_ZEROES range: {sector u64, num_sectors u32, flags u32}.
pub const RANGE_LEN: usize = 16;
/// Ranges per DISCARD / WRITE_ZEROES request (`max_discard_seg`, `max_write_zeroes_seg`): one,
/// as in QEMU, since each is one fallocate; Linux then sends one range per request.
pub const MAX_RANGES: usize = 1;
/// The most sectors one range covers (`max_discard_sectors`, `max_write_zeroes_sectors`):
/// 32 MiB, so that a RAM disk zeroes one in a few milliseconds; Linux splits larger ones.
pub const MAX_RANGE_SECTORS: u32 = 1 << 16;
// Status byte values (virtio 1.x §5.2.6).
/// The request succeeded.
pub const VIRTIO_BLK_S_OK: u8 = 0;
/// The request failed: the disk reported an error, or the request was malformed, out of
/// range, or a write to a read-only disk.
pub const VIRTIO_BLK_S_IOERR: u8 = 1;
/// The request's type is unknown or was not negotiated, or it carries a flag the device does
/// not take.
pub const VIRTIO_BLK_S_UNSUPP: u8 = 2;
/// Bytes of the request header the driver puts first: {type u32, reserved u32, sector u64}.
pub const HEADER_LEN: u32 = 16;
/// GET_ID answers with at most this many bytes.
pub const ID_LEN: usize = 20;

/// What a parsed request asks of the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RequestKind {
    Read,
    Write,
    Flush,
    GetId,
    Discard,
    WriteZeroes { unmap: bool },
}

/// A request ready for the backend.
pub(crate) struct Request {
    pub head: u16,
    pub kind: RequestKind,
    /// Byte offset on the disk.
    pub offset: u64,
    segments: [Segment; MAX_SEGMENTS],
    pub segment_count: usize,
    pub data_len: u64,
    /// Bytes a DISCARD or WRITE_ZEROES covers from `offset`.
    pub range_len: u64,
    pub status: StatusByte,
}

/// Why a request cannot run; what the guest is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rejection {
    /// Answer this status (IOERR or UNSUPP) through the request's status byte.
    Status { status: StatusByte, code: u8 },
    /// No usable status descriptor: complete the chain with nothing written.
    Unanswerable,
}

/// The outcome of parsing one chain.
pub(crate) enum Parsed {
    Ready,
    Rejected(Rejection),
}

impl Request {
    /// A blank request for `parse` to fill (the worker keeps one and reuses it).
    pub(crate) fn empty() -> Request {
        Request {
            head: 0,
            kind: RequestKind::Read,
            offset: 0,
            segments: [Segment::EMPTY; MAX_SEGMENTS],
            segment_count: 0,
            data_len: 0,
            range_len: 0,
            status: StatusByte(std::ptr::null_mut()),
        }
    }

    /// The data segments (crate-private: they are valid only while the queue they came from lives).
    pub(crate) fn segments(&self) -> &[Segment] {
        &self.segments[..self.segment_count]
    }

    /// Parse the chain at `head` into `self` (reused: no allocation). A `QueueError` means the
    /// queue itself is broken (the device needs a reset); a rejection fails just this request.
    pub(crate) fn parse(&mut self, queue: &Queue, head: u16, disk: &DiskInfo) -> Result<Parsed, QueueError> {
        let (capacity, read_only) = (disk.capacity, disk.read_only);
        // Header, data descriptors and status, at most MAX_SEGMENTS + 2 kept. A longer chain is
        // walked to its end all the same (the walk bounds it), for its status descriptor: such a
        // request is answered IOERR, the queue is not broken.
        let empty = Descriptor { addr: 0, len: 0, flags: 0, next: 0 };
        let mut chain = [empty; MAX_SEGMENTS + 2];
        let (mut count, mut last) = (0, empty);
        let mut too_long = false;
        queue.walk_chain(head, |d| {
            last = d;
            match chain.get_mut(count) {
                Some(slot) => {
                    *slot = d;
                    count += 1;
                }
                None => too_long = true,
            }
            true
        })?;
        let mem = queue.memory();
        self.head = head;
        self.segment_count = 0;
        self.data_len = 0;
        self.range_len = 0;

        let Some(status) = host_status(mem, &last).filter(|_| count >= 2) else {
            return Ok(Parsed::Rejected(Rejection::Unanswerable));
        };
        self.status = status;
        let reject = |code| Ok(Parsed::Rejected(Rejection::Status { status, code }));
        if too_long {
            return reject(VIRTIO_BLK_S_IOERR);
        }
        let header = chain[0];
        if header.is_write_only() || header.len < HEADER_LEN {
            return reject(VIRTIO_BLK_S_IOERR);
        }
        let Some((kind_code, sector)) = read_header(mem, header.addr) else {
            return reject(VIRTIO_BLK_S_IOERR);
        };
        self.kind = match kind_code {
            VIRTIO_BLK_T_IN => RequestKind::Read,
            VIRTIO_BLK_T_OUT => RequestKind::Write,
            VIRTIO_BLK_T_FLUSH => RequestKind::Flush,
            VIRTIO_BLK_T_GET_ID => RequestKind::GetId,
            VIRTIO_BLK_T_DISCARD if disk.discard => RequestKind::Discard,
            // The flag is read with the range.
            VIRTIO_BLK_T_WRITE_ZEROES if disk.write_zeroes => RequestKind::WriteZeroes { unmap: false },
            _ => return reject(VIRTIO_BLK_S_UNSUPP),
        };
        let device_writes = matches!(self.kind, RequestKind::Read | RequestKind::GetId);
        for data in &chain[1..count - 1] {
            // Larger than the size_max the device offers: no correct driver sends it, and the
            // bound keeps a request's length (at most SEG_MAX * SIZE_MAX) within a u32.
            if data.is_write_only() != device_writes || data.len == 0 || data.len > SIZE_MAX {
                return reject(VIRTIO_BLK_S_IOERR);
            }
            let Ok(slice) = mem.get_slice(GuestAddress(data.addr), data.len as usize) else {
                return reject(VIRTIO_BLK_S_IOERR);
            };
            // SAFETY: the slice is inside the queue's memory, which the queue keeps mapped; the
            // crate hands segments only to its BlockWorker, which owns the queue and lets its
            // backend finish (or drop) before the queue goes. The guest may name the same bytes
            // in another request, or write them meanwhile: backends only copy them volatilely or
            // hand them to the kernel (the contract of `Segment::new`).
            self.segments[self.segment_count] =
                unsafe { Segment::new(slice.ptr_guard_mut().as_ptr(), data.len) };
            self.segment_count += 1;
            self.data_len += data.len as u64;
        }
        match self.kind {
            RequestKind::Read | RequestKind::Write => {
                if self.kind == RequestKind::Write && read_only {
                    return reject(VIRTIO_BLK_S_IOERR);
                }
                let in_range = sector
                    .checked_mul(SECTOR_SIZE)
                    .and_then(|offset| offset.checked_add(self.data_len).map(|end| (offset, end)));
                match in_range {
                    Some((offset, end)) if end <= capacity && self.data_len.is_multiple_of(SECTOR_SIZE) => {
                        self.offset = offset;
                    }
                    _ => return reject(VIRTIO_BLK_S_IOERR),
                }
            }
            RequestKind::Flush => self.offset = 0,
            RequestKind::Discard | RequestKind::WriteZeroes { .. } => {
                if let Err(code) = self.parse_range(capacity, read_only) {
                    return reject(code);
                }
            }
            RequestKind::GetId if self.segment_count == 0 => return reject(VIRTIO_BLK_S_IOERR),
            RequestKind::GetId => {}
        }
        Ok(Parsed::Ready)
    }
}

impl Request {
    /// Read and check a DISCARD / WRITE_ZEROES request's one range from its data segments (see
    /// the module documentation); sets `offset`, `range_len` and the UNMAP flag, and leaves no
    /// data segments for the backend. Err: the status to answer.
    fn parse_range(&mut self, capacity: u64, read_only: bool) -> Result<(), u8> {
        const _: () = assert!(MAX_RANGES == 1, "one range is read");
        if self.data_len != RANGE_LEN as u64 {
            return Err(VIRTIO_BLK_S_IOERR);
        }
        let mut range = [0u8; RANGE_LEN];
        let mut filled = 0;
        for segment in self.segments() {
            let n = (segment.len() as usize).min(range.len() - filled);
            // SAFETY: `parse` made the segment from a range of `len` bytes of the queue's memory,
            // which the queue keeps mapped; the guest may write it meanwhile: a volatile copy.
            let slice = unsafe { VolatileSlice::new(segment.addr(), n) };
            slice.copy_to(&mut range[filled..filled + n]);
            filled += n;
        }
        let sector = u64::from_le_bytes(range[0..8].try_into().unwrap_or_default());
        let sectors = u32::from_le_bytes(range[8..12].try_into().unwrap_or_default());
        let flags = u32::from_le_bytes(range[12..16].try_into().unwrap_or_default());
        let unmap = flags & VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP != 0;
        if flags & !VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP != 0 || (unmap && self.kind == RequestKind::Discard) {
            return Err(VIRTIO_BLK_S_UNSUPP);
        }
        if read_only || sectors > MAX_RANGE_SECTORS {
            return Err(VIRTIO_BLK_S_IOERR);
        }
        let len = u64::from(sectors) * SECTOR_SIZE;
        let offset = sector
            .checked_mul(SECTOR_SIZE)
            .filter(|offset| offset.checked_add(len).is_some_and(|end| end <= capacity));
        let Some(offset) = offset else { return Err(VIRTIO_BLK_S_IOERR) };
        if let RequestKind::WriteZeroes { unmap: flag } = &mut self.kind {
            *flag = unmap;
        }
        self.offset = offset;
        self.range_len = len;
        self.segment_count = 0;
        Ok(())
    }
}

/// The status byte's host address, if its descriptor is device-writable and inside RAM.
fn host_status(mem: &GuestMemoryMmap, descriptor: &Descriptor) -> Option<StatusByte> {
    if !descriptor.is_write_only() || descriptor.len == 0 {
        return None;
    }
    // The status is the last byte of the last descriptor.
    let last = descriptor.addr.checked_add(descriptor.len as u64 - 1)?;
    mem.get_slice(GuestAddress(last), 1).ok().map(|s| StatusByte(s.ptr_guard_mut().as_ptr()))
}

fn read_header(mem: &GuestMemoryMmap, addr: u64) -> Option<(u32, u64)> {
    use vm_memory::Bytes;
    let mut header = [0u8; HEADER_LEN as usize];
    mem.read_slice(&mut header, GuestAddress(addr)).ok()?;
    Some((
        u32::from_le_bytes(header[0..4].try_into().unwrap()),
        u64::from_le_bytes(header[8..16].try_into().unwrap()),
    ))
}

/// A request's status byte in guest RAM. Only `parse` makes one, from a checked address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StatusByte(*mut u8);

impl StatusByte {
    pub(crate) fn write(self, code: u8) {
        // SAFETY: the address came from `host_status`: a device-writable byte inside the queue's
        // memory; status bytes are crate-private and used only by the BlockWorker that owns
        // that queue, which keeps the memory mapped.
        unsafe { self.0.write_volatile(code) }
    }

    /// Where it is in this process (the dirty log finds its guest-physical address).
    pub(crate) fn host_address(self) -> *mut u8 {
        self.0
    }
}
