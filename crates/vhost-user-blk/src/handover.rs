//! `--handover-socket PATH`: upgrading the daemon without a hang-up (the exchange is
//! `vhost_user::upgrade`'s). Here: what a disk is to a hand-over. Disks are compared by socket,
//! storage, queues and serial number; a new RAM disk, whose contents live only in this daemon,
//! and a disk the control API added, which a successor's command line does not name, keep the
//! daemon from handing over.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use vhost_user::handover::{Adopted, Handle};
use vhost_user::server::Listen;
use vhost_user::upgrade::{Devices, Handing, Taking};

use crate::disks::{identity, Disks};
use crate::spec::VhostDisk;

impl Devices for Disks {
    const NOUN: &'static str = "disk";

    fn identities(&self) -> Vec<Value> {
        self.in_order().iter().map(|disk| disk.identity()).collect()
    }

    fn drain_limit(&self) -> Duration {
        self.in_order().iter().map(|disk| reset_timeout(&disk.spec)).max().unwrap_or_default()
    }
}

impl Handing for Disks {
    fn handles(&self) -> Result<Vec<&Handle>, String> {
        let disks = self.in_order();
        eligible(disks.iter().map(|disk| &disk.spec))?;
        disks
            .iter()
            .map(|disk| {
                disk.handover()
                    .ok_or_else(|| "a disk added through the control API cannot be handed over".into())
            })
            .collect()
    }
}

/// The disks of a successor's command line, each with its socket, taken into `disks`.
pub struct TakenDisks<'a> {
    /// Where they are served once adopted.
    pub disks: &'a mut Disks,
    /// The command line's disks, in order.
    pub specs: &'a [(VhostDisk, PathBuf)],
}

impl Devices for TakenDisks<'_> {
    const NOUN: &'static str = "disk";

    fn identities(&self) -> Vec<Value> {
        self.specs
            .iter()
            .enumerate()
            .map(|(index, (spec, socket))| {
                let queues = spec.queues.unwrap_or(self.disks.default_queues());
                let serial = spec.serial.clone().unwrap_or_else(|| format!("vhost-user-disk{index}"));
                identity(spec, socket, queues, &serial)
            })
            .collect()
    }

    fn drain_limit(&self) -> Duration {
        self.specs.iter().map(|(spec, _)| reset_timeout(spec)).max().unwrap_or_default()
    }
}

impl Taking for TakenDisks<'_> {
    fn adopt(&mut self, index: usize, listener: OwnedFd, adopted: Adopted) -> Result<(), String> {
        let (spec, socket) = self.specs.get(index).ok_or("not on this daemon's command line")?;
        let listen = Listen::Adopt { listener, adopted };
        self.disks.add_on(spec.clone(), socket.clone(), listen).map(|_| ()).map_err(|e| e.to_string())
    }
}

fn reset_timeout(spec: &VhostDisk) -> Duration {
    spec.reset_timeout.unwrap_or(virtio::block::worker::RESET_WAIT)
}

/// Can these disks be handed over? A new RAM disk's contents live only in its daemon.
fn eligible<'a>(mut specs: impl Iterator<Item = &'a VhostDisk>) -> Result<(), String> {
    match specs.position(|s| matches!(s.disk, storage::DiskSpec::Ram { .. })) {
        Some(index) => Err(format!(
            "disk {index} is a new RAM disk (ram=SIZE), whose contents live only in this daemon; \
             serve a /dev/shm file (ram,path=FILE) to upgrade without losing them"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::eligible;
    use crate::spec;

    #[test]
    fn a_new_ram_disk_cannot_be_handed_over() {
        let file = spec::parse("socket=/a.sock,path=/tmp/a.img").unwrap();
        let ram = spec::parse("socket=/b.sock,ram=1M").unwrap();
        assert!(eligible([&file].into_iter()).is_ok());
        let refused = eligible([&file, &ram].into_iter()).unwrap_err();
        assert!(refused.starts_with("disk 1 is a new RAM disk (ram=SIZE)"), "{refused}");
    }
}
