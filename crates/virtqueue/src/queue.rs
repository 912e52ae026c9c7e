//! A split virtqueue, device side (virtio 1.x §2.7), over untrusted guest memory.
//!
//! The rings are validated once, when the driver makes the queue ready: each must lie inside one
//! guest RAM region, so every later ring access is an index masked by the queue size into memory
//! known to exist. Descriptors are checked one by one as chains are walked: a chain longer than
//! its table (the queue's, or an indirect one), an index out of range, or an indirect descriptor
//! not negotiated is an error the caller turns into DEVICE_NEEDS_RESET. Nothing here allocates or
//! locks.

use std::sync::atomic::{fence, AtomicU16, Ordering};

use thiserror::Error;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use crate::dirty::{guest_address, DirtyLog};
use crate::inflight::{InflightArea, InflightError, InflightTracker, Recovery};

/// The largest queue a device offers.
pub const MAX_QUEUE_SIZE: u16 = 256;
/// The most descriptors an indirect table may hold, whatever the queue size: QEMU's
/// VIRTQUEUE_MAX_SIZE. Drivers rely on it: Linux's virtio_blk puts up to `seg_max` + 2
/// descriptors (data, header and status) in one table, 130 on a 128-entry queue when the device
/// offers a `seg_max` of 128.
pub const MAX_INDIRECT_DESCRIPTORS: u32 = 1024;
/// Descriptor flag: the chain continues at `next`.
pub const VIRTQ_DESC_F_NEXT: u16 = 1;
/// Descriptor flag: the device writes this buffer (otherwise it reads it).
pub const VIRTQ_DESC_F_WRITE: u16 = 2;
/// Descriptor flag: the buffer is a table of descriptors (not negotiated here).
pub const VIRTQ_DESC_F_INDIRECT: u16 = 4;
/// Used-ring flag: the device asks the driver not to notify it.
pub const VRING_USED_F_NO_NOTIFY: u16 = 1;
/// Avail-ring flag: the driver asks the device not to interrupt it.
pub const VRING_AVAIL_F_NO_INTERRUPT: u16 = 1;

/// What the driver configured through the transport.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueConfig {
    /// Number of descriptors.
    pub size: u16,
    /// Guest address of the descriptor table.
    pub desc: u64,
    /// Guest address of the available ring (the "driver area").
    pub avail: u64,
    /// Guest address of the used ring (the "device area").
    pub used: u64,
}

/// How the driver broke a queue: the device needs a reset (DEVICE_NEEDS_RESET).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum QueueError {
    /// The driver chose a size the queue cannot have.
    #[error("queue size {0} is not a power of two in 1..={MAX_QUEUE_SIZE}")]
    BadSize(u16),
    /// A ring (named) is misaligned or outside guest RAM.
    #[error("the {0} ring is misaligned or not inside guest RAM")]
    BadRing(&'static str),
    /// The avail index moved by more than the queue holds.
    #[error("the avail index moved by {0}, more than the queue size")]
    AvailIndexJump(u16),
    /// A descriptor index beyond the table.
    #[error("descriptor index {0} is out of range")]
    BadDescriptorIndex(u16),
    /// A chain loops, or is longer than its table.
    #[error("descriptor chain is longer than its descriptor table, the ring's or an indirect one (a loop)")]
    ChainTooLong,
    /// An indirect descriptor the driver may not use.
    #[error("indirect descriptors were not negotiated")]
    UnexpectedIndirect,
    /// An indirect table (of this many bytes) the device cannot read.
    #[error(
        "an indirect descriptor table of {0} bytes is empty, not whole 16-byte descriptors, more than {MAX_INDIRECT_DESCRIPTORS} descriptors or outside guest RAM"
    )]
    BadIndirectTable(u32),
    /// An indirect descriptor inside an indirect table, or one with a next descriptor.
    #[error(
        "an indirect descriptor table holds an indirect descriptor, or the indirect descriptor has a next"
    )]
    NestedIndirect,
    /// A head made available again before the device returned it.
    #[error("descriptor chain {0} was made available again while the device still held it")]
    HeadInUse(u16),
}

/// One descriptor as the device reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    /// Guest address of the buffer.
    pub addr: u64,
    /// Length of the buffer in bytes.
    pub len: u32,
    /// `VIRTQ_DESC_F_*` bits.
    pub flags: u16,
    /// The next descriptor's index, if `VIRTQ_DESC_F_NEXT` is set.
    pub next: u16,
}

impl Descriptor {
    /// A descriptor from its 16 bytes as they lie in guest memory.
    #[inline]
    pub fn from_le_bytes(raw: [u8; 16]) -> Descriptor {
        let [a0, a1, a2, a3, a4, a5, a6, a7, l0, l1, l2, l3, f0, f1, n0, n1] = raw;
        Descriptor {
            addr: u64::from_le_bytes([a0, a1, a2, a3, a4, a5, a6, a7]),
            len: u32::from_le_bytes([l0, l1, l2, l3]),
            flags: u16::from_le_bytes([f0, f1]),
            next: u16::from_le_bytes([n0, n1]),
        }
    }

    /// Does the device write this buffer?
    #[inline]
    pub fn is_write_only(&self) -> bool {
        self.flags & VIRTQ_DESC_F_WRITE != 0
    }
}

/// A ready split virtqueue, device side: where its three rings are in host memory, and the
/// device's place in them. It holds the guest memory it was made from, so the rings stay mapped
/// for as long as the queue exists, whatever happens to the caller's copy (a vhost-user memory
/// table replaced, a VM torn down).
pub struct Queue {
    /// Keeps every region the ring pointers point into mapped (regions are reference-counted).
    mem: GuestMemoryMmap,
    size: u16,
    desc: *mut u8,
    avail: *mut u8,
    used: *mut u8,
    next_avail: u16,
    next_used: u16,
    event_idx: bool,
    /// VIRTIO_F_INDIRECT_DESC was negotiated: a chain may continue in a table in guest RAM.
    indirect: bool,
    /// `next_used` when the driver was last signalled (for EVENT_IDX suppression).
    signalled_used: Option<u16>,
    /// Heads taken from the avail ring and not yet returned in a published used element, one
    /// bit each: the driver may not offer such a head again (the same buffers twice).
    held: [u64; MAX_QUEUE_SIZE as usize / 64],
    /// Heads returned by `add_used` since the last `publish_used`, released when it runs.
    returned: [u16; MAX_QUEUE_SIZE as usize],
    returned_count: usize,
    /// Heads in flight are also kept in memory shared with a vhost-user frontend, and those a
    /// crashed predecessor held are served again first (see [`crate::inflight`]).
    inflight: Option<Box<InflightTracker>>,
    /// During a live migration: the dirty log, and the used ring's guest-physical address
    /// (vhost's `log_guest_addr`), whose pages are marked as the device writes them.
    used_log: Option<(DirtyLog, u64)>,
}

// SAFETY: the ring pointers point into regions of `mem`, which the queue holds, so they stay valid
// wherever the queue goes; every access through them is atomic or volatile, since the guest
// writes the same memory concurrently.
unsafe impl Send for Queue {}

fn ring_ptr(
    mem: &GuestMemoryMmap,
    addr: u64,
    len: usize,
    align: u64,
    what: &'static str,
) -> Result<*mut u8, QueueError> {
    if !addr.is_multiple_of(align) {
        return Err(QueueError::BadRing(what));
    }
    let slice = mem.get_slice(GuestAddress(addr), len).map_err(|_| QueueError::BadRing(what))?;
    Ok(slice.ptr_guard_mut().as_ptr())
}

impl Queue {
    /// Validate `config` against guest memory and make a queue of it.
    pub fn new(mem: &GuestMemoryMmap, config: QueueConfig, event_idx: bool) -> Result<Queue, QueueError> {
        let size = config.size;
        if size == 0 || size > MAX_QUEUE_SIZE || !size.is_power_of_two() {
            return Err(QueueError::BadSize(size));
        }
        let n = size as usize;
        // Sizes include the event words at the end of the avail and used rings (EVENT_IDX).
        let desc = ring_ptr(mem, config.desc, 16 * n, 16, "descriptor")?;
        let avail = ring_ptr(mem, config.avail, 6 + 2 * n, 2, "available")?;
        let used = ring_ptr(mem, config.used, 6 + 8 * n, 4, "used")?;
        Ok(Queue {
            mem: mem.clone(),
            size,
            desc,
            avail,
            used,
            next_avail: 0,
            next_used: 0,
            event_idx,
            indirect: false,
            signalled_used: None,
            held: [0; MAX_QUEUE_SIZE as usize / 64],
            returned: [0; MAX_QUEUE_SIZE as usize],
            returned_count: 0,
            inflight: None,
            used_log: None,
        })
    }

    /// Accept indirect descriptor tables (the driver negotiated VIRTIO_F_INDIRECT_DESC).
    pub fn with_indirect_descriptors(mut self, enabled: bool) -> Queue {
        self.indirect = enabled;
        self
    }

    /// Mark in `log` every page of the used ring the device writes, the ring lying at
    /// guest-physical address `used_gpa` (live migration: vhost's VHOST_VRING_F_LOG).
    pub fn with_used_log(mut self, log: DirtyLog, used_gpa: u64) -> Queue {
        self.used_log = Some((log, used_gpa));
        self
    }

    /// Start (`Some`) or stop (`None`) marking the used ring's pages in a dirty log, on a running
    /// queue (a VMM's own live migration), at the guest-physical address the ring has in the
    /// queue's memory.
    pub fn set_used_log(&mut self, log: Option<DirtyLog>) {
        self.used_log = log.and_then(|log| Some((log, guest_address(&self.mem, self.used)?)));
    }

    /// Mark `len` bytes at `offset` in the used ring dirty, if the ring is logged.
    #[inline]
    fn log_used(&self, offset: usize, len: u64) {
        if let Some((log, used)) = &self.used_log {
            log.mark(used.saturating_add(offset as u64), len);
        }
    }

    /// The guest memory the queue's rings (and its chains' buffers) live in.
    #[inline]
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// Where the descriptor table, available ring and used ring are mapped in this process
    /// (checked against guest memory when the queue was made): the addresses a vhost-user
    /// frontend gives its backend (SET_VRING_ADDR), which translates them through the memory
    /// table.
    pub fn host_addresses(&self) -> (u64, u64, u64) {
        (self.desc as u64, self.avail as u64, self.used as u64)
    }

    /// The number of descriptors (a power of two).
    #[inline]
    pub fn size(&self) -> u16 {
        self.size
    }

    /// The index in the avail ring of the next request the device will take (vhost-user's
    /// "vring base", returned to the frontend when a ring stops).
    #[inline]
    pub fn next_avail(&self) -> u16 {
        self.next_avail
    }

    /// The used ring's `idx` in guest memory now: how far whoever serves the ring (this queue,
    /// or a vhost-user daemon given its addresses) has returned requests.
    #[inline]
    pub fn used_index(&self) -> u16 {
        self.used_u16(2).load(Ordering::Acquire)
    }

    /// Resume a ring another device implementation (or an earlier connection) served: take
    /// requests from avail index `next_avail` on, and continue the used ring where its `idx` in
    /// guest memory says. A new queue starts at 0 for both, which is right for a ring the driver
    /// has just set up.
    pub fn resume(&mut self, next_avail: u16) {
        self.next_avail = next_avail;
        self.next_used = self.used_index();
        self.signalled_used = None;
    }

    /// Track heads in flight in `area` from now on, after `resume`: bring it up to date with the
    /// used ring (finishing a batch a crashed predecessor left half done), resume at the used
    /// index plus the heads it holds in flight, and serve those again, in the order they were
    /// taken, before new avail entries.
    pub fn track_inflight(&mut self, area: InflightArea) -> Result<Recovery, InflightError> {
        let (tracker, recovery) = InflightTracker::recover(area, self.size, self.next_used)?;
        for &head in tracker.pending_resubmits() {
            // `recover` checked every head against the queue size.
            self.held[head as usize / 64] |= 1u64 << (head % 64);
        }
        self.next_avail = recovery.next_avail;
        self.inflight = Some(Box::new(tracker));
        Ok(recovery)
    }

    /// The in-flight tracker, if the queue has one.
    #[inline]
    pub fn inflight(&self) -> Option<&InflightTracker> {
        self.inflight.as_deref()
    }

    /// The 16-bit word at `offset` in the avail ring: at most `4 + 2 * size`.
    #[inline]
    fn avail_u16(&self, offset: usize) -> &AtomicU16 {
        assert!(offset <= 4 + 2 * self.size as usize);
        // SAFETY: the avail ring is `6 + 2 * size` bytes of `self.mem`, checked in `new` and
        // kept mapped by `self`, so the word is inside it for as long as the borrow of `self`;
        // the ring and the offset are 2-byte aligned.
        unsafe { AtomicU16::from_ptr(self.avail.add(offset).cast()) }
    }

    /// The 16-bit word at `offset` in the used ring: at most `4 + 8 * size`.
    #[inline]
    fn used_u16(&self, offset: usize) -> &AtomicU16 {
        assert!(offset <= 4 + 8 * self.size as usize);
        // SAFETY: the used ring is `6 + 8 * size` bytes of `self.mem`, checked in `new` and
        // kept mapped by `self`; the ring is 4-byte aligned and the offset even.
        unsafe { AtomicU16::from_ptr(self.used.add(offset).cast()) }
    }

    #[inline]
    fn avail_idx(&self) -> u16 {
        self.avail_u16(2).load(Ordering::Acquire)
    }

    #[inline]
    fn avail_flags(&self) -> u16 {
        self.avail_u16(0).load(Ordering::Acquire)
    }

    /// `used_event`, the word after the avail ring (EVENT_IDX).
    #[inline]
    fn used_event(&self) -> u16 {
        self.avail_u16(4 + 2 * self.size as usize).load(Ordering::Acquire)
    }

    /// Are there requests the device has not taken yet?
    #[inline]
    pub fn has_avail(&self) -> Result<bool, QueueError> {
        let pending = self.avail_idx().wrapping_sub(self.next_avail);
        if pending > self.size {
            return Err(QueueError::AvailIndexJump(pending));
        }
        let resubmits = self.inflight.as_ref().is_some_and(|t| !t.pending_resubmits().is_empty());
        Ok(pending != 0 || resubmits)
    }

    /// Take the head of the next available chain. The device holds it until it returns it with
    /// `add_used` and `publish_used`; the driver offering it again meanwhile is an error.
    #[inline]
    pub fn pop_avail(&mut self) -> Result<Option<u16>, QueueError> {
        // Heads a crashed predecessor held come first; they are marked held already.
        if let Some(head) = self.inflight.as_mut().and_then(|t| t.next_resubmit()) {
            return Ok(Some(head));
        }
        if !self.has_avail()? {
            return Ok(None);
        }
        let slot = (self.next_avail % self.size) as usize;
        let head = self.avail_u16(4 + 2 * slot).load(Ordering::Acquire);
        if head >= self.size {
            return Err(QueueError::BadDescriptorIndex(head));
        }
        let (word, bit) = (head as usize / 64, 1u64 << (head % 64));
        if self.held[word] & bit != 0 {
            return Err(QueueError::HeadInUse(head));
        }
        self.held[word] |= bit;
        if let Some(tracker) = &mut self.inflight {
            tracker.mark_in_flight(head);
        }
        self.next_avail = self.next_avail.wrapping_add(1);
        Ok(Some(head))
    }

    /// Read descriptor `index` of the ring's table.
    #[inline]
    pub fn descriptor(&self, index: u16) -> Result<Descriptor, QueueError> {
        if index >= self.size {
            return Err(QueueError::BadDescriptorIndex(index));
        }
        let mut raw = [0u8; 16];
        // SAFETY: `index < size`, so the 16 bytes lie inside the descriptor table validated in
        // `new` and kept mapped by `self.mem`. A volatile copy: the guest may change them
        // concurrently, and we only use the copy.
        unsafe {
            let src = self.desc.add(16 * index as usize);
            for (i, byte) in raw.iter_mut().enumerate() {
                *byte = src.add(i).read_volatile();
            }
        }
        Ok(Descriptor::from_le_bytes(raw))
    }

    /// Walk the chain starting at `head`, calling `visit` for each buffer descriptor until it
    /// returns `false`; an indirect descriptor (if negotiated) continues the chain in its table,
    /// as its last element. A chain longer than its table (the queue's, or the indirect one) is a
    /// loop.
    pub fn walk_chain(&self, head: u16, mut visit: impl FnMut(Descriptor) -> bool) -> Result<(), QueueError> {
        let mut index = head;
        for _ in 0..self.size {
            let descriptor = self.descriptor(index)?;
            if descriptor.flags & VIRTQ_DESC_F_INDIRECT != 0 {
                return self.walk_indirect(descriptor, visit);
            }
            if !visit(descriptor) || descriptor.flags & VIRTQ_DESC_F_NEXT == 0 {
                return Ok(());
            }
            index = descriptor.next;
        }
        Err(QueueError::ChainTooLong)
    }

    /// Walk the table an indirect descriptor points to (virtio 1.x §2.7.5.3): whole
    /// descriptors, at most MAX_INDIRECT_DESCRIPTORS of them (not bounded by the queue size, as
    /// in QEMU), inside guest RAM, none indirect itself. A chain longer than the table is a loop.
    fn walk_indirect(
        &self,
        table: Descriptor,
        mut visit: impl FnMut(Descriptor) -> bool,
    ) -> Result<(), QueueError> {
        if !self.indirect {
            return Err(QueueError::UnexpectedIndirect);
        }
        if table.flags & VIRTQ_DESC_F_NEXT != 0 {
            return Err(QueueError::NestedIndirect);
        }
        let bad_table = QueueError::BadIndirectTable(table.len);
        let count = table.len / 16;
        if count == 0 || !table.len.is_multiple_of(16) || count > MAX_INDIRECT_DESCRIPTORS {
            return Err(bad_table);
        }
        let slice =
            self.mem.get_slice(GuestAddress(table.addr), table.len as usize).map_err(|_| bad_table)?;
        let mut index = 0u32;
        for _ in 0..count {
            let mut raw = [0u8; 16];
            // `index < count`, so the 16 bytes are inside the slice; the copy is volatile.
            slice.subslice(index as usize * 16, 16).map_err(|_| bad_table)?.copy_to(&mut raw[..]);
            let descriptor = Descriptor::from_le_bytes(raw);
            if descriptor.flags & VIRTQ_DESC_F_INDIRECT != 0 {
                return Err(QueueError::NestedIndirect);
            }
            if !visit(descriptor) || descriptor.flags & VIRTQ_DESC_F_NEXT == 0 {
                return Ok(());
            }
            index = u32::from(descriptor.next);
            if index >= count {
                return Err(QueueError::BadDescriptorIndex(descriptor.next));
            }
        }
        Err(QueueError::ChainTooLong)
    }

    /// Put a finished chain in the used ring (not yet visible: see `publish_used`).
    #[inline]
    pub fn add_used(&mut self, head: u16, written: u32) {
        let slot = (self.next_used % self.size) as usize;
        // SAFETY: `slot < size`, so the element lies inside the used ring validated in `new` and
        // kept mapped by `self.mem`; 4-byte aligned.
        unsafe {
            let elem = self.used.add(4 + 8 * slot);
            elem.cast::<u32>().write_volatile((head as u32).to_le());
            elem.add(4).cast::<u32>().write_volatile(written.to_le());
        }
        self.log_used(4 + 8 * slot, 8);
        self.next_used = self.next_used.wrapping_add(1);
        // Every head is returned at most once per time it is held, so this has room unless the
        // caller returns heads it never took; those need no release.
        if let Some(entry) = self.returned.get_mut(self.returned_count) {
            *entry = head;
            self.returned_count += 1;
        }
    }

    /// Make the used elements added so far visible to the driver, which may then offer their
    /// heads again.
    #[inline]
    pub fn publish_used(&mut self) {
        let batch = &self.returned[..self.returned_count];
        if let Some(tracker) = &mut self.inflight {
            tracker.link_batch(batch);
        }
        fence(Ordering::Release);
        self.used_u16(2).store(self.next_used, Ordering::Release);
        self.log_used(2, 2);
        if let Some(tracker) = &mut self.inflight {
            tracker.clear_batch(batch, self.next_used);
        }
        for &head in &self.returned[..self.returned_count] {
            if let Some(word) = self.held.get_mut(head as usize / 64) {
                *word &= !(1u64 << (head % 64));
            }
        }
        self.returned_count = 0;
    }

    /// After `publish_used`: should the driver be interrupted?
    #[inline]
    pub fn needs_interrupt(&mut self) -> bool {
        fence(Ordering::SeqCst);
        let new = self.next_used;
        let old = self.signalled_used.replace(new);
        if self.event_idx {
            match old {
                None => true,
                Some(old) => vring_need_event(self.used_event(), new, old),
            }
        } else {
            self.avail_flags() & VRING_AVAIL_F_NO_INTERRUPT == 0
        }
    }

    /// Ask the driver not to notify (the device polls), or to notify again.
    #[inline]
    pub fn set_notifications(&mut self, enabled: bool) {
        if self.event_idx {
            // avail_event, after the used ring: the driver notifies once avail passes it.
            let event = if enabled { self.next_avail } else { self.next_avail.wrapping_sub(1) };
            self.used_u16(4 + 8 * self.size as usize).store(event, Ordering::Release);
            self.log_used(4 + 8 * self.size as usize, 2);
        }
        let flags = if enabled { 0 } else { VRING_USED_F_NO_NOTIFY };
        self.used_u16(0).store(flags, Ordering::Release);
        self.log_used(0, 2);
        // Make the change visible before the caller re-checks the avail ring.
        fence(Ordering::SeqCst);
    }
}

/// virtio's `vring_need_event`: has `new` passed `event` since `old`?
#[inline]
pub fn vring_need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}
