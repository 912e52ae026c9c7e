//! The virtio-blk data path: takes requests off the queue, runs them on the backend, and puts
//! completions in the used ring. It does not know which I/O mode drives it: the vCPU thread
//! (trap), an I/O thread woken by an eventfd, or a polling IOCore call the same two methods.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::latency::LocalHistogram;
use rate_limiter::RateLimiter;
use storage::{Backend, Completion, IoError, Op, Segment, MAX_SEGMENTS};
use virtqueue::dirty::{guest_address, DirtyLog};
use virtqueue::queue::{Queue, QueueError, MAX_QUEUE_SIZE};
use virtqueue::QueueWorker;
use vm_memory::{GuestMemoryMmap, VolatileSlice};

use super::request::{
    Parsed, Rejection, Request, RequestKind, StatusByte, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK,
    VIRTIO_BLK_S_UNSUPP,
};
use crate::device::{DeviceSignals, RequestCounters};

/// How long a reset waits for the backend to finish the worker's requests before it cancels
/// them, unless the disk is configured otherwise ([`BlockWorker::with_reset_timeout`]; see
/// `into_backend`). A request normally takes micro- to milliseconds, but a FLUSH over much dirty
/// data, or a slow network disk, can take seconds, and a vhost-user frontend that stops its
/// rings (to pause or migrate the VM) needs every completion a disk still gives.
pub const RESET_WAIT: Duration = Duration::from_secs(5);

/// How long a reset that cancelled the disk's requests waits for the cancels, at most (never
/// longer than its own bound): a cancel the kernel can do ends a request within microseconds
/// (a poll it removes) or milliseconds (a worker thread it interrupts).
const CANCEL_WAIT: Duration = Duration::from_secs(1);

/// What the device tells the guest about the disk.
#[derive(Debug, Clone, Default)]
pub struct DiskInfo {
    /// Size in bytes.
    pub capacity: u64,
    /// Writes fail (VIRTIO_BLK_F_RO is offered).
    pub read_only: bool,
    /// GET_ID answer (NUL-padded).
    pub id: [u8; super::request::ID_LEN],
    /// DISCARD is served: the device offers VIRTIO_BLK_F_DISCARD and the driver took it
    /// (otherwise such a request is answered UNSUPP).
    pub discard: bool,
    /// WRITE_ZEROES is served (VIRTIO_BLK_F_WRITE_ZEROES offered and taken).
    pub write_zeroes: bool,
    /// The driver switched the cache to writethrough (VIRTIO_BLK_F_CONFIG_WCE, writeback 0):
    /// set by the device, read by its workers once per pass (`Backend::set_write_through`).
    pub write_through: Arc<AtomicBool>,
}

/// A request handed to the backend and not yet completed.
#[derive(Clone, Copy)]
struct InFlight {
    status: StatusByte,
    /// Bytes the device writes into the chain on success (data for reads, plus the status).
    written: u32,
    /// Data bytes the request moves (for the byte count).
    data: u32,
    /// When it was taken off the ring ([`clock::ticks`]).
    started: u64,
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
    /// Drop the request `tag` names without answering it (an abandoned worker's).
    /// `true` if it was held.
    fn forget(&mut self, tag: u32) -> bool {
        u16::try_from(tag).is_ok_and(|head| self.remove(head).is_some())
    }

    fn finish(
        &mut self,
        completion: Completion,
        counters: &mut RequestCounters,
        latency: &mut LocalHistogram,
        now: u64,
    ) -> Option<(u16, u32, StatusByte)> {
        let head = u16::try_from(completion.tag).ok()?;
        let request = self.remove(head)?;
        latency.record(now.saturating_sub(request.started));
        let written = match completion.result {
            Ok(_) => {
                request.status.write(VIRTIO_BLK_S_OK);
                counters.completed += 1;
                counters.bytes += u64::from(request.data);
                request.written
            }
            Err(IoError::Unsupported) => {
                request.status.write(VIRTIO_BLK_S_UNSUPP);
                counters.io_errors += 1;
                1
            }
            Err(_) => {
                request.status.write(VIRTIO_BLK_S_IOERR);
                counters.io_errors += 1;
                1
            }
        };
        Some((head, written, request.status))
    }
}

/// A live migration's dirty log, as a worker keeps it: the log, and the guest-physical ranges
/// of each read in flight, marked once the disk has written them (marking them earlier would
/// let the frontend copy a page before the data lands in it, and not again).
struct DirtyState {
    log: DirtyLog,
    /// `MAX_SEGMENTS` ranges per head, allocated when logging starts (never per request).
    ranges: Box<[(u64, u32)]>,
    /// How many of a head's ranges are held (0 for requests that write no data).
    counts: Box<[u8]>,
}

impl DirtyState {
    fn new(log: DirtyLog, queue_size: u16) -> DirtyState {
        let heads = usize::from(queue_size);
        DirtyState {
            log,
            ranges: vec![(0, 0); heads * MAX_SEGMENTS].into_boxed_slice(),
            counts: vec![0; heads].into_boxed_slice(),
        }
    }

    /// Keep the guest-physical ranges of `segments`, which the disk will write for `head` (a
    /// head below the queue size).
    fn hold(&mut self, mem: &GuestMemoryMmap, head: u16, segments: &[Segment]) {
        let head = usize::from(head);
        let n = segments.len().min(MAX_SEGMENTS);
        if let Some(slots) = self.ranges.get_mut(head * MAX_SEGMENTS..head * MAX_SEGMENTS + n) {
            for (slot, segment) in slots.iter_mut().zip(segments) {
                // Segments come from the queue's memory; one that did not would mark nothing.
                *slot = (guest_address(mem, segment.addr()).unwrap_or(u64::MAX), segment.len());
            }
            // MAX_SEGMENTS (128) fits a u8.
            self.counts[head] = u8::try_from(n).unwrap_or(0);
        }
    }

    /// Mark the pages of `segments`, just written.
    fn mark_segments(&self, mem: &GuestMemoryMmap, segments: &[Segment]) {
        for segment in segments {
            if let Some(gpa) = guest_address(mem, segment.addr()) {
                self.log.mark(gpa, u64::from(segment.len()));
            }
        }
    }

    /// Mark a status byte just written.
    fn mark_status(&self, mem: &GuestMemoryMmap, status: StatusByte) {
        if let Some(gpa) = guest_address(mem, status.host_address()) {
            self.log.mark(gpa, 1);
        }
    }

    /// `head` finished: mark the ranges its disk wrote and its status byte.
    fn mark_finished(&mut self, mem: &GuestMemoryMmap, head: u16, status: StatusByte) {
        let head = usize::from(head);
        if let Some(count) = self.counts.get_mut(head) {
            let n = usize::from(std::mem::take(count));
            for &(gpa, len) in &self.ranges[head * MAX_SEGMENTS..head * MAX_SEGMENTS + n] {
                self.log.mark(gpa, u64::from(len));
            }
        }
        self.mark_status(mem, status);
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
    /// Why it broke, until the driver is told: once the requests started before the break
    /// have finished and are in the used ring, so that it sees the same whatever the backend
    /// (a RAM disk finishes them at once, an io_uring disk later).
    unreported_break: Option<QueueError>,
    /// What this worker did since it started.
    pub counters: RequestCounters,
    /// `counters` as last added to the device's stats.
    reported: RequestCounters,
    /// Service times, added to the device's stats with the counters.
    latency: LocalHistogram,
    /// The most requests one pass takes off the ring (fair share between queues of one owner).
    batch_limit: usize,
    /// The device's token buckets, shared by its queues.
    limiter: Option<Arc<RateLimiter>>,
    /// The last pass left requests in the ring because a bucket was empty.
    throttled: bool,
    /// Its driver gives no kick (vhost-user's VRING_NOFD): nothing announces its requests.
    unannounced: bool,
    /// Requests were submitted since the backend was last kicked.
    unkicked: bool,
    /// The clock when the current pass began: requests taken in it started then.
    now: u64,
    /// A reset gave up on the requests in flight: they are only reaped, not answered (the
    /// driver has moved on, and its rings may serve another worker).
    abandoned: bool,
    /// The cache mode the backend was last told (`DiskInfo::write_through`).
    write_through: bool,
    /// The device's queue this worker serves, for its per-queue counts.
    queue_index: usize,
    /// During a live migration, every guest page the worker writes is marked here (the used
    /// ring's by the queue); `None`: no logging, and no cost.
    dirty: Option<Box<DirtyState>>,
    /// How long a reset waits for the backend before it cancels what it holds.
    reset_timeout: Duration,
}

// SAFETY: the raw pointers in `in_flight` and `request` point into guest memory that `queue`
// holds (requests are parsed from the queue's own memory), so they stay valid wherever the
// worker goes; the worker is used by one thread at a time.
unsafe impl Send for BlockWorker {}

impl BlockWorker {
    /// Serve `queue` (and the guest memory it holds) from `backend`.
    pub fn new(
        queue: Queue,
        mut backend: Box<dyn Backend>,
        disk: DiskInfo,
        signals: DeviceSignals,
    ) -> BlockWorker {
        let write_through = disk.write_through.load(Ordering::Relaxed);
        backend.set_write_through(write_through);
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
            unreported_break: None,
            counters: RequestCounters::default(),
            reported: RequestCounters::default(),
            latency: LocalHistogram::default(),
            batch_limit: usize::MAX,
            limiter: None,
            throttled: false,
            unannounced: false,
            unkicked: false,
            now: 0,
            abandoned: false,
            write_through,
            queue_index: 0,
            dirty: None,
            reset_timeout: RESET_WAIT,
        }
    }

    /// Let a reset wait `timeout` (rather than `RESET_WAIT`) for the backend before it cancels
    /// the requests it holds (see [`BlockWorker::into_backend`]).
    pub fn with_reset_timeout(mut self, timeout: Duration) -> BlockWorker {
        self.reset_timeout = timeout;
        self
    }

    /// The device's stats as they stand (what its workers reported so far).
    pub fn stats_snapshot(&self) -> crate::DeviceStatsSnapshot {
        self.signals.stats().snapshot()
    }

    /// The device's name in logs.
    pub fn device_name(&self) -> &str {
        self.signals.stats().name()
    }

    /// Count this worker's requests as queue `index`'s in the device's stats (default 0).
    pub fn for_queue(mut self, index: usize) -> BlockWorker {
        self.queue_index = index;
        self
    }

    /// Take at most `limit` (at least 1) requests off the ring per pass, so that an owner that
    /// serves several queues in turn gives each its share (a queue at depth 64 cannot hold the
    /// others up for more than `limit` requests). Only for owners that poll again while requests
    /// are left ([`QueueWorker::has_pending`]), as the IOCore does; the default is no limit.
    pub fn with_batch_limit(mut self, limit: usize) -> BlockWorker {
        self.batch_limit = limit.max(1);
        self
    }

    /// Mark every guest page this worker writes (read data, GET_ID answers, status bytes) in
    /// `log`: a live migration is copying guest memory. The used ring is the queue's to mark
    /// (`Queue::with_used_log`, `Queue::set_used_log`).
    pub fn with_dirty_log(mut self, log: DirtyLog) -> BlockWorker {
        self.dirty = Some(Box::new(DirtyState::new(log, self.queue.size())));
        self
    }

    /// Start (`Some`) or stop (`None`) marking the guest pages this worker writes, used ring
    /// included, on a worker that holds no request (drained: a read in flight when logging
    /// starts would not be marked when it lands).
    pub fn set_dirty_log(&mut self, log: Option<DirtyLog>) {
        self.queue.set_used_log(log.clone());
        self.dirty = log.map(|log| Box::new(DirtyState::new(log, self.queue.size())));
    }

    /// Mark a status byte just written, if logging.
    fn log_status(&self, status: StatusByte) {
        if let Some(dirty) = &self.dirty {
            dirty.mark_status(self.queue.memory(), status);
        }
    }

    /// Its driver will not kick (vhost-user's VRING_NOFD, "polling should be used instead"): an
    /// owner that sleeps must look at the ring again after a moment (`unannounced`).
    pub fn without_kicks(mut self) -> BlockWorker {
        self.unannounced = true;
        self
    }

    /// Take requests only while `limiter`'s buckets hold tokens; the rest wait in the ring.
    pub fn with_rate_limiter(mut self, limiter: Arc<RateLimiter>) -> BlockWorker {
        self.limiter = Some(limiter);
        self
    }

    /// Give the backend back (device reset) once it holds none of this worker's requests: those
    /// write into guest memory this worker keeps mapped, and carry this worker's tags. After the
    /// reset timeout (`with_reset_timeout`) it asks the backend to cancel them
    /// (`storage::Backend::cancel_all`) and waits for the cancels a little longer (`CANCEL_WAIT`,
    /// at most the timeout again): a cancelled request completes with an error, answered to the
    /// driver as VIRTIO_BLK_S_IOERR. If the disk still holds some (a wait the kernel cannot
    /// cancel), it gives up and returns itself, abandoned (see [`BlockWorker::abandon`]): the
    /// worker is then their quarantine, since it owns the guest memory the kernel may still
    /// write (`queue`) and the backend whose ring and iovec table the kernel still reads. The
    /// caller keeps it until [`QueueWorker::in_flight`] is 0, and serves the disk through a
    /// backend opened again ([`BlockWorker::reopen_backend`]). Logged on one line at warn
    /// level, and counted in the device's stats ([`DeviceStats::reset_timed_out`]).
    ///
    /// [`DeviceStats::reset_timed_out`]: crate::DeviceStats::reset_timed_out
    pub fn into_backend(mut self) -> Result<Box<dyn Backend>, Box<BlockWorker>> {
        // Whatever was submitted reaches the kernel, or it would never finish.
        self.kick();
        if !self.wait_for_backend(self.reset_timeout) {
            let held = self.in_flight.held;
            self.backend.cancel_all();
            self.wait_for_backend(self.reset_timeout.min(CANCEL_WAIT));
            let quarantined = self.in_flight.held;
            // Ended after the cancel: cancelled, or finished meanwhile.
            let cancelled = held.saturating_sub(quarantined);
            let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
            self.signals.stats().reset_timed_out(count(cancelled), count(quarantined));
            log::warn!(
                "{}: {held} request(s) still held after {} s at reset; cancelled {cancelled}, \
                 quarantined {quarantined}{}",
                self.signals.stats().name(),
                self.reset_timeout.as_secs_f64(),
                if quarantined > 0 {
                    " (kept with the old guest memory and io_uring until the disk finishes them; \
                     the disk is opened again for the next driver)"
                } else {
                    ""
                }
            );
            if quarantined > 0 {
                self.abandon();
                return Err(Box::new(self));
            }
        }
        if let Some(why) = self.unreported_break.take() {
            self.signals.queue_broken_at_reset(why);
        }
        Ok(self.backend)
    }

    /// Reap and answer completions until the backend holds none of this worker's requests
    /// (`true`) or `limit` has passed (`false`). Only while a reset waits.
    fn wait_for_backend(&mut self, limit: Duration) -> bool {
        let started = Instant::now();
        while self.in_flight.held > 0 {
            if self.complete() > 0 {
                continue;
            }
            if started.elapsed() >= limit {
                return false;
            }
            std::thread::sleep(Duration::from_micros(20));
        }
        true
    }

    /// Stop answering the driver: requests still in flight are reaped as the backend finishes
    /// them, without a used entry, a status or an interrupt.
    pub fn abandon(&mut self) {
        self.abandoned = true;
    }

    /// A new backend on this worker's disk (`storage::Backend::reopen`), for the device to go on
    /// with while this worker keeps the requests it gave up on.
    pub fn reopen_backend(&self) -> Result<Box<dyn Backend>, storage::BackendError> {
        self.backend.reopen()
    }

    /// The queue, to stop it where vhost-user asks (its avail index).
    pub fn queue_mut(&mut self) -> &mut Queue {
        &mut self.queue
    }

    /// Take every available request and start it. An error means the guest broke the queue
    /// itself: the device must stop and ask for a reset.
    pub fn process_queue(&mut self) -> Result<usize, QueueError> {
        let result = self.take_requests();
        // Also when the pass ended at a broken queue: a request the backend holds but never
        // handed to the kernel would never finish, and the reset that follows would wait for it
        // for ever (a head offered twice in one pass did that on io_uring disks).
        self.kick();
        result
    }

    /// Hand the requests submitted since the last kick to the backend's kernel side.
    fn kick(&mut self) {
        if self.unkicked {
            self.unkicked = false;
            self.backend.kick();
        }
    }

    /// `process_queue`'s pass, without the kick.
    fn take_requests(&mut self) -> Result<usize, QueueError> {
        self.throttled = false;
        self.now = clock::ticks();
        // The driver may switch the cache mode at any time; requests taken from here on follow
        // it (one atomic load per pass, no lock).
        let write_through = self.disk.write_through.load(Ordering::Relaxed);
        if write_through != self.write_through {
            self.write_through = write_through;
            self.backend.set_write_through(write_through);
        }
        if let Some(limiter) = &self.limiter {
            limiter.refill(self.now);
        }
        let mut started = self.take_available(self.batch_limit)?;
        if self.polling {
            // Keep the driver's notification threshold behind us (EVENT_IDX), so it never fires.
            if started > 0 {
                self.queue.set_notifications(false);
            }
        } else {
            // Ask for the next notification, then look again: a request made before the driver
            // saw the request for a notification would otherwise wait for the next one.
            // A pass cut short (batch limit, rate limit) leaves the rest to the owner's next one.
            while !self.throttled && started < self.batch_limit {
                self.queue.set_notifications(true);
                if !self.queue.has_avail()? {
                    break;
                }
                started += self.take_available(self.batch_limit - started)?;
            }
        }
        Ok(started)
    }

    /// Take up to `limit` available requests and start them, while the rate limit allows.
    fn take_available(&mut self, limit: usize) -> Result<usize, QueueError> {
        let mut started = 0;
        while started < limit {
            if let Some(limiter) = &self.limiter {
                if !limiter.allows() {
                    if self.queue.has_avail()? {
                        self.throttled = true;
                        limiter.note_wait();
                    }
                    break;
                }
            }
            let Some(head) = self.queue.pop_avail()? else { break };
            started += 1;
            let parsed = self.request.parse(&self.queue, head, &self.disk)?;
            if let Some(limiter) = &self.limiter {
                let bytes = if matches!(parsed, Parsed::Ready) { self.request.data_len } else { 0 };
                limiter.consume(bytes);
            }
            match parsed {
                Parsed::Ready => self.start(),
                Parsed::Rejected(Rejection::Status { status, code }) => {
                    status.write(code);
                    self.log_status(status);
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
            RequestKind::Discard => Op::Discard { len: request.range_len },
            RequestKind::WriteZeroes { unmap } => Op::WriteZeroes { len: request.range_len, unmap },
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
                if let Some(dirty) = &self.dirty {
                    dirty.mark_segments(self.queue.memory(), request.segments());
                    dirty.mark_status(self.queue.memory(), request.status);
                }
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
            self.log_status(request.status);
            self.counters.io_errors += 1;
            self.add_used(head, 1);
            return;
        }
        self.unkicked = true;
        if let Some(dirty) = &mut self.dirty {
            // Reads only: the disk writes no other request's data segments.
            let written = if op == Op::Read { request.segments() } else { &[] };
            dirty.hold(self.queue.memory(), head, written);
        }
        // At most MAX_SEGMENTS descriptors of u32 lengths: counted saturating. A range request
        // moves no data (its 16-byte range is not counted).
        let moved = if op.range_len().is_some() { 0 } else { request.data_len };
        let data = u32::try_from(moved).unwrap_or(u32::MAX);
        self.in_flight.insert(head, InFlight { status: request.status, written, data, started: self.now });
    }

    /// Collect finished requests into the used ring, publish them, and interrupt the guest if
    /// it asked to be. Returns how many completed.
    pub fn complete(&mut self) -> usize {
        // One clock read for the whole batch of completions.
        let now = if self.in_flight.held > 0 { clock::ticks() } else { self.now };
        let Self {
            backend, queue, in_flight, counters, latency, used_since_publish, abandoned, dirty, ..
        } = self;
        let mut released = 0u64;
        let finished = backend.poll(&mut |completion| {
            if *abandoned {
                released += u64::from(in_flight.forget(completion.tag));
            } else if let Some((head, written, status)) = in_flight.finish(completion, counters, latency, now)
            {
                if let Some(dirty) = dirty {
                    dirty.mark_finished(queue.memory(), head, status);
                }
                queue.add_used(head, written);
                *used_since_publish += 1;
            }
        });
        if released > 0 {
            self.signals.stats().quarantine_released(released);
        }
        self.publish();
        finished
    }

    /// Tell the driver the queue broke (DEVICE_NEEDS_RESET) once nothing started before the
    /// break is still in flight. The owner keeps polling while requests are in flight (the
    /// IOCore waits on the backend's descriptor, trap mode up to its completion wait).
    fn report_break(&mut self) {
        if self.in_flight.held == 0 {
            if let Some(why) = self.unreported_break.take() {
                self.signals.queue_broken(why);
            }
        }
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
        self.signals.stats().add_for_queue(self.queue_index, &self.counters.since(&self.reported));
        self.reported = self.counters;
        self.latency.report(self.signals.stats().latency());
    }
}

impl QueueWorker for BlockWorker {
    fn poll(&mut self) -> usize {
        // Requests started before the queue broke still finish (their buffers are valid), and
        // what finished is published before the driver is told the device needs a reset. Those
        // the kernel finishes later are reaped too: their completions would otherwise keep the
        // backend's descriptor readable, and the owner spinning, until the reset.
        if self.broken {
            let finished = self.complete();
            self.report_break();
            return finished;
        }
        let started = self.process_queue();
        let finished = self.complete();
        match started {
            Ok(started) => started + finished,
            Err(e) => {
                self.broken = true;
                self.unreported_break = Some(e);
                self.report_break();
                finished
            }
        }
    }

    fn set_dirty_log(&mut self, log: Option<DirtyLog>) -> bool {
        BlockWorker::set_dirty_log(self, log);
        true
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

    fn backend_fd_fired(&mut self) {
        self.backend.completion_fd_fired();
    }

    fn waits_on_submitter_workers(&self) -> bool {
        self.backend.waits_on_submitter_workers()
    }

    fn waits_on_backend_threads(&self) -> bool {
        self.backend.completes_on_own_threads()
    }

    fn throttled(&self) -> bool {
        self.throttled && !self.broken
    }

    fn unannounced(&self) -> bool {
        self.unannounced && !self.broken
    }
}
