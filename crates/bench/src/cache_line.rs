//! How long one cache line takes to go from one host CPU to another and back, measured just
//! before a guest's run. A polled request crosses between the vCPU's CPU and the IOCore's several
//! times (the ring's index, the descriptors, the header, the status, the used ring), one after
//! the other, so its latency follows that round trip. On a cloud VM the round trip depends on
//! where the hypervisor placed the two virtual CPUs at that moment, and it moves between runs
//! (docs/tuning.md): the bench reports it beside each row, so that two rows measured under
//! different placements are not read as a difference between modes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Round trips per sample, and samples taken (the median is reported): a few milliseconds in all.
const ROUND_TRIPS: u64 = 2_000;
const SAMPLES: usize = 5;
/// A measurement that takes longer than this has lost one of its CPUs to another thread, and
/// says nothing about the cache: it is given up.
const GIVE_UP: Duration = Duration::from_secs(1);

/// One cache line, alone in it.
#[repr(align(64))]
struct Line(AtomicU64);

/// The median round trip of one cache line between CPUs `a` and `b`, in nanoseconds; `None` when
/// they are the same CPU, a thread cannot be pinned, or one of them is busy with other work.
pub fn round_trip_ns(a: usize, b: usize) -> Option<f64> {
    if a == b {
        return None;
    }
    let line = Line(AtomicU64::new(0));
    let total = ROUND_TRIPS * SAMPLES as u64;
    // Both sides pinned before either starts; each on a thread of its own, as pinning the
    // caller would leave it pinned.
    let ready = Barrier::new(2);
    let unpinned = AtomicBool::new(false);
    let pin = |cpu| {
        let pinned = iocore::pin_current_thread(cpu).is_ok();
        unpinned.fetch_or(!pinned, Ordering::Relaxed);
        ready.wait();
        (!unpinned.load(Ordering::Relaxed)).then(|| Instant::now() + GIVE_UP)
    };
    std::thread::scope(|scope| {
        let responder = scope.spawn(|| {
            let deadline = pin(b)?;
            // Answers odd values with the next even one.
            for i in 0..total {
                wait_for(&line.0, 2 * i + 1, deadline)?;
                line.0.store(2 * i + 2, Ordering::Release);
            }
            Some(())
        });
        let measured = scope.spawn(|| measure(&line.0, pin(a)?)).join().ok().flatten();
        let answered = responder.join().ok().flatten();
        measured.zip(answered).map(|(ns, ())| ns)
    })
}

/// The asking side: `SAMPLES` samples of `ROUND_TRIPS` round trips, the median per trip.
fn measure(line: &AtomicU64, deadline: Instant) -> Option<f64> {
    let mut samples = [0.0; SAMPLES];
    let mut next = 0;
    for sample in &mut samples {
        let start = Instant::now();
        for _ in 0..ROUND_TRIPS {
            line.store(next + 1, Ordering::Release);
            wait_for(line, next + 2, deadline)?;
            next += 2;
        }
        *sample = start.elapsed().as_nanos() as f64 / ROUND_TRIPS as f64;
    }
    samples.sort_by(f64::total_cmp);
    Some(samples[SAMPLES / 2])
}

/// Spin until `line` holds `value`; `None` past `deadline` (looked at every 1024 spins).
fn wait_for(line: &AtomicU64, value: u64, deadline: Instant) -> Option<()> {
    let mut spins = 0u32;
    while line.load(Ordering::Acquire) != value {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(1024) && Instant::now() > deadline {
            return None;
        }
        std::hint::spin_loop();
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_between_two_cpus_and_not_on_one() {
        assert_eq!(round_trip_ns(0, 0), None);
        // This host has two CPUs or more (the bench's set-up needs them).
        let ns = round_trip_ns(0, 1).expect("a round trip between CPUs 0 and 1");
        assert!(ns > 0.0 && ns < 1e6, "{ns} ns");
        assert_eq!(round_trip_ns(0, 100_000), None);
        let allowed = std::thread::available_parallelism().unwrap().get();
        assert!(allowed >= 2, "the caller stays unpinned: {allowed} CPU(s) allowed");
    }
}
