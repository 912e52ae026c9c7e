//! virtio-blk request parsing and the block worker over a RAM disk: a hostile driver posts
//! requests (every type, sectors on and off the disk, bent descriptors, loops, avail jumps)
//! between polls. After every poll nothing is left in flight (the RAM disk completes at once),
//! and, while the queue is not broken, every request the device took has exactly one used
//! entry.
#![no_main]

use std::sync::atomic::{AtomicBool, Ordering};

use arbitrary::{Result, Unstructured};
use exitless_fuzz::{guest_memory, queue_config, ram_disk, signals, DriverRing, MAX_STEPS};
use libfuzzer_sys::fuzz_target;
use storage::Backend;
use virtio::block::{BlockWorker, DiskInfo};
use virtqueue::queue::Queue;
use virtqueue::QueueWorker;
use vm_memory::GuestMemoryMmap;

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});

fn run(u: &mut Unstructured) -> Result<()> {
    let mem = guest_memory();
    let (config, laid_out) = queue_config(u, 0)?;
    let Ok(queue) = Queue::new(&mem, config, u.arbitrary()?) else { return Ok(()) };
    let read_only = u.ratio(1, 8)?;
    let disk = ram_disk(read_only);
    let info = DiskInfo {
        capacity: disk.capacity(),
        read_only,
        id: *b"exitless-fuzz-disk\0\0",
        // Negotiated or not, on a disk read-only or not: every answer a range request can get.
        discard: u.ratio(7, 8)?,
        write_zeroes: u.ratio(7, 8)?,
        ..DiskInfo::default()
    };
    let (signals, needs_reset) = signals();
    let mut worker = BlockWorker::new(queue, Box::new(disk), info, signals);
    worker.set_polling(u.arbitrary()?);
    let mut ring = DriverRing::new(config, laid_out);
    for _ in 0..MAX_STEPS {
        if u.is_empty() {
            break;
        }
        match u.int_in_range(0..=5)? {
            0..=2 => ring.blk_request(u, &mem)?,
            3 => ring.driver_step(u, &mem)?,
            4 => worker.set_polling(u.arbitrary()?),
            _ => {
                if !poll(&mut worker, &ring, &mem, &needs_reset) {
                    return Ok(());
                }
            }
        }
    }
    poll(&mut worker, &ring, &mem, &needs_reset);
    Ok(())
}

/// Poll once and check what a RAM disk guarantees; `false` if the input ends here (it would
/// only meet an open bug).
fn poll(
    worker: &mut BlockWorker,
    ring: &DriverRing,
    mem: &GuestMemoryMmap,
    needs_reset: &AtomicBool,
) -> bool {
    let was_broken = needs_reset.load(Ordering::Acquire);
    let served = worker.poll();
    assert!(!was_broken || served == 0, "a broken queue was served ({served} requests)");
    assert_eq!(worker.in_flight(), 0, "requests left in flight after a poll of a RAM disk");
    let taken = worker.queue_mut().next_avail();
    let answered = worker.counters.completed + worker.counters.io_errors + worker.counters.rejected;
    assert!(answered <= u64::from(taken), "{answered} answers for {taken} requests");
    if ring.laid_out && !needs_reset.load(Ordering::Acquire) {
        assert_eq!(ring.used_idx(mem), Some(taken), "used index differs from the requests taken");
    }
    true
}
