//! virtio-net (virtio 1.x §5.1) over one virtio-mmio transport: queue 0 is the receiveq,
//! queue 1 the transmitq; no control queue, no multiqueue.
//!
//! Features: VIRTIO_F_VERSION_1 (required), VIRTIO_NET_F_MAC (the MAC address is read from
//! configuration offset 0; without it the probe uses [`DEFAULT_MAC`]) and VIRTIO_F_EVENT_IDX
//! when offered and wanted. Nothing else: no VIRTIO_NET_F_MRG_RXBUF, no checksum or
//! segmentation offloads, no VIRTIO_NET_F_STATUS, no control queue.
//!
//! Receive buffers have one fixed layout. Each is one device-writable descriptor of
//! [`RX_BUFFER_LEN`] = 1526 bytes: the 12-byte `virtio_net_hdr` of VERSION_1 (flags,
//! gso_type, hdr_len, gso_size, csum_start, csum_offset, num_buffers; num_buffers is present
//! although MRG_RXBUF is not negotiated, is 1 from a conforming device, and is not relied
//! on: QEMU's tap path leaves it as the buffer held it) followed by room for one
//! Ethernet frame of up to [`MAX_FRAME`] = 1514 bytes (a 1500-byte MTU plus the 14-byte
//! Ethernet header, no FCS). That is the §5.1.6.3.1 minimum for a driver without MRG_RXBUF and
//! without GUEST_TSO/UFO. The driver reads only what the used ring says the device wrote;
//! a completion shorter than the header plus an Ethernet header, or longer than the buffer,
//! is dropped and counted (`rx_dropped`). Receive buffers stay posted: each one is handed
//! back to the device as soon as its frame has been looked at.
//!
//! Transmit buffers are the same size: one device-readable descriptor holding an all-zero
//! header (no offloads) and the frame. Completion is polled (interrupts suppressed with
//! VRING_AVAIL_F_NO_INTERRUPT, or `used_event` kept far ahead under EVENT_IDX) or, for the
//! receive queue only, by interrupt (the transport's IOAPIC pin, the counting ring-0 handler,
//! InterruptStatus/InterruptACK), as in the block driver. The transmit queue's used ring is
//! always polled. Notifications go out only when the device asks for them (EVENT_IDX's
//! `avail_event`, or VRING_USED_F_NO_NOTIFY clear).

use core::ptr::addr_of_mut;

use super::interrupts::Interrupts;
use super::mmio::Transport;
use super::queue::{Descriptor, SplitQueue, DESC_F_WRITE, MAX_QUEUE_SIZE};
use super::{phys, Completion, DmaStatic, Error, F_EVENT_IDX, F_VERSION_1};
use crate::deadline::{Deadline, Spinner};

pub const DEVICE_ID: u32 = 1;
/// VIRTIO_NET_F_MAC: the device has a MAC address in its configuration space.
pub const F_MAC: u64 = 1 << 5;
/// `struct virtio_net_hdr` with VERSION_1 (num_buffers included).
pub const HDR_LEN: usize = 12;
/// The largest Ethernet frame (without FCS) a buffer holds: 1500 bytes of MTU plus 14.
pub const MAX_FRAME: usize = 1514;
/// Bytes of one receive (and transmit) buffer: header and frame.
pub const RX_BUFFER_LEN: usize = HDR_LEN + MAX_FRAME;
/// The shortest frame worth looking at: an Ethernet header.
pub const MIN_FRAME: usize = 14;
/// Receive buffers posted at most (fewer when the queue is smaller).
pub const RX_SLOTS: usize = 128;
/// Transmit buffers (fewer when the queue is smaller).
pub const TX_SLOTS: usize = 32;
/// The MAC address used when the device offers none (locally administered, unicast).
pub const DEFAULT_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x02];
pub const RX_QUEUE: u32 = 0;
pub const TX_QUEUE: u32 = 1;

/// Buffers start this far apart (page-friendly, and a buffer never crosses a 4 KiB page).
const BUFFER_STRIDE: usize = 2048;
const CONFIG_MAC: u64 = 0;
/// The interrupt vector the device's IOAPIC pin is routed to (exitcost uses 0x40, blk 0x41).
const VECTOR: u8 = 0x42;

const _: () = assert!(RX_BUFFER_LEN <= BUFFER_STRIDE && 4096 % BUFFER_STRIDE == 0);
const _: () = assert!(RX_SLOTS <= 128 && TX_SLOTS <= 32 && RX_SLOTS <= MAX_QUEUE_SIZE as usize);

#[repr(C, align(4096))]
struct Buffers<const N: usize>([[u8; BUFFER_STRIDE]; N]);

static RX_BUFFERS: DmaStatic<Buffers<RX_SLOTS>> = DmaStatic::new(Buffers([[0; BUFFER_STRIDE]; RX_SLOTS]));
static TX_BUFFERS: DmaStatic<Buffers<TX_SLOTS>> = DmaStatic::new(Buffers([[0; BUFFER_STRIDE]; TX_SLOTS]));

#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// How receive completions are noticed.
    pub completion: Completion,
    /// Accept VIRTIO_F_EVENT_IDX when offered.
    pub event_idx: bool,
}

/// Notifications, interrupts and what the driver threw away.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    pub notifies: u64,
    pub interrupts: u64,
    pub rx_frames: u64,
    pub tx_frames: u64,
    /// Receive completions with an impossible length (shorter than header and Ethernet header,
    /// or longer than the buffer), handed back unread.
    pub rx_dropped: u64,
}

/// One received frame: which buffer, and how many bytes the device wrote there (header
/// included). Hand it back with [`NetDevice::rx_repost`].
#[derive(Clone, Copy, Debug)]
pub struct Rx {
    slot: usize,
    len: usize,
}

pub struct NetDevice {
    transport: Transport,
    rx: SplitQueue,
    tx: SplitQueue,
    options: Options,
    pub mac: [u8; 6],
    /// Whether the device offered VIRTIO_NET_F_MAC (else `mac` is [`DEFAULT_MAC`]).
    pub device_mac: bool,
    /// Whether EVENT_IDX was negotiated.
    pub event_idx: bool,
    pub counters: Counters,
    /// Receive buffers in use (posted or being looked at), at most `RX_SLOTS`.
    rx_slots: usize,
    /// Bit `s` set while receive buffer `s` is with the device.
    rx_posted: u128,
    /// Transmit buffers in use, at most `TX_SLOTS`.
    tx_slots: usize,
    /// Bit `s` set while transmit buffer `s` is with the device.
    tx_busy: u32,
    interrupts: Interrupts,
}

impl NetDevice {
    /// Initialise the virtio-net device behind `transport` (§3.1.1, §5.1.5) and post its
    /// receive buffers.
    pub fn open(transport: Transport, options: Options, deadline: Deadline) -> Result<NetDevice, Error> {
        transport.expect_device(DEVICE_ID)?;
        let interrupts = Interrupts::new(&transport, options.completion)?;
        let rx = SplitQueue::claim(MAX_QUEUE_SIZE, false)?;
        let tx = SplitQueue::claim(MAX_QUEUE_SIZE, false)?;
        let mut device = NetDevice {
            transport,
            rx,
            tx,
            options,
            mac: DEFAULT_MAC,
            device_mac: false,
            event_idx: false,
            counters: Counters::default(),
            rx_slots: 0,
            rx_posted: 0,
            tx_slots: 0,
            tx_busy: 0,
            interrupts,
        };
        device.start(deadline)?;
        Ok(device)
    }

    /// Reset the device and set it up again from scratch (after DEVICE_NEEDS_RESET or a
    /// queue the driver gave up on). Buffers with the device are forgotten.
    pub fn restart(&mut self, deadline: Deadline) -> Result<(), Error> {
        self.start(deadline)
    }

    fn start(&mut self, deadline: Deadline) -> Result<(), Error> {
        let t = self.transport;
        t.reset(deadline)?;
        self.rx_posted = 0;
        self.tx_busy = 0;
        let mut wanted = F_VERSION_1 | F_MAC;
        if self.options.event_idx {
            wanted |= F_EVENT_IDX;
        }
        let features = t.negotiate(wanted)?;
        self.event_idx = features & F_EVENT_IDX != 0;
        self.device_mac = features & F_MAC != 0;
        self.mac = DEFAULT_MAC;
        if self.device_mac {
            t.config_bytes(CONFIG_MAC, &mut self.mac);
        }
        let rx_size = SplitQueue::size_for(t.queue_max(RX_QUEUE)?);
        let tx_size = SplitQueue::size_for(t.queue_max(TX_QUEUE)?);
        self.rx_slots = RX_SLOTS.min(rx_size as usize);
        self.tx_slots = TX_SLOTS.min(tx_size as usize);
        let event_idx = self.event_idx;
        for (index, queue, size) in [(RX_QUEUE, &mut self.rx, rx_size), (TX_QUEUE, &mut self.tx, tx_size)] {
            queue.reset(size, event_idx);
            let (desc, driver, device) = queue.addresses();
            t.setup_queue(index, size, desc, driver, device);
        }
        if self.interrupts.enabled() {
            self.interrupts.route(&t, VECTOR);
        }
        // Touch every buffer now, so that the measured phase takes no first-touch page fault
        // (each one an exit) on buffers the warm-up did not reach.
        // SAFETY: the device is reset and no buffer is posted, so nothing else uses them.
        unsafe {
            RX_BUFFERS.get().write_bytes(0, 1);
            TX_BUFFERS.get().write_bytes(0, 1);
        }
        // Fill the receive queue before DRIVER_OK (§3.1.1 step 7), but notify only after it.
        for slot in 0..self.rx_slots {
            self.rx_push(slot);
        }
        let wants_notify = self.rx.publish();
        t.driver_ok();
        if wants_notify {
            self.notify(RX_QUEUE);
        }
        self.interrupts.forget_pending(&t);
        Ok(())
    }

    pub fn transport(&self) -> &Transport {
        &self.transport
    }

    /// The transmit queue, for drivers that break the rules on purpose (`net-hostile`).
    pub fn tx_queue_mut(&mut self) -> &mut SplitQueue {
        &mut self.tx
    }

    /// Physical address of transmit buffer `slot` (`BUFFER_STRIDE` bytes).
    pub fn tx_buffer_addr(&self, slot: usize) -> u64 {
        // SAFETY: only an address is computed; `slot` is bounds-checked by the indexing.
        phys(unsafe { addr_of_mut!((*TX_BUFFERS.get()).0[slot]) })
    }

    fn rx_buffer_addr(&self, slot: usize) -> u64 {
        // SAFETY: as in `tx_buffer_addr`.
        phys(unsafe { addr_of_mut!((*RX_BUFFERS.get()).0[slot]) })
    }

    /// Transmit buffer `slot`, whole. It must not be with the device.
    pub fn tx_buffer(&mut self, slot: usize) -> &mut [u8; BUFFER_STRIDE] {
        debug_assert!(self.tx_busy & (1 << slot) == 0);
        // SAFETY: the buffer is static; `&mut self` and the slot not being with the device mean
        // nothing else touches it while the reference lives.
        unsafe { &mut *addr_of_mut!((*TX_BUFFERS.get()).0[slot]) }
    }

    /// Notify the device about queue `queue`, whatever it asked.
    pub fn notify(&mut self, queue: u32) {
        self.counters.notifies += 1;
        self.transport.notify(queue);
    }

    /// Give receive buffer `slot` to the device (seen after the next publish).
    fn rx_push(&mut self, slot: usize) {
        debug_assert!(slot < self.rx_slots && self.rx_posted & (1 << slot) == 0);
        let descriptor = Descriptor {
            addr: self.rx_buffer_addr(slot),
            len: RX_BUFFER_LEN as u32,
            flags: DESC_F_WRITE,
            next: 0,
        };
        self.rx.set_descriptor(slot as u16, descriptor);
        self.rx.push(slot as u16);
        self.rx_posted |= 1 << slot;
    }

    /// Publish posted receive buffers; notify if the device asked to be.
    fn rx_publish(&mut self) {
        if self.rx.publish() {
            self.notify(RX_QUEUE);
        }
    }

    /// The next received frame, if the device has used a buffer. Completions with an impossible
    /// length are handed straight back and counted in `rx_dropped`; a used id that names no
    /// posted buffer is an error (the device is broken).
    pub fn rx_pop(&mut self) -> Result<Option<Rx>, Error> {
        while let Some((id, written)) = self.rx.pop_used() {
            let slot = id as usize;
            if slot >= self.rx_slots || self.rx_posted & (1 << slot) == 0 {
                return Err(Error::BadUsedId(id));
            }
            self.rx_posted &= !(1 << slot);
            let len = written as usize;
            if !(HDR_LEN + MIN_FRAME..=RX_BUFFER_LEN).contains(&len) {
                self.counters.rx_dropped += 1;
                self.rx_repost(Rx { slot, len: 0 });
                continue;
            }
            self.counters.rx_frames += 1;
            return Ok(Some(Rx { slot, len }));
        }
        Ok(None)
    }

    /// The Ethernet frame of `rx` (after the virtio-net header).
    pub fn rx_frame(&self, rx: Rx) -> &[u8] {
        debug_assert!(self.rx_posted & (1 << rx.slot) == 0 && rx.len <= RX_BUFFER_LEN);
        // SAFETY: the buffer is static and not with the device (popped, not yet reposted);
        // `rx.len` was checked against the buffer's size in `rx_pop`. The shared borrow of
        // `self` keeps `rx_repost` from handing it back while the slice lives.
        unsafe {
            let buffer = addr_of_mut!((*RX_BUFFERS.get()).0[rx.slot]).cast::<u8>();
            core::slice::from_raw_parts(buffer.add(HDR_LEN), rx.len - HDR_LEN)
        }
    }

    /// Hand `rx`'s buffer back to the device, and publish it.
    pub fn rx_repost(&mut self, rx: Rx) {
        self.rx_push(rx.slot);
        self.rx_publish();
    }

    /// Collect finished transmissions; returns how many there were. A used id that names no
    /// buffer in flight is an error.
    pub fn tx_reap(&mut self) -> Result<usize, Error> {
        let mut count = 0;
        while let Some((id, _)) = self.tx.pop_used() {
            let slot = id as usize;
            if slot >= self.tx_slots || self.tx_busy & (1 << slot) == 0 {
                return Err(Error::BadUsedId(id));
            }
            self.tx_busy &= !(1 << slot);
            count += 1;
        }
        Ok(count)
    }

    /// Send one frame that `build` writes into the buffer it is given (up to [`MAX_FRAME`]
    /// bytes), returning its length. Waits (until `deadline`) for a free transmit buffer.
    pub fn tx_send(
        &mut self,
        deadline: Deadline,
        build: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<(), Error> {
        let slot = loop {
            let free = !self.tx_busy & low_bits(self.tx_slots);
            if free != 0 {
                break free.trailing_zeros() as usize;
            }
            if self.tx_reap()? == 0 {
                self.spin_until(deadline)?;
            }
        };
        let buffer = self.tx_buffer(slot);
        buffer[..HDR_LEN].fill(0);
        let len = build(&mut buffer[HDR_LEN..RX_BUFFER_LEN]).min(MAX_FRAME);
        let descriptor =
            Descriptor { addr: self.tx_buffer_addr(slot), len: (HDR_LEN + len) as u32, flags: 0, next: 0 };
        self.tx.set_descriptor(slot as u16, descriptor);
        self.tx.push(slot as u16);
        self.tx_busy |= 1 << slot;
        self.counters.tx_frames += 1;
        if self.tx.publish() {
            self.notify(TX_QUEUE);
        }
        Ok(())
    }

    /// Wait until the device has returned every transmit buffer.
    pub fn tx_drain(&mut self, deadline: Deadline) -> Result<(), Error> {
        let mut spinner = Spinner::new(deadline);
        loop {
            self.tx_reap()?;
            if self.tx_busy == 0 {
                return Ok(());
            }
            if !spinner.spin() {
                return Err(self.transport.stall_error());
            }
        }
    }

    /// One spin of a wait for the transmit queue, with the deadline checked.
    fn spin_until(&self, deadline: Deadline) -> Result<(), Error> {
        if deadline.passed() {
            return Err(self.transport.stall_error());
        }
        core::hint::spin_loop();
        Ok(())
    }

    /// Wait until the device has used a receive buffer (by polling or by interrupt): `Ok(true)`,
    /// or `Ok(false)` at `deadline`. A device that set DEVICE_NEEDS_RESET is an error then.
    pub fn rx_wait(&mut self, deadline: Deadline) -> Result<bool, Error> {
        let counted = &mut self.counters.interrupts;
        let used = self.interrupts.wait_for_used(&self.transport, &mut self.rx, counted, deadline);
        // A buffer used just as the deadline passed still counts.
        if used || self.rx.has_used() {
            return Ok(true);
        }
        match self.transport.stall_error() {
            Error::NeedsReset => Err(Error::NeedsReset),
            _ => Ok(false),
        }
    }
}

/// A mask of the low `n` bits (`n` up to 32).
fn low_bits(n: usize) -> u32 {
    if n >= 32 {
        u32::MAX
    } else {
        (1u32 << n) - 1
    }
}

impl Drop for NetDevice {
    fn drop(&mut self) {
        // Stop the device before its queue memory and buffers are released; a device that does
        // not finish its reset in time is left as it is.
        let _ = self.transport.reset(Deadline::after_ms(0, 100));
    }
}
