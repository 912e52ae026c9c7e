//! The in-flight region a vhost-user frontend hands a backend (SET_INFLIGHT_FD), as a ring
//! that starts reads it: `Queue::track_inflight` (`InflightTracker::recover`) over a queue area
//! every byte of which comes from the input (header: version, `desc_num`, last batch head, used
//! index; entries: in-flight byte, `next`, counter), for a queue of a fuzzed size whose used
//! ring's index in guest memory is fuzzed too. Recovery either refuses the area or finds heads
//! that are inside the queue, distinct, marked in flight, oldest first, and resumes at the used
//! index plus their count. Then the queue serves: the recovered heads first, then heads the
//! driver makes available, returned in batches; and at the end the backend "crashes": a new
//! queue recovering from the same area must find exactly the heads taken and not yet returned,
//! in the order they were taken, and resume where the first one stood.
#![no_main]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arbitrary::{Result, Unstructured};
use exitless_fuzz::{guest_memory, queue_config, DriverRing, MAX_STEPS};
use libfuzzer_sys::fuzz_target;
use virtqueue::inflight::{queue_region_size, InflightArea, INFLIGHT_VERSION};
use virtqueue::queue::Queue;
use vm_memory::{Bytes, GuestAddress};

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});

/// The area's memory: 64-bit words, as a mapped region is 8-byte aligned.
type Words = Arc<Vec<AtomicU64>>;

fn area(words: &Words, capacity: u16) -> InflightArea {
    let base = words.as_ptr().cast::<u8>().cast_mut();
    // SAFETY: `words` holds `queue_region_size(capacity)` bytes (made so in `run`) of atomics,
    // 8-byte aligned, kept alive by the clone handed over; they are only accessed atomically.
    unsafe { InflightArea::new(base, capacity, words.clone()) }
}

/// Byte `offset` of the area.
fn byte(words: &Words, offset: usize) -> u8 {
    words[offset / 8].load(Ordering::Relaxed).to_le_bytes()[offset % 8]
}

fn u16_at(words: &Words, offset: usize) -> u16 {
    u16::from_le_bytes([byte(words, offset), byte(words, offset + 1)])
}

fn u64_at(words: &Words, offset: usize) -> u64 {
    words[offset / 8].load(Ordering::Relaxed)
}

fn run(u: &mut Unstructured) -> Result<()> {
    let mem = guest_memory();
    let (config, laid_out) = queue_config(u, 0)?;
    let Ok(mut queue) = Queue::new(&mem, config, u.arbitrary()?) else { return Ok(()) };
    let size = queue.size();
    let mut ring = DriverRing::new(config, laid_out);
    // The area's entries: mostly the queue's size (as QEMU sizes it), sometimes more or fewer.
    let capacity: u16 = match u.int_in_range(0..=7)? {
        0 => u.int_in_range(0..=1024)?,
        1 => size.saturating_mul(2),
        _ => size,
    };
    let len = usize::try_from(queue_region_size(capacity)).unwrap_or(0);
    let words: Words = Arc::new((0..len / 8).map(|_| AtomicU64::new(0)).collect());
    // The frontend's area, from the input: whole, or a plausible header and a few entries.
    if u.ratio(1, 4)? {
        for word in words.iter() {
            word.store(u.arbitrary()?, Ordering::Relaxed);
        }
    } else {
        let version: u16 = if u.ratio(1, 8)? { u.arbitrary()? } else { u.int_in_range(0..=1)? };
        let desc_num = if u.ratio(1, 8)? { u.arbitrary()? } else { capacity };
        let last_batch: u16 = if u.ratio(1, 8)? { u.arbitrary()? } else { u.int_in_range(0..=size - 1)? };
        let used_idx: u16 = u.arbitrary()?;
        let header = u64::from(version)
            | u64::from(desc_num) << 16
            | u64::from(last_batch) << 32
            | u64::from(used_idx) << 48;
        words[1].store(header, Ordering::Relaxed);
        for _ in 0..u.int_in_range(0..=16)? {
            let head = usize::from(u.int_in_range(0..=capacity.saturating_sub(1))?);
            if head >= usize::from(capacity) {
                break;
            }
            let inflight: u64 = if u.ratio(1, 16)? { u.arbitrary::<u8>()?.into() } else { 1 };
            let next: u16 = if u.ratio(1, 8)? { u.arbitrary()? } else { u.int_in_range(0..=size - 1)? };
            words[2 + 2 * head].store(inflight | u64::from(next) << 48, Ordering::Relaxed);
            words[3 + 2 * head].store(u.int_in_range(0..=64)?, Ordering::Relaxed);
        }
    }
    let used: u16 =
        if u.ratio(1, 2)? { u.arbitrary()? } else { u16_at(&words, 14).wrapping_add(u.int_in_range(0..=2)?) };
    let _ = mem.write_obj(used, GuestAddress(config.used.wrapping_add(2)));
    let used = queue.used_index();
    // What the area held, for the checks: each entry's in-flight byte and counter.
    let marked: Vec<(u8, u64)> = (0..usize::from(capacity))
        .map(|h| (byte(&words, 16 + 16 * h), u64_at(&words, 24 + 16 * h)))
        .collect();
    queue.resume(u.arbitrary()?);
    let Ok(recovery) = queue.track_inflight(area(&words, capacity)) else { return Ok(()) };

    let owed: Vec<u16> = queue.inflight().map(|t| t.pending_resubmits().to_vec()).unwrap_or_default();
    assert_eq!(owed.len(), recovery.count);
    assert!(owed.len() <= usize::from(size), "more heads owed than the queue holds");
    let mut seen = vec![false; usize::from(size)];
    for &head in &owed {
        assert!(head < size, "owed head {head} outside the queue of {size}");
        assert!(!seen[usize::from(head)], "head {head} owed twice");
        seen[usize::from(head)] = true;
        assert_eq!(marked[usize::from(head)].0, 1, "head {head} owed but not marked in flight");
    }
    let counters: Vec<u64> = owed.iter().map(|&h| marked[usize::from(h)].1).collect();
    assert!(counters.windows(2).all(|w| w[0] <= w[1]), "owed heads not oldest first: {counters:?}");
    assert_eq!(recovery.next_avail, used.wrapping_add(owed.len() as u16));
    assert_eq!(queue.next_avail(), recovery.next_avail);
    assert_eq!(u16_at(&words, 8), INFLIGHT_VERSION, "recovery leaves the area current");
    assert_eq!(u16_at(&words, 14), used, "recovery leaves the area's used index at the ring's");
    assert_eq!(queue.inflight().map(|t| t.area().count_in_flight()), Some(owed.len()));

    // Serve: the driver's avail index continues from where the device stands.
    ring.avail_idx = queue.next_avail();
    ring.write(&mem, config.avail.wrapping_add(2), &ring.avail_idx.to_le_bytes());
    // Heads taken and not yet published, in the order taken; those added to the used ring.
    let mut held: Vec<u16> = Vec::new();
    let mut added: Vec<u16> = Vec::new();
    let wrapped = marked.iter().any(|&(_, counter)| counter >= u64::MAX / 2);
    let mut broken = false;
    for _ in 0..MAX_STEPS {
        if u.is_empty() {
            break;
        }
        match u.int_in_range(0..=3)? {
            0 => {
                let head = ring.index(u)?;
                ring.make_available(&mem, head);
            }
            1 if !broken => match queue.pop_avail() {
                Ok(Some(head)) => held.push(head),
                Ok(None) => {}
                Err(_) => broken = true,
            },
            2 => {
                let pending: Vec<u16> = held.iter().copied().filter(|h| !added.contains(h)).collect();
                if let Some(&head) = pending.get(u.int_in_range(0..=pending.len())?) {
                    queue.add_used(head, 0);
                    added.push(head);
                }
            }
            _ => {
                queue.publish_used();
                held.retain(|h| !added.contains(h));
                added.clear();
            }
        }
    }
    // The crash: a new backend, a new queue on the same rings, recovering from the same area.
    let Ok(mut next) = Queue::new(&mem, config, false) else { return Ok(()) };
    next.resume(0);
    let again = next.track_inflight(area(&words, capacity)).expect("an area this backend kept recovers");
    assert_eq!(again.next_avail, queue.next_avail(), "the next backend resumes where this one stood");
    let owed_now = next.inflight().map(|t| t.pending_resubmits().to_vec()).unwrap_or_default();
    // Owed: the heads taken and not published, in the order taken, then the recovered heads
    // not taken yet (none of the driver's heads is taken before those).
    let mut expected = held.clone();
    expected.extend(queue.inflight().map(|t| t.pending_resubmits().to_vec()).unwrap_or_default());
    if wrapped {
        // A counter from the area near its end wraps: the set is owed, in some order.
        expected.sort_unstable();
        let mut found = owed_now.clone();
        found.sort_unstable();
        assert_eq!(found, expected, "heads owed after the crash");
    } else {
        assert_eq!(owed_now, expected, "heads owed after the crash, oldest first");
    }
    Ok(())
}
