//! `--stats-interval`: one line per disk on standard output every interval (and once more when
//! the daemon stops), as text or, with `--json`, as a JSON object per line. Counts are since the
//! daemon started; rates and service-time percentiles are over the interval since the previous
//! line. Service time is from taking a request off the ring to putting it in the used ring, in
//! log2 buckets of TSC ticks (a percentile is its bucket's upper bound, so within 2x above).

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use metrics::latency::Histogram;
use rate_limiter::{Limits, RateLimiter};
use serde_json::{json, Value};
use virtio::{DeviceStats, DeviceStatsSnapshot};

/// A disk as the statistics see it.
pub struct DiskFigures {
    pub index: usize,
    pub name: String,
    pub socket: PathBuf,
    pub stats: Arc<DeviceStats>,
    pub limiter: Option<Arc<RateLimiter>>,
    pub iocore: usize,
    last: DeviceStatsSnapshot,
}

impl DiskFigures {
    pub fn new(
        (index, name): (usize, String),
        socket: PathBuf,
        stats: Arc<DeviceStats>,
        limiter: Option<Arc<RateLimiter>>,
        iocore: usize,
    ) -> DiskFigures {
        DiskFigures { index, name, socket, stats, limiter, iocore, last: DeviceStatsSnapshot::default() }
    }

    /// The limits in force (none without a rate limiter).
    pub fn limits(&self) -> Limits {
        self.limiter.as_ref().map(|l| l.limits()).unwrap_or_default()
    }

    /// The counts so far, as `GET /disks` shows them.
    pub fn counts(&self) -> Value {
        let now = self.stats.snapshot();
        let r = &now.requests;
        let limits = self.limits();
        json!({
            "requests": r.completed + r.io_errors + r.rejected,
            "completed": r.completed,
            "io_errors": r.io_errors,
            "rejected": r.rejected,
            "bytes": r.bytes,
            "needs_reset": now.needs_reset,
            "reset_timeouts": now.reset_timeouts,
            "reset_cancelled": now.reset_cancelled,
            "quarantined": now.quarantined,
            "iops_limit": limits.iops,
            "bw_limit": limits.bandwidth,
            "rate_limit_waits": self.limiter.as_ref().map_or(0, |l| l.waits()),
        })
    }
}

/// Prints the figures of every disk.
pub struct Reporter {
    json: bool,
    /// The daemon's start, before any rate limiter was made.
    started: Instant,
    last: Instant,
}

impl Reporter {
    pub fn new(json: bool, started: Instant) -> Reporter {
        Reporter { json, started, last: started }
    }

    /// One line per disk: the counts so far, and rates since the previous call.
    pub fn report<'a>(&mut self, disks: impl Iterator<Item = &'a mut DiskFigures>) {
        let now = Instant::now();
        let uptime = now.duration_since(self.started).as_secs_f64();
        let interval = now.duration_since(self.last).as_secs_f64().max(1e-9);
        self.last = now;
        let json = self.json;
        let mut out = std::io::stdout().lock();
        for disk in disks {
            let snapshot = disk.stats.snapshot();
            let line = figures(disk, &snapshot, uptime, interval);
            disk.last = snapshot;
            let _ = if json { writeln!(out, "{line}") } else { writeln!(out, "{}", text(&line)) };
        }
        let _ = out.flush();
    }
}

fn micros(histogram: &Histogram, permille: u64) -> Option<f64> {
    histogram.quantile_ticks(permille).map(|t| clock::to_duration(t).as_secs_f64() * 1e6)
}

fn figures(disk: &DiskFigures, now: &DeviceStatsSnapshot, uptime: f64, interval: f64) -> Value {
    let r = &now.requests;
    let delta = r.since(&disk.last.requests);
    let answered = |c: &virtio::RequestCounters| c.completed + c.io_errors + c.rejected;
    let latency = now.latency.since(&disk.last.latency);
    let limits = disk.limits();
    json!({
        "stats": "disk",
        "disk": disk.index,
        "name": disk.name,
        "socket": disk.socket.display().to_string(),
        "iocore": disk.iocore,
        "uptime_s": uptime,
        "interval_s": interval,
        "requests": answered(r),
        "completed": r.completed,
        "io_errors": r.io_errors,
        "rejected": r.rejected,
        "bytes": r.bytes,
        "needs_reset": now.needs_reset,
        "reset_timeouts": now.reset_timeouts,
        "reset_cancelled": now.reset_cancelled,
        "quarantined": now.quarantined,
        "iops": answered(&delta) as f64 / interval,
        "bytes_per_s": delta.bytes as f64 / interval,
        "p50_us": micros(&latency, 500),
        "p99_us": micros(&latency, 990),
        "max_us": micros(&latency, 1000),
        "iops_limit": limits.iops,
        "bw_limit": limits.bandwidth,
        "rate_limit_waits": disk.limiter.as_ref().map_or(0, |l| l.waits()),
    })
}

fn text(v: &Value) -> String {
    let us = |key: &str| v[key].as_f64().map_or("-".to_string(), |x| format!("{x:.1}"));
    let limits = match (v["iops_limit"].as_u64(), v["bw_limit"].as_u64()) {
        (None, None) => String::new(),
        (iops, bw) => format!(
            ", limits iops={} bw={}, {} waits",
            iops.map_or("-".into(), |n| n.to_string()),
            bw.map_or("-".into(), |n| n.to_string()),
            v["rate_limit_waits"]
        ),
    };
    format!(
        "exitless vhost-user-blk: {} ({}, IOCore {}): {} requests, {} bytes, {} I/O errors, {} refused; \
         last {:.1} s: {:.0} IOPS, {:.1} MB/s, service time p50 {} us p99 {} us max {} us{limits}",
        v["name"].as_str().unwrap_or(""),
        v["socket"].as_str().unwrap_or(""),
        v["iocore"],
        v["requests"],
        v["bytes"],
        v["io_errors"],
        v["rejected"],
        v["interval_s"].as_f64().unwrap_or(0.0),
        v["iops"].as_f64().unwrap_or(0.0),
        v["bytes_per_s"].as_f64().unwrap_or(0.0) / 1e6,
        us("p50_us"),
        us("p99_us"),
        us("max_us"),
    )
}
