//! Service-time histograms: log2 buckets of clock ticks (the `clock` crate), which a worker fills
//! locally (plain adds, per request) and adds to its device's shared histogram once per batch.

use std::sync::atomic::{AtomicU64, Ordering};

/// Buckets: bucket `b` counts times of `[2^(b-1), 2^b)` ticks (bucket 0: 0 ticks); the last one
/// everything longer (2^38 ticks is over a minute at any TSC rate).
pub const BUCKETS: usize = 40;

/// The bucket a time of `ticks` falls in.
#[inline]
pub fn bucket(ticks: u64) -> usize {
    let b = (u64::BITS - ticks.leading_zeros()) as usize;
    b.min(BUCKETS - 1)
}

/// The most ticks a time in bucket `b` may have taken (its upper bound).
pub fn bucket_limit(b: usize) -> u64 {
    if b >= 63 {
        u64::MAX
    } else {
        (1u64 << b).saturating_sub(1).max(1)
    }
}

/// A worker's own counts, added to its device's [`SharedHistogram`] once per batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalHistogram {
    counts: [u64; BUCKETS],
    reported: [u64; BUCKETS],
    /// The ticks of every time counted, and how many of them were reported.
    sum: u64,
    reported_sum: u64,
}

impl Default for LocalHistogram {
    fn default() -> Self {
        LocalHistogram { counts: [0; BUCKETS], reported: [0; BUCKETS], sum: 0, reported_sum: 0 }
    }
}

impl LocalHistogram {
    /// Count one request that took `ticks`.
    #[inline]
    pub fn record(&mut self, ticks: u64) {
        self.counts[bucket(ticks)] += 1;
        self.sum = self.sum.wrapping_add(ticks);
    }

    /// Add what changed since the last report to `shared`.
    pub fn report(&mut self, shared: &SharedHistogram) {
        for (b, (count, reported)) in self.counts.iter().zip(self.reported.iter_mut()).enumerate() {
            if count != reported {
                shared.counts[b].fetch_add(count - *reported, Ordering::Relaxed);
                *reported = *count;
            }
        }
        if self.sum != self.reported_sum {
            shared.sum.fetch_add(self.sum.wrapping_sub(self.reported_sum), Ordering::Relaxed);
            self.reported_sum = self.sum;
        }
    }
}

/// A device's histogram, added to by its workers and read by anyone.
#[derive(Debug)]
pub struct SharedHistogram {
    counts: [AtomicU64; BUCKETS],
    sum: AtomicU64,
}

impl Default for SharedHistogram {
    fn default() -> Self {
        SharedHistogram { counts: std::array::from_fn(|_| AtomicU64::new(0)), sum: AtomicU64::new(0) }
    }
}

impl SharedHistogram {
    /// The ticks of every time counted, added up (wrapping after some 200 years of service
    /// time at 3 GHz).
    pub fn sum_ticks(&self) -> u64 {
        self.sum.load(Ordering::Relaxed)
    }

    /// A copy of the counts.
    pub fn snapshot(&self) -> Histogram {
        Histogram(std::array::from_fn(|b| self.counts[b].load(Ordering::Relaxed)))
    }
}

/// Counts per bucket, copied out of a [`SharedHistogram`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Histogram(pub [u64; BUCKETS]);

impl Default for Histogram {
    fn default() -> Self {
        Histogram([0; BUCKETS])
    }
}

impl Histogram {
    /// What was counted since `earlier`.
    pub fn since(&self, earlier: &Histogram) -> Histogram {
        Histogram(std::array::from_fn(|b| self.0[b].saturating_sub(earlier.0[b])))
    }

    /// How many times were counted.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// The upper bound, in ticks, of the bucket holding the quantile of `permille` thousandths
    /// (500: the median, 1000: the maximum); `None` when nothing was counted.
    pub fn quantile_ticks(&self, permille: u64) -> Option<u64> {
        let total = self.total();
        if total == 0 {
            return None;
        }
        // The rank of the quantile, at least the first.
        let rank = u64::try_from((u128::from(total) * u128::from(permille.min(1000))).div_ceil(1000))
            .unwrap_or(total)
            .clamp(1, total);
        let mut seen = 0;
        for (b, &count) in self.0.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Some(bucket_limit(b));
            }
        }
        Some(bucket_limit(BUCKETS - 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_land_in_their_power_of_two() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1), 1);
        assert_eq!(bucket(2), 2);
        assert_eq!(bucket(3), 2);
        assert_eq!(bucket(1024), 11);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        for t in [1u64, 5, 1000, 123_456] {
            assert!(t <= bucket_limit(bucket(t)));
        }
    }

    #[test]
    fn quantiles_come_from_the_shared_counts() {
        let shared = SharedHistogram::default();
        let mut local = LocalHistogram::default();
        for _ in 0..99 {
            local.record(100);
        }
        local.record(1_000_000);
        local.report(&shared);
        local.report(&shared);
        let h = shared.snapshot();
        assert_eq!(h.total(), 100);
        assert_eq!(h.quantile_ticks(500), Some(127));
        assert_eq!(h.quantile_ticks(990), Some(127));
        assert_eq!(h.quantile_ticks(1000), Some((1 << 20) - 1));
        assert_eq!(Histogram::default().quantile_ticks(500), None);
        assert_eq!(shared.sum_ticks(), 99 * 100 + 1_000_000, "reported once, however often asked");
    }
}
