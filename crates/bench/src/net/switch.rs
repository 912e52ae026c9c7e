//! `exitless vhost-user-net` as the bench starts it: NICs for the guests of a row, its IOCore
//! on the IOCore's CPU, its log in the run's directory; and the row of exitless's own VM on it.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use exitless_args::VhostIoMode;
use thiserror::Error;
use vmm::{ConsoleMode, IoMode, VhostUserNic, VmConfig};

use super::{Lab, Row, PORT, RUN_SLACK, SERVER_UPLINK_IP, UPLINK_GUEST_IP};
use crate::args::NetBenchArgs;
use crate::daemon::{Backend as Daemon, DaemonError};
use crate::probe_dir::{ProbeDir, ProbeDirError};
use crate::scale::launch::Context;

/// The guest NIC's address on the daemon, in every row that has one guest there.
pub const GUEST_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x65, 0x78, 0x02];
/// The same, as the command lines spell it.
pub const GUEST_MAC_TEXT: &str = "52:54:00:65:78:02";

/// Why the daemon could not be started or stopped.
#[derive(Debug, Error)]
pub enum SwitchError {
    /// It failed to start, or to stop when told.
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    /// The path of this executable, which runs the daemon, is unknown.
    #[error("cannot find this executable: {0}")]
    CurrentExe(#[source] std::io::Error),
    /// The directory of the daemon's socket could not be made.
    #[error(transparent)]
    Dir(#[from] ProbeDirError),
    /// The guest's run failed.
    #[error(transparent)]
    Guest(#[from] super::GuestRunError),
}

/// The row's name of exitless's own VM on the daemon in `mode`.
pub fn exitless_row_name(mode: VhostIoMode) -> String {
    format!("exitless on exitless vhost-user-net (uplink), daemon {}", mode.name())
}

/// The row of exitless's own VM, polling, with its NIC on the daemon, whose IOCore runs in
/// `mode`: UDP request-response to the responder through the switch and its uplink. Its cores
/// include the daemon's, over the whole run (a polling IOCore spins throughout).
pub fn exitless_row(lab: &Lab, args: &NetBenchArgs, tsc_khz: u32, mode: VhostIoMode) -> Row {
    let mut row = Row::new("exitless", exitless_row_name(mode), args.size);
    if let Err(e) = measure(&mut row, lab, args, tsc_khz, mode) {
        row.note = Some(format!("not measured: {e}"));
    }
    row
}

fn measure(
    row: &mut Row,
    lab: &Lab,
    args: &NetBenchArgs,
    tsc_khz: u32,
    daemon_mode: VhostIoMode,
) -> Result<(), SwitchError> {
    let dir = ProbeDir::make("net-switch")?;
    let socket = dir.path().join("nic.sock");
    let nics = [(socket.as_path(), GUEST_MAC_TEXT)];
    let command = switch_command(args, daemon_mode, &nics, Some(&lab.uplink))?;
    // The guest runs in this process; the daemon is the row's own set-up.
    row.command = Some(shown(&command));
    let daemon = start(command, dir.path(), &nics)?;
    let cmdline = format!(
        "probe.workload=udp-rr probe.ip={UPLINK_GUEST_IP} probe.dst={SERVER_UPLINK_IP} probe.port={PORT} \
         probe.size={} probe.duration_ms={} probe.warmup={} probe.tsc_khz={tsc_khz}",
        args.size, args.duration_ms, args.warmup
    );
    let mode = IoMode::Exitless;
    let config = VmConfig {
        cmdline: probe_image::with_io_mode(&cmdline, mode),
        testdev: true,
        console: ConsoleMode::Capture,
        timeout: Some(Duration::from_millis(args.duration_ms) + RUN_SLACK),
        pin_vcpus: vec![args.vcpu_cpu],
        vhost_user_nets: vec![VhostUserNic {
            socket,
            mac: GUEST_MAC,
            reconnect: Duration::ZERO,
            daemon_uid: None,
        }],
        io_mode: mode,
        seccomp: args.seccomp.mode(),
        ..Default::default()
    };
    let (daemon_cpu, started) = (crate::qemu::process_cpu_time(daemon.id()), Instant::now());
    let run = super::super::run_guest(&config, "udp-rr")?;
    let daemon_cores = crate::qemu::process_cpu_time(daemon.id()).saturating_sub(daemon_cpu).as_secs_f64()
        / started.elapsed().as_secs_f64();
    daemon.terminate(Duration::from_secs(10))?;
    row.fill(&run);
    row.cpu_cores_used = run.cores_used.map(|vm| vm + daemon_cores);
    Ok(())
}

/// Start `exitless vhost-user-net` serving `nics` (socket, MAC), with `uplink` if given, its
/// IOCore in `mode` on the IOCore CPU and its log in `dir`.
pub fn start_switch(
    args: &NetBenchArgs,
    mode: VhostIoMode,
    dir: &Path,
    nics: &[(&Path, &str)],
    uplink: Option<&str>,
) -> Result<Daemon, SwitchError> {
    start(switch_command(args, mode, nics, uplink)?, dir, nics)
}

/// How the bench's launcher runs exitless VMs (`scale::launch::run_exitless`) whose NICs are on
/// a daemon of `dir`: the vCPU on `vcpu_cpu`, the probe measuring for `duration_ms`.
pub fn exitless_vm_context(
    args: &NetBenchArgs,
    tsc_khz: u32,
    dir: &ProbeDir,
    vcpu_cpu: usize,
    duration_ms: u64,
) -> Result<Context, SwitchError> {
    Ok(Context {
        exe: std::env::current_exe().map_err(SwitchError::CurrentExe)?,
        tsc_khz,
        duration_ms,
        warmup_ms: 0,
        vcpu_cpu,
        io_cpu: args.iocore_cpu,
        seccomp: args.seccomp,
        qemu: None,
        storage_daemon: None,
        dir: dir.path().to_owned(),
        elf: dir.elf().to_owned(),
    })
}

/// The daemon's command line, as [`start_switch`] runs it.
fn switch_command(
    args: &NetBenchArgs,
    mode: VhostIoMode,
    nics: &[(&Path, &str)],
    uplink: Option<&str>,
) -> Result<Command, SwitchError> {
    let mut command = Command::new(std::env::current_exe().map_err(SwitchError::CurrentExe)?);
    let cpu = args.iocore_cpu.to_string();
    command
        .args(["vhost-user-net", "--io-mode", &mode.name(), "--iocore-cpu", &cpu])
        .args(args.seccomp.flag());
    for (socket, mac) in nics {
        command.args(["--nic", &format!("socket={},mac={mac}", socket.display())]);
    }
    if let Some(uplink) = uplink {
        command.args(["--uplink", uplink]);
    }
    Ok(command)
}

fn start(command: Command, dir: &Path, nics: &[(&Path, &str)]) -> Result<Daemon, SwitchError> {
    let sockets: Vec<_> = nics.iter().map(|(socket, _)| socket.to_path_buf()).collect();
    for socket in &sockets {
        let _ = std::fs::remove_file(socket);
    }
    Ok(Daemon::start(command, &sockets, &dir.join("vhost-user-net.log"), "exitless vhost-user-net")?)
}

/// `command` as a shell would take it (its arguments hold no spaces).
fn shown(command: &Command) -> String {
    let words = std::iter::once(command.get_program()).chain(command.get_args());
    words.map(|w| w.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ")
}
