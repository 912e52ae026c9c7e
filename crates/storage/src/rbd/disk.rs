//! One queue's backend on an RBD image.

use std::os::fd::RawFd;
use std::sync::Arc;

use super::client::{on_client_thread, Connection};
use super::inbox::{request_done, Inbox, SlotTicket};
use super::{ffi, RbdSpec};
use crate::completions::CompletionRing;
use crate::validate::validate;
use crate::{Backend, BackendError, Capabilities, Completion, IoError, Op, Segment, MAX_SEGMENTS};

/// A request librbd holds.
struct Slot {
    /// Its completion, null while the slot is free.
    completion: ffi::Completion,
    tag: u32,
    /// The bytes it moves (what it answers with).
    bytes: u32,
    read: bool,
    /// Its segments as librbd reads them: librbd keeps the array's address until the request
    /// completes, so it lives here rather than on the submitter's stack.
    iov: Box<[libc::iovec]>,
}

/// A backend for one queue of a disk on an RBD image; the queues of a disk share its
/// [`Connection`].
///
/// `submit` calls `rbd_aio_*` (librbd allocates a completion and its own request state per
/// request, and takes its locks: the C API has no way around them); `poll` takes the requests
/// librbd finished from the [`Inbox`] with no system call and no lock.
pub struct RbdDisk {
    connection: Arc<Connection>,
    spec: Arc<RbdSpec>,
    slots: Box<[Slot]>,
    free: Vec<usize>,
    /// Requests answered at submission (refused, or with no data to move).
    answered: CompletionRing,
    /// Boxed: librbd's threads reach it through `tickets` until every request is done.
    inbox: Box<Inbox>,
    tickets: Box<[SlotTicket]>,
    max_in_flight: usize,
}

// SAFETY: the completions in `slots` are librbd handles, usable from any thread; the iovecs point
// into guest memory that `Segment::new`'s contract keeps valid; the rest is owned data.
unsafe impl Send for RbdDisk {}

impl RbdDisk {
    /// Open the image `spec` names once, and make `count` backends on it (one per queue). The
    /// connection, and every descriptor the backends hold, are made on the RBD client thread:
    /// a queue's start after a reset may ask for a backend from any thread.
    pub fn open_queues(
        spec: &RbdSpec,
        count: usize,
        max_in_flight: usize,
    ) -> Result<Vec<RbdDisk>, BackendError> {
        let spec = Arc::new(spec.clone());
        // The outer error is the connection's, the inner a queue's.
        on_client_thread(move |library| {
            let connection = Arc::new(Connection::open(library, &spec)?);
            Ok((0..count.max(1))
                .map(|_| RbdDisk::on(Arc::clone(&connection), Arc::clone(&spec), max_in_flight))
                .collect::<Result<Vec<_>, BackendError>>())
        })?
    }

    fn on(
        connection: Arc<Connection>,
        spec: Arc<RbdSpec>,
        max_in_flight: usize,
    ) -> Result<RbdDisk, BackendError> {
        if max_in_flight == 0 || max_in_flight > crate::DEFAULT_MAX_IN_FLIGHT {
            return Err(BackendError::BadQueueDepth {
                requested: max_in_flight,
                limit: crate::DEFAULT_MAX_IN_FLIGHT,
            });
        }
        let empty = libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 };
        let slots = (0..max_in_flight)
            .map(|_| Slot {
                completion: std::ptr::null_mut(),
                tag: 0,
                bytes: 0,
                read: false,
                iov: vec![empty; MAX_SEGMENTS].into_boxed_slice(),
            })
            .collect();
        let inbox = Box::new(Inbox::new(max_in_flight).map_err(|source| BackendError::Ring { source })?);
        let tickets = inbox.tickets(max_in_flight);
        Ok(RbdDisk {
            connection,
            spec,
            slots,
            free: (0..max_in_flight).rev().collect(),
            answered: CompletionRing::new(max_in_flight),
            inbox,
            tickets,
            max_in_flight,
        })
    }

    fn in_flight(&self) -> usize {
        self.max_in_flight - self.free.len()
    }

    /// Hand the request in `slot` to librbd; the errno librbd refused it with otherwise.
    fn start(&mut self, slot: usize, op: Op, offset: u64, segments: &[Segment]) -> Result<(), i32> {
        let lib = self.connection.library;
        let image = self.connection.image;
        let ticket = std::ptr::from_ref(&self.tickets[slot]).cast_mut().cast();
        let mut completion = std::ptr::null_mut();
        // SAFETY: the ticket stays valid until the request is done (see `Drop`); the out-pointer
        // is valid.
        let rc = unsafe { (lib.rbd_aio_create_completion)(ticket, Some(request_done), &mut completion) };
        if rc < 0 {
            return Err(-rc);
        }
        let entry = &mut self.slots[slot];
        let mut count = 0;
        for segment in segments.iter().filter(|s| !s.is_empty()) {
            entry.iov[count] =
                libc::iovec { iov_base: segment.addr().cast(), iov_len: segment.len() as usize };
            count += 1;
        }
        let iov = entry.iov.as_ptr();
        let iovcnt = i32::try_from(count).unwrap_or(i32::MAX);
        // SAFETY: `image` is open for as long as `connection` lives, which outlives the request
        // (see `Drop`); the iovecs name guest memory that `Segment::new`'s contract keeps valid
        // until the request completes, and live in the slot until then too.
        let rc = unsafe {
            match op {
                Op::Read => (lib.rbd_aio_readv)(image, iov, iovcnt, offset, completion),
                Op::Write => (lib.rbd_aio_writev)(image, iov, iovcnt, offset, completion),
                Op::Flush => (lib.rbd_aio_flush)(image, completion),
                Op::Discard { len } => (lib.rbd_aio_discard)(image, offset, len, completion),
                Op::WriteZeroes { len, .. } => match usize::try_from(len) {
                    Ok(len) => (lib.rbd_aio_write_zeroes)(image, offset, len, completion, 0, 0),
                    Err(_) => -libc::EINVAL,
                },
            }
        };
        if rc < 0 {
            // SAFETY: librbd refused the request, so nothing else holds the completion.
            unsafe { (lib.rbd_aio_release)(completion) };
            return Err(-rc);
        }
        entry.completion = completion;
        Ok(())
    }
}

impl Backend for RbdDisk {
    fn capacity(&self) -> u64 {
        self.connection.capacity
    }

    fn read_only(&self) -> bool {
        self.spec.read_only
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { discard: true, write_zeroes: true, ..Capabilities::default() }
    }

    fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    fn submit(&mut self, tag: u32, op: Op, offset: u64, segments: &[Segment]) -> bool {
        if self.in_flight() + self.answered.len() >= self.max_in_flight {
            return false;
        }
        let bytes = match validate(op, offset, segments, self.capacity(), self.read_only()) {
            Ok(bytes) => bytes,
            Err(error) => return self.answered.push(Completion { tag, result: Err(error) }),
        };
        let moves_data = matches!(op, Op::Read | Op::Write);
        let empty_range = op.range_len() == Some(0);
        // A FLUSH commits the writes completed before it (virtio 1.2, 5.2.6). librbd answers a
        // write once the cluster has it (its cache is off: `client::FORCED_SETTINGS`), so there
        // is nothing to commit; `rbd_aio_flush` would also wait for the writes still in flight,
        // which the FLUSH does not cover, holding the guest's queue up for nothing.
        if (moves_data && bytes == 0) || empty_range || op == Op::Flush {
            return self.answered.push(Completion { tag, result: Ok(0) });
        }
        let Some(slot) = self.free.pop() else { return false };
        match self.start(slot, op, offset, segments) {
            Ok(()) => {
                let entry = &mut self.slots[slot];
                (entry.tag, entry.bytes, entry.read) = (tag, bytes, op == Op::Read);
            }
            Err(errno) => {
                self.free.push(slot);
                return self.answered.push(Completion { tag, result: Err(IoError::Errno(errno)) });
            }
        }
        true
    }

    fn poll(&mut self, done: &mut dyn FnMut(Completion)) -> usize {
        let mut count = self.answered.drain(done);
        let lib = self.connection.library;
        let (slots, free) = (&mut self.slots, &mut self.free);
        self.inbox.take(|slot| {
            let entry = &mut slots[slot];
            // SAFETY: the slot's completion finished (librbd called back for it) and is
            // released once, here.
            let value = unsafe {
                let value = (lib.rbd_aio_get_return_value)(entry.completion);
                (lib.rbd_aio_release)(entry.completion);
                value
            };
            entry.completion = std::ptr::null_mut();
            let result = match u32::try_from(value) {
                Err(_) => Err(IoError::Errno(i32::try_from(-value).unwrap_or(libc::EIO))),
                Ok(read) if entry.read && read != entry.bytes => Err(IoError::Short),
                Ok(_) => Ok(entry.bytes),
            };
            free.push(slot);
            done(Completion { tag: entry.tag, result });
            count += 1;
        });
        count
    }

    fn completion_fd(&self) -> Option<RawFd> {
        Some(self.inbox.fd())
    }

    fn completion_fd_fired(&mut self) {
        self.inbox.clear_wake();
    }

    fn completes_on_own_threads(&self) -> bool {
        true
    }

    fn cancel_all(&mut self) -> usize {
        // librbd cannot cancel a request: each finishes when the cluster answers it.
        self.in_flight()
    }

    fn reopen(&self) -> Result<Box<dyn Backend>, BackendError> {
        let mut disks = RbdDisk::open_queues(&self.spec, 1, self.max_in_flight)?;
        Ok(Box::new(disks.remove(0)))
    }
}

impl Drop for RbdDisk {
    fn drop(&mut self) {
        let lib = self.connection.library;
        for entry in self.slots.iter().filter(|e| !e.completion.is_null()) {
            // SAFETY: the completion is one this backend submitted and has not released. Waiting
            // for it keeps the tickets, the inbox and the request's buffers valid until librbd's
            // callback has returned, which a completion's "complete" state comes after.
            unsafe {
                (lib.rbd_aio_wait_for_complete)(entry.completion);
                (lib.rbd_aio_release)(entry.completion);
            }
        }
    }
}
