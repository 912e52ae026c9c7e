//! One run of one set-up: its shared backend (if any) and N probe VMs started together as
//! child processes, each VM's result, exits and measured window, and the set-up's CPU time.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use thiserror::Error;

use super::cpu::Sampler;
use super::Setup;
use crate::daemon::{Backend, DaemonError};
use crate::qemu::{CpuOutOfRange, ProbeError, Qemu, QemuError};
use exitless_args::SeccompArgs;
use vmm::Counters;

/// Guest memory of every VM (the probe needs about 48 MiB).
pub const MEM_MIB: u64 = 64;
/// How long QEMU's probe idles at each mark while its counters are sampled over QMP.
const MARK_LINGER_MS: u64 = 200;

/// Why a run of a set-up failed.
#[derive(Debug, Error)]
pub enum LaunchError {
    /// The shared backend could not be started.
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    /// The qemu-storage-daemon set-up, and it is not installed.
    #[error(
        "qemu-storage-daemon not found (install qemu-system-common, or set $EXITLESS_QEMU_STORAGE_DAEMON)"
    )]
    NoStorageDaemon,
    /// The shared backend's CPU cannot be pinned.
    #[error(transparent)]
    Pin(#[from] CpuOutOfRange),
    /// These VMs (by index) failed.
    #[error("{}", .0.iter().map(|(i, e)| format!("VM {i}: {e}")).collect::<Vec<_>>().join("; "))]
    Vms(Vec<(usize, VmRunError)>),
    /// No VM ran, so there is no measured window.
    #[error("no VM ran")]
    NoVm,
}

impl LaunchError {
    /// Whether a program the set-up needs is missing (QEMU, qemu-storage-daemon): running it
    /// again cannot help.
    pub fn is_missing_program(&self) -> bool {
        match self {
            LaunchError::NoStorageDaemon => true,
            LaunchError::Vms(errors) => errors.iter().any(|(_, e)| matches!(e, VmRunError::NoQemu)),
            _ => false,
        }
    }
}

/// Why one VM of a run failed.
#[derive(Debug, Error)]
pub enum VmRunError {
    /// Its runner thread panicked.
    #[error("a VM's runner panicked")]
    Panicked,
    /// `exitless run` could not be started.
    #[error("cannot start exitless run: {0}")]
    Start(#[source] std::io::Error),
    /// `exitless run`'s standard error was not piped.
    #[error("no stderr")]
    NoStderr,
    /// `exitless run`'s standard output was not piped.
    #[error("no stdout")]
    NoStdout,
    /// `exitless run` could not be waited for.
    #[error("cannot wait for exitless run: {0}")]
    Wait(#[source] std::io::Error),
    /// `exitless run` failed, or printed no result (`why`: its last line of standard error;
    /// `result`: its result line, if any).
    #[error("exitless run ended with {status}: {why} {result}")]
    Ended { status: ExitStatus, why: String, result: String },
    /// `exitless run --stats --json` printed no stats line.
    #[error("no --stats line")]
    NoStats,
    /// The stats have no phase between marks 0 and 1.
    #[error("no measured phase in --stats")]
    NoPhase,
    /// The measured phase has no counters.
    #[error("no counters in the measured phase")]
    NoCounters,
    /// The measured phase does not say when it began.
    #[error("no from_monotonic_s in the measured phase")]
    NoStart,
    /// A QEMU set-up, and QEMU is not installed.
    #[error("qemu-system-x86_64 not found (install qemu-system-x86)")]
    NoQemu,
    /// QEMU failed.
    #[error(transparent)]
    Qemu(#[from] QemuError),
    /// The probe's run under QEMU gave no usable result.
    #[error(transparent)]
    Probe(#[from] ProbeError),
}

/// What every run of the bench shares.
pub struct Context {
    pub exe: PathBuf,
    pub tsc_khz: u32,
    pub duration_ms: u64,
    pub warmup_ms: u64,
    pub vcpu_cpu: usize,
    pub io_cpu: usize,
    pub seccomp: SeccompArgs,
    pub qemu: Option<Qemu>,
    /// qemu-storage-daemon's binary, if it runs.
    pub storage_daemon: Option<PathBuf>,
    /// Sockets, QMP sockets and the exported probe ELF.
    pub dir: PathBuf,
    pub elf: PathBuf,
}

/// One VM's disk: a /dev/shm file (`ram`) or a file on a real disk used with O_DIRECT.
pub struct VmDisk {
    pub path: PathBuf,
    pub ram: bool,
}

impl VmDisk {
    /// As `exitless run --disk` (and after `socket=...,` the daemon's `--disk`) takes it.
    fn spec(&self) -> String {
        match self.ram {
            true => format!("ram,path={}", self.path.display()),
            false => format!("path={},direct", self.path.display()),
        }
    }
}

/// What one VM measured.
pub struct VmResult {
    /// Operations per second: IOPS, or UDP transactions per second.
    pub rate: f64,
    pub ops: u64,
    /// vCPU exit counters over the measured phase (KVM's statistics, QEMU's through QMP).
    pub counters: Counters,
    /// When the measured phase began and ended, as the host saw it.
    pub window: (Instant, Instant),
}

/// What one run measured.
pub struct RunResult {
    pub vms: Vec<VmResult>,
    pub cpu_cores_used: Option<f64>,
    /// Cores the rest of the host kept busy meanwhile (other programs: noise).
    pub other_cores: Option<f64>,
    /// The VMs' common measured time over the mean measured time (1: they all measured at once).
    pub overlap: f64,
}

/// Runs `setup` with one VM per entry of `qds` (its queue depth) on `disks`.
pub fn run(setup: Setup, qds: &[u32], disks: &[VmDisk], ctx: &Context) -> Result<RunResult, LaunchError> {
    let sockets: Vec<PathBuf> = (0..qds.len()).map(|i| ctx.dir.join(format!("disk{i}.sock"))).collect();
    let sampler = Sampler::start();
    let _backend = match setup {
        Setup::SharedIocore => Some(start_daemon(disks, &sockets, ctx)?),
        Setup::QemuStorageDaemon => Some(start_storage_daemon(disks, &sockets, ctx)?),
        Setup::IocorePerVm | Setup::QemuIothread => None,
    };
    if let Some(backend) = &_backend {
        sampler.watch(backend.id());
    }
    let results: Vec<Result<VmResult, VmRunError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = qds
            .iter()
            .enumerate()
            .map(|(i, &qd)| {
                let (disk, socket, watcher) = (&disks[i], &sockets[i], sampler.watcher());
                scope.spawn(move || match setup {
                    Setup::SharedIocore | Setup::IocorePerVm => {
                        let disk = match setup {
                            Setup::SharedIocore => format!("vhost-user={}", socket.display()),
                            _ => disk.spec(),
                        };
                        let vm = ExitlessVm::disk(&disk, workload(qd, ctx));
                        run_exitless(&vm, setup == Setup::IocorePerVm, ctx, &watcher)
                    }
                    Setup::QemuIothread | Setup::QemuStorageDaemon => {
                        let device = match setup {
                            Setup::QemuIothread => QemuDisk::Own(&disk.path),
                            _ => QemuDisk::VhostUser(socket),
                        };
                        run_qemu(i, device, qd, ctx, &watcher)
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(Err(VmRunError::Panicked))).collect()
    });
    let samples = sampler.finish();
    let mut vms = Vec::new();
    let mut errors = Vec::new();
    for (i, result) in results.into_iter().enumerate() {
        match result {
            Ok(vm) => vms.push(vm),
            Err(e) => errors.push((i, e)),
        }
    }
    if !errors.is_empty() {
        return Err(LaunchError::Vms(errors));
    }
    let (from, to, overlap) = common_window(&vms).ok_or(LaunchError::NoVm)?;
    let (cpu_cores_used, other_cores) = (samples.cores(from, to), samples.other_cores(from, to));
    Ok(RunResult { vms, cpu_cores_used, other_cores, overlap })
}

/// The VMs' common measured window (the union of their windows if they hardly overlap), and
/// its share of their mean measured time (1: they all measured at once); `None` without VMs.
pub fn common_window(vms: &[VmResult]) -> Option<(Instant, Instant, f64)> {
    let start = vms.iter().map(|v| v.window.0).max()?;
    let end = vms.iter().map(|v| v.window.1).min()?;
    let mean = vms.iter().map(|v| v.window.1.duration_since(v.window.0).as_secs_f64()).sum::<f64>()
        / vms.len() as f64;
    let common = end.checked_duration_since(start).map_or(0.0, |d| d.as_secs_f64());
    let overlap = if mean > 0.0 { common / mean } else { 0.0 };
    if common >= 0.1 * mean {
        return Some((start, end, overlap));
    }
    let first = vms.iter().map(|v| v.window.0).min()?;
    let last = vms.iter().map(|v| v.window.1).max()?;
    Some((first, last, overlap))
}

/// The probe's workload on the command line (QEMU's also gets the TSC rate and the guest half
/// of the mode, which `exitless run --probe` adds itself).
fn workload(qd: u32, ctx: &Context) -> String {
    format!(
        "probe.workload=blk probe.rw=randread probe.bs=4096 probe.qd={qd} probe.duration_ms={} \
         probe.warmup=0 probe.warmup_ms={} probe.seed={}",
        ctx.duration_ms,
        ctx.warmup_ms,
        crate::fresh_seed()
    )
}

/// How long a VM may run before it is stopped.
fn timeout(ctx: &Context) -> Duration {
    Duration::from_millis(ctx.warmup_ms + ctx.duration_ms + 30_000)
}

/// One exitless VM of a run: its device (`exitless run` arguments), the probe's workload, and
/// its result line (`"probe"`) with the key of its rate in it.
pub struct ExitlessVm<'a> {
    pub device: [&'a str; 2],
    pub cmdline: String,
    pub result: &'static str,
    pub rate: &'static str,
}

impl<'a> ExitlessVm<'a> {
    /// A VM reading its disk `spec` (`--disk`) with the probe's `blk` workload `cmdline`.
    fn disk(spec: &'a str, cmdline: String) -> ExitlessVm<'a> {
        ExitlessVm { device: ["--disk", spec], cmdline, result: "blk", rate: "iops" }
    }
}

/// `exitless run --probe` running `vm`, the guest polling; its own IOCore on the I/O CPU if
/// `own_iocore`.
pub fn run_exitless(
    vm: &ExitlessVm,
    own_iocore: bool,
    ctx: &Context,
    watcher: &Arc<Mutex<Vec<u32>>>,
) -> Result<VmResult, VmRunError> {
    let mut command = Command::new(&ctx.exe);
    command
        .args(["run", "--probe", "--mem", &format!("{MEM_MIB}M"), "--io-mode", "exitless"])
        .args(["--pin-vcpu", &ctx.vcpu_cpu.to_string(), "--stats", "--json"])
        .args(["--timeout", &timeout(ctx).as_secs().to_string()])
        .args(vm.device)
        .args(["--cmdline", &vm.cmdline])
        .args(ctx.seccomp.flag());
    if own_iocore {
        command.args(["--iocore-cpu", &ctx.io_cpu.to_string()]);
    }
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(VmRunError::Start)?;
    if let Ok(mut pids) = watcher.lock() {
        pids.push(child.id());
    }
    let mut stderr = child.stderr.take().ok_or(VmRunError::NoStderr)?;
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut stdout = String::new();
    let _ = child.stdout.take().ok_or(VmRunError::NoStdout)?.read_to_string(&mut stdout);
    let status = child.wait().map_err(VmRunError::Wait)?;
    let stderr = err.join().unwrap_or_default();
    let lines: Vec<Value> = stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let result = lines.iter().find(|v| v["probe"] == vm.result);
    let (Some(result), true) = (result, status.success()) else {
        let why = stderr.lines().last().unwrap_or("").to_string();
        return Err(VmRunError::Ended {
            status,
            why,
            result: result.map(Value::to_string).unwrap_or_default(),
        });
    };
    let stats = lines.iter().find(|v| v["exitless"] == "run").ok_or(VmRunError::NoStats)?;
    let phase = stats["vcpus"][0]["phases"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["from"] == 0 && p["to"] == 1))
        .ok_or(VmRunError::NoPhase)?;
    // The closing mark's own MMIO write is counted in the phase.
    let counters = Counters(
        phase["counters"]
            .as_object()
            .ok_or(VmRunError::NoCounters)?
            .iter()
            .map(|(name, value)| {
                let value = value.as_u64().unwrap_or(0);
                let closing_mark = u64::from(name == "exits" || name == "mmio_exits");
                (name.clone(), value.saturating_sub(closing_mark))
            })
            .collect(),
    );
    let wall = Duration::from_secs_f64(phase["wall_s"].as_f64().unwrap_or(0.0).max(0.0));
    // Where the phase lay on the host's clock: not counted back from the process's end, which
    // a loaded host delays past the phase (its window would then hold only the teardown).
    let from = phase["from_monotonic_s"]
        .as_f64()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(|s| clock::instant_of(Duration::from_secs_f64(s)))
        .ok_or(VmRunError::NoStart)?;
    Ok(VmResult {
        rate: result[vm.rate].as_f64().unwrap_or(0.0),
        ops: result["ops"].as_u64().unwrap_or(0),
        counters,
        window: (from, from + wall),
    })
}

/// QEMU's disk: its own virtio-blk on an iothread, or a vhost-user-blk socket.
enum QemuDisk<'a> {
    Own(&'a Path),
    VhostUser(&'a Path),
}

/// QEMU-KVM (microvm) booting the probe, its vCPU thread on the vCPU CPU and every other
/// thread on the I/O CPU; exits sampled over QMP at the probe's marks.
fn run_qemu(
    index: usize,
    disk: QemuDisk,
    qd: u32,
    ctx: &Context,
    watcher: &Arc<Mutex<Vec<u32>>>,
) -> Result<VmResult, VmRunError> {
    let qemu = ctx.qemu.as_ref().ok_or(VmRunError::NoQemu)?;
    let cmdline = format!(
        "{} probe.tsc_khz={} probe.completion=poll probe.mark_linger_ms={MARK_LINGER_MS}",
        workload(qd, ctx),
        ctx.tsc_khz
    );
    let machine = match disk {
        QemuDisk::Own(_) => "microvm,acpi=off",
        QemuDisk::VhostUser(_) => "microvm,acpi=off,memory-backend=mem",
    };
    let mut args = Qemu::probe_args(machine, &ctx.elf, &cmdline, MEM_MIB);
    args.extend(["-global", "virtio-mmio.force-legacy=false"].map(String::from));
    // Thread names (`CPU 0/KVM`, `IO io0`), so the vCPU thread can be told from the others.
    args.extend(["-name".to_string(), format!("exitless-scale-{index},debug-threads=on")]);
    match disk {
        QemuDisk::Own(path) => args.extend([
            "-object".into(),
            "iothread,id=io0".into(),
            "-drive".into(),
            format!("file={},format=raw,if=none,id=d0,cache=none,aio=io_uring", path.display()),
            "-device".into(),
            "virtio-blk-device,drive=d0,iothread=io0".into(),
        ]),
        QemuDisk::VhostUser(socket) => {
            args.extend([
                "-object".into(),
                format!("memory-backend-memfd,id=mem,size={MEM_MIB}M,share=on"),
                "-chardev".into(),
                format!("socket,id=vu,path={}", socket.display()),
                "-device".into(),
                "vhost-user-blk,chardev=vu".into(),
            ]);
        }
    }
    let qmp = ctx.dir.join(format!("qmp{index}.sock"));
    let _ = std::fs::remove_file(&qmp);
    let (vcpu_cpu, io_cpu) = (ctx.vcpu_cpu, ctx.io_cpu);
    let (run, marks) = qemu.run_marked_with(&args, Some(&qmp), &[], timeout(ctx), |pid| {
        if let Ok(mut pids) = watcher.lock() {
            pids.push(pid);
        }
        crate::qemu::pin_threads(pid, vcpu_cpu, io_cpu);
    })?;
    let line = crate::qemu::blk_result(&run)?;
    let (start, end) = (super::super::blk_qemu::find(&marks, 0)?, super::super::blk_qemu::find(&marks, 1)?);
    Ok(VmResult {
        rate: line["iops"].as_f64().unwrap_or(0.0),
        ops: line["ops"].as_u64().unwrap_or(0),
        counters: super::super::blk_qemu::exits_between(start, end),
        window: (start.at, end.at),
    })
}

/// `exitless vhost-user-blk` serving every disk from one IOCore (sidecore) on the I/O CPU.
fn start_daemon(disks: &[VmDisk], sockets: &[PathBuf], ctx: &Context) -> Result<Backend, DaemonError> {
    let mut command = Command::new(&ctx.exe);
    command.arg("vhost-user-blk");
    for (disk, socket) in disks.iter().zip(sockets) {
        let _ = std::fs::remove_file(socket);
        command.args(["--disk", &format!("socket={},{}", socket.display(), disk.spec())]);
    }
    command
        .args(["--io-mode", "sidecore", "--iocores", "1", "--iocore-cpu", &ctx.io_cpu.to_string()])
        .args(ctx.seccomp.flag());
    Backend::start(command, sockets, &ctx.dir.join("daemon.log"), "exitless vhost-user-blk")
}

/// qemu-storage-daemon exporting every disk as vhost-user-blk from one iothread
/// (aio=io_uring, O_DIRECT), the whole process on the I/O CPU.
fn start_storage_daemon(
    disks: &[VmDisk],
    sockets: &[PathBuf],
    ctx: &Context,
) -> Result<Backend, LaunchError> {
    let binary = ctx.storage_daemon.as_ref().ok_or(LaunchError::NoStorageDaemon)?;
    let mut command = Command::new(binary);
    command.args(["--object", "iothread,id=iothread0"]);
    for (i, (disk, socket)) in disks.iter().zip(sockets).enumerate() {
        let _ = std::fs::remove_file(socket);
        command.args([
            "--blockdev".to_string(),
            format!(
                "driver=file,filename={},aio=io_uring,cache.direct=on,node-name=disk{i}",
                disk.path.display()
            ),
            "--export".to_string(),
            format!(
                "type=vhost-user-blk,id=export{i},node-name=disk{i},addr.type=unix,addr.path={},\
                 iothread=iothread0,writable=on",
                socket.display()
            ),
        ]);
    }
    crate::qemu::pin_child(&mut command, ctx.io_cpu)?;
    Ok(Backend::start(command, sockets, &ctx.dir.join("qsd.log"), "qemu-storage-daemon")?)
}
