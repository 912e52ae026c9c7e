//! Disks that carry out a request at once, inside `submit`, with no system call (the RAM disk
//! and the null disk). They share everything but what a request does to their bytes: the
//! checks, the completions kept for the next `poll`, and the rest of [`Backend`].

use crate::completions::CompletionRing;
use crate::validate::validate;
use crate::{Backend, Capabilities, Completion, IoError, Op, Segment, DEFAULT_MAX_IN_FLIGHT};

/// What holds an at-once disk's bytes (or holds none), and what a request does to them.
pub trait Medium: Send {
    /// Bytes, a non-zero multiple of 512.
    fn capacity(&self) -> u64;

    /// Writes, discards and write-zeroes are refused.
    fn read_only(&self) -> bool;

    /// Carry out `op` at byte `offset` over `segments`, `total` bytes of data, and return
    /// `total`.
    ///
    /// # Safety
    /// The request passed [`validate`] against this medium's capacity and read-only flag, which
    /// gave `total`: its range lies inside the disk. The segments' bytes are valid while the
    /// call runs (the promise of [`Segment::new`]).
    unsafe fn transfer(&mut self, op: Op, offset: u64, segments: &[Segment], total: u32) -> u32;
}

/// A disk over `M` whose requests complete inside `submit`, checked first as on any disk, and
/// are handed over by the next `poll`: no system call, allocation or lock per request.
pub struct AtOnce<M> {
    medium: M,
    /// Finished requests waiting for `poll`.
    done: CompletionRing,
}

impl<M: Medium> AtOnce<M> {
    pub(crate) fn over(medium: M) -> AtOnce<M> {
        AtOnce { medium, done: CompletionRing::new(DEFAULT_MAX_IN_FLIGHT) }
    }

    fn carry_out(&mut self, op: Op, offset: u64, segments: &[Segment]) -> Result<u32, IoError> {
        let medium = &mut self.medium;
        let total = validate(op, offset, segments, medium.capacity(), medium.read_only())?;
        // SAFETY: `validate` accepted the request against this medium and gave `total`; the
        // segments' validity is `Backend::submit`'s promise, carried by `Segment::new`.
        Ok(unsafe { medium.transfer(op, offset, segments, total) })
    }
}

impl<M: Medium> Backend for AtOnce<M> {
    fn capacity(&self) -> u64 {
        self.medium.capacity()
    }

    fn read_only(&self) -> bool {
        self.medium.read_only()
    }

    fn capabilities(&self) -> Capabilities {
        let writable = !self.medium.read_only();
        Capabilities { discard: writable, write_zeroes: writable, ..Capabilities::default() }
    }

    fn max_in_flight(&self) -> usize {
        DEFAULT_MAX_IN_FLIGHT
    }

    fn submit(&mut self, tag: u32, op: Op, offset: u64, segments: &[Segment]) -> bool {
        if self.done.is_full() {
            return false;
        }
        let result = self.carry_out(op, offset, segments);
        self.done.push(Completion { tag, result })
    }

    fn poll(&mut self, done: &mut dyn FnMut(Completion)) -> usize {
        self.done.drain(done)
    }
}
