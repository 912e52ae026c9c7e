//! FLUSHes served as QEMU's block layer serves them: one fdatasync at a time per disk backend,
//! and none for a FLUSH whose writes are durable already.
//!
//! A FLUSH must make durable the writes that completed before it arrived (a driver waits for a
//! write's completion before it asks for that write to be made durable); an fdatasync makes
//! durable what completed before it started. So a FLUSH that arrives while an fdatasync runs
//! waits for it; when it ends, the waiting FLUSHes it covers (no write completed between its
//! start and their arrival) complete with it, and the others share one new fdatasync. With 16
//! writes and 16 FLUSHes in flight (write+FLUSH pairs at depth 32), that is one fdatasync per
//! batch rather than one per FLUSH, each of which the file system serializes anyway.
//!
//! Writes are counted across every backend of a disk (a multi-queue device's queues, and a
//! backend reopened after a reset): a FLUSH on one queue covers writes completed on another.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Writes (and Discard and WriteZeroes) completed on one disk, by any of its backends.
#[derive(Clone)]
pub(super) struct CompletedWrites(Arc<AtomicU64>);

impl CompletedWrites {
    /// A count for a disk just opened. It starts at 1, as if a write had completed before: a
    /// disk's first FLUSH always syncs, since writes an earlier process completed (a daemon
    /// before its restart) may still be in the page cache, and the guest's FLUSH covers them.
    pub(super) fn new() -> CompletedWrites {
        CompletedWrites(Arc::new(AtomicU64::new(1)))
    }

    /// A write completed, and its completion is about to be handed to the driver.
    pub(super) fn add(&self) {
        // Release, and the driver's sight of the completion comes after it: a FLUSH the driver
        // makes after seeing it (on any queue) reads a count that includes it.
        self.0.fetch_add(1, Ordering::Release);
    }

    fn now(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

/// What to do with a FLUSH that just arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Arrival {
    /// Every write it covers is durable already: it completes now, with no system call.
    Durable,
    /// Start an fdatasync for it, covering the writes counted up to `covers`.
    Sync { covers: u64 },
    /// An fdatasync runs: wait for it. The FLUSH needs the writes counted up to `needs`.
    Wait { needs: u64 },
}

/// One backend's FLUSHes: the fdatasync it runs, and what is durable.
pub(super) struct Flushes {
    writes: CompletedWrites,
    /// The count of writes the last successful fdatasync covered.
    durable: u64,
    /// The running fdatasync's coverage, if one runs.
    running: Option<u64>,
}

impl Flushes {
    pub(super) fn new(writes: CompletedWrites) -> Flushes {
        Flushes { writes, durable: 0, running: None }
    }

    /// The disk's count of completed writes, shared with this backend's siblings.
    pub(super) fn writes(&self) -> &CompletedWrites {
        &self.writes
    }

    /// A FLUSH arrived: what to do with it. For `Sync`, call [`Flushes::started`] once the
    /// fdatasync is handed to the kernel.
    pub(super) fn arrive(&self) -> Arrival {
        let needs = self.writes.now();
        if needs <= self.durable {
            return Arrival::Durable;
        }
        match self.running {
            Some(_) => Arrival::Wait { needs },
            None => Arrival::Sync { covers: needs },
        }
    }

    /// An fdatasync covering the writes counted up to `covers` was handed to the kernel.
    pub(super) fn started(&mut self, covers: u64) {
        self.running = Some(covers);
    }

    /// The running fdatasync ended (`ok`: with success). Returns what it covered: a waiting
    /// FLUSH that needs no more completes with it, with its result.
    pub(super) fn synced(&mut self, ok: bool) -> u64 {
        let covers = self.running.take().unwrap_or(0);
        if ok {
            self.durable = self.durable.max(covers);
        }
        covers
    }

    /// What an fdatasync started now covers: every FLUSH waiting has arrived by now, so it
    /// covers them all.
    pub(super) fn covered_now(&self) -> u64 {
        self.writes.now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_flush_syncs_and_a_flush_with_no_write_since_does_not() {
        let mut flushes = Flushes::new(CompletedWrites::new());
        let Arrival::Sync { covers } = flushes.arrive() else { panic!("the first FLUSH syncs") };
        flushes.started(covers);
        assert_eq!(flushes.synced(true), covers);
        assert_eq!(flushes.arrive(), Arrival::Durable, "nothing written since");
        flushes.writes().add();
        assert!(matches!(flushes.arrive(), Arrival::Sync { .. }), "a write completed since");
    }

    #[test]
    fn flushes_arriving_during_a_sync_wait_and_share_the_next() {
        let writes = CompletedWrites::new();
        let mut flushes = Flushes::new(writes.clone());
        let Arrival::Sync { covers: first } = flushes.arrive() else { panic!() };
        flushes.started(first);
        // Covered by the running sync (no write completed since it started)...
        let Arrival::Wait { needs: same } = flushes.arrive() else { panic!() };
        assert_eq!(same, first);
        // ...and not covered: a write completed after it started.
        writes.add();
        let Arrival::Wait { needs: more } = flushes.arrive() else { panic!() };
        assert!(more > first);
        assert_eq!(flushes.synced(true), first, "the first FLUSH and `same` complete with it");
        let next = flushes.covered_now();
        flushes.started(next);
        assert!(next >= more, "one sync covers every FLUSH still waiting");
        assert_eq!(flushes.arrive(), Arrival::Wait { needs: next }, "another arrives meanwhile");
        assert_eq!(flushes.synced(true), next);
        assert_eq!(flushes.arrive(), Arrival::Durable);
    }

    #[test]
    fn a_failed_sync_makes_nothing_durable() {
        let mut flushes = Flushes::new(CompletedWrites::new());
        let Arrival::Sync { covers } = flushes.arrive() else { panic!() };
        flushes.started(covers);
        assert_eq!(flushes.synced(false), covers);
        assert_eq!(flushes.arrive(), Arrival::Sync { covers }, "the next FLUSH syncs again");
    }

    #[test]
    fn writes_on_a_sibling_backend_count() {
        let writes = CompletedWrites::new();
        let (mut one, mut other) = (Flushes::new(writes.clone()), Flushes::new(writes.clone()));
        let Arrival::Sync { covers } = one.arrive() else { panic!() };
        one.started(covers);
        one.synced(true);
        assert_eq!(one.arrive(), Arrival::Durable);
        let Arrival::Sync { covers } = other.arrive() else { panic!("its first FLUSH syncs") };
        other.started(covers);
        other.synced(true);
        other.writes().add();
        assert!(matches!(one.arrive(), Arrival::Sync { .. }), "the sibling's write needs a sync here");
    }
}
