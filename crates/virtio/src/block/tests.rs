//! The virtio-blk data path against a hostile driver, without a VM: rings laid out by hand in
//! real guest memory (vm-memory), served by a real RAM disk in /dev/shm.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use storage::ram::RamDisk;
use virtqueue::queue::*;
use virtqueue::QueueWorker;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::request::*;
use super::{BlockWorker, DiskInfo};
use crate::device::DeviceSignals;
use crate::interrupt::InterruptLine;

const MEM: usize = 4 << 20;
const DESC: u64 = 0x1000;
const AVAIL: u64 = 0x2000;
const USED: u64 = 0x3000;
const HEADER: u64 = 0x10000;
const DATA: u64 = 0x20000;
const STATUS: u64 = 0x8000;
const SIZE: u16 = 16;
const DISK: u64 = 4 << 20;

struct Rig {
    mem: GuestMemoryMmap,
    worker: BlockWorker,
    size: u16,
    avail_idx: u16,
    needs_reset: Arc<AtomicBool>,
    _disk: tempfile::TempPath,
}

fn rig(read_only: bool) -> Rig {
    rig_of_size(read_only, SIZE)
}

fn signals(needs_reset: Arc<AtomicBool>) -> DeviceSignals {
    DeviceSignals::new(InterruptLine::new(Arc::new(AtomicU32::new(0)), None), needs_reset)
}

fn rig_of_size(read_only: bool, size: u16) -> Rig {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
    let config = QueueConfig { size, desc: DESC, avail: AVAIL, used: USED };
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
    let info = DiskInfo {
        capacity: DISK,
        read_only,
        id: *b"exitless-test-disk\0\0",
        discard: true,
        write_zeroes: true,
        ..DiskInfo::default()
    };
    let needs_reset = Arc::new(AtomicBool::new(false));
    let worker = BlockWorker::new(queue, Box::new(disk), info, signals(needs_reset.clone()));
    Rig { mem, worker, size, avail_idx: 0, needs_reset, _disk: path }
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
        let slot = AVAIL + 4 + 2 * (self.avail_idx % self.size) as u64;
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
        let info = DiskInfo { capacity: DISK, read_only: false, id: [0; 20], ..DiskInfo::default() };
        BlockWorker::new(
            queue,
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
        let info = DiskInfo { capacity: DISK, read_only: false, id: [0; 20], ..DiskInfo::default() };
        let signals =
            DeviceSignals::new(InterruptLine::new(Arc::new(AtomicU32::new(0)), None), Arc::default());
        BlockWorker::new(queue, Box::new(disk), info, signals)
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
    // With MQ negotiated, a worker per queue the driver made ready (here: both, then only 1);
    // without, queue 0's alone, whatever else is ready; no queue at all is refused.
    let mq = two.features();
    let workers = two.activate(&mem, vec![Some(queue()), Some(queue())], mq, signals()).unwrap();
    assert_eq!(workers.iter().map(Option::is_some).collect::<Vec<_>>(), [true, true]);
    assert_eq!((two.worker_count(), two.worker_of_queue(1), two.worker_of_queue(2)), (2, Some(1), None));
    two.deactivate(workers);
    let workers = two.activate(&mem, vec![None, Some(queue())], mq, signals()).unwrap();
    assert_eq!(workers.iter().map(Option::is_some).collect::<Vec<_>>(), [false, true]);
    two.deactivate(workers);
    let without_mq = mq & !(1 << VIRTIO_BLK_F_MQ);
    let workers = two.activate(&mem, vec![Some(queue()), Some(queue())], without_mq, signals()).unwrap();
    assert_eq!(workers.iter().map(Option::is_some).collect::<Vec<_>>(), [true, false]);
    two.deactivate(workers);
    assert!(matches!(two.activate(&mem, vec![None, None], mq, signals()), Err(ActivateError::NoQueue)));
    assert!(matches!(
        two.activate(&mem, vec![None, Some(queue())], without_mq, signals()),
        Err(ActivateError::NoQueue)
    ));
    let worker = two.start_queue(1, queue(), signals()).unwrap();
    assert!(matches!(two.start_queue(1, queue(), signals()), Err(ActivateError::NoBackend)));
    assert!(matches!(two.start_queue(2, queue(), signals()), Err(ActivateError::NoSuchQueue { index: 2 })));
    two.stop_queue(1, worker);
    assert!(two.start_queue(1, queue(), signals()).is_ok(), "the backend came back");
}

#[test]
fn more_completions_than_one_batch_all_reach_the_used_ring() {
    // 100 FLUSH requests made available at once; the RAM disk hands all 100 completions over
    // in one poll.
    let mut rig = rig_of_size(false, 256);
    rig.header(VIRTIO_BLK_T_FLUSH, 0);
    for i in 0..100u16 {
        let status = STATUS + 1 + i as u64;
        rig.mem.write_obj(0xffu8, GuestAddress(status)).unwrap();
        rig.desc(2 * i, HEADER, 16, VIRTQ_DESC_F_NEXT, 2 * i + 1);
        rig.desc(2 * i + 1, status, 1, VIRTQ_DESC_F_WRITE, 0);
        rig.submit(2 * i);
    }
    assert_eq!(rig.run(), Ok(100));
    assert_eq!(rig.used_idx(), 100, "every request completed");
    for i in 0..100u64 {
        assert_eq!(
            rig.mem.read_obj::<u8>(GuestAddress(STATUS + 1 + i)).unwrap(),
            VIRTIO_BLK_S_OK,
            "request {i}"
        );
    }
    assert_eq!(rig.worker.in_flight(), 0);
    assert_eq!(rig.worker.counters.completed, 100);
}

#[test]
fn a_head_made_available_twice_needs_a_reset() {
    let mut rig = rig(false);
    rig.request(VIRTIO_BLK_T_IN, 0, 512);
    rig.submit(0);
    rig.submit(0); // again, while the device holds it
    assert_eq!(rig.worker.process_queue(), Err(QueueError::HeadInUse(0)));
    // The request that did start still finishes, once, and nothing stays in flight.
    rig.worker.complete();
    assert_eq!((rig.used_idx(), rig.status(), rig.worker.in_flight()), (1, VIRTIO_BLK_S_OK, 0));

    // Through the worker's owner: DEVICE_NEEDS_RESET, counted with its reason, nothing served.
    let mut rig = self::rig(false);
    rig.request(VIRTIO_BLK_T_IN, 0, 512);
    rig.submit(0);
    rig.submit(0);
    rig.worker.poll();
    assert!(rig.needs_reset.load(Ordering::Acquire));
    assert_eq!(rig.worker.in_flight(), 0);
    assert!(!rig.worker.has_pending(), "a broken queue is not served until reset");
}

/// The duplicate head on an io_uring disk (a buffered and an O_DIRECT file): the request that
/// did start reaches the kernel, finishes and is in the used ring before the driver is told the
/// device needs a reset (as on a RAM disk, which finishes it at once), and the reset gets the
/// backend back. Regression: the pass ended at the duplicate before handing the first copy to
/// the kernel, so nothing ever finished it and `into_backend` waited for ever.
#[test]
fn a_head_made_available_twice_on_an_io_uring_disk_still_lets_the_reset_finish() {
    for direct in [false, true] {
        let mut rig = rig(false);
        let file = tempfile::Builder::new().prefix("exitless-virtio-test").tempfile_in("/tmp").unwrap();
        file.as_file().set_len(DISK).unwrap();
        let disk = storage::FileDisk::open(file.path(), false, direct).unwrap();
        let queue =
            Queue::new(&rig.mem, QueueConfig { size: SIZE, desc: DESC, avail: AVAIL, used: USED }, false)
                .unwrap();
        let info = DiskInfo { capacity: DISK, read_only: false, id: [0; 20], ..DiskInfo::default() };
        rig.worker = BlockWorker::new(queue, Box::new(disk), info, signals(rig.needs_reset.clone()));
        rig.request(VIRTIO_BLK_T_IN, 0, 4096);
        rig.submit(0);
        rig.submit(0);
        // The owner polls while requests are in flight (a hang guard, not a speed bound).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !rig.needs_reset.load(Ordering::Acquire) {
            assert_eq!(
                rig.used_idx(),
                0,
                "direct {direct}: nothing published before the first copy finished"
            );
            assert!(std::time::Instant::now() < deadline, "direct {direct}: the first copy never finished");
            rig.worker.poll();
        }
        assert_eq!(
            (rig.used_idx(), rig.status()),
            (1, VIRTIO_BLK_S_OK),
            "direct {direct}: served once, first"
        );
        assert_eq!(rig.worker.in_flight(), 0);
        // A thread, so that a reset that never ends fails the test instead of hanging it.
        let Rig { worker, .. } = rig;
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || done.send(worker.into_backend().is_ok()).unwrap());
        let took_back = finished
            .recv_timeout(std::time::Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("direct {direct}: the reset still waits for a request"));
        assert!(took_back, "direct {direct}: the reset gave up on a request");
    }
}

#[test]
fn a_queue_keeps_the_memory_it_reads_mapped() {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
    mem.write_obj(1u16, GuestAddress(AVAIL + 2)).unwrap();
    let mut queue =
        Queue::new(&mem, QueueConfig { size: SIZE, desc: DESC, avail: AVAIL, used: USED }, false).unwrap();
    drop(mem);
    assert_eq!(queue.has_avail(), Ok(true));
    assert_eq!(queue.pop_avail(), Ok(Some(0)));
    queue.add_used(0, 1);
    queue.publish_used();
    assert!(queue.needs_interrupt());
}

/// A backend that holds its requests until told to finish them, then writes `FILL` into their
/// buffers as the kernel would; dropping it finishes what it holds (as FileDisk waits for the
/// kernel). `held` says how many it holds.
struct HeldBackend {
    requests: Vec<(u32, Vec<storage::Segment>)>,
    release_at: std::time::Instant,
    held: Arc<std::sync::atomic::AtomicUsize>,
}

const FILL: u8 = 0xab;

impl HeldBackend {
    fn finish_all(&mut self, done: &mut dyn FnMut(storage::Completion)) -> usize {
        let n = self.requests.len();
        for (tag, segments) in self.requests.drain(..) {
            for segment in segments {
                // SAFETY: the worker made the segment from guest memory it keeps mapped until
                // this backend is done with it (what these tests check).
                unsafe { std::ptr::write_bytes(segment.addr(), FILL, segment.len() as usize) };
            }
            done(storage::Completion { tag, result: Ok(0) });
        }
        self.held.store(0, Ordering::Release);
        n
    }
}

impl storage::Backend for HeldBackend {
    fn capacity(&self) -> u64 {
        DISK
    }
    fn read_only(&self) -> bool {
        false
    }
    fn max_in_flight(&self) -> usize {
        256
    }
    fn submit(&mut self, tag: u32, _op: storage::Op, _offset: u64, segments: &[storage::Segment]) -> bool {
        self.requests.push((tag, segments.to_vec()));
        self.held.store(self.requests.len(), Ordering::Release);
        true
    }
    fn poll(&mut self, done: &mut dyn FnMut(storage::Completion)) -> usize {
        if std::time::Instant::now() < self.release_at {
            return 0;
        }
        self.finish_all(done)
    }
}

impl Drop for HeldBackend {
    fn drop(&mut self) {
        self.finish_all(&mut |_| {});
    }
}

/// A worker over its own guest memory (the test keeps no copy) and a `HeldBackend` holding one
/// 64 KiB read, released after `hold`.
fn worker_with_a_held_read(hold: std::time::Duration) -> (BlockWorker, Arc<std::sync::atomic::AtomicUsize>) {
    let mut rig = rig(false);
    let held = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let backend = HeldBackend {
        requests: Vec::new(),
        release_at: std::time::Instant::now() + hold,
        held: held.clone(),
    };
    let queue = Queue::new(&rig.mem, QueueConfig { size: SIZE, desc: DESC, avail: AVAIL, used: USED }, false)
        .unwrap();
    let info = DiskInfo { capacity: DISK, read_only: false, id: [0; 20], ..DiskInfo::default() };
    rig.worker = BlockWorker::new(queue, Box::new(backend), info, signals(Arc::default()));
    rig.request(VIRTIO_BLK_T_IN, 0, 65536);
    rig.submit(0);
    rig.run().unwrap();
    assert_eq!(rig.worker.in_flight(), 1);
    let Rig { worker, .. } = rig;
    (worker, held)
}

#[test]
fn dropping_a_worker_lets_the_backend_finish_before_memory_goes() {
    // The backend writes into guest memory as it drops: that memory must still be mapped.
    let (worker, held) = worker_with_a_held_read(std::time::Duration::from_secs(3600));
    drop(worker);
    assert_eq!(held.load(Ordering::Acquire), 0);
}

/// A reset waits for the backend a bounded time (its reset timeout, then as long again for the
/// cancels, which this backend ignores), then gives up: the worker comes back abandoned, still
/// holding the request and the guest memory it reads into, and answers nothing when the backend
/// finishes it late. The stats count the request quarantined, then released.
#[test]
fn a_reset_gives_up_on_a_backend_that_holds_a_request_and_keeps_its_memory() {
    // Well beyond the 2 x 200 ms the reset waits.
    let (worker, held) = worker_with_a_held_read(std::time::Duration::from_millis(3000));
    let worker = worker.with_reset_timeout(std::time::Duration::from_millis(200));
    let Err(mut worker) = worker.into_backend() else { panic!("the backend still held a request") };
    let stats = worker.stats_snapshot();
    assert_eq!((stats.reset_timeouts, stats.reset_cancelled, stats.quarantined), (1, 0, 1));
    assert_eq!((worker.in_flight(), held.load(Ordering::Acquire)), (1, 1));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while worker.in_flight() > 0 {
        assert!(std::time::Instant::now() < deadline, "the held read never finished");
        worker.complete();
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(worker.counters.completed, 0, "an abandoned request is not answered");
    assert_eq!(worker.queue_mut().next_avail(), 1);
    assert_eq!(worker.stats_snapshot().quarantined, 0, "the quarantine is released");
}

/// A reset that waited longer than its timeout cancels what the disk holds: a read the cancel
/// ends (a real io_uring read of a pipe nobody writes) is answered VIRTIO_BLK_S_IOERR in the used
/// ring, which the driver still reads (a vhost-user frontend stopping a ring with
/// GET_VRING_BASE), and the backend comes back for the next driver: nothing is quarantined.
#[test]
fn a_reset_cancels_a_read_the_disk_holds_too_long_and_answers_it_ioerr() {
    let mut rig = rig(false);
    let (disk, _writer) = storage::testing::disk_on_a_pipe();
    let config = QueueConfig { size: SIZE, desc: DESC, avail: AVAIL, used: USED };
    let queue = Queue::new(&rig.mem, config, false).unwrap();
    let info = DiskInfo { capacity: 1 << 20, read_only: false, id: [0; 20], ..DiskInfo::default() };
    let stats = Arc::new(crate::DeviceStats::new("pipe disk"));
    let signals = signals(Arc::default()).with_stats(stats.clone());
    let worker = BlockWorker::new(queue, Box::new(disk), info, signals);
    rig.worker = worker.with_reset_timeout(std::time::Duration::from_millis(200));
    rig.request(VIRTIO_BLK_T_IN, 0, 512);
    rig.submit(0);
    rig.run().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    rig.run().unwrap();
    assert_eq!((rig.used_idx(), rig.worker.in_flight()), (0, 1), "the pipe answered the read");

    let worker = std::mem::replace(&mut rig.worker, rig_of_size(false, SIZE).worker);
    let Ok(backend) = worker.into_backend() else { panic!("the cancelled read was quarantined") };
    assert_eq!(backend.max_in_flight(), 8, "the pipe disk came back");
    assert_eq!(rig.used_idx(), 1, "the cancelled read is in the used ring");
    assert_eq!(rig.status(), VIRTIO_BLK_S_IOERR);
    let stats = stats.snapshot();
    assert_eq!((stats.reset_timeouts, stats.reset_cancelled, stats.quarantined), (1, 1, 0));
    assert_eq!(stats.requests.io_errors, 1);
}

const STALL_CONFIG: QueueConfig = QueueConfig { size: SIZE, desc: DESC, avail: AVAIL, used: USED };

fn start_queue_0(block: &mut super::Block, mem: &GuestMemoryMmap) -> BlockWorker {
    block.start_queue(0, Queue::new(mem, STALL_CONFIG, false).unwrap(), signals(Arc::default())).unwrap()
}

/// A block device on a tmpfs file whose queue 0 was reset while the disk held a read into guest
/// memory whose page fault nobody answers (userfaultfd), as a disk that does not answer would:
/// the device, the stall (to release the read) and the file.
fn block_with_a_quarantined_read(
    rig: &mut Rig,
) -> (super::Block, storage::testing::Stall, tempfile::NamedTempFile) {
    use vm_memory::GuestMemoryBackend;
    let image = tempfile::Builder::new().prefix("exitless-virtio-test").tempfile_in("/dev/shm").unwrap();
    image.as_file().set_len(DISK).unwrap();
    // tmpfs: io_uring runs the read in its worker, which stalls, not this thread.
    let disk = storage::FileDisk::open(image.path(), false, false).unwrap();
    let mut block = super::Block::new(Box::new(disk), "stalled");
    let host_data = rig.mem.get_host_address(GuestAddress(DATA)).unwrap();
    // SAFETY: guest memory stays mapped for the whole test (rig.mem, and every worker's queue).
    let stall = unsafe { storage::testing::Stall::new(host_data, 4096) };
    rig.worker = start_queue_0(&mut block, &rig.mem);
    rig.request(VIRTIO_BLK_T_IN, 0, 4096);
    rig.submit(0);
    rig.run().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    rig.run().unwrap();
    assert_eq!(rig.used_idx(), 0, "the stalled read finished");

    let placeholder = rig_of_size(false, SIZE).worker;
    let stalled = std::mem::replace(&mut rig.worker, placeholder);
    let reset = std::time::Instant::now();
    block.stop_queue(0, stalled);
    // A hang guard, far above the bound, not a speed check.
    assert!(reset.elapsed() < std::time::Duration::from_secs(30));
    assert_eq!(block.abandoned_requests(), 1);
    (block, stall, image)
}

/// The driver sets queue 0 up again and reads at head 3 into its own buffer and status: it is
/// served.
fn next_driver_is_served(rig: &mut Rig, block: &mut super::Block) {
    rig.mem.write_obj(0u16, GuestAddress(AVAIL + 2)).unwrap();
    rig.mem.write_obj(0u16, GuestAddress(USED + 2)).unwrap();
    rig.avail_idx = 0;
    rig.worker = start_queue_0(block, &rig.mem);
    let (data, status) = (DATA + 0x10000, STATUS + 0x100);
    rig.header(VIRTIO_BLK_T_IN, 8);
    rig.mem.write_obj(0xffu8, GuestAddress(status)).unwrap();
    rig.desc(3, HEADER, 16, VIRTQ_DESC_F_NEXT, 4);
    rig.desc(4, data, 4096, VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT, 5);
    rig.desc(5, status, 1, VIRTQ_DESC_F_WRITE, 0);
    rig.submit(3);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while rig.used_idx() == 0 {
        assert!(std::time::Instant::now() < deadline, "the next driver was not served");
        rig.worker.poll();
    }
    let used_head: u32 = rig.mem.read_obj(GuestAddress(USED + 4)).unwrap();
    assert_eq!((used_head, rig.mem.read_obj::<u8>(GuestAddress(status)).unwrap()), (3, VIRTIO_BLK_S_OK));
}

/// Wait until the disk has finished the quarantined requests (they are reaped).
fn wait_for_quarantine_release(block: &mut super::Block) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while block.abandoned_requests() > 0 {
        assert!(std::time::Instant::now() < deadline, "the released read never finished");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Regression: a device reset waited as long as the disk did, for ever for one that does not
/// answer, and the disk's next driver was never served. The reset now gives up within its
/// bound, the next start opens the disk again and serves at once, and the abandoned read, once
/// it finishes, is reaped without touching the rings.
#[test]
fn a_reset_over_a_disk_that_does_not_answer_is_bounded_and_the_next_driver_is_served() {
    let mut rig = rig(false);
    let (mut block, mut stall, _image) = block_with_a_quarantined_read(&mut rig);
    next_driver_is_served(&mut rig, &mut block);

    // The disk answers the abandoned read at last: it is reaped, and answers nothing.
    let old_status = rig.mem.read_obj::<u8>(GuestAddress(STATUS)).unwrap();
    stall.release();
    wait_for_quarantine_release(&mut block);
    let used_head: u32 = rig.mem.read_obj(GuestAddress(USED + 4)).unwrap();
    assert_eq!((rig.used_idx(), used_head), (1, 3), "the abandoned read touched the used ring");
    assert_eq!(rig.mem.read_obj::<u8>(GuestAddress(STATUS)).unwrap(), old_status);
    deactivate(&mut rig, &mut block);
}

/// A queue whose quarantine drains before it starts again takes the drained worker's backend
/// back and serves. Regression: the drained worker went with its backend, and the start failed
/// ("the device's backend is gone"): a vhost-user ring that waited for its quarantine to drain
/// (so as not to resubmit what the disk still held) could then never start.
#[test]
fn a_queue_whose_quarantine_drained_before_its_next_start_is_served() {
    let mut rig = rig(false);
    let (mut block, mut stall, _image) = block_with_a_quarantined_read(&mut rig);
    stall.release();
    wait_for_quarantine_release(&mut block);
    next_driver_is_served(&mut rig, &mut block);
    deactivate(&mut rig, &mut block);
}

fn deactivate(rig: &mut Rig, block: &mut super::Block) {
    use crate::device::VirtioDevice;
    let worker = std::mem::replace(&mut rig.worker, rig_of_size(false, SIZE).worker);
    block.deactivate(vec![Some(worker.into())]);
}

#[test]
fn a_data_descriptor_larger_than_size_max_is_an_io_error() {
    // Larger descriptors would let a request's length outgrow the used element's u32.
    let mut rig = rig(false);
    rig.request(VIRTIO_BLK_T_IN, 0, super::device::SIZE_MAX + 512);
    rig.submit(0);
    rig.run().unwrap();
    assert_eq!(rig.status(), VIRTIO_BLK_S_IOERR);
    rig.request(VIRTIO_BLK_T_IN, 0, super::device::SIZE_MAX);
    rig.submit(0);
    rig.run().unwrap();
    assert_eq!(rig.status(), VIRTIO_BLK_S_OK, "size_max itself is fine");
}

#[test]
fn a_head_may_be_offered_again_only_once_its_used_element_is_published() {
    let config = QueueConfig { size: SIZE, desc: DESC, avail: AVAIL, used: USED };
    for publish in [false, true] {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
        let offer = |idx: u16, head: u16| {
            mem.write_obj(head, GuestAddress(AVAIL + 4 + 2 * ((idx - 1) % SIZE) as u64)).unwrap();
            mem.write_obj(idx, GuestAddress(AVAIL + 2)).unwrap();
        };
        let mut queue = Queue::new(&mem, config, false).unwrap();
        offer(1, 5);
        assert_eq!(queue.pop_avail(), Ok(Some(5)));
        queue.add_used(5, 0);
        if publish {
            queue.publish_used();
        }
        offer(2, 5);
        let expected = if publish { Ok(Some(5)) } else { Err(QueueError::HeadInUse(5)) };
        assert_eq!(queue.pop_avail(), expected, "published: {publish}");
    }
}

const TABLE: u64 = 0x9000;

/// A rig whose driver negotiated indirect descriptors.
fn indirect_rig() -> Rig {
    indirect_rig_of_size(SIZE)
}

/// As `indirect_rig`, on a queue of `size` descriptors.
fn indirect_rig_of_size(size: u16) -> Rig {
    let mut rig = rig_of_size(false, size);
    let queue = Queue::new(&rig.mem, QueueConfig { size, desc: DESC, avail: AVAIL, used: USED }, false)
        .unwrap()
        .with_indirect_descriptors(true);
    let path = tempfile::Builder::new().tempfile_in("/dev/shm").unwrap().into_temp_path();
    let disk = RamDisk::create(&path, DISK).unwrap();
    let info = DiskInfo { capacity: DISK, read_only: false, id: [0; 20], ..DiskInfo::default() };
    rig.worker = BlockWorker::new(queue, Box::new(disk), info, signals(rig.needs_reset.clone()));
    rig._disk = path;
    rig
}

impl Rig {
    /// Descriptor `index` of the indirect table at TABLE.
    fn table_desc(&self, index: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let at = TABLE + 16 * index as u64;
        self.mem.write_obj(addr, GuestAddress(at)).unwrap();
        self.mem.write_obj(len, GuestAddress(at + 8)).unwrap();
        self.mem.write_obj(flags, GuestAddress(at + 12)).unwrap();
        self.mem.write_obj(next, GuestAddress(at + 14)).unwrap();
    }

    /// A 4 KiB read whose three descriptors are in the indirect table, and ring descriptor 0
    /// pointing to the table's `len` bytes.
    fn indirect_read(&self, len: u32) {
        self.header(VIRTIO_BLK_T_IN, 0);
        self.table_desc(0, HEADER, 16, VIRTQ_DESC_F_NEXT, 1);
        self.table_desc(1, DATA, 4096, VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT, 2);
        self.table_desc(2, STATUS, 1, VIRTQ_DESC_F_WRITE, 0);
        self.desc(0, TABLE, len, VIRTQ_DESC_F_INDIRECT, 0);
    }
}

#[test]
fn a_request_in_an_indirect_table_is_served_when_negotiated() {
    let mut rig = indirect_rig();
    rig.mem.write_slice(&[0x77; 4096], GuestAddress(DATA)).unwrap();
    rig.indirect_read(48);
    rig.submit(0);
    assert_eq!(rig.run(), Ok(1));
    assert_eq!((rig.used_idx(), rig.used_len(0), rig.status()), (1, 4097, VIRTIO_BLK_S_OK));
    assert_eq!(rig.mem.read_obj::<u8>(GuestAddress(DATA)).unwrap(), 0, "the disk's zeros were read");

    // Not negotiated: the driver broke the queue.
    let mut rig = self::rig(false);
    rig.indirect_read(48);
    rig.submit(0);
    assert_eq!(rig.run(), Err(QueueError::UnexpectedIndirect));
}

#[test]
fn malformed_indirect_tables_need_a_reset() {
    type Spoil = fn(&Rig);
    let cases: [(&str, Spoil, QueueError); 7] = [
        ("empty", |r| r.desc(0, TABLE, 0, VIRTQ_DESC_F_INDIRECT, 0), QueueError::BadIndirectTable(0)),
        (
            "not whole descriptors",
            |r| r.desc(0, TABLE, 40, VIRTQ_DESC_F_INDIRECT, 0),
            QueueError::BadIndirectTable(40),
        ),
        (
            "more than 1024 descriptors",
            |r| r.desc(0, TABLE, 16 * (MAX_INDIRECT_DESCRIPTORS + 1), VIRTQ_DESC_F_INDIRECT, 0),
            QueueError::BadIndirectTable(16 * (MAX_INDIRECT_DESCRIPTORS + 1)),
        ),
        (
            "outside guest RAM",
            |r| r.desc(0, MEM as u64 - 16, 48, VIRTQ_DESC_F_INDIRECT, 0),
            QueueError::BadIndirectTable(48),
        ),
        (
            "indirect with next",
            |r| r.desc(0, TABLE, 48, VIRTQ_DESC_F_INDIRECT | VIRTQ_DESC_F_NEXT, 1),
            QueueError::NestedIndirect,
        ),
        ("nested", |r| r.table_desc(1, TABLE, 48, VIRTQ_DESC_F_INDIRECT, 0), QueueError::NestedIndirect),
        (
            "next outside the table",
            |r| r.table_desc(1, DATA, 4096, VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT, 3),
            QueueError::BadDescriptorIndex(3),
        ),
    ];
    for (name, spoil, expected) in cases {
        let mut rig = indirect_rig();
        rig.indirect_read(48);
        spoil(&rig);
        rig.submit(0);
        assert_eq!(rig.run(), Err(expected), "{name}");
    }
    // A loop inside the table.
    let mut rig = indirect_rig();
    rig.indirect_read(48);
    rig.table_desc(2, STATUS, 1, VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT, 0);
    rig.submit(0);
    assert_eq!(rig.run(), Err(QueueError::ChainTooLong));
}

/// Post `n` 4 KiB reads, each its own three-descriptor chain (heads 0, 3, 6, ...).
fn post_reads(rig: &mut Rig, n: u16) {
    rig.header(VIRTIO_BLK_T_IN, 0);
    for i in 0..n {
        let first = 3 * i;
        rig.desc(first, HEADER, 16, VIRTQ_DESC_F_NEXT, first + 1);
        rig.desc(first + 1, DATA, 4096, VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT, first + 2);
        rig.desc(first + 2, STATUS, 1, VIRTQ_DESC_F_WRITE, 0);
        rig.submit(first);
    }
}

/// Run passes while requests wait in the ring; how many requests each took off it.
fn passes_until_drained(rig: &mut Rig) -> Vec<usize> {
    let mut passes = Vec::new();
    while rig.worker.has_pending() {
        passes.push(rig.run().unwrap());
    }
    passes
}

#[test]
fn a_pass_takes_at_most_the_batch_limit_and_leaves_the_rest_pending() {
    let mut rig = rig_of_size(false, 64);
    rig.worker = std::mem::replace(&mut rig.worker, rig_of_size(false, 64).worker).with_batch_limit(4);
    post_reads(&mut rig, 10);
    assert_eq!(passes_until_drained(&mut rig), [4, 4, 2]);
    assert_eq!(rig.used_idx(), 10);
    assert_eq!(rig.worker.counters.completed, 10);
    assert_eq!(rig.worker.counters.bytes, 10 * 4096);
}

/// The device's batch limit (the IOCore's share in the VMM and the daemon) holds for the
/// worker of every queue it starts, a restarted one too.
#[test]
fn a_devices_batch_limit_holds_for_every_queue_it_starts() {
    use super::Block;
    let mut rig = rig_of_size(false, 64);
    let path =
        tempfile::Builder::new().prefix("exitless-batch").tempfile_in("/dev/shm").unwrap().into_temp_path();
    let mut block = Block::new(Box::new(RamDisk::create(&path, DISK).unwrap()), "batch").with_batch_limit(4);
    let queue = || {
        Queue::new(&rig.mem, QueueConfig { size: 64, desc: DESC, avail: AVAIL, used: USED }, false).unwrap()
    };
    let first = block.start_queue(0, queue(), signals(Arc::default())).unwrap();
    block.stop_queue(0, first);
    rig.worker = block.start_queue(0, queue(), signals(Arc::default())).unwrap();
    post_reads(&mut rig, 10);
    assert_eq!(passes_until_drained(&mut rig), [4, 4, 2]);
    assert_eq!(rig.used_idx(), 10);
}

#[test]
fn a_rate_limited_queue_leaves_requests_waiting_in_the_ring_not_failed() {
    use rate_limiter::{Limits, RateLimiter};
    let mut rig = rig_of_size(false, 64);
    let limiter = Arc::new(RateLimiter::new(Limits { iops: Some(5), bandwidth: None }));
    rig.worker =
        std::mem::replace(&mut rig.worker, rig_of_size(false, 64).worker).with_rate_limiter(limiter.clone());
    post_reads(&mut rig, 8);
    assert_eq!(rig.run().unwrap(), 5, "the burst: one second's budget");
    assert!(rig.worker.throttled());
    assert!(rig.worker.has_pending());
    assert_eq!(rig.run().unwrap(), 0, "no token earned yet");
    assert_eq!(rig.used_idx(), 5);
    assert_eq!(rig.worker.counters.io_errors + rig.worker.counters.rejected, 0);
    assert!(limiter.waits() >= 2);
    // 1.2 s later four tokens have come: at least the three waiting requests are served.
    std::thread::sleep(std::time::Duration::from_millis(1200));
    assert_eq!(rig.run().unwrap(), 3);
    assert!(!rig.worker.throttled());
    assert_eq!(rig.used_idx(), 8);
}

/// Where the chains below read into: clear of the header, the table and the written data.
const READBACK: u64 = 0x10_0000;

impl Rig {
    /// A request in an indirect table, as Linux's virtio_blk lays it out: header, one descriptor
    /// per `(address, length)` data segment, status; ring descriptor 0 points to the table.
    fn table_request(&self, kind: u32, sector: u64, segments: &[(u64, u32)]) {
        self.header(kind, sector);
        let data_flags = if kind == VIRTIO_BLK_T_OUT { 0 } else { VIRTQ_DESC_F_WRITE };
        self.table_desc(0, HEADER, 16, VIRTQ_DESC_F_NEXT, 1);
        for (i, &(addr, len)) in segments.iter().enumerate() {
            let index = i as u16 + 1;
            self.table_desc(index, addr, len, data_flags | VIRTQ_DESC_F_NEXT, index + 1);
        }
        let last = segments.len() as u16 + 1;
        self.table_desc(last, STATUS, 1, VIRTQ_DESC_F_WRITE, 0);
        self.desc(0, TABLE, 16 * (u32::from(last) + 1), VIRTQ_DESC_F_INDIRECT, 0);
    }

    /// Submit head 0 and run: the request must finish with `status`, the queue unbroken.
    fn run_expecting(&mut self, status: u8) {
        self.submit(0);
        assert_eq!(self.run(), Ok(1), "the queue is not broken");
        assert_eq!(self.status(), status);
        assert!(!self.needs_reset.load(Ordering::Acquire));
    }
}

/// Linux's virtio_blk with `seg_max` 128 on QEMU's default vhost-user-blk queue of 128: a 512 KiB
/// request of 128 scattered 4 KiB pages takes an indirect table of 130 descriptors, longer than
/// the queue (what `mkfs.ext4` and `blkdiscard -z` send; refused before, which hung the guest).
#[test]
fn a_130_descriptor_indirect_table_on_a_128_entry_queue_is_served() {
    let mut rig = indirect_rig_of_size(128);
    let pages: Vec<(u64, u32)> = (0..128u64).map(|i| (DATA + 4096 * i, 4096)).collect();
    for (i, &(addr, len)) in pages.iter().enumerate() {
        rig.mem.write_slice(&vec![i as u8 + 1; len as usize], GuestAddress(addr)).unwrap();
    }
    rig.table_request(VIRTIO_BLK_T_OUT, 8, &pages);
    rig.run_expecting(VIRTIO_BLK_S_OK);

    // Read it back into 128 other pages, in reverse order of the disk's blocks.
    let back: Vec<(u64, u32)> = (0..128u64).map(|i| (READBACK + 4096 * (127 - i), 4096)).collect();
    rig.table_request(VIRTIO_BLK_T_IN, 8, &back);
    rig.run_expecting(VIRTIO_BLK_S_OK);
    assert_eq!(rig.used_len(1), 128 * 4096 + 1, "a read reports its data plus the status");
    for (block, &(addr, _)) in back.iter().enumerate() {
        let mut page = [0u8; 4096];
        rig.mem.read_slice(&mut page, GuestAddress(addr)).unwrap();
        assert!(page.iter().all(|&b| b == block as u8 + 1), "segment {block} read the wrong data");
    }

    // 128 segments of one sector each: sector j of the request lies in written block j / 8.
    let sectors: Vec<(u64, u32)> = (0..128u64).map(|j| (READBACK + 4096 * j, 512)).collect();
    rig.table_request(VIRTIO_BLK_T_IN, 8, &sectors);
    rig.run_expecting(VIRTIO_BLK_S_OK);
    for (j, &(addr, len)) in sectors.iter().enumerate() {
        let mut sector = vec![0u8; len as usize];
        rig.mem.read_slice(&mut sector, GuestAddress(addr)).unwrap();
        assert!(sector.iter().all(|&b| b == (j / 8) as u8 + 1), "512-byte segment {j}");
    }
    rig.assert_still_serves();
}

#[test]
fn more_data_segments_than_seg_max_are_an_io_error_not_a_broken_queue() {
    const UNTOUCHED: u8 = 0x5a;
    let many = |n: u64| -> Vec<(u64, u32)> { (0..n).map(|i| (DATA + 512 * i, 512)).collect() };
    // In an indirect table: one segment too many, and the largest table there is (1022).
    for n in [129, u64::from(MAX_INDIRECT_DESCRIPTORS) - 2] {
        let mut rig = indirect_rig_of_size(128);
        rig.mem.write_slice(&vec![UNTOUCHED; 512 * n as usize], GuestAddress(DATA)).unwrap();
        rig.table_request(VIRTIO_BLK_T_IN, 0, &many(n));
        rig.run_expecting(VIRTIO_BLK_S_IOERR);
        let mut data = vec![0u8; 512 * n as usize];
        rig.mem.read_slice(&mut data, GuestAddress(DATA)).unwrap();
        assert!(data.iter().all(|&b| b == UNTOUCHED), "{n} segments: the device wrote into the data");
        rig.assert_still_serves();
    }
    // In the ring itself: 131 descriptors on a 256-entry queue.
    let mut rig = rig_of_size(false, 256);
    rig.mem.write_slice(&[UNTOUCHED; 512 * 129], GuestAddress(DATA)).unwrap();
    rig.header(VIRTIO_BLK_T_IN, 0);
    rig.desc(0, HEADER, 16, VIRTQ_DESC_F_NEXT, 1);
    for (i, (addr, len)) in many(129).into_iter().enumerate() {
        let index = i as u16 + 1;
        rig.desc(index, addr, len, VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT, index + 1);
    }
    rig.desc(130, STATUS, 1, VIRTQ_DESC_F_WRITE, 0);
    rig.run_expecting(VIRTIO_BLK_S_IOERR);
    let mut data = [0u8; 512 * 129];
    rig.mem.read_slice(&mut data, GuestAddress(DATA)).unwrap();
    assert!(data.iter().all(|&b| b == UNTOUCHED), "the status went into a data buffer");
    rig.assert_still_serves();
}

/// BLKZEROOUT without WRITE_ZEROES: Linux writes the zero page over and over, one chain naming
/// the same guest page up to 128 times.
#[test]
fn the_same_guest_page_many_times_in_one_chain_is_served() {
    let mut rig = indirect_rig_of_size(128);
    rig.mem.write_slice(&[0xc3; 4096], GuestAddress(DATA)).unwrap();
    rig.table_request(VIRTIO_BLK_T_OUT, 0, &[(DATA, 4096); 128]);
    rig.run_expecting(VIRTIO_BLK_S_OK);
    // The 512 KiB written, read back in pieces of size_max.
    let size_max = super::device::SIZE_MAX;
    let pieces: Vec<(u64, u32)> = (0..128 * 4096 / u64::from(size_max))
        .map(|i| (READBACK + i * u64::from(size_max), size_max))
        .collect();
    rig.table_request(VIRTIO_BLK_T_IN, 0, &pieces);
    rig.run_expecting(VIRTIO_BLK_S_OK);
    let mut back = vec![0u8; 128 * 4096];
    rig.mem.read_slice(&mut back, GuestAddress(READBACK)).unwrap();
    assert!(back.iter().all(|&b| b == 0xc3), "every copy of the page reached the disk");
    // And read into one 512-byte buffer 128 times.
    rig.mem.write_slice(&[0; 512], GuestAddress(DATA)).unwrap();
    rig.table_request(VIRTIO_BLK_T_IN, 0, &[(DATA, 512); 128]);
    rig.run_expecting(VIRTIO_BLK_S_OK);
    assert_eq!(rig.used_len(2), 128 * 512 + 1);
    let mut sector = [0u8; 512];
    rig.mem.read_slice(&mut sector, GuestAddress(DATA)).unwrap();
    assert!(sector.iter().all(|&b| b == 0xc3));
    rig.assert_still_serves();
}

/// SeaBIOS's virtio-blk driver splits its reads by `size_max * seg_max / blk_size` sectors held
/// in 16 bits: the product must be a sector count above 0 there, or it reads with a zero-length
/// buffer and cannot boot from the disk (as with a size_max of 1 MiB: 2^18 sectors, 0).
#[test]
fn size_max_times_seg_max_fits_seabios_16_bit_sector_count() {
    use super::Block;
    use crate::device::VirtioDevice;
    let path = tempfile::Builder::new().tempfile_in("/dev/shm").unwrap().into_temp_path();
    let block = Block::new(Box::new(RamDisk::create(&path, DISK).unwrap()), "seabios");
    let word = |at: usize| {
        let mut bytes = [0u8; 4];
        block.read_config(at as u64, &mut bytes);
        u32::from_le_bytes(bytes)
    };
    let (size_max, seg_max, blk_size) = (word(8), word(12), word(20));
    let sectors = u64::from(size_max) * u64::from(seg_max) / u64::from(blk_size);
    assert!((1..1 << 16).contains(&sectors), "{size_max} x {seg_max} / {blk_size} = {sectors}");
}

/// One 16-byte DISCARD / WRITE_ZEROES range.
fn range(sector: u64, sectors: u32, flags: u32) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes[0..8].copy_from_slice(&sector.to_le_bytes());
    bytes[8..12].copy_from_slice(&sectors.to_le_bytes());
    bytes[12..16].copy_from_slice(&flags.to_le_bytes());
    bytes
}

impl Rig {
    /// A DISCARD or WRITE_ZEROES at descriptors 0, 1, 2 whose payload is `payload` (a
    /// device-readable descriptor), served; returns the status.
    fn range_request(&mut self, kind: u32, payload: &[u8]) -> u8 {
        self.header(kind, 0);
        self.mem.write_slice(payload, GuestAddress(DATA)).unwrap();
        self.desc(0, HEADER, 16, VIRTQ_DESC_F_NEXT, 1);
        self.desc(1, DATA, payload.len() as u32, VIRTQ_DESC_F_NEXT, 2);
        self.desc(2, STATUS, 1, VIRTQ_DESC_F_WRITE, 0);
        self.submit(0);
        self.run().unwrap();
        self.status()
    }

    /// Write `fill` over the disk's first 64 KiB.
    fn fill_start(&mut self, fill: u8) {
        self.mem.write_slice(&[fill; 65536], GuestAddress(DATA + 0x1000)).unwrap();
        self.header(VIRTIO_BLK_T_OUT, 0);
        self.desc(0, HEADER, 16, VIRTQ_DESC_F_NEXT, 1);
        self.desc(1, DATA + 0x1000, 65536, VIRTQ_DESC_F_NEXT, 2);
        self.desc(2, STATUS, 1, VIRTQ_DESC_F_WRITE, 0);
        self.submit(0);
        self.run().unwrap();
        assert_eq!(self.status(), VIRTIO_BLK_S_OK);
    }

    /// The disk's first 64 KiB, read through the device.
    fn read_start(&mut self) -> Vec<u8> {
        self.mem.write_slice(&[0xee; 65536], GuestAddress(DATA + 0x1000)).unwrap();
        self.header(VIRTIO_BLK_T_IN, 0);
        self.desc(0, HEADER, 16, VIRTQ_DESC_F_NEXT, 1);
        self.desc(1, DATA + 0x1000, 65536, VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT, 2);
        self.desc(2, STATUS, 1, VIRTQ_DESC_F_WRITE, 0);
        self.submit(0);
        self.run().unwrap();
        assert_eq!(self.status(), VIRTIO_BLK_S_OK);
        let mut back = vec![0u8; 65536];
        self.mem.read_slice(&mut back, GuestAddress(DATA + 0x1000)).unwrap();
        back
    }
}

#[test]
fn write_zeroes_and_discard_zero_exactly_their_range() {
    let mut rig = rig(false);
    rig.fill_start(0x5a);
    let used = rig.used_idx();
    let status = rig.range_request(VIRTIO_BLK_T_WRITE_ZEROES, &range(8, 8, 0));
    assert_eq!(status, VIRTIO_BLK_S_OK);
    assert_eq!(rig.used_len(used % SIZE), 1, "only the status is written");
    assert_eq!(
        rig.range_request(VIRTIO_BLK_T_WRITE_ZEROES, &range(32, 1, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP)),
        0
    );
    assert_eq!(rig.range_request(VIRTIO_BLK_T_DISCARD, &range(64, 16, 0)), VIRTIO_BLK_S_OK);
    let back = rig.read_start();
    for (at, &byte) in back.iter().enumerate() {
        let zeroed =
            (4096..8192).contains(&at) || (16384..16896).contains(&at) || (32768..40960).contains(&at);
        assert_eq!(byte, if zeroed { 0 } else { 0x5a }, "byte {at}");
    }
    // A range of no sectors does nothing, as in QEMU; the last sector of the disk is in range.
    assert_eq!(rig.range_request(VIRTIO_BLK_T_DISCARD, &range(0, 0, 0)), VIRTIO_BLK_S_OK);
    assert_eq!(rig.range_request(VIRTIO_BLK_T_WRITE_ZEROES, &range(DISK / 512 - 1, 1, 0)), VIRTIO_BLK_S_OK);
    assert_eq!(rig.range_request(VIRTIO_BLK_T_DISCARD, &range(0, (DISK / 512) as u32, 0)), VIRTIO_BLK_S_OK);
    assert!(rig.read_start().iter().all(|&b| b == 0), "the whole disk discarded");
    assert_eq!(rig.worker.counters.rejected, 0);
    assert_eq!(rig.worker.counters.bytes, 3 * 65536, "ranges move no data");
}

#[test]
fn range_flags_other_than_unmap_on_write_zeroes_are_unsupported() {
    let mut rig = rig(false);
    rig.fill_start(0x5a);
    for (kind, flags) in [
        (VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP),
        (VIRTIO_BLK_T_DISCARD, 2),
        (VIRTIO_BLK_T_WRITE_ZEROES, 2),
        (VIRTIO_BLK_T_WRITE_ZEROES, 3),
        (VIRTIO_BLK_T_WRITE_ZEROES, 1 << 31),
        (VIRTIO_BLK_T_DISCARD, u32::MAX),
    ] {
        let status = rig.range_request(kind, &range(0, 8, flags));
        assert_eq!(status, VIRTIO_BLK_S_UNSUPP, "type {kind} flags {flags:#x}");
    }
    assert!(rig.read_start().iter().all(|&b| b == 0x5a), "nothing was zeroed");
    rig.assert_still_serves();
}

#[test]
fn range_payloads_that_are_not_one_whole_range_are_io_errors() {
    let mut rig = rig(false);
    rig.fill_start(0x5a);
    let one = range(0, 8, 0);
    let mut two = one.to_vec();
    two.extend_from_slice(&range(16, 8, 0));
    for kind in [VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_WRITE_ZEROES] {
        for payload in [&one[..15], &one[..1], &[one.as_slice(), &[0]].concat()[..], &two[..]] {
            let status = rig.range_request(kind, payload);
            assert_eq!(status, VIRTIO_BLK_S_IOERR, "type {kind}, {} bytes", payload.len());
        }
        // No payload at all: header and status only.
        rig.header(kind, 0);
        rig.desc(0, HEADER, 16, VIRTQ_DESC_F_NEXT, 2);
        rig.submit(0);
        rig.run().unwrap();
        assert_eq!(rig.status(), VIRTIO_BLK_S_IOERR);
        // The range in a device-writable descriptor.
        rig.mem.write_slice(&one, GuestAddress(DATA)).unwrap();
        rig.header(kind, 0);
        rig.desc(0, HEADER, 16, VIRTQ_DESC_F_NEXT, 1);
        rig.desc(1, DATA, 16, VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT, 2);
        rig.submit(0);
        rig.run().unwrap();
        assert_eq!(rig.status(), VIRTIO_BLK_S_IOERR);
    }
    assert!(rig.read_start().iter().all(|&b| b == 0x5a), "nothing was zeroed");
    // One range split over two descriptors is one range.
    rig.mem.write_slice(&range(8, 8, 0), GuestAddress(DATA)).unwrap();
    rig.header(VIRTIO_BLK_T_WRITE_ZEROES, 0);
    rig.desc(0, HEADER, 16, VIRTQ_DESC_F_NEXT, 1);
    rig.desc(1, DATA, 5, VIRTQ_DESC_F_NEXT, 3);
    rig.desc(3, DATA + 5, 11, VIRTQ_DESC_F_NEXT, 2);
    rig.desc(2, STATUS, 1, VIRTQ_DESC_F_WRITE, 0);
    rig.submit(0);
    rig.run().unwrap();
    assert_eq!(rig.status(), VIRTIO_BLK_S_OK);
    assert!(rig.read_start()[4096..8192].iter().all(|&b| b == 0));
}

#[test]
fn ranges_beyond_the_disk_or_the_maximum_are_io_errors() {
    let mut rig = rig(false);
    rig.fill_start(0x5a);
    let sectors = DISK / 512;
    for kind in [VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_WRITE_ZEROES] {
        for (sector, count) in [
            (sectors, 1),
            (sectors - 1, 2),
            (u64::MAX, 1),
            (u64::MAX / 512 + 1, 1),
            (u64::MAX - 7, 8),
            (0, MAX_RANGE_SECTORS + 1),
            (0, u32::MAX),
        ] {
            let status = rig.range_request(kind, &range(sector, count, 0));
            assert_eq!(status, VIRTIO_BLK_S_IOERR, "type {kind}, sector {sector}, {count} sectors");
        }
    }
    assert!(rig.read_start().iter().all(|&b| b == 0x5a), "nothing was zeroed");
    rig.assert_still_serves();
}

#[test]
fn a_read_only_disk_refuses_ranges_with_io_errors() {
    let mut rig = rig(true);
    for kind in [VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_WRITE_ZEROES] {
        assert_eq!(rig.range_request(kind, &range(0, 8, 0)), VIRTIO_BLK_S_IOERR, "type {kind}");
    }
}

#[test]
fn ranges_the_driver_did_not_negotiate_are_unsupported() {
    use super::{Block, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_WRITE_ZEROES};
    use crate::device::VirtioDevice;
    let path =
        tempfile::Builder::new().prefix("exitless-wz-test").tempfile_in("/dev/shm").unwrap().into_temp_path();
    let mut block = Block::new(Box::new(RamDisk::create(&path, DISK).unwrap()), "neg");
    let offered = block.features();
    assert_ne!(offered & 1 << VIRTIO_BLK_F_DISCARD, 0);
    let mut rig = rig(false);
    let queue = Queue::new(&rig.mem, QueueConfig { size: SIZE, desc: DESC, avail: AVAIL, used: USED }, false)
        .unwrap();
    // The driver takes WRITE_ZEROES but not DISCARD.
    let without_discard = offered & !(1 << VIRTIO_BLK_F_DISCARD);
    assert_ne!(without_discard & 1 << VIRTIO_BLK_F_WRITE_ZEROES, 0);
    let worker = block.activate(
        &rig.mem.clone(),
        vec![Some(queue)],
        without_discard,
        signals(rig.needs_reset.clone()),
    );
    let Some(crate::Worker::Block(worker)) = worker.unwrap().remove(0) else { panic!("a block worker") };
    rig.worker = *worker;
    assert_eq!(rig.range_request(VIRTIO_BLK_T_DISCARD, &range(0, 8, 0)), VIRTIO_BLK_S_UNSUPP);
    assert_eq!(rig.range_request(VIRTIO_BLK_T_WRITE_ZEROES, &range(0, 8, 0)), VIRTIO_BLK_S_OK);
}

#[test]
fn the_configuration_space_describes_ranges_and_topology() {
    use super::{Block, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_TOPOLOGY, VIRTIO_BLK_F_WRITE_ZEROES};
    use crate::device::VirtioDevice;
    let path = tempfile::Builder::new()
        .prefix("exitless-cfg-test")
        .tempfile_in("/dev/shm")
        .unwrap()
        .into_temp_path();
    let block = Block::new(Box::new(RamDisk::create(&path, DISK).unwrap()), "serial-no-1");
    let features = block.features();
    for bit in [VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_WRITE_ZEROES, VIRTIO_BLK_F_TOPOLOGY] {
        assert_ne!(features & 1 << bit, 0, "feature {bit}");
    }
    let mut config = [0u8; 60];
    block.read_config(0, &mut config);
    let u32_at = |at: usize| u32::from_le_bytes(config[at..at + 4].try_into().unwrap());
    assert_eq!(
        (config[24], config[25], u16::from_le_bytes([config[26], config[27]]), u32_at(28)),
        (0, 0, 1, 0)
    );
    assert_eq!((u32_at(36), u32_at(40), u32_at(44)), (MAX_RANGE_SECTORS, 1, 1));
    assert_eq!((u32_at(48), u32_at(52), config[56]), (MAX_RANGE_SECTORS, 1, 1));
    // A file on ext4: 4 KiB blocks, 8 sectors each.
    let file = tempfile::NamedTempFile::new_in("/tmp").unwrap();
    file.as_file().set_len(1 << 20).unwrap();
    let disk = storage::FileDisk::open(file.path(), false, false).unwrap();
    let block = Block::new(Box::new(disk), "f");
    block.read_config(0, &mut config);
    let u32_at = |at: usize| u32::from_le_bytes(config[at..at + 4].try_into().unwrap());
    assert_eq!((config[24], u16::from_le_bytes([config[26], config[27]]), u32_at(44)), (3, 8, 8));
    // Read-only: neither range request is offered.
    drop(block);
    let block = Block::new(Box::new(RamDisk::open(&path, true).unwrap()), "ro");
    assert_eq!(block.features() & (1 << VIRTIO_BLK_F_DISCARD | 1 << VIRTIO_BLK_F_WRITE_ZEROES), 0);
}

/// A RAM disk that records the cache mode its worker last gave it.
struct ModeRecorder {
    disk: RamDisk,
    write_through: Arc<AtomicBool>,
}

impl storage::Backend for ModeRecorder {
    fn capacity(&self) -> u64 {
        self.disk.capacity()
    }
    fn read_only(&self) -> bool {
        false
    }
    fn max_in_flight(&self) -> usize {
        self.disk.max_in_flight()
    }
    fn submit(&mut self, tag: u32, op: storage::Op, offset: u64, segments: &[storage::Segment]) -> bool {
        self.disk.submit(tag, op, offset, segments)
    }
    fn poll(&mut self, done: &mut dyn FnMut(storage::Completion)) -> usize {
        self.disk.poll(done)
    }
    fn set_write_through(&mut self, write_through: bool) {
        self.write_through.store(write_through, Ordering::SeqCst);
    }
}

#[test]
fn the_driver_switches_the_cache_mode_through_writeback_and_the_backend_follows() {
    use super::{Block, VIRTIO_BLK_F_CONFIG_WCE};
    use crate::device::VirtioDevice;
    let path = tempfile::Builder::new()
        .prefix("exitless-wce-test")
        .tempfile_in("/dev/shm")
        .unwrap()
        .into_temp_path();
    let recorded = Arc::new(AtomicBool::new(true));
    let backend =
        ModeRecorder { disk: RamDisk::create(&path, DISK).unwrap(), write_through: recorded.clone() };
    let writeback = |block: &Block| {
        let mut byte = [0xffu8];
        block.read_config(32, &mut byte);
        byte[0]
    };
    // Without the switch offered (the vhost-user daemon's disks) the byte is the device's.
    let mut fixed = Block::new(Box::new(RamDisk::create(&path, DISK).unwrap()), "fixed");
    assert_eq!(fixed.features() & 1 << VIRTIO_BLK_F_CONFIG_WCE, 0);
    fixed.write_config(32, &[0]);
    assert_eq!(writeback(&fixed), 1, "write back, not the driver's to change");

    let mut block = Block::new(Box::new(backend), "wce").with_writeback_switch();
    assert_ne!(block.features() & 1 << VIRTIO_BLK_F_CONFIG_WCE, 0);
    assert_eq!(writeback(&block), 1, "write back at first");
    let rig = rig(false);
    let queue = Queue::new(&rig.mem, QueueConfig { size: SIZE, desc: DESC, avail: AVAIL, used: USED }, false)
        .unwrap();
    let mut workers = block
        .activate(&rig.mem.clone(), vec![Some(queue)], block.features(), signals(Arc::default()))
        .unwrap();
    let mut worker = workers.remove(0).unwrap();
    assert!(!recorded.load(Ordering::SeqCst), "the worker told the backend: write back");
    // Hostile or misplaced writes change nothing: other offsets, wider writes, the capacity.
    for (offset, data) in
        [(32, &[0u8, 0, 0, 0][..]), (33, &[0]), (31, &[0, 0]), (0, &[0; 8]), (u64::MAX, &[0])]
    {
        block.write_config(offset, data);
        assert_eq!(writeback(&block), 1, "a write of {} bytes at {offset}", data.len());
    }
    let mut capacity = [0u8; 8];
    block.read_config(0, &mut capacity);
    assert_eq!(u64::from_le_bytes(capacity), DISK / 512);
    block.write_config(32, &[0]);
    assert_eq!(writeback(&block), 0);
    worker.poll();
    assert!(recorded.load(Ordering::SeqCst), "the next pass switched the backend to write through");
    block.write_config(32, &[7]);
    assert_eq!(writeback(&block), 1, "any non-zero value writes back");
    worker.poll();
    assert!(!recorded.load(Ordering::SeqCst));
    block.write_config(32, &[0]);
    // A reset returns to write back.
    block.deactivate(vec![Some(worker)]);
    assert_eq!(writeback(&block), 1);
}
