//! `GET /metrics`: the daemon's figures in the Prometheus text exposition format (version
//! 0.0.4), in base units: counters since the daemon started (`_total`), seconds for times.
//!
//! Per disk (label `disk`, its name): requests by outcome, bytes, service times as a histogram
//! (taken off the ring to put in the used ring), rate-limit waits, needs-reset events, whether a
//! frontend is connected and the limits in force. Per IOCore (label `iocore`): busy and idle
//! seconds (see `iocore::IoCoreTimes`).

use std::fmt::Write;

use metrics::exposition::{escape, family, per_iocore_seconds, sample};
use metrics::latency::{bucket_limit, BUCKETS};
use virtio::DeviceStatsSnapshot;

use crate::disks::{Disk, Disks};

pub use metrics::exposition::CONTENT_TYPE;

/// Every metric of every disk and IOCore.
pub fn render(disks: &Disks) -> String {
    let mut out = String::with_capacity(16 << 10);
    let all: Vec<_> = disks.iter().map(|d| (d, d.figures.stats.snapshot())).collect();

    family(
        &mut out,
        "exitless_disk_requests_total",
        "counter",
        "Requests answered, by outcome: completed, io_error (the backend failed it), refused (malformed or unsupported).",
    );
    for (disk, now) in &all {
        let r = &now.requests;
        for (outcome, n) in [("completed", r.completed), ("io_error", r.io_errors), ("refused", r.rejected)] {
            let labels = [("disk", disk.figures.name.as_str()), ("outcome", outcome)];
            sample(&mut out, "exitless_disk_requests_total", &labels, n);
        }
    }
    family(&mut out, "exitless_disk_queue_requests_total", "counter", "Requests answered, by virtqueue.");
    for (disk, now) in &all {
        let queues = usize::from(disk.queues).min(now.per_queue.len());
        for (queue, &n) in now.per_queue[..queues].iter().enumerate() {
            let queue = queue.to_string();
            let labels = [("disk", disk.figures.name.as_str()), ("queue", &queue)];
            sample(&mut out, "exitless_disk_queue_requests_total", &labels, n);
        }
    }
    let per_disk: [(&str, &str, &str, PerDisk); 9] = [
        (
            "exitless_disk_bytes_total",
            "counter",
            "Data bytes read or written by completed requests.",
            |_, now| Some(now.requests.bytes),
        ),
        (
            "exitless_disk_rate_limit_waits_total",
            "counter",
            "IOCore passes in which the disk's requests waited for its rate limit.",
            |disk, _| Some(disk.figures.limiter.as_ref().map_or(0, |l| l.waits())),
        ),
        (
            "exitless_disk_needs_reset_total",
            "counter",
            "Times the driver broke a queue and the device asked for a reset.",
            |_, now| Some(now.needs_reset),
        ),
        (
            "exitless_disk_reset_timeouts_total",
            "counter",
            "Resets that waited longer than the disk's reset-timeout for its requests and cancelled them.",
            |_, now| Some(now.reset_timeouts),
        ),
        (
            "exitless_disk_reset_cancelled_total",
            "counter",
            "Requests that ended once such a reset cancelled them.",
            |_, now| Some(now.reset_cancelled),
        ),
        (
            "exitless_disk_quarantined_requests",
            "gauge",
            "Requests the disk still holds that no cancel ended, kept with their old guest memory until it finishes them.",
            |_, now| Some(now.quarantined),
        ),
        (
            "exitless_disk_frontend_connected",
            "gauge",
            "1 while a vhost-user frontend is connected to the disk.",
            |disk, _| Some(u64::from(disk.frontend_connected())),
        ),
        (
            "exitless_disk_iops_limit",
            "gauge",
            "The disk's limit in requests per second (absent: none).",
            |disk, _| disk.figures.limits().iops,
        ),
        (
            "exitless_disk_bandwidth_limit_bytes",
            "gauge",
            "The disk's limit in bytes per second (absent: none).",
            |disk, _| disk.figures.limits().bandwidth,
        ),
    ];
    for (name, kind, help, value) in per_disk {
        family(&mut out, name, kind, help);
        for (disk, now) in &all {
            if let Some(v) = value(disk, now) {
                sample(&mut out, name, &[("disk", &disk.figures.name)], v);
            }
        }
    }
    family(
        &mut out,
        "exitless_disk_request_duration_seconds",
        "histogram",
        "Service time: from taking a request off the ring to putting it in the used ring.",
    );
    for (disk, now) in &all {
        let name = disk.figures.name.as_str();
        // Buckets 0 and 1 share their bound (1 tick): the first line counts both.
        let mut cumulative = now.latency.0[0];
        for (b, &count) in now.latency.0.iter().enumerate().skip(1) {
            cumulative += count;
            let le = if b == BUCKETS - 1 { "+Inf".to_owned() } else { seconds(bucket_limit(b)) };
            let labels = [("disk", name), ("le", &le)];
            sample(&mut out, "exitless_disk_request_duration_seconds_bucket", &labels, cumulative);
        }
        let sum = seconds(disk.figures.stats.latency().sum_ticks());
        let _ =
            writeln!(out, "exitless_disk_request_duration_seconds_sum{{disk=\"{}\"}} {sum}", escape(name));
        sample(&mut out, "exitless_disk_request_duration_seconds_count", &[("disk", name)], cumulative);
    }
    let times: Vec<_> = disks.iocores().iter().map(|io| io.times()).collect();
    per_iocore_seconds(
        &mut out,
        "exitless_iocore_busy_seconds_total",
        "IOCore time in passes that started or finished a request.",
        times.iter().map(|t| t.busy),
    );
    per_iocore_seconds(
        &mut out,
        "exitless_iocore_idle_seconds_total",
        "IOCore time in passes that found nothing to do, spinning or asleep.",
        times.iter().map(|t| t.idle),
    );
    out
}

/// A per-disk value; `None`: no sample for that disk.
type PerDisk = fn(&Disk, &DeviceStatsSnapshot) -> Option<u64>;

/// `ticks` of the `clock` crate in seconds, as an exposition float.
fn seconds(ticks: u64) -> String {
    format!("{:e}", ticks as f64 / clock::ticks_per_second() as f64)
}
