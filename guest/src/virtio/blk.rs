//! virtio-blk (virtio 1.x §5.2) over one virtio-mmio transport and its request queue, or with
//! VIRTIO_BLK_F_MQ several (`Options::queues`): requests go to them in turn, round robin.
//!
//! Every request slot (up to `MAX_IN_FLIGHT`) owns its descriptors (header, data segments,
//! status), a static header, a static status byte and a static data buffer, so submitting is a
//! few stores and completing is a few loads: nothing is allocated or searched. With
//! VIRTIO_F_INDIRECT_DESC a slot's descriptors live in its own static indirect table and the
//! request takes one ring descriptor, so a 256-entry queue holds 256 requests; without it they
//! are a run of ring descriptors, and the ring holds `size / (segments + 2)` requests. A slot
//! has the same descriptors in every queue's table, so any slot may go to any queue.

use core::ptr::addr_of_mut;

use super::interrupts::{Interrupts, UsedRings};
use super::mmio::Transport;
use super::queue::{Descriptor, SplitQueue, DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_WRITE, MAX_QUEUE_SIZE};
pub use super::Completion;
use super::{device_status, phys, DmaStatic, Error, F_EVENT_IDX, F_INDIRECT_DESC, F_VERSION_1};
use crate::deadline::Deadline;

pub const DEVICE_ID: u32 = 2;
pub const T_IN: u32 = 0;
pub const T_OUT: u32 = 1;
pub const T_FLUSH: u32 = 4;
pub const T_GET_ID: u32 = 8;
pub const T_DISCARD: u32 = 11;
pub const T_WRITE_ZEROES: u32 = 13;
/// WRITE_ZEROES may deallocate (the range's flags).
pub const WRITE_ZEROES_FLAG_UNMAP: u32 = 1;
pub const S_OK: u8 = 0;
pub const S_IOERR: u8 = 1;
pub const S_UNSUPP: u8 = 2;
/// What the status byte holds until the device writes it.
pub const STATUS_UNWRITTEN: u8 = 0xff;
pub const SECTOR_SIZE: u64 = 512;
/// GET_ID answers with at most this many bytes.
pub const ID_LEN: u32 = 20;
pub const HEADER_LEN: u32 = 16;
/// Requests in flight at most (and slots): one per descriptor of the largest queue, which
/// requests reach when each takes one ring descriptor (an indirect table).
pub const MAX_IN_FLIGHT: usize = MAX_QUEUE_SIZE as usize;
/// The largest request payload; each slot has a buffer this big.
pub const MAX_REQUEST_BYTES: u32 = 128 * 1024;
/// Data descriptors an indirect table has room for; a request that needs more (a device with
/// a small SIZE_MAX) goes in direct chains.
const INDIRECT_SEGMENTS: usize = 32;
/// Descriptors in each slot's indirect table: header, data segments, status.
const INDIRECT_TABLE_LEN: usize = INDIRECT_SEGMENTS + 2;

const F_SIZE_MAX: u64 = 1 << 1;
const F_SEG_MAX: u64 = 1 << 2;
const F_RO: u64 = 1 << 5;
const F_BLK_SIZE: u64 = 1 << 6;
const F_FLUSH: u64 = 1 << 9;
const F_CONFIG_WCE: u64 = 1 << 11;
const F_DISCARD: u64 = 1 << 13;
const F_WRITE_ZEROES: u64 = 1 << 14;
const F_MQ: u64 = 1 << 12;
const CONFIG_CAPACITY: u64 = 0;
const CONFIG_SIZE_MAX: u64 = 8;
const CONFIG_SEG_MAX: u64 = 12;
const CONFIG_BLK_SIZE: u64 = 20;
const CONFIG_WRITEBACK: u64 = 32;
const CONFIG_NUM_QUEUES: u64 = 34;
const CONFIG_MAX_DISCARD_SECTORS: u64 = 36;
const CONFIG_MAX_WRITE_ZEROES_SECTORS: u64 = 48;
/// The most request queues the driver sets up (`Options::queues`).
pub const MAX_QUEUES: usize = 4;
/// The interrupt vector the device's IOAPIC pin is routed to (exitcost's test device uses 0x40).
const VECTOR: u8 = 0x41;

#[repr(C)]
struct RequestHeader {
    kind: u32,
    reserved: u32,
    sector: u64,
}

#[repr(C, align(4096))]
struct RequestArea {
    headers: [RequestHeader; MAX_IN_FLIGHT],
    status: [u8; MAX_IN_FLIGHT],
}

#[repr(C, align(4096))]
struct DataBuffers([[u8; MAX_REQUEST_BYTES as usize]; MAX_IN_FLIGHT]);

const EMPTY_HEADER: RequestHeader = RequestHeader { kind: 0, reserved: 0, sector: 0 };
static REQUESTS: DmaStatic<RequestArea> =
    DmaStatic::new(RequestArea { headers: [EMPTY_HEADER; MAX_IN_FLIGHT], status: [0; MAX_IN_FLIGHT] });
static DATA: DmaStatic<DataBuffers> =
    DmaStatic::new(DataBuffers([[0; MAX_REQUEST_BYTES as usize]; MAX_IN_FLIGHT]));

/// One indirect descriptor table per slot.
#[repr(C, align(4096))]
struct IndirectTables([[Descriptor; INDIRECT_TABLE_LEN]; MAX_IN_FLIGHT]);

static INDIRECT_TABLES: DmaStatic<IndirectTables> =
    DmaStatic::new(IndirectTables([[Descriptor::EMPTY; INDIRECT_TABLE_LEN]; MAX_IN_FLIGHT]));

#[derive(Clone, Copy, Debug)]
pub struct Options {
    pub completion: Completion,
    /// Accept VIRTIO_F_EVENT_IDX when offered.
    pub event_idx: bool,
    /// Accept VIRTIO_F_INDIRECT_DESC when offered and put each request in an indirect table.
    pub indirect: bool,
    /// The largest request payload the caller will submit.
    pub max_request_bytes: u32,
    /// Requests in flight at most (1..=MAX_IN_FLIGHT).
    pub queue_depth: usize,
    /// Give the request queue at most this many descriptors (rounded down to a power of two),
    /// fewer than the device allows: QEMU gives Linux 128 on a vhost-user-blk device.
    pub queue_size: Option<u16>,
    /// Request queues to use (1..=MAX_QUEUES; above 1 the device must offer VIRTIO_BLK_F_MQ
    /// and as many queues).
    pub queues: usize,
}

/// The disk as the device describes it.
#[derive(Clone, Copy, Debug, Default)]
pub struct DiskInfo {
    pub capacity_sectors: u64,
    pub read_only: bool,
    pub flush: bool,
    pub event_idx: bool,
    /// Requests go in indirect tables (VIRTIO_F_INDIRECT_DESC negotiated, and a request fits
    /// a slot's table).
    pub indirect: bool,
    /// Logical block size (BLK_SIZE), 512 when not offered.
    pub blk_size: u32,
    /// Data descriptors one request may have (SEG_MAX), `u32::MAX` when not offered.
    pub seg_max: u32,
    /// Sectors one DISCARD range may cover (max_discard_sectors); 0: DISCARD not offered.
    pub max_discard_sectors: u32,
    /// Sectors one WRITE_ZEROES range may cover; 0: WRITE_ZEROES not offered.
    pub max_write_zeroes_sectors: u32,
    /// The cache mode (`writeback`: 1 write back, 0 write through), if the driver may switch it
    /// (VIRTIO_BLK_F_CONFIG_WCE).
    pub writeback: Option<u8>,
}

impl DiskInfo {
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_sectors.saturating_mul(SECTOR_SIZE)
    }
}

/// Interrupts and notifications, for exit accounting, and completions by queue.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    pub notifies: u64,
    pub interrupts: u64,
    /// Requests the device completed, by queue.
    pub per_queue: [u64; MAX_QUEUES],
}

/// A set of slots (below `MAX_IN_FLIGHT`), one bit each.
#[derive(Clone, Copy)]
struct SlotSet([u64; MAX_IN_FLIGHT / 64]);

impl SlotSet {
    const EMPTY: SlotSet = SlotSet([0; MAX_IN_FLIGHT / 64]);

    fn contains(&self, slot: usize) -> bool {
        slot < MAX_IN_FLIGHT && self.0[slot / 64] & (1 << (slot % 64)) != 0
    }

    fn insert(&mut self, slot: usize) {
        self.0[slot / 64] |= 1 << (slot % 64);
    }

    /// Take `slot` out; false if it was not in.
    fn remove(&mut self, slot: usize) -> bool {
        let was_in = self.contains(slot);
        if was_in {
            self.0[slot / 64] &= !(1 << (slot % 64));
        }
        was_in
    }

    fn len(&self) -> u32 {
        self.0.iter().map(|word| word.count_ones()).sum()
    }
}

pub struct BlockDevice {
    transport: Transport,
    /// The request queues: the first `options.queues` (claimed at open), the rest `None`.
    queues: [Option<SplitQueue>; MAX_QUEUES],
    /// The queue the next request goes to.
    next_queue: usize,
    /// Queues with requests pushed since the last kick, one bit each.
    pushed: u32,
    /// The queue each slot in flight is on.
    queue_of: [u8; MAX_IN_FLIGHT],
    options: Options,
    pub disk: DiskInfo,
    pub counters: Counters,
    /// Ring descriptors per slot: 1 (an indirect table) or the request's header, data segments
    /// and status.
    descs_per_slot: u16,
    /// Bytes per data descriptor at most (SIZE_MAX).
    segment_bytes: u32,
    /// The slots with the device.
    in_flight: SlotSet,
    interrupts: Interrupts,
}

impl BlockDevice {
    /// Initialise the virtio-blk device behind `transport` (§3.1.1) for requests up to
    /// `options.max_request_bytes` at up to `options.queue_depth` in flight.
    pub fn open(transport: Transport, options: Options, deadline: Deadline) -> Result<BlockDevice, Error> {
        transport.expect_device(DEVICE_ID)?;
        let interrupts = Interrupts::new(&transport, options.completion)?;
        let mut queues = [const { None }; MAX_QUEUES];
        for queue in queues.iter_mut().take(options.queues.clamp(1, MAX_QUEUES)) {
            *queue = Some(SplitQueue::claim(MAX_QUEUE_SIZE, false)?);
        }
        let mut device = BlockDevice {
            transport,
            queues,
            next_queue: 0,
            pushed: 0,
            queue_of: [0; MAX_IN_FLIGHT],
            options,
            disk: DiskInfo::default(),
            counters: Counters::default(),
            descs_per_slot: 0,
            segment_bytes: 0,
            in_flight: SlotSet::EMPTY,
            interrupts,
        };
        device.start(deadline)?;
        Ok(device)
    }

    /// Reset the device and set it up again from scratch (after DEVICE_NEEDS_RESET).
    pub fn restart(&mut self, deadline: Deadline) -> Result<(), Error> {
        self.start(deadline)
    }

    fn start(&mut self, deadline: Deadline) -> Result<(), Error> {
        let t = self.transport;
        t.reset(deadline)?;
        self.in_flight = SlotSet::EMPTY;
        (self.next_queue, self.pushed) = (0, 0);
        let mut wanted = F_VERSION_1
            | F_RO
            | F_FLUSH
            | F_SEG_MAX
            | F_SIZE_MAX
            | F_BLK_SIZE
            | F_DISCARD
            | F_WRITE_ZEROES
            | F_CONFIG_WCE;
        if self.options.event_idx {
            wanted |= F_EVENT_IDX;
        }
        if self.options.indirect {
            wanted |= F_INDIRECT_DESC;
        }
        if self.queue_count() > 1 {
            wanted |= F_MQ;
        }
        let features = t.negotiate(wanted)?;
        let has = |bit: u64| features & bit != 0;
        let offered = if has(F_MQ) {
            let mut num_queues = [0u8; 2];
            t.config_bytes(CONFIG_NUM_QUEUES, &mut num_queues);
            u16::from_le_bytes(num_queues)
        } else {
            1
        };
        if self.queue_count() > usize::from(offered) {
            return self.fail(Error::TooFewQueues(u32::from(offered)));
        }
        self.disk = DiskInfo {
            capacity_sectors: t.config64(CONFIG_CAPACITY),
            read_only: has(F_RO),
            flush: has(F_FLUSH),
            event_idx: has(F_EVENT_IDX),
            indirect: false,
            blk_size: if has(F_BLK_SIZE) { t.config32(CONFIG_BLK_SIZE) } else { SECTOR_SIZE as u32 },
            seg_max: if has(F_SEG_MAX) { t.config32(CONFIG_SEG_MAX) } else { u32::MAX },
            max_discard_sectors: if has(F_DISCARD) { t.config32(CONFIG_MAX_DISCARD_SECTORS) } else { 0 },
            max_write_zeroes_sectors: if has(F_WRITE_ZEROES) {
                t.config32(CONFIG_MAX_WRITE_ZEROES_SECTORS)
            } else {
                0
            },
            writeback: has(F_CONFIG_WCE).then(|| {
                let mut byte = [0u8];
                t.config_bytes(CONFIG_WRITEBACK, &mut byte);
                byte[0]
            }),
        };
        let size_max = if has(F_SIZE_MAX) { t.config32(CONFIG_SIZE_MAX) } else { 0 };
        let seg_max = self.disk.seg_max;
        self.segment_bytes = match size_max {
            0 => MAX_REQUEST_BYTES,
            n => n.min(MAX_REQUEST_BYTES),
        };
        let mut largest = self.options.queue_size.map_or(u32::MAX, u32::from);
        for index in 0..self.queue_count() {
            largest = largest.min(t.queue_max(index as u32)?);
        }
        let size = SplitQueue::size_for(largest);
        // A FLUSH-only driver (no payload) needs no data descriptor: two per request. A chain
        // is at most the queue size long, in an indirect table too (§2.7.5.3.1).
        let segments = self.options.max_request_bytes.div_ceil(self.segment_bytes);
        let request_descs = segments + 2;
        if segments > seg_max || request_descs > size as u32 {
            return self.fail(Error::TooManySegments);
        }
        self.disk.indirect = has(F_INDIRECT_DESC) && request_descs as usize <= INDIRECT_TABLE_LEN;
        self.descs_per_slot = if self.disk.indirect { 1 } else { request_descs as u16 };
        let deepest = (size as usize / self.descs_per_slot as usize).min(MAX_IN_FLIGHT);
        let depth = self.options.queue_depth;
        if depth == 0 || depth > deepest {
            return self.fail(Error::QueueTooSmall(deepest as u32));
        }
        // Write every buffer the requests will use now, as an application writes the data it
        // stores: an untouched buffer is the host's shared zero page, which the host kernel
        // cannot pin on its fast path, so every write request from it took the slow one.
        let used = self.options.max_request_bytes.min(MAX_REQUEST_BYTES) as usize;
        for slot in 0..depth {
            self.buffer(slot)[..used].fill(0);
        }
        if self.interrupts.enabled() {
            self.interrupts.route(&t, VECTOR);
        }
        for (index, queue) in self.queues.iter_mut().flatten().enumerate() {
            queue.reset(size, self.disk.event_idx);
            let (desc, driver, device) = queue.addresses();
            t.setup_queue(index as u32, size, desc, driver, device);
            if self.interrupts.enabled() {
                queue.request_interrupt();
            }
        }
        t.driver_ok();
        self.interrupts.forget_pending(&t);
        Ok(())
    }

    fn fail<T>(&self, error: Error) -> Result<T, Error> {
        self.transport.write_status(self.transport.status() | device_status::FAILED);
        Err(error)
    }

    /// Switch the cache to write back (`true`) or through, if the device lets the driver
    /// (VIRTIO_BLK_F_CONFIG_WCE); returns the mode the device then reports, `None` without.
    pub fn set_writeback(&mut self, writeback: bool) -> Option<u8> {
        self.disk.writeback?;
        self.transport.config_write8(CONFIG_WRITEBACK, u8::from(writeback));
        let mut byte = [0u8];
        self.transport.config_bytes(CONFIG_WRITEBACK, &mut byte);
        self.disk.writeback = Some(byte[0]);
        self.disk.writeback
    }

    pub fn transport(&self) -> &Transport {
        &self.transport
    }

    /// The first request queue (the only one, unless `Options::queues` asked for more).
    pub fn queue_mut(&mut self) -> &mut SplitQueue {
        self.queue(0)
    }

    /// Request queue `index` (below `queue_count`, claimed at open).
    fn queue(&mut self, index: usize) -> &mut SplitQueue {
        self.queues[index].as_mut().expect("the device's queues are claimed when it is opened")
    }

    /// How many request queues the driver uses.
    pub fn queue_count(&self) -> usize {
        self.options.queues.clamp(1, MAX_QUEUES)
    }

    pub fn queue_depth(&self) -> usize {
        self.options.queue_depth
    }

    fn head(&self, slot: usize) -> u16 {
        slot as u16 * self.descs_per_slot
    }

    /// Physical address of slot `slot`'s request header.
    pub fn header_addr(&self, slot: usize) -> u64 {
        // SAFETY: only an address is computed; `slot` is bounds-checked by the indexing.
        phys(unsafe { addr_of_mut!((*REQUESTS.get()).headers[slot]) })
    }

    /// Physical address of slot `slot`'s status byte.
    pub fn status_addr(&self, slot: usize) -> u64 {
        // SAFETY: as in `header_addr`.
        phys(unsafe { addr_of_mut!((*REQUESTS.get()).status[slot]) })
    }

    /// Physical address of slot `slot`'s data buffer (`MAX_REQUEST_BYTES` long).
    pub fn buffer_addr(&self, slot: usize) -> u64 {
        // SAFETY: as in `header_addr`.
        phys(unsafe { addr_of_mut!((*DATA.get()).0[slot]) })
    }

    /// Slot `slot`'s data buffer. The slot must not be in flight: the device owns it then.
    pub fn buffer(&mut self, slot: usize) -> &mut [u8] {
        debug_assert!(!self.in_flight.contains(slot));
        // SAFETY: the buffer is static; `&mut self` and the slot not being in flight mean
        // neither the device nor other Rust code touches it while the slice lives.
        unsafe {
            core::slice::from_raw_parts_mut(
                addr_of_mut!((*DATA.get()).0[slot]).cast::<u8>(),
                MAX_REQUEST_BYTES as usize,
            )
        }
    }

    /// Write slot `slot`'s header and mark its status byte unwritten.
    pub fn write_header(&mut self, slot: usize, kind: u32, sector: u64) {
        // SAFETY: the slot is not in flight, so the device does not read its header or status.
        unsafe {
            addr_of_mut!((*REQUESTS.get()).headers[slot]).write_volatile(RequestHeader {
                kind,
                reserved: 0,
                sector,
            });
            addr_of_mut!((*REQUESTS.get()).status[slot]).write_volatile(STATUS_UNWRITTEN);
        }
    }

    /// Slot `slot`'s status byte as the device left it.
    pub fn status_byte(&self, slot: usize) -> u8 {
        // SAFETY: a volatile read of a static byte the device may have written.
        unsafe { addr_of_mut!((*REQUESTS.get()).status[slot]).read_volatile() }
    }

    /// Slot `slot`'s indirect table.
    fn indirect_table(slot: usize) -> *mut [Descriptor; INDIRECT_TABLE_LEN] {
        // SAFETY: only an address is computed; `slot` is bounds-checked by the indexing.
        unsafe { addr_of_mut!((*INDIRECT_TABLES.get()).0[slot]) }
    }

    /// Write descriptor `index` of slot `slot`'s request: of its indirect table, or of queue
    /// `queue`'s ring. The slot must not be in flight.
    fn set_request_descriptor(&mut self, queue: usize, slot: usize, index: u16, descriptor: Descriptor) {
        debug_assert!(!self.in_flight.contains(slot));
        if self.disk.indirect {
            let table = Self::indirect_table(slot);
            // SAFETY: the entry lies in the slot's static table (`index` bounds-checked), which
            // the device does not read while the slot is not in flight; volatile because the
            // device reads it by physical address once the request is published.
            unsafe { addr_of_mut!((*table)[index as usize]).write_volatile(descriptor) }
        } else {
            self.queue(queue).set_descriptor(index, descriptor);
        }
    }

    /// Queue request `kind` at `sector` for `len` bytes of slot `slot`'s buffer (0 for FLUSH),
    /// on the next queue in turn. The device sees it after `kick`.
    pub fn submit(&mut self, slot: usize, kind: u32, sector: u64, len: u32) {
        debug_assert!(slot < self.options.queue_depth && !self.in_flight.contains(slot));
        debug_assert!(len <= self.options.max_request_bytes);
        let queue = self.next_queue;
        self.next_queue = (queue + 1) % self.queue_count();
        self.write_header(slot, kind, sector);
        let head = self.head(slot);
        let data_flags = if matches!(kind, T_IN | T_GET_ID) { DESC_F_WRITE } else { 0 };
        // `next` counts within the table the chain is in: the slot's own, or the ring's.
        let first = if self.disk.indirect { 0 } else { head };
        let mut index = first;
        let header =
            Descriptor { addr: self.header_addr(slot), len: HEADER_LEN, flags: DESC_F_NEXT, next: index + 1 };
        self.set_request_descriptor(queue, slot, index, header);
        let buffer = self.buffer_addr(slot);
        let mut offset = 0;
        while offset < len {
            index += 1;
            let chunk = (len - offset).min(self.segment_bytes);
            let data = Descriptor {
                addr: buffer + offset as u64,
                len: chunk,
                flags: DESC_F_NEXT | data_flags,
                next: index + 1,
            };
            self.set_request_descriptor(queue, slot, index, data);
            offset += chunk;
        }
        index += 1;
        let status = Descriptor { addr: self.status_addr(slot), len: 1, flags: DESC_F_WRITE, next: 0 };
        self.set_request_descriptor(queue, slot, index, status);
        if self.disk.indirect {
            let descriptors = u32::from(index - first) + 1;
            let table = Descriptor {
                addr: phys(Self::indirect_table(slot)),
                len: descriptors * core::mem::size_of::<Descriptor>() as u32,
                flags: DESC_F_INDIRECT,
                next: 0,
            };
            self.queue(queue).set_descriptor(head, table);
        }
        self.queue(queue).push(head);
        self.queue_of[slot] = queue as u8;
        self.pushed |= 1 << queue;
        self.in_flight.insert(slot);
    }

    /// Publish submitted requests and notify each queue that got some if it asked to be.
    pub fn kick(&mut self) {
        for queue in 0..self.queue_count() {
            if self.pushed & 1 << queue != 0 && self.queue(queue).publish() {
                self.notify_queue(queue);
            }
        }
        self.pushed = 0;
    }

    /// Notify the device of the first queue, whatever it asked.
    pub fn notify(&mut self) {
        self.notify_queue(0);
    }

    fn notify_queue(&mut self, queue: usize) {
        self.counters.notifies += 1;
        self.transport.notify(queue as u32);
    }

    /// Hand every completed request to `done(slot, status)`; returns how many there were.
    pub fn reap(&mut self, mut done: impl FnMut(usize, u8)) -> Result<usize, Error> {
        let mut count = 0;
        for queue in 0..self.queue_count() {
            while let Some((id, _written)) = self.queue(queue).pop_used() {
                let slot = id as usize / self.descs_per_slot.max(1) as usize;
                let aligned = id.is_multiple_of(self.descs_per_slot as u32);
                // The slot must be in flight on this very queue.
                let on_queue = self.in_flight.contains(slot) && usize::from(self.queue_of[slot]) == queue;
                if !aligned || !on_queue {
                    return Err(Error::BadUsedId(id));
                }
                self.in_flight.remove(slot);
                done(slot, self.status_byte(slot));
                self.counters.per_queue[queue] += 1;
                count += 1;
            }
        }
        Ok(count)
    }

    /// Wait for at least one completion (by polling or by interrupt), then reap as `reap`.
    pub fn wait(&mut self, deadline: Deadline, done: impl FnMut(usize, u8)) -> Result<usize, Error> {
        let counted = &mut self.counters.interrupts;
        let queues = &mut self.queues[..];
        if !self.interrupts.wait_for_used(&self.transport, queues, counted, deadline) {
            return Err(self.transport.stall_error());
        }
        let count = self.reap(done)?;
        if self.interrupts.enabled() {
            // Interrupt-driven, as Linux's driver is: every completion raises an interrupt, so
            // keep asking for the next one (EVENT_IDX's used_event).
            self.queues[..].request_interrupt();
        }
        Ok(count)
    }

    /// Requests still with the device.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.len()
    }
}

impl Drop for BlockDevice {
    fn drop(&mut self) {
        // Stop the device before its queue memory is released; a device that does not finish
        // its reset in time is left as it is.
        let _ = self.transport.reset(Deadline::after_ms(0, 100));
    }
}
