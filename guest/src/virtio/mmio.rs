//! The virtio-mmio transport, register layout version 2 (virtio 1.x §4.2.2), and the
//! `virtio_mmio.device=<size>@<addr>:<irq>` command-line entries that announce transports
//! (the format of Linux, QEMU microvm and Firecracker).
//!
//! QEMU microvm puts those entries on the command line only with `acpi=off`, and its
//! transports use the legacy layout (version 1, not driven here) unless started with
//! `-global virtio-mmio.force-legacy=false`.

use super::{device_status as ds, Error, F_VERSION_1};
use crate::cmdline;
use crate::deadline::Deadline;
use crate::x86::{mmio_read32, mmio_read8, mmio_write32, mmio_write8};

const MAGIC_VALUE: u64 = 0x000;
const VERSION: u64 = 0x004;
const DEVICE_ID: u64 = 0x008;
const DEVICE_FEATURES: u64 = 0x010;
const DEVICE_FEATURES_SEL: u64 = 0x014;
const DRIVER_FEATURES: u64 = 0x020;
const DRIVER_FEATURES_SEL: u64 = 0x024;
const QUEUE_SEL: u64 = 0x030;
const QUEUE_NUM_MAX: u64 = 0x034;
const QUEUE_NUM: u64 = 0x038;
const QUEUE_READY: u64 = 0x044;
const QUEUE_NOTIFY: u64 = 0x050;
const INTERRUPT_STATUS: u64 = 0x060;
const INTERRUPT_ACK: u64 = 0x064;
const STATUS: u64 = 0x070;
const QUEUE_DESC_LOW: u64 = 0x080;
const QUEUE_DRIVER_LOW: u64 = 0x090;
const QUEUE_DEVICE_LOW: u64 = 0x0a0;
const CONFIG_GENERATION: u64 = 0x0fc;
const CONFIG: u64 = 0x100;

const MAGIC: u32 = 0x7472_6976; // "virt"
const PARAM: &str = "virtio_mmio.device";
/// A device that changes its configuration this many times in a row gets its last reading.
const CONFIG_RETRIES: u32 = 100;
/// The probe's identity map ends here; a transport above it cannot be reached.
const MAPPED_LIMIT: u64 = 1 << 32;

/// One virtio-mmio transport from the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transport {
    pub base: u64,
    pub size: u64,
    pub irq: u32,
}

/// Parse `<size>@<addr>:<irq>[:<id>]`. The size takes K/M suffixes or 0x hex; `None` for a
/// malformed entry or one the probe cannot map.
pub fn parse_entry(value: &str) -> Option<Transport> {
    let (size, rest) = value.split_once('@')?;
    let mut parts = rest.split(':');
    let base = cmdline::parse_u64(parts.next()?)?;
    let irq: u32 = parts.next()?.parse().ok()?;
    let size = cmdline::parse_u64(size)?;
    let fits = base.checked_add(size).is_some_and(|end| end <= MAPPED_LIMIT);
    (fits && size > CONFIG && base.is_multiple_of(4)).then_some(Transport { base, size, irq })
}

/// Every `virtio_mmio.device=` entry, in command-line order: `Err(value)` for a malformed one.
pub fn entries(cmdline: &str) -> impl Iterator<Item = Result<Transport, &str>> {
    cmdline
        .split_ascii_whitespace()
        .filter_map(|word| word.split_once('='))
        .filter(|(key, _)| *key == PARAM)
        .map(|(_, value)| parse_entry(value).ok_or(value))
}

impl Transport {
    fn read(&self, register: u64) -> u32 {
        mmio_read32(self.base + register)
    }

    fn write(&self, register: u64, value: u32) {
        mmio_write32(self.base + register, value)
    }

    /// The device ID, after checking the magic value and the register layout version.
    pub fn device_id(&self) -> Result<u32, Error> {
        if self.read(MAGIC_VALUE) != MAGIC {
            return Err(Error::BadMagic);
        }
        match self.read(VERSION) {
            2 => {}
            v => return Err(Error::UnsupportedVersion(v)),
        }
        match self.read(DEVICE_ID) {
            0 => Err(Error::NoDevice),
            id => Ok(id),
        }
    }

    /// `NoDevice` unless the transport holds a device of type `device_id` (checked as by
    /// [`Transport::device_id`]).
    pub fn expect_device(&self, device_id: u32) -> Result<(), Error> {
        match self.device_id()? {
            id if id == device_id => Ok(()),
            _ => Err(Error::NoDevice),
        }
    }

    pub fn status(&self) -> u32 {
        self.read(STATUS)
    }

    /// Why a wait on the device ended without a completion.
    pub fn stall_error(&self) -> Error {
        if self.status() & ds::NEEDS_RESET != 0 {
            Error::NeedsReset
        } else {
            Error::Timeout
        }
    }

    pub fn write_status(&self, value: u32) {
        self.write(STATUS, value);
    }

    fn add_status(&self, bits: u32) {
        self.write(STATUS, self.status() | bits);
    }

    /// Reset the device (write 0 to Status) and wait until it reads back 0.
    pub fn reset(&self, deadline: Deadline) -> Result<(), Error> {
        self.write(STATUS, 0);
        while self.status() != 0 {
            if deadline.passed() {
                return Err(Error::ResetTimeout);
            }
            core::hint::spin_loop();
        }
        Ok(())
    }

    /// All 64 feature bits the device offers.
    pub fn device_features(&self) -> u64 {
        self.write(DEVICE_FEATURES_SEL, 0);
        let low = self.read(DEVICE_FEATURES) as u64;
        self.write(DEVICE_FEATURES_SEL, 1);
        let high = self.read(DEVICE_FEATURES) as u64;
        low | high << 32
    }

    /// Steps 1-6 of device initialisation (§3.1.1) after a reset: ACKNOWLEDGE, DRIVER, accept
    /// the offered subset of `supported`, FEATURES_OK and check that it stuck. Returns the
    /// negotiated features; on failure the device is left with FAILED set.
    pub fn negotiate(&self, supported: u64) -> Result<u64, Error> {
        self.add_status(ds::ACKNOWLEDGE);
        self.add_status(ds::DRIVER);
        let accepted = self.device_features() & supported;
        if accepted & F_VERSION_1 == 0 {
            self.add_status(ds::FAILED);
            return Err(Error::NoVersion1);
        }
        self.write(DRIVER_FEATURES_SEL, 0);
        self.write(DRIVER_FEATURES, accepted as u32);
        self.write(DRIVER_FEATURES_SEL, 1);
        self.write(DRIVER_FEATURES, (accepted >> 32) as u32);
        self.add_status(ds::FEATURES_OK);
        if self.status() & ds::FEATURES_OK == 0 {
            self.add_status(ds::FAILED);
            return Err(Error::FeaturesRejected);
        }
        Ok(accepted)
    }

    /// The largest size queue `index` may have (0: the queue does not exist).
    pub fn queue_max(&self, index: u32) -> Result<u32, Error> {
        self.write(QUEUE_SEL, index);
        if self.read(QUEUE_READY) != 0 {
            return Err(Error::QueueInUse);
        }
        match self.read(QUEUE_NUM_MAX) {
            0 => Err(Error::QueueUnavailable),
            max => Ok(max),
        }
    }

    /// Give queue `index` its size and ring addresses and make it ready.
    pub fn setup_queue(&self, index: u32, size: u16, desc: u64, driver: u64, device: u64) {
        self.write(QUEUE_SEL, index);
        self.write(QUEUE_NUM, size as u32);
        for (register, addr) in
            [(QUEUE_DESC_LOW, desc), (QUEUE_DRIVER_LOW, driver), (QUEUE_DEVICE_LOW, device)]
        {
            self.write(register, addr as u32);
            self.write(register + 4, (addr >> 32) as u32);
        }
        self.write(QUEUE_READY, 1);
    }

    pub fn driver_ok(&self) {
        self.add_status(ds::DRIVER_OK);
    }

    pub fn notify(&self, queue: u32) {
        self.write(QUEUE_NOTIFY, queue);
    }

    /// InterruptStatus, left unacknowledged.
    pub fn interrupt_status(&self) -> u32 {
        self.read(INTERRUPT_STATUS)
    }

    /// Read InterruptStatus and acknowledge those bits (QEMU's line is level-triggered and
    /// stays up until acknowledged). Returns the bits.
    pub fn ack_interrupt(&self) -> u32 {
        let pending = self.read(INTERRUPT_STATUS);
        if pending != 0 {
            self.write(INTERRUPT_ACK, pending);
        }
        pending
    }

    /// A 32-bit field of the device configuration space.
    pub fn config32(&self, offset: u64) -> u32 {
        self.read(CONFIG + offset)
    }

    /// Bytes `offset..offset + out.len()` of the device configuration space, read one byte at a
    /// time (as §4.2.2.2 asks for 8-bit fields such as a MAC address), retried while
    /// ConfigGeneration shows that the device changed them in between (a bounded number of
    /// times).
    pub fn config_bytes(&self, offset: u64, out: &mut [u8]) {
        for _ in 0..CONFIG_RETRIES {
            let generation = self.read(CONFIG_GENERATION);
            for (i, byte) in out.iter_mut().enumerate() {
                *byte = mmio_read8(self.base + CONFIG + offset + i as u64);
            }
            if self.read(CONFIG_GENERATION) == generation {
                break;
            }
        }
    }

    /// Write one byte of the device configuration space (an 8-bit field, such as virtio-blk's
    /// `writeback`).
    pub fn config_write8(&self, offset: u64, value: u8) {
        mmio_write8(self.base + CONFIG + offset, value);
    }

    /// A 64-bit configuration field, read as two halves and retried while ConfigGeneration
    /// shows that the device changed it in between (a bounded number of times).
    pub fn config64(&self, offset: u64) -> u64 {
        let mut value = 0;
        for _ in 0..CONFIG_RETRIES {
            let generation = self.read(CONFIG_GENERATION);
            value = self.config32(offset) as u64 | (self.config32(offset + 4) as u64) << 32;
            if self.read(CONFIG_GENERATION) == generation {
                break;
            }
        }
        value
    }
}
