//! What a VM was built from, in a snapshot: enough to build the same machine again (memory,
//! vCPUs, disks by path or, for a null disk, by size; I/O mode). The kernel is not needed: it is
//! in guest memory.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::SnapshotError;
use crate::devices::virtio::{DiskBackend, DiskOptions, IoMode, MAX_VIRTIO_DEVICES};
use crate::vm::{DisableExits, VmConfig};

/// A disk in a snapshot, reopened from its path on restore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedDisk {
    /// "file" (a raw file or block device through io_uring), "ram-file" (a /dev/shm file) or
    /// "null" (a null disk, which holds no data: made again from its size).
    pub kind: String,
    /// The file (empty for a null disk).
    pub path: PathBuf,
    /// A null disk's size in bytes (0 for the others, and in snapshots from before null disks).
    #[serde(default)]
    pub size: u64,
    pub read_only: bool,
    /// O_DIRECT (files only).
    pub direct: bool,
    /// Its serial number, if not the default.
    pub serial: Option<String>,
    /// Virtqueues it offers (`queues=N`), each with its own worker.
    pub queues: u16,
}

/// A VM's configuration in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedConfig {
    pub mem_bytes: u64,
    pub vcpus: u8,
    pub hugepages: bool,
    /// The command line the VM was started with (before exitless's additions; for the record:
    /// the guest's own copy is in its memory).
    pub cmdline: String,
    /// `--io-mode`.
    pub io_mode: String,
    pub idle_budget_us: u64,
    pub disable_hlt_exits: bool,
    pub disable_pause_exits: bool,
    pub disks: Vec<SavedDisk>,
}

impl SavedConfig {
    /// The configuration of a VM that can be snapshotted: local file and null disks only.
    pub fn of(config: &VmConfig) -> Result<SavedConfig, SnapshotError> {
        let unsupported =
            |what: &str| Err(SnapshotError::Unsupported(format!("{what} are not supported yet")));
        if !config.vhost_user_disks.is_empty() {
            return unsupported("vhost-user disks");
        }
        if !config.nets.is_empty() {
            return unsupported("network devices");
        }
        let disks = config
            .disks
            .iter()
            .enumerate()
            .map(|(i, disk)| {
                let DiskOptions { serial, queues } = config.disk_options.get(i).cloned().unwrap_or_default();
                match disk {
                    DiskBackend::File { path, read_only, direct } => Ok(SavedDisk {
                        kind: "file".into(),
                        path: path.clone(),
                        size: 0,
                        read_only: *read_only,
                        direct: *direct,
                        serial,
                        queues,
                    }),
                    DiskBackend::RamFile { path, read_only } => Ok(SavedDisk {
                        kind: "ram-file".into(),
                        path: path.clone(),
                        size: 0,
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
        })
    }

    /// Counts and names that must make sense before anything is built from them.
    pub fn check(&self) -> Result<(), SnapshotError> {
        let bad = |reason: String| Err(SnapshotError::Unsupported(format!("its configuration: {reason}")));
        if self.vcpus == 0 || self.vcpus > crate::vm::MAX_VCPUS {
            return bad(format!("{} vCPUs", self.vcpus));
        }
        if self.disks.len() > MAX_VIRTIO_DEVICES {
            return bad(format!("{} disks", self.disks.len()));
        }
        if IoMode::from_name(&self.io_mode).is_none() {
            return bad(format!("I/O mode {:?}", self.io_mode));
        }
        if self.cmdline.len() > crate::boot::CMDLINE_MAX {
            return bad(format!("a command line of {} bytes", self.cmdline.len()));
        }
        if let Some(d) = self.disks.iter().find(|d| !matches!(d.kind.as_str(), "file" | "ram-file" | "null"))
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

    /// The VM configuration to build again; `base` gives what is the new process's own (console,
    /// timeout, seccomp, CPU placement).
    pub fn to_vm_config(&self, base: VmConfig) -> Result<VmConfig, SnapshotError> {
        self.check()?;
        Ok(VmConfig {
            mem_bytes: self.mem_bytes,
            vcpus: self.vcpus,
            hugepages: self.hugepages,
            disable_exits: DisableExits { hlt: self.disable_hlt_exits, pause: self.disable_pause_exits },
            cmdline: self.cmdline.clone(),
            disks: self
                .disks
                .iter()
                .map(|d| match d.kind.as_str() {
                    "ram-file" => DiskBackend::RamFile { path: d.path.clone(), read_only: d.read_only },
                    "null" => DiskBackend::Null { size: d.size, read_only: d.read_only },
                    _ => DiskBackend::File { path: d.path.clone(), read_only: d.read_only, direct: d.direct },
                })
                .collect(),
            disk_options: self
                .disks
                .iter()
                .map(|d| DiskOptions { serial: d.serial.clone(), queues: d.queues })
                .collect(),
            vhost_user_disks: Vec::new(),
            nets: Vec::new(),
            io_mode: IoMode::from_name(&self.io_mode).unwrap_or(IoMode::Eventfd),
            idle_budget: Duration::from_micros(self.idle_budget_us),
            ..base
        })
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
        let saved = SavedConfig::of(&config).unwrap();
        assert_eq!((saved.disks[0].kind.as_str(), saved.disks[0].size), ("null", 64 << 20));
        let text = serde_json::to_string(&saved).unwrap();
        let again: SavedConfig = serde_json::from_str(&text).unwrap();
        let rebuilt = again.to_vm_config(VmConfig::default()).unwrap();
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
}
