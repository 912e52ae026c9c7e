//! The virtio-mmio transport with a block device on a RAM disk behind it, in trap mode (the
//! transport serves the queue on QueueNotify): register reads and writes of any offset, width
//! and value, interleaved with the driver's set-up sequence (so queues get activated and reset
//! again), requests and notifications. The magic value always reads right, a reset always
//! clears the device, and while the device runs every request made available before a
//! notification is answered by it.
#![no_main]

use arbitrary::{Result, Unstructured};
use exitless_fuzz::{guest_memory, queue_config, ram_disk, DriverRing, MAX_STEPS};
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;
use virtio::block::Block;
use virtio::mmio::{status, MmioTransport, Runner, QUEUE_NOTIFY};
use virtio::{DeviceStats, VIRTIO_F_EVENT_IDX, VIRTIO_F_VERSION_1};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const MAGIC_VALUE: u64 = 0x000;
const DEVICE_FEATURES: u64 = 0x010;
const DEVICE_FEATURES_SEL: u64 = 0x014;
const DRIVER_FEATURES: u64 = 0x020;
const DRIVER_FEATURES_SEL: u64 = 0x024;
const QUEUE_SEL: u64 = 0x030;
const QUEUE_NUM: u64 = 0x038;
const QUEUE_READY: u64 = 0x044;
const INTERRUPT_STATUS: u64 = 0x060;
const STATUS: u64 = 0x070;
const QUEUE_DESC_LOW: u64 = 0x080;
const QUEUE_DRIVER_LOW: u64 = 0x090;
const QUEUE_DEVICE_LOW: u64 = 0x0a0;
/// Every register of layout version 2, and the first configuration bytes.
const REGISTERS: [u64; 27] = [
    0x000, 0x004, 0x008, 0x00c, 0x010, 0x014, 0x020, 0x024, 0x030, 0x034, 0x038, 0x044, 0x050, 0x060, 0x064,
    0x070, 0x080, 0x084, 0x090, 0x094, 0x0a0, 0x0a4, 0x0fc, 0x100, 0x108, 0x114, 0x122,
];
const MAGIC: u32 = 0x7472_6976;

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});

struct Driver {
    transport: MmioTransport,
    mem: GuestMemoryMmap,
}

impl Driver {
    fn read(&self, offset: u64) -> u32 {
        let mut data = [0u8; 4];
        self.transport.read(offset, &mut data);
        u32::from_le_bytes(data)
    }

    fn write(&mut self, offset: u64, value: u32) {
        self.transport.write(offset, &value.to_le_bytes());
    }

    /// §3.1.1 for queue 0 at `ring`, with fuzzed features (mostly acceptable ones).
    fn set_up(&mut self, u: &mut Unstructured, ring: &DriverRing) -> Result<()> {
        self.write(STATUS, 0);
        self.write(STATUS, status::ACKNOWLEDGE);
        self.write(STATUS, status::ACKNOWLEDGE | status::DRIVER);
        let features: u64 = match u.int_in_range(0..=3)? {
            0 => u.arbitrary()?,
            1 => 1 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_F_EVENT_IDX,
            _ => 1 << VIRTIO_F_VERSION_1,
        };
        for (select, half) in [(0, features as u32), (1, (features >> 32) as u32)] {
            self.write(DEVICE_FEATURES_SEL, select);
            let _ = self.read(DEVICE_FEATURES);
            self.write(DRIVER_FEATURES_SEL, select);
            self.write(DRIVER_FEATURES, half);
        }
        self.write(STATUS, status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK);
        self.write(QUEUE_SEL, 0);
        self.write(QUEUE_NUM, u32::from(ring.config.size));
        for (low, value) in [
            (QUEUE_DESC_LOW, ring.config.desc),
            (QUEUE_DRIVER_LOW, ring.config.avail),
            (QUEUE_DEVICE_LOW, ring.config.used),
        ] {
            self.write(low, value as u32);
            self.write(low + 4, (value >> 32) as u32);
        }
        ring.clear_used_idx(&self.mem);
        self.write(QUEUE_READY, 1);
        self.write(STATUS, status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK);
        Ok(())
    }

    /// Is the device running its worker (DRIVER_OK, not NEEDS_RESET)?
    fn running(&self) -> bool {
        self.read(STATUS) & (status::DRIVER_OK | status::NEEDS_RESET) == status::DRIVER_OK
    }

    fn avail_idx(&self, ring: &DriverRing) -> Option<u16> {
        self.mem.read_obj(GuestAddress(ring.config.avail.wrapping_add(2))).ok()
    }
}

/// Notify queue 0; while the device runs the queue at `ring`, every request made available
/// must be answered by then.
fn notify(driver: &mut Driver, ring: &DriverRing, known_setup: bool, next_avail: &mut u16) {
    let avail_before = driver.avail_idx(ring);
    driver.write(QUEUE_NOTIFY, 0);
    let avail = driver.avail_idx(ring);
    *next_avail = avail.unwrap_or(0);
    // A request may have the device write its status or data over the avail index (the
    // guest's choice): the index then says nothing about what was published.
    if known_setup && ring.laid_out && avail == avail_before && driver.running() {
        assert_eq!(ring.used_idx(&driver.mem), avail, "a notification left requests unanswered");
    }
}

fn run(u: &mut Unstructured) -> Result<()> {
    let mem = guest_memory();
    let block = Block::new(Box::new(ram_disk(u.ratio(1, 8)?)), "exitless-fuzz-mmio");
    let stats = Arc::new(DeviceStats::new("virtio-blk fuzz"));
    let transport = MmioTransport::new(Box::new(block), mem.clone(), Runner::OnNotify, None, stats);
    let mut driver = Driver { transport, mem };
    let (config, laid_out) = queue_config(u, 0)?;
    let mut ring = DriverRing::new(config, laid_out);
    // Queue 0 is `ring`, as set up by `set_up` with no register write since.
    let mut known_setup = false;
    // The avail index the running worker takes the next request from: 0 when it starts, the
    // avail index after each notification (it takes all there is).
    let mut next_avail = 0u16;
    for _ in 0..MAX_STEPS {
        if u.is_empty() {
            break;
        }
        let was_running = driver.running();
        match u.int_in_range(0..=11)? {
            0 | 1 => {
                let offset = if u.ratio(1, 4)? { u.int_in_range(0..=0x1ff)? } else { *u.choose(&REGISTERS)? };
                let width = *u.choose(&[4usize, 4, 4, 1, 2, 8])?;
                let mut bytes = [0u8; 8];
                u.fill_buffer(&mut bytes[..width])?;
                if offset == QUEUE_NOTIFY && width == 4 {
                    notify(&mut driver, &ring, known_setup, &mut next_avail);
                    continue;
                }
                driver.transport.write(offset, &bytes[..width]);
                known_setup = false;
            }
            2 => {
                let offset = if u.ratio(1, 4)? { u.int_in_range(0..=0x1ff)? } else { *u.choose(&REGISTERS)? };
                let mut bytes = [0u8; 8];
                let width = *u.choose(&[4usize, 1, 2, 8])?;
                driver.transport.read(offset, &mut bytes[..width]);
            }
            3 => {
                let (config, laid_out) = queue_config(u, 0)?;
                ring = DriverRing::new(config, laid_out);
                driver.set_up(u, &ring)?;
                known_setup = true;
                next_avail = 0;
            }
            4..=6 => ring.blk_request(u, &driver.mem)?,
            7 => ring.driver_step(u, &driver.mem)?,
            8 | 9 => notify(&mut driver, &ring, known_setup, &mut next_avail),
            _ => {
                driver.write(STATUS, 0);
                known_setup = false;
                assert_eq!(driver.read(STATUS), 0, "status after a reset");
                assert_eq!(driver.read(QUEUE_READY), 0, "queue ready after a reset");
                assert_eq!(driver.read(INTERRUPT_STATUS), 0, "interrupt status after a reset");
            }
        }
        // A worker started by register writes (or a set-up) starts at avail index 0.
        if !was_running && driver.running() {
            next_avail = 0;
        }
        assert_eq!(driver.read(MAGIC_VALUE), MAGIC);
    }
    driver.transport.shutdown();
    Ok(())
}
