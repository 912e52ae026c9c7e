//! The transport's register state machine driven as a hostile or a correct driver would,
//! over real guest memory and a real RAM disk in /dev/shm.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use storage::ram::RamDisk;
use virtqueue::queue::{VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::*;
use crate::block::request::{VIRTIO_BLK_S_OK, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT};
use crate::block::Block;

const MEM: usize = 1 << 20;
const DESC: u64 = 0x1000;
const AVAIL: u64 = 0x2000;
const USED: u64 = 0x3000;
const HEADER: u64 = 0x4000;
const STATUS_BYTE: u64 = 0x4100;
const DATA: u64 = 0x5000;
const DISK: u64 = 1 << 20;

struct Rig {
    mem: GuestMemoryMmap,
    transport: MmioTransport,
    avail_idx: u16,
    stats: Arc<DeviceStats>,
    _disk: tempfile::TempPath,
}

fn rig() -> Rig {
    rig_with_queues(1)
}

/// A rig whose disk offers `queues` queues (VIRTIO_BLK_F_MQ above 1).
fn rig_with_queues(queues: usize) -> Rig {
    let stats = Arc::new(DeviceStats::new("virtio-blk 0"));
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
    let (device, path) = disk_with_queues(DISK, queues);
    let transport = MmioTransport::new(Box::new(device), mem.clone(), Runner::OnNotify, None, stats.clone());
    Rig { mem, transport, avail_idx: 0, stats, _disk: path }
}

/// A new RAM disk of `disk` bytes in /dev/shm offering `queues` queues, and its file.
fn disk_with_queues(disk: u64, queues: usize) -> (Block, tempfile::TempPath) {
    let path = tempfile::Builder::new().tempfile_in("/dev/shm").unwrap().into_temp_path();
    drop(RamDisk::create(&path, disk).unwrap());
    let backends = (0..queues)
        .map(|_| Box::new(RamDisk::open(&path, false).unwrap()) as Box<dyn storage::Backend>)
        .collect();
    (Block::with_queues(backends, "mmio-test").unwrap(), path)
}

impl Rig {
    fn read(&self, offset: u64) -> u32 {
        let mut data = [0u8; 4];
        self.transport.read(offset, &mut data);
        u32::from_le_bytes(data)
    }

    fn write(&mut self, offset: u64, value: u32) {
        self.transport.write(offset, &value.to_le_bytes());
    }

    fn features(&mut self) -> u64 {
        self.write(DEVICE_FEATURES_SEL, 0);
        let low = self.read(DEVICE_FEATURES) as u64;
        self.write(DEVICE_FEATURES_SEL, 1);
        low | (self.read(DEVICE_FEATURES) as u64) << 32
    }

    /// The driver's side of §3.1.1 with queue 0 at the given rings.
    fn set_up(&mut self, driver_features: u64, desc: u64) {
        self.write(STATUS, 0);
        self.write(STATUS, status::ACKNOWLEDGE);
        self.write(STATUS, status::ACKNOWLEDGE | status::DRIVER);
        self.write(DRIVER_FEATURES_SEL, 0);
        self.write(DRIVER_FEATURES, driver_features as u32);
        self.write(DRIVER_FEATURES_SEL, 1);
        self.write(DRIVER_FEATURES, (driver_features >> 32) as u32);
        self.write(STATUS, status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK);
        self.write(QUEUE_SEL, 0);
        self.write(QUEUE_NUM, 16);
        for (low, value) in [(QUEUE_DESC_LOW, desc), (QUEUE_DRIVER_LOW, AVAIL), (QUEUE_DEVICE_LOW, USED)] {
            self.write(low, value as u32);
            self.write(low + 4, (value >> 32) as u32);
        }
        self.write(QUEUE_READY, 1);
        let ok = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK;
        self.write(STATUS, ok);
        self.avail_idx = 0;
    }

    /// Give queue `index` 16 entries at `rings` (descriptors, avail, used) and make it ready.
    fn set_up_queue(&mut self, index: u32, (desc, avail, used): (u64, u64, u64)) {
        self.write(QUEUE_SEL, index);
        self.write(QUEUE_NUM, 16);
        for (low, value) in [(QUEUE_DESC_LOW, desc), (QUEUE_DRIVER_LOW, avail), (QUEUE_DEVICE_LOW, used)] {
            self.write(low, value as u32);
            self.write(low + 4, (value >> 32) as u32);
        }
        self.write(QUEUE_READY, 1);
    }

    /// Queue a 4 KiB request on descriptors 0-2 and notify.
    fn request(&mut self, kind: u32, sector: u64) {
        self.mem.write_obj(kind, GuestAddress(HEADER)).unwrap();
        self.mem.write_obj(sector, GuestAddress(HEADER + 8)).unwrap();
        self.mem.write_obj(0xffu8, GuestAddress(STATUS_BYTE)).unwrap();
        let data_flags = if kind == VIRTIO_BLK_T_OUT { 0 } else { VIRTQ_DESC_F_WRITE };
        let descriptors = [
            (HEADER, 16u32, VIRTQ_DESC_F_NEXT),
            (DATA, 4096, data_flags | VIRTQ_DESC_F_NEXT),
            (STATUS_BYTE, 1, VIRTQ_DESC_F_WRITE),
        ];
        write_chain(&self.mem, DESC, &descriptors);
        self.mem.write_obj(0u16, GuestAddress(AVAIL + 4 + 2 * (self.avail_idx % 16) as u64)).unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.mem.write_obj(self.avail_idx, GuestAddress(AVAIL + 2)).unwrap();
        self.write(QUEUE_NOTIFY, 0);
    }

    fn used_idx(&self) -> u16 {
        self.mem.read_obj(GuestAddress(USED + 2)).unwrap()
    }

    fn status_byte(&self) -> u8 {
        self.mem.read_obj(GuestAddress(STATUS_BYTE)).unwrap()
    }
}

/// Write `descriptors` (address, length, flags) as a chain from entry 0 of the table at `desc`.
fn write_chain(mem: &GuestMemoryMmap, desc: u64, descriptors: &[(u64, u32, u16)]) {
    for (i, &(addr, len, flags)) in descriptors.iter().enumerate() {
        let at = desc + 16 * i as u64;
        mem.write_obj(addr, GuestAddress(at)).unwrap();
        mem.write_obj(len, GuestAddress(at + 8)).unwrap();
        mem.write_obj(flags, GuestAddress(at + 12)).unwrap();
        mem.write_obj(i as u16 + 1, GuestAddress(at + 14)).unwrap();
    }
}

const VERSION_1: u64 = 1 << crate::VIRTIO_F_VERSION_1;

#[test]
fn identifies_as_a_modern_block_device_with_its_capacity() {
    let mut rig = rig();
    assert_eq!(rig.read(MAGIC_VALUE), MAGIC);
    assert_eq!(rig.read(VERSION), 2);
    assert_eq!(rig.read(DEVICE_ID), 2);
    assert_ne!(rig.features() & VERSION_1, 0);
    assert_eq!(rig.read(QUEUE_NUM_MAX), 256);
    let mut capacity = [0u8; 8];
    rig.transport.read(CONFIG, &mut capacity);
    assert_eq!(u64::from_le_bytes(capacity), DISK / 512);
}

#[test]
fn serves_a_write_and_a_read_on_notify() {
    let mut rig = rig();
    let features = rig.features();
    rig.set_up(features, DESC);
    assert_eq!(rig.read(STATUS) & status::NEEDS_RESET, 0);
    rig.mem.write_slice(&[0xa5; 4096], GuestAddress(DATA)).unwrap();
    rig.request(VIRTIO_BLK_T_OUT, 16);
    assert_eq!((rig.used_idx(), rig.status_byte()), (1, VIRTIO_BLK_S_OK));
    rig.mem.write_slice(&[0; 4096], GuestAddress(DATA)).unwrap();
    rig.request(VIRTIO_BLK_T_IN, 16);
    assert_eq!((rig.used_idx(), rig.status_byte()), (2, VIRTIO_BLK_S_OK));
    let mut back = [0u8; 4096];
    rig.mem.read_slice(&mut back, GuestAddress(DATA)).unwrap();
    assert!(back.iter().all(|&b| b == 0xa5));
    assert_eq!(rig.read(INTERRUPT_STATUS) & 1, 1, "used-buffer interrupt");
    rig.write(INTERRUPT_ACK, 1);
    assert_eq!(rig.read(INTERRUPT_STATUS), 0);
}

#[test]
fn features_not_offered_or_without_version_1_are_refused() {
    let mut rig = rig();
    rig.set_up(1 << 60, DESC);
    assert_eq!(rig.read(STATUS) & status::FEATURES_OK, 0);
    assert_ne!(rig.read(STATUS) & status::NEEDS_RESET, 0, "DRIVER_OK without FEATURES_OK");
    rig.set_up(0, DESC);
    assert_eq!(rig.read(STATUS) & status::FEATURES_OK, 0, "a legacy driver");
}

#[test]
fn rings_outside_guest_memory_need_a_reset_and_a_reset_recovers() {
    let mut rig = rig();
    let features = rig.features();
    rig.set_up(features, MEM as u64 - 8);
    assert_ne!(rig.read(STATUS) & status::NEEDS_RESET, 0);
    rig.request(VIRTIO_BLK_T_IN, 0);
    assert_eq!(rig.used_idx(), 0, "an inactive device serves nothing");
    rig.set_up(features, DESC);
    assert_eq!(rig.read(STATUS) & status::NEEDS_RESET, 0);
    rig.request(VIRTIO_BLK_T_IN, 0);
    assert_eq!((rig.used_idx(), rig.status_byte()), (1, VIRTIO_BLK_S_OK));
}

#[test]
fn a_broken_queue_sets_needs_reset_with_a_config_interrupt() {
    let mut rig = rig();
    let features = rig.features();
    rig.set_up(features, DESC);
    rig.mem.write_obj(1000u16, GuestAddress(AVAIL + 2)).unwrap();
    rig.write(QUEUE_NOTIFY, 0);
    assert_ne!(rig.read(STATUS) & status::NEEDS_RESET, 0);
    assert_eq!(rig.read(INTERRUPT_STATUS) & 2, 2, "configuration-change interrupt");
    let stats = rig.stats.snapshot();
    assert_eq!(stats.needs_reset, 1, "counted for the operator");
    assert_eq!(
        stats.first_reset_reason.as_deref(),
        Some("the avail index moved by 1000, more than the queue size")
    );
    rig.set_up(features, DESC);
    rig.request(VIRTIO_BLK_T_IN, 0);
    assert_eq!((rig.used_idx(), rig.status_byte()), (1, VIRTIO_BLK_S_OK));
    assert_eq!(rig.stats.snapshot().requests.completed, 1, "counts survive the reset");
}

#[test]
fn odd_accesses_are_ignored() {
    let mut rig = rig();
    let mut wide = [0xffu8; 8];
    rig.transport.read(MAGIC_VALUE, &mut wide);
    assert_eq!(wide, [0; 8], "registers take 32-bit accesses only");
    let mut byte = [0xffu8; 1];
    rig.transport.read(MAGIC_VALUE + 1, &mut byte);
    assert_eq!(byte, [0]);
    rig.transport.write(STATUS, &[1, 0]);
    assert_eq!(rig.read(STATUS), 0);
    assert_eq!(rig.read(0x0f0), 0, "an unknown register");
    let mut beyond = [0xffu8; 4];
    rig.transport.read(CONFIG + 0xe00, &mut beyond);
    assert_eq!(beyond, [0; 4]);
    rig.write(QUEUE_SEL, 7);
    assert_eq!(rig.read(QUEUE_NUM_MAX), 0, "no queue 7");
    rig.write(QUEUE_NUM, 64);
    rig.write(QUEUE_READY, 1);
    // A queue-size write after DRIVER_OK does not move the running queue.
    let features = rig.features();
    rig.set_up(features, DESC);
    rig.write(QUEUE_SEL, 0);
    rig.write(QUEUE_NUM, 0);
    rig.request(VIRTIO_BLK_T_IN, 0);
    assert_eq!(rig.used_idx(), 1);
    assert_eq!(rig.transport.interrupt_status.load(Ordering::Acquire) & 1, 1);
}

#[test]
fn configuration_writes_reach_the_device_which_takes_only_what_it_offers() {
    let mut rig = rig();
    let mut byte = [0xffu8];
    // This device offers no writeback switch: the byte stays the device's (write back).
    rig.transport.write(CONFIG + 32, &[0]);
    rig.transport.read(CONFIG + 32, &mut byte);
    assert_eq!(byte, [1]);
    // One that offers it takes the driver's byte write, and only that.
    let stats = Arc::new(DeviceStats::new("virtio-blk 1"));
    let path = tempfile::Builder::new().tempfile_in("/dev/shm").unwrap().into_temp_path();
    let device = Block::new(Box::new(RamDisk::create(&path, DISK).unwrap()), "wce").with_writeback_switch();
    let mut transport = MmioTransport::new(Box::new(device), rig.mem.clone(), Runner::OnNotify, None, stats);
    transport.write(CONFIG + 32, &[0, 0, 0, 0]);
    transport.read(CONFIG + 32, &mut byte);
    assert_eq!(byte, [1], "a 4-byte write over writeback and its neighbours is ignored");
    transport.write(CONFIG + 32, &[0]);
    transport.read(CONFIG + 32, &mut byte);
    assert_eq!(byte, [0], "write through");
    let mut capacity = [0u8; 8];
    transport.write(CONFIG, &[0xff; 8]);
    transport.read(CONFIG, &mut capacity);
    assert_eq!(u64::from_le_bytes(capacity), DISK / 512, "the capacity is not the driver's");
}

/// A second transport over `rig`'s guest memory, on a disk of `disk` bytes: a restore's target.
fn restore_target(rig: &Rig, disk: u64) -> (MmioTransport, tempfile::TempPath) {
    restore_target_with_queues(rig, disk, 1)
}

/// The same with `queues` queues.
fn restore_target_with_queues(rig: &Rig, disk: u64, queues: usize) -> (MmioTransport, tempfile::TempPath) {
    let (device, path) = disk_with_queues(disk, queues);
    let stats = Arc::new(DeviceStats::new("virtio-blk 0"));
    (MmioTransport::new(Box::new(device), rig.mem.clone(), Runner::OnNotify, None, stats), path)
}

#[test]
fn a_paused_transport_saves_and_a_new_one_restored_from_it_serves_on() {
    let mut rig = rig();
    let features = rig.features();
    rig.set_up(features, DESC);
    rig.request(VIRTIO_BLK_T_OUT, 16);
    assert!(matches!(rig.transport.save(), Err(StateError::NotPaused)));
    rig.transport.pause().unwrap();
    let saved = rig.transport.save().unwrap();
    assert_eq!(saved.queues[0].next_avail, 1);
    assert_eq!(saved.driver_features, features);

    let (mut restored, _disk) = restore_target(&rig, DISK);
    restored.restore(&saved).unwrap();
    restored.resume();
    rig.transport = restored;
    rig.request(VIRTIO_BLK_T_IN, 16);
    assert_eq!((rig.used_idx(), rig.status_byte()), (2, VIRTIO_BLK_S_OK));
    assert_eq!(rig.read(STATUS) & status::NEEDS_RESET, 0);
}

#[test]
fn a_restore_that_disagrees_with_the_device_or_guest_memory_is_refused() {
    let mut rig = rig();
    let features = rig.features();
    rig.set_up(features, DESC);
    rig.request(VIRTIO_BLK_T_OUT, 16);
    rig.transport.pause().unwrap();
    let saved = rig.transport.save().unwrap();
    let refused = |edit: &dyn Fn(&mut TransportState), disk: u64| {
        let mut state = saved.clone();
        edit(&mut state);
        let (mut target, _disk) = restore_target(&rig, disk);
        target.restore(&state).unwrap_err()
    };
    assert!(matches!(refused(&|s| s.device_id = 1, DISK), StateError::DeviceType { .. }));
    assert!(matches!(refused(&|s| s.queues.push(s.queues[0]), DISK), StateError::QueueCount { .. }));
    assert!(matches!(refused(&|s| s.queues[0].size = 512, DISK), StateError::QueueSize { .. }));
    assert!(matches!(refused(&|s| s.queues[0].used = MEM as u64, DISK), StateError::Queue { .. }));
    assert!(matches!(refused(&|s| s.queues[0].next_avail = 7, DISK), StateError::UsedIndex { .. }));
    assert!(matches!(refused(&|s| s.queues[0].ready = false, DISK), StateError::QueueNotReady(0)));
    assert!(matches!(refused(&|s| s.driver_features = u64::MAX, DISK), StateError::Features { .. }));
    assert!(matches!(refused(&|s| s.config.truncate(10), DISK), StateError::Config(_)));
    assert!(matches!(refused(&|_| {}, 2 * DISK), StateError::ConfigDiffers { offset: 0..=7, .. }));
}

/// A two-queue disk: a driver may make only some queues ready (Linux with fewer CPUs than
/// queues); each queue's notification serves that queue, and notifications of queues that do
/// not run, or do not exist, are ignored.
#[test]
fn a_multi_queue_disk_serves_each_ready_queue_on_its_own_notification() {
    const MQ: u64 = 1 << crate::block::VIRTIO_BLK_F_MQ;
    let mut rig = rig_with_queues(2);
    assert_ne!(rig.features() & MQ, 0);
    rig.write(QUEUE_SEL, 7);
    assert_eq!(rig.read(QUEUE_NUM_MAX), 0, "no queue 7");
    // Queue 0 alone ready: the device runs, and a notification of queue 1 or 7 does nothing.
    rig.set_up(VERSION_1 | MQ, DESC);
    assert_eq!(rig.read(STATUS) & status::NEEDS_RESET, 0);
    rig.request(VIRTIO_BLK_T_OUT, 0);
    assert_eq!((rig.used_idx(), rig.status_byte()), (1, VIRTIO_BLK_S_OK));
    rig.write(QUEUE_NOTIFY, 1);
    rig.write(QUEUE_NOTIFY, 7);
    rig.write(QUEUE_NOTIFY, u32::MAX);
    assert_eq!(rig.stats.snapshot().per_queue[..2], [1, 0]);

    // Both ready (queue 0's rings emptied, as a driver's reset does): a request on queue 1 is
    // served on queue 1's notification, not on queue 0's.
    rig.write(STATUS, 0);
    rig.mem.write_obj(0u16, GuestAddress(AVAIL + 2)).unwrap();
    rig.mem.write_obj(0u16, GuestAddress(USED + 2)).unwrap();
    set_up_two_queues(&mut rig);
    offer_on_queue_1(&mut rig, 1);
    rig.write(QUEUE_NOTIFY, 0);
    assert_eq!(used_index_of_queue_1(&rig), 0, "queue 0's notification");
    rig.write(QUEUE_NOTIFY, 1);
    assert_eq!(used_index_of_queue_1(&rig), 1);
    assert_eq!(rig.stats.snapshot().per_queue[..2], [1, 1]);
    // A reset stops both workers and gives their backends back: the device starts again.
    rig.set_up(VERSION_1 | MQ, DESC);
    rig.request(VIRTIO_BLK_T_OUT, 0);
    assert_eq!(rig.status_byte(), VIRTIO_BLK_S_OK);
}

/// Queue 1's rings in the two-queue tests.
const QUEUE_1: (u64, u64, u64) = (0x8000, 0x9000, 0xa000);

/// The driver's set-up of a two-queue disk with both queues ready (queue 0 at the rig's rings).
fn set_up_two_queues(rig: &mut Rig) {
    const MQ: u64 = 1 << crate::block::VIRTIO_BLK_F_MQ;
    rig.write(STATUS, 0);
    rig.write(STATUS, status::ACKNOWLEDGE);
    rig.write(STATUS, status::ACKNOWLEDGE | status::DRIVER);
    rig.write(DRIVER_FEATURES_SEL, 1);
    rig.write(DRIVER_FEATURES, ((VERSION_1 | MQ) >> 32) as u32);
    rig.write(DRIVER_FEATURES_SEL, 0);
    rig.write(DRIVER_FEATURES, (VERSION_1 | MQ) as u32);
    rig.write(STATUS, status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK);
    rig.set_up_queue(0, (DESC, AVAIL, USED));
    rig.set_up_queue(1, QUEUE_1);
    rig.write(STATUS, status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK);
    assert_eq!(rig.read(STATUS) & status::NEEDS_RESET, 0);
}

/// Make a read of no data (a header and a status byte) available on queue 1, the `n`th there.
fn offer_on_queue_1(rig: &mut Rig, n: u16) {
    let (desc, avail, _) = QUEUE_1;
    rig.mem.write_obj(VIRTIO_BLK_T_IN, GuestAddress(HEADER)).unwrap();
    rig.mem.write_obj(0u64, GuestAddress(HEADER + 8)).unwrap();
    let descriptors = [(HEADER, 16u32, VIRTQ_DESC_F_NEXT), (STATUS_BYTE, 1, VIRTQ_DESC_F_WRITE)];
    write_chain(&rig.mem, desc, &descriptors);
    rig.mem.write_obj(0u16, GuestAddress(avail + 4 + 2 * u64::from((n - 1) % 16))).unwrap();
    rig.mem.write_obj(n, GuestAddress(avail + 2)).unwrap();
}

fn used_index_of_queue_1(rig: &Rig) -> u16 {
    rig.mem.read_obj(GuestAddress(QUEUE_1.2 + 2)).unwrap()
}

/// `offer_on_queue_1` and notify queue 1; its used index after.
fn request_on_queue_1(rig: &mut Rig, n: u16) -> u16 {
    offer_on_queue_1(rig, n);
    rig.write(QUEUE_NOTIFY, 1);
    used_index_of_queue_1(rig)
}

/// A two-queue disk with both queues in use: the snapshot has each queue's own index, and the
/// restored transport serves both from there; one with only queue 0 ready restores queue 1 as
/// absent, and a snapshot that says queue 1 was used though not ready is refused.
#[test]
fn a_two_queue_transport_saves_each_queue_and_restores_both() {
    let mut rig = rig_with_queues(2);
    set_up_two_queues(&mut rig);
    rig.request(VIRTIO_BLK_T_OUT, 16);
    rig.request(VIRTIO_BLK_T_OUT, 24);
    assert_eq!(request_on_queue_1(&mut rig, 1), 1);
    rig.transport.pause().unwrap();
    let saved = rig.transport.save().unwrap();
    let indices: Vec<_> = saved.queues.iter().map(|q| (q.ready, q.next_avail)).collect();
    assert_eq!(indices, [(true, 2), (true, 1)]);

    let refused = |edit: &dyn Fn(&mut TransportState)| {
        let mut state = saved.clone();
        edit(&mut state);
        let (mut target, _disk) = restore_target_with_queues(&rig, DISK, 2);
        target.restore(&state).unwrap_err()
    };
    assert!(matches!(refused(&|s| s.queues[1].next_avail = 5), StateError::UsedIndex { queue: 1, .. }));
    assert!(matches!(refused(&|s| s.queues[1].ready = false), StateError::QueueNotReady(1)));
    assert!(matches!(refused(&|s| s.queues.truncate(1)), StateError::QueueCount { .. }));

    let (mut restored, _disk) = restore_target_with_queues(&rig, DISK, 2);
    restored.restore(&saved).unwrap();
    restored.resume();
    rig.transport = restored;
    rig.request(VIRTIO_BLK_T_IN, 16);
    assert_eq!((rig.used_idx(), rig.status_byte()), (3, VIRTIO_BLK_S_OK));
    assert_eq!(request_on_queue_1(&mut rig, 2), 2);
    assert_eq!(rig.read(STATUS) & status::NEEDS_RESET, 0);

    // Only queue 0 made ready: queue 1 is saved unused and restored absent.
    let mut rig = rig_with_queues(2);
    rig.set_up(VERSION_1 | (1 << crate::block::VIRTIO_BLK_F_MQ), DESC);
    rig.request(VIRTIO_BLK_T_OUT, 16);
    rig.transport.pause().unwrap();
    let saved = rig.transport.save().unwrap();
    let indices: Vec<_> = saved.queues.iter().map(|q| (q.ready, q.next_avail)).collect();
    assert_eq!(indices, [(true, 1), (false, 0)]);
    let mut used_elsewhere = saved.clone();
    used_elsewhere.queues[1].next_avail = 3;
    let (mut target, _disk) = restore_target_with_queues(&rig, DISK, 2);
    assert!(matches!(target.restore(&used_elsewhere), Err(StateError::QueueNotReady(1))));
    let (mut restored, _disk) = restore_target_with_queues(&rig, DISK, 2);
    restored.restore(&saved).unwrap();
    restored.resume();
    rig.transport = restored;
    rig.request(VIRTIO_BLK_T_IN, 16);
    assert_eq!((rig.used_idx(), rig.status_byte()), (2, VIRTIO_BLK_S_OK));
}
