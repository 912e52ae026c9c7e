//! virtio-mmio devices of a VM: their MMIO windows, interrupt lines and notification eventfds,
//! the backends behind them, and the I/O mode that decides who serves their queues.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use iocore::{IoCore, Policy};
use kvm_ioctls::{IoEventAddress, NoDatamatch, VmFd};
use storage::{BackendError, DiskSpec};
use thiserror::Error;
use virtio::block::{Block, FAIR_BATCH};
use virtio::interrupt::Trigger;
use virtio::mmio::{Hosted, MmioTransport, Runner, MMIO_SIZE, QUEUE_NOTIFY};
use virtio::net::{Net, RX_QUEUE, TX_QUEUE};
use virtio::{DeviceStats, VirtioDevice, Worker};
use virtqueue::WorkerHost;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use super::irq_line::IrqLine;
use super::vhost_user::{self, VhostUserDisk, VhostUserError, VhostUserInfo, VhostUserNic};

/// The first transport's MMIO window (in the 3-4 GiB hole; the next one follows it).
pub const VIRTIO_MMIO_BASE: u64 = 0xd000_0000;
/// The first transport's IOAPIC pin (COM1 is 4, the test device 5).
pub const VIRTIO_FIRST_IRQ: u32 = 10;
/// IOAPIC pins available to transports.
pub const MAX_VIRTIO_DEVICES: usize = 14;

/// The rungs of the I/O path ladder (docs/io-modes.md). The host side of a mode is who serves
/// the queues and whether the driver is asked to notify; the guest side (interrupt or polled
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
    /// Its name on the command line (`--io-mode`), in reports and in a snapshot.
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

    /// The mode `--io-mode NAME` names.
    pub fn from_name(name: &str) -> Option<IoMode> {
        [IoMode::Trap, IoMode::Eventfd, IoMode::PvEoi, IoMode::Sidecore, IoMode::Exitless, IoMode::Adaptive]
            .into_iter()
            .find(|mode| mode.name() == name)
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

/// Where a disk's bytes live: storage's [`DiskSpec`], under the name the VMM's callers know.
pub type DiskBackend = DiskSpec;

/// How the VMM serves one of its own disks, besides where its bytes live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskOptions {
    /// The serial number (GET_ID); `None`: `exitless-diskN`, N the disk's index among the disks.
    pub serial: Option<String>,
    /// Virtqueues offered (VIRTIO_BLK_F_MQ above 1), each with its own backend and worker.
    pub queues: u16,
}

impl Default for DiskOptions {
    fn default() -> DiskOptions {
        DiskOptions { serial: None, queues: 1 }
    }
}

/// A virtio-net device on a tap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetConfig {
    /// The tap's name; opened if it exists, created otherwise.
    pub tap: String,
    /// The network namespace the tap lives in (`/run/netns/NAME`); ours if `None`.
    pub netns: Option<String>,
    /// The device's MAC address, as the guest reads it from the configuration space.
    pub mac: [u8; 6],
}

impl NetConfig {
    /// The MAC address exitless gives network device `index` unless told otherwise (locally
    /// administered, unicast).
    pub fn default_mac(index: usize) -> [u8; 6] {
        [0x52, 0x54, 0x00, 0x45, 0x58, index as u8]
    }
}

#[derive(Debug, Error)]
pub enum DeviceError {
    #[error("too many virtio devices: at most {MAX_VIRTIO_DEVICES}")]
    TooMany,
    #[error("disk {index}: {source}")]
    Backend { index: usize, source: BackendError },
    #[error("network device {index}: {source}")]
    Tap { index: usize, source: tap::TapError },
    #[error("disk {index}: cannot serve {queues} queues (1 to {max}; do its queues see the same disk?)", max = virtio::block::MAX_QUEUES)]
    Queues { index: usize, queues: u16 },
    #[error("cannot start the IOCore: {0}")]
    IoCore(#[from] iocore::IoCoreError),
    #[error("cannot register virtio device {index}'s {what} with KVM: {source}")]
    Kvm { index: usize, what: &'static str, source: kvm_ioctls::Error },
    #[error("cannot create an eventfd: {0}")]
    EventFd(#[source] std::io::Error),
    #[error("cannot open virtio device {index}'s interrupt line (a copy of the VM's descriptor): {source}")]
    IrqLine { index: usize, source: std::io::Error },
    #[error("vhost-user {what} {index}: {source}")]
    VhostUser { what: &'static str, index: usize, source: VhostUserError },
    #[error(
        "--io-mode trap serves a device in the vCPU's MMIO exit, but a vhost-user disk or NIC is served \
         by its daemon: choose eventfd, pv-eoi or sidecore (the guest takes interrupts) or exitless or \
         adaptive (the guest polls)"
    )]
    TrapVhostUser,
}

/// One virtio-mmio transport on the MMIO bus.
pub struct VirtioSlot {
    pub base: u64,
    pub irq: u32,
    pub transport: Mutex<MmioTransport>,
    /// "virtio-blk", "vhost-user-blk" or "virtio-net".
    pub kind: &'static str,
    /// The device's index among those of its kind.
    pub index: usize,
    /// The queues whose requests `stats` counts apart (`per_queue`): the VMM's own disk's
    /// queues, 0 for other devices.
    pub request_queues: usize,
    /// What the device did, for `run --stats`.
    pub stats: Arc<DeviceStats>,
    /// For a vhost-user disk, what the VMM knows of it.
    pub vhost_user: Option<Arc<VhostUserInfo>>,
    /// A disk's size in bytes (0 for other devices).
    pub capacity: u64,
    /// Does the transport run the workers itself (`Runner::OnNotify`), so that the main thread
    /// must reap what a notification's exit left in flight?
    serves_on_notify: bool,
    // Kept open for the VM's lifetime: KVM holds them as ioeventfds.
    _notify_fds: Vec<Arc<EventFd>>,
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

/// How many workers one device may have with the IOCore (their ids are `slot * this + worker`).
const WORKERS_PER_DEVICE: u64 = 64;

/// Who serves the queues of one of the VMM's own devices (slot `index` at `base`), and the
/// notification eventfds of its `workers` workers. The VM has one IOCore: a multi-queue disk's
/// workers all run there, each waiting on its own queue's notification.
fn local_runner(
    vm: &VmFd,
    iocore: &Option<Arc<IoCore<Worker>>>,
    (mode, is_disk): (IoMode, bool),
    (base, index): (u64, usize),
    workers: usize,
) -> Result<(Runner, Vec<Arc<EventFd>>), DeviceError> {
    let iocore = match iocore {
        // Trap mode: the vCPU serves a disk's queues inside the notification's exit.
        _ if mode == IoMode::Trap && is_disk => return Ok((Runner::OnNotify, Vec::new())),
        None => return Ok((Runner::OnNotify, Vec::new())),
        Some(iocore) => iocore,
    };
    let mut hosted = Vec::with_capacity(workers);
    let mut fds = Vec::with_capacity(workers);
    for worker in 0..workers {
        let notify = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(DeviceError::EventFd)?);
        // Trap mode: no ioeventfd, so the notification exits to user space, where the
        // transport passes it on to the I/O thread through this eventfd.
        if mode != IoMode::Trap {
            let address = IoEventAddress::Mmio(base + QUEUE_NOTIFY);
            let registered = match u32::try_from(worker) {
                // Several workers: each wakes on its own queue's index only (worker i serves
                // queue i).
                Ok(queue) if workers > 1 => vm.register_ioevent(&notify, &address, queue),
                _ => vm.register_ioevent(&notify, &address, NoDatamatch),
            };
            registered.map_err(|source| DeviceError::Kvm {
                index,
                what: "queue notify (ioeventfd)",
                source,
            })?;
        }
        let id = index as u64 * WORKERS_PER_DEVICE + worker as u64;
        hosted.push(Hosted { id, notify: Some(notify.clone()) });
        fds.push(notify);
    }
    let host: Arc<dyn WorkerHost<Worker>> = iocore.clone();
    Ok((Runner::Host { host, workers: hosted }, fds))
}

/// The devices of a VM, by kind; on the bus in this order.
pub struct DeviceList<'a> {
    pub disks: &'a [DiskBackend],
    /// Serial numbers and queue counts of `disks` by index (see `VmConfig::disk_options`).
    pub disk_options: &'a [DiskOptions],
    pub vhost_user: &'a [VhostUserDisk],
    pub nets: &'a [NetConfig],
    pub vhost_user_nets: &'a [VhostUserNic],
}

/// How the VM's IOCore thread runs, if it has one.
pub struct IoCoreSetup {
    /// `adaptive`: how long the IOCore spins without a request before it sleeps.
    pub idle_budget: Duration,
    /// The host CPU to pin it to.
    pub cpu: Option<usize>,
    /// The seccomp filter it confines itself with before it serves a queue.
    pub filter: sandbox::Filter,
}

/// The VM's virtio devices and the IOCore that serves them (none in `trap` mode, nor for
/// vhost-user disks alone: their daemon serves them).
pub struct VirtioDevices {
    pub slots: Vec<VirtioSlot>,
    pub iocore: Option<Arc<IoCore<Worker>>>,
}

/// Which device goes into a slot.
enum Model<'a> {
    Disk(&'a DiskBackend),
    VhostUser(&'a VhostUserDisk),
    Net(&'a NetConfig),
    VhostUserNet(&'a VhostUserNic),
}

impl VirtioDevices {
    /// Disks first, then vhost-user disks, then network devices, then vhost-user NICs, in the
    /// order given.
    /// `watch_filter` confines the threads that watch vhost-user daemons.
    pub fn create(
        vm: &VmFd,
        mem: &GuestMemoryMmap,
        devices: DeviceList,
        mode: IoMode,
        iocore_setup: IoCoreSetup,
        watch_filter: sandbox::Filter,
    ) -> Result<VirtioDevices, DeviceError> {
        let DeviceList { disks, disk_options, vhost_user, nets, vhost_user_nets } = devices;
        let count = disks.len() + vhost_user.len() + nets.len() + vhost_user_nets.len();
        if count > MAX_VIRTIO_DEVICES {
            return Err(DeviceError::TooMany);
        }
        if mode == IoMode::Trap && !(vhost_user.is_empty() && vhost_user_nets.is_empty()) {
            return Err(DeviceError::TrapVhostUser);
        }
        // In trap mode a network device still needs a thread that waits for frames from its tap
        // (as QEMU's main loop does); its queue notifications exit to user space all the same.
        let IoCoreSetup { idle_budget, cpu, filter } = iocore_setup;
        let policy = match mode.policy(idle_budget) {
            None if !nets.is_empty() => Some(Policy::Notified),
            policy => policy,
        };
        let local = disks.len() + nets.len();
        let iocore = match policy {
            Some(policy) if local > 0 => Some(Arc::new(IoCore::spawn_confined(policy, cpu, filter)?)),
            _ => None,
        };
        let models = disks
            .iter()
            .map(Model::Disk)
            .chain(vhost_user.iter().map(Model::VhostUser))
            .chain(nets.iter().map(Model::Net))
            .chain(vhost_user_nets.iter().map(Model::VhostUserNet));
        let mut slots = Vec::with_capacity(count);
        let mut kind_counts = [0usize; 4];
        for (index, model) in models.enumerate() {
            let kvm = |what| move |source| DeviceError::Kvm { index, what, source };
            let base = VIRTIO_MMIO_BASE + index as u64 * MMIO_SIZE;
            let irq = VIRTIO_FIRST_IRQ + index as u32;
            let (kind, kind_slot) = match model {
                Model::Disk(_) => ("virtio-blk", 0),
                Model::VhostUser(_) => ("vhost-user-blk", 1),
                Model::Net(_) => ("virtio-net", 2),
                Model::VhostUserNet(_) => ("vhost-user-net", 3),
            };
            let kind_index = kind_counts[kind_slot];
            kind_counts[kind_slot] += 1;
            let stats = Arc::new(DeviceStats::new(format!("{kind} {kind_index}")));
            let mut vhost_user_info = None;
            let mut request_queues = 0;
            let mut capacity = 0;
            // The VMM's own devices raise their interrupt line themselves (see `irq_line`); a
            // vhost-user daemon can only write an irqfd.
            let own_line = || -> Result<Arc<dyn Trigger>, DeviceError> {
                let line = IrqLine::new(vm, irq).map_err(|source| DeviceError::IrqLine { index, source })?;
                Ok(Arc::new(line))
            };
            let (device, runner, notify_fds, interrupt): (
                Box<dyn VirtioDevice>,
                Runner,
                _,
                Arc<dyn Trigger>,
            ) = match model {
                Model::VhostUser(disk) => {
                    // The daemon serves the queue: the notification goes to it through the
                    // ioeventfd, and it interrupts through the irqfd.
                    let irq_fd = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(DeviceError::EventFd)?);
                    vm.register_irqfd(&irq_fd, irq).map_err(kvm("interrupt (irqfd)"))?;
                    let notify = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(DeviceError::EventFd)?);
                    let address = IoEventAddress::Mmio(base + QUEUE_NOTIFY);
                    vm.register_ioevent(&notify, &address, NoDatamatch)
                        .map_err(kvm("queue notify (ioeventfd)"))?;
                    let device =
                        vhost_user::blk::connect(disk, notify.clone(), irq_fd.clone(), watch_filter.clone())
                            .map_err(|source| DeviceError::VhostUser {
                                what: "disk",
                                index: kind_index,
                                source,
                            })?;
                    vhost_user_info = Some(device.info());
                    (Box::new(device), Runner::OnNotify, vec![notify], irq_fd)
                }
                Model::VhostUserNet(nic) => {
                    // As a vhost-user disk, with a kick per ring: the ioeventfd of each fires
                    // only for its own queue's index.
                    let irq_fd = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(DeviceError::EventFd)?);
                    vm.register_irqfd(&irq_fd, irq).map_err(kvm("interrupt (irqfd)"))?;
                    let address = IoEventAddress::Mmio(base + QUEUE_NOTIFY);
                    let mut kicks = Vec::new();
                    for queue in [RX_QUEUE, TX_QUEUE] {
                        let kick = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(DeviceError::EventFd)?);
                        vm.register_ioevent(&kick, &address, queue as u32)
                            .map_err(kvm("queue notify (ioeventfd)"))?;
                        kicks.push(kick);
                    }
                    let pair = [kicks[0].clone(), kicks[1].clone()];
                    let device =
                        vhost_user::net::connect(nic, pair, irq_fd.clone(), watch_filter.clone()).map_err(
                            |source| DeviceError::VhostUser { what: "NIC", index: kind_index, source },
                        )?;
                    vhost_user_info = Some(device.info());
                    (Box::new(device), Runner::OnNotify, kicks, irq_fd)
                }
                Model::Disk(disk) => {
                    let options = disk_options.get(kind_index).cloned().unwrap_or_default();
                    let backends = disk
                        .open_queues(usize::from(options.queues))
                        .map_err(|source| DeviceError::Backend { index: kind_index, source })?;
                    capacity = backends.first().map_or(0, |b| b.capacity());
                    let serial = options.serial.unwrap_or_else(|| format!("exitless-disk{kind_index}"));
                    let mut device = Block::with_queues(backends, &serial)
                        .ok_or(DeviceError::Queues { index: kind_index, queues: options.queues })?
                        .with_writeback_switch();
                    let workers = device.worker_count();
                    request_queues = device.num_queues();
                    let (runner, notify) = local_runner(vm, &iocore, (mode, true), (base, index), workers)?;
                    if matches!(runner, Runner::Host { .. }) {
                        // The IOCore serves every disk's queues in turn (the vCPU, in trap
                        // mode, serves one queue per notification and takes all it finds).
                        device = device.with_batch_limit(FAIR_BATCH);
                    }
                    (Box::new(device), runner, notify, own_line()?)
                }
                Model::Net(net) => {
                    let tap = tap::Tap::open(&net.tap, net.netns.as_deref())
                        .map_err(|source| DeviceError::Tap { index: kind_index, source })?;
                    let device = Box::new(Net::new(Box::new(tap), net.mac));
                    let workers = device.worker_count();
                    let (runner, notify) = local_runner(vm, &iocore, (mode, false), (base, index), workers)?;
                    (device, runner, notify, own_line()?)
                }
            };
            let serves_on_notify = matches!(runner, Runner::OnNotify);
            let transport = MmioTransport::new(device, mem.clone(), runner, Some(interrupt), stats.clone());
            slots.push(VirtioSlot {
                base,
                irq,
                transport: Mutex::new(transport),
                kind,
                index: kind_index,
                request_queues,
                stats,
                vhost_user: vhost_user_info,
                capacity,
                serves_on_notify,
                _notify_fds: notify_fds,
            });
        }
        Ok(VirtioDevices { slots, iocore })
    }

    /// Pause every transport: its workers taken back from the IOCore and drained (the vCPUs are
    /// stopped). On error some may be paused; `resume` undoes it all the same.
    pub fn pause(&self) -> Result<(), (usize, virtio::mmio::state::StateError)> {
        for (index, slot) in self.slots.iter().enumerate() {
            slot.transport.lock().unwrap_or_else(|p| p.into_inner()).pause().map_err(|e| (index, e))?;
        }
        Ok(())
    }

    /// Trap mode: complete the requests a notification's exit left in flight (see
    /// `MmioTransport::reap_late_completions`). The VMM's main thread calls it on each tick;
    /// it takes the lock of only the transports that run their workers themselves.
    pub fn reap_late_completions(&self) {
        for slot in self.slots.iter().filter(|slot| slot.serves_on_notify) {
            slot.transport.lock().unwrap_or_else(|p| p.into_inner()).reap_late_completions();
        }
    }

    /// Give every worker back to the IOCore after `pause` (or a restore).
    pub fn resume(&self) {
        for slot in &self.slots {
            slot.transport.lock().unwrap_or_else(|p| p.into_inner()).resume();
        }
    }

    /// Take every worker back from the IOCore and stop it (the VM is ending).
    pub fn shutdown(&self) -> Option<iocore::IoCoreStats> {
        for slot in &self.slots {
            slot.transport.lock().unwrap_or_else(|p| p.into_inner()).shutdown();
        }
        self.iocore.as_ref().and_then(|iocore| iocore.stop())
    }
}
