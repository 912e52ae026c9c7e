//! `exitless bench scale`: N probe VMs doing 4 KiB random reads at once, each on its own disk,
//! in four set-ups (one shared IOCore, an IOCore per VM, QEMU with an iothread per VM, QEMU
//! with one qemu-storage-daemon): aggregate and per-VM IOPS, Jain's fairness index, host cores,
//! IOPS per core and exits per I/O per set-up and VM count, and a mixed run (half the VMs at a
//! low queue depth, half at a high one) that shows the fair share.

pub(crate) mod cpu;
pub(crate) mod launch;
mod table;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::Serialize;
use thiserror::Error;

pub use crate::args::ScaleSetup as Setup;
use crate::args::{ScaleBenchArgs, ScaleDiskArg};
use crate::probe_dir::{ProbeDir, ProbeDirError};
use crate::qemu::Qemu;
use launch::{Context, LaunchError, RunResult, VmDisk};

use super::machine::About;
use super::progress::{Kind, Progress};

/// Why the bench could not start.
#[derive(Debug, Error)]
enum ScaleError {
    /// `--mixed-qd` is not two queue depths.
    #[error("--mixed-qd takes two queue depths, LOW,HIGH (e.g. 1,32)")]
    MixedQd,
    /// `--vcpu-cpu` or `--iocore-cpu` names a CPU this host does not have.
    #[error("--{0} {1}: this host has CPUs 0 to {2}")]
    NoSuchCpu(&'static str, usize, usize),
    /// A bad `--scratch`.
    #[error("{0}")]
    Scratch(#[from] super::scratch::ScratchError),
    /// `--disk-size` is not a whole number of MiB, or under 1 MiB.
    #[error("--disk-size {0}: a multiple of 1 MiB, at least 1M")]
    DiskSize(u64),
    /// A VM's RAM disk could not be made.
    #[error("cannot make the RAM disk {}: {source}", .path.display())]
    RamDisk {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The TSC's rate could not be read from KVM.
    #[error(transparent)]
    TscKhz(vmm::VmError),
    /// The run's directory, with the probe for the VMs, could not be made.
    #[error(transparent)]
    Dir(#[from] ProbeDirError),
    /// The path of this executable, which the VMs and the daemon run, is unknown.
    #[error("cannot find this executable: {0}")]
    CurrentExe(#[source] std::io::Error),
}

/// Why a run of a set-up was not measured.
#[derive(Debug, Error)]
enum RetryError {
    /// A program the set-up needs is missing: not retried.
    #[error(transparent)]
    Missing(LaunchError),
    /// The run failed, and failed again when retried.
    #[error(
        "failed twice: {}; then: {}",
        super::one_line(&.first.to_string()),
        super::one_line(&.second.to_string())
    )]
    Twice { first: Box<LaunchError>, second: Box<LaunchError> },
}

/// One row of the report: a set-up with N VMs at one queue depth, or one half of a mixed run.
#[derive(Serialize, Clone)]
pub struct Row {
    pub setup: &'static str,
    /// VMs running at once.
    pub vms: u32,
    /// VMs this row's figures cover (`vms`, or half of them in a mixed run).
    pub group_vms: u32,
    pub queue_depth: u32,
    /// One half of the mixed run (its VMs at `queue_depth`, the others at the other depth).
    pub mixed: bool,
    pub aggregate_iops: Option<f64>,
    pub per_vm_iops: Vec<f64>,
    pub per_vm_min_iops: Option<f64>,
    pub per_vm_max_iops: Option<f64>,
    /// Jain's fairness index of the row's VMs: (Σx)² / (n·Σx²), 1 when all are equal.
    pub jain_fairness: Option<f64>,
    /// CPU time of every process of the set-up over the VMs' common measured window (the whole
    /// run's, in a mixed run).
    pub cpu_cores_used: Option<f64>,
    /// The whole run's aggregate IOPS over `cpu_cores_used`.
    pub iops_per_core: Option<f64>,
    pub exits_per_io: Option<f64>,
    /// Exits per I/O by cause (KVM's counters; those under 0.005 left out). `irq_exits` are
    /// host interrupts (the scheduler preempting a vCPU on a shared core), not the I/O path's.
    pub exits_by_cause: serde_json::Map<String, serde_json::Value>,
    /// The VMs' common measured time over their mean measured time.
    pub window_overlap: Option<f64>,
    /// Cores the rest of the host kept busy meanwhile (other programs): above 0.1 the row is
    /// noisy, as the set-up did not have its two CPUs to itself.
    pub other_host_cores: Option<f64>,
    pub note: Option<String>,
}

impl Row {
    fn empty(setup: Setup, vms: u32, group_vms: u32, queue_depth: u32, mixed: bool) -> Row {
        Row {
            setup: setup.name(),
            vms,
            group_vms,
            queue_depth,
            mixed,
            aggregate_iops: None,
            per_vm_iops: Vec::new(),
            per_vm_min_iops: None,
            per_vm_max_iops: None,
            jain_fairness: None,
            cpu_cores_used: None,
            iops_per_core: None,
            exits_per_io: None,
            exits_by_cause: Default::default(),
            window_overlap: None,
            other_host_cores: None,
            note: None,
        }
    }

    /// The figures of VMs `group` (indices) of `run`, which ran `vms` VMs in all.
    fn measured(setup: Setup, vms: u32, qd: u32, mixed: bool, run: &RunResult, group: &[usize]) -> Row {
        let iops: Vec<f64> = group.iter().map(|&i| run.vms[i].rate).collect();
        let total: f64 = run.vms.iter().map(|v| v.rate).sum();
        let ops: u64 = group.iter().map(|&i| run.vms[i].ops).sum();
        let counters = vmm::Counters::sum(group.iter().map(|&i| &run.vms[i].counters));
        let mut row = Row::empty(setup, vms, group.len() as u32, qd, mixed);
        row.aggregate_iops = Some(iops.iter().sum());
        row.per_vm_min_iops = iops.iter().copied().reduce(f64::min);
        row.per_vm_max_iops = iops.iter().copied().reduce(f64::max);
        row.jain_fairness = jain(&iops);
        row.per_vm_iops = iops;
        row.cpu_cores_used = run.cpu_cores_used;
        row.iops_per_core = run.cpu_cores_used.filter(|&c| c > 0.0).map(|c| total / c);
        row.exits_per_io = (ops > 0).then(|| counters.get("exits") as f64 / ops as f64);
        row.exits_by_cause = super::causes_per(&counters, ops);
        row.window_overlap = Some(run.overlap);
        row.other_host_cores = run.other_cores;
        let mut notes = Vec::new();
        if run.overlap < 0.9 && vms > 1 {
            notes.push(format!(
                "the VMs' measured windows overlapped {:.0}% (a longer --warmup-ms aligns them)",
                run.overlap * 100.0
            ));
        }
        if let Some(other) = run.other_cores.filter(|&c| c > 0.1) {
            notes.push(format!("other programs kept {other:.2} host cores busy meanwhile: noisy"));
        }
        row.note = (!notes.is_empty()).then(|| notes.join("; "));
        row
    }
}

/// Jain's fairness index, (Σx)² / (n·Σx²); `None` for no values or all zero.
pub fn jain(values: &[f64]) -> Option<f64> {
    let sum: f64 = values.iter().sum();
    let squares: f64 = values.iter().map(|x| x * x).sum();
    (squares > 0.0).then(|| sum * sum / (values.len() as f64 * squares))
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    about: About,
    tsc_khz: u32,
    disk: String,
    duration_ms: u64,
    warmup_ms: u64,
    mem_mib: u64,
    /// Where vCPUs and the I/O side run.
    pinning: String,
    /// What each set-up is.
    setups: Vec<(&'static str, &'static str)>,
    cpu_accounting: &'static str,
    exits_accounting: &'static str,
    qemu_version: Option<String>,
    qemu_storage_daemon_version: Option<String>,
    results: Vec<Row>,
}

/// How each set-up serves its VMs, for the report.
fn describe(setup: Setup) -> &'static str {
    match setup {
        Setup::SharedIocore => {
            "one `exitless vhost-user-blk --io-mode sidecore --iocores 1` serving every disk; exitless VMs \
             as vhost-user frontends, the guest polling (`run --io-mode exitless`)"
        }
        Setup::IocorePerVm => "`exitless run --io-mode exitless`: each VM its own IOCore, the guest polling",
        Setup::QemuIothread => {
            "QEMU-KVM microvm, each VM its own virtio-blk on its own iothread (aio=io_uring, cache=none), \
             the guest polling"
        }
        Setup::QemuStorageDaemon => {
            "one qemu-storage-daemon exporting every disk as vhost-user-blk from one iothread (aio=io_uring, \
             O_DIRECT); QEMU-KVM microvm VMs as frontends, the guest polling"
        }
    }
}

const CPU_ACCOUNTING: &str =
    "on-CPU time of every thread of every process of the set-up (VMMs, QEMUs, daemons; \
     /proc/PID/task/*/schedstat sampled every 20 ms) over the VMs' common measured window";
const EXITS_ACCOUNTING: &str =
    "exitless: KVM's vCPU statistics between the probe's marks 0 and 1 (`run --stats \
     --json` phases); QEMU: KVM's statistics through QMP query-stats at the same marks";

pub fn main(args: ScaleBenchArgs) -> i32 {
    match run(&args) {
        Ok(report) => super::print_report(&report, args.output, |markdown| table::render(&report, markdown)),
        Err(e @ (ScaleError::MixedQd | ScaleError::NoSuchCpu(..) | ScaleError::Scratch(_))) => {
            exitless_args::usage_error(e)
        }
        Err(e) => exitless_args::fail(e),
    }
}

fn run(args: &ScaleBenchArgs) -> Result<Report, ScaleError> {
    let [low, high] = args.mixed_qd[..] else { return Err(ScaleError::MixedQd) };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (flag, cpu) in [("vcpu-cpu", args.vcpu_cpu), ("iocore-cpu", args.iocore_cpu)] {
        if cpu >= cpus {
            return Err(ScaleError::NoSuchCpu(flag, cpu, cpus - 1));
        }
    }
    let mut counts = args.vms.clone();
    counts.sort_unstable();
    counts.dedup();
    let largest = counts.last().copied().unwrap_or(1);
    let mixed = !args.no_mixed;
    let tsc_khz = vmm::tsc_khz().map_err(ScaleError::TscKhz)?;
    let probe = ProbeDir::make("scale")?;
    let disks = Disks::prepare(args, largest as usize)?;
    let ctx = Context {
        exe: std::env::current_exe().map_err(ScaleError::CurrentExe)?,
        tsc_khz,
        duration_ms: args.duration_ms,
        warmup_ms: args.warmup_ms,
        vcpu_cpu: args.vcpu_cpu,
        io_cpu: args.iocore_cpu,
        seccomp: args.seccomp,
        qemu: args.setups.iter().any(|s| s.is_qemu()).then(Qemu::find).flatten(),
        storage_daemon: args.setups.contains(&Setup::QemuStorageDaemon).then(find_storage_daemon).flatten(),
        dir: probe.path().to_owned(),
        elf: probe.elf().to_owned(),
    };
    let qemu_version = ctx.qemu.as_ref().map(|q| q.version.clone());
    let qsd_version = ctx.storage_daemon.as_ref().and_then(|b| version(b));
    let runs_per_setup = counts.len() + usize::from(mixed);
    let plan: Vec<Kind> = args
        .setups
        .iter()
        .flat_map(|s| {
            std::iter::repeat_n(if s.is_qemu() { Kind::Qemu } else { Kind::Exitless }, runs_per_setup)
        })
        .collect();
    let mut progress = Progress::new(plan, Duration::from_millis(args.warmup_ms + args.duration_ms + 500));
    let mut results = Vec::new();
    for &setup in &args.setups {
        let kind = if setup.is_qemu() { Kind::Qemu } else { Kind::Exitless };
        for &n in &counts {
            progress.start(kind, format_args!("{}, {n} VM(s) at QD {}", setup.name(), args.qd));
            let qds = vec![args.qd; n as usize];
            match run_twice(setup, &qds, &disks.vms, &ctx) {
                Ok((run, note)) => {
                    let mut row =
                        Row::measured(setup, n, args.qd, false, &run, &(0..n as usize).collect::<Vec<_>>());
                    row.note = join_notes(row.note, note);
                    results.push(row);
                }
                Err(e) => {
                    let mut row = Row::empty(setup, n, n, args.qd, false);
                    row.note = Some(format!("not measured: {e}"));
                    results.push(row);
                }
            }
        }
        if mixed {
            let lows = (largest / 2) as usize;
            let (low_vms, high_vms): (Vec<usize>, Vec<usize>) =
                ((0..lows).collect(), (lows..largest as usize).collect());
            progress.start(
                kind,
                format_args!(
                    "{}, mixed: {lows} VM(s) at QD {low}, {} at QD {high}",
                    setup.name(),
                    high_vms.len()
                ),
            );
            if lows == 0 {
                for (qd, group) in [(low, 0), (high, largest)] {
                    let mut row = Row::empty(setup, largest, group, qd, true);
                    row.note = Some("not measured: the mixed run needs at least 2 VMs (--vms)".into());
                    results.push(row);
                }
                continue;
            }
            let qds: Vec<u32> = (0..largest as usize).map(|i| if i < lows { low } else { high }).collect();
            match run_twice(setup, &qds, &disks.vms, &ctx) {
                Ok((run, note)) => {
                    for (qd, group) in [(low, &low_vms), (high, &high_vms)] {
                        let mut row = Row::measured(setup, largest, qd, true, &run, group);
                        row.note = join_notes(row.note, note.clone());
                        results.push(row);
                    }
                }
                Err(e) => {
                    for (qd, group) in [(low, &low_vms), (high, &high_vms)] {
                        let mut row = Row::empty(setup, largest, group.len() as u32, qd, true);
                        row.note = Some(format!("not measured: {e}"));
                        results.push(row);
                    }
                }
            }
        }
    }
    progress.finish();
    Ok(Report {
        about: About::now("scale"),
        tsc_khz,
        disk: disks.describe.clone(),
        duration_ms: args.duration_ms,
        warmup_ms: args.warmup_ms,
        mem_mib: launch::MEM_MIB,
        pinning: format!(
            "every VM's vCPU on CPU {v}; the I/O side on CPU {io}: the shared IOCore, every per-VM IOCore, \
             every QEMU thread but its vCPU (iothread, main loop), qemu-storage-daemon (the whole process)",
            v = args.vcpu_cpu,
            io = args.iocore_cpu
        ),
        setups: args.setups.iter().map(|&s| (s.name(), describe(s))).collect(),
        cpu_accounting: CPU_ACCOUNTING,
        exits_accounting: EXITS_ACCOUNTING,
        qemu_version,
        qemu_storage_daemon_version: qsd_version,
        results,
    })
}

/// Runs once, and once more if that fails (the note says so); the second failure is the error.
fn run_twice(
    setup: Setup,
    qds: &[u32],
    disks: &[VmDisk],
    ctx: &Context,
) -> Result<(RunResult, Option<String>), RetryError> {
    match launch::run(setup, qds, disks, ctx) {
        Ok(run) => Ok((run, None)),
        // Nothing to retry when the set-up's programs are missing.
        Err(e) if e.is_missing_program() => Err(RetryError::Missing(e)),
        Err(first) => {
            let short = super::one_line(&first.to_string());
            super::progress(format_args!("that run failed ({short}); running it again"));
            match launch::run(setup, qds, disks, ctx) {
                Ok(run) => {
                    Ok((run, Some(format!("measured on the second attempt; the first failed: {short}"))))
                }
                Err(second) => Err(RetryError::Twice { first: Box::new(first), second: Box::new(second) }),
            }
        }
    }
}

fn join_notes(a: Option<String>, b: Option<String>) -> Option<String> {
    match (a, b) {
        (Some(a), Some(b)) => Some(format!("{a}; {b}")),
        (a, b) => a.or(b),
    }
}

/// `$EXITLESS_QEMU_STORAGE_DAEMON` or `qemu-storage-daemon` from PATH, if it runs.
fn find_storage_daemon() -> Option<PathBuf> {
    let binary = std::env::var_os("EXITLESS_QEMU_STORAGE_DAEMON")
        .map_or_else(|| "qemu-storage-daemon".into(), PathBuf::from);
    version(&binary).map(|_| binary)
}

/// The first line of `binary --version`, if it runs.
fn version(binary: &Path) -> Option<String> {
    let output = Command::new(binary).arg("--version").stdin(Stdio::null()).output().ok()?;
    let line = String::from_utf8_lossy(&output.stdout).lines().next()?.trim().to_string();
    output.status.success().then_some(line)
}

/// The VMs' disks: RAM disks made for this run (removed at the end) or files kept in the
/// scratch directory.
struct Disks {
    vms: Vec<VmDisk>,
    describe: String,
    made: Vec<PathBuf>,
}

impl Disks {
    fn prepare(args: &ScaleBenchArgs, count: usize) -> Result<Disks, ScaleError> {
        let size = args.disk_size;
        if size < 1 << 20 || !size.is_multiple_of(1 << 20) {
            return Err(ScaleError::DiskSize(size));
        }
        let mut disks = Disks { vms: Vec::new(), describe: String::new(), made: Vec::new() };
        match args.disk {
            ScaleDiskArg::Ram => {
                super::progress(format_args!(
                    "filling {count} RAM disk(s) of {} MiB in /dev/shm",
                    size >> 20
                ));
                for i in 0..count {
                    let path =
                        PathBuf::from(format!("/dev/shm/exitless-scale-{}-{i}.img", std::process::id()));
                    disks.made.push(path.clone());
                    super::scratch::fill(&path, size)
                        .map_err(|source| ScaleError::RamDisk { path: path.clone(), source })?;
                    disks.vms.push(VmDisk { path, ram: true });
                }
                disks.describe = format!("ram: a {} MiB /dev/shm file per VM (filled with data)", size >> 20);
            }
            ScaleDiskArg::File => {
                let dir = args.scratch.clone().unwrap_or_else(std::env::temp_dir);
                for i in 0..count {
                    let path =
                        super::scratch::prepare_as(&dir, &format!("exitless-scale-{i}"), size, |path| {
                            super::progress(format_args!(
                                "writing {} (once: later runs reuse it)",
                                path.display()
                            ))
                        })?;
                    disks.vms.push(VmDisk { path, ram: false });
                }
                disks.describe = format!(
                    "file: a {} MiB file per VM in {} (filled with data), O_DIRECT (io_uring)",
                    size >> 20,
                    dir.display()
                );
            }
        }
        Ok(disks)
    }
}

impl Drop for Disks {
    fn drop(&mut self) {
        for path in &self.made {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::jain;

    #[test]
    fn jain_index() {
        assert_eq!(jain(&[5.0, 5.0, 5.0]), Some(1.0));
        assert_eq!(jain(&[1.0, 0.0]), Some(0.5));
        assert_eq!(jain(&[]), None);
        assert_eq!(jain(&[0.0, 0.0]), None);
    }
}
