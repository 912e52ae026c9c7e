//! The dirty-page log of a live migration (vhost's VHOST_F_LOG_ALL): a bitmap in memory shared
//! with the frontend, one bit per [`LOG_PAGE`] bytes of guest-physical address space. While a
//! migration copies guest memory, the device sets the bit of every page it writes, so that the
//! frontend copies that page again.
//!
//! The bitmap is accessed only as 64-bit words, each access atomic: a bit is set with a 64-bit
//! `fetch_or`, a word read and cleared with a 64-bit `swap`. One access size on the same memory
//! is what Rust's memory model allows (it leaves mixed-size atomic accesses undefined), so the
//! log must be 8-byte aligned and a whole number of words long: [`DirtyLog::new`] refuses any
//! other. The frontend and other queues' workers set and clear bits of the same words
//! concurrently. A page beyond the bitmap is not marked (never an access outside it); the
//! backend refuses a log too small for guest memory before any worker gets one.
//!
//! The vhost-user specification lays the log out in bytes (page `p` is bit `p % 8` of byte
//! `p / 8`); on a little-endian host that is bit `p % 64` of 64-bit word `p / 64`, the layout
//! used here (and QEMU's own, which logs in 64-bit words too).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

// The word layout above equals the specification's byte layout only on a little-endian host.
const _: () =
    assert!(cfg!(target_endian = "little"), "the dirty log's word layout needs a little-endian host");

/// Bytes of guest memory per bit of the log (vhost's VHOST_LOG_PAGE).
pub const LOG_PAGE: u64 = 0x1000;

/// Bytes per word of the log, the one size it is accessed in.
pub const LOG_WORD: usize = size_of::<u64>();

/// Why a memory range cannot be used as a dirty log.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LogLayoutError {
    /// The log does not start on an 8-byte boundary.
    #[error(
        "the dirty log at address {addr:#x} is not 8-byte aligned: it is accessed in 64-bit words; map it at a page-aligned offset"
    )]
    Misaligned {
        /// Where it starts.
        addr: usize,
    },
    /// The log's length is not a whole number of 64-bit words.
    #[error(
        "the dirty log is {len} bytes, not a multiple of 8: it is accessed in 64-bit words; give a size in whole words (as QEMU does)"
    )]
    PartialWord {
        /// Its length in bytes.
        len: usize,
    },
}

/// A handle on a mapped log bitmap, which it keeps mapped. Cloning it is cheap (the mapping is
/// shared); marking a page is one atomic OR, with no lock, allocation or system call.
#[derive(Clone)]
pub struct DirtyLog {
    words: *mut u64,
    len_words: usize,
    _mapping: Arc<dyn Send + Sync>,
}

// SAFETY: `words` points into memory that `_mapping` keeps mapped for as long as any clone of
// the handle lives, wherever it goes, and every access through it is an atomic 64-bit access.
unsafe impl Send for DirtyLog {}
// SAFETY: as above: nothing reachable through `&DirtyLog` is accessed non-atomically.
unsafe impl Sync for DirtyLog {}

impl DirtyLog {
    /// The `len`-byte bitmap at `base`, which must be 8-byte aligned and a whole number of
    /// 64-bit words long (otherwise [`LogLayoutError`]).
    ///
    /// # Safety
    ///
    /// `base` must point to `len` bytes of writable memory that stay mapped for as long as
    /// `mapping` lives; others may read and write them concurrently, but only with atomic
    /// accesses of 64 bits (or from another process, outside this one's memory model).
    pub unsafe fn new(
        base: *mut u8,
        len: usize,
        mapping: Arc<dyn Send + Sync>,
    ) -> Result<DirtyLog, LogLayoutError> {
        if !(base as usize).is_multiple_of(align_of::<AtomicU64>()) {
            return Err(LogLayoutError::Misaligned { addr: base as usize });
        }
        if !len.is_multiple_of(LOG_WORD) {
            return Err(LogLayoutError::PartialWord { len });
        }
        Ok(DirtyLog { words: base.cast(), len_words: len / LOG_WORD, _mapping: mapping })
    }

    /// How many guest-physical bytes the bitmap covers, from address 0.
    pub fn covers(&self) -> u64 {
        (self.len_words as u64).saturating_mul(64 * LOG_PAGE)
    }

    /// The word holding `page`'s bit, if the bitmap reaches that far.
    #[inline]
    fn word(&self, page: u64) -> Option<&AtomicU64> {
        let index = usize::try_from(page / 64).ok().filter(|&index| index < self.len_words)?;
        // SAFETY: `index < len_words`, so the word is inside the bitmap, which `_mapping` (held
        // by `self`, so for the borrow's lifetime) keeps mapped; `new` checked it is 8-byte
        // aligned; every access to it is an atomic 64-bit one, as `AtomicU64` makes sure here
        // and `new`'s contract asks of everyone else in this process.
        Some(unsafe { AtomicU64::from_ptr(self.words.add(index)) })
    }

    /// Mark every page that `[gpa, gpa + len)` touches as dirty (nothing for `len` 0).
    #[inline]
    pub fn mark(&self, gpa: u64, len: u64) {
        if len == 0 {
            return;
        }
        let first = gpa / LOG_PAGE;
        let last = gpa.saturating_add(len - 1) / LOG_PAGE;
        let mut page = first;
        while page <= last {
            // Pages are increasing: once one is beyond the bitmap, the rest are too.
            let Some(word) = self.word(page) else { return };
            // Every page of this word in the range, with one OR.
            let in_word = (last - page).min(63 - page % 64) + 1;
            let bits = if in_word == 64 { u64::MAX } else { ((1u64 << in_word) - 1) << (page % 64) };
            word.fetch_or(bits, Ordering::Relaxed);
            page += in_word;
        }
    }

    /// Is the page holding `gpa` marked? (For tests and diagnostics.)
    pub fn is_marked(&self, gpa: u64) -> bool {
        let page = gpa / LOG_PAGE;
        self.word(page).is_some_and(|word| word.load(Ordering::Relaxed) & 1 << (page % 64) != 0)
    }
}

/// The guest-physical address of `host`, a byte of one of `mem`'s regions as mapped in this
/// process; `None` for any other address. For marking what a worker wrote through host
/// addresses: finding the region costs a few compares, paid only while a migration logs.
pub fn guest_address(mem: &GuestMemoryMmap, host: *const u8) -> Option<u64> {
    let host = host as usize;
    mem.iter().find_map(|region| {
        let offset = host.checked_sub(region.as_ptr() as usize)?;
        (offset < region.size()).then(|| region.start_addr().0 + offset as u64)
    })
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
        // The words are aligned and whole by their type, and the `Arc` handed over keeps them
        // alive; they are accessed only as `AtomicU64`s, here and through the handle.
        DirtyLog {
            words: self.words.as_ptr().cast::<u64>().cast_mut(),
            len_words: self.words.len(),
            _mapping: Arc::new(self.words.clone()),
        }
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

    /// A log of `words` 64-bit words, and the words to look at.
    fn new_log(words: usize) -> (DirtyLog, Arc<Vec<AtomicU64>>) {
        let cells: Arc<Vec<AtomicU64>> = Arc::new((0..words).map(|_| AtomicU64::new(0)).collect());
        // SAFETY: the cells are `words * 8` bytes that `cells` (the mapping) keeps alive, only
        // accessed as AtomicU64s.
        let log = unsafe { DirtyLog::new(cells.as_ptr() as *mut u8, words * LOG_WORD, cells.clone()) }
            .expect("a Vec of AtomicU64 is aligned and whole words");
        (log, cells)
    }

    fn bits(cells: &[AtomicU64]) -> Vec<u64> {
        cells.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    }

    #[test]
    fn marks_the_pages_a_range_touches_and_nothing_beyond_the_bitmap() {
        let (log, cells) = new_log(2);
        log.mark(0x1fff, 2); // pages 1 and 2
        log.mark(127 * LOG_PAGE, 1); // page 127, the bitmap's last
        log.mark(128 * LOG_PAGE, 1 << 20); // beyond: nothing
        log.mark(u64::MAX - 1, 10); // wraps: clamped, beyond: nothing
        log.mark(3 * LOG_PAGE, 0); // empty: nothing
        assert_eq!(bits(&cells), vec![0b110, 1 << 63]);
        assert!(log.is_marked(0x2000) && !log.is_marked(0x3000) && !log.is_marked(1 << 40));
        assert_eq!(log.covers(), 128 * LOG_PAGE);
    }

    #[test]
    fn a_range_across_words_marks_each_page_once_and_stops_at_the_bitmap_end() {
        let (log, cells) = new_log(3);
        // Pages 60 to 131: the end of word 0, all of word 1, the start of word 2.
        log.mark(60 * LOG_PAGE + 5, 72 * LOG_PAGE - 5);
        assert_eq!(bits(&cells), vec![0xf << 60, u64::MAX, 0b1111]);
        // From page 190 on, far past the bitmap's 192 pages: pages 190 and 191 only.
        let (log, cells) = new_log(3);
        log.mark(190 * LOG_PAGE, u64::MAX - 190 * LOG_PAGE);
        assert_eq!(bits(&cells), vec![0, 0, 0b11 << 62]);
        // The same pages as page-by-page marking, wherever the range starts and ends.
        for (start, pages) in [(0, 1), (63, 2), (1, 64), (0, 192), (64, 64), (100, 50)] {
            let (whole, whole_cells) = new_log(3);
            let (single, single_cells) = new_log(3);
            whole.mark(start * LOG_PAGE, pages * LOG_PAGE);
            for page in start..start + pages {
                single.mark(page * LOG_PAGE, 1);
            }
            assert_eq!(bits(&whole_cells), bits(&single_cells), "pages {start}..+{pages}");
        }
    }

    #[test]
    fn a_misaligned_or_partial_word_log_is_refused() {
        let cells: Arc<Vec<AtomicU64>> = Arc::new((0..4).map(|_| AtomicU64::new(0)).collect());
        let base = cells.as_ptr() as *mut u8;
        // SAFETY: each range is inside `cells`, which the mapping keeps alive; refused before
        // any access.
        let misaligned = unsafe { DirtyLog::new(base.add(4), 16, cells.clone()) };
        assert_eq!(misaligned.err(), Some(LogLayoutError::Misaligned { addr: base as usize + 4 }));
        // SAFETY: as above.
        let partial = unsafe { DirtyLog::new(base, 20, cells.clone()) };
        assert_eq!(partial.err(), Some(LogLayoutError::PartialWord { len: 20 }));
        let message = LogLayoutError::PartialWord { len: 20 }.to_string();
        assert!(message.contains("20 bytes") && message.contains("multiple of 8"), "{message}");
        // SAFETY: as above.
        assert!(unsafe { DirtyLog::new(base, 32, cells.clone()) }.is_ok());
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

    #[test]
    fn no_mark_is_lost_while_the_bitmap_is_taken_concurrently() {
        // Four threads mark every page of their own quarter of each word while the main thread
        // takes the bitmap over and over: every page is reported exactly once in all.
        const PAGES: u64 = 64 * 16;
        let bitmap = DirtyBitmap::new(PAGES * LOG_PAGE);
        let mut reported = vec![0u32; PAGES as usize];
        std::thread::scope(|scope| {
            let markers: Vec<_> = (0..4u64)
                .map(|quarter| {
                    let log = bitmap.log();
                    scope.spawn(move || {
                        for page in (0..PAGES).filter(|page| page % 64 / 16 == quarter) {
                            log.mark(page * LOG_PAGE, 1);
                        }
                    })
                })
                .collect();
            while markers.iter().any(|marker| !marker.is_finished()) {
                bitmap.take(|gpa| reported[(gpa / LOG_PAGE) as usize] += 1);
            }
        });
        bitmap.take(|gpa| reported[(gpa / LOG_PAGE) as usize] += 1);
        assert!(reported.iter().all(|&count| count == 1), "{reported:?}");
    }
}
