//! The bare-metal baseline of the block benchmarks: the guest's workload run on the host by fio,
//! against the same backing file, with the disk's caching (O_DIRECT, or through the page cache
//! for the matrix's buffered disks), one job allowed the same CPUs the guest set-up
//! uses (the vCPU's and the IOCore's cores), once per engine: `psync` (queue depth 1), `libaio`
//! and `io_uring` (the requested queue depth). The run with the most IOPS counts, and
//! the report names it. For a RAM disk, [`Engine::Mmap`] measures the device
//! itself: fio's `mmap` engine copies to or from a mapping of the file, no system call per I/O
//! (and no O_DIRECT: with it fio's mmap engine syncs each I/O, which is no longer a memory copy).
//! For a null disk, [`Engine::Null`] is the baseline: fio's `null` engine, which has no file and
//! completes every I/O at once (fio's own cost of an I/O on the host). For an RBD image,
//! [`RBD_ENGINES`]: fio's `rbd` engine (librbd, its cache off as exitless's) sleeping until a
//! completion comes and busy-polling for it; the better is the baseline.
//!
//! Cores: fio's job thread may run on any of [`FioJob::cpus`]. With `io_uring`, I/O the kernel
//! cannot complete without blocking is handed to an `iou-wrk` worker thread, which inherits the
//! job's CPU set. Not used: `--sqthread_poll` (a kernel thread polling the submission queue, a
//! third user of the cores), `--hipri` (polled completions: only block devices with poll
//! queues, files answer EOPNOTSUPP), `--fixedbufs`/`--registerfiles` (within noise, and fixed
//! buffers can hit RLIMIT_MEMLOCK on older kernels).
//!
//! Latency is fio's *total* latency (`lat_ns`, submission to completion, i.e. slat + clat), asked
//! for with `--lat_percentiles=1`: what a guest sees from posting a request to seeing it done. For
//! `psync` and `mmap` submission latency is 0, so it equals completion latency.

use std::io::ErrorKind;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use storage::RbdSpec;
use thiserror::Error;

/// One baseline workload: what fio runs, on which file and core.
#[derive(Clone, Debug)]
pub struct FioJob {
    /// The backing file (or block device). It must exist and, if a regular file, hold at least
    /// `size` bytes: fio is told not to create or extend it. Write workloads overwrite its data.
    pub path: PathBuf,
    /// The workload: fio's `--rw` (`randread`, `randwrite`, `read` or `write`), or `writeflush`:
    /// random writes each followed by an fdatasync (`--rw=randwrite --fdatasync=1`; with the rbd
    /// engine an fsync, `--fsync=1`, its flush), whose IOPS count both, as the guest's FLUSHes
    /// are requests.
    pub rw: &'static str,
    /// Open the file with O_DIRECT (as the guest's disk is), or go through the page cache.
    pub direct: bool,
    /// Bytes per I/O.
    pub block_size: u32,
    /// The queue depth for `libaio` and `io_uring` (`psync` and `mmap` always run at depth 1).
    pub queue_depth: u32,
    /// How long each engine runs (at least 1 ms; fio's granularity is milliseconds here).
    pub runtime: Duration,
    /// The host CPUs the job may run on (`--cpus_allowed`).
    pub cpus: Vec<usize>,
    /// Bytes of the file the workload spans, from offset 0.
    pub size: u64,
    /// Put fio's buffers on 2 MiB huge pages (`--iomem=shmhuge`, from the host's reserved pool):
    /// see [`buffers_on_huge_pages`].
    pub huge_pages: bool,
    /// The RBD image [`Engine::Rbd`] works on (`path` is then not used): its pool, name, cephx
    /// user and cluster configuration file (fio's rbd engine reads the file `$CEPH_CONF` names).
    pub rbd: Option<RbdSpec>,
}

/// Whether fio's buffers for `queue_depth` requests of `block_size` bytes go on huge pages, as
/// the guest's RAM does (it asks for transparent huge pages): for requests larger than a 4 KiB
/// page, when the host gives transparent huge pages and has enough reserved ones free for fio.
/// A large O_DIRECT request reaches the disk in one segment per physically contiguous run of
/// its buffer, and that, not the I/O path, set the pace of 128 KiB reads, for the guest and
/// for fio alike (docs/tuning.md). A page-sized request is one segment either way.
pub fn buffers_on_huge_pages(block_size: u32, queue_depth: u32) -> bool {
    const HUGE_PAGE: u64 = 2 << 20;
    if block_size <= 4096 || !vmm::memory::transparent_huge_pages() {
        return false;
    }
    // fio allocates queue_depth * block_size bytes, plus one page of alignment.
    let needed = (u64::from(queue_depth) * u64::from(block_size)).div_ceil(HUGE_PAGE) + 1;
    vmm::memory::free_huge_pages().is_ok_and(|free| free >= needed)
}

/// A fio I/O engine the baseline tries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// `pread`/`pwrite`, one I/O at a time.
    Psync,
    /// Linux native AIO (`io_submit`/`io_getevents`) at the job's queue depth.
    Libaio,
    /// `io_uring` at the job's queue depth.
    IoUring,
    /// A memory copy to or from a mapping of the file, one I/O at a time, no system call and no
    /// O_DIRECT: the speed of a memory-backed device itself.
    Mmap,
    /// No file and no system call: every I/O completes at once, at the job's queue depth (the
    /// host's peer of a null disk). The job's path is not used.
    Null,
    /// librbd on the job's RBD image at the job's queue depth (`rbd_aio_*`), its cache off;
    /// with `busy_poll` fio spins on the completions instead of sleeping until one comes.
    Rbd { busy_poll: bool },
}

/// The engines whose best run is the bare-metal baseline: each I/O is a system call, as it is for
/// any program using a disk.
pub const SYSCALL_ENGINES: [Engine; 3] = [Engine::Psync, Engine::Libaio, Engine::IoUring];

/// The engines whose best run is an RBD image's bare-metal baseline: fio's rbd engine sleeping
/// until a completion comes, and spinning on them (as a polling IOCore does).
pub const RBD_ENGINES: [Engine; 2] = [Engine::Rbd { busy_poll: false }, Engine::Rbd { busy_poll: true }];

/// What fio's rbd engine (librbd) gets besides the configuration file: exitless's forced
/// setting, whatever the file says (librados reads `$CEPH_ARGS` over the file).
const RBD_CEPH_ARGS: &str = "--rbd_cache=false";

impl Engine {
    /// fio's name for it (`--ioengine=`).
    pub fn name(self) -> &'static str {
        match self {
            Engine::Psync => "psync",
            Engine::Libaio => "libaio",
            Engine::IoUring => "io_uring",
            Engine::Mmap => "mmap",
            Engine::Null => "null",
            Engine::Rbd { .. } => "rbd",
        }
    }

    /// Its name in the reports (`rbd busy_poll` for the spinning rbd engine, else the name).
    pub fn label(self) -> &'static str {
        match self {
            Engine::Rbd { busy_poll: true } => "rbd busy_poll",
            _ => self.name(),
        }
    }

    fn queue_depth(self, job: &FioJob) -> u32 {
        match self {
            Engine::Psync | Engine::Mmap => 1,
            Engine::Libaio | Engine::IoUring | Engine::Null | Engine::Rbd { .. } => job.queue_depth,
        }
    }
}

/// What one fio run measured.
#[derive(Clone, Debug, Serialize)]
pub struct FioResult {
    /// fio's engine ([`Engine::label`]: `psync`, `libaio`, `io_uring`, `mmap`, `null`, `rbd`,
    /// `rbd busy_poll`).
    pub engine: &'static str,
    pub iops: f64,
    /// Median total latency (submission to completion), microseconds.
    pub p50_us: f64,
    /// 99th-percentile total latency, microseconds.
    pub p99_us: f64,
    /// fio's buffers were on 2 MiB huge pages.
    pub huge_pages: bool,
    /// The queue depth fio ran at (1 for `psync` and `mmap`).
    pub queue_depth: u32,
    /// The fio command line, shell-quoted, to reproduce the run.
    pub command: String,
    /// fio's job's CPU time (user + system, as fio reports it) over its run time, in cores.
    pub cores: Option<f64>,
    /// On an RBD image of the bench's own cluster: the cores its daemons used over the run
    /// (filled in by the bench, which knows the cluster).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_cores: Option<f64>,
}

#[derive(Debug, Error)]
pub enum BaselineError {
    #[error("fio is not installed: install fio (scripts/setup.sh does)")]
    NotInstalled,
    #[error("cannot start fio: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("bad baseline job: {0}")]
    InvalidJob(String),
    #[error("backing file {path}: {reason}")]
    BackingFile { path: String, reason: String },
    #[error("fio's rbd engine needs an RBD image, and the job names none")]
    NoImage,
    #[error("fio failed ({status}): {message}; to see all of it, run: {command}")]
    Failed { status: String, message: String, command: String },
    #[error("cannot read fio's output ({reason}); to see it, run: {command}")]
    Unparsable { reason: String, command: String },
}

/// Runs `job` once with `engine` and returns what fio measured.
pub fn run(job: &FioJob, engine: Engine) -> Result<FioResult, BaselineError> {
    check(job, engine)?;
    let args = fio_args(job, engine)?;
    let env = fio_env(job, engine);
    let command = env
        .iter()
        .map(|(key, value)| format!("{key}={}", shell_quote(value)))
        .chain(std::iter::once("fio".to_string()))
        .chain(args.iter().map(|w| shell_quote(w)))
        .collect::<Vec<_>>()
        .join(" ");
    let output = Command::new("fio").args(&args).envs(env).stdin(Stdio::null()).output().map_err(|e| {
        if e.kind() == ErrorKind::NotFound {
            BaselineError::NotInstalled
        } else {
            BaselineError::Spawn(e)
        }
    })?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        // A job's error is a `fio: pid=N, err=...` line before the JSON document.
        let message = last_line(&stderr)
            .or_else(|| stdout.lines().find(|l| l.starts_with("fio: ")))
            .or_else(|| last_line(&stdout))
            .unwrap_or("no message")
            .to_string();
        return Err(BaselineError::Failed { status: output.status.to_string(), message, command });
    }
    // librbd's flush with its cache off has nothing to write back: the writes are the latency.
    let flush_latency = !matches!(engine, Engine::Rbd { .. });
    let measured = parse(&stdout, job.rw, flush_latency).map_err(|e| match e {
        ParseError::JobError(code) => BaselineError::Failed {
            status: format!("job error {code}"),
            message: last_line(&String::from_utf8_lossy(&output.stderr)).unwrap_or("no message").to_string(),
            command: command.clone(),
        },
        ParseError::Bad(reason) => BaselineError::Unparsable { reason, command: command.clone() },
    })?;
    Ok(FioResult {
        engine: engine.label(),
        iops: measured.iops,
        p50_us: measured.p50_us,
        p99_us: measured.p99_us,
        huge_pages: job.huge_pages,
        queue_depth: engine.queue_depth(job),
        command,
        cores: measured.cores,
        cluster_cores: None,
    })
}

/// The run with the most IOPS (the first one on a tie), or `None` for no runs.
pub fn best(runs: &[FioResult]) -> Option<&FioResult> {
    runs.iter().fold(None, |best: Option<&FioResult>, r| match best {
        Some(b) if b.iops >= r.iops => Some(b),
        _ => Some(r),
    })
}

/// fio's version as it prints it (e.g. `fio-3.33`), or `None` if fio cannot be run.
pub fn fio_version() -> Option<String> {
    let output = Command::new("fio").arg("--version").stdin(Stdio::null()).output().ok()?;
    let version = String::from_utf8_lossy(&output.stdout).trim().to_string();
    (output.status.success() && !version.is_empty()).then_some(version)
}

const RW: [&str; 5] = ["randread", "randwrite", "read", "write", WRITE_FLUSH];
/// Writes each followed by a FLUSH (an fdatasync on the host).
const WRITE_FLUSH: &str = "writeflush";

fn check(job: &FioJob, engine: Engine) -> Result<(), BaselineError> {
    let invalid = |m: String| Err(BaselineError::InvalidJob(m));
    if !RW.contains(&job.rw) {
        return invalid(format!("rw {:?} is none of {}", job.rw, RW.join(", ")));
    }
    if job.block_size == 0 || job.queue_depth == 0 {
        return invalid("block size and queue depth must be at least 1".into());
    }
    if job.runtime < Duration::from_millis(1) {
        return invalid("runtime must be at least 1 ms (fio's 0 means forever)".into());
    }
    if job.size < u64::from(job.block_size) {
        return invalid(format!("size {} is smaller than one block ({} bytes)", job.size, job.block_size));
    }
    match engine {
        Engine::Null => return Ok(()),
        Engine::Rbd { .. } if job.rbd.is_none() => return Err(BaselineError::NoImage),
        Engine::Rbd { .. } => return Ok(()),
        _ => {}
    }
    let path = job.path.display().to_string();
    let meta = std::fs::metadata(&job.path).map_err(|e| BaselineError::BackingFile {
        path: path.clone(),
        reason: format!("{e} (create it first: fio is not allowed to)"),
    })?;
    if meta.is_file() && meta.len() < job.size {
        return Err(BaselineError::BackingFile {
            path,
            reason: format!(
                "{} bytes, smaller than the {} the job spans (grow it first: fio would write it out)",
                meta.len(),
                job.size
            ),
        });
    }
    Ok(())
}

fn fio_args(job: &FioJob, engine: Engine) -> Result<Vec<String>, BaselineError> {
    if job.cpus.is_empty() {
        return Err(BaselineError::InvalidJob("no CPU to run on".into()));
    }
    let mut args = vec!["--output-format=json".to_string(), "--name=exitless-baseline".to_string()];
    if !matches!(engine, Engine::Null | Engine::Rbd { .. }) {
        let path = job.path.to_str().ok_or_else(|| {
            BaselineError::InvalidJob(format!(
                "path {} is not UTF-8, which fio's command line needs",
                job.path.display()
            ))
        })?;
        // fio splits --filename on ':' unless escaped.
        let filename = path.replace(':', "\\:");
        args.extend([format!("--filename={filename}"), "--allow_file_create=0".into()]);
    }
    let cpus = job.cpus.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    let memory = if job.huge_pages { "shmhuge" } else { "malloc" };
    let with_file = !matches!(engine, Engine::Mmap | Engine::Null | Engine::Rbd { .. });
    args.extend([
        format!("--direct={}", u8::from(with_file && job.direct)),
        format!("--ioengine={}", engine.name()),
        format!("--iodepth={}", engine.queue_depth(job)),
    ]);
    // An engine's own options come after --ioengine, or fio does not know them.
    if let (Engine::Rbd { busy_poll }, Some(rbd)) = (engine, &job.rbd) {
        args.extend([
            format!("--clientname={}", rbd.user()),
            format!("--pool={}", rbd.pool),
            format!("--rbdname={}", rbd.image),
            format!("--busy_poll={}", u8::from(busy_poll)),
        ]);
    }
    args.extend([
        format!("--rw={}", if job.rw == WRITE_FLUSH { "randwrite" } else { job.rw }),
        // fio's rbd engine flushes on an fsync (rbd_aio_flush) and refuses an fdatasync.
        match engine {
            Engine::Rbd { .. } => format!("--fsync={}", u8::from(job.rw == WRITE_FLUSH)),
            _ => format!("--fdatasync={}", u8::from(job.rw == WRITE_FLUSH)),
        },
        format!("--bs={}", job.block_size),
        format!("--iomem={memory}"),
        format!("--size={}", job.size),
        format!("--runtime={}ms", job.runtime.as_millis()),
        "--time_based".into(),
        format!("--cpus_allowed={cpus}"),
        "--numjobs=1".into(),
        "--thread".into(),
        "--group_reporting".into(),
        // The bench decides what the page cache holds (a buffered disk is read into it and a
        // cold one dropped from it before every run); fio's default drops the file's pages first.
        "--invalidate=0".into(),
        // No map of blocks already hit (less work per I/O), and a fresh random seed per run.
        "--norandommap".into(),
        "--randrepeat=0".into(),
        "--lat_percentiles=1".into(),
        "--percentile_list=50:99".into(),
    ]);
    Ok(args)
}

/// The environment fio runs in: for the rbd engine, the cluster's configuration file (fio's
/// engine has no option for it) and librbd's cache off.
fn fio_env(job: &FioJob, engine: Engine) -> Vec<(&'static str, String)> {
    match (engine, &job.rbd) {
        (Engine::Rbd { .. }, Some(rbd)) => {
            let mut env = Vec::new();
            if let Some(conf) = &rbd.conf {
                env.push(("CEPH_CONF", conf.display().to_string()));
            }
            env.push(("CEPH_ARGS", RBD_CEPH_ARGS.to_string()));
            env
        }
        _ => Vec::new(),
    }
}

#[derive(Debug, PartialEq)]
struct Measured {
    iops: f64,
    p50_us: f64,
    p99_us: f64,
    cores: Option<f64>,
}

#[derive(Debug)]
enum ParseError {
    /// fio's JSON says the job failed (its `error` field).
    JobError(i64),
    /// Anything else that is not what fio prints.
    Bad(String),
}

/// Reads fio's `--output-format=json` output (which may follow notes fio prints on standard output
/// first) for a job with `--rw=rw`; for write+FLUSH pairs, the latency is the flushes' with
/// `flush_latency`, else the writes'.
fn parse(stdout: &str, rw: &str, flush_latency: bool) -> Result<Measured, ParseError> {
    let bad = |m: &str| ParseError::Bad(m.to_string());
    let start = if stdout.starts_with('{') {
        0
    } else {
        stdout.find("\n{").map(|i| i + 1).ok_or_else(|| bad("no JSON document"))?
    };
    let doc: Value = serde_json::Deserializer::from_str(&stdout[start..])
        .into_iter()
        .next()
        .ok_or_else(|| bad("no JSON document"))?
        .map_err(|e| ParseError::Bad(format!("invalid JSON: {e}")))?;
    let job = doc.get("jobs").and_then(|j| j.get(0)).ok_or_else(|| bad("no jobs[0]"))?;
    match job.get("error").and_then(Value::as_i64) {
        Some(0) | None => {}
        Some(code) => return Err(ParseError::JobError(code)),
    }
    let direction = if rw.contains("read") { "read" } else { "write" };
    let stats = job.get(direction).ok_or_else(|| ParseError::Bad(format!("no jobs[0].{direction}")))?;
    // Writes and flushes alike are requests; the latency is the larger part's: the fdatasync's
    // on a file, the write's on an RBD image (whose flush, its cache off, has nothing to do).
    let (requests_per_io, latencies, latency_of) = match rw {
        WRITE_FLUSH if flush_latency => (2.0, job.get("sync").ok_or_else(|| bad("no jobs[0].sync"))?, "sync"),
        WRITE_FLUSH => (2.0, stats, direction),
        _ => (1.0, stats, direction),
    };
    let iops = requests_per_io
        * stats
            .get("iops")
            .and_then(Value::as_f64)
            .filter(|i| i.is_finite() && *i >= 0.0)
            .ok_or_else(|| ParseError::Bad(format!("no jobs[0].{direction}.iops")))?;
    let percentile_us = |key: &str| {
        latencies
            .get("lat_ns")
            .and_then(|l| l.get("percentile"))
            .and_then(|p| p.get(key))
            .and_then(Value::as_f64)
            .filter(|ns| ns.is_finite() && *ns >= 0.0)
            .map(|ns| ns / 1000.0)
            .ok_or_else(|| {
                ParseError::Bad(format!(
                    "no jobs[0].{latency_of}.lat_ns.percentile[\"{key}\"] (did the job do any {latency_of}s? \
                     does this fio know --lat_percentiles?)"
                ))
            })
    };
    let percent = |key: &str| job.get(key).and_then(Value::as_f64).filter(|v| v.is_finite() && *v >= 0.0);
    let cores = percent("usr_cpu").zip(percent("sys_cpu")).map(|(usr, sys)| (usr + sys) / 100.0);
    Ok(Measured { iops, p50_us: percentile_us("50.000000")?, p99_us: percentile_us("99.000000")?, cores })
}

fn last_line(text: &str) -> Option<&str> {
    text.lines().map(str::trim).rfind(|l| !l.is_empty())
}

/// `word` as a POSIX shell reads it back: bare if it is plain, else in single quotes.
fn shell_quote(word: &str) -> String {
    let plain =
        !word.is_empty() && word.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scratch;

    /// Trimmed from a real run: `fio-3.33 ... --ioengine=psync --rw=randread --bs=4096
    /// --lat_percentiles=1 --percentile_list=50:99` on a tmpfs file, with the note fio prints on
    /// standard output before the JSON when a sync engine is given a queue depth (its `usr_cpu` and
    /// `sys_cpu` set to round values for the test).
    const SAMPLE: &str = r#"note: both iodepth >= 1 and synchronous I/O engine are selected, queue depth will be capped at 1
{
  "fio version" : "fio-3.33",
  "jobs" : [
    {
      "jobname" : "exitless-baseline",
      "groupid" : 0,
      "error" : 0,
      "usr_cpu" : 45.500000,
      "sys_cpu" : 54.000000,
      "read" : {
        "io_bytes" : 2788904960,
        "iops" : 1361770.000000,
        "runtime" : 500,
        "total_ios" : 680885,
        "slat_ns" : { "min" : 0, "max" : 0, "mean" : 0.000000, "stddev" : 0.000000, "N" : 0 },
        "clat_ns" : {
          "min" : 520, "max" : 52368, "mean" : 564.866045, "stddev" : 281.326103, "N" : 680885,
          "percentile" : { "50.000000" : 564, "99.000000" : 588 }
        },
        "lat_ns" : {
          "min" : 550, "max" : 52398, "mean" : 592.140200, "stddev" : 286.272869, "N" : 680885,
          "percentile" : { "50.000000" : 588, "99.000000" : 612 }
        }
      },
      "write" : {
        "io_bytes" : 0,
        "iops" : 0.000000,
        "runtime" : 0,
        "total_ios" : 0,
        "slat_ns" : { "min" : 0, "max" : 0, "mean" : 0.000000, "stddev" : 0.000000, "N" : 0 },
        "clat_ns" : { "min" : 0, "max" : 0, "mean" : 0.000000, "stddev" : 0.000000, "N" : 0 },
        "lat_ns" : { "min" : 0, "max" : 0, "mean" : 0.000000, "stddev" : 0.000000, "N" : 0 }
      }
    }
  ]
}
"#;

    #[test]
    fn parses_captured_output() {
        let m = parse(SAMPLE, "randread", true).unwrap();
        assert_eq!(m, Measured { iops: 1361770.0, p50_us: 0.588, p99_us: 0.612, cores: Some(0.995) });
        // The write side did nothing, so it has no percentiles: an error, not zeros.
        assert!(matches!(parse(SAMPLE, "randwrite", true), Err(ParseError::Bad(_))));
        let failed = SAMPLE.replace(r#""error" : 0"#, r#""error" : 5"#);
        assert!(matches!(parse(&failed, "randread", true), Err(ParseError::JobError(5))));
    }

    #[test]
    fn garbage_is_an_error() {
        for garbage in ["", "fio: something broke\n", "{", "{\"jobs\": 3}", "[1, 2]", "\n{\"jobs\": [{}]}"] {
            assert!(matches!(parse(garbage, "read", true), Err(ParseError::Bad(_))), "{garbage:?}");
        }
    }

    #[test]
    fn quotes_for_the_shell() {
        assert_eq!(shell_quote("--filename=/dev/shm/a"), "--filename=/dev/shm/a");
        assert_eq!(shell_quote("it's here"), r"'it'\''s here'");
        assert_eq!(shell_quote(""), "''");
    }

    fn job(path: PathBuf) -> FioJob {
        FioJob {
            path,
            rw: "randread",
            direct: true,
            block_size: 4096,
            queue_depth: 8,
            runtime: Duration::from_millis(500),
            cpus: vec![0, 1],
            size: 64 << 20,
            huge_pages: false,
            rbd: None,
        }
    }

    /// A buffered run measures what the page cache holds: fio's default (invalidate=1) drops the
    /// file's pages before each job, which made the bench's page-cache-hit rows read from the
    /// disk (docs/tuning.md).
    #[test]
    fn a_buffered_run_leaves_the_page_cache_as_it_found_it() {
        let (file, len) = scratch::file_on_disk();
        assert!(
            scratch::cached_share(file.as_file(), len) > 0.9,
            "just written, the file is in the page cache"
        );
        let mut job = job(file.path().to_path_buf());
        (job.direct, job.size, job.runtime) = (false, len as u64, Duration::from_millis(100));
        for engine in SYSCALL_ENGINES {
            run(&job, engine).unwrap();
            let share = scratch::cached_share(file.as_file(), len);
            assert!(share > 0.9, "after fio {}: {:.0}% of the file cached", engine.name(), share * 100.0);
        }
    }

    /// Real fio on a tmpfs file (tmpfs takes O_DIRECT since Linux 6.6), every engine.
    #[test]
    fn runs_fio_with_every_engine() {
        let file = tempfile::Builder::new().prefix("exitless-baseline").tempfile_in("/dev/shm").unwrap();
        file.as_file().set_len(64 << 20).unwrap();
        let mut job = job(file.path().to_path_buf());
        job.runtime = Duration::from_millis(200);
        let all: Vec<FioResult> =
            SYSCALL_ENGINES.iter().chain([&Engine::Mmap]).map(|&e| run(&job, e).unwrap()).collect();
        assert_eq!(
            all.iter().map(|r| (r.engine, r.queue_depth)).collect::<Vec<_>>(),
            [("psync", 1), ("libaio", 8), ("io_uring", 8), ("mmap", 1)]
        );
        for r in &all {
            assert!(r.iops > 0.0 && r.p50_us > 0.0 && r.p50_us <= r.p99_us, "{r:?}");
            assert!(r.command.starts_with("fio --output-format=json"), "{}", r.command);
            assert!(r.command.contains("--cpus_allowed=0,1"), "{}", r.command);
            let direct = if r.engine == "mmap" { "--direct=0" } else { "--direct=1" };
            assert!(r.command.contains(direct), "{}", r.command);
        }
        let max = all.iter().map(|r| r.iops).fold(0.0, f64::max);
        assert_eq!(best(&all).unwrap().iops, max);
        assert!(best(&[]).is_none());
        assert!(all.iter().all(|r| !r.huge_pages && r.command.contains("--iomem=malloc")));
    }

    /// fio's null engine needs no file: it runs every workload at the job's queue depth.
    #[test]
    fn the_null_engine_runs_without_a_file() {
        let mut job = job(PathBuf::from("/nonexistent/exitless-null"));
        job.runtime = Duration::from_millis(100);
        for rw in ["randread", "writeflush"] {
            job.rw = rw;
            let result = run(&job, Engine::Null).unwrap();
            assert_eq!((result.engine, result.queue_depth), ("null", 8));
            assert!(result.iops > 0.0 && result.p50_us <= result.p99_us, "{result:?}");
            assert!(result.command.contains("--ioengine=null --iodepth=8"), "{}", result.command);
            assert!(!result.command.contains("--filename"), "{}", result.command);
        }
    }

    /// fio's rbd engine on an image of the bench's own cluster, both ways, reads and write+FLUSH
    /// pairs: the image by pool and name, the cluster through $CEPH_CONF, librbd's cache off.
    #[test]
    fn the_rbd_engine_runs_on_an_image_both_ways() {
        let scratch = tempfile::tempdir_in("/var/tmp").unwrap();
        let source = crate::ceph::Source::resolve(None, scratch.path()).unwrap();
        let image =
            crate::ceph::Image::create(crate::ceph::Cluster::start(&source).unwrap(), 16 << 20).unwrap();
        let mut job = job(PathBuf::new());
        (job.rbd, job.size, job.runtime) = (Some(image.spec()), 16 << 20, Duration::from_millis(200));
        for rw in ["randread", "writeflush"] {
            job.rw = rw;
            for engine in RBD_ENGINES {
                let result = run(&job, engine).unwrap();
                assert_eq!((result.engine, result.queue_depth), (engine.label(), 8));
                assert!(result.iops > 0.0 && result.p50_us <= result.p99_us, "{result:?}");
                let conf = image.spec().conf.unwrap();
                let env = format!("CEPH_CONF={} CEPH_ARGS=--rbd_cache=false fio ", conf.display());
                assert!(result.command.starts_with(&env), "{}", result.command);
                let rbd = format!("--clientname=admin --pool=rbd --rbdname={}", image.spec().image);
                assert!(result.command.contains(&rbd), "{}", result.command);
                assert!(
                    result.command.contains(&format!("--ioengine=rbd --iodepth=8 {rbd}")),
                    "{}",
                    result.command
                );
                assert!(!result.command.contains("--filename"), "{}", result.command);
                let flush = if rw == "writeflush" { "--rw=randwrite --fsync=1" } else { "--fsync=0" };
                assert!(result.command.contains(flush), "{}", result.command);
            }
        }
        job.rbd = None;
        assert!(matches!(run(&job, Engine::Rbd { busy_poll: false }), Err(BaselineError::NoImage)));
    }

    /// Requests larger than a page get huge-page buffers where the host has them to give, and
    /// fio runs with them.
    #[test]
    fn large_requests_get_buffers_on_huge_pages_where_the_host_has_them() {
        assert!(!buffers_on_huge_pages(4096, 32), "a page-sized request is one segment either way");
        assert!(
            buffers_on_huge_pages(128 << 10, 4),
            "this test needs transparent huge pages on and 2 free reserved huge pages: run \
             scripts/setup.sh (it reserves 64)"
        );
        let file = tempfile::Builder::new().prefix("exitless-baseline").tempfile_in("/dev/shm").unwrap();
        file.as_file().set_len(64 << 20).unwrap();
        let mut job = job(file.path().to_path_buf());
        (job.rw, job.block_size, job.queue_depth, job.huge_pages) = ("read", 128 << 10, 4, true);
        job.runtime = Duration::from_millis(100);
        let result = run(&job, Engine::IoUring).unwrap();
        assert!(result.huge_pages && result.iops > 0.0, "{result:?}");
        assert!(result.command.contains("--iomem=shmhuge"), "{}", result.command);
    }

    #[test]
    fn errors_say_what_went_wrong() {
        let file = tempfile::Builder::new().prefix("exitless-baseline").tempfile_in("/dev/shm").unwrap();
        file.as_file().set_len(64 << 20).unwrap();
        // A CPU that does not exist: fio refuses, and its message comes through.
        let mut bad_cpu = job(file.path().to_path_buf());
        bad_cpu.cpus = vec![1 << 20];
        let err = run(&bad_cpu, Engine::Psync).unwrap_err();
        assert!(
            matches!(err, BaselineError::Failed { .. }) && err.to_string().contains("cpus_allowed"),
            "{err}"
        );
        // A file too small, or missing: refused before fio could write it out.
        let mut too_big = job(file.path().to_path_buf());
        too_big.size = 128 << 20;
        assert!(matches!(run(&too_big, Engine::Psync), Err(BaselineError::BackingFile { .. })));
        let missing = job(file.path().with_extension("missing"));
        assert!(matches!(run(&missing, Engine::Psync), Err(BaselineError::BackingFile { .. })));
        assert!(fio_version().is_some_and(|v| v.starts_with("fio-")));
    }
}
