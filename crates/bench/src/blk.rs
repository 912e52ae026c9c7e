//! `exitless bench` (the default scenario): the block I/O ladder. The probe guest runs the same
//! block workload on a virtio-blk disk in each I/O mode, and fio runs it on the host against
//! the very same file (on a null disk, with its null engine): the bare-metal baseline.

use std::io::{Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use exitless_args::fail;
use probe_image as probe;
use serde::Serialize;
use serde_json::{Map, Value};
use thiserror::Error;
use vmm::{ConsoleMode, DiskBackend, IoMode, VmConfig, VmError};

use super::backend::Backend;
use super::baseline::{self, BaselineError, Engine, FioJob, FioResult, RBD_ENGINES, SYSCALL_ENGINES};
use super::blk_qemu::{PeerDisk, PeerError, QemuPeer};
use super::ceph::{self, CephError, ClusterInfo};
use super::loop_device::{LoopDevice, LoopError};
use super::machine::About;
use super::plot::PlotError;
use super::progress::{Kind, Progress};
use super::scratch::{self, PageCache, ScratchError};
use super::{causes_per, progress};
use crate::args::{BackendArg, BenchDiskArg, BlkBenchArgs, Peer};
use crate::qemu::Qemu;

/// How long one guest run (exitless's or QEMU's) of `scenario` may take before it is stopped:
/// its measured time, 15 s for boot and teardown, and 1 ms per warm-up request (every mode here
/// serves well over 1000 requests a second), 10 ms on an RBD image (its OSD, on this host's
/// shared CPUs, takes a few hundred writes a second at depth 1, bare metal's included).
pub fn run_timeout(args: &BlkBenchArgs, scenario: Scenario) -> Duration {
    let per_request = if scenario.backend == Backend::Rbd { 10 } else { 1 };
    let warmup = args.warmup.saturating_mul(per_request);
    Duration::from_millis(args.duration_ms.saturating_add(warmup).saturating_add(15_000))
}

#[derive(Serialize, Clone)]
pub struct Row {
    /// Which of the bench's disks: `file` (a file on a real disk, O_DIRECT), `ram` (the RAM disk),
    /// `null` (the null disk), or a backend matrix kind.
    pub disk: &'static str,
    pub device: &'static str,
    /// What the row's I/O ended up on: "x QEMU" compares only rows on the same one.
    pub backend: Backend,
    pub vmm: &'static str,
    pub mode: String,
    pub workload: &'static str,
    pub block_size: u32,
    pub queue_depth: u32,
    pub iops: Option<f64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    /// Requests measured.
    pub ops: u64,
    pub exits_per_io: Option<f64>,
    pub exits_by_cause: Map<String, Value>,
    /// The bare-metal baseline: the best of fio's system-call engines (psync, libaio, io_uring).
    pub bare_metal_iops: Option<f64>,
    pub ratio_to_bare_metal: Option<f64>,
    /// What the row adds to each I/O: its p50 less the bare-metal baseline's p50, microseconds.
    pub added_latency_us: Option<f64>,
    /// RAM disk only: the device's own speed, fio's `mmap` engine (a memory copy, no system call).
    pub device_iops: Option<f64>,
    /// RAM disk only: IOPS over [`Row::device_iops`].
    pub ratio_to_device: Option<f64>,
    /// IOPS over the best of QEMU's own configurations (its virtio-blk, qemu-storage-daemon) on
    /// the same [`Row::backend`] in the same scenario; none if QEMU ran on no such backend.
    pub ratio_to_qemu: Option<f64>,
    pub cpu_cores_used: Option<f64>,
    /// A guest's row: one cache line's round trip between the vCPU's and the IOCore's CPUs, in
    /// nanoseconds, measured just before the run (see [`super::cache_line`]).
    pub cpu_round_trip_ns: Option<f64>,
    /// With `--rounds N` (N > 1), a guest row's IOPS in each round, in round order (`None`: that
    /// run failed); the row itself is the median run ([`super::rounds`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub round_iops: Vec<Option<f64>>,
    /// The command that ran the row (fio, QEMU); exitless's own rows ran in this process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    pub note: Option<String>,
}

impl Row {
    /// Adds `note` (if any) to the row's note.
    pub fn add_note(&mut self, note: Option<String>) {
        if let Some(note) = note {
            self.note = Some(self.note.take().map_or(note.clone(), |n| format!("{n}; {note}")));
        }
    }

    /// A row with nothing measured yet.
    pub fn new(vmm: &'static str, mode: String, scenario: Scenario) -> Row {
        Row {
            disk: scenario.disk,
            device: "virtio-blk",
            backend: scenario.backend,
            vmm,
            mode,
            workload: scenario.rw,
            block_size: scenario.bs,
            queue_depth: scenario.qd,
            iops: None,
            p50_us: None,
            p99_us: None,
            ops: 0,
            exits_per_io: None,
            exits_by_cause: Map::new(),
            bare_metal_iops: None,
            ratio_to_bare_metal: None,
            added_latency_us: None,
            device_iops: None,
            ratio_to_device: None,
            ratio_to_qemu: None,
            cpu_cores_used: None,
            cpu_round_trip_ns: None,
            round_iops: Vec::new(),
            command: None,
            note: None,
        }
    }
}

/// One workload shape on one disk.
#[derive(Clone, Copy)]
pub struct Scenario {
    /// The disk's label ([`Row::disk`]).
    pub disk: &'static str,
    pub rw: &'static str,
    pub bs: u32,
    pub qd: u32,
    /// The disk as exitless serves it (its own rows' [`Row::backend`]).
    pub backend: Backend,
}

/// One of the bench's disks, as the report describes it.
#[derive(Serialize)]
struct DiskInfo {
    disk: &'static str,
    describe: String,
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    about: About,
    tsc_khz: u32,
    disks: Vec<DiskInfo>,
    fio_version: Option<String>,
    qemu_version: Option<String>,
    qemu_storage_daemon_version: Option<String>,
    /// The host CPUs of the vCPU and of the IOCore; fio may use both.
    cpus: [usize; 2],
    /// `--backends rbd`: the Ceph cluster and image, and where the cluster's daemons ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    ceph: Option<ClusterInfo>,
    results: Vec<Row>,
    /// Runs that failed twice (their rows have no numbers and say why); the bench then ends
    /// with a failure status after printing the report.
    failures: Vec<String>,
}

/// Why the block bench stopped.
#[derive(Debug, Error)]
enum BenchError {
    /// A bad `--scratch`: a mistake on the command line.
    #[error(transparent)]
    Scratch(ScratchError),
    /// A bad `--ceph-conf`: a mistake on the command line.
    #[error(transparent)]
    CephConf(CephError),
    /// No Ceph cluster to put an RBD image on.
    #[error(transparent)]
    Ceph(CephError),
    /// librbd's client threads' filter could not be built.
    #[error("cannot set up librbd's client threads: {0}")]
    RbdClients(#[source] sandbox::SandboxError),
    /// The TSC's rate could not be read from KVM.
    #[error(transparent)]
    TscKhz(VmError),
    /// `--plot`: the plots could not be written.
    #[error(transparent)]
    Plot(#[from] PlotError),
    /// `--peers qemu`, and QEMU is not installed.
    #[error("--peers qemu: qemu-system-x86_64 not found (install qemu-system-x86, or pass --peers none)")]
    NoQemu,
    /// The QEMU peer could not be set up.
    #[error(transparent)]
    Peer(#[from] PeerError),
    /// A disk could not be made ready.
    #[error(transparent)]
    Disk(PrepareError),
    /// fio could not measure a bare-metal baseline.
    #[error(transparent)]
    Baselines(#[from] BaselinesError),
}

/// Why a scenario's bare-metal baseline could not be measured.
#[derive(Debug, Error)]
enum BaselinesError {
    /// fio's null engine failed on a null disk.
    #[error("bare metal, {scenario}: {source}")]
    Null {
        scenario: String,
        #[source]
        source: BaselineError,
    },
    /// fio is missing or the job is impossible: no engine would do better.
    #[error(transparent)]
    Fio(BaselineError),
    /// Every engine failed (`failed`: each one's error, `; ` between them).
    #[error("bare metal, {scenario}: every fio engine failed: {failed}")]
    EveryEngine { scenario: String, failed: String },
}

pub fn main(mut args: BlkBenchArgs) -> i32 {
    if !args.backends.is_empty() {
        args.disks = BackendArg::disks(&args.backends, args.backend_size);
    }
    match run(&args) {
        Ok(report) => match super::print_report(&report, args.output, |markdown| report.tables(markdown)) {
            0 if !report.failures.is_empty() => fail(format_args!(
                "{} run(s) failed twice, their rows say why: {}",
                report.failures.len(),
                report.failures.join("; ")
            )),
            status => status,
        },
        Err(BenchError::Scratch(e)) => exitless_args::usage_error(e),
        Err(BenchError::CephConf(e)) => exitless_args::usage_error(e),
        Err(e) => fail(e),
    }
}

fn run(args: &BlkBenchArgs) -> Result<Report, BenchError> {
    let scratch_dir = args.scratch.clone().unwrap_or_else(std::env::temp_dir);
    let rbd = args.disks.iter().any(BenchDiskArg::is_rbd);
    // The throw-away cluster's OSD keeps its store in the scratch directory, on a real disk.
    let own_cluster = rbd && args.ceph_conf.is_none();
    if args.disks.iter().any(BenchDiskArg::in_scratch) || own_cluster {
        scratch::check(&scratch_dir).map_err(BenchError::Scratch)?;
    }
    // Decided now: a missing script or file ends the bench before any run.
    let ceph = match rbd {
        true => {
            Some(ceph::Source::resolve(args.ceph_conf.as_deref(), &scratch_dir).map_err(|e| match e {
                e @ CephError::Conf { .. } => BenchError::CephConf(e),
                e => BenchError::Ceph(e),
            })?)
        }
        false => None,
    };
    if rbd {
        // librbd's threads where, and under the filter, `exitless run` puts them.
        let set_up = iocore::backend_thread_set_up(
            sandbox::ThreadKind::RbdClient,
            args.seccomp.mode(),
            vec![args.iocore_cpu],
        )
        .map_err(BenchError::RbdClients)?;
        storage::rbd::set_up_client_threads(Box::new(set_up));
    }
    let tsc_khz = vmm::tsc_khz().map_err(BenchError::TscKhz)?;
    if let Some(dir) = &args.plot {
        super::plot::prepare(dir)?;
    }
    let mut qemu = match args.peers.contains(&Peer::Qemu) {
        false => None,
        true => {
            let found = Qemu::find().ok_or(BenchError::NoQemu)?;
            Some(QemuPeer::new(found)?)
        }
    };
    let labels = disk_labels(&args.disks);
    let mut progress = Progress::new(plan(args), Duration::from_millis(args.duration_ms));
    let mut results = Vec::new();
    let mut failures = Vec::new();
    let mut disks = Vec::new();
    let mut cluster = None;
    for (spec, &label) in args.disks.iter().zip(&labels) {
        let disk = BenchDisk::prepare(spec, &scratch_dir, ceph.as_ref()).map_err(|e| match e {
            PrepareError::Scratch(e) => BenchError::Scratch(e),
            e => BenchError::Disk(e),
        })?;
        disks.push(DiskInfo { disk: label, describe: disk.describe.clone() });
        if let Some(image) = &disk.rbd {
            cluster = Some(image.info());
        }
        for &rw in &args.rw {
            for &bs in &args.bs {
                for &qd in &args.qd {
                    let scenario = Scenario { disk: label, rw: rw.name(), bs, qd, backend: disk.backend };
                    let first = results.len();
                    let (bare_metal, device) = if args.no_baseline {
                        (None, None)
                    } else {
                        let (rows, bare_metal, device) = baselines(&disk, scenario, args, &mut progress)?;
                        results.extend(rows);
                        (Some(bare_metal), device)
                    };
                    let mut rounds = Vec::new();
                    for _ in 0..args.rounds {
                        let mut round = Vec::new();
                        for &mode in &args.modes {
                            let mode = IoMode::from(mode);
                            progress.start(
                                Kind::Exitless,
                                format_args!("exitless {mode}, {}", scenario.describe()),
                            );
                            let run = || {
                                disk.before_run();
                                let (row, cluster) = ceph::cores_during(disk.cluster(), || {
                                    run_mode(mode, scenario, args, tsc_khz, &disk.vm_backend)
                                });
                                row.map(|mut row| {
                                    row.add_note(ceph::cores_note(cluster));
                                    row
                                })
                            };
                            let failed = Row::new("exitless", mode.name().into(), scenario);
                            round.push(run_twice(run, failed, || {
                                failures.push(format!("exitless {mode}, {}", scenario.describe()))
                            }));
                        }
                        if let Some(peer) = qemu.as_mut() {
                            round.extend(peer.rows(
                                scenario,
                                args,
                                &disk.peer_disk(),
                                tsc_khz,
                                &mut progress,
                            ));
                        }
                        rounds.push(round);
                    }
                    match args.rounds {
                        1 => results.extend(rounds.into_iter().flatten()),
                        _ => results.extend(super::rounds::median_rows(rounds)),
                    }
                    let bare_metal = match bare_metal {
                        Some(before) if !disk.in_memory() => Some(baseline_again(
                            &disk,
                            scenario,
                            args,
                            before,
                            &mut results[first],
                            &mut progress,
                        )),
                        other => other,
                    };
                    compare(&mut results[first..], bare_metal.as_ref(), device.as_ref());
                }
            }
        }
    }
    progress.finish();
    if let Some(cluster) = cluster.as_mut() {
        cluster.librbd_cpus = ceph::client_thread_cpus();
    }
    if let Some(dir) = &args.plot {
        let files = super::plot::write_all(dir, &results)?;
        super::progress(format_args!("wrote {} plot(s) to {}", files.len(), dir.display()));
    }
    Ok(Report {
        about: About::now("blk"),
        tsc_khz,
        disks,
        fio_version: (!args.no_baseline).then(baseline::fio_version).flatten(),
        qemu_version: qemu.as_ref().map(|q| q.version().to_string()),
        qemu_storage_daemon_version: qemu.as_ref().and_then(|q| q.storage_daemon_version()),
        cpus: [args.vcpu_cpu, args.iocore_cpu],
        ceph: cluster,
        results,
        failures,
    })
}

/// Runs `run`, and once more if it fails (a guest that hangs or crashes once in a while must
/// not cost the whole bench; the row says so). Two failures give `failed` (with its note) and
/// call `failure`.
fn run_twice<E: std::fmt::Display>(
    run: impl Fn() -> Result<Row, E>,
    mut failed: Row,
    failure: impl FnOnce(),
) -> Row {
    // One line, and not the whole console of a guest that printed a lot.
    let short = |e: E| {
        let line = e.to_string().split_whitespace().collect::<Vec<_>>().join(" ");
        match line.char_indices().nth(400) {
            Some((at, _)) => format!("{}...", &line[..at]),
            None => line,
        }
    };
    let first = match run() {
        Ok(row) => return row,
        Err(e) => short(e),
    };
    progress(format_args!("that run failed ({first}); running it again"));
    match run() {
        Ok(mut row) => {
            let retried = format!("measured on the second attempt; the first failed: {first}");
            row.note = Some(row.note.map_or(retried.clone(), |n| format!("{n}; {retried}")));
            row
        }
        Err(second) => {
            let second = short(second);
            failure();
            failed.note = Some(format!("failed twice: {first}; then: {second}"));
            failed
        }
    }
}

impl Scenario {
    /// `file, randread 4096 B QD 32`.
    fn describe(&self) -> String {
        format!("{}, {} {} B QD {}", self.disk, self.rw, self.bs, self.qd)
    }
}

/// Each disk's label: `ram`, `null` or `file`, numbered from the second of a kind on (`file2`);
/// a backend matrix disk's kind (`direct`, `buffered`, ...).
fn disk_labels(disks: &[BenchDiskArg]) -> Vec<&'static str> {
    let mut labels: Vec<&'static str> = Vec::new();
    for disk in disks {
        let kind = match disk {
            BenchDiskArg::Matrix { kind, .. } => kind.name(),
            _ if disk.is_ram() => "ram",
            _ if disk.is_null() => "null",
            _ => "file",
        };
        let seen = labels.iter().filter(|l| l.trim_end_matches(|c: char| c.is_ascii_digit()) == kind).count();
        labels.push(match seen {
            0 => kind,
            // A few bytes per extra disk named on the command line, for the process's lifetime.
            n => Box::leak(format!("{kind}{}", n + 1).into_boxed_str()),
        });
    }
    labels
}

/// The runs `run` will make, in order, for the progress estimate.
fn plan(args: &BlkBenchArgs) -> Vec<Kind> {
    let mut plan = Vec::new();
    for disk in &args.disks {
        let scenarios = args.rw.len() * args.bs.len() * args.qd.len();
        for _ in 0..scenarios {
            if !args.no_baseline {
                // On a RAM disk also mmap; on a real disk (and an RBD image) the winner once more,
                // after the guests; on a null disk fio's null engine alone.
                let engines = match disk {
                    _ if disk.is_null() => 1,
                    _ if disk.is_rbd() => RBD_ENGINES.len() + 1,
                    _ => SYSCALL_ENGINES.len() + 1,
                };
                plan.extend(std::iter::repeat_n(Kind::Fio, engines));
            }
            for _ in 0..args.rounds {
                plan.extend(std::iter::repeat_n(Kind::Exitless, args.modes.len()));
                if args.peers.contains(&Peer::Qemu) {
                    plan.extend(std::iter::repeat_n(Kind::Qemu, super::blk_qemu::runs(disk.is_null())));
                }
            }
        }
    }
    plan
}

/// fio on the host: every system-call engine (the best is the bare-metal baseline) and, on a RAM
/// disk, `mmap` (the device's own speed); on a null disk, its `null` engine, the baseline; on an
/// RBD image its `rbd` engine both ways (the best is the baseline). Returns the rows, the
/// baseline and the device run.
fn baselines(
    disk: &BenchDisk,
    scenario: Scenario,
    args: &BlkBenchArgs,
    progress: &mut Progress,
) -> Result<(Vec<Row>, FioResult, Option<FioResult>), BaselinesError> {
    let job = disk.fio_job(scenario, args);
    if disk.backend == Backend::Null {
        progress.start(Kind::Fio, format_args!("bare metal, fio null, {}", scenario.describe()));
        let run = baseline::run(&job, Engine::Null)
            .map_err(|source| BaselinesError::Null { scenario: scenario.describe(), source })?;
        return Ok((vec![null_row(scenario, &run, &job.cpus)], run, None));
    }
    let mut runs = Vec::new();
    let mut failed = Vec::new();
    for engine in disk.engines() {
        progress
            .start(Kind::Fio, format_args!("bare metal, fio {}, {}", engine.label(), scenario.describe()));
        disk.before_run();
        match ceph::cores_during(disk.cluster(), || baseline::run(&job, engine)) {
            (Ok(mut run), cluster) => {
                run.cluster_cores = cluster;
                runs.push(run);
            }
            // fio itself missing or the job impossible: no engine would do better.
            (
                Err(
                    e @ (BaselineError::NotInstalled
                    | BaselineError::BackingFile { .. }
                    | BaselineError::NoImage),
                ),
                _,
            ) => return Err(BaselinesError::Fio(e)),
            (Err(e), _) => failed.push(format!("{}: {e}", engine.label())),
        }
    }
    let best = baseline::best(&runs).cloned().ok_or_else(|| BaselinesError::EveryEngine {
        scenario: scenario.describe(),
        failed: failed.join("; "),
    })?;
    // fio's system-call engines open the file as the guests' devices do: O_DIRECT or buffered;
    // its rbd engine opens the image through librbd, as they do.
    let backend = match disk.backend {
        Backend::Rbd => Backend::Rbd,
        _ => Backend::of_file(&disk.fio_path, disk.direct),
    };
    let mut rows = vec![host_row(scenario, backend, &best, &runs, &failed, &job.cpus)];
    let mut device = None;
    if disk.backend == Backend::Ram {
        progress.start(Kind::Fio, format_args!("device speed, fio mmap, {}", scenario.describe()));
        match baseline::run(&job, Engine::Mmap) {
            Ok(run) => {
                rows.push(device_row(scenario, &run));
                device = Some(run);
            }
            Err(e) => {
                let mut row = Row::new("host", "device (fio mmap)".into(), scenario);
                row.device = "host file";
                row.backend = Backend::Ram;
                row.note = Some(format!("not measured: {e}"));
                rows.push(row);
            }
        }
    }
    Ok((rows, best, device))
}

/// A real disk's speed drifts (a cloud disk's burst budget, other tenants, the host's own
/// writeback): the winning fio engine runs once more after the guests, and the faster of its two
/// runs is the baseline, so a slow moment of the disk never flatters the guests. The host row
/// becomes that run and says how far the two were apart.
fn baseline_again(
    disk: &BenchDisk,
    scenario: Scenario,
    args: &BlkBenchArgs,
    before: FioResult,
    host: &mut Row,
    progress: &mut Progress,
) -> FioResult {
    let engine = before.engine;
    progress.start(Kind::Fio, format_args!("bare metal again, fio {engine}, {}", scenario.describe()));
    let again = disk.engines().into_iter().find(|e| e.label() == engine).map(|e| {
        disk.before_run();
        let (run, cluster) =
            ceph::cores_during(disk.cluster(), || baseline::run(&disk.fio_job(scenario, args), e));
        run.map(|run| FioResult { cluster_cores: cluster, ..run })
    });
    let after = match again {
        Some(Ok(after)) => after,
        failed => {
            let why =
                failed.and_then(Result::err).map_or("not a system-call engine".into(), |e| e.to_string());
            let note = format!(
                "; fio {engine} again after the guests failed ({why}): the baseline is the first run"
            );
            host.note = Some(host.note.take().unwrap_or_default() + &note);
            return before;
        }
    };
    let drift = (before.iops - after.iops).abs() / before.iops.max(after.iops);
    let note = format!(
        "; fio {engine} again after the guests: {:.0} IOPS, p50 {:.1} µs{} (the disk's speed moved {:.0}% between \
         the two; the faster is the baseline{})",
        after.iops,
        after.p50_us,
        cluster_aside(&after),
        drift * 100.0,
        if drift > 0.25 { "; this disk's ratios in this run are unreliable" } else { "" }
    );
    let best = if after.iops > before.iops { after } else { before };
    host.iops = Some(best.iops);
    host.p50_us = Some(best.p50_us);
    host.p99_us = Some(best.p99_us);
    host.cpu_cores_used = best.cores;
    host.command = Some(best.command.clone());
    host.note = Some(host.note.take().unwrap_or_default() + &note);
    best
}

/// Fill in one scenario's comparisons: to bare metal (the best system-call fio run), to the
/// device itself (fio mmap, RAM disk) and to the best of QEMU's own configurations on the row's
/// backend (null against null, a file against the same file with the same cache mode).
fn compare(rows: &mut [Row], bare_metal: Option<&FioResult>, device: Option<&FioResult>) {
    let qemu_best = |backend: Backend, rows: &[Row]| {
        rows.iter()
            .filter(|r| is_qemu_own(r) && r.backend == backend)
            .filter_map(|r| r.iops)
            .fold(None, |best: Option<f64>, v| Some(best.map_or(v, |b| b.max(v))))
    };
    let best: Vec<Option<f64>> = rows.iter().map(|row| qemu_best(row.backend, rows)).collect();
    for (row, qemu_best) in rows.iter_mut().zip(best) {
        row.ratio_to_qemu = row.iops.zip(qemu_best).map(|(ours, theirs)| ours / theirs);
        if let Some(host) = bare_metal {
            row.bare_metal_iops = Some(host.iops);
            row.ratio_to_bare_metal = row.iops.map(|ours| ours / host.iops);
            row.added_latency_us = row.p50_us.map(|p50| p50 - host.p50_us);
        }
        if let Some(device) = device {
            row.device_iops = Some(device.iops);
            row.ratio_to_device = row.iops.map(|ours| ours / device.iops);
        }
    }
}

/// A configuration of QEMU's own: its virtio-blk, or qemu-storage-daemon; not exitless's backend.
fn is_qemu_own(row: &Row) -> bool {
    row.vmm == "qemu" && !row.mode.contains("exitless")
}

/// Why a disk could not be made ready.
#[derive(Debug, Error)]
enum PrepareError {
    /// A bad `--scratch`: a mistake on the command line.
    #[error(transparent)]
    Scratch(ScratchError),
    /// The size of a disk's file or device could not be read.
    #[error("{}: {source}", .path.display())]
    Size {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `--disk rbd=...`: RBD images are measured with `--backends rbd` only.
    #[error("an RBD image is benchmarked with --backends rbd")]
    RbdDisk,
    /// The RAM disk's file could not be made.
    #[error("cannot make the RAM disk {}: {source}", .path.display())]
    RamDisk {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The tmpfs file of the backend matrix could not be made.
    #[error("cannot make {}: {source}", .path.display())]
    Tmpfs {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The loop device could not be attached.
    #[error(transparent)]
    Loop(#[from] LoopError),
    /// `--backends rbd` with no Ceph cluster resolved for it.
    #[error("no Ceph cluster for the rbd disk")]
    NoCluster,
    /// The Ceph cluster or the RBD image could not be made.
    #[error(transparent)]
    Ceph(#[from] CephError),
}

/// The backing file both the VM and fio use.
struct BenchDisk {
    vm_backend: DiskBackend,
    /// The same disk as a `--disk` spec, for `exitless vhost-user-blk`.
    spec: String,
    /// The file fio and QEMU use (empty for a null disk and an RBD image: there is none).
    fio_path: PathBuf,
    size: u64,
    /// How exitless serves it: [`Backend::Ram`] for a RAM disk (a mapping of the file),
    /// [`Backend::Null`] for a null disk, [`Backend::Rbd`] for an RBD image.
    backend: Backend,
    /// Whether the file is opened with O_DIRECT by QEMU's own device and qemu-storage-daemon,
    /// as exitless opens it (a RAM disk's file: with O_DIRECT, as fio reads it).
    direct: bool,
    describe: String,
    /// A RAM disk file this run made, removed at the end.
    made: Option<PathBuf>,
    /// What its pages in the host's page cache are made before every run.
    page_cache: PageCache,
    /// The loop device it is (`--backends loop`), detached at the end.
    _loop_device: Option<LoopDevice>,
    /// The RBD image it is (`--backends rbd`), removed at the end with the cluster the bench
    /// started for it.
    rbd: Option<ceph::Image>,
}

impl BenchDisk {
    /// The disk `spec` names (`ceph`: where an RBD image's cluster comes from).
    fn prepare(
        spec: &BenchDiskArg,
        scratch_dir: &Path,
        ceph: Option<&ceph::Source>,
    ) -> Result<BenchDisk, PrepareError> {
        // Seeking to the end sizes block devices too, whose metadata length is 0.
        let file_size = |path: &Path| {
            std::fs::File::open(path)
                .and_then(|mut file| file.seek(SeekFrom::End(0)))
                .map_err(|source| PrepareError::Size { path: path.to_owned(), source })
        };
        let spec = match spec {
            BenchDiskArg::Matrix { kind, size } => {
                return BenchDisk::of_kind(*kind, *size, scratch_dir, ceph)
            }
            BenchDiskArg::Scratch { size } => {
                let path = scratch::prepare(scratch_dir, *size, |path| {
                    progress(format_args!(
                        "writing the {} MiB real disk {} (once: later runs reuse it)",
                        size >> 20,
                        path.display()
                    ))
                })
                .map_err(PrepareError::Scratch)?;
                return Ok(BenchDisk {
                    vm_backend: DiskBackend::File { path: path.clone(), read_only: false, direct: true },
                    spec: format!("path={},direct", path.display()),
                    backend: Backend::of_file(&path, true),
                    direct: true,
                    fio_path: path.clone(),
                    size: *size,
                    describe: format!(
                        "real disk: a {} MiB file in {} (filled with data) through io_uring with O_DIRECT",
                        size >> 20,
                        scratch_dir.display()
                    ),
                    made: None,
                    page_cache: PageCache::AsIs,
                    _loop_device: None,
                    rbd: None,
                });
            }
            BenchDiskArg::Disk(spec) => spec,
        };
        Ok(match spec {
            DiskBackend::Rbd(_) => return Err(PrepareError::RbdDisk),
            DiskBackend::Ram { size } => {
                let path = PathBuf::from(format!("/dev/shm/exitless-bench-{}.img", std::process::id()));
                progress(format_args!("filling a {} MiB RAM disk at {}", size >> 20, path.display()));
                scratch::fill(&path, *size)
                    .map_err(|source| PrepareError::RamDisk { path: path.clone(), source })?;
                BenchDisk {
                    vm_backend: DiskBackend::RamFile { path: path.clone(), read_only: false },
                    spec: format!("ram,path={}", path.display()),
                    fio_path: path.clone(),
                    size: *size,
                    backend: Backend::Ram,
                    direct: true,
                    describe: format!("RAM disk: a {} MiB file in /dev/shm (filled with data)", size >> 20),
                    made: Some(path),
                    page_cache: PageCache::AsIs,
                    _loop_device: None,
                    rbd: None,
                }
            }
            DiskBackend::RamFile { path, .. } => BenchDisk {
                vm_backend: spec.clone(),
                spec: format!("ram,path={}", path.display()),
                fio_path: path.clone(),
                size: file_size(path)?,
                backend: Backend::Ram,
                direct: true,
                describe: format!("RAM disk: {}", path.display()),
                made: None,
                page_cache: PageCache::AsIs,
                _loop_device: None,
                rbd: None,
            },
            DiskBackend::File { path, direct, .. } => BenchDisk {
                vm_backend: spec.clone(),
                spec: format!("path={}{}", path.display(), if *direct { ",direct" } else { "" }),
                fio_path: path.clone(),
                size: file_size(path)?,
                backend: Backend::of_file(path, *direct),
                direct: *direct,
                describe: format!(
                    "file {} through io_uring{}",
                    path.display(),
                    if *direct { " with O_DIRECT" } else { "" }
                ),
                made: None,
                page_cache: PageCache::AsIs,
                _loop_device: None,
                rbd: None,
            },
            DiskBackend::Null { size, .. } => BenchDisk {
                vm_backend: DiskBackend::Null { size: *size, read_only: false },
                spec: format!("null={size}"),
                fio_path: PathBuf::new(),
                size: *size,
                backend: Backend::Null,
                direct: false,
                describe: format!(
                    "null disk: {} MiB that hold nothing (reads return zeros, writes are dropped)",
                    size >> 20
                ),
                made: None,
                page_cache: PageCache::AsIs,
                _loop_device: None,
                rbd: None,
            },
        })
    }

    /// Whether it is memory (a RAM or null disk), whose speed does not drift as a device's (an
    /// RBD image's OSD does: it is a disk, and shares the host's CPUs).
    fn in_memory(&self) -> bool {
        matches!(self.backend, Backend::Ram | Backend::Null)
    }

    /// A disk of the backend matrix, of `size` bytes: the scratch file (O_DIRECT, buffered warm
    /// or cold, or under a loop device), a file on tmpfs, a RAM disk or a null disk.
    fn of_kind(
        kind: BackendArg,
        size: u64,
        scratch_dir: &Path,
        ceph: Option<&ceph::Source>,
    ) -> Result<BenchDisk, PrepareError> {
        let scratch_file = || {
            scratch::prepare(scratch_dir, size, |path| {
                progress(format_args!("writing the {} MiB real disk {} (once)", size >> 20, path.display()))
            })
            .map_err(PrepareError::Scratch)
        };
        let file = |path: PathBuf, direct: bool| {
            BenchDiskArg::Disk(DiskBackend::File { path, read_only: false, direct })
        };
        let disk = match kind {
            BackendArg::Direct => BenchDisk::prepare(&file(scratch_file()?, true), scratch_dir, None)?,
            BackendArg::Buffered | BackendArg::Cold => {
                let mut disk = BenchDisk::prepare(&file(scratch_file()?, false), scratch_dir, None)?;
                let (page_cache, how) = match kind {
                    BackendArg::Buffered => (PageCache::Warm, "read into the host's page cache"),
                    _ => (PageCache::Cold, "its pages dropped from the host's page cache"),
                };
                disk.page_cache = page_cache;
                disk.describe += &format!(", {how} before every run");
                disk
            }
            BackendArg::Tmpfs => {
                let path = PathBuf::from(format!("/dev/shm/exitless-bench-tmpfs-{}.img", std::process::id()));
                progress(format_args!("filling a {} MiB file on tmpfs at {}", size >> 20, path.display()));
                scratch::fill(&path, size)
                    .map_err(|source| PrepareError::Tmpfs { path: path.clone(), source })?;
                let mut disk = BenchDisk::prepare(&file(path.clone(), false), scratch_dir, None)?;
                disk.made = Some(path);
                disk
            }
            BackendArg::Loop => {
                let device = LoopDevice::attach(&scratch_file()?)?;
                let mut disk = BenchDisk::prepare(&file(device.path.clone(), true), scratch_dir, None)?;
                disk.describe =
                    format!("{} (a loop device over the scratch file, direct I/O)", disk.describe);
                disk._loop_device = Some(device);
                disk
            }
            BackendArg::Ram | BackendArg::All => {
                BenchDisk::prepare(&BenchDiskArg::Disk(DiskBackend::Ram { size }), scratch_dir, None)?
            }
            BackendArg::Null => {
                let null = DiskBackend::Null { size, read_only: false };
                BenchDisk::prepare(&BenchDiskArg::Disk(null), scratch_dir, None)?
            }
            BackendArg::Rbd => {
                let source = ceph.ok_or(PrepareError::NoCluster)?;
                if let ceph::Source::Own { dir, .. } = source {
                    progress(format_args!("starting a throw-away Ceph cluster in {}", dir.display()));
                }
                let image = ceph::Image::create(ceph::Cluster::start(source)?, size)?;
                let spec = image.spec();
                BenchDisk {
                    vm_backend: DiskBackend::Rbd(spec.clone()),
                    spec: format!(
                        "rbd={}/{}{}",
                        spec.pool,
                        spec.image,
                        spec.conf.as_ref().map_or(String::new(), |c| format!(",conf={}", c.display()))
                    ),
                    fio_path: PathBuf::new(),
                    size: image.size(),
                    backend: Backend::Rbd,
                    direct: false,
                    describe: image.describe(),
                    made: None,
                    page_cache: PageCache::AsIs,
                    _loop_device: None,
                    rbd: Some(image),
                }
            }
        };
        Ok(disk)
    }

    /// The fio engines of its bare-metal baseline, the best of which counts.
    fn engines(&self) -> Vec<Engine> {
        match self.backend {
            Backend::Null => vec![Engine::Null],
            Backend::Rbd => RBD_ENGINES.to_vec(),
            _ => SYSCALL_ENGINES.to_vec(),
        }
    }

    /// The bench's own Ceph cluster, whose daemons' CPU time the rows' notes give.
    fn cluster(&self) -> Option<&ceph::Cluster> {
        self.rbd.as_ref().map(ceph::Image::cluster)
    }

    /// Before a run (fio's, a guest's).
    fn before_run(&self) {
        self.page_cache.prepare(&self.fio_path);
    }

    /// The disk as QEMU's rows see it.
    fn peer_disk(&self) -> PeerDisk<'_> {
        PeerDisk {
            path: &self.fio_path,
            spec: &self.spec,
            direct: self.direct,
            file_backend: match self.backend {
                Backend::Rbd => Backend::Rbd,
                _ => Backend::of_file(&self.fio_path, self.direct),
            },
            null_size: (self.backend == Backend::Null).then_some(self.size),
            page_cache: self.page_cache,
            rbd: match &self.vm_backend {
                DiskBackend::Rbd(spec) => Some(spec),
                _ => None,
            },
            cluster: self.cluster(),
        }
    }

    fn fio_job(&self, scenario: Scenario, args: &BlkBenchArgs) -> FioJob {
        let mut cpus = vec![args.vcpu_cpu, args.iocore_cpu];
        cpus.dedup();
        FioJob {
            path: self.fio_path.clone(),
            rw: scenario.rw,
            block_size: scenario.bs,
            queue_depth: scenario.qd,
            runtime: Duration::from_millis(args.duration_ms),
            cpus,
            size: self.size / scenario.bs as u64 * scenario.bs as u64,
            direct: self.direct,
            huge_pages: baseline::buffers_on_huge_pages(scenario.bs, scenario.qd),
            rbd: match &self.vm_backend {
                DiskBackend::Rbd(spec) => Some(spec.clone()),
                _ => None,
            },
        }
    }
}

impl Drop for BenchDisk {
    fn drop(&mut self) {
        if let Some(path) = &self.made {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A host row of one fio run, `mode` in the table, on `backend`, with `note`.
fn fio_row(scenario: Scenario, mode: String, run: &FioResult, backend: Backend, note: String) -> Row {
    Row {
        device: if backend == Backend::Rbd { "host, librbd" } else { "host file" },
        backend,
        iops: Some(run.iops),
        p50_us: Some(run.p50_us),
        p99_us: Some(run.p99_us),
        exits_per_io: Some(0.0),
        cpu_cores_used: run.cores,
        command: Some(run.command.clone()),
        note: Some(note),
        ..Row::new("host", mode, scenario)
    }
}

/// fio's `--cpus_allowed` list, as the notes show it.
fn cpu_list(cpus: &[usize]) -> String {
    cpus.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}

/// The bare-metal row: the best system-call fio run, and in its note every run and which won.
fn host_row(
    scenario: Scenario,
    backend: Backend,
    best: &FioResult,
    all: &[FioResult],
    failed: &[String],
    cpus: &[usize],
) -> Row {
    let tried: Vec<String> = all
        .iter()
        .map(|r| {
            let (engine, qd, iops, p50) = (r.engine, r.queue_depth, r.iops, r.p50_us);
            format!("{engine} qd {qd}: {iops:.0} IOPS, p50 {p50:.1} µs{}", cluster_aside(r))
        })
        .chain(failed.iter().cloned())
        .collect();
    let note = format!(
        "fio on CPUs {}, {}, buffers on {}, the best of {}: {} won",
        cpu_list(cpus),
        backend.caching(),
        if best.huge_pages { "2 MiB huge pages, as exitless's guest RAM" } else { "4 KiB pages" },
        tried.join("; "),
        best.engine
    );
    fio_row(scenario, format!("bare metal (fio {})", best.engine), best, backend, note)
}

/// ` (the cluster 0.52 cores)` for a run on an RBD image of the bench's own cluster: the cores
/// the cluster's daemons used over it.
fn cluster_aside(run: &FioResult) -> String {
    run.cluster_cores
        .map_or(String::new(), |cores| format!(" (the cluster's OSD and monitor {cores:.2} cores)"))
}

/// The RAM disk's own speed: fio's `mmap` engine, a memory copy with no system call.
fn device_row(scenario: Scenario, run: &FioResult) -> Row {
    let note = "the device itself: a memory copy from a mapping of the file, no system call (not the \
                baseline: no program reaches a disk this way). fio maps the file when its job starts, so \
                its first touch of each page takes a page fault, its writes most of all; exitless's RAM \
                disk maps the file's pages when it opens the disk";
    fio_row(scenario, "device (fio mmap)".into(), run, Backend::Ram, note.into())
}

/// A null disk's bare-metal row: fio's null engine, which has no file and completes each I/O at
/// once (fio's own cost of an I/O).
fn null_row(scenario: Scenario, run: &FioResult, cpus: &[usize]) -> Row {
    let note = format!(
        "fio's null engine on CPUs {} at queue depth {}: no file and no system call, every I/O done \
         at once",
        cpu_list(cpus),
        run.queue_depth
    );
    Row {
        device: "host, no file",
        ..fio_row(scenario, "bare metal (fio null)".into(), run, Backend::Null, note)
    }
}

fn run_mode(
    mode: IoMode,
    scenario: Scenario,
    args: &BlkBenchArgs,
    tsc_khz: u32,
    disk: &DiskBackend,
) -> Result<Row, super::GuestRunError> {
    let Scenario { rw, bs, qd, .. } = scenario;
    let cmdline = format!(
        "probe.workload=blk probe.rw={rw} probe.bs={bs} probe.qd={qd} probe.duration_ms={} probe.warmup={} \
         probe.tsc_khz={tsc_khz} probe.seed={}",
        args.duration_ms,
        args.warmup,
        super::fresh_seed()
    );
    let config = VmConfig {
        cmdline: probe::with_io_mode(&cmdline, mode),
        // The probe guest: its exit marks and ping-pong are the test device's.
        testdev: true,
        console: ConsoleMode::Capture,
        timeout: Some(run_timeout(args, scenario)),
        pin_vcpus: vec![args.vcpu_cpu],
        disks: vec![disk.clone()],
        io_mode: mode,
        iocore_cpu: Some(args.iocore_cpu),
        seccomp: args.seccomp.mode(),
        ..Default::default()
    };
    let mut row = Row::new("exitless", mode.name().to_string(), scenario);
    row.cpu_round_trip_ns = super::cache_line::round_trip_ns(args.vcpu_cpu, args.iocore_cpu);
    let run = match super::run_guest(&config, "blk") {
        Ok(run) => run,
        Err(super::GuestRunError::Vm(e @ VmError::PvEoiUnavailable(_))) => {
            row.note = Some(format!("not measured: {e}"));
            return Ok(row);
        }
        Err(e) => return Err(e),
    };
    let line = run.line;
    let ops = line["ops"].as_u64().unwrap_or(0);
    row.ops = ops;
    row.iops = line["iops"].as_f64();
    row.p50_us = line["p50_ns"].as_f64().map(|ns| ns / 1000.0);
    row.p99_us = line["p99_ns"].as_f64().map(|ns| ns / 1000.0);
    row.exits_per_io = Some(run.counters.get("exits") as f64 / ops.max(1) as f64);
    row.exits_by_cause = causes_per(&run.counters, ops);
    row.cpu_cores_used = run.cores_used;
    row.note = pv_eoi_note(mode, &line);
    Ok(row)
}

/// Whether PV EOI, asked for, took any EOI exit away: the guest counts the interrupts KVM ended
/// through the PV EOI flag.
fn pv_eoi_note(mode: IoMode, line: &Value) -> Option<String> {
    if !mode.uses_pv_eoi() {
        return None;
    }
    let interrupts = line["interrupts"].as_u64().unwrap_or(0);
    let pv_eois = line["pv_eois"].as_u64().unwrap_or(0);
    (pv_eois < interrupts).then(|| {
        format!(
            "PV EOI enabled, but KVM ended only {pv_eois} of {interrupts} interrupts through it; the guest's \
             EOI write still exits for the rest (this host's KVM ends interrupts at delivery)"
        )
    })
}

impl Report {
    fn tables(&self, markdown: bool) -> String {
        let context = super::blk_table::Context {
            about: &self.about,
            disks: self.disks.iter().map(|d| (d.disk, d.describe.as_str())).collect(),
            fio_version: self.fio_version.as_deref(),
            qemu_version: self.qemu_version.as_deref(),
            qemu_storage_daemon_version: self.qemu_storage_daemon_version.as_deref(),
            cpus: self.cpus,
            librbd_cpus: self.ceph.as_ref().and_then(|c| c.librbd_cpus.as_deref()),
        };
        super::blk_table::render(&context, &self.results, markdown)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    fn row_scenario() -> Scenario {
        Scenario { disk: "ram", rw: "randread", bs: 4096, qd: 1, backend: Backend::Null }
    }

    fn row() -> Row {
        Row::new("exitless", "eventfd".into(), row_scenario())
    }

    /// An RBD image's rows compare with QEMU's own rows on the image only (its virtio-blk and
    /// qemu-storage-daemon on driver=rbd): never with a faster QEMU row on a file or on null-co
    /// in the same scenario, nor with QEMU behind exitless's own vhost-user backend.
    #[test]
    fn rbd_rows_pair_only_with_rbd_peers() {
        let at = |vmm, mode: &str, backend, iops| Row {
            backend,
            iops: Some(iops),
            ..Row::new(vmm, mode.into(), Scenario { disk: "rbd", backend: Backend::Rbd, ..row_scenario() })
        };
        let mut rows = vec![
            at("host", "bare metal (fio rbd)", Backend::Rbd, 3000.0),
            at("exitless", "exitless", Backend::Rbd, 600.0),
            at("exitless", "sidecore", Backend::Rbd, 300.0),
            at("qemu", "qemu virtio-blk, interrupt", Backend::Rbd, 800.0),
            at("qemu", "qemu virtio-blk, poll", Backend::Rbd, 1200.0),
            at("qemu", "qemu + exitless vhost-user-blk, poll", Backend::Rbd, 5000.0),
            at("qemu", "qemu + qemu-storage-daemon, poll", Backend::Rbd, 1000.0),
            // Faster peers on other backends: mixed in, they would be the divisor.
            at("qemu", "qemu virtio-blk, poll", Backend::FileDirect, 90_000.0),
            at("qemu", "qemu virtio-blk null-co, poll", Backend::Null, 400_000.0),
        ];
        let bare_metal = FioResult {
            engine: "rbd",
            iops: 3000.0,
            p50_us: 300.0,
            p99_us: 900.0,
            huge_pages: false,
            queue_depth: 1,
            command: String::new(),
            cores: None,
            cluster_cores: None,
        };
        compare(&mut rows, Some(&bare_metal), None);
        let ratios: Vec<Option<f64>> = rows.iter().map(|r| r.ratio_to_qemu).collect();
        let best = 1200.0;
        let expected = [
            Some(3000.0 / best),
            Some(600.0 / best),
            Some(300.0 / best),
            Some(800.0 / best),
            Some(1.0),
            Some(5000.0 / best),
            Some(1000.0 / best),
            Some(1.0),
            Some(1.0),
        ];
        assert_eq!(ratios, expected);
        assert_eq!(rows[1].ratio_to_bare_metal, Some(0.2));
    }

    #[test]
    fn a_run_that_fails_once_is_measured_again_and_says_so() {
        let attempts = Cell::new(0);
        let flaky = || {
            attempts.set(attempts.get() + 1);
            match attempts.get() {
                1 => Err("the guest was stopped at the timeout;\nconsole".to_string()),
                _ => Ok(Row { iops: Some(1.0), ..row() }),
            }
        };
        let measured = run_twice(flaky, row(), || panic!("not a failure"));
        assert_eq!(measured.iops, Some(1.0));
        let note = measured.note.unwrap();
        assert!(note.contains("first failed: the guest was stopped at the timeout; console"), "{note}");

        let mut failed = false;
        let broken = run_twice(|| Err("x".repeat(1000)), row(), || failed = true);
        assert!(failed && broken.iops.is_none());
        assert!(broken.note.unwrap().len() < 1000, "errors are shortened");
    }

    #[test]
    fn x_qemu_is_against_the_best_qemu_row_on_the_same_backend() {
        let at = |vmm, mode: &str, backend, iops| Row {
            backend,
            iops,
            ..Row::new(vmm, mode.into(), row_scenario())
        };
        let mut rows = vec![
            at("host", "bare metal (fio psync)", Backend::TmpfsDirect, Some(200.0)),
            at("host", "device (fio mmap)", Backend::Ram, Some(2000.0)),
            at("host", "bare metal (fio null)", Backend::Null, Some(3000.0)),
            at("exitless", "exitless", Backend::Null, Some(1000.0)),
            at("exitless", "trap", Backend::Null, None),
            // The RAM disk's memory copy: QEMU has no such backend, so no x QEMU.
            at("exitless", "sidecore", Backend::Ram, Some(900.0)),
            // Faster than QEMU's null device: mixed in, it would be the divisor.
            at("qemu", "qemu virtio-blk, poll", Backend::TmpfsDirect, Some(500.0)),
            at("qemu", "qemu virtio-blk, interrupt", Backend::TmpfsDirect, Some(250.0)),
            // Exitless's backend behind QEMU: compared, never the divisor.
            at("qemu", "qemu + exitless vhost-user-blk, poll", Backend::Null, Some(4000.0)),
            at("qemu", "qemu + exitless vhost-user-blk, poll", Backend::Ram, Some(4000.0)),
            at("qemu", "qemu virtio-blk null-co, poll", Backend::Null, Some(400.0)),
            at("qemu", "qemu + qemu-storage-daemon null-co, poll", Backend::Null, Some(320.0)),
            at("qemu", "qemu virtio-blk null-co, interrupt", Backend::Null, None),
            // No QEMU row on this backend.
            at("exitless", "adaptive", Backend::FileBuffered, Some(100.0)),
        ];
        compare(&mut rows, None, None);
        let ratios: Vec<Option<f64>> = rows.iter().map(|r| r.ratio_to_qemu).collect();
        let expected = [
            Some(200.0 / 500.0),
            None,
            Some(3000.0 / 400.0),
            Some(1000.0 / 400.0),
            None,
            None,
            Some(1.0),
            Some(250.0 / 500.0),
            Some(4000.0 / 400.0),
            None,
            Some(1.0),
            Some(320.0 / 400.0),
            None,
            None,
        ];
        assert_eq!(ratios, expected);
    }
}
