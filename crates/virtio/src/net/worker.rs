//! The virtio-net data path: frames from the transmit queue to the backend, and from the
//! backend into receive chains the driver posted. Every descriptor is checked against guest
//! RAM before a byte moves; a malformed chain is returned unused and counted, a broken queue
//! (loop, bad index, avail jump) needs a device reset. Nothing here allocates or locks once the
//! worker exists; the backend's read and write are the only system calls.

use virtqueue::dirty::{guest_address, DirtyLog};
use virtqueue::queue::{Descriptor, Queue, QueueError};
use virtqueue::QueueWorker;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, VolatileSlice};

use super::backend::NetBackend;
use super::{MAX_FRAME_LEN, MIN_FRAME_LEN, NET_HDR_LEN};
use crate::device::DeviceSignals;

/// Descriptors one packet may use.
const MAX_PARTS: usize = 64;
/// Frames received per `poll` at most, so transmission is not starved.
const RX_BATCH: usize = 64;
/// Room for any frame a tap can hand over (a 64 KiB MTU and an Ethernet header), to see how long
/// an oversized frame was and to drop frames nobody has a buffer for.
const SCRATCH_LEN: usize = 65_536 + 32;

const EMPTY: libc::iovec = libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 };

/// Packets moved and dropped, by reason.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct NetCounters {
    /// Frames from the transmit queue that the backend sent.
    pub tx_frames: u64,
    /// Transmit chains with a bad descriptor, direction or length: returned, not sent.
    pub tx_malformed: u64,
    /// Frames the backend refused (e.g. the tap is down).
    pub tx_errors: u64,
    /// Frames delivered into receive chains.
    pub rx_frames: u64,
    /// Frames that arrived with no receive buffer posted.
    pub rx_no_buffer: u64,
    /// Frames longer than the receive chain they would land in.
    pub rx_too_big: u64,
    /// Frames shorter than an Ethernet header.
    pub rx_truncated: u64,
    /// Receive chains with a bad descriptor or too small for a header: returned empty.
    pub rx_malformed: u64,
    /// Used-buffer interrupts sent to the driver.
    pub interrupts: u64,
}

/// A receive chain taken from the driver and not yet filled.
struct RxChain {
    head: u16,
    /// The chain's bytes after the header, then the scratch buffer (to measure overflow).
    parts: [libc::iovec; MAX_PARTS + 1],
    count: usize,
    /// Where the 12-byte header goes: (address, length) pieces at the chain's start.
    header: [(*mut u8, usize); NET_HDR_LEN],
    header_pieces: usize,
    /// Frame bytes the chain holds after the header.
    capacity: usize,
}

/// The data path of a [`Net`](super::Net): both of its queues, polled as one `QueueWorker` by
/// whoever serves the device. It owns the backend until `deactivate` takes it back.
pub struct NetWorker {
    rx: Queue,
    tx: Queue,
    mem: GuestMemoryMmap,
    backend: Box<dyn NetBackend>,
    signals: DeviceSignals,
    staged: Option<RxChain>,
    tx_parts: [libc::iovec; MAX_PARTS],
    scratch: Box<[u8]>,
    polling: bool,
    broken: bool,
    rx_used: usize,
    tx_used: usize,
    /// A live migration's dirty log: receive buffers filled are marked in it (the queues mark
    /// their used rings).
    dirty: Option<DirtyLog>,
    /// What it did since it started (kept here only: nothing adds it to `DeviceStats`).
    pub counters: NetCounters,
}

// SAFETY: the raw pointers (iovecs, header pieces) point into regions of `mem`, which the worker
// holds (they are resolved through it), or into its own scratch buffer; the worker is used by
// one thread at a time.
unsafe impl Send for NetWorker {}

impl NetWorker {
    /// A worker for the driver's receive and transmit queues over `mem`, moving frames through
    /// `backend` and signalling through `signals`.
    pub fn new(
        rx: Queue,
        tx: Queue,
        mem: GuestMemoryMmap,
        backend: Box<dyn NetBackend>,
        signals: DeviceSignals,
    ) -> NetWorker {
        NetWorker {
            rx,
            tx,
            mem,
            backend,
            signals,
            staged: None,
            tx_parts: [EMPTY; MAX_PARTS],
            scratch: vec![0u8; SCRATCH_LEN].into_boxed_slice(),
            polling: false,
            broken: false,
            rx_used: 0,
            tx_used: 0,
            dirty: None,
            counters: NetCounters::default(),
        }
    }

    /// Give the backend back (device reset), ending the worker.
    pub(crate) fn into_backend(self) -> Box<dyn NetBackend> {
        self.backend
    }

    /// Host addresses of a chain's descriptors, checked: `writable` is the direction every
    /// descriptor must have. `None` for a bad address, direction or too many descriptors.
    fn chain_parts(
        mem: &GuestMemoryMmap,
        queue: &Queue,
        head: u16,
        writable: bool,
        parts: &mut [libc::iovec],
    ) -> Result<Option<usize>, QueueError> {
        let mut count = 0;
        let mut valid = true;
        queue.walk_chain(head, |d: Descriptor| {
            let slice = mem.get_slice(GuestAddress(d.addr), d.len as usize);
            match slice {
                Ok(slice) if d.is_write_only() == writable && count < parts.len() => {
                    parts[count] = libc::iovec {
                        iov_base: slice.ptr_guard_mut().as_ptr().cast(),
                        iov_len: d.len as usize,
                    };
                    count += 1;
                    true
                }
                _ => {
                    valid = false;
                    false
                }
            }
        })?;
        Ok(valid.then_some(count))
    }

    fn transmit(&mut self) -> Result<usize, QueueError> {
        let mut sent = 0;
        loop {
            while let Some(head) = self.tx.pop_avail()? {
                self.send(head)?;
                self.tx.add_used(head, 0);
                self.tx_used += 1;
                sent += 1;
            }
            if !rearm(&mut self.tx, self.polling, sent > 0)? {
                return Ok(sent);
            }
        }
    }

    fn send(&mut self, head: u16) -> Result<(), QueueError> {
        let Some(count) = Self::chain_parts(&self.mem, &self.tx, head, false, &mut self.tx_parts)? else {
            self.counters.tx_malformed += 1;
            return Ok(());
        };
        let total: usize = self.tx_parts[..count].iter().map(|p| p.iov_len).sum();
        let frame_len = total.wrapping_sub(NET_HDR_LEN);
        if total < NET_HDR_LEN + MIN_FRAME_LEN || frame_len > MAX_FRAME_LEN {
            self.counters.tx_malformed += 1;
            return Ok(());
        }
        // Skip the header: it carries nothing we act on (no offloads were negotiated).
        let first = skip(&mut self.tx_parts[..count], NET_HDR_LEN);
        match self.backend.write_frame(&self.tx_parts[first..count]) {
            Ok(_) => self.counters.tx_frames += 1,
            Err(_) => self.counters.tx_errors += 1,
        }
        Ok(())
    }

    fn receive(&mut self) -> Result<usize, QueueError> {
        let mut received = 0;
        let mut taken = false;
        for _ in 0..RX_BATCH {
            if self.staged.is_none() {
                let Some(head) = self.rx.pop_avail()? else {
                    if !rearm(&mut self.rx, self.polling, taken)? {
                        // No buffer posted: a waiting frame has nowhere to go.
                        if self.drop_waiting_frame() {
                            continue;
                        }
                        break;
                    }
                    continue;
                };
                taken = true;
                if !self.stage(head)? {
                    self.rx.add_used(head, 0);
                    self.rx_used += 1;
                    self.counters.rx_malformed += 1;
                    continue;
                }
            }
            let Some(chain) = self.staged.as_mut() else { break };
            let Ok(Some(n)) = self.backend.read_frame(&mut chain.parts[..=chain.count]) else { break };
            if n < MIN_FRAME_LEN {
                self.counters.rx_truncated += 1;
                continue;
            }
            if n > chain.capacity {
                self.counters.rx_too_big += 1;
                continue;
            }
            let chain = self.staged.take().expect("staged above");
            write_header(&chain);
            if let Some(log) = &self.dirty {
                mark_received(log, &self.mem, &chain, n);
            }
            // A frame is at most SCRATCH_LEN bytes.
            self.rx.add_used(chain.head, u32::try_from(NET_HDR_LEN + n).unwrap_or(u32::MAX));
            self.rx_used += 1;
            self.counters.rx_frames += 1;
            received += 1;
        }
        Ok(received)
    }

    /// Take receive chain `head` apart into header pieces and frame iovecs; `false` if it is
    /// malformed or cannot hold a header and a minimal frame.
    fn stage(&mut self, head: u16) -> Result<bool, QueueError> {
        let mut parts = [EMPTY; MAX_PARTS + 1];
        let Some(count) = Self::chain_parts(&self.mem, &self.rx, head, true, &mut parts[..MAX_PARTS])? else {
            return Ok(false);
        };
        let total: usize = parts[..count].iter().map(|p| p.iov_len).sum();
        if total < NET_HDR_LEN + MIN_FRAME_LEN {
            return Ok(false);
        }
        let mut header = [(std::ptr::null_mut(), 0); NET_HDR_LEN];
        let mut header_pieces = 0;
        let mut need = NET_HDR_LEN;
        for part in parts[..count].iter() {
            if need == 0 {
                break;
            }
            let n = need.min(part.iov_len);
            if n > 0 {
                header[header_pieces] = (part.iov_base.cast::<u8>(), n);
                header_pieces += 1;
                need -= n;
            }
        }
        let first = skip(&mut parts[..count], NET_HDR_LEN);
        let frame_parts = count - first;
        parts.copy_within(first..count, 0);
        parts[frame_parts] =
            libc::iovec { iov_base: self.scratch.as_mut_ptr().cast(), iov_len: self.scratch.len() };
        self.staged = Some(RxChain {
            head,
            parts,
            count: frame_parts,
            header,
            header_pieces,
            capacity: total - NET_HDR_LEN,
        });
        Ok(true)
    }

    /// Read and drop one frame, if one is waiting; `true` if there was one.
    fn drop_waiting_frame(&mut self) -> bool {
        let mut scratch =
            [libc::iovec { iov_base: self.scratch.as_mut_ptr().cast(), iov_len: self.scratch.len() }];
        match self.backend.read_frame(&mut scratch) {
            Ok(Some(_)) => {
                self.counters.rx_no_buffer += 1;
                true
            }
            _ => false,
        }
    }

    /// Make used entries visible and interrupt the driver once per queue, if it asked to be.
    fn publish(&mut self) {
        for (queue, used) in [(&mut self.tx, &mut self.tx_used), (&mut self.rx, &mut self.rx_used)] {
            if *used == 0 {
                continue;
            }
            *used = 0;
            queue.publish_used();
            if queue.needs_interrupt() {
                self.counters.interrupts += 1;
                self.signals.interrupt.signal_used_buffer();
            }
        }
    }
}

/// After draining a queue: polling owners keep the driver from notifying; notified owners ask
/// for the next notification and look once more. `true` if there is more to take.
fn rearm(queue: &mut Queue, polling: bool, took_some: bool) -> Result<bool, QueueError> {
    if polling {
        if took_some {
            queue.set_notifications(false);
        }
        return Ok(false);
    }
    queue.set_notifications(true);
    queue.has_avail()
}

/// Advance `parts` past the first `bytes` bytes; returns the index of the first part left.
fn skip(parts: &mut [libc::iovec], mut bytes: usize) -> usize {
    for (index, part) in parts.iter_mut().enumerate() {
        if bytes < part.iov_len {
            // SAFETY: `bytes` is inside this part, so the new base is too.
            part.iov_base = unsafe { part.iov_base.cast::<u8>().add(bytes) }.cast();
            part.iov_len -= bytes;
            return index;
        }
        bytes -= part.iov_len;
    }
    parts.len()
}

/// Mark in `log` the pages a frame of `len` bytes, and its header, filled in `chain`.
fn mark_received(log: &DirtyLog, mem: &GuestMemoryMmap, chain: &RxChain, len: usize) {
    let mark = |host: *const u8, bytes: usize| {
        if let Some(gpa) = guest_address(mem, host) {
            log.mark(gpa, bytes as u64);
        }
    };
    for &(addr, bytes) in &chain.header[..chain.header_pieces] {
        mark(addr, bytes);
    }
    let mut left = len;
    for part in &chain.parts[..chain.count] {
        if left == 0 {
            break;
        }
        let bytes = left.min(part.iov_len);
        mark(part.iov_base.cast::<u8>(), bytes);
        left -= bytes;
    }
}

/// A zeroed `virtio_net_hdr` with `num_buffers` = 1, spread over the chain's header pieces.
fn write_header(chain: &RxChain) {
    let mut header = [0u8; NET_HDR_LEN];
    header[10] = 1;
    let mut at = 0;
    for &(addr, len) in &chain.header[..chain.header_pieces] {
        // SAFETY: each piece is a checked, device-writable range of `len` bytes of the worker's
        // guest memory, which it keeps mapped; the pieces add up to
        // NET_HDR_LEN. The guest may touch it concurrently, hence a volatile slice.
        let piece = unsafe { VolatileSlice::new(addr, len) };
        piece.copy_from(&header[at..at + len]);
        at += len;
    }
}

impl QueueWorker for NetWorker {
    fn poll(&mut self) -> usize {
        if self.broken {
            return 0;
        }
        let served = self.transmit().and_then(|sent| Ok(sent + self.receive()?));
        self.publish();
        match served {
            Ok(n) => n,
            Err(e) => {
                self.broken = true;
                self.signals.queue_broken(e);
                0
            }
        }
    }

    fn set_polling(&mut self, polling: bool) {
        self.polling = polling;
        if !self.broken {
            self.tx.set_notifications(!polling);
            self.rx.set_notifications(!polling);
        }
    }

    fn in_flight(&self) -> usize {
        0
    }

    fn has_pending(&self) -> bool {
        !self.broken && self.tx.has_avail().unwrap_or(true)
    }

    fn backend_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.backend.as_raw_fd())
    }

    /// Only the receive path writes guest memory: the frames and headers it delivers, and both
    /// queues' used rings.
    fn set_dirty_log(&mut self, log: Option<DirtyLog>) -> bool {
        self.rx.set_used_log(log.clone());
        self.tx.set_used_log(log.clone());
        self.dirty = log;
        true
    }
}
