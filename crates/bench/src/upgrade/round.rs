//! One round of `bench upgrade`: a daemon, one probe VM (exitless or QEMU) doing a verify run on
//! it, and the daemon replaced once in the middle of that run; what the guest, the frontend and
//! the daemons said of it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use exitless_args::SeccompArgs;
use serde_json::Value;
use thiserror::Error;

use crate::args::{UpgradeFrontend as Frontend, UpgradeStop as Stop};
use crate::daemon::{Backend, DaemonError};
use crate::qemu::{Qemu, QemuError, QemuRun};

/// Guest memory of every VM (the probe needs about 48 MiB).
const MEM_MIB: u64 = 64;
/// How long the guest may take to boot and write its first block.
const FIRST_WRITE_LIMIT: Duration = Duration::from_secs(60);
/// How long a daemon may take to exit after SIGTERM (it promises 1.5 s).
const STOP_LIMIT: Duration = Duration::from_secs(10);
/// How long a VM may run in all (its verify run takes a few seconds).
const VM_LIMIT: Duration = Duration::from_secs(180);
/// How long the guest waits for any one request before it gives up: well over QEMU's
/// reconnect interval, so that a slow hand-over is measured, not failed.
const GUEST_WAIT_MS: u64 = 20_000;

/// Why a round failed.
#[derive(Debug, Error)]
pub enum RoundError {
    /// A daemon could not be started, or did not stop as it should.
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    /// A file (the disk, a VM's output) could not be examined or made.
    #[error("{}: {source}", .path.display())]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A QEMU round, and QEMU is not installed.
    #[error("qemu-system-x86_64 not found (install qemu-system-x86)")]
    NoQemu,
    /// The verify run ended before the daemon was replaced (`stdout`: what the VM printed).
    #[error(
        "the guest's verify run ended before the restart ({stdout}): give it more --blocks or a lower --iops"
    )]
    EndedBeforeRestart { stdout: String },
    /// The VM ended before its first write reached the disk (`output`: how it ended).
    #[error("the VM ended before its first write: {output}")]
    EndedBeforeFirstWrite { output: String },
    /// The guest wrote nothing to the disk in time.
    #[error("the guest wrote nothing to the disk within {:?}", FIRST_WRITE_LIMIT)]
    NoFirstWrite,
    /// The probe printed no result line (`output`: how the VM ended).
    #[error("the probe printed no result: {output}")]
    NoResult { output: String },
    /// The probe's result has no `max_ns`.
    #[error("no max_ns in the probe's result: {line}")]
    NoMaxNs { line: Value },
    /// The verify run failed (`output`: how the VM ended; `log`: the serving daemon's log).
    #[error(
        "the guest's verify run failed ({errors} errors, {mismatches} mismatches): {output}; the daemon \
         after the restart: {log}"
    )]
    VerifyFailed { errors: u64, mismatches: u64, output: String, log: String },
    /// The thread running QEMU panicked.
    #[error("QEMU's runner panicked")]
    QemuPanicked,
    /// QEMU failed.
    #[error(transparent)]
    Qemu(#[from] QemuError),
    /// `exitless run` could not be started.
    #[error("cannot start exitless run: {0}")]
    StartVm(#[source] std::io::Error),
    /// `exitless run` did not end in time (it was killed then).
    #[error("exitless run did not end within {:?} (killed)", VM_LIMIT)]
    VmTimeout,
    /// `exitless run` could not be waited for.
    #[error("cannot wait for exitless run: {0}")]
    WaitVm(#[source] std::io::Error),
}

/// What every round shares.
pub struct Context {
    pub exe: PathBuf,
    /// Sockets, logs and the exported probe ELF.
    pub dir: PathBuf,
    /// The disk's file, served with O_DIRECT.
    pub disk: PathBuf,
    pub elf: PathBuf,
    pub tsc_khz: u32,
    pub qemu: Option<Qemu>,
    pub blocks: u64,
    pub qd: u32,
    pub iops: u64,
    /// The daemon's `--io-mode`.
    pub io_mode: &'static str,
    pub restart_after: Duration,
    pub seccomp: SeccompArgs,
}

/// What one round measured.
pub struct Round {
    /// The guest's longest request (the probe's `max_ns`), in ms: the one that waited through
    /// the restart.
    pub pause_ms: f64,
    /// The guest's median request, in ms, for scale.
    pub p50_ms: f64,
    /// The frontend's own "reconnected to a daemon after N ms" (exitless only).
    pub reconnected_ms: Option<u64>,
    /// Reconnections: the exitless frontend's count (`--stats`); for QEMU, the connections the
    /// daemons logged less the first.
    pub reconnections: Option<u64>,
    /// From SIGTERM to the old daemon's exit (SIGTERM rounds only).
    pub sigterm_to_exit: Option<Duration>,
    /// From the successor's start to the old daemon's exit (hand-over rounds only).
    pub handover_to_exit: Option<Duration>,
    /// Requests the new daemon resubmitted from the in-flight region.
    pub resubmitted: u64,
    pub errors: u64,
    pub mismatches: u64,
}

/// Runs one round: `frontend` on a daemon that `stop` ends in the middle of its verify run,
/// a new daemon started on the same socket (with `Stop::None`, the control, the first daemon
/// serves the whole run). `index` names its logs.
pub fn run(frontend: Frontend, stop: Stop, index: usize, ctx: &Context) -> Result<Round, RoundError> {
    let socket = ctx.dir.join("upgrade.sock");
    let handover = (stop == Stop::Handover).then(|| ctx.dir.join("handover.sock"));
    let old = start_daemon(ctx, &socket, &format!("daemon{index}-old"), handover.as_deref(), false)?;
    let before = modified(&ctx.disk)?;
    std::thread::scope(|scope| {
        let vm = match frontend {
            Frontend::Exitless => Vm::Exitless(ExitlessVm::start(&socket, index, ctx)?),
            Frontend::Qemu => {
                let qemu = ctx.qemu.as_ref().ok_or(RoundError::NoQemu)?;
                let args = qemu_args(&socket, ctx);
                Vm::Qemu(scope.spawn(move || qemu.run_marked(&args, None, &[], VM_LIMIT)))
            }
        };
        let mut vm = wait_for_first_write(&ctx.disk, before, vm)?;
        std::thread::sleep(ctx.restart_after);
        if vm.ended() {
            return Err(RoundError::EndedBeforeRestart { stdout: vm.finish()?.stdout.trim().to_string() });
        }
        // The daemon that serves the rest of the run: the new one, or the old one when there
        // is no restart (the control).
        let new = format!("daemon{index}-new");
        let (mut sigterm_to_exit, mut handover_to_exit) = (None, None);
        let (old_log, serving) = match stop {
            Stop::None => (String::new(), old),
            Stop::Sigterm => {
                let (took, log) = old.terminate(STOP_LIMIT)?;
                sigterm_to_exit = Some(took);
                (log, start_daemon(ctx, &socket, &new, None, false)?)
            }
            Stop::Kill => (old.kill()?, start_daemon(ctx, &socket, &new, None, false)?),
            Stop::Handover => {
                let started = Instant::now();
                let successor = start_daemon(ctx, &socket, &new, handover.as_deref(), true)?;
                let (took, log) = old.exited(STOP_LIMIT, started)?;
                handover_to_exit = Some(took);
                (log, successor)
            }
        };
        let out = vm.finish()?;
        let serving_log = serving.terminate(STOP_LIMIT)?.1;
        let connections =
            [&old_log, &serving_log].into_iter().map(|log| log.matches("frontend connected").count());
        let connections = u64::try_from(connections.sum::<usize>()).unwrap_or(u64::MAX);
        let line = out.result().ok_or_else(|| RoundError::NoResult { output: out.describe() })?;
        let figure = |name: &str| line[name].as_u64();
        let ms = |name: &str| line[name].as_f64().map(|ns| ns / 1e6);
        let round = Round {
            pause_ms: ms("max_ns").ok_or_else(|| RoundError::NoMaxNs { line: line.clone() })?,
            p50_ms: ms("p50_ns").unwrap_or(0.0),
            reconnected_ms: reconnected_ms(&out.stderr),
            reconnections: match frontend {
                Frontend::Exitless => out.stats().and_then(|s| s["devices"][0]["reconnections"].as_u64()),
                Frontend::Qemu => Some(connections.saturating_sub(1)),
            },
            sigterm_to_exit,
            handover_to_exit,
            resubmitted: resubmitted(&serving_log),
            errors: figure("errors").unwrap_or(0),
            mismatches: figure("mismatches").unwrap_or(0),
        };
        if !out.ok {
            return Err(RoundError::VerifyFailed {
                errors: round.errors,
                mismatches: round.mismatches,
                output: out.describe(),
                log: serving_log.trim().to_string(),
            });
        }
        Ok(round)
    })
}

/// `exitless vhost-user-blk` serving the disk on `socket`, its log `<name>.log`; with
/// `--handover-socket` when `handover` is given, and as the successor of the daemon listening
/// there when `successor` is set.
fn start_daemon(
    ctx: &Context,
    socket: &Path,
    name: &str,
    handover: Option<&Path>,
    successor: bool,
) -> Result<Backend, DaemonError> {
    // The old daemon's socket file may outlive it (kill -9): the new one must not be mistaken
    // for listening before it does. A successor takes the live one over.
    if !successor {
        let _ = std::fs::remove_file(socket);
        if let Some(handover) = handover {
            let _ = std::fs::remove_file(handover);
        }
    }
    let mut command = Command::new(&ctx.exe);
    command
        .args(["vhost-user-blk", "--disk"])
        .arg(format!("socket={},path={},direct,iops={}", socket.display(), ctx.disk.display(), ctx.iops))
        .args(["--io-mode", ctx.io_mode])
        .args(ctx.seccomp.flag());
    if let Some(handover) = handover {
        command.arg("--handover-socket").arg(handover);
    }
    Backend::start(
        command,
        &[socket.to_owned()],
        &ctx.dir.join(format!("{name}.log")),
        "exitless vhost-user-blk",
    )
}

/// The probe's verify run on the command line; QEMU's also gets the TSC rate, which `exitless
/// run --probe` adds itself.
fn workload(ctx: &Context) -> String {
    let verify = crate::verify_cmdline(ctx.blocks, ctx.qd, crate::fresh_seed());
    format!("{verify} probe.bs=4096 probe.timeout_ms={GUEST_WAIT_MS}")
}

/// QEMU-KVM microvm booting the probe on a vhost-user-blk disk behind a chardev that reconnects
/// every second; its ring of 256 (the probe's size) tracked in the in-flight region.
fn qemu_args(socket: &Path, ctx: &Context) -> Vec<String> {
    let cmdline = format!("{} probe.tsc_khz={}", workload(ctx), ctx.tsc_khz);
    let mut args = Qemu::probe_args("microvm,acpi=off,memory-backend=mem", &ctx.elf, &cmdline, MEM_MIB);
    args.extend([
        "-global".into(),
        "virtio-mmio.force-legacy=false".into(),
        "-object".into(),
        format!("memory-backend-memfd,id=mem,size={MEM_MIB}M,share=on"),
        "-chardev".into(),
        format!("socket,id=vu,path={},reconnect=1", socket.display()),
        "-device".into(),
        "vhost-user-blk,chardev=vu,queue-size=256".into(),
    ]);
    args
}

/// The disk file's modification time.
fn modified(path: &Path) -> Result<SystemTime, RoundError> {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .map_err(|source| RoundError::File { path: path.to_owned(), source })
}

/// Waits until the guest's first write reached the disk file (its modification time moved):
/// its verify run is under way.
fn wait_for_first_write<'s>(disk: &Path, before: SystemTime, mut vm: Vm<'s>) -> Result<Vm<'s>, RoundError> {
    let deadline = Instant::now() + FIRST_WRITE_LIMIT;
    while modified(disk)? <= before {
        if vm.ended() {
            return Err(RoundError::EndedBeforeFirstWrite { output: vm.finish()?.describe() });
        }
        if Instant::now() > deadline {
            return Err(RoundError::NoFirstWrite);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(vm)
}

/// A running probe VM.
enum Vm<'scope> {
    Exitless(ExitlessVm),
    Qemu(std::thread::ScopedJoinHandle<'scope, Result<(QemuRun, Vec<crate::qemu::PeerMark>), QemuError>>),
}

/// What a VM printed when it ended.
struct Output {
    stdout: String,
    stderr: String,
    /// Whether it ended as a passing run does (exit status 0; QEMU: the guest's OK).
    ok: bool,
    /// How it ended, for errors.
    status: String,
}

impl Vm<'_> {
    fn ended(&mut self) -> bool {
        match self {
            Vm::Exitless(vm) => !matches!(vm.child.try_wait(), Ok(None)),
            Vm::Qemu(handle) => handle.is_finished(),
        }
    }

    /// Waits for it to end (within `VM_LIMIT` of its start; it is killed then).
    fn finish(self) -> Result<Output, RoundError> {
        match self {
            Vm::Exitless(vm) => vm.finish(),
            Vm::Qemu(handle) => {
                let (run, _) = handle.join().map_err(|_| RoundError::QemuPanicked)??;
                Ok(Output {
                    ok: run.guest_status == probe_abi::status::OK,
                    status: format!("guest status {}", run.guest_status),
                    stdout: run.stdout,
                    stderr: String::new(),
                })
            }
        }
    }
}

/// `exitless run --probe` on the vhost-user disk, its output in files; killed and reaped when
/// dropped.
struct ExitlessVm {
    child: Child,
    started: Instant,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl ExitlessVm {
    fn start(socket: &Path, index: usize, ctx: &Context) -> Result<ExitlessVm, RoundError> {
        let stdout = ctx.dir.join(format!("vm{index}.out"));
        let stderr = ctx.dir.join(format!("vm{index}.err"));
        let file = |path: &Path| {
            std::fs::File::create(path).map_err(|source| RoundError::File { path: path.to_owned(), source })
        };
        let mut command = Command::new(&ctx.exe);
        command
            .args(["run", "--probe", "--mem", &format!("{MEM_MIB}M"), "--io-mode", "eventfd"])
            .args(["--disk", &format!("vhost-user={},reconnect=10", socket.display())])
            .args(["--timeout", &VM_LIMIT.as_secs().to_string(), "--stats", "--json"])
            .args(["--cmdline", &workload(ctx)])
            .args(ctx.seccomp.flag())
            .stdin(Stdio::null())
            .stdout(file(&stdout)?)
            .stderr(file(&stderr)?);
        crate::daemon::dies_with_parent(&mut command);
        let child = command.spawn().map_err(RoundError::StartVm)?;
        Ok(ExitlessVm { child, started: Instant::now(), stdout, stderr })
    }

    fn finish(mut self) -> Result<Output, RoundError> {
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if self.started.elapsed() < VM_LIMIT + Duration::from_secs(10) => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Ok(None) => return Err(RoundError::VmTimeout),
                Err(e) => return Err(RoundError::WaitVm(e)),
            }
        };
        let read = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
        Ok(Output {
            stdout: read(&self.stdout),
            stderr: read(&self.stderr),
            ok: status.success(),
            status: format!("exitless run ended with {status}"),
        })
    }
}

impl Drop for ExitlessVm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Output {
    fn json_lines(&self) -> impl Iterator<Item = Value> + '_ {
        self.stdout.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok())
    }

    /// The probe's `blk` result line.
    fn result(&self) -> Option<Value> {
        crate::blk_result(&self.stdout)
    }

    /// `exitless run --stats --json`'s line.
    fn stats(&self) -> Option<Value> {
        self.json_lines().find(|v| v["exitless"] == "run")
    }

    /// How it ended and the last of what it said.
    fn describe(&self) -> String {
        let last = |text: &str| text.lines().rev().take(3).collect::<Vec<_>>().join(" / ");
        format!("{}; stdout: {}; stderr: {}", self.status, last(&self.stdout), last(&self.stderr))
    }
}

/// The exitless frontend's "reconnected to a daemon after N ms".
fn reconnected_ms(stderr: &str) -> Option<u64> {
    stderr
        .lines()
        .filter_map(|l| l.split("reconnected to a daemon after ").nth(1))
        .find_map(|rest| rest.split_whitespace().next()?.parse().ok())
}

/// "resubmitting N request(s)" summed over a daemon's log.
fn resubmitted(log: &str) -> u64 {
    log.lines()
        .filter_map(|l| l.split("resubmitting ").nth(1))
        .filter_map(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_what_the_frontend_and_the_daemon_logged() {
        let stderr = "[WARN] vhost-user disk /t/u.sock: reconnected to a daemon after 47 ms, its ring resumed at used index 12\n";
        assert_eq!(super::reconnected_ms(stderr), Some(47));
        assert_eq!(super::reconnected_ms("nothing"), None);
        let log = "d: vring 0 resumes at avail index 9 (the frontend said 5), resubmitting 4 request(s) in flight\n\
                   d: vring 1 resumes at avail index 3 (the frontend said 2), resubmitting 1 request(s) in flight\n";
        assert_eq!(super::resubmitted(log), 5);
    }
}
