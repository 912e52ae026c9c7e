//! `exitless vhost-user-net`: NICs served over vhost-user (to QEMU's `-netdev vhost-user` and
//! other frontends), every NIC a port of the switch an IOCore runs (`--iocores N`: a switch on
//! each, the NICs spread over them). Frames between two NICs of one IOCore go from one guest's
//! transmit ring into the other's receive ring, with one copy and no system call (see the
//! `switch` crate); between two IOCores, through a ring between their switches. With
//! `--uplink`, an AF_PACKET socket on a host interface carries frames to and from the host, its
//! rings polled by the first IOCore.
//!
//! [`run`] starts the IOCore and the NICs' connection threads ([`nics`]); its thread then
//! becomes the control thread, which waits for the stop signal and, with `--api-socket`,
//! answers the control API ([`routes`], [`metrics`]) or hands the NICs over to a successor
//! (`--handover-socket`: `vhost_user::upgrade`, and [`handover`] for what a NIC is to it).

#![deny(missing_docs)]

pub mod args;
mod handover;
mod metrics;
mod nics;
mod routes;

use std::sync::Arc;

use api_http::server::ControlApi;
use iocore::IoCore;
use sandbox::{Filter, SandboxError, ThreadKind};
use switch::{Switch, SwitchControl};
use thiserror::Error;
use unix_socket::{Access, ListenError};
use vhost_user::upgrade::{self, HandoverSocket, TakeOverError};
use vhost_user_blk::signals::{exit_after_stop_grace, stop_signals, wait_for_control, Woken};
use virtqueue::WorkerHost;

pub use args::{Nic, VhostUserNetArgs};
use handover::TakenNics;
pub use nics::NicError;
use nics::Nics;

/// Each switch's id on its IOCore (it is the only worker there).
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
    /// The switch's mailbox or the epoll instance that wakes it could not be made.
    #[error("cannot set up the switch's wake-ups: {0}")]
    Switch(#[source] std::io::Error),
    /// A NIC of the command line could not be served.
    #[error(transparent)]
    Nic(#[from] NicError),
    /// The control API could not be started.
    #[error("control API: {0}")]
    Api(#[from] api_http::server::ServerError),
    /// The hand-over socket could not be listened on.
    #[error("--handover-socket: {0}")]
    HandoverSocket(#[source] ListenError),
    /// The NICs could not be taken over from the daemon on the hand-over socket.
    #[error(transparent)]
    TakeOver(#[from] TakeOverError),
}

impl Error {
    /// Is it the command line's fault (a usage error, status 2)?
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            Error::Nic(
                NicError::NameTaken(_)
                    | NicError::MacTaken { .. }
                    | NicError::SocketTaken { .. }
                    | NicError::NoTwin { .. }
                    | NicError::TwinMac { .. }
            ) | Error::Uplink(af_packet::PacketError::NoInterface(_))
        )
    }
}

/// Run the daemon until SIGINT or SIGTERM (or until a successor took its NICs over).
pub fn run(args: VhostUserNetArgs) -> Result<(), Error> {
    // The command line's NICs are checked against each other before any socket is made.
    let mut earlier: Vec<(String, &Nic)> = Vec::new();
    for (index, nic) in args.nic.iter().enumerate() {
        let name = nics::name_of(nic, index);
        Nics::check(earlier.iter().map(|(name, nic)| (name.as_str(), *nic)), &name, nic)?;
        earlier.push((name, nic));
    }
    let stop = stop_signals().map_err(Error::Signals)?;
    let seccomp = args.seccomp.mode();
    exit_after_stop_grace(&stop, Filter::new(ThreadKind::StopWatchdog, seccomp)?).map_err(Error::Watchdog)?;
    let control = Arc::new(SwitchControl::with_switches(args.iocores.into()).map_err(Error::Switch)?);
    let mut nics = Nics::new(control.clone(), Access::owner_only(), seccomp);
    // The uplink is the first switch's.
    let mut uplink = match &args.uplink {
        Some(interface) => {
            let ring = af_packet::PacketRing::open(interface)?;
            let counters = Arc::default();
            nics.uplink = Some((interface.clone(), Arc::clone(&counters)));
            log::info!("uplink on {interface}");
            Some((ring, counters))
        }
        None => None,
    };
    let switches = (0..control.switches())
        .map(|index| {
            let switch = Switch::new(control.clone(), index)?;
            match uplink.take() {
                Some((ring, counters)) => switch.with_uplink(ring, counters),
                None => Ok(switch),
            }
        })
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(Error::Switch)?;
    let iocores = switches
        .into_iter()
        .enumerate()
        .map(|(k, switch)| {
            let cpu = (!args.iocore_cpu.is_empty()).then(|| args.iocore_cpu[k % args.iocore_cpu.len()]);
            let filter = Filter::new(ThreadKind::SwitchIoCore, seccomp)?;
            let iocore: IoCore<Switch> = IoCore::spawn_confined(args.io.policy(), cpu, filter)?;
            iocore.attach(SWITCH_ID, switch, None);
            Ok(iocore)
        })
        .collect::<Result<Vec<_>, Error>>()?;
    log::info!("{} switch IOCore(s) serve in {} mode", iocores.len(), args.io.mode_name());
    let mut successors = match &args.handover_socket {
        Some(path) => {
            nics = nics.with_handover();
            Some(match upgrade::connect(path) {
                Some(stream) => {
                    // The predecessor's messages (states, descriptors, sessions) are bytes from
                    // another process, read only under the control thread's filter.
                    let filter = Filter::new(ThreadKind::DaemonControl, seccomp)?;
                    let confine = move || filter.install().map_err(|e| e.to_string());
                    let mut taken = TakenNics { nics: &mut nics, specs: &args.nic };
                    upgrade::take_over(&stream, path, &mut taken, confine)?
                }
                None => {
                    add_nics(&mut nics, &args.nic)?;
                    HandoverSocket::bind(path).map_err(Error::HandoverSocket)?
                }
            })
        }
        None => {
            add_nics(&mut nics, &args.nic)?;
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
    // This thread waits for the stop signal now and, with the control API, adds and removes
    // NICs: it keeps what that takes.
    let kind = if api.is_some() { ThreadKind::DaemonControl } else { ThreadKind::VhostUserConnection };
    sandbox::install(kind, seccomp)?;
    let mut handed_over = false;
    loop {
        let handover_fd = successors.as_ref().map(HandoverSocket::fd);
        match wait_for_control(&stop, &[api.as_ref().map(ControlApi::wake_fd), handover_fd], None) {
            Woken::Stop => break,
            Woken::Ready(1) => {
                if let Some(socket) = successors.as_mut() {
                    if socket.serve_successor(&nics) {
                        handed_over = true;
                        break;
                    }
                }
            }
            Woken::Ready(_) => {
                if let Some(api) = &api {
                    api.answer(|request| routes::handle(&mut nics, &iocores, request));
                }
            }
            Woken::Timeout => {}
        }
    }
    if !handed_over {
        log::info!("stopping");
    }
    // After a hand-over the NICs' threads have ended already, leaving their sockets alone.
    nics.stop_all();
    if let Some(api) = api {
        api.join();
    }
    for (k, iocore) in iocores.into_iter().enumerate() {
        if let Some(stats) = iocore.stop() {
            log::info!("switch IOCore {k} took {} frames and slept {} times", stats.work, stats.sleeps);
        }
    }
    Ok(())
}

/// Serve the command line's NICs, each on its socket.
fn add_nics(nics: &mut Nics, specs: &[Nic]) -> Result<(), Error> {
    for spec in specs {
        nics.add(spec.clone())?;
    }
    Ok(())
}
