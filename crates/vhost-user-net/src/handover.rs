//! `--handover-socket PATH`: upgrading the daemon without a hang-up (the exchange is
//! `vhost_user::upgrade`'s). Here: what a NIC is to a hand-over. NICs are compared by socket,
//! address, MTU and name, what a frontend, its guest and the control API know them by; their isolation and
//! limits are the successor's to set. A NIC keeps no frame between passes, so its rings stop at
//! once: the hand-over waits for no drain.

use std::os::fd::OwnedFd;
use std::time::Duration;

use serde_json::{json, Value};
use vhost_user::handover::{Adopted, Handle};
use vhost_user::server::Listen;
use vhost_user::upgrade::{Devices, Handing, Taking};

use crate::args::Nic as NicSpec;
use crate::nics::{name_of, Nics};

/// A NIC as a hand-over compares it: what the control API and its guest know it by.
fn identity(name: &str, spec: &NicSpec) -> Value {
    let (socket, mac, mtu) = (spec.socket.display().to_string(), spec.mac.to_string(), spec.policy.mtu());
    json!({"name": name, "socket": socket, "mac": mac, "mtu": mtu})
}

impl Devices for Nics {
    const NOUN: &'static str = "NIC";

    fn identities(&self) -> Vec<Value> {
        self.iter().map(|nic| identity(&nic.name, &nic.spec)).collect()
    }

    fn drain_limit(&self) -> Duration {
        Duration::ZERO
    }
}

impl Handing for Nics {
    fn handles(&self) -> Result<Vec<&Handle>, String> {
        self.iter()
            .map(|nic| nic.handover().ok_or_else(|| format!("NIC {} has no hand-over port", nic.name)))
            .collect()
    }
}

/// The NICs of a successor's command line, taken into `nics` as they are handed over.
pub struct TakenNics<'a> {
    /// Where they are served once adopted.
    pub nics: &'a mut Nics,
    /// The command line's NICs, in order.
    pub specs: &'a [NicSpec],
}

impl Devices for TakenNics<'_> {
    const NOUN: &'static str = "NIC";

    fn identities(&self) -> Vec<Value> {
        self.specs.iter().enumerate().map(|(index, spec)| identity(&name_of(spec, index), spec)).collect()
    }

    fn drain_limit(&self) -> Duration {
        Duration::ZERO
    }
}

impl Taking for TakenNics<'_> {
    fn adopt(&mut self, index: usize, listener: OwnedFd, adopted: Adopted) -> Result<(), String> {
        let spec = self.specs.get(index).ok_or("not on this daemon's command line")?;
        let listen = Listen::Adopt { listener, adopted };
        self.nics.add_on(spec.clone(), listen).map(|_| ()).map_err(|e| e.to_string())
    }
}
