//! The RBD backend against a real cluster (`scripts/ceph.sh`, started once for this binary).

use std::time::{Duration, Instant};

use crate::testing::ceph::TestCluster;
use crate::{Backend, BackendError, Completion, IoError, Op, RbdDisk, RbdSpec, Segment};

/// Submit one request and wait (sleeping on the completion fd, as an IOCore does) for its answer.
fn run(disk: &mut RbdDisk, op: Op, offset: u64, buffers: &mut [&mut [u8]]) -> Result<u32, IoError> {
    let segments: Vec<Segment> = buffers
        .iter_mut()
        // SAFETY: the buffers outlive the request, which this function waits for.
        .map(|b| unsafe { Segment::new(b.as_mut_ptr(), u32::try_from(b.len()).unwrap()) })
        .collect();
    assert!(disk.submit(7, op, offset, &segments));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut answer: Option<Completion> = None;
    while answer.is_none() {
        assert!(Instant::now() < deadline, "{op:?} at {offset} not answered");
        if disk.poll(&mut |c| answer = Some(c)) == 0 {
            let mut fd = libc::pollfd { fd: disk.completion_fd().unwrap(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut fd, 1, 1000) };
            disk.completion_fd_fired();
        }
    }
    let answer = answer.unwrap();
    assert_eq!(answer.tag, 7);
    answer.result
}

fn open(spec: &RbdSpec, queues: usize) -> Vec<RbdDisk> {
    RbdDisk::open_queues(spec, queues, 32).unwrap_or_else(|e| panic!("{spec}: {e}"))
}

#[test]
fn every_request_kind_reaches_the_image_and_reads_back() {
    let cluster = TestCluster::get();
    let spec = cluster.image("kinds", 8 << 20);
    let mut disk = open(&spec, 1).remove(0);
    assert_eq!(disk.capacity(), 8 << 20);
    let (mut a, mut b) = (vec![0xa5u8; 4096], vec![0x3cu8; 512]);
    assert_eq!(run(&mut disk, Op::Write, 4 << 20, &mut [&mut a, &mut b]), Ok(4608));
    assert_eq!(run(&mut disk, Op::Flush, 0, &mut []), Ok(0));
    let mut back = vec![0u8; 4608];
    assert_eq!(run(&mut disk, Op::Read, 4 << 20, &mut [&mut back]), Ok(4608));
    assert!(back[..4096].iter().all(|&x| x == 0xa5) && back[4096..].iter().all(|&x| x == 0x3c));

    // Part of an object discarded, then zeroed: both read back as zeros.
    assert_eq!(run(&mut disk, Op::Discard { len: 512 }, 4 << 20, &mut []), Ok(0));
    assert_eq!(run(&mut disk, Op::WriteZeroes { len: 512, unmap: false }, (4 << 20) + 4096, &mut []), Ok(0));
    assert_eq!(run(&mut disk, Op::Read, 4 << 20, &mut [&mut back]), Ok(4608));
    assert!(back[..512].iter().all(|&x| x == 0), "discarded bytes read back");
    assert!(back[512..4096].iter().all(|&x| x == 0xa5));
    assert!(back[4096..].iter().all(|&x| x == 0), "zeroed bytes read back");

    // Checked before librbd sees them.
    assert_eq!(run(&mut disk, Op::Read, 8 << 20, &mut [&mut back]), Err(IoError::OutOfRange));
    assert_eq!(run(&mut disk, Op::Read, 0, &mut []), Ok(0));
}

/// A FLUSH covers the writes completed before it, which librbd (its cache off) answered once
/// the cluster had them: it is answered at once, not held behind the writes still in flight.
#[test]
fn a_flush_is_answered_at_once_and_not_held_behind_writes_in_flight() {
    let cluster = TestCluster::get();
    let spec = cluster.image("flush", 4 << 20);
    let mut disk = open(&spec, 1).remove(0);
    let mut block = vec![0x5au8; 4096];
    // SAFETY: the block outlives the write, which is collected below.
    let segment = unsafe { Segment::new(block.as_mut_ptr(), 4096) };
    assert!(disk.submit(1, Op::Write, 0, &[segment]));
    assert!(disk.submit(2, Op::Flush, 0, &[]));
    let mut order = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while order.len() < 2 {
        assert!(Instant::now() < deadline, "answered: {order:?}");
        disk.poll(&mut |c| order.push((c.tag, c.result)));
    }
    assert_eq!(order, [(2, Ok(0)), (1, Ok(4096))], "the flush first, then the write");
}

#[test]
fn the_queues_of_a_disk_share_one_image() {
    let cluster = TestCluster::get();
    let spec = cluster.image("queues", 4 << 20);
    let mut queues = open(&spec, 3);
    let mut data = vec![0x77u8; 8192];
    assert_eq!(run(&mut queues[0], Op::Write, 8192, &mut [&mut data]), Ok(8192));
    let mut back = vec![0u8; 8192];
    assert_eq!(run(&mut queues[2], Op::Read, 8192, &mut [&mut back]), Ok(8192));
    assert_eq!(back, data);
    // Many in flight on two queues at once: each answers its own.
    let mut blocks: Vec<Vec<u8>> = (0..32u8).map(|i| vec![i; 4096]).collect();
    for (i, block) in blocks.iter_mut().enumerate() {
        let queue = &mut queues[i % 2];
        // SAFETY: the blocks outlive the requests, which are all collected below.
        let segment = unsafe { Segment::new(block.as_mut_ptr(), 4096) };
        assert!(queue.submit(u32::try_from(i).unwrap(), Op::Write, i as u64 * 4096, &[segment]));
    }
    let mut answered = [0usize; 2];
    let deadline = Instant::now() + Duration::from_secs(60);
    while answered.iter().sum::<usize>() < 32 {
        assert!(Instant::now() < deadline, "answered {answered:?} of 16 + 16");
        for (q, queue) in queues.iter_mut().take(2).enumerate() {
            queue.poll(&mut |c| {
                assert_eq!(c.result, Ok(4096));
                assert_eq!(c.tag as usize % 2, q, "queue {q} answered another queue's request");
                answered[q] += 1;
            });
        }
        std::thread::yield_now();
    }
    let mut all = vec![0u8; 32 * 4096];
    assert_eq!(run(&mut queues[1], Op::Read, 0, &mut [&mut all]), Ok(32 * 4096));
    assert!(all.chunks(4096).enumerate().all(|(i, c)| c.iter().all(|&x| usize::from(x) == i)));
}

#[test]
fn a_read_only_image_refuses_writes() {
    let cluster = TestCluster::get();
    let mut spec = cluster.image("readonly", 1 << 20);
    spec.read_only = true;
    let mut disk = open(&spec, 1).remove(0);
    assert!(disk.read_only());
    let mut block = vec![1u8; 512];
    assert_eq!(run(&mut disk, Op::Write, 0, &mut [&mut block]), Err(IoError::ReadOnly));
    assert_eq!(run(&mut disk, Op::Read, 0, &mut [&mut block]), Ok(512));
    assert!(block.iter().all(|&x| x == 0));
}

#[test]
fn a_missing_image_or_pool_is_one_clear_error() {
    let cluster = TestCluster::get();
    let error = |spec: RbdSpec| match RbdDisk::open_queues(&spec, 1, 8) {
        Err(BackendError::Rbd(e)) => e.to_string(),
        Err(other) => panic!("{spec}: not an RBD error: {other}"),
        Ok(_) => panic!("{spec} opened"),
    };
    let missing = error(cluster.spec("nonexistent"));
    assert!(missing.contains("rbd/nonexistent") && missing.contains("No such file"), "{missing}");
    let mut spec = cluster.spec("nonexistent");
    spec.pool = "nopool".into();
    let pool = error(spec);
    assert!(pool.contains("pool nopool"), "{pool}");
    let mut spec = cluster.spec("nonexistent");
    spec.user = Some("stranger".into());
    let user = error(spec);
    assert!(user.contains("cannot connect") && user.contains("client.stranger"), "{user}");
}
