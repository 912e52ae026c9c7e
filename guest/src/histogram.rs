//! A fixed-size log-linear latency histogram (HDR-style): exact below 32, then 32 linear
//! buckets per power of two, so any value is known to within 1/32 (~3%). No allocation.

/// Linear buckets per power of two, as a power of two.
const SUB_BITS: u32 = 5;
const SUB: usize = 1 << SUB_BITS;
/// Values below `SUB` get one bucket each; then one group of `SUB` per exponent up to 63.
const BUCKETS: usize = SUB * (64 - SUB_BITS as usize + 1);

pub struct Histogram {
    counts: [u32; BUCKETS],
    total: u64,
    max: u64,
}

fn bucket(value: u64) -> usize {
    if value < SUB as u64 {
        return value as usize;
    }
    let exponent = 63 - value.leading_zeros();
    let shift = exponent - SUB_BITS;
    let sub = (value >> shift) as usize - SUB;
    SUB * (shift as usize + 1) + sub
}

/// The middle of bucket `index`.
fn bucket_value(index: usize) -> u64 {
    if index < SUB {
        return index as u64;
    }
    let shift = (index / SUB - 1) as u32;
    let low = ((SUB + index % SUB) as u64) << shift;
    low + (1u64 << shift) / 2
}

impl Histogram {
    pub const fn new() -> Histogram {
        Histogram { counts: [0; BUCKETS], total: 0, max: 0 }
    }

    pub fn record(&mut self, value: u64) {
        let count = &mut self.counts[bucket(value)];
        *count = count.saturating_add(1);
        self.total += 1;
        self.max = self.max.max(value);
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    /// The value below which `per_mille`/1000 of the samples lie (0 when empty).
    pub fn percentile(&self, per_mille: u64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = (self.total * per_mille).div_ceil(1000).max(1);
        let mut seen = 0u64;
        for (index, &count) in self.counts.iter().enumerate() {
            seen += count as u64;
            if seen >= rank {
                return bucket_value(index).min(self.max);
            }
        }
        self.max
    }
}
