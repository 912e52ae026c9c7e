//! In-flight request tracking for one split queue, in memory shared with a vhost-user frontend
//! (VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD), so that a backend restarted after a crash resubmits
//! the requests its predecessor took from the avail ring and never put in the used ring.
//!
//! The layout is QEMU's and libvhost-user's for split queues: per queue, a 16-byte header
//! (`features` u64, `version` u16, `desc_num` u16, `last_batch_head` u16, `used_idx` u16) and
//! `desc_num` 16-byte entries (`inflight` u8, 5 bytes of padding, `next` u16, `counter` u64),
//! the queue's area rounded up to 64 bytes ([`queue_region_size`]).
//!
//! The protocol keeps the area consistent at every instant, whatever point the backend dies at:
//! a head is marked in flight (with a counter giving the order it was taken in) when it is
//! taken from the avail ring; a batch of used elements is first linked into a list (from
//! `last_batch_head` through `next`), then published in the used ring, then cleared, and only
//! then is `used_idx` set to the used ring's index. A backend that finds `used_idx` behind the
//! used ring knows that the listed batch reached the guest and clears it (libvhost-user writes
//! batches of one, which this reads the same way). Every value is read back as untrusted: the
//! frontend holds the memory too.

use std::sync::atomic::{fence, AtomicU16, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use thiserror::Error;

use crate::queue::MAX_QUEUE_SIZE;

/// The version this code writes and reads (libvhost-user's INFLIGHT_VERSION).
pub const INFLIGHT_VERSION: u16 = 1;
/// Size of a queue area's header.
const HEADER_LEN: usize = 16;
/// Size of one descriptor's state.
const DESC_LEN: usize = 16;
/// Each queue's area is aligned to a cache line.
const ALIGNMENT: u64 = 64;

/// The bytes one queue of `queue_size` descriptors takes in the region (libvhost-user's
/// `vu_inflight_queue_size`, which always leaves room for the 16-byte header).
pub fn queue_region_size(queue_size: u16) -> u64 {
    let raw = DESC_LEN as u64 * u64::from(queue_size) + 2;
    raw.div_ceil(ALIGNMENT) * ALIGNMENT
}

/// Why a queue's in-flight area cannot be trusted: the queue is not served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum InflightError {
    /// A version this code does not know.
    #[error("in-flight area version {0}: expected 0 (new) or {INFLIGHT_VERSION}")]
    BadVersion(u16),
    /// The area's descriptor count is not the one the region was made for.
    #[error("in-flight area holds {found} descriptors, the region was set up for {expected}")]
    BadDescNum {
        /// What the area says.
        found: u16,
        /// What the region was set up for.
        expected: u16,
    },
    /// The queue has more descriptors than the area has entries.
    #[error("the queue has {queue} descriptors, more than the in-flight area's {area}")]
    QueueLargerThanArea {
        /// The queue's size.
        queue: u16,
        /// The area's entries.
        area: u16,
    },
    /// A head marked in flight is not a descriptor of the queue.
    #[error("in-flight head {head} is outside the queue of {size} descriptors")]
    HeadOutOfRange {
        /// The head.
        head: u16,
        /// The queue's size.
        size: u16,
    },
    /// An entry's in-flight flag is neither 0 nor 1.
    #[error("in-flight entry {head} has inflight byte {value}: expected 0 or 1")]
    BadInflightByte {
        /// The entry.
        head: u16,
        /// Its flag byte.
        value: u8,
    },
    /// The last batch lists more used elements than the queue holds.
    #[error("the last batch holds {batch} used elements, more than the queue's {size}")]
    BatchTooLarge {
        /// Elements listed.
        batch: u16,
        /// The queue's size.
        size: u16,
    },
    /// The last batch's list reaches a head that was not in flight (or reaches one twice).
    #[error("the last batch's list reaches head {0}, which was not in flight (or twice)")]
    BatchNotInFlight(u16),
}

/// One queue's area of a mapped in-flight region: `capacity` descriptor entries after a header,
/// kept mapped by `_mapping`.
pub struct InflightArea {
    base: *mut u8,
    capacity: u16,
    _mapping: Arc<dyn Send + Sync>,
}

// SAFETY: `base` points into the mapping `_mapping` keeps alive, wherever the area goes; every
// access through it is atomic.
unsafe impl Send for InflightArea {}

impl InflightArea {
    /// An area of `capacity` entries at `base`.
    ///
    /// # Safety
    ///
    /// `base` must be 8-byte aligned and point to at least [`queue_region_size`]`(capacity)`
    /// bytes of writable shared memory that stays mapped for as long as `mapping` lives (others
    /// may write it concurrently: it is only accessed atomically).
    pub unsafe fn new(base: *mut u8, capacity: u16, mapping: Arc<dyn Send + Sync>) -> InflightArea {
        InflightArea { base, capacity, _mapping: mapping }
    }

    #[inline]
    fn u16_at(&self, offset: usize) -> &AtomicU16 {
        assert!(offset + 2 <= HEADER_LEN + DESC_LEN * self.capacity as usize);
        // SAFETY: in bounds of the area (checked above, `new`'s contract), 2-byte aligned (all
        // offsets used are even, the base 8-byte aligned), mapped while `self` lives.
        unsafe { AtomicU16::from_ptr(self.base.add(offset).cast()) }
    }

    #[inline]
    fn u64_at(&self, offset: usize) -> &AtomicU64 {
        assert!(offset + 8 <= HEADER_LEN + DESC_LEN * self.capacity as usize);
        // SAFETY: as in `u16_at`; the offsets used are multiples of 8.
        unsafe { AtomicU64::from_ptr(self.base.add(offset).cast()) }
    }

    #[inline]
    fn u8_at(&self, offset: usize) -> &AtomicU8 {
        assert!(offset < HEADER_LEN + DESC_LEN * self.capacity as usize);
        // SAFETY: in bounds (checked above), mapped while `self` lives.
        unsafe { AtomicU8::from_ptr(self.base.add(offset)) }
    }

    fn version(&self) -> &AtomicU16 {
        self.u16_at(8)
    }
    fn desc_num(&self) -> &AtomicU16 {
        self.u16_at(10)
    }
    #[inline]
    fn last_batch_head(&self) -> &AtomicU16 {
        self.u16_at(12)
    }
    #[inline]
    fn used_idx(&self) -> &AtomicU16 {
        self.u16_at(14)
    }
    /// Entry `head`'s `inflight` byte; `head < capacity`.
    #[inline]
    fn inflight(&self, head: u16) -> &AtomicU8 {
        self.u8_at(HEADER_LEN + DESC_LEN * head as usize)
    }
    #[inline]
    fn next(&self, head: u16) -> &AtomicU16 {
        self.u16_at(HEADER_LEN + DESC_LEN * head as usize + 6)
    }
    #[inline]
    fn counter(&self, head: u16) -> &AtomicU64 {
        self.u64_at(HEADER_LEN + DESC_LEN * head as usize + 8)
    }

    /// Write the header's `desc_num` (SET_INFLIGHT_FD does, as libvhost-user does).
    pub fn set_desc_num(&self) {
        self.desc_num().store(self.capacity, Ordering::Relaxed);
    }

    /// How many entries the area has.
    pub fn capacity(&self) -> u16 {
        self.capacity
    }

    /// Is head `head` marked in flight? (For tests and the daemon's checks.)
    pub fn is_in_flight(&self, head: u16) -> bool {
        head < self.capacity && self.inflight(head).load(Ordering::Relaxed) != 0
    }

    /// How many heads are marked in flight.
    pub fn count_in_flight(&self) -> usize {
        (0..self.capacity).filter(|&h| self.is_in_flight(h)).count()
    }
}

/// What recovery found: heads to serve again before the avail ring, oldest first.
pub struct Recovery {
    /// The avail index to resume at: the used index plus the heads in flight.
    pub next_avail: u16,
    /// How many heads are in flight.
    pub count: usize,
}

/// A queue's tracker: the area, the next counter, and the heads still to resubmit.
pub struct InflightTracker {
    area: InflightArea,
    counter: u64,
    resubmit: [u16; MAX_QUEUE_SIZE as usize],
    resubmit_len: usize,
    resubmit_next: usize,
}

impl InflightTracker {
    /// Bring `area` up to date for a queue of `queue_size` whose used ring's index is `used`
    /// (libvhost-user's `vu_check_queue_inflights`): a new area is initialised; a used one has
    /// its half-done last batch finished, and its heads in flight become the resubmit list in
    /// the order they were taken.
    pub fn recover(
        area: InflightArea,
        queue_size: u16,
        used: u16,
    ) -> Result<(InflightTracker, Recovery), InflightError> {
        let mut tracker = InflightTracker {
            area,
            counter: 0,
            resubmit: [0; MAX_QUEUE_SIZE as usize],
            resubmit_len: 0,
            resubmit_next: 0,
        };
        let area = &tracker.area;
        if queue_size > area.capacity || queue_size > MAX_QUEUE_SIZE {
            return Err(InflightError::QueueLargerThanArea { queue: queue_size, area: area.capacity });
        }
        let desc_num = area.desc_num().load(Ordering::Acquire);
        if desc_num != area.capacity {
            return Err(InflightError::BadDescNum { found: desc_num, expected: area.capacity });
        }
        match area.version().load(Ordering::Acquire) {
            0 => {
                // A new area: whatever it holds was never written by a backend.
                for head in 0..area.capacity {
                    area.inflight(head).store(0, Ordering::Relaxed);
                }
                area.used_idx().store(used, Ordering::Relaxed);
                fence(Ordering::Release);
                area.version().store(INFLIGHT_VERSION, Ordering::Release);
                return Ok((tracker, Recovery { next_avail: used, count: 0 }));
            }
            INFLIGHT_VERSION => {}
            other => return Err(InflightError::BadVersion(other)),
        }
        // The used ring moved past `used_idx`: the listed batch reached the guest, but the
        // backend died before clearing it.
        let batch = used.wrapping_sub(area.used_idx().load(Ordering::Acquire));
        if batch > queue_size {
            return Err(InflightError::BatchTooLarge { batch, size: queue_size });
        }
        let mut head = area.last_batch_head().load(Ordering::Acquire);
        let mut batch_heads = [0u16; MAX_QUEUE_SIZE as usize];
        // Heads met on the list: a loop in it meets one twice.
        let mut listed = [0u64; MAX_QUEUE_SIZE as usize / 64];
        for slot in batch_heads.iter_mut().take(batch as usize) {
            if head >= queue_size {
                return Err(InflightError::HeadOutOfRange { head, size: queue_size });
            }
            let (word, bit) = (head as usize / 64, 1u64 << (head % 64));
            if area.inflight(head).load(Ordering::Acquire) != 1 || listed[word] & bit != 0 {
                return Err(InflightError::BatchNotInFlight(head));
            }
            listed[word] |= bit;
            *slot = head;
            head = area.next(head).load(Ordering::Acquire);
        }
        for &head in &batch_heads[..batch as usize] {
            area.inflight(head).store(0, Ordering::Relaxed);
        }
        fence(Ordering::Release);
        area.used_idx().store(used, Ordering::Release);

        let mut found: [(u64, u16); MAX_QUEUE_SIZE as usize] = [(0, 0); MAX_QUEUE_SIZE as usize];
        let mut count = 0;
        for head in 0..area.capacity {
            match area.inflight(head).load(Ordering::Acquire) {
                0 => {}
                1 if head < queue_size => {
                    // At most `queue_size` heads pass the test above.
                    found[count] = (area.counter(head).load(Ordering::Acquire), head);
                    count += 1;
                }
                1 => return Err(InflightError::HeadOutOfRange { head, size: queue_size }),
                value => return Err(InflightError::BadInflightByte { head, value }),
            }
        }
        let found = &mut found[..count];
        found.sort_unstable();
        for (i, &(_, head)) in found.iter().enumerate() {
            tracker.resubmit[i] = head;
        }
        tracker.resubmit_len = count;
        tracker.counter = found.last().map_or(0, |&(counter, _)| counter.wrapping_add(1));
        // `count <= queue_size <= MAX_QUEUE_SIZE`.
        let next_avail = used.wrapping_add(u16::try_from(count).unwrap_or(u16::MAX));
        Ok((tracker, Recovery { next_avail, count }))
    }

    /// The heads recovery found in flight, oldest first, that are still to be served again.
    #[inline]
    pub fn pending_resubmits(&self) -> &[u16] {
        &self.resubmit[self.resubmit_next..self.resubmit_len]
    }

    /// The next head to serve again, if any.
    #[inline]
    pub fn next_resubmit(&mut self) -> Option<u16> {
        let head = *self.resubmit[..self.resubmit_len].get(self.resubmit_next)?;
        self.resubmit_next += 1;
        Some(head)
    }

    /// Mark `head` (below the queue size) in flight, taken after every head marked before.
    #[inline]
    pub fn mark_in_flight(&mut self, head: u16) {
        self.area.counter(head).store(self.counter, Ordering::Relaxed);
        self.counter = self.counter.wrapping_add(1);
        // The counter is in place before the head counts as in flight.
        fence(Ordering::Release);
        self.area.inflight(head).store(1, Ordering::Relaxed);
    }

    /// Before the used index moves: record the batch about to be published.
    #[inline]
    pub fn link_batch(&mut self, heads: &[u16]) {
        let Some((&first, _)) = heads.split_first() else { return };
        self.area.last_batch_head().store(first, Ordering::Relaxed);
        for pair in heads.windows(2) {
            self.area.next(pair[0]).store(pair[1], Ordering::Relaxed);
        }
        // The list is complete before the used index that makes it matter.
        fence(Ordering::Release);
    }

    /// After the used index moved to `used`: the batch is no longer in flight.
    #[inline]
    pub fn clear_batch(&mut self, heads: &[u16], used: u16) {
        fence(Ordering::Release);
        for &head in heads {
            self.area.inflight(head).store(0, Ordering::Relaxed);
        }
        fence(Ordering::Release);
        self.area.used_idx().store(used, Ordering::Release);
    }

    /// The area, to inspect.
    pub fn area(&self) -> &InflightArea {
        &self.area
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;

    const SIZE: u16 = 8;

    /// A zeroed area of `SIZE` entries in heap memory (8-byte aligned), with `desc_num` set.
    fn area(memory: &Arc<Vec<AtomicU64>>) -> InflightArea {
        let base = memory.as_ptr().cast::<u8>().cast_mut();
        // SAFETY: the vector holds `queue_region_size(SIZE)` bytes of atomics (so shared writes
        // are sound), 8-byte aligned, kept alive by the clone.
        let area = unsafe { InflightArea::new(base, SIZE, memory.clone()) };
        area.set_desc_num();
        area
    }

    fn memory() -> Arc<Vec<AtomicU64>> {
        let words = usize::try_from(queue_region_size(SIZE)).unwrap() / 8;
        Arc::new((0..words).map(|_| AtomicU64::new(0)).collect())
    }

    /// Heads 1, 5, 3 taken in that order; 5 and 3 completed in one batch at used index 2 (of a
    /// ring whose used index was 0), stopped after `steps` of the batch's steps (0: before
    /// linking it, 1: linked, 2: linked and the used index published, 3: cleared too).
    fn crash_during_a_batch(steps: usize) -> (Arc<Vec<AtomicU64>>, u16) {
        let memory = memory();
        let (mut tracker, recovery) = InflightTracker::recover(area(&memory), SIZE, 0).unwrap();
        assert_eq!((recovery.next_avail, recovery.count), (0, 0));
        for head in [1, 5, 3] {
            tracker.mark_in_flight(head);
        }
        let batch = [5, 3];
        let mut ring_used = 0;
        if steps >= 1 {
            tracker.link_batch(&batch);
        }
        if steps >= 2 {
            ring_used = 2;
        }
        if steps >= 3 {
            tracker.clear_batch(&batch, 2);
        }
        (memory, ring_used)
    }

    #[test]
    fn a_crash_at_any_step_of_a_batch_leaves_a_region_that_recovers_exactly_what_is_owed() {
        for steps in 0..=3 {
            let (memory, ring_used) = crash_during_a_batch(steps);
            let (mut tracker, recovery) = InflightTracker::recover(area(&memory), SIZE, ring_used).unwrap();
            let mut resubmitted = Vec::new();
            while let Some(head) = tracker.next_resubmit() {
                resubmitted.push(head);
            }
            if ring_used == 0 {
                // The batch never reached the guest: all three are owed, in the order taken.
                assert_eq!(resubmitted, [1, 5, 3], "after {steps} steps");
            } else {
                assert_eq!(resubmitted, [1], "after {steps} steps");
            }
            assert_eq!(recovery.next_avail, 3, "three avail entries were taken, after {steps} steps");
            assert_eq!(tracker.area().count_in_flight(), resubmitted.len());
            // The next head is marked after the resubmitted ones.
            tracker.mark_in_flight(6);
            let (mut again, _) = InflightTracker::recover(area(&memory), SIZE, ring_used).unwrap();
            assert_eq!(again.pending_resubmits().last(), Some(&6), "after {steps} steps");
            assert_eq!(again.next_resubmit(), resubmitted.first().copied().or(Some(6)));
        }
    }

    #[test]
    fn region_sizes_are_libvhost_users() {
        assert_eq!(queue_region_size(1), 64);
        assert_eq!(queue_region_size(16), 320);
        assert_eq!(queue_region_size(128), 2112);
        assert_eq!(queue_region_size(256), 4160);
    }

    #[test]
    fn a_queue_larger_than_its_area_is_refused() {
        let memory = memory();
        let error = InflightTracker::recover(area(&memory), SIZE * 2, 0).err();
        assert_eq!(error, Some(InflightError::QueueLargerThanArea { queue: SIZE * 2, area: SIZE }));
    }
}
