//! What a VM was built from, in a snapshot: enough to build the same machine again (memory,
//! vCPUs, disks by path, I/O mode). The kernel is not needed: it is in guest memory.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::SnapshotError;
use crate::devices::virtio::{DiskBackend, DiskOptions, IoMode, MAX_VIRTIO_DEVICES};
use crate::vm::{DisableExits, VmConfig};

/// A disk in a snapshot, reopened from its path on restore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedDisk {
    /// "file" (a raw file or block device through io_uring) or "ram-file" (a /dev/shm file).
    pub kind: String,
    pub path: PathBuf,
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
    /// The configuration of a VM that can be snapshotted: local file disks only.
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
                        read_only: *read_only,
                        direct: *direct,
                        serial,
                        queues,
                    }),
                    DiskBackend::RamFile { path, read_only } => Ok(SavedDisk {
                        kind: "ram-file".into(),
                        path: path.clone(),
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
        if let Some(d) = self.disks.iter().find(|d| !matches!(d.kind.as_str(), "file" | "ram-file")) {
            return bad(format!("a disk of kind {:?}", d.kind));
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
