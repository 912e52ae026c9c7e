//! Keeps up to the queue depth of requests in flight, refilling each slot as it completes, and
//! times every request from submission (just before the kick) to the moment its completion is
//! seen.

use crate::deadline::Deadline;
use crate::histogram::Histogram;
use crate::virtio::blk::{BlockDevice, MAX_IN_FLIGHT, S_OK};
use crate::virtio::Error;
use crate::x86;

/// What the requests are.
pub trait Job {
    /// Request number `index`: fill `buffer` if the device reads it, and return
    /// (request type, first sector, bytes).
    fn prepare(&mut self, index: u64, buffer: &mut [u8]) -> (u32, u64, u32);
    /// Request number `index` finished with `status`; `buffer` holds what the device wrote.
    fn complete(&mut self, index: u64, status: u8, buffer: &[u8]);
}

#[derive(Clone, Copy)]
pub enum Limit {
    Requests(u64),
    /// Submit until the TSC reaches this value, then drain.
    UntilTsc(u64),
}

#[derive(Clone, Copy, Default)]
pub struct Stats {
    pub ops: u64,
    pub errors: u64,
    pub cycles: u64,
}

/// The slots' bookkeeping: which request each holds, when it was submitted, and which were
/// filled since the last kick.
struct Slots {
    index_of: [u64; MAX_IN_FLIGHT],
    submitted_at: [u64; MAX_IN_FLIGHT],
    fresh: [usize; MAX_IN_FLIGHT],
    fresh_count: usize,
    submitted: u64,
}

impl Slots {
    /// Put the next request of `job` in `slot`.
    fn fill(&mut self, dev: &mut BlockDevice, job: &mut impl Job, slot: usize) {
        let index = self.submitted;
        let (kind, sector, len) = job.prepare(index, dev.buffer(slot));
        dev.submit(slot, kind, sector, len);
        self.index_of[slot] = index;
        self.submitted += 1;
        self.fresh[self.fresh_count] = slot;
        self.fresh_count += 1;
    }

    /// Stamp the freshly filled slots and let the device see them.
    fn kick(&mut self, dev: &mut BlockDevice) {
        if self.fresh_count == 0 {
            return;
        }
        let now = x86::rdtsc();
        for &slot in &self.fresh[..self.fresh_count] {
            self.submitted_at[slot] = now;
        }
        self.fresh_count = 0;
        dev.kick();
    }
}

/// Run `job` at the device's queue depth until `limit`, recording latencies (TSC cycles) in
/// `latencies` if given. Each wait for a completion is bounded by `timeout_ms`.
pub fn run(
    dev: &mut BlockDevice,
    job: &mut impl Job,
    limit: Limit,
    mut latencies: Option<&mut Histogram>,
    tsc_khz: u64,
    timeout_ms: u64,
) -> Result<Stats, Error> {
    let mut slots = Slots {
        index_of: [0; MAX_IN_FLIGHT],
        submitted_at: [0; MAX_IN_FLIGHT],
        fresh: [0; MAX_IN_FLIGHT],
        fresh_count: 0,
        submitted: 0,
    };
    let mut stats = Stats::default();
    let start = x86::rdtsc();
    let wants_more = |submitted: u64, now: u64| match limit {
        Limit::Requests(n) => submitted < n,
        Limit::UntilTsc(end) => now < end,
    };
    for slot in 0..dev.queue_depth() {
        if !wants_more(slots.submitted, start) {
            break;
        }
        slots.fill(dev, job, slot);
    }
    loop {
        slots.kick(dev);
        if dev.in_flight() == 0 {
            break;
        }
        let mut done = [(0usize, 0u8); MAX_IN_FLIGHT];
        let mut done_count = 0;
        dev.wait(Deadline::after_ms(tsc_khz, timeout_ms), |slot, status| {
            done[done_count] = (slot, status);
            done_count += 1;
        })?;
        let now = x86::rdtsc();
        for &(slot, status) in &done[..done_count] {
            if let Some(histogram) = latencies.as_deref_mut() {
                histogram.record(now - slots.submitted_at[slot]);
            }
            stats.ops += 1;
            if status != S_OK {
                stats.errors += 1;
            }
            job.complete(slots.index_of[slot], status, dev.buffer(slot));
            if wants_more(slots.submitted, now) {
                slots.fill(dev, job, slot);
            }
        }
    }
    stats.cycles = x86::rdtsc() - start;
    Ok(stats)
}
