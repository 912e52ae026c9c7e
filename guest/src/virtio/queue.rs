//! A split virtqueue, driver side (virtio 1.x §2.7), in static page-aligned memory.
//!
//! Ring fields the device also touches are accessed as atomics: the avail index is stored with
//! Release after the ring entries it covers, the used index is loaded with Acquire before the
//! entries it covers are read, and a full fence separates "publish" from "does the other side
//! want to hear about it", so neither a notification nor an interrupt can be missed.

use core::sync::atomic::{fence, AtomicBool, AtomicU16, AtomicU32, Ordering};

use super::{phys, DmaStatic, Error};

pub const MAX_QUEUE_SIZE: u16 = 256;
pub const DESC_F_NEXT: u16 = 1;
pub const DESC_F_WRITE: u16 = 2;
/// The descriptor points to a table of descriptors (VIRTIO_F_INDIRECT_DESC, §2.7.5.3).
pub const DESC_F_INDIRECT: u16 = 4;
const AVAIL_F_NO_INTERRUPT: u16 = 1;
const USED_F_NO_NOTIFY: u16 = 1;
/// In polling mode `used_event` is kept this far ahead of the used index (EVENT_IDX), so the
/// device never reaches it: far more than the queue size, well under the u16 wrap.
const USED_EVENT_FAR_AHEAD: u16 = 0x8000;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Descriptor {
    pub addr: u64,
    pub len: u32,
    pub flags: u16,
    pub next: u16,
}

impl Descriptor {
    pub const EMPTY: Descriptor = Descriptor { addr: 0, len: 0, flags: 0, next: 0 };
}

#[repr(C, align(4096))]
struct Page([u8; 4096]);

/// Descriptor table, avail ring and used ring, one page each: big enough for 256 entries
/// (16 * 256, 6 + 2 * 256 and 6 + 8 * 256 bytes).
#[repr(C, align(4096))]
struct Rings {
    desc: [Descriptor; MAX_QUEUE_SIZE as usize],
    avail: Page,
    used: Page,
}

/// How many queues can be live at once: a block device's (up to `blk::MAX_QUEUES`), a network
/// device's two, and one to spare.
pub const QUEUE_POOL: usize = 7;

/// The static ring areas, one per live queue; `RINGS_TAKEN[i]` says whether `RINGS[i]` is
/// claimed.
static RINGS: [DmaStatic<Rings>; QUEUE_POOL] = [const {
    DmaStatic::new(Rings {
        desc: [Descriptor::EMPTY; MAX_QUEUE_SIZE as usize],
        avail: Page([0; 4096]),
        used: Page([0; 4096]),
    })
}; QUEUE_POOL];
static RINGS_TAKEN: [AtomicBool; QUEUE_POOL] = [const { AtomicBool::new(false) }; QUEUE_POOL];

/// The driver's view of one queue, in one of the static ring areas.
pub struct SplitQueue {
    /// Which of `RINGS` this queue owns.
    area: usize,
    size: u16,
    event_idx: bool,
    /// Avail index including entries pushed but not yet published.
    avail_idx: u16,
    /// Avail index at the last publish (the "old" of `vring_need_event`).
    published_idx: u16,
    /// Used entries consumed so far.
    last_used: u16,
    /// Whether the driver asked for interrupts (else it keeps them suppressed).
    interrupts: bool,
}

impl SplitQueue {
    /// Take a free static ring area for a queue of `size` (a power of two up to 256) entries,
    /// zeroed. `Busy` if all `QUEUE_POOL` areas are held by other queues.
    pub fn claim(size: u16, event_idx: bool) -> Result<SplitQueue, Error> {
        let area =
            RINGS_TAKEN.iter().position(|taken| !taken.swap(true, Ordering::AcqRel)).ok_or(Error::Busy)?;
        let mut queue = SplitQueue {
            area,
            size: 0,
            event_idx: false,
            avail_idx: 0,
            published_idx: 0,
            last_used: 0,
            interrupts: false,
        };
        queue.reset(size, event_idx);
        Ok(queue)
    }

    /// The size to give a queue whose device allows at most `max` entries: the largest power
    /// of two (§2.7) up to `MAX_QUEUE_SIZE`.
    pub fn size_for(max: u32) -> u16 {
        1 << (31 - max.min(MAX_QUEUE_SIZE as u32).leading_zeros())
    }

    /// Start over with empty rings (after a device reset, before the queue is set up again).
    pub fn reset(&mut self, size: u16, event_idx: bool) {
        debug_assert!(size.is_power_of_two() && size <= MAX_QUEUE_SIZE);
        // SAFETY: this queue owns its ring area (claimed in `claim`), and the device is reset,
        // so nothing else reads or writes it.
        unsafe { self.rings().write_bytes(0, 1) };
        // Field by field: assigning a whole new `SplitQueue` would drop the old one, and with it
        // the claim on the ring area.
        self.size = size;
        self.event_idx = event_idx;
        self.avail_idx = 0;
        self.published_idx = 0;
        self.last_used = 0;
        self.interrupts = false;
        self.suppress_interrupts();
    }

    pub fn size(&self) -> u16 {
        self.size
    }

    /// This queue's ring area.
    fn rings(&self) -> *mut Rings {
        RINGS[self.area].get()
    }

    /// Physical addresses of the descriptor table, the avail (driver) ring and the used
    /// (device) ring.
    pub fn addresses(&self) -> (u64, u64, u64) {
        let rings = self.rings();
        // SAFETY: only field addresses are computed; nothing is read.
        unsafe {
            (
                phys(core::ptr::addr_of!((*rings).desc)),
                phys(core::ptr::addr_of!((*rings).avail)),
                phys(core::ptr::addr_of!((*rings).used)),
            )
        }
    }

    /// The u16 at byte `offset` of the avail ring (flags 0, idx 2, ring 4.., used_event last).
    fn avail_u16(&self, offset: usize) -> &AtomicU16 {
        debug_assert!(offset + 2 <= 4096 && offset.is_multiple_of(2));
        // SAFETY: the offset lies inside the avail page, 2-byte aligned; the page is static and
        // accessed only atomically while the queue is live.
        unsafe {
            AtomicU16::from_ptr(
                core::ptr::addr_of_mut!((*self.rings()).avail.0).cast::<u8>().add(offset).cast(),
            )
        }
    }

    /// The u16 at byte `offset` of the used ring (flags 0, idx 2, elements 4.., avail_event last).
    fn used_u16(&self, offset: usize) -> &AtomicU16 {
        debug_assert!(offset + 2 <= 4096 && offset.is_multiple_of(2));
        // SAFETY: as in `avail_u16`, for the used page.
        unsafe {
            AtomicU16::from_ptr(
                core::ptr::addr_of_mut!((*self.rings()).used.0).cast::<u8>().add(offset).cast(),
            )
        }
    }

    fn used_u32(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset + 4 <= 4096 && offset.is_multiple_of(4));
        // SAFETY: as in `avail_u16`; the used ring's elements are 4-byte aligned in the page.
        unsafe {
            AtomicU32::from_ptr(
                core::ptr::addr_of_mut!((*self.rings()).used.0).cast::<u8>().add(offset).cast(),
            )
        }
    }

    /// Where `used_event` lives: right after the avail ring's `size` entries.
    fn used_event(&self) -> &AtomicU16 {
        self.avail_u16(4 + 2 * self.size as usize)
    }

    /// Where `avail_event` lives: right after the used ring's `size` elements.
    fn avail_event(&self) -> &AtomicU16 {
        self.used_u16(4 + 8 * self.size as usize)
    }

    /// Write descriptor `index` (masked to the table). Only for descriptors the device does not
    /// own: not in flight.
    pub fn set_descriptor(&mut self, index: u16, descriptor: Descriptor) {
        let index = (index % MAX_QUEUE_SIZE) as usize;
        // SAFETY: `index` is inside the static table; the write is volatile because the device
        // reads the table by physical address once the chain is published.
        unsafe { core::ptr::addr_of_mut!((*self.rings()).desc[index]).write_volatile(descriptor) }
    }

    /// Put chain `head` in the next avail slot; the device sees it after `publish`.
    pub fn push(&mut self, head: u16) {
        let slot = (self.avail_idx % self.size) as usize;
        self.avail_u16(4 + 2 * slot).store(head, Ordering::Relaxed);
        self.avail_idx = self.avail_idx.wrapping_add(1);
    }

    /// Make pushed chains visible; returns whether the device wants a notification for them.
    pub fn publish(&mut self) -> bool {
        let old = self.published_idx;
        let new = self.avail_idx;
        self.published_idx = new;
        self.avail_u16(2).store(new, Ordering::Release);
        // The device may be about to stop polling: the new index must be visible before its
        // "notify me" is read, or both sides could wait for each other.
        fence(Ordering::SeqCst);
        if self.event_idx {
            vring_need_event(self.avail_event().load(Ordering::Acquire), new, old)
        } else {
            self.used_u16(0).load(Ordering::Acquire) & USED_F_NO_NOTIFY == 0
        }
    }

    /// Hostile use only: publish `idx` as the avail index, whatever was pushed.
    pub fn publish_raw_avail_idx(&mut self, idx: u16) {
        self.avail_idx = idx;
        self.published_idx = idx;
        self.avail_u16(2).store(idx, Ordering::Release);
    }

    pub fn avail_idx(&self) -> u16 {
        self.avail_idx
    }

    /// The device's used index, as last published.
    pub fn device_used_idx(&self) -> u16 {
        self.used_u16(2).load(Ordering::Acquire)
    }

    pub fn has_used(&self) -> bool {
        self.device_used_idx() != self.last_used
    }

    /// The next used element (id, bytes written), if the device has published one.
    pub fn pop_used(&mut self) -> Option<(u32, u32)> {
        if self.device_used_idx() == self.last_used {
            return None;
        }
        let offset = 4 + 8 * (self.last_used % self.size) as usize;
        let id = self.used_u32(offset).load(Ordering::Relaxed);
        let len = self.used_u32(offset + 4).load(Ordering::Relaxed);
        self.last_used = self.last_used.wrapping_add(1);
        if self.event_idx && !self.interrupts {
            self.used_event().store(self.last_used.wrapping_add(USED_EVENT_FAR_AHEAD), Ordering::Relaxed);
        }
        Some((id, len))
    }

    /// Polling: ask the device not to interrupt.
    pub fn suppress_interrupts(&mut self) {
        self.interrupts = false;
        self.avail_u16(0).store(AVAIL_F_NO_INTERRUPT, Ordering::Relaxed);
        self.used_event().store(self.last_used.wrapping_add(USED_EVENT_FAR_AHEAD), Ordering::Relaxed);
    }

    /// Ask for an interrupt at the next used entry. The caller must check `has_used` afterwards:
    /// an entry published before the device saw this request raises no interrupt.
    pub fn request_interrupt(&mut self) {
        self.interrupts = true;
        self.avail_u16(0).store(0, Ordering::Relaxed);
        self.used_event().store(self.last_used, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }
}

impl Drop for SplitQueue {
    fn drop(&mut self) {
        RINGS_TAKEN[self.area].store(false, Ordering::Release);
    }
}

/// virtio's `vring_need_event`: has the index moved past `event` in going from `old` to `new`?
pub fn vring_need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}
