//! What a VM was built from, in a snapshot: enough to build the same machine again (memory,
//! vCPUs, disks by path or, for a null disk, by size; NICs by MAC address; I/O mode). The
//! kernel is not needed: it is in guest memory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use virtio::net::{mac_text, parse_mac};

use super::SnapshotError;
use crate::devices::virtio::{DiskBackend, DiskOptions, IoMode, NetConfig, MAX_VIRTIO_DEVICES};
use crate::vm::{DisableExits, VmConfig};

/// A disk in a snapshot, reopened from its path on restore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedDisk {
    /// "file" (a raw file or block device through io_uring), "ram-file" (a /dev/shm file),
    /// "rbd" (an RBD image, its path `POOL/IMAGE`) or "null" (a null disk, which holds no data:
    /// made again from its size).
    pub kind: String,
    /// The file (empty for a null disk), for the record: a restore or a migration's destination
    /// opens the disk its operator names (`--disk`), never this path.
    pub path: PathBuf,
    /// The disk's size in bytes, which the disk named on restore must have (0 in snapshots from
    /// before sizes were recorded: not checked).
    #[serde(default)]
    pub size: u64,
    /// The guest may not write it.
    pub read_only: bool,
    /// O_DIRECT (files only).
    pub direct: bool,
    /// Its serial number, if not the default.
    pub serial: Option<String>,
    /// Virtqueues it offers (`queues=N`), each with its own worker.
    pub queues: u16,
}

/// A NIC on a tap in a snapshot. Frames in flight when the VM paused are lost, as on a wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedNet {
    /// The MAC address the guest knows the NIC by, which the NIC named on restore must have.
    pub mac: String,
    /// The tap it was on, for the record: a restore or a migration's destination opens the tap
    /// its operator names (`--net`), never this one.
    pub tap: String,
}

/// A NIC on a vhost-user daemon in a snapshot. The daemon holds nothing of it the guest needs:
/// it stopped the rings before guest memory was saved, and a frame it had not delivered is as
/// a frame lost on a wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedVhostUserNet {
    /// The MAC address the guest knows the NIC by, which the NIC named on restore must have.
    pub mac: String,
    /// The daemon's socket, for the record: a restore connects to the socket its operator names
    /// (`--net vhost-user=SOCKET`), never this one.
    pub socket: PathBuf,
}

/// A VM's configuration in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedConfig {
    /// Guest RAM in bytes.
    pub mem_bytes: u64,
    /// How many vCPUs.
    pub vcpus: u8,
    /// Guest RAM on reserved 2 MiB huge pages (`--hugepages`).
    pub hugepages: bool,
    /// The command line the VM was started with (before exitless's additions; for the record:
    /// the guest's own copy is in its memory).
    pub cmdline: String,
    /// `--io-mode`.
    pub io_mode: String,
    /// `adaptive`'s idle budget, in microseconds.
    pub idle_budget_us: u64,
    /// HLT exits were left to the guest.
    pub disable_hlt_exits: bool,
    /// PAUSE exits were left to the guest.
    pub disable_pause_exits: bool,
    /// The disks, in the order the guest sees them.
    pub disks: Vec<SavedDisk>,
    /// The NICs on taps, in the order the guest sees them (after the disks).
    #[serde(default)]
    pub nets: Vec<SavedNet>,
    /// The NICs on vhost-user daemons, in the order the guest sees them (after the taps').
    #[serde(default)]
    pub vhost_user_nets: Vec<SavedVhostUserNet>,
    /// Whether the VM has the test device (`--probe` or `--testdev`).
    #[serde(default)]
    pub testdev: bool,
}

impl SavedConfig {
    /// The configuration of a VM that can be snapshotted: file, RAM-file, RBD and null disks,
    /// NICs on taps and on vhost-user daemons (no new RAM disk or vhost-user disk); `sizes`:
    /// each disk's size in bytes, by index.
    pub fn of(config: &VmConfig, sizes: &[u64]) -> Result<SavedConfig, SnapshotError> {
        if !config.vhost_user_disks.is_empty() {
            return Err(SnapshotError::Unsupported("vhost-user disks are not supported yet".into()));
        }
        let disks = config
            .disks
            .iter()
            .enumerate()
            .map(|(i, disk)| {
                let DiskOptions { serial, queues } = config.disk_options.get(i).cloned().unwrap_or_default();
                let size = sizes.get(i).copied().unwrap_or(0);
                match disk {
                    DiskBackend::File { path, read_only, direct } => Ok(SavedDisk {
                        kind: "file".into(),
                        path: path.clone(),
                        size,
                        read_only: *read_only,
                        direct: *direct,
                        serial,
                        queues,
                    }),
                    DiskBackend::RamFile { path, read_only } => Ok(SavedDisk {
                        kind: "ram-file".into(),
                        path: path.clone(),
                        size,
                        read_only: *read_only,
                        direct: false,
                        serial,
                        queues,
                    }),
                    DiskBackend::Null { size, read_only } => Ok(SavedDisk {
                        kind: "null".into(),
                        path: PathBuf::new(),
                        size: *size,
                        read_only: *read_only,
                        direct: false,
                        serial,
                        queues,
                    }),
                    // Shared storage: the destination names the same image.
                    DiskBackend::Rbd(spec) => Ok(SavedDisk {
                        kind: "rbd".into(),
                        path: PathBuf::from(format!("{}/{}", spec.pool, spec.image)),
                        size,
                        read_only: spec.read_only,
                        direct: false,
                        serial,
                        queues,
                    }),
                    DiskBackend::Ram { .. } => Err(SnapshotError::Unsupported(
                        "a new RAM disk (ram=SIZE) is gone with the process; use ram,path=FILE".into(),
                    )),
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(SavedConfig {
            mem_bytes: config.mem_bytes,
            vcpus: config.vcpus,
            hugepages: config.hugepages,
            cmdline: config.cmdline.clone(),
            io_mode: config.io_mode.name().to_string(),
            idle_budget_us: config.idle_budget.as_micros() as u64,
            disable_hlt_exits: config.disable_exits.hlt,
            disable_pause_exits: config.disable_exits.pause,
            disks,
            nets: config.nets.iter().map(|n| SavedNet { mac: mac_text(n.mac), tap: n.tap.clone() }).collect(),
            vhost_user_nets: config
                .vhost_user_nets
                .iter()
                .map(|n| SavedVhostUserNet { mac: mac_text(n.mac), socket: n.socket.clone() })
                .collect(),
            testdev: config.testdev,
        })
    }

    /// Counts and names that must make sense before anything is built from them.
    pub fn check(&self) -> Result<(), SnapshotError> {
        let bad = |reason: String| Err(SnapshotError::Unsupported(format!("its configuration: {reason}")));
        if self.vcpus == 0 || self.vcpus > crate::vm::MAX_VCPUS {
            return bad(format!("{} vCPUs", self.vcpus));
        }
        let nics = self.nets.len() + self.vhost_user_nets.len();
        if self.disks.len() + nics > MAX_VIRTIO_DEVICES {
            return bad(format!("{} disks and {nics} NICs", self.disks.len()));
        }
        let mut macs = self.nets.iter().map(|n| &n.mac).chain(self.vhost_user_nets.iter().map(|n| &n.mac));
        if let Some(mac) = macs.find(|mac| parse_mac(mac).is_none()) {
            return bad(format!("a NIC whose MAC address is {mac:?}"));
        }
        if IoMode::from_name(&self.io_mode).is_none() {
            return bad(format!("I/O mode {:?}", self.io_mode));
        }
        if self.cmdline.len() > crate::boot::CMDLINE_MAX {
            return bad(format!("a command line of {} bytes", self.cmdline.len()));
        }
        if let Some(d) =
            self.disks.iter().find(|d| !matches!(d.kind.as_str(), "file" | "ram-file" | "null" | "rbd"))
        {
            return bad(format!("a disk of kind {:?}", d.kind));
        }
        if let Some(d) =
            self.disks.iter().find(|d| d.kind == "null" && (d.size == 0 || !d.size.is_multiple_of(512)))
        {
            return bad(format!("a null disk of {} bytes", d.size));
        }
        if let Some(d) =
            self.disks.iter().find(|d| !(1..=virtio::block::MAX_QUEUES).contains(&usize::from(d.queues)))
        {
            return bad(format!("a disk of {} queues", d.queues));
        }
        Ok(())
    }

    /// A base for [`SavedConfig::to_vm_config`] that names each saved disk and NIC as it was saved
    /// (its recorded path, kind, size and read-only setting; its tap and MAC address) and asks
    /// for the test device, so that
    /// every check of the configuration runs without an operator: for checking a snapshot or a
    /// stream on its own (`migration::wire::parse_stream`, the fuzz targets). Nothing it names
    /// is to be opened: a restore's disks are its operator's.
    pub fn base_naming_saved_devices(&self) -> VmConfig {
        let disks = self
            .disks
            .iter()
            .map(|d| match d.kind.as_str() {
                "ram-file" => DiskBackend::RamFile { path: d.path.clone(), read_only: d.read_only },
                "null" => DiskBackend::Null { size: d.size, read_only: d.read_only },
                _ => DiskBackend::File { path: d.path.clone(), read_only: d.read_only, direct: d.direct },
            })
            .collect();
        let disk_options =
            self.disks.iter().map(|d| DiskOptions { serial: d.serial.clone(), queues: d.queues }).collect();
        let nets = self
            .nets
            .iter()
            .map(|n| NetConfig {
                tap: n.tap.clone(),
                netns: None,
                mac: parse_mac(&n.mac).unwrap_or_default(),
            })
            .collect();
        let vhost_user_nets = self
            .vhost_user_nets
            .iter()
            .map(|n| crate::VhostUserNic {
                socket: n.socket.clone(),
                mac: parse_mac(&n.mac).unwrap_or_default(),
                reconnect: Duration::ZERO,
                daemon_uid: None,
            })
            .collect();
        VmConfig { disks, disk_options, nets, vhost_user_nets, testdev: self.testdev, ..VmConfig::default() }
    }

    /// The VM configuration to build again; `base` gives what is the new process's own (console,
    /// timeout, seccomp, CPU placement) and the disks its operator named (`--disk`), which take
    /// the saved disks' places in order: a saved path is never opened. Each named disk must be of
    /// the saved one's kind, read-only or not as it was, and of its size (checked once open,
    /// `Vm::check_disk_sizes`). Its NICs are the taps the operator named (`--net`), in order,
    /// each with the saved MAC address. The test device is there only if the operator asked for
    /// it.
    pub fn to_vm_config(&self, base: VmConfig) -> Result<VmConfig, SnapshotError> {
        self.check()?;
        if !base.vhost_user_disks.is_empty() {
            return Err(SnapshotError::Unsupported(
                "a restored or migrated VM takes local disks only: no vhost-user disk".into(),
            ));
        }
        if base.vhost_user_nets.len() != self.vhost_user_nets.len() {
            return Err(SnapshotError::VhostUserNicsNotNamed {
                saved: self.vhost_user_nets.len(),
                named: base.vhost_user_nets.len(),
                list: self.vhost_user_nets.iter().map(|n| n.mac.as_str()).collect::<Vec<_>>().join(", "),
            });
        }
        let saved = self.vhost_user_nets.iter().map(|n| n.mac.as_str());
        check_macs(saved, base.vhost_user_nets.iter().map(|n| n.mac), self.nets.len(), "--net vhost-user=")?;
        if base.nets.len() != self.nets.len() {
            return Err(SnapshotError::NicsNotNamed {
                saved: self.nets.len(),
                named: base.nets.len(),
                list: self.nets.iter().map(|n| n.mac.as_str()).collect::<Vec<_>>().join(", "),
            });
        }
        check_macs(self.nets.iter().map(|n| n.mac.as_str()), base.nets.iter().map(|n| n.mac), 0, "--net")?;
        if base.disks.len() != self.disks.len() {
            return Err(SnapshotError::DisksNotNamed {
                saved: self.disks.len(),
                named: base.disks.len(),
                list: self.disks.iter().map(SavedDisk::describe).collect::<Vec<_>>().join(", "),
            });
        }
        let disks = self
            .disks
            .iter()
            .zip(&base.disks)
            .enumerate()
            .map(|(index, (saved, named))| {
                saved.take(named).map_err(|reason| SnapshotError::Disk { index, reason })
            })
            .collect::<Result<Vec<_>, _>>()?;
        for (index, (saved, named)) in self.disks.iter().zip(&base.disk_options).enumerate() {
            if named.queues != saved.queues {
                return Err(SnapshotError::Disk {
                    index,
                    reason: format!(
                        "the VM's disk has {} queues, --disk says queues={}: give it queues={}",
                        saved.queues, named.queues, saved.queues
                    ),
                });
            }
        }
        if self.testdev && !base.testdev {
            return Err(SnapshotError::Unsupported(
                "the VM has the test device (it ran the probe, or with --testdev): give --testdev too".into(),
            ));
        }
        Ok(VmConfig {
            mem_bytes: self.mem_bytes,
            vcpus: self.vcpus,
            hugepages: self.hugepages,
            disable_exits: DisableExits { hlt: self.disable_hlt_exits, pause: self.disable_pause_exits },
            cmdline: self.cmdline.clone(),
            disks,
            disk_options: self
                .disks
                .iter()
                .map(|d| DiskOptions { serial: d.serial.clone(), queues: d.queues })
                .collect(),
            io_mode: IoMode::from_name(&self.io_mode).unwrap_or(IoMode::Eventfd),
            idle_budget: Duration::from_micros(self.idle_budget_us),
            ..base
        })
    }
}

/// Each NIC named for a saved one (in order, `named`) has the address the guest knows the saved
/// one by (`saved`); `first`: the first's index among the VM's NICs, `option`: what named them.
fn check_macs<'a>(
    saved: impl Iterator<Item = &'a str>,
    named: impl Iterator<Item = [u8; 6]>,
    first: usize,
    option: &str,
) -> Result<(), SnapshotError> {
    for (index, (saved, named)) in saved.zip(named).enumerate() {
        if parse_mac(saved) != Some(named) {
            return Err(SnapshotError::Nic {
                index: first + index,
                reason: format!(
                    "the guest knows it as {saved}, {option} gives it {}: name it with mac={saved}",
                    mac_text(named)
                ),
            });
        }
    }
    Ok(())
}

impl SavedDisk {
    /// `file /PATH (N bytes)`, for messages (the path quoted: it is the snapshot's, untrusted).
    fn describe(&self) -> String {
        let ro = if self.read_only { ", readonly" } else { "" };
        match self.kind.as_str() {
            "null" => format!("null {} bytes{ro}", self.size),
            kind => format!("{kind} {:?} ({} bytes{ro})", self.path, self.size),
        }
    }

    /// The disk the operator named for this saved one, if it can take its place.
    fn take(&self, named: &DiskBackend) -> Result<DiskBackend, String> {
        let read_only = match named {
            DiskBackend::File { read_only, .. }
            | DiskBackend::RamFile { read_only, .. }
            | DiskBackend::Null { read_only, .. } => *read_only,
            DiskBackend::Rbd(spec) => spec.read_only,
            DiskBackend::Ram { .. } => false,
        };
        let fits = match (self.kind.as_str(), named) {
            ("file", DiskBackend::File { .. }) | ("ram-file", DiskBackend::RamFile { .. }) => true,
            ("null", DiskBackend::Null { size, .. }) => *size == self.size,
            ("rbd", DiskBackend::Rbd(spec)) => {
                self.path == Path::new(&format!("{}/{}", spec.pool, spec.image))
            }
            _ => false,
        };
        let want = match self.kind.as_str() {
            "file" => "path=FILE",
            "ram-file" => "ram,path=FILE",
            "rbd" => "rbd=POOL/IMAGE (the same image)",
            _ => "null=SIZE (its size)",
        };
        if !fits {
            return Err(format!("the VM's disk is {}: name it with --disk {want}", self.describe()));
        }
        if read_only != self.read_only {
            return Err(format!(
                "the VM's disk is {}: --disk must {}say readonly",
                self.describe(),
                if self.read_only { "" } else { "not " }
            ));
        }
        Ok(named.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_null_disk_is_saved_by_its_size_and_made_again() {
        let null = DiskBackend::Null { size: 64 << 20, read_only: true };
        let config = VmConfig {
            disks: vec![null.clone()],
            disk_options: vec![DiskOptions { serial: Some("n0".into()), queues: 2 }],
            ..VmConfig::default()
        };
        let saved = SavedConfig::of(&config, &[64 << 20]).unwrap();
        assert_eq!((saved.disks[0].kind.as_str(), saved.disks[0].size), ("null", 64 << 20));
        let text = serde_json::to_string(&saved).unwrap();
        let again: SavedConfig = serde_json::from_str(&text).unwrap();
        let named = VmConfig { disks: vec![null.clone()], ..VmConfig::default() };
        let rebuilt = again.to_vm_config(named).unwrap();
        assert_eq!(rebuilt.disks, [null]);
        assert_eq!(rebuilt.disk_options, config.disk_options);

        let mut bad = again.clone();
        bad.disks[0].size = 1000;
        assert!(bad.check().unwrap_err().to_string().contains("a null disk of 1000 bytes"));
        // A snapshot from before null disks has no `size`: its file disks still load.
        let old = text.replace(r#""kind":"null""#, r#""kind":"file""#).replace(r#""size":67108864,"#, "");
        let old: SavedConfig = serde_json::from_str(&old).unwrap();
        assert_eq!((old.disks[0].kind.as_str(), old.disks[0].size), ("file", 0));
    }

    #[test]
    fn an_rbd_disk_is_saved_by_its_image_and_taken_only_by_the_same_image() {
        let rbd = |image: &str| {
            DiskBackend::Rbd(storage::RbdSpec {
                pool: "rbd".into(),
                image: image.into(),
                conf: Some("/etc/ceph/ceph.conf".into()),
                user: None,
                read_only: false,
            })
        };
        let config = VmConfig {
            disks: vec![rbd("vm1")],
            disk_options: vec![DiskOptions::default()],
            ..VmConfig::default()
        };
        let saved = SavedConfig::of(&config, &[64 << 20]).unwrap();
        assert_eq!((saved.disks[0].kind.as_str(), saved.disks[0].path.to_str()), ("rbd", Some("rbd/vm1")));
        let again: SavedConfig = serde_json::from_str(&serde_json::to_string(&saved).unwrap()).unwrap();
        again.check().unwrap();
        let same = VmConfig { disks: vec![rbd("vm1")], ..VmConfig::default() };
        assert_eq!(again.to_vm_config(same).unwrap().disks, [rbd("vm1")]);
        let other = VmConfig { disks: vec![rbd("vm2")], ..VmConfig::default() };
        let error = again.to_vm_config(other).unwrap_err().to_string();
        assert!(error.contains("rbd=POOL/IMAGE (the same image)"), "{error}");
    }

    #[test]
    fn a_nic_is_saved_by_its_mac_and_restored_on_the_tap_its_operator_names() {
        let nic = |tap: &str, mac: [u8; 6]| NetConfig { tap: tap.into(), netns: None, mac };
        let mac = [0x52, 0x54, 0x00, 0xab, 0xcd, 0xef];
        let config = VmConfig { nets: vec![nic("tap0", mac)], ..VmConfig::default() };
        let saved = SavedConfig::of(&config, &[]).unwrap();
        assert_eq!(saved.nets, [SavedNet { mac: "52:54:00:ab:cd:ef".into(), tap: "tap0".into() }]);
        let text = serde_json::to_string(&saved).unwrap();
        let again: SavedConfig = serde_json::from_str(&text).unwrap();
        again.check().unwrap();
        let elsewhere = VmConfig { nets: vec![nic("tap9", mac)], ..VmConfig::default() };
        assert_eq!(again.to_vm_config(elsewhere).unwrap().nets, [nic("tap9", mac)]);

        let error = again.to_vm_config(VmConfig::default()).unwrap_err().to_string();
        assert!(error.contains("the VM has 1 NIC(s) (52:54:00:ab:cd:ef) and 0 were named"), "{error}");
        let other = VmConfig { nets: vec![nic("tap9", [0x52, 0, 0, 0, 0, 1])], ..VmConfig::default() };
        let error = again.to_vm_config(other).unwrap_err().to_string();
        assert!(error.contains("name it with mac=52:54:00:ab:cd:ef"), "{error}");
        let mut bad = again.clone();
        bad.nets[0].mac = "52:54:00:ab:cd".into();
        assert!(bad.check().unwrap_err().to_string().contains("a NIC whose MAC address"));
        // A snapshot from before NICs were saved has no `nets`: it loads, with none.
        let old: SavedConfig =
            serde_json::from_str(&text.replace(r#","nets":[{"mac":"52:54:00:ab:cd:ef","tap":"tap0"}]"#, ""))
                .unwrap();
        assert!(old.nets.is_empty());
    }
}
