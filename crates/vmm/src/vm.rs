//! A KVM virtual machine: built from a [`VmConfig`] and a PVH kernel, run to its end.

use std::fmt;
use std::io::Cursor;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use kvm_bindings::{
    kvm_enable_cap, kvm_irq_routing_entry, KvmIrqRouting, KVM_CAP_X86_DISABLE_EXITS, KVM_IRQCHIP_IOAPIC,
    KVM_IRQ_ROUTING_IRQCHIP, KVM_X86_DISABLE_EXITS_HLT, KVM_X86_DISABLE_EXITS_PAUSE,
};
use kvm_ioctls::{Kvm, VmFd};
use sandbox::{Filter, SeccompMode, ThreadKind};
use storage::open::{open_without_blocking, OpenError, Wanted};
use thiserror::Error;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::signal::{register_signal_handler, Killable, SIGRTMIN};

use crate::boot::{self, BootError};
use crate::devices::console::{ConsoleMode, ConsoleWriter};
use crate::devices::serial::{Com1, COM1_IRQ};
use crate::devices::testdev::TestDevice;
use crate::devices::vhost_user::{VhostUserDisk, VhostUserNic};
use crate::devices::virtio::{
    DeviceError, DeviceList, DiskBackend, DiskOptions, IoCoreSetup, IoMode, NetConfig, VirtioDevices,
};
use crate::devices::Bus;
use crate::memory::{self, MemoryError};
use crate::snapshot::{self, DeviceState, SavedConfig, Snapshot, SnapshotError, SnapshotFiles, VmState};
use crate::stats::{StatsError, VcpuStats};
use crate::vcpu::{RunControl, Vcpu, VcpuReport};
use crate::{cpuid, regs};
use std::thread::JoinHandle;

/// Interrupt lines of the IOAPIC; all are routed to it alone (see `route_gsis_to_ioapic`).
const IOAPIC_PINS: u32 = 24;
const TSS_ADDR: usize = 0xfffb_d000;
/// The most vCPUs a VM may have.
pub const MAX_VCPUS: u8 = 64;
/// How often a stopping VM re-signals vCPU threads that are still in KVM_RUN.
const KICK_INTERVAL: Duration = Duration::from_millis(2);
/// How often the VMM's main thread looks for a pause, resume or snapshot request.
const CONTROL_TICK: Duration = Duration::from_millis(10);
/// How long a pause waits for the vCPUs to leave KVM_RUN.
const PAUSE_LIMIT: Duration = Duration::from_secs(5);

/// Exits that can be handed to the guest (KVM_CAP_X86_DISABLE_EXITS).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DisableExits {
    /// HLT stays in the guest: an idle vCPU halts its host CPU in guest mode instead of exiting
    /// to sleep in KVM, so its thread keeps the CPU.
    pub hlt: bool,
    /// PAUSE stays in the guest (no pause-loop exits for a vCPU spinning on a lock).
    pub pause: bool,
}

/// What to build: the guest's resources and devices, and how this process runs them.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// Guest RAM in bytes (`memory::MIN_MEM_BYTES` to `memory::MAX_MEM_BYTES`; a multiple of
    /// 2 MiB with `hugepages`).
    pub mem_bytes: u64,
    /// How many vCPUs (1 to `MAX_VCPUS`).
    pub vcpus: u8,
    /// Back guest RAM with reserved 2 MiB huge pages (hugetlb), which must be free at start.
    pub hugepages: bool,
    /// Host CPU for vCPU `i` at index `i`; vCPUs beyond the list float.
    pub pin_vcpus: Vec<usize>,
    /// Exits KVM leaves to the guest; refused if this host's KVM cannot.
    pub disable_exits: DisableExits,
    /// The kernel command line; exitless appends `exitless.testdev=<address>` when the VM has
    /// the test device.
    pub cmdline: String,
    /// Give the VM the test device (the probe's exit-cost registers and ping-pong responder);
    /// only when asked for (`--probe`, `--testdev`).
    pub testdev: bool,
    /// Where the guest's serial console output goes.
    pub console: ConsoleMode,
    /// Stop the guest after this long (`Ending::Timeout`); `None`: no limit.
    pub timeout: Option<Duration>,
    /// virtio-blk disks, in the order the guest sees them.
    pub disks: Vec<DiskBackend>,
    /// The serial numbers and queue counts of `disks`, by index (a disk beyond the list:
    /// the defaults).
    pub disk_options: Vec<DiskOptions>,
    /// Disks a vhost-user daemon serves, on the bus after `disks`. With any, guest memory is
    /// one shared memfd (the daemon maps it).
    pub vhost_user_disks: Vec<VhostUserDisk>,
    /// virtio-net devices on taps, after the disks.
    pub nets: Vec<NetConfig>,
    /// NICs a vhost-user daemon serves, after `nets`. With any, guest memory is one shared
    /// memfd, as with a vhost-user disk.
    pub vhost_user_nets: Vec<VhostUserNic>,
    /// How the virtio devices' queues are served.
    pub io_mode: IoMode,
    /// The host CPU for the IOCore thread.
    pub iocore_cpu: Option<usize>,
    /// `adaptive`: how long the IOCore spins without a request before it sleeps.
    pub idle_budget: Duration,
    /// What the seccomp filters of the VM's threads (vCPUs, IOCore, ping-pong responder) do with
    /// a system call outside their allowlists.
    pub seccomp: SeccompMode,
    /// Confine the thread that calls `Vm::run` too, once the vCPUs run (`ThreadKind::VmmMain`):
    /// for a process that does nothing else afterwards (`exitless run`), not for one that goes
    /// on with other work (the bench, tests).
    pub confine_caller: bool,
    /// Where a snapshot goes; with it, SIGUSR1 pauses the VM and writes a snapshot there (the
    /// VM stays paused), and SIGUSR2 pauses or resumes it.
    pub snapshot_dir: Option<PathBuf>,
}

impl Default for VmConfig {
    fn default() -> Self {
        VmConfig {
            mem_bytes: 256 << 20,
            vcpus: 1,
            hugepages: false,
            pin_vcpus: Vec::new(),
            disable_exits: DisableExits::default(),
            cmdline: String::new(),
            testdev: false,
            console: ConsoleMode::Stdout,
            timeout: None,
            disks: Vec::new(),
            disk_options: Vec::new(),
            vhost_user_disks: Vec::new(),
            nets: Vec::new(),
            vhost_user_nets: Vec::new(),
            io_mode: IoMode::Eventfd,
            iocore_cpu: None,
            idle_budget: iocore::DEFAULT_IDLE_BUDGET,
            seccomp: SeccompMode::Kill,
            confine_caller: false,
            snapshot_dir: None,
        }
    }
}

/// The kernel to boot: a PVH ELF.
pub enum Kernel<'a> {
    /// A file, opened without blocking (it must be a regular file).
    File(PathBuf),
    /// An image in memory (the built-in probe).
    Image(&'a [u8]),
}

/// Why a VM could not be built, restored or run.
#[derive(Debug, Error)]
#[allow(missing_docs)] // Each variant's message says what it is.
pub enum VmError {
    #[error("{0}")]
    Devices(#[from] DeviceError),
    #[error("--io-mode {0} needs KVM's paravirtual EOI, which this host's KVM does not offer (CPUID 0x40000001 bit 6); use another mode")]
    PvEoiUnavailable(IoMode),
    #[error("cannot open /dev/kvm: {0} (is KVM available, and may this user open it?)")]
    OpenKvm(#[source] kvm_ioctls::Error),
    #[error("KVM refused to {what}: {source}")]
    Kvm { what: &'static str, source: kvm_ioctls::Error },
    #[error("--vcpus must be between 1 and {MAX_VCPUS}, got {0}")]
    VcpuCount(u8),
    #[error("cannot pin a vCPU to CPU {cpu}: this host has CPUs 0..{available}")]
    NoSuchCpu { cpu: usize, available: usize },
    #[error("this host's KVM cannot disable {0} exits (KVM_CAP_X86_DISABLE_EXITS)")]
    DisableExitsUnsupported(&'static str),
    #[error("cannot open the kernel {path}: {source}")]
    OpenKernel { path: PathBuf, source: std::io::Error },
    #[error("the kernel {path} {kind_error}")]
    KernelNotAFile { path: PathBuf, kind_error: OpenError },
    #[error("kernel {path}: {source}")]
    KernelFile { path: PathBuf, source: BootError },
    #[error("the kernel command line is {total} bytes with the parameters exitless appends (devices, test device, probe); the limit is {}: shorten --cmdline by {} bytes", boot::CMDLINE_MAX, total.saturating_sub(boot::CMDLINE_MAX))]
    CmdlineTooLong { total: usize },
    #[error("{0}")]
    Boot(#[from] BootError),
    #[error("{0}")]
    Memory(#[from] MemoryError),
    #[error("{0}")]
    Stats(#[from] StatsError),
    #[error("cannot write the boot GDT: {0}")]
    Gdt(#[from] vm_memory::GuestMemoryError),
    #[error("cannot create an eventfd or thread: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Seccomp(#[from] sandbox::SandboxError),
    #[error("snapshot: {0}")]
    Snapshot(#[from] SnapshotError),
    #[error("live migration: {0}")]
    Migration(#[from] crate::migration::MigrationError),
    #[error("restore: the snapshot's guest TSC runs at {saved} kHz, this host's at {here} kHz, and KVM would not scale it: {source}")]
    TscKhz { saved: u32, here: u32, source: kvm_ioctls::Error },
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The guest wrote this value to the debug-exit port.
    GuestExit(u8),
    /// KVM_EXIT_SHUTDOWN: a triple fault, or a shutdown request.
    Shutdown {
        /// The vCPU it happened on.
        vcpu: u8,
    },
    /// The guest asked for a reset (KVM_SYSTEM_EVENT_RESET); the run ends instead.
    Reset {
        /// The vCPU that asked.
        vcpu: u8,
    },
    /// The guest reported a crash (KVM_SYSTEM_EVENT_CRASH).
    GuestCrash {
        /// The vCPU that reported it.
        vcpu: u8,
    },
    /// HLT reached user space (only without an in-kernel irqchip).
    Halted {
        /// The vCPU that halted.
        vcpu: u8,
    },
    /// KVM_EXIT_INTERNAL_ERROR: KVM could not go on with the guest.
    InternalError {
        /// The vCPU it happened on.
        vcpu: u8,
        /// KVM's suberror (1: instruction emulation failed, 2: simultaneous exceptions, 3: a
        /// delivery event not handled).
        suberror: u32,
        /// The guest's instruction pointer then.
        rip: u64,
    },
    /// KVM_EXIT_FAIL_ENTRY: the hardware refused to enter the guest.
    FailEntry {
        /// The vCPU it happened on.
        vcpu: u8,
        /// The hardware's entry failure reason.
        reason: u64,
    },
    /// An exit the VMM does not handle.
    UnexpectedExit {
        /// The vCPU it happened on.
        vcpu: u8,
        /// The exit, as KVM's bindings describe it.
        exit: String,
    },
    /// [`VmConfig::timeout`] passed (this long; zero when the VMM stopped the guest at once
    /// because its main thread could not confine itself, an error `Vm::run` then returns).
    Timeout(Duration),
    /// The VMM failed while the guest ran (e.g. KVM_RUN failed, a vCPU could not be pinned);
    /// the message says what.
    HostError(String),
    /// The VM went on in another process (a live migration to this URL).
    Migrated(String),
}

impl fmt::Display for Ending {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Ending::GuestExit(v) => write!(f, "the guest exited with status {v} through the debug-exit port"),
            Ending::Shutdown { vcpu } => {
                write!(f, "the guest shut down or triple-faulted (KVM_EXIT_SHUTDOWN on vCPU {vcpu})")
            }
            Ending::Reset { vcpu } => write!(f, "the guest asked for a reset (vCPU {vcpu})"),
            Ending::GuestCrash { vcpu } => write!(f, "the guest reported a crash (vCPU {vcpu})"),
            Ending::Halted { vcpu } => write!(f, "the guest halted (vCPU {vcpu})"),
            Ending::InternalError { vcpu, suberror, rip } => {
                let what = match suberror {
                    1 => "instruction emulation failed",
                    2 => "simultaneous exceptions",
                    3 => "delivery event not handled",
                    _ => "internal error",
                };
                write!(
                    f,
                    "KVM internal error on vCPU {vcpu}: {what} (suberror {suberror}) at guest RIP {rip:#x}"
                )?;
                if *suberror == 1 {
                    write!(
                        f,
                        "; this host's KVM emulates guest ring-0 code and cannot emulate every instruction"
                    )?;
                }
                Ok(())
            }
            Ending::FailEntry { vcpu, reason } => {
                write!(f, "KVM could not enter the guest on vCPU {vcpu} (hardware entry failure reason {reason:#x})")
            }
            Ending::UnexpectedExit { vcpu, exit } => write!(f, "unexpected exit on vCPU {vcpu}: {exit}"),
            Ending::Timeout(t) => {
                write!(f, "the guest was stopped at the timeout of {:.1} s", t.as_secs_f64())
            }
            Ending::HostError(e) => write!(f, "{e}"),
            Ending::Migrated(url) => write!(f, "the VM migrated to {url} and runs there"),
        }
    }
}

/// Everything a run produced.
#[derive(Debug)]
pub struct RunOutcome {
    /// Why the run ended: the first ending any vCPU or the VMM reported.
    pub ending: Ending,
    /// Each vCPU's exits and marks, by index.
    pub vcpus: Vec<VcpuReport>,
    /// The console output, when the console mode captures it.
    pub console: Vec<u8>,
    /// From the vCPUs' start to the end of the run, the threads joined and devices shut down.
    pub wall_time: Duration,
    /// What the IOCore did, if the VM had one.
    pub iocore: Option<iocore::IoCoreStats>,
    /// What each virtio device did, disks first.
    pub devices: Vec<DeviceReport>,
}

/// One virtio device's counts over the run.
#[derive(Debug, Clone)]
pub struct DeviceReport {
    /// "virtio-blk", "vhost-user-blk" or "virtio-net".
    pub kind: &'static str,
    /// Its index among the devices of its kind (`--disk`s, `--net`s, in order).
    pub index: usize,
    /// The request queues it counts separately (`stats.per_queue`): a disk's queues, 0 for
    /// other devices.
    pub request_queues: usize,
    /// What the device did. For a vhost-user disk only `needs_reset` and its reason are the
    /// VMM's to know: the daemon serves the requests and raises the interrupts.
    pub stats: virtio::DeviceStatsSnapshot,
    /// For a vhost-user disk, what the VMM knows of it.
    pub vhost_user: Option<VhostUserReport>,
}

/// What the VMM knows of a vhost-user disk at the end of a run.
#[derive(Debug, Clone)]
pub struct VhostUserReport {
    /// The daemon's socket.
    pub socket: PathBuf,
    /// The virtio features the driver accepted (last start).
    pub features: u64,
    /// Times the driver started the device and the daemon took the ring.
    pub activations: u64,
    /// The daemon closed the connection while the VM ran and none took over.
    pub daemon_gone: bool,
    /// Times a new daemon took the disk over.
    pub reconnections: u64,
}

/// A KVM virtual machine built from a `VmConfig`: guest memory, vCPUs, the MMIO bus with the
/// console, test device and virtio devices (and their IOCore), and the loaded kernel. `run`
/// starts the vCPUs and returns when the guest ends or the timeout passes.
pub struct Vm {
    // Fields drop in order: the VM fd goes before the RAM it maps.
    _kvm: Kvm,
    /// Shared with the live-migration thread, which reads the dirty log (joined before the VM
    /// drops).
    vm: Arc<VmFd>,
    pub(crate) mem: GuestMemoryMmap,
    /// What the live-migration thread confines itself to.
    migration_filter: Filter,
    /// Mutual TLS for a live migration over TCP (`with_migration_tls`).
    pub(crate) migration_tls: Option<Arc<crate::migration::MigrationTls>>,
    /// What a snapshot records of the configuration, or why this VM cannot be snapshotted.
    pub(crate) saved_config: Result<SavedConfig, String>,
    snapshot_dir: Option<PathBuf>,
    /// The guest's TSC frequency in kHz (recorded in a snapshot).
    tsc_khz: u32,
    vcpu_count: usize,
    /// Called on every control tick of `run` (`with_control`).
    control_hook: Option<ControlHook>,
    /// Set while a live migration's dirty logging is on (the test device is held meanwhile).
    pub(crate) migrating: AtomicBool,
    vcpus: Vec<Vcpu>,
    pub(crate) bus: Arc<Bus>,
    console: ConsoleWriter,
    pub(crate) control: Arc<RunControl>,
    timeout: Option<Duration>,
    /// What the calling thread confines itself to once the vCPUs run (`confine_caller`).
    main_filter: Filter,
    // Kept open for the VM's lifetime: KVM holds them as irqfds.
    _serial_irq: EventFd,
}

fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmError {
    move |source| VmError::Kvm { what, source }
}

/// The TSC frequency KVM gives guests, in kHz (guests need it to turn cycles into time).
pub fn tsc_khz() -> Result<u32, VmError> {
    let kvm = Kvm::new().map_err(VmError::OpenKvm)?;
    let vm = kvm.create_vm().map_err(kvm_err("create a VM"))?;
    let vcpu = vm.create_vcpu(0).map_err(kvm_err("create a vCPU"))?;
    vcpu.get_tsc_khz().map_err(kvm_err("report the TSC frequency"))
}

impl Vm {
    /// Build the VM `config` describes and load `kernel` into it.
    pub fn new(config: &VmConfig, kernel: Kernel) -> Result<Vm, VmError> {
        Vm::build(config, Some(kernel))
    }

    /// Build the VM a snapshot in `dir` describes, in the state it was saved in; `base` gives
    /// what is this process's own (console, timeout, seccomp, CPU placement, snapshot
    /// directory) and the disks its operator named, which take the saved disks' places
    /// (`SavedConfig::to_vm_config`). Every part of the snapshot is checked; a bad one is
    /// refused with an error.
    pub fn restore(dir: &std::path::Path, base: VmConfig) -> Result<Vm, VmError> {
        let files = SnapshotFiles::open(dir)?;
        let filter = Filter::new(ThreadKind::StateReader, base.seccomp)?;
        let (to_main, parsed) = std::sync::mpsc::channel();
        let (to_reader, built) = std::sync::mpsc::channel::<GuestMemoryMmap>();
        // Every byte of the snapshot is read, and the state parsed, by a thread confined by its
        // filter first; this one only builds from what it parsed and checked.
        let reader = std::thread::Builder::new().name("state-reader".into()).spawn(move || {
            let mut files = files;
            let snapshot =
                filter.install().map_err(VmError::from).and_then(|()| Ok(Snapshot::read(&mut files)?));
            let memory_bytes = snapshot.as_ref().map(|s| s.memory_bytes).ok();
            let _ = to_main.send(snapshot);
            match (memory_bytes, built.recv()) {
                (Some(bytes), Ok(mem)) => files.load_memory(bytes, &mem),
                _ => Ok(()),
            }
        })?;
        let outcome = (|| -> Result<(Vm, Snapshot), VmError> {
            let snapshot = parsed.recv().map_err(|_| crate::migration::MigrationError::ThreadGone)??;
            let config = snapshot.config.to_vm_config(base)?;
            let vm = Vm::build(&config, None)?;
            vm.check_disk_sizes(&snapshot.config)?;
            to_reader.send(vm.mem.clone()).map_err(|_| crate::migration::MigrationError::ThreadGone)?;
            Ok((vm, snapshot))
        })();
        drop(to_reader);
        let loaded =
            reader.join().map_err(|_| VmError::Io(std::io::Error::other("the snapshot reader panicked")))?;
        let (vm, snapshot) = outcome?;
        loaded?;
        vm.apply_snapshot(&snapshot)?;
        Ok(vm)
    }

    /// Check that each disk of the VM (built from `saved` with the operator's disks) has the
    /// size the saved one had: a guest must find its disk as it left it.
    pub(crate) fn check_disk_sizes(&self, saved: &SavedConfig) -> Result<(), VmError> {
        let disks = self.bus.virtio.slots.iter().filter(|s| s.kind == "virtio-blk");
        for (index, (slot, saved)) in disks.zip(&saved.disks).enumerate() {
            if saved.size != 0 && slot.capacity != saved.size {
                return Err(SnapshotError::Disk {
                    index,
                    reason: format!(
                        "the VM's disk was {} bytes, the one named with --disk is {} bytes: name the \
                         VM's disk (or a copy of it)",
                        saved.size, slot.capacity
                    ),
                }
                .into());
            }
        }
        Ok(())
    }

    /// Build the VM a live migration on `url` (`unix:/PATH`, `tcp:IP:PORT` with `tls`, or
    /// `tcp+plain:IP:PORT`) brings, as it was when the source paused it; `base` as for
    /// `restore`. Waits for one source; every part of what it sends is checked, and a bad
    /// stream is refused with an error (the source is told, and resumes).
    pub fn receive_migration(
        url: &str,
        base: VmConfig,
        tls: Option<Arc<crate::migration::MigrationTls>>,
    ) -> Result<(Vm, crate::migration::Received), VmError> {
        crate::migration::receive(url, base, tls)
    }

    /// Guest memory.
    pub(crate) fn memory(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// Bring a VM just built from `snapshot`'s configuration, its memory filled, to the
    /// snapshot's state: the irqchip and clock, each vCPU, each device (its workers paused
    /// until `run`).
    pub(crate) fn apply_snapshot(&self, snapshot: &Snapshot) -> Result<(), VmError> {
        let vm = self;
        snapshot.vm.apply(&vm.vm)?;
        for (vcpu, state) in vm.vcpus.iter().zip(&snapshot.vcpus) {
            let here = vcpu.fd.get_tsc_khz().map_err(kvm_err("report the TSC frequency"))?;
            if here != snapshot.tsc_khz {
                vcpu.fd.set_tsc_khz(snapshot.tsc_khz).map_err(|source| VmError::TscKhz {
                    saved: snapshot.tsc_khz,
                    here,
                    source,
                })?;
            }
            state.apply(&vcpu.fd)?;
        }
        for (slot, saved) in vm.bus.virtio.slots.iter().zip(&snapshot.devices) {
            let device =
                |source| SnapshotError::Device { kind: slot.kind.to_string(), index: slot.index, source };
            if saved.kind != slot.kind || saved.index != slot.index {
                return Err(SnapshotError::Unsupported(format!(
                    "device {} {} in the snapshot where this VM has {} {}",
                    saved.kind, saved.index, slot.kind, slot.index
                ))
                .into());
            }
            lock(&slot.transport).restore(&saved.transport).map_err(device)?;
        }
        Ok(())
    }

    pub(crate) fn build(config: &VmConfig, kernel: Option<Kernel>) -> Result<Vm, VmError> {
        if config.vcpus == 0 || config.vcpus > MAX_VCPUS {
            return Err(VmError::VcpuCount(config.vcpus));
        }
        let available = std::thread::available_parallelism().map_or(1, |n| n.get());
        if let Some(&cpu) = config.pin_vcpus.iter().find(|&&c| c >= available) {
            return Err(VmError::NoSuchCpu { cpu, available });
        }
        let kvm = Kvm::new().map_err(VmError::OpenKvm)?;
        let vm = kvm.create_vm().map_err(kvm_err("create a VM"))?;
        vm.set_tss_address(TSS_ADDR).map_err(kvm_err("set the TSS address"))?;
        vm.create_irq_chip().map_err(kvm_err("create the in-kernel irqchip"))?;
        route_gsis_to_ioapic(&vm)?;
        disable_exits(&vm, config.disable_exits)?;

        let mem = if config.vhost_user_disks.is_empty() && config.vhost_user_nets.is_empty() {
            memory::create(config.mem_bytes, config.hugepages)?
        } else {
            memory::create_shared(config.mem_bytes, config.hugepages)?
        };
        for (slot, (base, len, host)) in host_ranges(&mem).into_iter().enumerate() {
            let region = kvm_bindings::kvm_userspace_memory_region {
                slot: slot as u32,
                flags: 0,
                guest_phys_addr: base,
                memory_size: len,
                userspace_addr: host,
            };
            // SAFETY: the region maps memory owned by `mem`, which `Vm` keeps alive for as long
            // as the VM fd that refers to it.
            unsafe { vm.set_user_memory_region(region) }.map_err(kvm_err("map guest memory"))?;
        }

        let entry = match kernel {
            // Restoring: the kernel and boot information are in the snapshot's memory.
            None => None,
            Some(Kernel::File(path)) => {
                let mut file = open_without_blocking(&path, true, 0, Wanted::RegularFile).map_err(
                    |error| match error {
                        OpenError::Io(source) => VmError::OpenKernel { path: path.clone(), source },
                        kind_error => VmError::KernelNotAFile { path: path.clone(), kind_error },
                    },
                )?;
                Some(
                    boot::load_kernel(&mem, &mut file)
                        .map_err(|source| VmError::KernelFile { path, source })?,
                )
            }
            Some(Kernel::Image(bytes)) => Some(boot::load_kernel(&mem, &mut Cursor::new(bytes))?),
        };

        let control = Arc::new(RunControl::default());
        let testdev = match config.testdev {
            true => {
                let testdev = TestDevice::new(
                    probe_abi::testdev::DEFAULT_BASE,
                    mem.clone(),
                    control.stop.clone(),
                    Filter::new(ThreadKind::PingPong, config.seccomp)?,
                )?;
                testdev.register(&vm).map_err(kvm_err("register the test device doorbell and interrupt"))?;
                Some(testdev)
            }
            false => None,
        };
        let base_cpuid = cpuid::supported(&kvm).map_err(kvm_err("report supported CPUID"))?;
        let has_devices = !config.disks.is_empty()
            || !config.vhost_user_disks.is_empty()
            || !config.nets.is_empty()
            || !config.vhost_user_nets.is_empty();
        if config.io_mode.uses_pv_eoi() && has_devices && !cpuid::has_pv_eoi(&base_cpuid) {
            return Err(VmError::PvEoiUnavailable(config.io_mode));
        }
        let virtio = VirtioDevices::create(
            &vm,
            &mem,
            DeviceList {
                disks: &config.disks,
                disk_options: &config.disk_options,
                vhost_user: &config.vhost_user_disks,
                nets: &config.nets,
                vhost_user_nets: &config.vhost_user_nets,
            },
            config.io_mode,
            IoCoreSetup {
                idle_budget: config.idle_budget,
                cpu: config.iocore_cpu,
                filter: Filter::new(ThreadKind::IoCore, config.seccomp)?,
            },
            Filter::new(ThreadKind::VhostUserWatch, config.seccomp)?,
        )?;
        let mut cmdline = config.cmdline.clone();
        for slot in &virtio.slots {
            cmdline = format!("{cmdline} {}", slot.cmdline_entry());
        }
        if let Some(testdev) = &testdev {
            cmdline = format!("{cmdline} {}={:#x}", probe_abi::param::TESTDEV, testdev.base());
        }
        let cmdline = cmdline.trim();
        if cmdline.len() > boot::CMDLINE_MAX {
            return Err(VmError::CmdlineTooLong { total: cmdline.len() });
        }
        if entry.is_some() {
            boot::write_boot_info(&mem, cmdline)?;
            regs::write_gdt(&mem)?;
        }

        let console = ConsoleWriter::new(config.console);
        let serial_irq = EventFd::new(libc::EFD_NONBLOCK)?;
        vm.register_irqfd(&serial_irq, COM1_IRQ).map_err(kvm_err("register the serial irqfd"))?;
        let serial = Com1::new(serial_irq.try_clone()?, console.clone());
        let disk_sizes: Vec<u64> =
            virtio.slots.iter().filter(|s| s.kind == "virtio-blk").map(|s| s.capacity).collect();
        let bus = Arc::new(Bus { serial: Mutex::new(serial), testdev, virtio });

        let vcpu_filter = Filter::new(ThreadKind::Vcpu, config.seccomp)?;
        // Read when a vCPU parks: every MSR KVM lists as saveable goes in a snapshot.
        let msr_list: Arc<[u32]> =
            kvm.get_msr_index_list().map_err(kvm_err("list the MSRs to save"))?.as_slice().into();
        let mut vcpus = Vec::with_capacity(config.vcpus as usize);
        for index in 0..config.vcpus {
            let fd = vm.create_vcpu(index as u64).map_err(kvm_err("create a vCPU"))?;
            fd.set_cpuid2(&cpuid::for_vcpu(&base_cpuid, index, config.vcpus))
                .map_err(kvm_err("set CPUID"))?;
            if let (0, Some(entry)) = (index, entry) {
                let sregs = fd.get_sregs().map_err(kvm_err("read special registers"))?;
                fd.set_sregs(&regs::pvh_sregs(sregs)).map_err(kvm_err("set special registers"))?;
                fd.set_regs(&regs::pvh_regs(entry)).map_err(kvm_err("set registers"))?;
                fd.set_fpu(&regs::reset_fpu()).map_err(kvm_err("set the FPU state"))?;
            }
            let stats = VcpuStats::open(&fd)?;
            vcpus.push(Vcpu {
                index,
                fd,
                stats,
                pin_cpu: config.pin_vcpus.get(index as usize).copied(),
                iocore_cpu: config.iocore_cpu,
                filter: vcpu_filter.clone(),
                msr_list: msr_list.clone(),
            });
        }

        Ok(Vm {
            _kvm: kvm,
            vm: Arc::new(vm),
            mem,
            migration_filter: Filter::new(ThreadKind::Migration, config.seccomp)?,
            migration_tls: None,
            saved_config: SavedConfig::of(config, &disk_sizes).map_err(|e| e.to_string()),
            snapshot_dir: config.snapshot_dir.clone(),
            tsc_khz: vcpus.first().and_then(|v| v.fd.get_tsc_khz().ok()).unwrap_or(0),
            vcpu_count: vcpus.len(),
            control_hook: None,
            migrating: AtomicBool::new(false),
            vcpus,
            bus,
            console,
            control,
            timeout: config.timeout,
            main_filter: match config.confine_caller {
                true => Filter::new(ThreadKind::VmmMain, config.seccomp)?,
                false => Filter::off(ThreadKind::VmmMain),
            },
            _serial_irq: serial_irq,
        })
    }

    /// Run the VM until the guest exits, crashes, or the timeout passes. With
    /// `VmConfig::confine_caller`, once the vCPUs run the calling thread confines itself to what
    /// the rest takes (`ThreadKind::VmmMain`): stopping and joining the other threads, tearing
    /// the VM down, and the caller's report.
    pub fn run(mut self) -> Result<RunOutcome, VmError> {
        install_kick_handler();
        if self.snapshot_dir.is_some() {
            install_control_handlers();
        }
        // A restored VM's devices start paused; a new one's are not, and this does nothing.
        self.bus.virtio.resume();
        let started = Instant::now();
        let mut threads = Vec::with_capacity(self.vcpus.len());
        for mut vcpu in std::mem::take(&mut self.vcpus) {
            let start = vcpu.stats.snapshot()?;
            let bus = self.bus.clone();
            let control = self.control.clone();
            let name = format!("vcpu{}", vcpu.index);
            threads
                .push(std::thread::Builder::new().name(name).spawn(move || vcpu.run(&bus, &control, start))?);
        }
        let mut hook = self.control_hook.take();
        // A VM with a control API may be migrated: its sender thread starts now, before this
        // thread confines itself (a thread it started later would be bound by that filter).
        let migration = match (&hook, &self.saved_config) {
            (Some(_), Ok(_)) => Some(crate::migration::Sender::spawn(
                self.vm.clone(),
                self.mem.clone(),
                self.migration_filter.clone(),
            )?),
            _ => None,
        };
        let confined = self.main_filter.install();
        if confined.is_err() {
            // Stop the guest at once; the error is returned once the threads are down.
            self.control.end(Ending::Timeout(Duration::ZERO));
        }

        let ending = loop {
            let left = self.timeout.map(|t| t.saturating_sub(started.elapsed()));
            if let Some(ending) = self.control.wait(Some(left.map_or(CONTROL_TICK, |l| l.min(CONTROL_TICK))))
            {
                break ending;
            }
            if left.is_some_and(|l| l.is_zero()) {
                let timeout = self.timeout.unwrap_or_default();
                self.control.end(Ending::Timeout(timeout));
                break Ending::Timeout(timeout);
            }
            self.bus.virtio.reap_late_completions();
            let control = VmControl { vm: &self, threads: &threads, migration: migration.as_ref() };
            if self.snapshot_dir.is_some() {
                control.serve_signals();
            }
            if let Some(hook) = hook.as_mut() {
                hook(&control);
            }
        };
        drop(migration);
        // A paused VM's vCPUs are parked; they see the stop flag within a tick.
        self.control.pause.withdraw();
        // A vCPU may sit in KVM_RUN (guest code, or a halted/waiting vCPU): signal it until its
        // thread has seen the stop flag. Repeated because a signal that lands just before
        // KVM_RUN starts is not seen by it.
        while threads.iter().any(|t| !t.is_finished()) {
            for thread in threads.iter().filter(|t| !t.is_finished()) {
                let _ = thread.kill(SIGRTMIN());
            }
            std::thread::sleep(KICK_INTERVAL);
        }
        let vcpus = threads
            .into_iter()
            .map(|t| t.join().map_err(|_| VmError::Io(std::io::Error::other("a vCPU thread panicked"))))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(testdev) = &self.bus.testdev {
            testdev.join();
        }
        let iocore = self.bus.virtio.shutdown();
        let devices = self
            .bus
            .virtio
            .slots
            .iter()
            .map(|slot| DeviceReport {
                kind: slot.kind,
                index: slot.index,
                request_queues: slot.request_queues,
                stats: slot.stats.snapshot(),
                vhost_user: slot.vhost_user.as_ref().map(|info| VhostUserReport {
                    socket: info.socket.clone(),
                    features: info.features.load(Ordering::Relaxed),
                    activations: info.activations.load(Ordering::Relaxed),
                    daemon_gone: info.daemon_gone.load(Ordering::Relaxed),
                    reconnections: info.reconnections.load(Ordering::Relaxed),
                }),
            })
            .collect();
        let mut console = self.console;
        let _ = std::io::Write::flush(&mut console);
        confined?;
        Ok(RunOutcome {
            ending,
            vcpus,
            console: console.captured(),
            wall_time: started.elapsed(),
            iocore,
            devices,
        })
    }
}

/// What `Vm::with_control` calls on each control tick.
type ControlHook = Box<dyn FnMut(&VmControl) + Send>;

/// Why a pause, resume or snapshot was refused or failed.
#[derive(Debug, Error)]
#[allow(missing_docs)] // Each variant's message says what it is.
pub enum ControlError {
    #[error("the VM is already paused")]
    AlreadyPaused,
    #[error("the VM is not paused (a snapshot is of a paused VM: pause it first)")]
    NotPaused,
    #[error("{0}")]
    Snapshot(#[from] SnapshotError),
    #[error("live migration: {0}")]
    Migration(#[from] crate::migration::MigrationError),
}

/// Pause, resume and snapshot a running VM, from `Vm::run`'s main thread (its control hook, see
/// `Vm::with_control`, or the control signals).
pub struct VmControl<'a> {
    pub(crate) vm: &'a Vm,
    threads: &'a [JoinHandle<VcpuReport>],
    /// The live-migration sender, for a VM that can be migrated.
    pub(crate) migration: Option<&'a crate::migration::Sender>,
}

impl VmControl<'_> {
    /// Is the VM paused?
    pub fn paused(&self) -> bool {
        self.vm.control.pause.requested()
    }

    /// Stop the vCPUs (out of KVM_RUN, parked, their state read) and drain every device: no
    /// request is held by the IOCore or a backend once this returns. How long it took.
    pub fn pause(&self) -> Result<Duration, ControlError> {
        if self.paused() {
            return Err(ControlError::AlreadyPaused);
        }
        let started = Instant::now();
        let vm = self.vm;
        // Devices first: a drain's completions raise interrupts, which must reach the local
        // APICs before the vCPUs park and read them (else the IOAPIC's state, read later, says
        // an interrupt is in service that no LAPIC has). Requests the guest adds meanwhile wait
        // in their rings (a trap-mode notification is served in its exit, as always).
        let drained = vm.bus.virtio.pause().map_err(|(index, source)| {
            let slot = &vm.bus.virtio.slots[index];
            SnapshotError::Device { kind: slot.kind.to_string(), index: slot.index, source }
        });
        vm.control.pause.request();
        let result = drained.and_then(|()| {
            loop {
                let parked = vm.control.pause.parked(self.threads.len(), KICK_INTERVAL);
                if parked.iter().all(|&p| p) {
                    break;
                }
                if vm.control.stop.load(Ordering::Acquire) || started.elapsed() > PAUSE_LIMIT {
                    return Err(SnapshotError::NotPaused);
                }
                // As when stopping: a signal that lands just before KVM_RUN is missed, so repeat.
                for (thread, _) in self.threads.iter().zip(parked).filter(|(_, p)| !p) {
                    let _ = thread.kill(SIGRTMIN());
                }
            }
            Ok(())
        });
        if let Err(e) = result {
            // Half paused is no state to leave a VM in.
            vm.bus.virtio.resume();
            vm.control.pause.withdraw();
            return Err(e.into());
        }
        // The vCPUs are parked, so none is starting a responder: end the one that runs, whose
        // writes would change the paused VM's memory behind the snapshot's back.
        if let Some(testdev) = &vm.bus.testdev {
            testdev.hold();
        }
        Ok(started.elapsed())
    }

    /// Let a paused VM go on: the devices' workers back with the IOCore, the vCPUs into the
    /// guest. How long it took.
    pub fn resume(&self) -> Result<Duration, ControlError> {
        if !self.paused() {
            return Err(ControlError::NotPaused);
        }
        let started = Instant::now();
        self.vm.bus.virtio.resume();
        if let (Some(testdev), false) = (&self.vm.bus.testdev, self.migrating()) {
            testdev.release();
        }
        self.vm.control.pause.withdraw();
        Ok(started.elapsed())
    }

    /// Write a snapshot of the paused VM into `dir`: the bytes written and how long it took.
    pub fn snapshot(&self, dir: &std::path::Path) -> Result<(u64, Duration), ControlError> {
        if !self.paused() {
            return Err(ControlError::NotPaused);
        }
        let started = Instant::now();
        let bytes = self.vm.snapshot(dir)?;
        Ok((bytes, started.elapsed()))
    }

    /// Carry out what SIGUSR1 (pause if running, then snapshot) and SIGUSR2 (pause or resume)
    /// asked for, and say how it went on standard error (the log).
    fn serve_signals(&self) {
        if TOGGLE_PAUSE.swap(false, Ordering::AcqRel) {
            match self.paused() {
                true => log_outcome("resumed", self.resume()),
                false => log_outcome("paused", self.pause()),
            }
        }
        if SNAPSHOT.swap(false, Ordering::AcqRel) {
            let Some(dir) = &self.vm.snapshot_dir else { return };
            if !self.paused() {
                log_outcome("paused", self.pause());
            }
            match self.snapshot(dir) {
                Ok((bytes, took)) => log::info!(
                    "snapshot written to {}: {bytes} bytes in {:.3} ms; the VM stays paused",
                    dir.display(),
                    took.as_secs_f64() * 1e3
                ),
                Err(e) => log::error!("snapshot to {} failed: {e}", dir.display()),
            }
        }
    }
}

fn log_outcome(what: &str, outcome: Result<Duration, ControlError>) {
    match outcome {
        Ok(took) => log::info!("{what} in {:.3} ms", took.as_secs_f64() * 1e3),
        Err(e) => log::error!("not {what}: {e}"),
    }
}

impl Vm {
    /// Call `hook` from the VMM's main thread every few milliseconds while the VM runs (and
    /// while it is paused), with what it may do to the VM: how a control API's requests reach
    /// the VM.
    pub fn with_control(mut self, hook: impl FnMut(&VmControl) + Send + 'static) -> Vm {
        self.control_hook = Some(Box::new(hook));
        self
    }

    /// Use `tls` (this host's certificate and key, and the CA it trusts) for a live migration
    /// to a `tcp:IP:PORT` destination; without it such a migration is refused.
    pub fn with_migration_tls(mut self, tls: Arc<crate::migration::MigrationTls>) -> Vm {
        self.migration_tls = Some(tls);
        self
    }

    /// Write a snapshot of the paused VM into `dir`; the bytes written.
    fn snapshot(&self, dir: &std::path::Path) -> Result<u64, SnapshotError> {
        self.state()?.write(dir, &self.mem)
    }

    /// The paused VM's state, as a snapshot records it (its memory aside).
    pub(crate) fn state(&self) -> Result<Snapshot, SnapshotError> {
        let config = self.saved_config.clone().map_err(SnapshotError::Unsupported)?;
        let states = self.control.pause.states(self.vcpu_count).ok_or(SnapshotError::NotPaused)?;
        let vcpus = states.into_iter().collect::<Result<Vec<_>, _>>().map_err(SnapshotError::Unsupported)?;
        let devices = self
            .bus
            .virtio
            .slots
            .iter()
            .map(|slot| {
                let transport = lock(&slot.transport).save().map_err(|source| SnapshotError::Device {
                    kind: slot.kind.to_string(),
                    index: slot.index,
                    source,
                })?;
                Ok(DeviceState { kind: slot.kind.to_string(), index: slot.index, transport })
            })
            .collect::<Result<Vec<_>, SnapshotError>>()?;
        let snapshot = Snapshot {
            format: snapshot::FORMAT.to_string(),
            version: snapshot::VERSION,
            config,
            memory_bytes: host_ranges(&self.mem).iter().map(|r| r.1).sum(),
            tsc_khz: self.tsc_khz,
            vm: VmState::capture(&self.vm)?,
            vcpus,
            devices,
        };
        Ok(snapshot)
    }
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

static TOGGLE_PAUSE: AtomicBool = AtomicBool::new(false);
static SNAPSHOT: AtomicBool = AtomicBool::new(false);

/// SIGUSR1 asks for a snapshot, SIGUSR2 for a pause or resume; the main thread carries them out
/// at its next tick (a signal handler may only set a flag).
fn install_control_handlers() {
    static ONCE: Once = Once::new();
    extern "C" fn snapshot(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
        SNAPSHOT.store(true, Ordering::Release);
    }
    extern "C" fn toggle(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
        TOGGLE_PAUSE.store(true, Ordering::Release);
    }
    ONCE.call_once(|| {
        register_signal_handler(libc::SIGUSR1, snapshot).expect("a SIGUSR1 handler can be installed");
        register_signal_handler(libc::SIGUSR2, toggle).expect("a SIGUSR2 handler can be installed");
    });
}

/// (guest address, length, host address) of each RAM region.
pub(crate) fn host_ranges(mem: &GuestMemoryMmap) -> Vec<(u64, u64, u64)> {
    use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
    mem.iter().map(|r| (r.start_addr().0, r.len(), r.as_ptr() as u64)).collect()
}

/// Route every GSI to the IOAPIC alone. KVM's default also sends GSIs 0-15 to the PIC, whose
/// output reaches LINT0 as ExtINT, and on this host that makes a guest with device interrupts
/// triple-fault.
fn route_gsis_to_ioapic(vm: &VmFd) -> Result<(), VmError> {
    let mut routing =
        KvmIrqRouting::new(0).map_err(|_| VmError::Io(std::io::Error::other("GSI routing table")))?;
    for pin in 0..IOAPIC_PINS {
        let mut entry =
            kvm_irq_routing_entry { gsi: pin, type_: KVM_IRQ_ROUTING_IRQCHIP, ..Default::default() };
        entry.u.irqchip.irqchip = KVM_IRQCHIP_IOAPIC;
        entry.u.irqchip.pin = pin;
        routing.push(entry).map_err(|_| VmError::Io(std::io::Error::other("GSI routing table")))?;
    }
    vm.set_gsi_routing(&routing).map_err(kvm_err("set GSI routing"))
}

fn disable_exits(vm: &VmFd, which: DisableExits) -> Result<(), VmError> {
    let mut flags = 0;
    if which.hlt {
        flags |= KVM_X86_DISABLE_EXITS_HLT;
    }
    if which.pause {
        flags |= KVM_X86_DISABLE_EXITS_PAUSE;
    }
    if flags == 0 {
        return Ok(());
    }
    let supported = vm.check_extension_raw(KVM_CAP_X86_DISABLE_EXITS.into()) as u32;
    if which.hlt && supported & KVM_X86_DISABLE_EXITS_HLT == 0 {
        return Err(VmError::DisableExitsUnsupported("HLT"));
    }
    if which.pause && supported & KVM_X86_DISABLE_EXITS_PAUSE == 0 {
        return Err(VmError::DisableExitsUnsupported("PAUSE"));
    }
    let mut cap = kvm_enable_cap { cap: KVM_CAP_X86_DISABLE_EXITS, ..Default::default() };
    cap.args[0] = flags as u64;
    vm.enable_cap(&cap).map_err(kvm_err("disable HLT/PAUSE exits"))
}

/// vCPU threads are stopped with a real-time signal whose handler does nothing: its only job is
/// to make KVM_RUN return EINTR.
fn install_kick_handler() {
    static ONCE: Once = Once::new();
    extern "C" fn kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}
    ONCE.call_once(|| {
        register_signal_handler(SIGRTMIN(), kick).expect("a real-time signal handler can be installed");
    });
}
