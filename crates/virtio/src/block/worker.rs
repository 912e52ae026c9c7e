//! The virtio-blk data path: takes requests off the queue, runs them on the backend, and puts
//! completions in the used ring. It does not know which I/O mode drives it: the vCPU thread
//! (trap), an I/O thread woken by an eventfd, or a polling IOCore call the same two methods.

use std::time::{Duration, Instant};

use storage::{Backend, Completion, Op};

use super::request::{
    Parsed, Rejection, Request, RequestKind, StatusByte, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK,
};
use crate::device::{DeviceSignals, QueueWorker};
use crate::queue::{Queue, QueueError, MAX_QUEUE_SIZE};
use vm_memory::GuestMemoryMmap;

/// How long a reset waits for requests still with the backend.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// What the device tells the guest about the disk.
#[derive(Debug, Clone)]
pub struct DiskInfo {
    pub capacity: u64,
    pub read_only: bool,
    /// GET_ID answer (NUL-padded).
    pub id: [u8; super::request::ID_LEN],
}

/// A request handed to the backend and not yet completed.
#[derive(Clone, Copy)]
struct InFlight {
    status: Option<StatusByte>,
    /// Bytes the device writes into the chain on success (data for reads, plus the status).
    written: u32,
}

/// Request counts, for metrics and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BlockCounters {
    pub completed: u64,
    pub io_errors: u64,
    pub rejected: u64,
    pub interrupts: u64,
}

pub struct BlockWorker {
    queue: Queue,
    mem: GuestMemoryMmap,
    backend: Box<dyn Backend>,
    disk: DiskInfo,
    signals: DeviceSignals,
    request: Request,
    in_flight: [InFlight; MAX_QUEUE_SIZE as usize],
    /// Requests with the backend.
    outstanding: usize,
    used_since_publish: usize,
    /// The owner polls the queue (notifications suppressed) rather than waiting for them.
    polling: bool,
    /// The driver broke the queue; nothing is served until the device is reset.
    broken: bool,
    pub counters: BlockCounters,
}

// SAFETY: the raw pointers in `in_flight` and `request` point into guest RAM, which outlives the
// worker; the worker is used by one thread at a time.
unsafe impl Send for BlockWorker {}

impl BlockWorker {
    pub fn new(
        queue: Queue,
        mem: GuestMemoryMmap,
        backend: Box<dyn Backend>,
        disk: DiskInfo,
        signals: DeviceSignals,
    ) -> BlockWorker {
        let idle = InFlight { status: None, written: 0 };
        BlockWorker {
            queue,
            mem,
            backend,
            disk,
            signals,
            request: Request::empty(),
            in_flight: [idle; MAX_QUEUE_SIZE as usize],
            outstanding: 0,
            used_since_publish: 0,
            polling: false,
            broken: false,
            counters: BlockCounters::default(),
        }
    }

    /// Give the backend back (device reset). Requests still with the backend write into guest
    /// RAM and carry this worker's tags, so they are let finish first (for a bounded time).
    pub fn into_backend(mut self) -> Box<dyn Backend> {
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        while self.outstanding > 0 && Instant::now() < deadline {
            if self.complete() == 0 {
                std::hint::spin_loop();
            }
        }
        self.backend
    }

    pub fn queue_mut(&mut self) -> &mut Queue {
        &mut self.queue
    }

    /// Take every available request and start it. An error means the guest broke the queue
    /// itself: the device must stop and ask for a reset.
    pub fn process_queue(&mut self) -> Result<usize, QueueError> {
        let mut started = self.take_available()?;
        if self.polling {
            // Keep the driver's notification threshold behind us (EVENT_IDX), so it never fires.
            if started > 0 {
                self.queue.set_notifications(false);
            }
        } else {
            // Ask for the next notification, then look again: a request made before the driver
            // saw the request for a notification would otherwise wait for the next one.
            loop {
                self.queue.set_notifications(true);
                if !self.queue.has_avail()? {
                    break;
                }
                started += self.take_available()?;
            }
        }
        if started > 0 {
            self.backend.kick();
        }
        Ok(started)
    }

    fn take_available(&mut self) -> Result<usize, QueueError> {
        let mut started = 0;
        while let Some(head) = self.queue.pop_avail()? {
            started += 1;
            let parsed =
                self.request.parse(&self.queue, &self.mem, head, self.disk.capacity, self.disk.read_only)?;
            match parsed {
                Parsed::Ready => self.start(),
                Parsed::Rejected(Rejection::Status { status, code }) => {
                    status.write(code);
                    self.counters.rejected += 1;
                    self.add_used(head, 1);
                }
                Parsed::Rejected(Rejection::Unanswerable) => {
                    self.counters.rejected += 1;
                    self.add_used(head, 0);
                }
            }
        }
        Ok(started)
    }

    fn start(&mut self) {
        let request = &self.request;
        let head = request.head;
        let op = match request.kind {
            RequestKind::Read => Op::Read,
            RequestKind::Write => Op::Write,
            RequestKind::Flush => Op::Flush,
            RequestKind::GetId => {
                let mut id = &self.disk.id[..];
                for segment in request.segments() {
                    let n = id.len().min(segment.len as usize);
                    // SAFETY: the segment is a checked, device-writable range of guest RAM of
                    // at least `n` bytes.
                    unsafe { std::ptr::copy_nonoverlapping(id.as_ptr(), segment.addr, n) };
                    id = &id[n..];
                }
                let written = (self.disk.id.len() - id.len()) as u32;
                request.status.write(VIRTIO_BLK_S_OK);
                self.add_used(head, written + 1);
                return;
            }
        };
        let written = if op == Op::Read { request.data_len as u32 + 1 } else { 1 };
        self.in_flight[head as usize] = InFlight { status: Some(request.status), written };
        self.outstanding += 1;
        if !self.backend.submit(head as u32, op, request.offset, request.segments()) {
            self.in_flight[head as usize].status = None;
            self.outstanding -= 1;
            // The backend holds at least a queue's worth of requests, so this is a backend fault.
            request.status.write(VIRTIO_BLK_S_IOERR);
            self.counters.io_errors += 1;
            self.add_used(head, 1);
        }
    }

    /// Collect finished requests into the used ring, publish them, and interrupt the guest if
    /// it asked to be. Returns how many completed.
    pub fn complete(&mut self) -> usize {
        let mut finished = [None::<Completion>; 64];
        let mut total = 0;
        loop {
            let mut n = 0;
            self.backend.poll(&mut |c| {
                if n < finished.len() {
                    finished[n] = Some(c);
                    n += 1;
                }
            });
            for completion in finished[..n].iter().flatten() {
                self.finish(*completion);
            }
            total += n;
            if n < finished.len() {
                break;
            }
        }
        self.publish();
        total
    }

    fn finish(&mut self, completion: Completion) {
        let head = completion.tag as u16;
        // A tag the backend made up, or one already finished, is ignored.
        let Some(slot) = self.in_flight.get_mut(head as usize) else { return };
        let Some(status) = slot.status.take() else { return };
        let slot_written = slot.written;
        self.outstanding -= 1;
        let written = match completion.result {
            Ok(_) => {
                status.write(VIRTIO_BLK_S_OK);
                self.counters.completed += 1;
                slot_written
            }
            Err(_) => {
                status.write(VIRTIO_BLK_S_IOERR);
                self.counters.io_errors += 1;
                1
            }
        };
        self.add_used(head, written);
    }

    fn add_used(&mut self, head: u16, written: u32) {
        self.queue.add_used(head, written);
        self.used_since_publish += 1;
    }

    /// Make used entries visible and signal the guest once for the whole batch, if it wants it.
    fn publish(&mut self) {
        if self.used_since_publish == 0 {
            return;
        }
        self.used_since_publish = 0;
        self.queue.publish_used();
        if self.queue.needs_interrupt() {
            self.counters.interrupts += 1;
            self.signals.interrupt.signal_used_buffer();
        }
    }
}

impl QueueWorker for BlockWorker {
    fn poll(&mut self) -> usize {
        if self.broken {
            return 0;
        }
        let started = match self.process_queue() {
            Ok(n) => n,
            Err(e) => {
                self.broken = true;
                self.signals.queue_broken(e);
                0
            }
        };
        // Requests started before the queue broke still finish: their buffers are valid.
        started + self.complete()
    }

    fn set_polling(&mut self, polling: bool) {
        self.polling = polling;
        if !self.broken {
            self.queue.set_notifications(!polling);
        }
    }

    fn in_flight(&self) -> usize {
        self.outstanding
    }

    fn has_pending(&self) -> bool {
        !self.broken && self.queue.has_avail().unwrap_or(true)
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }
}
