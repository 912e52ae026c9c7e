//! virtio 1.x drivers for the probe: the virtio-mmio transport, split virtqueues, the block
//! device and the network device. They run in ring 3, poll or take interrupts, and never
//! allocate: every ring and buffer the device touches is static memory, whose physical address
//! is its address (the probe identity-maps the low 4 GiB).

pub mod blk;
pub mod interrupts;
pub mod mmio;
pub mod net;
pub mod queue;

use core::cell::UnsafeCell;

/// Device status bits (virtio 1.x §2.1).
pub mod device_status {
    pub const ACKNOWLEDGE: u32 = 1;
    pub const DRIVER: u32 = 2;
    pub const DRIVER_OK: u32 = 4;
    pub const FEATURES_OK: u32 = 8;
    pub const NEEDS_RESET: u32 = 0x40;
    pub const FAILED: u32 = 0x80;
}

/// Transport feature bits (virtio 1.x §6).
pub const F_INDIRECT_DESC: u64 = 1 << 28;
pub const F_EVENT_IDX: u64 = 1 << 29;
pub const F_VERSION_1: u64 = 1 << 32;

/// How a driver learns that the device used a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// Interrupts suppressed; the driver spins on the used index.
    Poll,
    /// The device interrupts; the driver waits for the interrupt counter, then acknowledges.
    Interrupt,
}

impl Completion {
    pub fn name(self) -> &'static str {
        match self {
            Completion::Poll => "poll",
            Completion::Interrupt => "interrupt",
        }
    }
}

/// Why a device could not be driven; the message goes into the probe's JSON error line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    BadMagic,
    /// Version 1 is the legacy register layout, which the probe does not drive.
    UnsupportedVersion(u32),
    NoDevice,
    NoVersion1,
    FeaturesRejected,
    QueueUnavailable,
    QueueInUse,
    /// The requested queue depth and segment count need more descriptors than the queue has;
    /// the deepest queue that fits.
    QueueTooSmall(u32),
    /// The device limits segments so much that a request of the asked size cannot be built.
    TooManySegments,
    ResetTimeout,
    Timeout,
    NeedsReset,
    /// The device put an id in the used ring that names no request in flight.
    BadUsedId(u32),
    /// Interrupt completion needs the device's line on the IOAPIC the probe programs.
    IrqOutOfRange,
    /// Other queues already hold all of the probe's static ring areas.
    Busy,
    /// The driver asked for more queues than the device offers (how many it offers).
    TooFewQueues(u32),
}

impl Error {
    pub fn message(&self) -> &'static str {
        match self {
            Error::BadMagic => "no virtio-mmio magic value at the transport address",
            Error::UnsupportedVersion(_) => "virtio-mmio version is not 2 (legacy devices are not supported)",
            Error::NoDevice => "the transport has no device (device ID 0)",
            Error::NoVersion1 => "the device does not offer VIRTIO_F_VERSION_1",
            Error::FeaturesRejected => "the device did not accept the features (FEATURES_OK did not stick)",
            Error::QueueUnavailable => "a queue the driver needs is not available (QueueNumMax is 0)",
            Error::QueueInUse => "a queue is already ready before setup",
            Error::QueueTooSmall(_) => {
                "the queue has too few descriptors for this queue depth and block size (detail: the deepest that fits)"
            }
            Error::TooManySegments => "the block size needs more segments than the device's seg_max",
            Error::ResetTimeout => "the device did not finish its reset (Status did not read 0)",
            Error::Timeout => "timed out waiting for a completion",
            Error::NeedsReset => "the device set DEVICE_NEEDS_RESET",
            Error::BadUsedId(_) => "the device returned a used id that is not in flight",
            Error::IrqOutOfRange => "the device's irq is beyond the first IOAPIC's 24 pins",
            Error::Busy => "no free static ring area for the device's queues (too many devices open)",
            Error::TooFewQueues(_) => {
                "the device offers fewer queues than probe.queues asks for (detail: the queues it offers)"
            }
        }
    }
}

/// Static memory shared with a device: the device reads and writes it by physical address,
/// behind the compiler's back, so Rust only ever sees it through raw pointers.
pub struct DmaStatic<T>(UnsafeCell<T>);

// SAFETY: the probe is single-threaded (ring 3; the ring-0 interrupt handlers touch only their
// counters and the PV EOI flag), and all access goes through raw pointers whose users follow
// the device protocol.
unsafe impl<T> Sync for DmaStatic<T> {}

impl<T> DmaStatic<T> {
    pub const fn new(value: T) -> Self {
        DmaStatic(UnsafeCell::new(value))
    }

    pub fn get(&self) -> *mut T {
        self.0.get()
    }
}

/// The physical address of probe memory: the identity map makes it the virtual address.
pub fn phys<T>(ptr: *const T) -> u64 {
    ptr as u64
}
