//! A cheap clock for the data path: the time-stamp counter (one `rdtsc`, ~10 ns, no system call)
//! where the CPU has one, else the monotonic clock. Workers read it once per pass (service-time
//! histograms, token-bucket refills); [`ticks_per_second`] converts ticks to time. Also, for
//! telling another process when something happened, [`monotonic_at`] and [`instant_of`].

#![deny(missing_docs)]
#![cfg_attr(not(test), warn(clippy::cast_possible_truncation, clippy::cast_sign_loss))]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long the TSC is compared with the monotonic clock to find its rate.
const CALIBRATION: Duration = Duration::from_millis(20);

/// The clock's current value, in ticks.
#[inline]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no preconditions; it reads a counter every x86_64 CPU has.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        u64::try_from(epoch().elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Ticks per second, measured once (the first call spins for about 20 ms, reading only the
/// vDSO clock: call it before a thread confines itself, or early, to keep it off a data path).
pub fn ticks_per_second() -> u64 {
    static RATE: OnceLock<u64> = OnceLock::new();
    *RATE.get_or_init(calibrate)
}

fn calibrate() -> u64 {
    if cfg!(not(target_arch = "x86_64")) {
        return 1_000_000_000;
    }
    let (start, t0) = (Instant::now(), ticks());
    while start.elapsed() < CALIBRATION {
        std::hint::spin_loop();
    }
    let (elapsed, t1) = (start.elapsed(), ticks());
    let rate = u128::from(t1.wrapping_sub(t0)) * 1_000_000_000 / elapsed.as_nanos().max(1);
    u64::try_from(rate).unwrap_or(u64::MAX).max(1)
}

/// `ticks` as a duration.
pub fn to_duration(ticks: u64) -> Duration {
    let nanos = u128::from(ticks) * 1_000_000_000 / u128::from(ticks_per_second());
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// The host's monotonic clock (CLOCK_MONOTONIC, which `Instant` reads on Linux) at `at`: a
/// time that another process on the same host turns back into an `Instant` of its own with
/// [`instant_of`] (a report's measured window, for a harness that samples CPU time meanwhile).
pub fn monotonic_at(at: Instant) -> Duration {
    let (now, monotonic_now) = (Instant::now(), monotonic_now());
    match now.checked_duration_since(at) {
        Some(ago) => monotonic_now.saturating_sub(ago),
        None => monotonic_now + (at - now),
    }
}

/// The `Instant` at which the host's monotonic clock read `monotonic` (see [`monotonic_at`]).
pub fn instant_of(monotonic: Duration) -> Instant {
    let (now, monotonic_now) = (Instant::now(), monotonic_now());
    match monotonic_now.checked_sub(monotonic) {
        Some(ago) => now.checked_sub(ago).unwrap_or(now),
        None => now + (monotonic - monotonic_now),
    }
}

fn monotonic_now() -> Duration {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid timespec for the call to fill; CLOCK_MONOTONIC always exists
    // (read through the vDSO, no system call).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    let secs = u64::try_from(now.tv_sec).unwrap_or(0);
    Duration::new(secs, u32::try_from(now.tv_nsec).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_runs_at_its_measured_rate() {
        let rate = ticks_per_second();
        let (t0, start) = (ticks(), Instant::now());
        std::thread::sleep(Duration::from_millis(50));
        let (t1, wall) = (ticks(), start.elapsed());
        let measured = to_duration(t1 - t0);
        let ratio = measured.as_secs_f64() / wall.as_secs_f64();
        assert!((0.9..1.1).contains(&ratio), "rate {rate}: {measured:?} of ticks for {wall:?}");
    }

    #[test]
    fn a_monotonic_time_turns_back_into_the_same_instant() {
        let now = Instant::now();
        for at in [now - Duration::from_millis(1500), now, now + Duration::from_millis(1500)] {
            let back = instant_of(monotonic_at(at));
            // Off by the few instructions between two reads of the clock in each call; the
            // bound only has to catch a wrong sign or unit (3 s off).
            let off = back.max(at) - back.min(at);
            assert!(off < Duration::from_secs(1), "{off:?}");
        }
    }
}
