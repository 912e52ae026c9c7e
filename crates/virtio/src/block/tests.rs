//! The virtio-blk data path against a hostile driver, without a VM: rings laid out by hand in
//! real guest memory (vm-memory), served by a real RAM disk in /dev/shm.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use storage::ram::RamDisk;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::request::*;
use super::{BlockWorker, DiskInfo};
use crate::device::DeviceSignals;
use crate::interrupt::InterruptLine;
use crate::queue::*;

const MEM: usize = 4 << 20;
const DESC: u64 = 0x1000;
const AVAIL: u64 = 0x2000;
const USED: u64 = 0x3000;
const HEADER: u64 = 0x10000;
const DATA: u64 = 0x20000;
const STATUS: u64 = 0x8000;
const SIZE: u16 = 16;
const DISK: u64 = 1 << 20;

struct Rig {
    mem: GuestMemoryMmap,
    worker: BlockWorker,
    avail_idx: u16,
    _disk: tempfile::TempPath,
}

fn rig(read_only: bool) -> Rig {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
    let config = QueueConfig { size: SIZE, desc: DESC, avail: AVAIL, used: USED };
    let queue = Queue::new(&mem, config, false).unwrap();
    let path = tempfile::Builder::new()
        .prefix("exitless-virtio-test")
        .tempfile_in("/dev/shm")
        .unwrap()
        .into_temp_path();
    let mut disk = RamDisk::create(&path, DISK).unwrap();
    if read_only {
        disk = RamDisk::open(&path, true).unwrap();
    }
    let info = DiskInfo { capacity: DISK, read_only, id: *b"exitless-test-disk\0\0" };
    let interrupt = InterruptLine::new(Arc::new(AtomicU32::new(0)), None);
    let signals = DeviceSignals::new(interrupt, Arc::new(AtomicBool::new(false)));
    let worker = BlockWorker::new(queue, mem.clone(), Box::new(disk), info, signals);
    Rig { mem, worker, avail_idx: 0, _disk: path }
}

impl Rig {
    fn desc(&self, index: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let at = DESC + 16 * index as u64;
        self.mem.write_obj(addr, GuestAddress(at)).unwrap();
        self.mem.write_obj(len, GuestAddress(at + 8)).unwrap();
        self.mem.write_obj(flags, GuestAddress(at + 12)).unwrap();
        self.mem.write_obj(next, GuestAddress(at + 14)).unwrap();
    }

    fn header(&self, kind: u32, sector: u64) {
        self.mem.write_obj(kind, GuestAddress(HEADER)).unwrap();
        self.mem.write_obj(0u32, GuestAddress(HEADER + 4)).unwrap();
        self.mem.write_obj(sector, GuestAddress(HEADER + 8)).unwrap();
        self.mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
    }

    /// A well-formed three-descriptor request at descriptors 0, 1, 2.
    fn request(&self, kind: u32, sector: u64, len: u32) {
        self.header(kind, sector);
        let data_flags = if kind == VIRTIO_BLK_T_OUT { 0 } else { VIRTQ_DESC_F_WRITE };
        self.desc(0, HEADER, 16, VIRTQ_DESC_F_NEXT, 1);
        self.desc(1, DATA, len, data_flags | VIRTQ_DESC_F_NEXT, 2);
        self.desc(2, STATUS, 1, VIRTQ_DESC_F_WRITE, 0);
    }

    fn submit(&mut self, head: u16) {
        let slot = AVAIL + 4 + 2 * (self.avail_idx % SIZE) as u64;
        self.mem.write_obj(head, GuestAddress(slot)).unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.mem.write_obj(self.avail_idx, GuestAddress(AVAIL + 2)).unwrap();
    }

    /// Process and complete; the queue error, if the guest broke the queue.
    fn run(&mut self) -> Result<usize, QueueError> {
        let started = self.worker.process_queue()?;
        self.worker.complete();
        Ok(started)
    }

    fn status(&self) -> u8 {
        self.mem.read_obj(GuestAddress(STATUS)).unwrap()
    }

    fn used_idx(&self) -> u16 {
        self.mem.read_obj(GuestAddress(USED + 2)).unwrap()
    }

    fn used_len(&self, slot: u16) -> u32 {
        self.mem.read_obj(GuestAddress(USED + 4 + 8 * slot as u64 + 4)).unwrap()
    }

    /// A valid write then read of one 4 KiB block still works.
    fn assert_still_serves(&mut self) {
        self.mem.write_slice(&[0x5a; 4096], GuestAddress(DATA)).unwrap();
        self.request(VIRTIO_BLK_T_OUT, 8, 4096);
        self.submit(0);
        self.run().unwrap();
        assert_eq!(self.status(), VIRTIO_BLK_S_OK);
        self.mem.write_slice(&[0; 4096], GuestAddress(DATA)).unwrap();
        self.request(VIRTIO_BLK_T_IN, 8, 4096);
        self.submit(0);
        self.run().unwrap();
        assert_eq!(self.status(), VIRTIO_BLK_S_OK);
        let mut back = [0u8; 4096];
        self.mem.read_slice(&mut back, GuestAddress(DATA)).unwrap();
        assert!(back.iter().all(|&b| b == 0x5a));
    }
}

#[test]
fn read_write_flush_and_get_id() {
    let mut rig = rig(false);
    rig.assert_still_serves();
    assert_eq!(rig.used_len(1), 4097, "a read reports data plus status");
    rig.request(VIRTIO_BLK_T_FLUSH, 0, 0);
    rig.desc(0, HEADER, 16, VIRTQ_DESC_F_NEXT, 2);
    rig.submit(0);
    rig.run().unwrap();
    assert_eq!(rig.status(), VIRTIO_BLK_S_OK);
    rig.request(VIRTIO_BLK_T_GET_ID, 0, 20);
    rig.submit(0);
    rig.run().unwrap();
    let mut id = [0u8; 20];
    rig.mem.read_slice(&mut id, GuestAddress(DATA)).unwrap();
    assert_eq!(&id[..18], b"exitless-test-disk");
}

#[test]
fn descriptor_outside_guest_memory_is_an_io_error() {
    let mut rig = rig(false);
    rig.request(VIRTIO_BLK_T_IN, 0, 4096);
    rig.desc(1, 0xffff_f000_0000, 4096, VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT, 2);
    rig.submit(0);
    rig.run().unwrap();
    assert_eq!(rig.status(), VIRTIO_BLK_S_IOERR);
    // Straddling the end of RAM is outside too.
    rig.desc(1, MEM as u64 - 512, 4096, VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT, 2);
    rig.submit(0);
    rig.run().unwrap();
    assert_eq!(rig.status(), VIRTIO_BLK_S_IOERR);
    rig.assert_still_serves();
}

#[test]
fn length_that_wraps_around_is_an_io_error() {
    let mut rig = rig(false);
    rig.request(VIRTIO_BLK_T_IN, 0, 4096);
    rig.desc(1, u64::MAX - 100, 4096, VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT, 2);
    rig.submit(0);
    rig.run().unwrap();
    assert_eq!(rig.status(), VIRTIO_BLK_S_IOERR);
    rig.assert_still_serves();
}

#[test]
fn looping_chain_needs_a_reset() {
    let mut rig = rig(false);
    rig.request(VIRTIO_BLK_T_IN, 0, 512);
    rig.desc(1, DATA, 512, VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT, 0); // back to the header
    rig.submit(0);
    assert_eq!(rig.run(), Err(QueueError::ChainTooLong));
}

#[test]
fn descriptor_index_out_of_range_needs_a_reset() {
    let mut rig = rig(false);
    rig.request(VIRTIO_BLK_T_IN, 0, 512);
    rig.desc(1, DATA, 512, VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT, 999);
    rig.submit(0);
    assert_eq!(rig.run(), Err(QueueError::BadDescriptorIndex(999)));
    let mut rig = self::rig(false);
    rig.submit(SIZE + 3);
    assert_eq!(rig.run(), Err(QueueError::BadDescriptorIndex(SIZE + 3)));
}

#[test]
fn short_header_is_an_io_error() {
    let mut rig = rig(false);
    rig.request(VIRTIO_BLK_T_IN, 0, 512);
    rig.desc(0, HEADER, 8, VIRTQ_DESC_F_NEXT, 1);
    rig.submit(0);
    rig.run().unwrap();
    assert_eq!(rig.status(), VIRTIO_BLK_S_IOERR);
    rig.assert_still_serves();
}

#[test]
fn read_only_status_descriptor_is_completed_without_a_status() {
    let mut rig = rig(false);
    rig.request(VIRTIO_BLK_T_IN, 0, 512);
    rig.desc(2, STATUS, 1, 0, 0);
    rig.submit(0);
    rig.run().unwrap();
    assert_eq!(rig.status(), 0xff, "the device wrote nothing the guest marked read-only");
    assert_eq!(rig.used_idx(), 1);
    assert_eq!(rig.used_len(0), 0);
    rig.assert_still_serves();
}

#[test]
fn write_to_a_read_only_disk_is_an_io_error() {
    let mut rig = rig(true);
    rig.request(VIRTIO_BLK_T_OUT, 0, 512);
    rig.submit(0);
    rig.run().unwrap();
    assert_eq!(rig.status(), VIRTIO_BLK_S_IOERR);
    rig.request(VIRTIO_BLK_T_IN, 0, 512);
    rig.submit(0);
    rig.run().unwrap();
    assert_eq!(rig.status(), VIRTIO_BLK_S_OK, "reads still work");
}

#[test]
fn sectors_past_the_end_are_an_io_error() {
    let mut rig = rig(false);
    for sector in [DISK / 512, DISK / 512 - 1, u64::MAX / 512, u64::MAX] {
        rig.request(VIRTIO_BLK_T_IN, sector, 1024);
        rig.submit(0);
        rig.run().unwrap();
        assert_eq!(rig.status(), VIRTIO_BLK_S_IOERR, "sector {sector}");
    }
    rig.assert_still_serves();
}

#[test]
fn avail_index_jump_needs_a_reset() {
    let mut rig = rig(false);
    rig.mem.write_obj(SIZE + 1, GuestAddress(AVAIL + 2)).unwrap();
    assert_eq!(rig.run(), Err(QueueError::AvailIndexJump(SIZE + 1)));
}

#[test]
fn unknown_request_type_is_unsupported() {
    let mut rig = rig(false);
    rig.request(0x1234, 0, 512);
    rig.submit(0);
    rig.run().unwrap();
    assert_eq!(rig.status(), VIRTIO_BLK_S_UNSUPP);
    rig.assert_still_serves();
}

#[test]
fn data_length_not_a_multiple_of_a_sector_is_an_io_error() {
    let mut rig = rig(false);
    rig.request(VIRTIO_BLK_T_IN, 0, 100);
    rig.submit(0);
    rig.run().unwrap();
    assert_eq!(rig.status(), VIRTIO_BLK_S_IOERR);
}

#[test]
fn rings_outside_memory_or_misaligned_are_refused() {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
    let good = QueueConfig { size: SIZE, desc: DESC, avail: AVAIL, used: USED };
    assert!(Queue::new(&mem, good, true).is_ok());
    for bad in [
        QueueConfig { size: 0, ..good },
        QueueConfig { size: 3, ..good },
        QueueConfig { size: 512, ..good },
        QueueConfig { desc: MEM as u64 - 8, ..good },
        QueueConfig { desc: DESC + 1, ..good },
        QueueConfig { used: USED + 2, ..good },
        QueueConfig { avail: u64::MAX - 1, ..good },
    ] {
        assert!(Queue::new(&mem, bad, true).is_err(), "{bad:?}");
    }
}

#[test]
fn interrupts_follow_the_drivers_wishes() {
    let status = Arc::new(AtomicU32::new(0));
    let mut rig = rig(false);
    rig.worker = {
        let mem = rig.mem.clone();
        let queue = Queue::new(&mem, QueueConfig { size: SIZE, desc: DESC, avail: AVAIL, used: USED }, false)
            .unwrap();
        let path = tempfile::Builder::new().tempfile_in("/dev/shm").unwrap().into_temp_path();
        let disk = RamDisk::create(&path, DISK).unwrap();
        let info = DiskInfo { capacity: DISK, read_only: false, id: [0; 20] };
        BlockWorker::new(
            queue,
            mem,
            Box::new(disk),
            info,
            DeviceSignals::new(InterruptLine::new(status.clone(), None), Arc::new(AtomicBool::new(false))),
        )
    };
    rig.request(VIRTIO_BLK_T_IN, 0, 512);
    rig.submit(0);
    rig.run().unwrap();
    assert_eq!(status.swap(0, Ordering::AcqRel), 1, "interrupted by default");
    // VRING_AVAIL_F_NO_INTERRUPT: the polling driver asks for none.
    rig.mem.write_obj(VRING_AVAIL_F_NO_INTERRUPT, GuestAddress(AVAIL)).unwrap();
    rig.submit(0);
    rig.run().unwrap();
    assert_eq!(rig.status(), VIRTIO_BLK_S_OK);
    assert_eq!(status.load(Ordering::Acquire), 0, "no interrupt when the driver polls");
    assert_eq!(rig.worker.counters.interrupts, 1);
}

#[test]
fn event_idx_arithmetic() {
    assert!(vring_need_event(0, 1, 0));
    assert!(!vring_need_event(5, 3, 2));
    assert!(vring_need_event(5, 7, 4));
    assert!(vring_need_event(u16::MAX, 0, u16::MAX - 1), "wraps around");
}

#[test]
fn backend_io_error_answers_ioerr_when_the_file_shrank() {
    let mut rig = rig(false);
    let path = tempfile::Builder::new().tempfile_in("/dev/shm").unwrap().into_temp_path();
    std::fs::write(&path, vec![0u8; DISK as usize]).unwrap();
    let disk = storage::FileDisk::open(&path, false, false).unwrap();
    rig.worker = {
        let queue =
            Queue::new(&rig.mem, QueueConfig { size: SIZE, desc: DESC, avail: AVAIL, used: USED }, false)
                .unwrap();
        let info = DiskInfo { capacity: DISK, read_only: false, id: [0; 20] };
        let signals =
            DeviceSignals::new(InterruptLine::new(Arc::new(AtomicU32::new(0)), None), Arc::default());
        BlockWorker::new(queue, rig.mem.clone(), Box::new(disk), info, signals)
    };
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(4096).unwrap();
    rig.request(VIRTIO_BLK_T_IN, 64, 4096);
    rig.submit(0);
    rig.run().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while rig.used_idx() == 0 && std::time::Instant::now() < deadline {
        rig.worker.complete();
    }
    assert_eq!(rig.used_idx(), 1);
    assert_eq!(rig.status(), VIRTIO_BLK_S_IOERR, "a read past the shrunken end fails");
    assert_eq!(rig.worker.counters.io_errors, 1);
}

#[test]
fn a_resumed_queue_continues_from_the_given_avail_index_and_the_rings_used_index() {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
    let config = QueueConfig { size: SIZE, desc: DESC, avail: AVAIL, used: USED };
    // The driver has made 7 requests available, of which the device used 5 before it stopped.
    mem.write_obj(7u16, GuestAddress(AVAIL + 2)).unwrap();
    mem.write_obj(5u16, GuestAddress(USED + 2)).unwrap();
    let mut queue = Queue::new(&mem, config, false).unwrap();
    queue.resume(5);
    assert_eq!(queue.next_avail(), 5);
    assert_eq!(queue.pop_avail(), Ok(Some(0)));
    assert_eq!(queue.next_avail(), 6);
    queue.add_used(3, 1);
    queue.publish_used();
    assert_eq!(mem.read_obj::<u16>(GuestAddress(USED + 2)).unwrap(), 6, "used continues at 5");
    assert_eq!(mem.read_obj::<u32>(GuestAddress(USED + 4 + 8 * 5)).unwrap(), 3);
}

#[test]
fn a_multi_queue_device_offers_mq_and_one_backend_per_queue() {
    use super::{Block, VIRTIO_BLK_F_MQ};
    use crate::device::{ActivateError, VirtioDevice};
    let path =
        tempfile::Builder::new().prefix("exitless-mq-test").tempfile_in("/dev/shm").unwrap().into_temp_path();
    drop(RamDisk::create(&path, DISK).unwrap());
    let open = || Box::new(RamDisk::open(&path, false).unwrap()) as Box<dyn storage::Backend>;
    let one = Block::new(open(), "one");
    assert_eq!(one.features() & 1 << VIRTIO_BLK_F_MQ, 0);
    let mut two = Block::with_queues(vec![open(), open()], "two").unwrap();
    assert_ne!(two.features() & 1 << VIRTIO_BLK_F_MQ, 0);
    assert_eq!(two.queue_max_sizes().len(), 2);
    let mut num_queues = [0u8; 2];
    two.read_config(34, &mut num_queues);
    assert_eq!(u16::from_le_bytes(num_queues), 2);
    assert!(Block::with_queues(Vec::new(), "none").is_none());
    assert!(Block::with_queues((0..17).map(|_| open()).collect(), "too many").is_none());

    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
    let config = QueueConfig { size: SIZE, desc: DESC, avail: AVAIL, used: USED };
    let signals = || {
        DeviceSignals::new(
            InterruptLine::new(Arc::new(AtomicU32::new(0)), None),
            Arc::new(AtomicBool::new(false)),
        )
    };
    let queue = || Queue::new(&mem, config, false).unwrap();
    // The virtio-mmio path starts one worker per device: not for a multi-queue device.
    assert!(matches!(two.activate(&mem, vec![queue()], 0, signals()), Err(ActivateError::MultiQueue { .. })));
    let worker = two.start_queue(1, queue(), &mem, signals()).unwrap();
    assert!(matches!(two.start_queue(1, queue(), &mem, signals()), Err(ActivateError::NoBackend)));
    assert!(matches!(
        two.start_queue(2, queue(), &mem, signals()),
        Err(ActivateError::NoSuchQueue { index: 2 })
    ));
    two.stop_queue(1, worker);
    assert!(two.start_queue(1, queue(), &mem, signals()).is_ok(), "the backend came back");
}
