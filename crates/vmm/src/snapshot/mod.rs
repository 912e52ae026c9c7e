//! Snapshots of a paused VM: a directory with `state.json` (the VM's configuration, each
//! vCPU's and the irqchip's state as KVM exposes it, each device's transport state; versioned)
//! and `memory` (guest RAM, byte for byte). A snapshot is untrusted input when restored: its
//! size, every count and size in it, and its queues against guest memory are checked, and a bad
//! one is refused with an error.

pub mod config;
pub mod files;
pub mod raw;
pub mod vcpu;

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use kvm_bindings::{
    kvm_clock_data, kvm_irqchip, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE,
};
use kvm_ioctls::VmFd;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use virtio::mmio::state::{StateError, TransportState};
use vm_memory::{Bytes, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

pub use config::SavedConfig;
pub use files::SnapshotDir;
use raw::Raw;
pub use vcpu::VcpuState;

/// What `state.json` says it is.
pub const FORMAT: &str = "exitless-snapshot";
/// The format's version; a snapshot of another is refused.
pub const VERSION: u32 = 1;
/// The state file in a snapshot directory.
pub const STATE_FILE: &str = "state.json";
/// The guest memory file in a snapshot directory.
pub const MEMORY_FILE: &str = "memory";
/// The state file while it is written.
const PARTIAL_STATE_FILE: &str = ".state.json.partial";
/// The largest state file read (a 64-vCPU VM's is about 1.5 MiB).
const MAX_STATE_BYTES: u64 = 16 << 20;

/// Why a snapshot could not be taken or restored.
#[derive(Debug, Error)]
#[allow(missing_docs)] // Each variant's message says what it is.
pub enum SnapshotError {
    #[error("KVM refused to {what}: {source}")]
    Kvm { what: &'static str, source: kvm_ioctls::Error },
    #[error("too many {0} for one snapshot")]
    TooMany(&'static str),
    #[error("KVM did not take MSR {msr:#x} of vCPU {vcpu}")]
    MsrRefused { vcpu: u8, msr: u32 },
    #[error(
        "KVM would not read MSR {msr:#x} of vCPU {vcpu}, which it lists as saveable: no snapshot \
         without it (a restored guest would find it reset)"
    )]
    MsrUnreadable { vcpu: u8, msr: u32 },
    #[error("cannot {what} {path}: {source}")]
    File { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("{path} is not an exitless snapshot: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("{path} is a snapshot of format version {found}; this exitless reads version {VERSION}")]
    Version { path: PathBuf, found: u32 },
    #[error("{path} is {found} bytes; the snapshot's guest memory is {expected} bytes")]
    MemorySize { path: PathBuf, found: u64, expected: u64 },
    #[error("the snapshot has {found} {what}, its configuration says {expected}")]
    Count { what: &'static str, found: usize, expected: usize },
    #[error("cannot snapshot this VM: {0}")]
    Unsupported(String),
    #[error("the VM is not paused: a vCPU has not stopped")]
    NotPaused,
    #[error("{kind} {index}: {source}")]
    Device { kind: String, index: usize, source: StateError },
    #[error("cannot copy guest memory: {0}")]
    Memory(#[from] vm_memory::GuestMemoryError),
    #[error("the snapshot's URL {0:?} is not file:///DIR (the only kind exitless takes)")]
    Url(String),
    #[error(
        "the VM has {saved} disk(s) ({list}) and {named} were named with --disk: name each of its \
         disks, in order, with --disk (a restored or migrated VM opens only the disks its operator \
         names, never a path from the snapshot or the stream)"
    )]
    DisksNotNamed { saved: usize, named: usize, list: String },
    #[error("disk {index}: {reason}")]
    Disk { index: usize, reason: String },
    #[error(
        "the VM has {saved} NIC(s) ({list}) and {named} were named with --net: name each of its NICs, \
         in order, with --net tap=NAME (and its mac= if it had one); the taps are this host's"
    )]
    NicsNotNamed { saved: usize, named: usize, list: String },
    #[error(
        "the VM has {saved} NIC(s) on vhost-user daemons ({list}) and {named} were named with --net \
         vhost-user=SOCKET: name each, in order after its taps, with its daemon's socket (and its mac= if it \
         had one)"
    )]
    VhostUserNicsNotNamed { saved: usize, named: usize, list: String },
    #[error("NIC {index}: {reason}")]
    Nic { index: usize, reason: String },
    #[error(
        "{path} cannot hold a snapshot: {reason}; a snapshot directory is this user's, mode 0700, \
         and not a symbolic link (exitless makes it so when it creates it: name a new one)"
    )]
    UnsafeDir { path: PathBuf, reason: String },
}

/// The irqchip and KVM clock.
#[derive(Clone, Serialize, Deserialize)]
pub struct VmState {
    /// The KVM clock (KVM_GET_CLOCK).
    pub clock: Raw<kvm_clock_data>,
    /// The first 8259 PIC (KVM_GET_IRQCHIP).
    pub pic_master: Raw<kvm_irqchip>,
    /// The second, cascaded 8259 PIC.
    pub pic_slave: Raw<kvm_irqchip>,
    /// The IOAPIC.
    pub ioapic: Raw<kvm_irqchip>,
}

/// One virtio device in a snapshot.
#[derive(Clone, Serialize, Deserialize)]
pub struct DeviceState {
    /// "virtio-blk".
    pub kind: String,
    /// Its index among the devices of its kind.
    pub index: usize,
    /// Its virtio-mmio transport: registers, features, queues and configuration space.
    pub transport: TransportState,
}

/// `state.json`.
#[derive(Clone, Serialize, Deserialize)]
pub struct Snapshot {
    /// Always `FORMAT`.
    pub format: String,
    /// The format's version (`VERSION` when written); another is refused.
    pub version: u32,
    /// What the VM was built from.
    pub config: SavedConfig,
    /// Bytes in the memory file: guest RAM regions, in address order, back to back.
    pub memory_bytes: u64,
    /// The guest's TSC frequency (kHz); the restored VM's must be the same.
    pub tsc_khz: u32,
    /// The irqchip and KVM clock.
    pub vm: VmState,
    /// Each vCPU's state, in index order (one per `config.vcpus`).
    pub vcpus: Vec<VcpuState>,
    /// Each virtio device's state, in bus order (one per disk of `config.disks`, then one per NIC
    /// of `config.nets`).
    pub devices: Vec<DeviceState>,
}

fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> SnapshotError {
    move |source| SnapshotError::Kvm { what, source }
}

/// The directory of a `file:///DIR` URL (Cloud Hypervisor's `destination_url` and `source_url`).
pub fn dir_from_url(url: &str) -> Result<PathBuf, SnapshotError> {
    match url.strip_prefix("file://") {
        Some(path) if path.starts_with('/') && !path.contains('\0') => Ok(PathBuf::from(path)),
        _ => Err(SnapshotError::Url(url.to_string())),
    }
}

impl VmState {
    /// Read the VM-wide state (the vCPUs are stopped).
    pub fn capture(vm: &VmFd) -> Result<VmState, SnapshotError> {
        let chip = |chip_id| -> Result<Raw<kvm_irqchip>, SnapshotError> {
            let mut chip = kvm_irqchip { chip_id, ..Default::default() };
            vm.get_irqchip(&mut chip).map_err(kvm("read the irqchip"))?;
            Ok(Raw(chip))
        };
        Ok(VmState {
            clock: Raw(vm.get_clock().map_err(kvm("read the KVM clock"))?),
            pic_master: chip(KVM_IRQCHIP_PIC_MASTER)?,
            pic_slave: chip(KVM_IRQCHIP_PIC_SLAVE)?,
            ioapic: chip(KVM_IRQCHIP_IOAPIC)?,
        })
    }

    /// Write it into a new VM, before its vCPUs first run.
    pub fn apply(&self, vm: &VmFd) -> Result<(), SnapshotError> {
        for (chip, id) in [
            (&self.pic_master, KVM_IRQCHIP_PIC_MASTER),
            (&self.pic_slave, KVM_IRQCHIP_PIC_SLAVE),
            (&self.ioapic, KVM_IRQCHIP_IOAPIC),
        ] {
            if chip.0.chip_id != id {
                return Err(SnapshotError::Unsupported(format!(
                    "irqchip {id} saved as chip {}",
                    chip.0.chip_id
                )));
            }
            vm.set_irqchip(&chip.0).map_err(kvm("set the irqchip"))?;
        }
        // Only the clock's value: KVM refuses flags it did not set itself.
        let clock = kvm_clock_data { clock: self.clock.0.clock, ..Default::default() };
        vm.set_clock(&clock).map_err(kvm("set the KVM clock"))
    }
}

impl Snapshot {
    /// Write `state.json` and `memory` into `dir` (created with mode 0700 if missing; refused if
    /// it is a link, another user's or open to others: `SnapshotDir::create`). Each file is
    /// created new with mode 0600. The state file is written last, under a temporary name then
    /// renamed, so a directory with one holds a whole snapshot.
    pub fn write(&self, dir: &Path, mem: &GuestMemoryMmap) -> Result<u64, SnapshotError> {
        let dir = SnapshotDir::create(dir)?;
        // An older snapshot's state goes first: it must never sit beside this one's memory.
        dir.remove(STATE_FILE)?;
        dir.remove(MEMORY_FILE)?;
        dir.remove(PARTIAL_STATE_FILE)?;
        let mut memory = dir.create_new(MEMORY_FILE)?;
        for region in mem.iter() {
            mem.write_all_volatile_to(region.start_addr(), &mut memory, region.len() as usize)?;
        }
        let write_err = |name: &str| {
            let path = dir.path_of(name);
            move |source| SnapshotError::File { what: "write", path, source }
        };
        memory.sync_all().map_err(write_err(MEMORY_FILE))?;
        let text = serde_json::to_vec(self).map_err(|e| SnapshotError::Unsupported(e.to_string()))?;
        let mut file = dir.create_new(PARTIAL_STATE_FILE)?;
        file.write_all(&text).and_then(|()| file.sync_all()).map_err(write_err(PARTIAL_STATE_FILE))?;
        dir.rename(PARTIAL_STATE_FILE, STATE_FILE)?;
        dir.sync()?;
        Ok(text.len() as u64 + self.memory_bytes)
    }

    /// Read and check `state.json` (open in `files`): format, version and counts (the memory
    /// file's size, the vCPU and device counts against the configuration). Untrusted bytes:
    /// called on a thread confined by its filter (`Vm::restore`).
    pub fn read(files: &mut SnapshotFiles) -> Result<Snapshot, SnapshotError> {
        let path = files.state_path.clone();
        let mut text = Vec::new();
        (&mut files.state)
            .take(MAX_STATE_BYTES + 1)
            .read_to_end(&mut text)
            .map_err(|source| SnapshotError::File { what: "read", path: path.clone(), source })?;
        if text.len() as u64 > MAX_STATE_BYTES {
            return Err(SnapshotError::Corrupt {
                path,
                reason: format!("larger than {MAX_STATE_BYTES} bytes"),
            });
        }
        let snapshot = Snapshot::parse(&text, &path)?;
        if files.memory_len != snapshot.memory_bytes {
            return Err(SnapshotError::MemorySize {
                path: files.memory_path.clone(),
                found: files.memory_len,
                expected: snapshot.memory_bytes,
            });
        }
        Ok(snapshot)
    }

    /// Parse and check a state (`state.json`'s text, or a live migration's state record, from
    /// `path`): format, version, the configuration, and the vCPU and device counts against it.
    pub fn parse(text: &[u8], path: &Path) -> Result<Snapshot, SnapshotError> {
        let path = path.to_path_buf();
        let corrupt = |reason: String| SnapshotError::Corrupt { path: path.clone(), reason };
        // The header first, so that another version is named as such, not as a parse error.
        #[derive(Deserialize)]
        struct Header {
            format: String,
            version: u32,
        }
        let header: Header = serde_json::from_slice(text).map_err(|e| corrupt(e.to_string()))?;
        if header.format != FORMAT {
            return Err(corrupt(format!("its format is {:?}", header.format)));
        }
        if header.version != VERSION {
            return Err(SnapshotError::Version { path, found: header.version });
        }
        let snapshot: Snapshot = serde_json::from_slice(text).map_err(|e| corrupt(e.to_string()))?;
        snapshot.config.check()?;
        if snapshot.vcpus.len() != snapshot.config.vcpus as usize {
            return Err(SnapshotError::Count {
                what: "vCPU states",
                found: snapshot.vcpus.len(),
                expected: snapshot.config.vcpus as usize,
            });
        }
        if let Some((i, v)) = snapshot.vcpus.iter().enumerate().find(|(i, v)| v.index as usize != *i) {
            return Err(corrupt(format!("vCPU state {i} is for vCPU {}", v.index)));
        }
        let config = &snapshot.config;
        let devices = config.disks.len() + config.nets.len() + config.vhost_user_nets.len();
        if snapshot.devices.len() != devices {
            return Err(SnapshotError::Count {
                what: "device states",
                found: snapshot.devices.len(),
                expected: devices,
            });
        }
        Ok(snapshot)
    }
}

/// A snapshot's two files, opened (without following links) by the thread that builds the VM,
/// to be read by a confined one.
pub struct SnapshotFiles {
    state: File,
    state_path: PathBuf,
    memory: File,
    memory_path: PathBuf,
    memory_len: u64,
}

impl SnapshotFiles {
    /// Open `dir`'s `state.json` and `memory`.
    pub fn open(dir: &Path) -> Result<SnapshotFiles, SnapshotError> {
        let dir = SnapshotDir::open(dir)?;
        let state = dir.open_file(STATE_FILE)?;
        let memory = dir.open_file(MEMORY_FILE)?;
        let memory_path = dir.path_of(MEMORY_FILE);
        let memory_len = memory
            .metadata()
            .map_err(|source| SnapshotError::File { what: "look at", path: memory_path.clone(), source })?
            .len();
        Ok(SnapshotFiles { state, state_path: dir.path_of(STATE_FILE), memory, memory_path, memory_len })
    }

    /// Fill guest memory (just created from the snapshot's configuration, `memory_bytes` as it
    /// says) from the memory file.
    pub fn load_memory(&mut self, memory_bytes: u64, mem: &GuestMemoryMmap) -> Result<(), SnapshotError> {
        let total: u64 = mem.iter().map(|r| r.len()).sum();
        if total != memory_bytes {
            return Err(SnapshotError::MemorySize {
                path: self.memory_path.clone(),
                found: memory_bytes,
                expected: total,
            });
        }
        for region in mem.iter() {
            mem.read_exact_volatile_from(region.start_addr(), &mut self.memory, region.len() as usize)?;
        }
        Ok(())
    }
}
