//! The virtio-blk data path: takes requests off the queue, runs them on the backend, and puts
//! completions in the used ring. It does not know which I/O mode drives it: the vCPU thread
//! (trap), an I/O thread woken by an eventfd, or a polling IOCore call the same two methods.

#![warn(missing_docs)]

use std::time::{Duration, Instant};

use storage::{Backend, Completion, Op};
use vm_memory::VolatileSlice;

use super::request::{
    Parsed, Rejection, Request, RequestKind, StatusByte, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK,
};
use crate::device::{DeviceSignals, QueueWorker, RequestCounters};
use crate::queue::{Queue, QueueError, MAX_QUEUE_SIZE};

/// A reset still waiting this long for the backend says so (it keeps waiting: see `into_backend`).
const SLOW_DRAIN: Duration = Duration::from_secs(5);

/// What the device tells the guest about the disk.
#[derive(Debug, Clone)]
pub struct DiskInfo {
    /// Size in bytes.
    pub capacity: u64,
    /// Writes fail (VIRTIO_BLK_F_RO is offered).
    pub read_only: bool,
    /// GET_ID answer (NUL-padded).
    pub id: [u8; super::request::ID_LEN],
}

/// A request handed to the backend and not yet completed.
#[derive(Clone, Copy)]
struct InFlight {
    status: StatusByte,
    /// Bytes the device writes into the chain on success (data for reads, plus the status).
    written: u32,
}

/// The requests the backend holds, by head.
struct InFlightTable {
    slots: [Option<InFlight>; MAX_QUEUE_SIZE as usize],
    held: usize,
}

impl InFlightTable {
    fn new() -> Self {
        InFlightTable { slots: [None; MAX_QUEUE_SIZE as usize], held: 0 }
    }

    /// Record `head`: a head below the queue size, which the queue hands out at most once until
    /// it is returned (so the slot is free).
    fn insert(&mut self, head: u16, request: InFlight) {
        self.slots[head as usize] = Some(request);
        self.held += 1;
    }

    fn remove(&mut self, head: u16) -> Option<InFlight> {
        let request = self.slots.get_mut(head as usize)?.take()?;
        self.held -= 1;
        Some(request)
    }

    /// Answer the request `completion` is for through its status byte and count it; returns
    /// the used element to add. A tag the backend made up, or one already finished, is ignored.
    fn finish(&mut self, completion: Completion, counters: &mut RequestCounters) -> Option<(u16, u32)> {
        let head = u16::try_from(completion.tag).ok()?;
        let request = self.remove(head)?;
        let written = match completion.result {
            Ok(_) => {
                request.status.write(VIRTIO_BLK_S_OK);
                counters.completed += 1;
                request.written
            }
            Err(_) => {
                request.status.write(VIRTIO_BLK_S_IOERR);
                counters.io_errors += 1;
                1
            }
        };
        Some((head, written))
    }
}

/// One virtio-blk queue's data path: the queue (which keeps guest memory mapped), the backend
/// that owns the disk, and the requests between them.
pub struct BlockWorker {
    /// Declared first so it drops first: a backend's drop waits for the kernel to finish with
    /// the guest buffers of requests still in flight, which `queue` keeps mapped until then.
    backend: Box<dyn Backend>,
    queue: Queue,
    disk: DiskInfo,
    signals: DeviceSignals,
    request: Request,
    in_flight: InFlightTable,
    used_since_publish: usize,
    /// The owner polls the queue (notifications suppressed) rather than waiting for them.
    polling: bool,
    /// The driver broke the queue; nothing is served until the device is reset.
    broken: bool,
    /// What this worker did since it started.
    pub counters: RequestCounters,
    /// `counters` as last added to the device's stats.
    reported: RequestCounters,
}

// SAFETY: the raw pointers in `in_flight` and `request` point into guest memory that `queue`
// holds (requests are parsed from the queue's own memory), so they stay valid wherever the
// worker goes; the worker is used by one thread at a time.
unsafe impl Send for BlockWorker {}

impl BlockWorker {
    /// Serve `queue` (and the guest memory it holds) from `backend`.
    pub fn new(
        queue: Queue,
        backend: Box<dyn Backend>,
        disk: DiskInfo,
        signals: DeviceSignals,
    ) -> BlockWorker {
        BlockWorker {
            backend,
            queue,
            disk,
            signals,
            request: Request::empty(),
            in_flight: InFlightTable::new(),
            used_since_publish: 0,
            polling: false,
            broken: false,
            counters: RequestCounters::default(),
            reported: RequestCounters::default(),
        }
    }

    /// Give the backend back (device reset) once it holds none of this worker's requests: those
    /// write into guest memory this worker keeps mapped, and carry this worker's tags. There is
    /// no time limit, because memory the kernel may still write must not be unmapped or reused;
    /// a backend that takes long is reported once.
    pub fn into_backend(mut self) -> Box<dyn Backend> {
        let started = Instant::now();
        let mut reported = false;
        while self.in_flight.held > 0 {
            if self.complete() > 0 {
                continue;
            }
            if !reported && started.elapsed() >= SLOW_DRAIN {
                reported = true;
                eprintln!(
                    "exitless: {}: a reset is waiting for {} request(s) the disk still holds",
                    self.signals.stats().name(),
                    self.in_flight.held
                );
            }
            std::thread::sleep(Duration::from_micros(20));
        }
        self.backend
    }

    /// The queue, to stop it where vhost-user asks (its avail index).
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
            let parsed = self.request.parse(&self.queue, head, self.disk.capacity, self.disk.read_only)?;
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
                    // SAFETY: `parse` made the segment from a device-writable range of `len`
                    // bytes of the queue's memory, which `self.queue` keeps mapped. The guest
                    // may touch it concurrently, hence a volatile slice.
                    let slice = unsafe { VolatileSlice::new(segment.addr(), segment.len() as usize) };
                    let n = id.len().min(slice.len());
                    slice.copy_from(&id[..n]);
                    id = &id[n..];
                }
                let written = self.disk.id.len() - id.len() + 1;
                request.status.write(VIRTIO_BLK_S_OK);
                // At most ID_LEN + 1 bytes.
                self.add_used(head, u32::try_from(written).unwrap_or(u32::MAX));
                return;
            }
        };
        // `parse` bounds `data_len` by MAX_SEGMENTS descriptors of at most SIZE_MAX bytes.
        let written =
            if op == Op::Read { u32::try_from(request.data_len + 1).unwrap_or(u32::MAX) } else { 1 };
        if !self.backend.submit(head as u32, op, request.offset, request.segments()) {
            // The backend holds at least a queue's worth of requests, so this is a backend fault.
            request.status.write(VIRTIO_BLK_S_IOERR);
            self.counters.io_errors += 1;
            self.add_used(head, 1);
            return;
        }
        self.in_flight.insert(head, InFlight { status: request.status, written });
    }

    /// Collect finished requests into the used ring, publish them, and interrupt the guest if
    /// it asked to be. Returns how many completed.
    pub fn complete(&mut self) -> usize {
        let Self { backend, queue, in_flight, counters, used_since_publish, .. } = self;
        let finished = backend.poll(&mut |completion| {
            if let Some((head, written)) = in_flight.finish(completion, counters) {
                queue.add_used(head, written);
                *used_since_publish += 1;
            }
        });
        self.publish();
        finished
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
        self.signals.stats().add(&self.counters.since(&self.reported));
        self.reported = self.counters;
    }
}

impl QueueWorker for BlockWorker {
    fn poll(&mut self) -> usize {
        if self.broken {
            return 0;
        }
        let started = self.process_queue();
        // Requests started before the queue broke still finish (their buffers are valid), and
        // what finished is published before the driver is told the device needs a reset.
        let finished = self.complete();
        match started {
            Ok(started) => started + finished,
            Err(e) => {
                self.broken = true;
                self.signals.queue_broken(e);
                finished
            }
        }
    }

    fn set_polling(&mut self, polling: bool) {
        self.polling = polling;
        if !self.broken {
            self.queue.set_notifications(!polling);
        }
    }

    fn in_flight(&self) -> usize {
        self.in_flight.held
    }

    fn has_pending(&self) -> bool {
        !self.broken && self.queue.has_avail().unwrap_or(true)
    }

    fn backend_fd(&self) -> Option<std::os::fd::RawFd> {
        self.backend.completion_fd()
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }
}
