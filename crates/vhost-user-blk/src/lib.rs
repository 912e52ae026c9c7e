//! `exitless vhost-user-blk`: exitless's virtio-blk device and IOCore served over vhost-user, so
//! the guests of other VMMs (QEMU's `vhost-user-blk-pci`, Cloud Hypervisor, ...) use them. One
//! daemon serves many disks, each on its own socket, to a frontend each; the rings of every
//! connected frontend are served by a few shared IOCores (the shared data plane).
//!
//! [`run`] runs the daemon: it opens the disks, starts their sockets and the IOCores, and its
//! thread then becomes the control thread, which waits for the stop signal, answers the
//! control API and serves a successor's hand-over.
//!
//! - [`args`]: the command line.
//! - [`spec`]: `--disk socket=PATH,...` (and the control API's JSON disks).
//! - [`disks`]: the disks being served, each with its connection thread.
//! - [`handover`]: `--handover-socket`, an upgrade the frontends do not see.
//! - [`placement`]: which IOCore serves which disk.
//! - [`stats`]: `--stats-interval` lines.
//! - [`routes`], [`prometheus`]: `--api-socket`, the control API (its thread is
//!   `api_http::server`'s).
//! - [`api_dirs`]: `--api-disk-dir`, where the control API's disks may open files.
//! - [`signals`]: SIGINT and SIGTERM, and the stop watchdog.

#![deny(missing_docs)]

mod api_dirs;
pub mod args;
mod disks;
mod error;
mod handover;
mod placement;
mod prometheus;
mod routes;
pub mod signals;
mod spec;
mod stats;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use api_http::server::ControlApi;
use iocore::IoCore;
use sandbox::{Filter, ThreadKind};
use unix_socket::Access;

use api_dirs::ApiDiskDirs;
use args::SocketOwner;
pub use args::VhostUserBlkArgs;
use disks::Disks;
pub use error::{DaemonError, Error, UsageError};
use handover::TakenDisks;
use signals::{exit_after_stop_grace, stop_signals, wait_for_control, Woken};
use spec::VhostDisk;
use stats::Reporter;
use vhost_user::upgrade::{self, HandoverSocket};

/// Run the daemon until SIGINT or SIGTERM (or until a successor took its disks over).
pub fn run(args: VhostUserBlkArgs) -> Result<(), Error> {
    let sockets = sockets(&args)?;
    Ok(serve(args, sockets)?)
}

/// Each `--disk` with its socket: the one it names, or `--socket` (for at most one disk).
fn sockets(args: &VhostUserBlkArgs) -> Result<Vec<PathBuf>, UsageError> {
    let unnamed = args.disk.iter().filter(|d| d.socket.is_none()).count();
    match (&args.socket, unnamed) {
        (_, n) if n > 1 => return Err(UsageError::SeveralUnnamed),
        (None, 1) => return Err(UsageError::UnnamedWithoutDefault),
        (Some(_), 0) => return Err(UsageError::DefaultUnused),
        _ => {}
    }
    let sockets: Vec<PathBuf> = args
        .disk
        .iter()
        .map(|d| d.socket.clone().or_else(|| args.socket.clone()).unwrap_or_default())
        .collect();
    for (i, socket) in sockets.iter().enumerate() {
        if sockets[..i].contains(socket) {
            return Err(UsageError::SameSocket(socket.clone()));
        }
    }
    Ok(sockets)
}

/// Serve the disks of `args`, each on its socket (`sockets`, in the same order).
fn serve(args: VhostUserBlkArgs, sockets: Vec<PathBuf>) -> Result<(), DaemonError> {
    let started = Instant::now();
    // SIGINT/SIGTERM arrive through a signalfd the servers poll; blocked before any thread
    // starts, so every thread inherits the mask.
    let stop = stop_signals().map_err(DaemonError::Signals)?;
    let watchdog = Filter::new(ThreadKind::StopWatchdog, args.seccomp.mode())?;
    exit_after_stop_grace(&stop, watchdog).map_err(DaemonError::Watchdog)?;
    // Measured once, before any thread confines itself (rate limits, service times).
    clock::ticks_per_second();
    let policy = args.io.policy();
    let seccomp = args.seccomp.mode();
    // librbd's threads (an `rbd=` disk's) on the IOCores' CPUs, under their own filter.
    let rbd_threads = iocore::backend_thread_set_up(ThreadKind::RbdClient, seccomp, args.iocore_cpu.clone())?;
    storage::rbd::set_up_client_threads(Box::new(rbd_threads));
    if args.api_socket.is_some() {
        // Started before the control thread confines itself: a disk added through the API opens
        // its image on it.
        if let Err(error) = storage::rbd::start_client_thread() {
            eprintln!("exitless vhost-user-blk: RBD disks cannot be added through the API: {error}");
        }
    }
    let iocores = (0..args.iocores as usize)
        .map(|k| {
            let cpu = (!args.iocore_cpu.is_empty()).then(|| args.iocore_cpu[k % args.iocore_cpu.len()]);
            let filter = Filter::new(ThreadKind::VhostUserIoCore, seccomp)?;
            Ok(Arc::new(IoCore::spawn_confined(policy, cpu, filter)?))
        })
        .collect::<Result<Vec<_>, DaemonError>>()?;
    let mode = args.io.mode_name();
    let owner = args.socket_owner.unwrap_or(SocketOwner { uid: None, gid: None });
    let access = Access::new(args.socket_mode, owner.uid, owner.gid);
    // Opened now, before this thread confines itself, and held: what the operator allowed is
    // what the API's lookups start from, whatever is renamed later.
    let api_dirs = ApiDiskDirs::open(&args.api_disk_dir)?;
    let mut disks = Disks::new(iocores.clone(), args.queues, seccomp, args.api_socket.is_some(), mode)
        .with_access(access)
        .with_api_disk_dirs(api_dirs);
    let specs: Vec<(VhostDisk, PathBuf)> = args.disk.iter().cloned().zip(sockets).collect();
    let mut successors = match &args.handover_socket {
        Some(path) => {
            disks = disks.with_handover();
            match upgrade::connect(path) {
                Some(stream) => {
                    // The predecessor's messages (states, descriptors, sessions) are bytes from
                    // another process, read only under the control thread's filter, which
                    // allows all that adding a disk takes.
                    let filter = Filter::new(ThreadKind::DaemonControl, seccomp)?;
                    let mut taken = TakenDisks { disks: &mut disks, specs: &specs };
                    let confine = move || filter.install().map_err(|e| e.to_string());
                    Some(upgrade::take_over(&stream, path, &mut taken, confine)?)
                }
                None => {
                    add_disks(&mut disks, specs)?;
                    Some(HandoverSocket::bind(path).map_err(DaemonError::HandoverSocket)?)
                }
            }
        }
        None => {
            add_disks(&mut disks, specs)?;
            None
        }
    };
    let api = match &args.api_socket {
        Some(path) => {
            let filter = Filter::new(ThreadKind::ApiServer, seccomp)?;
            Some(ControlApi::start(path, &stop, move || filter.install())?)
        }
        None => None,
    };
    // This thread waits for the stop signal now, printing figures and, with the control API,
    // adding and removing disks: it keeps what that takes.
    let kind = if api.is_some() { ThreadKind::DaemonControl } else { ThreadKind::VhostUserConnection };
    sandbox::install(kind, seccomp)?;
    let mut reporter = Reporter::new(args.json, started);
    let interval = args.stats_interval.map(Duration::from_secs);
    let mut next_report = interval.map(|i| Instant::now() + i);
    let mut handed_over = false;
    loop {
        let limit = next_report.map(|at| at.saturating_duration_since(Instant::now()));
        let handover_fd = successors.as_ref().map(HandoverSocket::fd);
        match wait_for_control(&stop, &[api.as_ref().map(ControlApi::wake_fd), handover_fd], limit) {
            Woken::Stop => break,
            Woken::Ready(1) => {
                if let Some(socket) = successors.as_mut() {
                    if socket.serve_successor(&disks) {
                        handed_over = true;
                        break;
                    }
                }
            }
            Woken::Ready(_) => {
                if let Some(api) = &api {
                    api.answer(|request| routes::handle(&mut disks, request));
                }
            }
            Woken::Timeout => {}
        }
        if let (Some(at), Some(interval)) = (next_report, interval) {
            if Instant::now() >= at {
                reporter.report(disks.figures_mut());
                next_report = Some(at + interval);
            }
        }
    }
    if !handed_over {
        log::info!("stopping");
    }
    // After a hand-over the disks' threads have ended already, leaving their sockets alone.
    disks.stop_all();
    if let Some(api) = api {
        api.join();
    }
    if interval.is_some() {
        reporter.report(disks.figures_mut());
    }
    for iocore in &iocores {
        iocore.stop();
    }
    Ok(())
}

/// Open the disks of the command line and serve each on its socket.
fn add_disks(disks: &mut Disks, specs: Vec<(VhostDisk, PathBuf)>) -> Result<(), DaemonError> {
    for (disk, socket) in specs {
        disks.add(disk, socket)?;
    }
    Ok(())
}
