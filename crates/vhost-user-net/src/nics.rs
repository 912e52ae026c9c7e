//! The NICs the daemon serves, each on its socket with a connection thread of its own, its
//! counters shared with the switch. The control thread adds them (the command line's, then the
//! control API's) and removes them.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use api_http::server::eventfd_pair;
use sandbox::{SeccompMode, ThreadKind};
use serde_json::{json, Value};
use switch::{MacAddr, PortCounters, SharedPortCounters, SharedUplinkCounters, SwitchControl};
use thiserror::Error;
use unix_socket::Access;
use vhost_user::handover::{port, Handle};
use vhost_user::server::Listen;
use vhost_user::VhostUserNet;

use crate::args::Nic as NicSpec;

/// Why a NIC could not be added or removed. Each message says what went wrong.
#[derive(Debug, Error)]
#[allow(missing_docs)] // Each variant's message says what it is.
pub enum NicError {
    #[error("a NIC is named {0} already")]
    NameTaken(String),
    /// The switch could not tell the two apart.
    #[error("NIC {name}: address {mac} is NIC {other}'s already: give each its own")]
    MacTaken { name: String, mac: MacAddr, other: String },
    #[error("NIC {name}: shares-mac-with={twin}, but no NIC before it is named {twin}")]
    NoTwin { name: String, twin: String },
    #[error("NIC {name}: shares-mac-with={twin}, whose address is {twin_mac}, not {mac}")]
    TwinMac { name: String, twin: String, twin_mac: MacAddr, mac: MacAddr },
    #[error("NIC {name}: socket {} is NIC {other}'s already", .socket.display())]
    SocketTaken { name: String, socket: PathBuf, other: String },
    #[error("no NIC is named {0}")]
    NoSuchNic(String),
    #[error("NIC {0} has a frontend connected: stop its VM (or its NIC) first")]
    Connected(String),
    #[error("NIC {name} ({}): {source}", .socket.display())]
    Socket {
        name: String,
        socket: PathBuf,
        #[source]
        source: vhost_user::Error,
    },
    #[error("NIC {name}: cannot start its thread: {source}")]
    Thread {
        name: String,
        #[source]
        source: std::io::Error,
    },
}

impl NicError {
    /// The control API's status for it.
    pub fn status(&self) -> u16 {
        match self {
            NicError::NameTaken(_)
            | NicError::MacTaken { .. }
            | NicError::SocketTaken { .. }
            | NicError::Connected(_) => 409,
            NicError::NoSuchNic(_) => 404,
            NicError::Socket { .. } | NicError::NoTwin { .. } | NicError::TwinMac { .. } => 400,
            NicError::Thread { .. } => 500,
        }
    }
}

/// A NIC being served.
pub struct Nic {
    /// Its name.
    pub name: String,
    /// What it was added with.
    pub spec: NicSpec,
    counters: Arc<SharedPortCounters>,
    connected: Arc<AtomicBool>,
    /// Written to stop its thread.
    stop: File,
    thread: Option<JoinHandle<()>>,
    /// The control thread's end of its hand-over (with `--handover-socket`).
    handover: Option<Handle>,
}

impl Nic {
    /// What it did so far.
    pub fn counters(&self) -> PortCounters {
        self.counters.read()
    }

    /// The control thread's end of its hand-over (with `--handover-socket`).
    pub fn handover(&self) -> Option<&Handle> {
        self.handover.as_ref()
    }

    /// Is a frontend connected?
    pub fn frontend_connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    /// Its spec, state and counters, as the control API shows them.
    pub fn describe(&self) -> Value {
        let limits = self.spec.policy.limits;
        let counters: serde_json::Map<String, Value> =
            self.counters().named().map(|(name, n)| (name.to_owned(), n.into())).collect();
        json!({
            "name": self.name,
            "socket": self.spec.socket,
            "mac": self.spec.mac.to_string(),
            "mtu": self.spec.policy.mtu(),
            "isolated": self.spec.policy.isolated_to.is_some(),
            "shares-mac-with": self.spec.shares_mac_with,
            "pps": limits.iops,
            "bw": limits.bandwidth,
            "frontend_connected": self.frontend_connected(),
            "counters": counters,
        })
    }

    /// Stop its thread and wait for it: its socket is removed, its frontend (if any) cut off.
    fn stop(&mut self) {
        let _ = self.stop.write_all(&1u64.to_ne_bytes());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The NICs of one switch.
pub struct Nics {
    list: Vec<Nic>,
    control: Arc<SwitchControl>,
    access: Access,
    seccomp: SeccompMode,
    /// The uplink's interface and counters, if there is one.
    pub uplink: Option<(String, Arc<SharedUplinkCounters>)>,
    /// NICs added so far, for default names.
    added: usize,
    /// Give every NIC a hand-over port (`--handover-socket`).
    handover: bool,
}

impl Nics {
    /// No NIC yet, on the switch `control` serves.
    pub fn new(control: Arc<SwitchControl>, access: Access, seccomp: SeccompMode) -> Nics {
        Nics { list: Vec::new(), control, access, seccomp, uplink: None, added: 0, handover: false }
    }

    /// Give every NIC a hand-over port (`--handover-socket`).
    pub fn with_handover(mut self) -> Nics {
        self.handover = true;
        self
    }

    /// The NICs, in the order they were added.
    pub fn iter(&self) -> impl Iterator<Item = &Nic> {
        self.list.iter()
    }

    /// The NIC called `name`.
    pub fn get(&self, name: &str) -> Option<&Nic> {
        self.list.iter().find(|nic| nic.name == name)
    }

    /// Refuse `spec` (to be called `name`) if an earlier one of `nics` has its name, address
    /// (but the one it shares its address with) or socket, or if the one it names to share
    /// with is not among them with its address.
    pub fn check<'a>(
        nics: impl IntoIterator<Item = (&'a str, &'a NicSpec)>,
        name: &str,
        spec: &NicSpec,
    ) -> Result<(), NicError> {
        let nics: Vec<(&str, &NicSpec)> = nics.into_iter().collect();
        let twin = spec.shares_mac_with.as_deref();
        if let Some(twin) = twin {
            let (name, twin) = (name.to_owned(), twin.to_owned());
            match nics.iter().find(|(other, _)| **other == twin) {
                None => return Err(NicError::NoTwin { name, twin }),
                Some((_, earlier)) if earlier.mac != spec.mac => {
                    return Err(NicError::TwinMac { name, twin, twin_mac: earlier.mac, mac: spec.mac })
                }
                Some(_) => {}
            }
        }
        for (other, earlier) in nics {
            let (name, other) = (name.to_owned(), other.to_owned());
            if other == name {
                return Err(NicError::NameTaken(name));
            }
            if earlier.mac == spec.mac && twin != Some(other.as_str()) {
                return Err(NicError::MacTaken { name, mac: spec.mac, other });
            }
            if earlier.socket == spec.socket {
                return Err(NicError::SocketTaken { name, socket: spec.socket.clone(), other });
            }
        }
        Ok(())
    }

    /// Serve `spec` on its socket, from a thread of its own.
    pub fn add(&mut self, spec: NicSpec) -> Result<&Nic, NicError> {
        self.add_on(spec, Listen::Bind)
    }

    /// Serve `spec` on a socket `listen` says (its own, or one a predecessor handed over), from a
    /// thread of its own.
    pub fn add_on(&mut self, spec: NicSpec, listen: Listen) -> Result<&Nic, NicError> {
        let name = name_of(&spec, self.added);
        Self::check(self.list.iter().map(|nic| (nic.name.as_str(), &nic.spec)), &name, &spec)?;
        let (server, adopted) = vhost_user::Server::open(&spec.socket, self.access.clone(), listen)
            .map_err(|source| NicError::Socket { name: name.clone(), socket: spec.socket.clone(), source })?;
        let thread_error = |source| NicError::Thread { name: name.clone(), source };
        let (stop, stopped) = eventfd_pair().map_err(thread_error)?;
        let (handover, port) = match self.handover {
            true => port().map(|(handle, port)| (Some(handle), Some(port))).map_err(thread_error)?,
            false => (None, None),
        };
        let mut device = VhostUserNet::new(spec.mac, spec.policy, self.control.clone());
        let counters = device.counters();
        let connected = server.frontend_connected();
        let seccomp = self.seccomp;
        let thread_name = format!("nic-{}", self.added);
        let (label, socket) = (name.clone(), spec.socket.clone());
        let thread = std::thread::Builder::new()
            .name(thread_name)
            .spawn(move || {
                // This thread reads the NIC's frontends' messages (and a predecessor's) from here on.
                if let Err(e) = sandbox::install(ThreadKind::VhostUserConnection, seccomp) {
                    log::error!("NIC {label}: {e}; not served");
                    if let Some(adopted) = adopted {
                        let _ = adopted.replayed.send(Err(e.to_string()));
                    }
                    return;
                }
                if let Err(e) = server.serve_with(&mut device, Some(stopped.as_fd()), port.as_ref(), adopted)
                {
                    log::error!("NIC {label} ({}): {e}; no longer served", socket.display());
                }
            })
            .map_err(thread_error)?;
        log::info!("NIC {name} ({}) on {}", spec.mac, spec.socket.display());
        self.added += 1;
        self.list.push(Nic { name, spec, counters, connected, stop, thread: Some(thread), handover });
        Ok(self.list.last().expect("just added"))
    }

    /// Stop serving the NIC called `name`, which no frontend may be connected to.
    pub fn remove(&mut self, name: &str) -> Result<(), NicError> {
        let index = self.list.iter().position(|nic| nic.name == name);
        let index = index.ok_or_else(|| NicError::NoSuchNic(name.to_owned()))?;
        if self.list[index].frontend_connected() {
            return Err(NicError::Connected(name.to_owned()));
        }
        let mut nic = self.list.remove(index);
        nic.stop();
        log::info!(
            "NIC {name} removed; so far {} frames sent, {} received",
            nic.counters().tx_frames,
            nic.counters().rx_frames
        );
        Ok(())
    }

    /// Stop serving every NIC.
    pub fn stop_all(&mut self) {
        for nic in &mut self.list {
            nic.stop();
        }
    }
}

/// The name `spec` goes by as the `index`th NIC added (from 0): its own, or `nicN`.
pub fn name_of(spec: &NicSpec, index: usize) -> String {
    spec.name.clone().unwrap_or_else(|| format!("nic{index}"))
}
