//! The virtio-blk data path: takes requests off the queue, runs them on the backend, and puts
//! completions in the used ring. It does not know which I/O mode drives it: the vCPU thread
//! (trap), an I/O thread woken by an eventfd, or a polling IOCore call the same two methods.

use storage::{Backend, Completion, Op};

use super::request::{
    Parsed, Rejection, Request, RequestKind, StatusByte, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK,
};
use crate::interrupt::InterruptLine;
use crate::queue::{Queue, QueueError, MAX_QUEUE_SIZE};
use vm_memory::GuestMemoryMmap;

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
    interrupt: InterruptLine,
    request: Request,
    in_flight: [InFlight; MAX_QUEUE_SIZE as usize],
    used_since_publish: usize,
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
        interrupt: InterruptLine,
    ) -> BlockWorker {
        let idle = InFlight { status: None, written: 0 };
        BlockWorker {
            queue,
            mem,
            backend,
            disk,
            interrupt,
            request: Request::empty(),
            in_flight: [idle; MAX_QUEUE_SIZE as usize],
            used_since_publish: 0,
            counters: BlockCounters::default(),
        }
    }

    /// Give the backend back (device reset).
    pub fn into_backend(self) -> Box<dyn Backend> {
        self.backend
    }

    pub fn queue_mut(&mut self) -> &mut Queue {
        &mut self.queue
    }

    /// Take every available request and start it. An error means the guest broke the queue
    /// itself: the device must stop and ask for a reset.
    pub fn process_queue(&mut self) -> Result<usize, QueueError> {
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
        if started > 0 {
            self.backend.kick();
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
        if !self.backend.submit(head as u32, op, request.offset, request.segments()) {
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
            self.interrupt.signal_used_buffer();
        }
    }
}
