//! `exitless vhost-user-net`: NICs served over vhost-user (to QEMU's `-netdev vhost-user` and
//! other frontends), every NIC a port of one switch that an IOCore runs. Frames between two
//! NICs of the daemon go from one guest's transmit ring into the other's receive ring, with one
//! copy and no system call (see the `switch` crate).
//!
//! With `--uplink`, an AF_PACKET socket on a host interface carries frames to and from the
//! host, its rings polled by the same IOCore. There is no control API or hand-over yet.

#![deny(missing_docs)]

pub mod args;

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use iocore::{IoCore, Policy};
use sandbox::{Filter, SandboxError, ThreadKind};
use switch::{Switch, SwitchControl};
use thiserror::Error;
use unix_socket::Access;
use vhost_user::VhostUserNet;
use vhost_user_blk::signals::{exit_after_stop_grace, stop_signals};
use virtqueue::WorkerHost;

pub use args::{Nic, VhostUserNetArgs};

/// The switch's id on its IOCore (it is the only worker there).
const SWITCH_ID: u64 = 0x7377_0000_0000;

/// Why the daemon could not run. Each variant's message says what went wrong.
#[derive(Debug, Error)]
#[allow(missing_docs)] // Each variant's message says what it is.
pub enum Error {
    /// SIGINT and SIGTERM could not be routed to a signalfd.
    #[error("cannot set up the stop signals: {0}")]
    Signals(#[source] std::io::Error),
    /// The stop watchdog could not be started.
    #[error("cannot start the stop watchdog: {0}")]
    Watchdog(#[source] std::io::Error),
    /// A thread's seccomp filter could not be built or installed.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// The uplink's interface could not be opened.
    #[error("uplink: {0}")]
    Uplink(#[from] af_packet::PacketError),
    /// The IOCore could not be started.
    #[error(transparent)]
    IoCore(#[from] iocore::IoCoreError),
    /// A NIC's socket could not be made.
    #[error("NIC {index} ({}): {source}", .socket.display())]
    Socket {
        index: usize,
        socket: PathBuf,
        #[source]
        source: vhost_user::Error,
    },
    /// Two NICs were given one address or one socket.
    #[error("NICs {first} and {second} have the same {what}: give each its own")]
    Duplicate { first: usize, second: usize, what: &'static str },
    /// A NIC's connection thread could not be started.
    #[error("NIC {index}: cannot start its thread: {source}")]
    Thread {
        index: usize,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Is it the command line's fault (a usage error, status 2)?
    pub fn is_usage(&self) -> bool {
        matches!(self, Error::Duplicate { .. } | Error::Uplink(af_packet::PacketError::NoInterface(_)))
    }
}

/// Run the daemon until SIGINT or SIGTERM.
pub fn run(args: VhostUserNetArgs) -> Result<(), Error> {
    check_distinct(&args.nic)?;
    let stop = stop_signals().map_err(Error::Signals)?;
    let seccomp = args.seccomp.mode();
    exit_after_stop_grace(&stop, Filter::new(ThreadKind::StopWatchdog, seccomp)?).map_err(Error::Watchdog)?;
    let control = Arc::new(SwitchControl::default());
    let mut switch = Switch::new(control.clone());
    if let Some(interface) = &args.uplink {
        switch = switch.with_uplink(af_packet::PacketRing::open(interface)?);
        log::info!("uplink on {interface}");
    }
    let filter = Filter::new(ThreadKind::SwitchIoCore, seccomp)?;
    // The switch polls every ring: it takes no kicks (a NIC's guest never notifies).
    let iocore: IoCore<Switch> = IoCore::spawn_confined(Policy::Polling, args.iocore_cpu, filter)?;
    iocore.attach(SWITCH_ID, switch, None);
    let access = Access::owner_only();
    let mut threads = Vec::new();
    for (index, nic) in args.nic.iter().enumerate() {
        let server = vhost_user::Server::bind_with(&nic.socket, access.clone())
            .map_err(|source| Error::Socket { index, socket: nic.socket.clone(), source })?;
        let mut device = VhostUserNet::new(nic.mac, nic.policy, control.clone());
        let stop = stop.try_clone().map_err(|source| Error::Thread { index, source })?;
        let socket = nic.socket.clone();
        let thread = std::thread::Builder::new()
            .name(format!("nic-{index}"))
            .spawn(move || {
                // This thread reads the NIC's frontends' messages from here on.
                if let Err(e) = sandbox::install(ThreadKind::VhostUserConnection, seccomp) {
                    log::error!("NIC {index}: {e}; not served");
                    return;
                }
                if let Err(e) = server.serve(&mut device, Some(stop.as_fd())) {
                    log::error!("NIC {index} ({}): {e}; no longer served", socket.display());
                }
            })
            .map_err(|source| Error::Thread { index, source })?;
        log::info!("NIC {index} ({}) on {}", nic.mac, nic.socket.display());
        threads.push(thread);
    }
    sandbox::install(ThreadKind::VhostUserConnection, seccomp)?;
    wait_readable(&stop);
    log::info!("stopping");
    for thread in threads {
        let _ = thread.join();
    }
    iocore.stop();
    Ok(())
}

/// No two NICs share an address (the switch could not tell them apart) or a socket.
fn check_distinct(nics: &[Nic]) -> Result<(), Error> {
    for (second, nic) in nics.iter().enumerate() {
        for (first, earlier) in nics[..second].iter().enumerate() {
            let what = match (earlier.mac == nic.mac, earlier.socket == nic.socket) {
                (true, _) => "MAC address",
                (_, true) => "socket",
                _ => continue,
            };
            return Err(Error::Duplicate { first, second, what });
        }
    }
    Ok(())
}

/// Wait until `fd` (the stop signalfd) is readable.
fn wait_readable(fd: &OwnedFd) {
    let mut pollfd = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd; poll writes only its `revents`. EINTR cannot happen: the handled
    // signals are blocked and come through the signalfd.
    while unsafe { libc::poll(&mut pollfd, 1, -1) } <= 0 {}
}
