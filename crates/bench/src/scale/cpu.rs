//! CPU time of a set-up's processes while it runs: a thread samples every 20 ms the on-CPU
//! time of every thread of every process (`/proc/PID/task/TID/schedstat`, nanoseconds), so the
//! cores a set-up used can be taken over any interval afterwards (the VMs' common measured
//! window).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the sampler reads /proc.
const PERIOD: Duration = Duration::from_millis(20);

/// The processes to watch (more may be added while it runs) and the samples taken.
pub struct Sampler {
    pids: Arc<Mutex<Vec<u32>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<Sample>>>,
}

impl Sampler {
    pub fn start() -> Sampler {
        let pids = Arc::new(Mutex::new(Vec::<u32>::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (pids, stop) = (pids.clone(), stop.clone());
            std::thread::spawn(move || {
                // Each process's highest total seen: a process that ended (or a thread that
                // ended) keeps what it used, so the sum never goes back.
                let mut last: HashMap<u32, f64> = HashMap::new();
                let mut samples = Vec::new();
                // One more sample after the stop, so the samples cover everything before it.
                loop {
                    let stopping = stop.load(Ordering::Acquire);
                    let now = Instant::now();
                    let watched: Vec<u32> = pids.lock().map(|p| p.clone()).unwrap_or_default();
                    for pid in watched {
                        let seen = process_cpu_s(pid);
                        let entry = last.entry(pid).or_insert(0.0);
                        *entry = entry.max(seen);
                    }
                    samples.push(Sample { at: now, setup: last.values().sum(), host: host_busy_s() });
                    if stopping {
                        break;
                    }
                    std::thread::sleep(PERIOD);
                }
                samples
            })
        };
        Sampler { pids, stop, thread: Some(thread) }
    }

    /// Watch `pid` too.
    pub fn watch(&self, pid: u32) {
        if let Ok(mut pids) = self.pids.lock() {
            pids.push(pid);
        }
    }

    /// A handle that adds processes from another thread.
    pub fn watcher(&self) -> Arc<Mutex<Vec<u32>>> {
        self.pids.clone()
    }

    /// Stops sampling; returns the samples (time, total CPU seconds so far).
    pub fn finish(mut self) -> Samples {
        self.stop.store(true, Ordering::Release);
        Samples(self.thread.take().and_then(|t| t.join().ok()).unwrap_or_default())
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// One look at the CPU time used so far.
#[derive(Clone, Copy)]
struct Sample {
    at: Instant,
    /// CPU seconds of every watched process.
    setup: f64,
    /// CPU seconds every CPU of the host spent busy (not idle nor waiting), whoever ran.
    host: f64,
}

/// Samples in time order.
pub struct Samples(Vec<Sample>);

impl Samples {
    /// CPU seconds used between `from` and `to` over the wall seconds between them (linear
    /// between samples); `None` if the samples do not cover the interval.
    pub fn cores(&self, from: Instant, to: Instant) -> Option<f64> {
        self.rate(from, to, |s| s.setup)
    }

    /// The cores the rest of the host (everything but the set-up) kept busy meanwhile.
    pub fn other_cores(&self, from: Instant, to: Instant) -> Option<f64> {
        Some((self.rate(from, to, |s| s.host)? - self.cores(from, to)?).max(0.0))
    }

    fn rate(&self, from: Instant, to: Instant, of: impl Fn(&Sample) -> f64) -> Option<f64> {
        let wall = to.checked_duration_since(from)?.as_secs_f64();
        (wall > 0.0).then_some((self.at(to, &of)? - self.at(from, &of)?) / wall)
    }

    fn at(&self, t: Instant, of: impl Fn(&Sample) -> f64) -> Option<f64> {
        let after = self.0.iter().position(|s| s.at >= t)?;
        let (t1, c1) = (self.0[after].at, of(&self.0[after]));
        let Some((t0, c0)) = after.checked_sub(1).and_then(|i| self.0.get(i)).map(|s| (s.at, of(s))) else {
            return (t1 == t).then_some(c1);
        };
        let span = t1.duration_since(t0).as_secs_f64();
        let part = t.duration_since(t0).as_secs_f64();
        Some(if span > 0.0 { c0 + (c1 - c0) * part / span } else { c1 })
    }
}

/// Seconds all CPUs spent busy since boot: user, nice, system, irq, softirq and steal time from
/// /proc/stat (0 if unreadable).
fn host_busy_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().next().and_then(|l| l.strip_prefix("cpu ")) else { return 0.0 };
    let fields: Vec<u64> = cpu.split_whitespace().filter_map(|v| v.parse().ok()).collect();
    let busy: u64 = [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| fields.get(i)).sum();
    // SAFETY: sysconf has no memory-safety preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    busy as f64 / per_second
}

/// On-CPU seconds of every thread of `pid` now (0 if it is gone).
fn process_cpu_s(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0.0 };
    let mut ns: u64 = 0;
    for task in tasks.flatten() {
        let path = task.path().join("schedstat");
        if let Some(v) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()))
        {
            ns = ns.saturating_add(v);
        }
    }
    if ns == 0 {
        // No schedstat (a kernel without CONFIG_SCHED_INFO): user + system ticks.
        return crate::qemu::process_cpu_time(pid).as_secs_f64();
    }
    ns as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpolates_between_samples() {
        let t0 = Instant::now();
        let at = |secs, setup| Sample { at: t0 + Duration::from_secs(secs), setup, host: 2.0 * setup };
        let s = Samples(vec![at(0, 1.0), at(1, 2.0), at(2, 4.0)]);
        let half = t0 + Duration::from_millis(500);
        assert!((s.cores(half, t0 + Duration::from_secs(2)).unwrap() - 2.5 / 1.5).abs() < 1e-9);
        assert!(s.cores(t0, t0 + Duration::from_secs(3)).is_none(), "past the last sample");
        assert!((s.other_cores(t0, t0 + Duration::from_secs(2)).unwrap() - 1.5).abs() < 1e-9);
    }

    #[test]
    fn counts_this_process() {
        assert!(process_cpu_s(std::process::id()) > 0.0);
    }
}
