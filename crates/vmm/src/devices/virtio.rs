//! virtio-mmio devices of a VM: their MMIO windows, interrupt lines and notification eventfds,
//! the backends behind them, and the I/O mode that decides who serves their queues.

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use iocore::{IoCore, Policy};
use kvm_ioctls::{IoEventAddress, NoDatamatch, VmFd};
use storage::{Backend, BackendError, FileDisk, RamDisk};
use thiserror::Error;
use virtio::block::Block;
use virtio::mmio::{MmioTransport, Runner, MMIO_SIZE, QUEUE_NOTIFY};
use virtio::WorkerHost;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

/// The first transport's MMIO window (in the 3-4 GiB hole; the next one follows it).
pub const VIRTIO_MMIO_BASE: u64 = 0xd000_0000;
/// The first transport's IOAPIC pin (COM1 is 4, the test device 5).
pub const VIRTIO_FIRST_IRQ: u32 = 10;
/// IOAPIC pins available to transports.
pub const MAX_VIRTIO_DEVICES: usize = 14;

/// The rungs of the I/O path ladder (see DESIGN.md). The host side of a mode is who serves the
/// queues and whether the driver is asked to notify; the guest side (interrupt or polled
/// completion, PV EOI) is the guest driver's choice, which `guest_completion` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoMode {
    /// Queue notifications exit to the VMM's user space, which serves the queue on the vCPU.
    Trap,
    /// Notifications through an ioeventfd wake an I/O thread; completion by irqfd.
    Eventfd,
    /// `Eventfd`, and the guest completes interrupts with KVM's paravirtual EOI.
    PvEoi,
    /// An IOCore polls the rings, so the driver never notifies; completion by interrupt (PV EOI).
    Sidecore,
    /// `Sidecore`, and the guest polls for completions: no exit per request.
    Exitless,
    /// The IOCore polls while requests come and sleeps on notifications when idle.
    Adaptive,
}

impl IoMode {
    pub const ALL: [IoMode; 6] =
        [IoMode::Trap, IoMode::Eventfd, IoMode::PvEoi, IoMode::Sidecore, IoMode::Exitless, IoMode::Adaptive];

    pub fn name(self) -> &'static str {
        match self {
            IoMode::Trap => "trap",
            IoMode::Eventfd => "eventfd",
            IoMode::PvEoi => "pv-eoi",
            IoMode::Sidecore => "sidecore",
            IoMode::Exitless => "exitless",
            IoMode::Adaptive => "adaptive",
        }
    }

    /// The IOCore's policy, or `None` when the vCPU serves the queues itself.
    pub fn policy(self, idle_budget: Duration) -> Option<Policy> {
        match self {
            IoMode::Trap => None,
            IoMode::Eventfd | IoMode::PvEoi => Some(Policy::Notified),
            IoMode::Sidecore | IoMode::Exitless => Some(Policy::Polling),
            IoMode::Adaptive => Some(Policy::Adaptive { idle: idle_budget }),
        }
    }

    /// Does the guest side of this mode use KVM's PV EOI?
    pub fn uses_pv_eoi(self) -> bool {
        matches!(self, IoMode::PvEoi | IoMode::Sidecore)
    }

    /// Does the guest take completion interrupts in this mode (rather than poll)?
    pub fn interrupt_completion(self) -> bool {
        matches!(self, IoMode::Trap | IoMode::Eventfd | IoMode::PvEoi | IoMode::Sidecore)
    }
}

impl fmt::Display for IoMode {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a disk's bytes live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskBackend {
    /// A raw file (or block device) through io_uring.
    File { path: PathBuf, read_only: bool, direct: bool },
    /// A new RAM disk of `size` bytes, gone when the VM ends.
    Ram { size: u64 },
    /// An existing file on a memory file system (/dev/shm), mapped and shared with the host.
    RamFile { path: PathBuf, read_only: bool },
}

#[derive(Debug, Error)]
pub enum DeviceError {
    #[error("too many virtio devices: at most {MAX_VIRTIO_DEVICES}")]
    TooMany,
    #[error("disk {index}: {source}")]
    Backend { index: usize, source: BackendError },
    #[error("cannot start the IOCore: {0}")]
    IoCore(#[from] iocore::IoCoreError),
    #[error("cannot register virtio device {index}'s {what} with KVM: {source}")]
    Kvm { index: usize, what: &'static str, source: kvm_ioctls::Error },
    #[error("cannot create an eventfd: {0}")]
    EventFd(#[source] std::io::Error),
}

/// One virtio-mmio transport on the MMIO bus.
pub struct VirtioSlot {
    pub base: u64,
    pub irq: u32,
    pub transport: Mutex<MmioTransport>,
    // Kept open for the VM's lifetime: KVM holds them as irqfd and ioeventfd.
    _irq_fd: Arc<EventFd>,
    _notify_fd: Option<Arc<EventFd>>,
}

impl VirtioSlot {
    pub fn owns(&self, addr: u64) -> bool {
        addr >= self.base && addr - self.base < MMIO_SIZE
    }

    /// `virtio_mmio.device=<size>@<base>:<irq>` for the kernel command line.
    pub fn cmdline_entry(&self) -> String {
        format!("virtio_mmio.device=4K@{:#x}:{}", self.base, self.irq)
    }
}

/// The VM's virtio devices and the IOCore that serves them (none in `trap` mode).
pub struct VirtioDevices {
    pub slots: Vec<VirtioSlot>,
    pub iocore: Option<Arc<IoCore>>,
}

impl VirtioDevices {
    pub fn create(
        vm: &VmFd,
        mem: &GuestMemoryMmap,
        disks: &[DiskBackend],
        mode: IoMode,
        idle_budget: Duration,
        iocore_cpu: Option<usize>,
    ) -> Result<VirtioDevices, DeviceError> {
        if disks.len() > MAX_VIRTIO_DEVICES {
            return Err(DeviceError::TooMany);
        }
        let iocore = match mode.policy(idle_budget) {
            Some(policy) if !disks.is_empty() => Some(Arc::new(IoCore::spawn(policy, iocore_cpu)?)),
            _ => None,
        };
        let mut slots = Vec::with_capacity(disks.len());
        for (index, disk) in disks.iter().enumerate() {
            let kvm = |what| move |source| DeviceError::Kvm { index, what, source };
            let backend = open_backend(disk).map_err(|source| DeviceError::Backend { index, source })?;
            let base = VIRTIO_MMIO_BASE + index as u64 * MMIO_SIZE;
            let irq = VIRTIO_FIRST_IRQ + index as u32;
            let irq_fd = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(DeviceError::EventFd)?);
            vm.register_irqfd(&irq_fd, irq).map_err(kvm("interrupt (irqfd)"))?;
            let (runner, notify_fd) = match &iocore {
                None => (Runner::OnNotify, None),
                Some(iocore) => {
                    let notify = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(DeviceError::EventFd)?);
                    let address = IoEventAddress::Mmio(base + QUEUE_NOTIFY);
                    vm.register_ioevent(&notify, &address, NoDatamatch)
                        .map_err(kvm("queue notify (ioeventfd)"))?;
                    let host: Arc<dyn WorkerHost> = iocore.clone();
                    (Runner::Host { host, id: index as u64, notify: Some(notify.clone()) }, Some(notify))
                }
            };
            let device = Block::new(backend, &format!("exitless-disk{index}"));
            let transport = MmioTransport::new(Box::new(device), mem.clone(), runner, Some(irq_fd.clone()));
            slots.push(VirtioSlot {
                base,
                irq,
                transport: Mutex::new(transport),
                _irq_fd: irq_fd,
                _notify_fd: notify_fd,
            });
        }
        Ok(VirtioDevices { slots, iocore })
    }

    /// Take every worker back from the IOCore and stop it (the VM is ending).
    pub fn shutdown(&self) -> Option<iocore::IoCoreStats> {
        for slot in &self.slots {
            slot.transport.lock().unwrap_or_else(|p| p.into_inner()).shutdown();
        }
        self.iocore.as_ref().and_then(|iocore| iocore.stop())
    }
}

fn open_backend(disk: &DiskBackend) -> Result<Box<dyn Backend>, BackendError> {
    Ok(match disk {
        DiskBackend::File { path, read_only, direct } => Box::new(FileDisk::open(path, *read_only, *direct)?),
        DiskBackend::RamFile { path, read_only } => Box::new(RamDisk::open(path, *read_only)?),
        DiskBackend::Ram { size } => {
            let path = temporary_ram_path();
            let disk = RamDisk::create(&path, *size);
            // The mapping keeps the bytes; the name is not needed once mapped.
            let _ = std::fs::remove_file(&path);
            Box::new(disk?)
        }
    })
}

fn temporary_ram_path() -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    PathBuf::from(format!("/dev/shm/exitless-ram-{}-{n}", std::process::id()))
}
