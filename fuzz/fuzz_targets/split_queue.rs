//! The split virtqueue alone: a fuzzed configuration (sizes, ring addresses anywhere) and a
//! sequence of driver writes and device calls, continued even after the driver broke the queue
//! (which must stay memory-safe). Every head the device takes is inside the queue and was
//! published, a chain walk never visits more descriptors than the queue has, and the used index
//! in RAM is always what the device last published.
#![no_main]

use arbitrary::{Result, Unstructured};
use exitless_fuzz::{guest_memory, queue_config, DriverRing, MAX_STEPS};
use libfuzzer_sys::fuzz_target;
use virtqueue::queue::Queue;
use vm_memory::{Bytes, GuestAddress};

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});

fn run(u: &mut Unstructured) -> Result<()> {
    let mem = guest_memory();
    let (config, laid_out) = queue_config(u, 0)?;
    let Ok(mut queue) = Queue::new(&mem, config, u.arbitrary()?) else { return Ok(()) };
    let size = queue.size();
    assert_eq!(size, config.size);
    let mut ring = DriverRing::new(config, laid_out);
    // Heads taken and not yet returned; used entries added, and added when last published.
    let mut taken = Vec::with_capacity(usize::from(size));
    let (mut added, mut published) = (0u16, 0u16);
    for _ in 0..MAX_STEPS {
        if u.is_empty() {
            break;
        }
        match u.int_in_range(0..=9)? {
            0..=2 => ring.driver_step(u, &mem)?,
            3 | 4 => {
                let avail_idx: u16 = mem.read_obj(GuestAddress(config.avail + 2)).expect("validated ring");
                let before = queue.next_avail();
                if let Ok(Some(head)) = queue.pop_avail() {
                    assert!(head < size, "head {head} outside a queue of {size}");
                    let pending = avail_idx.wrapping_sub(before);
                    assert!((1..=size).contains(&pending), "took a request with {pending} published");
                    taken.push(head);
                    let mut visited = 0u32;
                    let _ = queue.walk_chain(head, |_| {
                        visited += 1;
                        true
                    });
                    assert!(visited <= u32::from(size), "a chain of {visited} in a queue of {size}");
                }
            }
            5 => {
                if let Some(head) = taken.pop() {
                    queue.add_used(head, u.arbitrary()?);
                    added = added.wrapping_add(1);
                }
            }
            6 => {
                queue.publish_used();
                published = added;
            }
            7 => {
                let _ = queue.needs_interrupt();
            }
            8 => queue.set_notifications(u.arbitrary()?),
            _ => {
                let index = ring.index(u)?;
                let _ = queue.descriptor(index);
                let _ = queue.has_avail();
            }
        }
        // The driver never writes the used index (DriverRing keeps off it): only the device.
        assert_eq!(ring.used_idx(&mem), Some(published), "used index in RAM is not the device's");
    }
    Ok(())
}
