//! FileDisk against real files and a real io_uring: /tmp is ext4 here (O_DIRECT works), /dev/shm
//! is tmpfs.

use std::alloc::Layout;
use std::collections::BTreeSet;
use std::path::Path;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use super::*;

/// A zeroed heap buffer with the alignment O_DIRECT needs.
struct AlignedBuffer {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl AlignedBuffer {
    fn new(len: usize, align: usize) -> AlignedBuffer {
        let layout = Layout::from_size_align(len, align).unwrap();
        // SAFETY: `layout` has a non-zero size (every test asks for at least one sector).
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }).expect("out of memory");
        AlignedBuffer { ptr, layout }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is a live allocation of `layout.size()` initialised (zeroed) bytes, and
        // `&mut self` makes this the only reference to them.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this very layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

fn segment(buf: &mut [u8]) -> Segment {
    // SAFETY: every test keeps `buf` alive and untouched until its requests complete or the
    // disk is dropped.
    unsafe { Segment::new(buf.as_mut_ptr(), buf.len() as u32) }
}

/// A disk image of `size` zero bytes in `dir`, removed when dropped.
fn image(dir: &str, size: u64) -> tempfile::TempPath {
    let file = tempfile::Builder::new().prefix("exitless-file-test").tempfile_in(dir).unwrap();
    file.as_file().set_len(size).unwrap();
    file.into_temp_path()
}

/// Kick, then poll until `count` completions arrived (failing after 10 s rather than hanging).
fn wait_for(disk: &mut FileDisk, count: usize) -> Vec<Completion> {
    disk.kick();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut all = Vec::new();
    while all.len() < count {
        disk.poll(&mut |c| all.push(c));
        assert!(Instant::now() < deadline, "only {} of {count} completions arrived", all.len());
        std::thread::sleep(Duration::from_micros(50));
    }
    assert_eq!(all.len(), count, "more completions than requests");
    all
}

fn round_trip(path: &Path, disk: &mut FileDisk, buffers: &mut [AlignedBuffer], offset: u64) {
    let total: usize = buffers.iter().map(|b| b.layout.size()).sum();
    for (i, buffer) in buffers.iter_mut().enumerate() {
        buffer.bytes().fill(0x10 + i as u8);
    }
    let written: Vec<Segment> = buffers.iter_mut().map(|b| segment(b.bytes())).collect();
    assert!(disk.submit(1, Op::Write, offset, &written));
    assert_eq!(wait_for(disk, 1), vec![Completion { tag: 1, result: Ok(total as u32) }]);

    let file = std::fs::read(path).unwrap();
    let mut at = offset as usize;
    for (i, buffer) in buffers.iter().enumerate() {
        let end = at + buffer.layout.size();
        assert!(file[at..end].iter().all(|&x| x == 0x10 + i as u8), "segment {i} not in the file");
        at = end;
    }

    for buffer in buffers.iter_mut() {
        buffer.bytes().fill(0);
    }
    let read: Vec<Segment> = buffers.iter_mut().map(|b| segment(b.bytes())).collect();
    assert!(disk.submit(2, Op::Read, offset, &read));
    assert_eq!(wait_for(disk, 1), vec![Completion { tag: 2, result: Ok(total as u32) }]);
    for (i, buffer) in buffers.iter_mut().enumerate() {
        assert!(buffer.bytes().iter().all(|&x| x == 0x10 + i as u8), "segment {i} read back wrong");
    }
}

#[test]
fn buffered_round_trip_with_segments_of_different_sizes() {
    let path = image("/tmp", 1 << 20);
    let mut disk = FileDisk::open(&path, false, false).unwrap();
    assert_eq!((disk.capacity(), disk.read_only(), disk.direct()), (1 << 20, false, false));
    let mut buffers = [AlignedBuffer::new(512, 8), AlignedBuffer::new(1536, 8), AlignedBuffer::new(4096, 8)];
    round_trip(&path, &mut disk, &mut buffers, 8192 + 512);
}

#[test]
fn direct_io_on_ext4_with_aligned_buffers() {
    let path = image("/tmp", 1 << 20);
    let mut disk = FileDisk::open(&path, false, true).unwrap();
    assert!(disk.direct(), "ext4 supports O_DIRECT");
    let mut buffers = [AlignedBuffer::new(4096, 4096), AlignedBuffer::new(8192, 4096)];
    round_trip(&path, &mut disk, &mut buffers, 64 << 10);
    assert!(disk.submit(3, Op::Flush, 0, &[]));
    assert_eq!(wait_for(&mut disk, 1), vec![Completion { tag: 3, result: Ok(0) }]);
}

#[test]
fn direct_io_on_dev_shm_works_either_way() {
    // tmpfs refused O_DIRECT before Linux 6.6 (we fall back) and accepts it since.
    let path = image("/dev/shm", 1 << 20);
    let mut disk = FileDisk::open(&path, false, true).unwrap();
    let mut buffers = [AlignedBuffer::new(4096, 4096), AlignedBuffer::new(4096, 4096)];
    round_trip(&path, &mut disk, &mut buffers, 4096);
}

#[test]
fn falls_back_to_buffered_io_where_o_direct_is_refused() {
    // sysfs attributes are regular files of 4096 bytes whose file system has no O_DIRECT.
    let candidates = ["/sys/kernel/mm/transparent_hugepage/enabled", "/sys/kernel/uevent_seqnum"];
    let Some(path) = candidates.iter().find(|p| Path::new(p).exists()) else {
        panic!("this test needs sysfs mounted on /sys: neither of {candidates:?} exists");
    };
    let mut disk = FileDisk::open(path, true, true).unwrap();
    assert!(!disk.direct(), "{path} accepted O_DIRECT");
    let mut buf = [0u8; 512];
    assert!(disk.submit(5, Op::Read, 0, &[segment(&mut buf)]));
    // The attribute's text is shorter than a sector: the read is short, but it completes.
    let done = wait_for(&mut disk, 1);
    assert_eq!(done[0].tag, 5);
    assert!(matches!(done[0].result, Err(IoError::Short) | Ok(512)), "{:?}", done[0].result);
}

#[test]
fn flush_completes() {
    let path = image("/tmp", 4096);
    let mut disk = FileDisk::open(&path, false, false).unwrap();
    let mut data = [0xa5u8; 512];
    assert!(disk.submit(1, Op::Write, 0, &[segment(&mut data)]));
    assert!(disk.submit(2, Op::Flush, 0, &[]));
    let mut done = wait_for(&mut disk, 2);
    done.sort_by_key(|c| c.tag);
    let expected = vec![Completion { tag: 1, result: Ok(512) }, Completion { tag: 2, result: Ok(0) }];
    assert_eq!(done, expected);
}

/// Write one block at `offset` and wait for it.
fn write_block(disk: &mut FileDisk, tag: u32, offset: u64) {
    let mut data = [0x3cu8; 512];
    assert!(disk.submit(tag, Op::Write, offset, &[segment(&mut data)]));
    assert_eq!(wait_for(disk, 1), [Completion { tag, result: Ok(512) }]);
}

/// Submit FLUSHes tagged `tags` back to back, then wait for them all: every one succeeds.
fn flush_all(disk: &mut FileDisk, tags: std::ops::Range<u32>) {
    for tag in tags.clone() {
        assert!(disk.submit(tag, Op::Flush, 0, &[]));
    }
    let mut done = wait_for(disk, tags.len());
    done.sort_by_key(|c| c.tag);
    assert_eq!(done, tags.map(|tag| Completion { tag, result: Ok(0) }).collect::<Vec<_>>());
}

#[test]
fn flushes_share_one_fdatasync_and_skip_it_when_nothing_was_written_since() {
    let path = image("/var/tmp", 1 << 20);
    let mut disk = FileDisk::open(&path, false, false).unwrap();
    // The first FLUSH syncs, written to or not: an earlier process may have left writes.
    flush_all(&mut disk, 1..2);
    assert_eq!(disk.fdatasyncs(), 1);
    write_block(&mut disk, 2, 0);
    // Eight at once: the first starts an fdatasync, the others wait for it, which covers them.
    flush_all(&mut disk, 10..18);
    assert_eq!(disk.fdatasyncs(), 2);
    flush_all(&mut disk, 20..22);
    assert_eq!(disk.fdatasyncs(), 2, "nothing was written since: durable already");
    write_block(&mut disk, 3, 4096);
    flush_all(&mut disk, 30..31);
    assert_eq!(disk.fdatasyncs(), 3, "a write completed since the last fdatasync");
}

#[test]
fn a_flush_on_one_queue_covers_writes_completed_on_another() {
    let path = image("/var/tmp", 1 << 20);
    let mut queues = FileDisk::open_queues(&path, FileDiskOptions::default(), 2).unwrap();
    let (first, second) = queues.split_at_mut(1);
    let (one, other) = (&mut first[0], &mut second[0]);
    flush_all(one, 1..2);
    flush_all(other, 2..3);
    write_block(one, 3, 0);
    flush_all(other, 4..5);
    assert_eq!(other.fdatasyncs(), 2, "the other queue's write needs an fdatasync here too");
    flush_all(other, 5..6);
    assert_eq!(other.fdatasyncs(), 2);
    // A backend reopened after a reset counts the same writes, and syncs at its first FLUSH.
    let mut reopened = other.reopen().unwrap();
    assert!(reopened.submit(6, Op::Flush, 0, &[]));
    reopened.kick();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut done = Vec::new();
    while done.is_empty() {
        reopened.poll(&mut |c| done.push(c));
        assert!(Instant::now() < deadline);
    }
    assert_eq!(done, [Completion { tag: 6, result: Ok(0) }]);
}

#[test]
fn flushes_waiting_for_an_fdatasync_end_with_a_cancel_or_a_drop() {
    let path = image("/var/tmp", 1 << 20);
    let mut disk = FileDisk::open(&path, false, false).unwrap();
    for tag in 1..5 {
        assert!(disk.submit(tag, Op::Flush, 0, &[]));
    }
    assert_eq!(disk.cancel_all(), 4, "the running fdatasync and the three waiting for it");
    let done = wait_for(&mut disk, 4);
    let cancelled = Err(IoError::Errno(libc::ECANCELED));
    // The fdatasync itself may have finished before the cancel reached it.
    assert!(done.iter().all(|c| c.result == cancelled || c.tag == 1), "{done:?}");
    assert!(done.iter().filter(|c| c.result == cancelled).count() >= 3, "{done:?}");
    for tag in 10..14 {
        assert!(disk.submit(tag, Op::Flush, 0, &[]));
    }
    drop(disk); // Returns: the waiting FLUSHes hold nothing the kernel has.
}

#[test]
fn out_of_range_and_malformed_requests_fail_through_completions() {
    let path = image("/tmp", 4096);
    let mut disk = FileDisk::open(&path, false, false).unwrap();
    let mut buf = [0u8; 512];
    // SAFETY: never dereferenced: the range check refuses it first (what this checks).
    let lie = unsafe { Segment::new(std::ptr::null_mut(), u32::MAX) };
    let many = vec![segment(&mut buf[..1]); MAX_SEGMENTS + 1];
    let requests: [(u64, &[Segment]); 6] = [
        (4096, &[segment(&mut buf)]),
        (3800, &[segment(&mut buf)]),
        (u64::MAX - 10, &[segment(&mut buf)]),
        (u64::MAX, &[segment(&mut buf)]),
        (0, &[lie, lie]),
        (0, &many),
    ];
    for (tag, (offset, segments)) in requests.iter().enumerate() {
        assert!(disk.submit(tag as u32, Op::Read, *offset, segments));
    }
    let done = wait_for(&mut disk, requests.len());
    for (tag, completion) in done.iter().enumerate() {
        assert_eq!(*completion, Completion { tag: tag as u32, result: Err(IoError::OutOfRange) });
    }
    // Empty requests complete without the kernel; empty segments are skipped.
    let empty = Segment::EMPTY;
    assert!(disk.submit(10, Op::Read, 4096, &[]));
    assert!(disk.submit(11, Op::Write, 0, &[empty, segment(&mut buf), empty]));
    let mut done = wait_for(&mut disk, 2);
    done.sort_by_key(|c| c.tag);
    assert_eq!(done, vec![Completion { tag: 10, result: Ok(0) }, Completion { tag: 11, result: Ok(512) }]);
}

#[test]
fn read_only_disk_rejects_writes() {
    let path = image("/tmp", 4096);
    std::fs::write(&path, [7u8; 4096]).unwrap();
    let mut disk = FileDisk::open(&path, true, false).unwrap();
    assert!(disk.read_only());
    let mut buf = [0u8; 1024];
    assert!(disk.submit(1, Op::Write, 0, &[segment(&mut buf)]));
    assert!(disk.submit(2, Op::Read, 1024, &[segment(&mut buf)]));
    let mut done = wait_for(&mut disk, 2);
    done.sort_by_key(|c| c.tag);
    let expected =
        vec![Completion { tag: 1, result: Err(IoError::ReadOnly) }, Completion { tag: 2, result: Ok(1024) }];
    assert_eq!(done, expected);
    assert!(buf.iter().all(|&x| x == 7));
    assert!(std::fs::read(&path).unwrap().iter().all(|&x| x == 7));
}

#[test]
fn many_requests_in_flight_complete_with_their_tags() {
    const COUNT: usize = 64;
    let path = image("/tmp", (COUNT * 4096) as u64);
    let mut disk = FileDisk::open(&path, false, false).unwrap();
    let mut buffers: Vec<Vec<u8>> = (0..COUNT).map(|i| vec![i as u8; 4096]).collect();
    for (i, buffer) in buffers.iter_mut().enumerate() {
        assert!(disk.submit(1000 + i as u32, Op::Write, (i * 4096) as u64, &[segment(buffer)]));
    }
    let done = wait_for(&mut disk, COUNT);
    assert!(done.iter().all(|c| c.result == Ok(4096)), "{done:?}");
    let tags: BTreeSet<u32> = done.iter().map(|c| c.tag).collect();
    assert_eq!(tags, (1000..1000 + COUNT as u32).collect());
    let file = std::fs::read(&path).unwrap();
    for (i, block) in file.chunks(4096).enumerate() {
        assert!(block.iter().all(|&x| x == i as u8), "block {i}");
    }
}

#[test]
fn submit_hands_each_pair_of_requests_to_the_kernel_without_a_kick() {
    let path = image("/tmp", 1 << 20);
    std::fs::write(&path, vec![0x5a; 1 << 20]).unwrap();
    // Declared before the disk, so a failed assertion drops the disk (which waits for the kernel)
    // before the buffers the kernel reads into.
    let mut buffers =
        [AlignedBuffer::new(4096, 4096), AlignedBuffer::new(4096, 4096), AlignedBuffer::new(4096, 4096)];
    let mut disk = FileDisk::open(&path, false, true).unwrap();
    let [first, second, third] = &mut buffers;
    assert!(disk.submit(1, Op::Read, 0, &[segment(first.bytes())]));
    assert_eq!(disk.ring.submission().len(), 1, "a lone request waits for a partner or a kick");
    assert!(disk.submit(2, Op::Read, 8192, &[segment(second.bytes())]));
    assert!(disk.ring.submission().is_empty(), "a pair is the kernel's at once");
    assert!(disk.submit(3, Op::Read, 16384, &[segment(third.bytes())]));
    // Polling alone (no kick) sees the pair through; the third still waits for its kick.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut done = Vec::new();
    while done.len() < 2 {
        disk.poll(&mut |c| done.push(c));
        assert!(Instant::now() < deadline, "the pair never completed: {done:?}");
        std::thread::sleep(Duration::from_micros(50));
    }
    done.sort_by_key(|c| c.tag);
    assert_eq!(done, [1, 2].map(|tag| Completion { tag, result: Ok(4096) }));
    assert_eq!(disk.ring.submission().len(), 1);
    assert_eq!(wait_for(&mut disk, 1), vec![Completion { tag: 3, result: Ok(4096) }]);
    assert!(buffers.iter_mut().all(|b| b.bytes().iter().all(|&x| x == 0x5a)));
}

#[test]
fn buffered_files_hand_their_requests_over_on_the_kick_alone() {
    let path = image("/tmp", 1 << 20);
    let mut buffers = [[0u8; 4096]; 3];
    let mut disk = FileDisk::open(&path, false, false).unwrap();
    for (i, buffer) in buffers.iter_mut().enumerate() {
        assert!(disk.submit(i as u32, Op::Read, (i * 4096) as u64, &[segment(buffer)]));
    }
    assert_eq!(disk.ring.submission().len(), 3, "queued until the kick");
    assert_eq!(wait_for(&mut disk, 3).len(), 3);
}

#[test]
fn submit_refuses_beyond_max_in_flight() {
    let path = image("/tmp", 64 << 10);
    let options = FileDiskOptions { max_in_flight: 4, ..FileDiskOptions::default() };
    let mut disk = FileDisk::open_with(&path, options).unwrap();
    assert_eq!(disk.max_in_flight(), 4);
    let mut buffers = vec![[0u8; 512]; 5];
    // Kernel requests and immediately failed ones count alike.
    for (i, buffer) in buffers.iter_mut().take(3).enumerate() {
        assert!(disk.submit(i as u32, Op::Read, (i * 512) as u64, &[segment(buffer)]));
    }
    assert!(disk.submit(3, Op::Read, 1 << 40, &[segment(&mut buffers[3])]));
    assert!(!disk.submit(4, Op::Read, 0, &[segment(&mut buffers[4])]), "full");
    disk.kick();
    assert!(!disk.submit(4, Op::Read, 0, &[segment(&mut buffers[4])]), "still full until polled");
    let mut done = wait_for(&mut disk, 4);
    done.sort_by_key(|c| c.tag);
    assert_eq!(done[3], Completion { tag: 3, result: Err(IoError::OutOfRange) });
    assert!(done[..3].iter().all(|c| c.result == Ok(512)));
    assert!(disk.submit(4, Op::Read, 0, &[segment(&mut buffers[4])]));
    assert_eq!(wait_for(&mut disk, 1), vec![Completion { tag: 4, result: Ok(512) }]);
}

#[test]
fn io_on_a_file_truncated_underneath_fails_cleanly() {
    let path = image("/tmp", 64 << 10);
    let mut disk = FileDisk::open(&path, false, false).unwrap();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(32 << 10).unwrap();
    let (mut past, mut across) = ([0u8; 4096], [0u8; 4096]);
    assert!(disk.submit(1, Op::Read, 60 << 10, &[segment(&mut past)]));
    assert!(disk.submit(2, Op::Read, (32 << 10) - 1024, &[segment(&mut across)]));
    let mut done = wait_for(&mut disk, 2);
    done.sort_by_key(|c| c.tag);
    for completion in done {
        assert!(matches!(completion.result, Err(IoError::Short) | Err(IoError::Errno(_))), "{completion:?}");
    }
}

#[test]
fn sqpoll_option_round_trips() {
    let path = image("/tmp", 1 << 20);
    let options = FileDiskOptions { sqpoll_idle_ms: Some(10), ..FileDiskOptions::default() };
    let mut disk = FileDisk::open_with(&path, options).unwrap();
    let mut buffers = [AlignedBuffer::new(512, 8), AlignedBuffer::new(2048, 8)];
    round_trip(&path, &mut disk, &mut buffers, 4096);
}

#[test]
fn dropping_with_requests_in_flight_waits_for_them() {
    let path = image("/tmp", 1 << 20);
    let pattern: Vec<u8> = (0..1 << 20).map(|i: usize| (i / 4096 + i % 251) as u8).collect();
    std::fs::write(&path, &pattern).unwrap();
    let mut buffers: Vec<Vec<u8>> = (0..16).map(|_| vec![0u8; 65536]).collect();
    let mut disk = FileDisk::open(&path, false, false).unwrap();
    for (i, buffer) in buffers.iter_mut().enumerate() {
        assert!(disk.submit(i as u32, Op::Read, (i * 65536) as u64, &[segment(buffer)]));
    }
    disk.kick();
    drop(disk);
    // Drop returned only once the kernel had finished every read: each buffer holds its data...
    for (i, buffer) in buffers.iter().enumerate() {
        assert!(buffer[..] == pattern[i * 65536..(i + 1) * 65536], "read {i} had not finished at drop");
    }
    // ...and nothing writes into them afterwards.
    buffers.iter_mut().for_each(|buffer| buffer.fill(0xee));
    std::thread::sleep(Duration::from_millis(50));
    assert!(buffers.iter().all(|buffer| buffer.iter().all(|&b| b == 0xee)), "a late write from the kernel");
}

#[test]
fn bad_files_and_options_are_clear_errors() {
    let missing = FileDisk::open("/tmp/exitless-no-such-disk-image", false, false);
    assert!(matches!(missing, Err(BackendError::Open { .. })));
    let path = image("/tmp", 0);
    assert!(matches!(FileDisk::open(&path, false, false), Err(BackendError::TooSmall { .. })));
    std::fs::write(&path, [0u8; 1500]).unwrap();
    assert_eq!(FileDisk::open(&path, false, false).unwrap().capacity(), 1024);
    for depth in [0, MAX_QUEUE_DEPTH + 1] {
        let options = FileDiskOptions { max_in_flight: depth, ..FileDiskOptions::default() };
        let error = FileDisk::open_with(&path, options).err().unwrap();
        assert!(matches!(error, BackendError::BadQueueDepth { .. }), "{error}");
    }
}

#[test]
fn backends_are_send() {
    fn assert_send<T: Send>() {}
    assert_send::<FileDisk>();
    assert_send::<crate::RamDisk>();
}

/// Dirty and under-writeback pages of the whole of `path` in the page cache.
fn dirty_pages(path: &Path) -> u64 {
    crate::testing::dirty_pages(path, 0..0)
}

#[test]
fn flush_writes_buffered_data_back_before_it_completes() {
    let path = image("/tmp", 4 << 20);
    let mut disk = FileDisk::open(&path, false, false).unwrap();
    let mut data = AlignedBuffer::new(1 << 20, 4096);
    data.bytes().fill(0x5a);
    assert!(disk.submit(1, Op::Write, 1 << 20, &[segment(data.bytes())]));
    assert_eq!(wait_for(&mut disk, 1), vec![Completion { tag: 1, result: Ok(1 << 20) }]);
    let dirty = dirty_pages(&path);
    // Buffered: the megabyte sits in the page cache, dirty (writeback waits ~30 s by default).
    assert!(dirty >= 200, "only {dirty} dirty pages after a 1 MiB buffered write");
    assert!(disk.submit(2, Op::Flush, 0, &[]));
    assert_eq!(wait_for(&mut disk, 1), vec![Completion { tag: 2, result: Ok(0) }]);
    assert_eq!(dirty_pages(&path), 0, "dirty pages left when the flush completed");
}

/// Does `submit` of `op` leave the disk saying a request runs in io_uring's workers, until the
/// completion is reaped?
fn on_workers_while_in_flight(disk: &mut FileDisk, op: Op, buf: &mut AlignedBuffer) -> bool {
    let segments = [segment(&mut buf.bytes()[..4096])];
    let segments: &[Segment] = if op == Op::Flush { &[] } else { &segments };
    assert!(disk.submit(7, op, 0, segments));
    let on_workers = disk.waits_on_submitter_workers();
    let done = wait_for(disk, 1);
    assert_eq!(done[0].tag, 7);
    assert!(!disk.waits_on_submitter_workers(), "reaped, yet still waiting on workers");
    on_workers
}

#[test]
fn requests_that_io_uring_runs_in_its_workers_are_announced_while_in_flight() {
    let mut buf = AlignedBuffer::new(4096, 4096);
    let ext4 = image("/tmp", 1 << 20);
    let mut direct = FileDisk::open(&ext4, false, true).unwrap();
    assert!(direct.direct(), "/tmp must take O_DIRECT");
    for op in [Op::Read, Op::Write] {
        assert!(!on_workers_while_in_flight(&mut direct, op, &mut buf), "O_DIRECT {op:?} on ext4");
    }
    assert!(
        on_workers_while_in_flight(&mut direct, Op::Flush, &mut buf),
        "io_uring runs every fsync in a worker"
    );
    let mut buffered = FileDisk::open(&ext4, false, false).unwrap();
    let tmpfs = image("/dev/shm", 1 << 20);
    let mut on_tmpfs = FileDisk::open(&tmpfs, false, true).unwrap();
    for disk in [&mut buffered, &mut on_tmpfs] {
        for op in [Op::Read, Op::Write, Op::Flush] {
            assert!(on_workers_while_in_flight(disk, op, &mut buf), "{op:?} without an asynchronous path");
        }
    }
}

/// An anonymous page whose first touch stalls until `release` (`testing::Stall`).
struct StallingPage {
    page: *mut u8,
    stall: crate::testing::Stall,
}

impl StallingPage {
    const SIZE: usize = 4096;

    fn new() -> StallingPage {
        // SAFETY: a fresh private anonymous mapping, unmapped in Drop.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                Self::SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(page, libc::MAP_FAILED);
        // SAFETY: the page is mapped until Drop, after the stall (a field) has gone.
        let stall = unsafe { crate::testing::Stall::new(page.cast(), Self::SIZE) };
        StallingPage { page: page.cast(), stall }
    }

    fn segment(&self) -> Segment {
        // SAFETY: the page stays mapped until the StallingPage drops, which the test does after
        // the disk.
        unsafe { Segment::new(self.page, Self::SIZE as u32) }
    }

    fn release(&mut self) {
        self.stall.release();
    }
}

impl Drop for StallingPage {
    fn drop(&mut self) {
        self.stall.release();
        // SAFETY: mapped in `new` with this size; nothing refers to it any more.
        unsafe { libc::munmap(self.page.cast(), Self::SIZE) };
    }
}

/// A device reset that gives up on a disk that does not answer goes on with a new backend on
/// the same file: it serves at once, and sees every write the old one completed, while the old
/// one keeps its stalled request until the kernel is done with it.
#[test]
fn a_reopened_disk_serves_while_the_old_one_still_holds_a_stalled_request() {
    let mut stall = StallingPage::new();
    // On tmpfs io_uring runs requests in its workers (one on a file system that may block is
    // first tried in the submitting thread, which would stall this test).
    let path = image("/dev/shm", 1 << 20);
    let mut old = FileDisk::open(&path, false, false).unwrap();
    let mut written = AlignedBuffer::new(4096, 4096);
    written.bytes().fill(0x5a);
    assert!(old.submit(1, Op::Write, 8192, &[segment(written.bytes())]));
    assert_eq!(wait_for(&mut old, 1)[0].result, Ok(4096));
    assert!(old.submit(2, Op::Read, 0, &[stall.segment()]));
    old.kick();
    std::thread::sleep(Duration::from_millis(100));
    let mut done = Vec::new();
    old.poll(&mut |c| done.push(c));
    assert!(done.is_empty(), "the stalled read finished: {done:?}");

    let mut new = old.reopen().unwrap();
    let mut read = AlignedBuffer::new(4096, 4096);
    assert!(new.submit(3, Op::Read, 8192, &[segment(read.bytes())]));
    new.kick();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut served = Vec::new();
    while served.is_empty() && Instant::now() < deadline {
        new.poll(&mut |c| served.push(c));
    }
    assert_eq!(served.first().map(|c| (c.tag, c.result)), Some((3, Ok(4096))));
    assert!(read.bytes().iter().all(|&b| b == 0x5a), "the new disk sees the old one's write");
    assert_eq!(old.in_flight(), 1, "the stalled read is still the old disk's");

    stall.release();
    assert_eq!(wait_for(&mut old, 1)[0].tag, 2);
    drop(old);
}

/// The bytes a file has allocated on its file system (st_blocks, in 512-byte units).
fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().blocks() * 512
}

/// A 1 MiB file in `dir` full of 0xa5, written through the disk, and the disk.
fn filled_disk(dir: &str, direct: bool) -> (tempfile::TempPath, FileDisk) {
    let path = image(dir, 1 << 20);
    let mut disk = FileDisk::open(&path, false, direct).unwrap();
    let mut data = AlignedBuffer::new(128 << 10, 4096);
    data.bytes().fill(0xa5);
    for i in 0..8u32 {
        assert!(disk.submit(i, Op::Write, u64::from(i) * (128 << 10), &[segment(data.bytes())]));
    }
    assert!(wait_for(&mut disk, 8).iter().all(|c| c.result == Ok(128 << 10)));
    assert!(disk.submit(9, Op::Flush, 0, &[]));
    assert_eq!(wait_for(&mut disk, 1)[0].result, Ok(0));
    (path, disk)
}

fn check_ranges(path: &Path, zero: &[std::ops::Range<usize>]) {
    let file = std::fs::read(path).unwrap();
    assert_eq!(file.len(), 1 << 20, "the file keeps its size");
    for (at, &byte) in file.iter().enumerate() {
        let expected = if zero.iter().any(|r| r.contains(&at)) { 0 } else { 0xa5 };
        assert_eq!(byte, expected, "byte {at}");
    }
}

#[test]
fn discard_punches_a_hole_and_write_zeroes_zeroes_on_ext4() {
    for direct in [false, true] {
        let (path, mut disk) = filled_disk("/tmp", direct);
        let caps = disk.capabilities();
        assert!(caps.discard && caps.write_zeroes, "{caps:?}");
        assert_eq!(caps.physical_block_size, 4096, "ext4's block size");
        let before = allocated(&path);
        assert!(disk.submit(1, Op::Discard { len: 256 << 10 }, 256 << 10, &[]));
        assert!(disk.submit(2, Op::WriteZeroes { len: 4096, unmap: false }, 8192, &[]));
        assert!(disk.submit(3, Op::WriteZeroes { len: 64 << 10, unmap: true }, 640 << 10, &[]));
        let mut results: Vec<_> = wait_for(&mut disk, 3).iter().map(|c| (c.tag, c.result)).collect();
        results.sort_by_key(|(tag, _)| *tag);
        assert_eq!(results, [(1, Ok(0)), (2, Ok(0)), (3, Ok(0))]);
        // The hole and the unmapped zeros (320 KiB) are gone from the file system, the zero range
        // is not; splitting the file's extent may cost ext4 an extent tree block.
        let after = allocated(&path);
        assert!(after <= before - (320 << 10) + 4096, "direct {direct}: {before} -> {after}");
        check_ranges(&path, &[8192..12288, 256 << 10..512 << 10, 640 << 10..704 << 10]);
    }
}

#[test]
fn discard_and_write_zeroes_on_tmpfs_punch_holes() {
    let (path, mut disk) = filled_disk("/dev/shm", false);
    assert!(disk.capabilities().discard && disk.capabilities().write_zeroes);
    let before = allocated(&path);
    assert!(disk.submit(1, Op::Discard { len: 8192 }, 0, &[]));
    assert!(disk.submit(2, Op::WriteZeroes { len: 4096, unmap: false }, 1 << 19, &[]));
    assert!(wait_for(&mut disk, 2).iter().all(|c| c.result == Ok(0)));
    assert_eq!(allocated(&path), before - 12288);
    check_ranges(&path, &[0..8192, 1 << 19..(1 << 19) + 4096]);
}

#[test]
fn range_requests_are_checked_and_refused_where_they_cannot_run() {
    let (path, mut disk) = filled_disk("/tmp", false);
    let end = 1u64 << 20;
    let segment_too = AlignedBuffer::new(512, 512);
    let mut buf = segment_too;
    let requests = [
        (Op::Discard { len: 1024 }, end - 512),
        (Op::WriteZeroes { len: u64::MAX, unmap: false }, 512),
        (Op::Discard { len: 512 }, u64::MAX),
    ];
    for (tag, (op, offset)) in requests.into_iter().enumerate() {
        assert!(disk.submit(tag as u32, op, offset, &[]));
    }
    assert!(disk.submit(7, Op::Discard { len: 512 }, 0, &[segment(buf.bytes())]));
    // Nothing to do: done at once.
    assert!(disk.submit(8, Op::WriteZeroes { len: 0, unmap: true }, end, &[]));
    let results: Vec<_> = wait_for(&mut disk, 5).iter().map(|c| c.result).collect();
    let out = Err(IoError::OutOfRange);
    assert_eq!(results, [out, out, out, out, Ok(0)]);
    drop(disk);
    check_ranges(&path, &[]);
    let mut read_only = FileDisk::open(&path, true, false).unwrap();
    assert_eq!((read_only.capabilities().discard, read_only.capabilities().write_zeroes), (false, false));
    assert!(read_only.submit(1, Op::Discard { len: 512 }, 0, &[]));
    assert!(read_only.submit(2, Op::WriteZeroes { len: 512, unmap: true }, 0, &[]));
    let results: Vec<_> = wait_for(&mut read_only, 2).iter().map(|c| c.result).collect();
    assert_eq!(results, [Err(IoError::ReadOnly), Err(IoError::ReadOnly)]);
}

#[test]
fn a_block_device_zeroes_and_discards_through_fallocate() {
    // A loop device over an ext4 file: it has write-zeroes (punching the backing file).
    let backing = image("/tmp", 1 << 20);
    let output = std::process::Command::new("losetup")
        .args(["--find", "--show"])
        .arg(&*backing)
        .output()
        .expect("losetup (util-linux) runs");
    assert!(output.status.success(), "losetup: {}", String::from_utf8_lossy(&output.stderr));
    let device = String::from_utf8(output.stdout).unwrap().trim().to_owned();
    let detach = scopeguard(device.clone());
    let mut disk = FileDisk::open(&device, false, true).unwrap();
    let caps = disk.capabilities();
    assert!(caps.discard && caps.write_zeroes, "{caps:?}");
    let mut data = AlignedBuffer::new(1 << 20, 4096);
    data.bytes().fill(0xa5);
    let chunks: Vec<Segment> = data.bytes().chunks_mut(128 << 10).map(segment).collect();
    assert!(disk.submit(1, Op::Write, 0, &chunks[..8]));
    assert_eq!(wait_for(&mut disk, 1)[0].result, Ok(1 << 20));
    assert!(disk.submit(2, Op::WriteZeroes { len: 4096, unmap: false }, 4096, &[]));
    assert!(disk.submit(3, Op::Discard { len: 8192 }, 65536, &[]));
    assert!(disk.submit(4, Op::WriteZeroes { len: 512, unmap: true }, 1 << 19, &[]));
    assert!(wait_for(&mut disk, 3).iter().all(|c| c.result == Ok(0)));
    drop(disk);
    drop(detach);
    check_ranges(&backing, &[4096..8192, 65536..73728, 1 << 19..(1 << 19) + 512]);
}

/// Detaches the loop device when dropped.
struct LoopDevice(String);

fn scopeguard(device: String) -> LoopDevice {
    LoopDevice(device)
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

#[test]
fn written_through_writes_and_ranges_are_durable_when_they_complete() {
    let path = image("/tmp", 4 << 20);
    let mut disk = FileDisk::open(&path, false, false).unwrap();
    let mut data = AlignedBuffer::new(1 << 20, 4096);
    data.bytes().fill(0x5a);
    let dirty = || dirty_pages(&path);
    disk.set_write_through(true);
    assert!(disk.submit(1, Op::Write, 0, &[segment(data.bytes())]));
    assert_eq!(wait_for(&mut disk, 1), vec![Completion { tag: 1, result: Ok(1 << 20) }]);
    assert_eq!(dirty(), 0, "a written-through write left dirty pages");
    // Written back, a write stays in the page cache, dirty; a range request written through is
    // followed by an fdatasync of the file, which writes them back before it completes.
    disk.set_write_through(false);
    assert!(disk.submit(2, Op::Write, 1 << 20, &[segment(data.bytes())]));
    assert_eq!(wait_for(&mut disk, 1)[0].result, Ok(1 << 20));
    assert!(dirty() >= 200, "only {} dirty pages after a 1 MiB buffered write", dirty());
    disk.set_write_through(true);
    assert!(disk.submit(3, Op::WriteZeroes { len: 4096, unmap: false }, 3 << 20, &[]));
    assert_eq!(wait_for(&mut disk, 1), vec![Completion { tag: 3, result: Ok(0) }], "one completion");
    assert_eq!(dirty(), 0, "the range's fdatasync did not run before it completed");
    // A failed fallocate cancels its fdatasync; the request reports the fallocate's error, once.
    let mut bad_mode = FileDisk::open(&path, false, false).unwrap();
    bad_mode.set_write_through(true);
    bad_mode.shape.fallocate.zeroes = Some(-1); // an invalid mode: EINVAL or EOPNOTSUPP
    assert!(bad_mode.submit(4, Op::WriteZeroes { len: 4096, unmap: false }, 0, &[]));
    let done = wait_for(&mut bad_mode, 1);
    assert!(matches!(done[0].result, Err(IoError::Errno(e)) if e != libc::ECANCELED), "{done:?}");
    // The slot is free again: a request after it still runs.
    assert!(bad_mode.submit(5, Op::Discard { len: 4096 }, 0, &[]));
    assert_eq!(wait_for(&mut bad_mode, 1)[0].result, Ok(0));
}

/// `cancel_all` ends reads the disk holds: each completes, through `poll`, with ECANCELED, and
/// the disk serves again afterwards (its slots are free).
#[test]
fn cancel_all_ends_held_reads_with_ecanceled() {
    use std::io::Write;
    let (mut disk, mut write_end) = crate::testing::disk_on_a_pipe();
    let mut buffers = [AlignedBuffer::new(512, 512), AlignedBuffer::new(512, 512)];
    for (tag, buf) in buffers.iter_mut().enumerate() {
        assert!(disk.submit(tag as u32, Op::Read, 0, &[segment(buf.bytes())]));
    }
    disk.kick();
    std::thread::sleep(Duration::from_millis(100));
    let mut done = Vec::new();
    disk.poll(&mut |c| done.push(c));
    assert!(done.is_empty(), "a read of an empty pipe finished: {done:?}");

    assert_eq!(disk.cancel_all(), 2);
    let mut cancelled = wait_for(&mut disk, 2);
    cancelled.sort_by_key(|c| c.tag);
    let expected = Err(IoError::Errno(libc::ECANCELED));
    assert_eq!(cancelled, [Completion { tag: 0, result: expected }, Completion { tag: 1, result: expected }]);
    assert_eq!(disk.in_flight(), 0);
    assert_eq!(disk.cancel_all(), 0, "nothing left to cancel");

    // Served again: a read that the pipe answers.
    let mut buf = AlignedBuffer::new(512, 512);
    assert!(disk.submit(7, Op::Read, 0, &[segment(buf.bytes())]));
    write_end.write_all(&[0x42; 512]).unwrap();
    assert_eq!(wait_for(&mut disk, 1)[0], Completion { tag: 7, result: Ok(512) });
    assert!(buf.bytes().iter().all(|&b| b == 0x42));
}
