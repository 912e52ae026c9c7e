//! The dirty-page log of a live migration (vhost's VHOST_F_LOG_ALL): a bitmap in memory shared
//! with the frontend, one bit per [`LOG_PAGE`] bytes of guest-physical address space. While a
//! migration copies guest memory, the device sets the bit of every page it writes, so that the
//! frontend copies that page again.
//!
//! Bits are set with an atomic OR on the byte that holds them: the frontend and other queues'
//! workers set and clear bits of the same bytes concurrently. A page beyond the bitmap is not
//! marked (never an access outside it); the backend refuses a log too small for guest memory
//! before any worker gets one.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// Bytes of guest memory per bit of the log (vhost's VHOST_LOG_PAGE).
pub const LOG_PAGE: u64 = 0x1000;

/// A handle on a mapped log bitmap, which it keeps mapped. Cloning it is cheap (the mapping is
/// shared); marking a page is one atomic OR, with no lock, allocation or system call.
#[derive(Clone)]
pub struct DirtyLog {
    base: *mut u8,
    len: usize,
    _mapping: Arc<dyn Send + Sync>,
}

// SAFETY: `base` points into the mapping `_mapping` keeps alive, wherever the handle goes, and
// every access through it is an atomic read-modify-write of one byte.
unsafe impl Send for DirtyLog {}
// SAFETY: as above: nothing reachable through `&DirtyLog` is accessed non-atomically.
unsafe impl Sync for DirtyLog {}

impl DirtyLog {
    /// The `len`-byte bitmap at `base`.
    ///
    /// # Safety
    ///
    /// `base` must point to `len` bytes of writable memory that stay mapped for as long as
    /// `mapping` lives; others may read and write them concurrently (they are only accessed
    /// atomically).
    pub unsafe fn new(base: *mut u8, len: usize, mapping: Arc<dyn Send + Sync>) -> DirtyLog {
        DirtyLog { base, len, _mapping: mapping }
    }

    /// How many guest-physical bytes the bitmap covers, from address 0.
    pub fn covers(&self) -> u64 {
        (self.len as u64).saturating_mul(8 * LOG_PAGE)
    }

    /// Mark every page that `[gpa, gpa + len)` touches as dirty (nothing for `len` 0).
    #[inline]
    pub fn mark(&self, gpa: u64, len: u64) {
        if len == 0 {
            return;
        }
        let first = gpa / LOG_PAGE;
        let last = gpa.saturating_add(len - 1) / LOG_PAGE;
        for page in first..=last {
            let Ok(byte) = usize::try_from(page / 8) else { return };
            if byte >= self.len {
                // Pages are increasing: the rest are beyond the bitmap too.
                return;
            }
            // SAFETY: `byte < len`, inside the bitmap `new`'s contract keeps mapped; accessed
            // only atomically since the frontend clears bits concurrently.
            let cell = unsafe { AtomicU8::from_ptr(self.base.add(byte)) };
            cell.fetch_or(1 << (page % 8), Ordering::Relaxed);
        }
    }

    /// Is the page holding `gpa` marked? (For tests and diagnostics.)
    pub fn is_marked(&self, gpa: u64) -> bool {
        let page = gpa / LOG_PAGE;
        match usize::try_from(page / 8) {
            Ok(byte) if byte < self.len => {
                // SAFETY: as in `mark`.
                let cell = unsafe { AtomicU8::from_ptr(self.base.add(byte)) };
                cell.load(Ordering::Relaxed) & (1 << (page % 8)) != 0
            }
            _ => false,
        }
    }
}

/// A dirty log a VMM keeps for itself (its own live migration): a bitmap in this process's
/// memory, in 64-bit words so that it is read and cleared a word at a time while workers mark
/// it through [`DirtyLog`] handles.
pub struct DirtyBitmap {
    words: Arc<[AtomicU64]>,
}

impl DirtyBitmap {
    /// A clear bitmap covering guest-physical addresses `[0, covers)`.
    pub fn new(covers: u64) -> DirtyBitmap {
        let pages = covers.div_ceil(LOG_PAGE);
        let words = usize::try_from(pages.div_ceil(64)).unwrap_or(0);
        DirtyBitmap { words: (0..words).map(|_| AtomicU64::new(0)).collect() }
    }

    /// A handle for workers to mark pages with.
    pub fn log(&self) -> DirtyLog {
        let base = self.words.as_ptr() as *mut u8;
        let len = self.words.len() * 8;
        // SAFETY: the words are `len` bytes that the `Arc` handed over keeps alive; AtomicU64 has
        // the layout of u64 and allows shared mutation, and a little-endian word's byte `i` holds
        // its bits `8i..8i+8`, so `mark`'s byte-wise bits are the word's bits in page order.
        unsafe { DirtyLog::new(base, len, Arc::new(self.words.clone())) }
    }

    /// Clear the bitmap, calling `dirty` with the guest-physical address of each page that was
    /// marked (in address order). A page marked meanwhile is either reported now or stays marked.
    pub fn take(&self, mut dirty: impl FnMut(u64)) {
        for (index, word) in self.words.iter().enumerate() {
            if word.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut bits = word.swap(0, Ordering::AcqRel);
            while bits != 0 {
                let bit = u64::from(bits.trailing_zeros());
                bits &= bits - 1;
                dirty((index as u64 * 64 + bit) * LOG_PAGE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(bytes: usize) -> (DirtyLog, Arc<Vec<AtomicU8>>) {
        let cells: Arc<Vec<AtomicU8>> = Arc::new((0..bytes).map(|_| AtomicU8::new(0)).collect());
        // SAFETY: the cells are `bytes` bytes that `cells` (the mapping) keeps alive; AtomicU8
        // has the layout of u8 and allows shared mutation.
        let log = unsafe { DirtyLog::new(cells.as_ptr() as *mut u8, bytes, cells.clone()) };
        (log, cells)
    }

    #[test]
    fn marks_the_pages_a_range_touches_and_nothing_beyond_the_bitmap() {
        let (log, cells) = log(2);
        log.mark(0x1fff, 2); // pages 1 and 2
        log.mark(15 * LOG_PAGE, 1); // page 15, the bitmap's last
        log.mark(16 * LOG_PAGE, 1 << 20); // beyond: nothing
        log.mark(u64::MAX - 1, 10); // wraps: clamped, beyond: nothing
        log.mark(3 * LOG_PAGE, 0); // empty: nothing
        let bits: Vec<u8> = cells.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        assert_eq!(bits, vec![0b0000_0110, 0b1000_0000]);
        assert!(log.is_marked(0x2000) && !log.is_marked(0x3000) && !log.is_marked(1 << 40));
        assert_eq!(log.covers(), 16 * LOG_PAGE);
    }

    #[test]
    fn an_owned_bitmap_reports_what_its_handles_marked_once() {
        let bitmap = DirtyBitmap::new(1 << 20);
        let log = bitmap.log();
        log.mark(0x1fff, 2);
        log.mark(0x41000, 1);
        log.mark(1 << 20, 1); // beyond
        let mut seen = Vec::new();
        bitmap.take(|gpa| seen.push(gpa));
        assert_eq!(seen, vec![0x1000, 0x2000, 0x41000]);
        seen.clear();
        bitmap.take(|gpa| seen.push(gpa));
        assert!(seen.is_empty());
    }
}
