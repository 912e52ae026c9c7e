//! Per-disk QoS: token buckets for requests per second and bytes per second, as Firecracker's
//! rate limiter offers, checked by the worker before it takes a request off the ring. A limited
//! request is not failed: it stays in the ring until the buckets refill. Buckets refill from the
//! clock value the worker read once for its pass (the `clock` crate), so enforcing a limit costs
//! no system call; they hold at most one second's budget (the burst) and start full.
//!
//! The request bucket never goes below zero (a request is taken only while a token is left).
//! The byte bucket is checked before a request's size is known (it is parsed after it is taken
//! off the ring), so the request that empties it may take it into debt, which later refills pay
//! back first: over any run of `t` seconds a disk serves at most `iops * (t + 1)` requests and
//! `bw * (t + 1)` bytes plus one request's bytes.

#![deny(missing_docs)]
#![cfg_attr(not(test), warn(clippy::cast_possible_truncation, clippy::cast_sign_loss))]

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// A disk's limits; `None`: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Requests per second.
    pub iops: Option<u64>,
    /// Data bytes per second (reads and writes).
    pub bandwidth: Option<u64>,
}

impl Limits {
    /// Is anything limited?
    pub fn any(&self) -> bool {
        self.iops.is_some() || self.bandwidth.is_some()
    }
}

/// One token bucket: `rate` tokens per second, at most `rate` held (one second's burst); a rate
/// of 0 is no limit. The rate may change while workers use the bucket ([`RateLimiter::set`]).
#[derive(Debug)]
struct TokenBucket {
    rate: AtomicU64,
    tokens: AtomicI64,
    /// The clock value up to which refills have been credited.
    credited: AtomicU64,
}

impl TokenBucket {
    fn new(rate: Option<u64>, now: u64) -> TokenBucket {
        let rate = rate.map_or(0, |r| r.max(1));
        TokenBucket {
            rate: AtomicU64::new(rate),
            tokens: AtomicI64::new(capacity(rate)),
            credited: AtomicU64::new(now),
        }
    }

    fn rate(&self) -> Option<u64> {
        Some(self.rate.load(Ordering::Relaxed)).filter(|&r| r > 0)
    }

    /// A new rate (`None`: no limit). The bucket keeps its tokens, but at most the new one
    /// second's budget, so a lower limit holds from now on; a new limit on an unlimited bucket
    /// starts full, as a disk's first limit does.
    fn set_rate(&self, rate: Option<u64>, now: u64) {
        let rate = rate.map_or(0, |r| r.max(1));
        let was_limited = self.rate.swap(rate, Ordering::AcqRel) > 0;
        let cap = capacity(rate);
        if was_limited {
            let _ = self.tokens.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |t| Some(t.min(cap)));
        } else {
            self.tokens.store(cap, Ordering::Release);
            self.credited.store(now, Ordering::Release);
        }
    }

    /// Credit the tokens earned up to `now`. Whoever moves `credited` forward adds them, so two
    /// threads refilling at once credit each interval once.
    fn refill(&self, now: u64, ticks_per_second: u64) {
        let Some(rate) = self.rate() else { return };
        let credited = self.credited.load(Ordering::Acquire);
        let elapsed = u128::from(now.saturating_sub(credited));
        let earned = elapsed * u128::from(rate) / u128::from(ticks_per_second);
        if earned == 0 {
            return;
        }
        let cap = capacity(rate);
        let full = self.tokens.load(Ordering::Relaxed) >= cap;
        // The ticks that paid for `earned` tokens; the remainder counts toward the next one.
        // When the bucket is full nothing is owed: start counting afresh from `now`.
        let paid = if full {
            now
        } else {
            let ticks = earned * u128::from(ticks_per_second) / u128::from(rate);
            credited.saturating_add(u64::try_from(ticks).unwrap_or(u64::MAX)).min(now)
        };
        if self.credited.compare_exchange(credited, paid, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return;
        }
        let earned = i64::try_from(earned).unwrap_or(i64::MAX);
        let _ = self
            .tokens
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |t| Some(t.saturating_add(earned).min(cap)));
    }

    /// Does the bucket allow a request needing at least `min` tokens?
    #[inline]
    fn holds(&self, min: i64) -> bool {
        self.rate.load(Ordering::Relaxed) == 0 || self.tokens.load(Ordering::Relaxed) >= min
    }

    #[inline]
    fn take(&self, n: u64) {
        if self.rate.load(Ordering::Relaxed) > 0 {
            self.tokens.fetch_sub(i64::try_from(n).unwrap_or(i64::MAX), Ordering::AcqRel);
        }
    }
}

/// One second's budget.
fn capacity(rate: u64) -> i64 {
    i64::try_from(rate).unwrap_or(i64::MAX)
}

/// The buckets of one disk, shared by its queues' workers. Its limits may change while they
/// run ([`RateLimiter::set`]).
#[derive(Debug)]
pub struct RateLimiter {
    ops: TokenBucket,
    bytes: TokenBucket,
    ticks_per_second: u64,
    /// Passes in which a worker left requests in the ring because a bucket was empty.
    waits: AtomicU64,
}

impl RateLimiter {
    /// Buckets for `limits`, full.
    pub fn new(limits: Limits) -> RateLimiter {
        let now = clock::ticks();
        RateLimiter {
            ops: TokenBucket::new(limits.iops, now),
            bytes: TokenBucket::new(limits.bandwidth, now),
            ticks_per_second: clock::ticks_per_second(),
            waits: AtomicU64::new(0),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        Limits { iops: self.ops.rate(), bandwidth: self.bytes.rate() }
    }

    /// Change the limits while workers use them. A bucket keeps the tokens it holds, up to its
    /// new one second's budget; a bucket that had no limit starts full.
    pub fn set(&self, limits: Limits) {
        let now = clock::ticks();
        self.ops.set_rate(limits.iops, now);
        self.bytes.set_rate(limits.bandwidth, now);
    }

    /// Credit what the buckets earned up to `now` (a [`clock::ticks`] value).
    pub fn refill(&self, now: u64) {
        self.ops.refill(now, self.ticks_per_second);
        self.bytes.refill(now, self.ticks_per_second);
    }

    /// May one more request be taken now?
    #[inline]
    pub fn allows(&self) -> bool {
        self.ops.holds(1) && self.bytes.holds(1)
    }

    /// A request of `bytes` data bytes was taken.
    #[inline]
    pub fn consume(&self, bytes: u64) {
        self.ops.take(1);
        self.bytes.take(bytes);
    }

    /// A worker left requests waiting for tokens.
    pub fn note_wait(&self) {
        self.waits.fetch_add(1, Ordering::Relaxed);
    }

    /// Passes in which requests waited for tokens, so far.
    pub fn waits(&self) -> u64 {
        self.waits.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_starts_with_one_second_and_refills_at_its_rate() {
        let tps = clock::ticks_per_second();
        let limiter = RateLimiter::new(Limits { iops: Some(100), bandwidth: None });
        let start = limiter.ops.credited.load(Ordering::Relaxed);
        let mut taken = 0;
        while limiter.allows() {
            limiter.consume(4096);
            taken += 1;
        }
        assert_eq!(taken, 100, "the burst is one second's budget");
        // A quarter of a second later: 25 more, in small steps that each earn a fraction. The
        // steps round up: rounded down, a quarter second fell short of the 25th token whenever
        // the measured tick rate was 1-3 past a multiple of 100 (a test that failed at random).
        for step in 1..=250u64 {
            limiter.refill(start + (tps * step).div_ceil(1000));
        }
        while limiter.allows() {
            limiter.consume(4096);
            taken += 1;
        }
        assert_eq!(taken, 125);
        // Ten idle seconds refill at most the burst.
        limiter.refill(start + tps * 11);
        assert_eq!(limiter.ops.tokens.load(Ordering::Relaxed), 100);
    }

    #[test]
    fn bytes_may_go_into_debt_by_one_request_which_refills_pay_first() {
        let tps = clock::ticks_per_second();
        let limiter = RateLimiter::new(Limits { iops: None, bandwidth: Some(10_000) });
        let start = limiter.bytes.credited.load(Ordering::Relaxed);
        let mut bytes = 0;
        while limiter.allows() {
            limiter.consume(4096);
            bytes += 4096;
        }
        assert_eq!(bytes, 12_288, "three 4 KiB requests: the third takes the bucket into debt");
        limiter.refill(start + tps / 10);
        assert!(!limiter.allows(), "1000 bytes earned do not pay a 2288-byte debt");
        limiter.refill(start + tps * 3 / 10);
        assert!(limiter.allows());
    }

    #[test]
    fn limits_change_while_in_use() {
        let limiter = RateLimiter::new(Limits::default());
        for _ in 0..10_000 {
            assert!(limiter.allows(), "no limit lets everything through");
            limiter.consume(1 << 20);
        }
        // A first limit starts full, as a new disk's does.
        limiter.set(Limits { iops: Some(1000), bandwidth: None });
        assert_eq!(limiter.limits(), Limits { iops: Some(1000), bandwidth: None });
        let mut taken = 0;
        while limiter.allows() && taken < 10_000 {
            limiter.consume(4096);
            taken += 1;
        }
        assert_eq!(taken, 1000);
        // A lower limit holds at once: the bucket keeps at most its new budget.
        limiter.set(Limits { iops: Some(2000), bandwidth: None });
        assert!(!limiter.allows(), "a higher limit does not refill the bucket");
        let limiter = RateLimiter::new(Limits { iops: Some(1000), bandwidth: None });
        limiter.set(Limits { iops: Some(10), bandwidth: Some(4096) });
        let mut taken = 0;
        while limiter.allows() && taken < 10_000 {
            limiter.consume(1024);
            taken += 1;
        }
        assert_eq!(taken, 4, "the new byte limit starts full: 4 KiB in 1 KiB requests");
        limiter.set(Limits::default());
        assert!(limiter.allows(), "limits removed");
    }
}
