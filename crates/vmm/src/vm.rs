//! A KVM virtual machine: built from a [`VmConfig`] and a PVH kernel, run to its end.

use std::fmt;
use std::io::Cursor;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
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
use crate::devices::vhost_user_blk::VhostUserDisk;
use crate::devices::virtio::{
    DeviceError, DeviceList, DiskBackend, DiskOptions, IoCoreSetup, IoMode, NetConfig, VirtioDevices,
};
use crate::devices::Bus;
use crate::memory::{self, MemoryError};
use crate::stats::{StatsError, VcpuStats};
use crate::vcpu::{RunControl, Vcpu, VcpuReport};
use crate::{cpuid, regs};

/// Interrupt lines of the IOAPIC; all are routed to it alone (see `route_gsis_to_ioapic`).
const IOAPIC_PINS: u32 = 24;
const TSS_ADDR: usize = 0xfffb_d000;
const MAX_VCPUS: u8 = 64;
/// How often a stopping VM re-signals vCPU threads that are still in KVM_RUN.
const KICK_INTERVAL: Duration = Duration::from_millis(2);

/// Exits that can be handed to the guest (KVM_CAP_X86_DISABLE_EXITS).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DisableExits {
    pub hlt: bool,
    pub pause: bool,
}

#[derive(Debug, Clone)]
pub struct VmConfig {
    pub mem_bytes: u64,
    pub vcpus: u8,
    pub hugepages: bool,
    /// Host CPU for vCPU `i` at index `i`; vCPUs beyond the list float.
    pub pin_vcpus: Vec<usize>,
    pub disable_exits: DisableExits,
    /// The kernel command line; exitless appends `exitless.testdev=<address>`.
    pub cmdline: String,
    pub console: ConsoleMode,
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
            console: ConsoleMode::Stdout,
            timeout: None,
            disks: Vec::new(),
            disk_options: Vec::new(),
            vhost_user_disks: Vec::new(),
            nets: Vec::new(),
            io_mode: IoMode::Eventfd,
            iocore_cpu: None,
            idle_budget: iocore::DEFAULT_IDLE_BUDGET,
            seccomp: SeccompMode::Kill,
            confine_caller: false,
        }
    }
}

/// The kernel to boot.
pub enum Kernel<'a> {
    File(PathBuf),
    Image(&'a [u8]),
}

#[derive(Debug, Error)]
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
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The guest wrote this value to the debug-exit port.
    GuestExit(u8),
    /// KVM_EXIT_SHUTDOWN: a triple fault, or a shutdown request.
    Shutdown {
        vcpu: u8,
    },
    Reset {
        vcpu: u8,
    },
    GuestCrash {
        vcpu: u8,
    },
    /// HLT reached user space (only without an in-kernel irqchip).
    Halted {
        vcpu: u8,
    },
    InternalError {
        vcpu: u8,
        suberror: u32,
        rip: u64,
    },
    FailEntry {
        vcpu: u8,
        reason: u64,
    },
    UnexpectedExit {
        vcpu: u8,
        exit: String,
    },
    Timeout(Duration),
    HostError(String),
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
        }
    }
}

/// Everything a run produced.
#[derive(Debug)]
pub struct RunOutcome {
    pub ending: Ending,
    pub vcpus: Vec<VcpuReport>,
    /// The console output, when the console mode captures it.
    pub console: Vec<u8>,
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
#[warn(missing_docs)]
pub struct Vm {
    // Held for ownership only. Fields drop in order: the VM fd goes before the RAM it maps.
    _kvm: Kvm,
    _vm: VmFd,
    _mem: GuestMemoryMmap,
    vcpus: Vec<Vcpu>,
    bus: Arc<Bus>,
    console: ConsoleWriter,
    control: Arc<RunControl>,
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

#[warn(missing_docs)]
impl Vm {
    /// Build the VM `config` describes and load `kernel` into it.
    pub fn new(config: &VmConfig, kernel: Kernel) -> Result<Vm, VmError> {
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

        let mem = if config.vhost_user_disks.is_empty() {
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
            Kernel::File(path) => {
                let mut file = open_without_blocking(&path, true, 0, Wanted::RegularFile).map_err(
                    |error| match error {
                        OpenError::Io(source) => VmError::OpenKernel { path: path.clone(), source },
                        kind_error => VmError::KernelNotAFile { path: path.clone(), kind_error },
                    },
                )?;
                boot::load_kernel(&mem, &mut file).map_err(|source| VmError::KernelFile { path, source })?
            }
            Kernel::Image(bytes) => boot::load_kernel(&mem, &mut Cursor::new(bytes))?,
        };

        let control = Arc::new(RunControl::default());
        let testdev = TestDevice::new(
            probe_abi::testdev::DEFAULT_BASE,
            mem.clone(),
            control.stop.clone(),
            Filter::new(ThreadKind::PingPong, config.seccomp)?,
        )?;
        testdev.register(&vm).map_err(kvm_err("register the test device doorbell and interrupt"))?;
        let base_cpuid = cpuid::supported(&kvm).map_err(kvm_err("report supported CPUID"))?;
        let has_devices =
            !config.disks.is_empty() || !config.vhost_user_disks.is_empty() || !config.nets.is_empty();
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
        let cmdline = format!("{cmdline} {}={:#x}", probe_abi::param::TESTDEV, testdev.base());
        let cmdline = cmdline.trim();
        if cmdline.len() > boot::CMDLINE_MAX {
            return Err(VmError::CmdlineTooLong { total: cmdline.len() });
        }
        boot::write_boot_info(&mem, cmdline)?;
        regs::write_gdt(&mem)?;

        let console = ConsoleWriter::new(config.console);
        let serial_irq = EventFd::new(libc::EFD_NONBLOCK)?;
        vm.register_irqfd(&serial_irq, COM1_IRQ).map_err(kvm_err("register the serial irqfd"))?;
        let serial = Com1::new(serial_irq.try_clone()?, console.clone());
        let bus = Arc::new(Bus { serial: Mutex::new(serial), testdev, virtio });

        let vcpu_filter = Filter::new(ThreadKind::Vcpu, config.seccomp)?;
        let mut vcpus = Vec::with_capacity(config.vcpus as usize);
        for index in 0..config.vcpus {
            let fd = vm.create_vcpu(index as u64).map_err(kvm_err("create a vCPU"))?;
            fd.set_cpuid2(&cpuid::for_vcpu(&base_cpuid, index, config.vcpus))
                .map_err(kvm_err("set CPUID"))?;
            if index == 0 {
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
            });
        }

        Ok(Vm {
            _kvm: kvm,
            _vm: vm,
            _mem: mem,
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
    pub fn run(self) -> Result<RunOutcome, VmError> {
        install_kick_handler();
        let started = Instant::now();
        let mut threads = Vec::with_capacity(self.vcpus.len());
        for mut vcpu in self.vcpus {
            let start = vcpu.stats.snapshot()?;
            let bus = self.bus.clone();
            let control = self.control.clone();
            let name = format!("vcpu{}", vcpu.index);
            threads
                .push(std::thread::Builder::new().name(name).spawn(move || vcpu.run(&bus, &control, start))?);
        }
        let confined = self.main_filter.install();
        if confined.is_err() {
            // Stop the guest at once; the error is returned once the threads are down.
            self.control.end(Ending::Timeout(Duration::ZERO));
        }

        let ending = match self.control.wait(self.timeout) {
            Some(ending) => ending,
            None => {
                let timeout = self.timeout.unwrap_or_default();
                self.control.end(Ending::Timeout(timeout));
                Ending::Timeout(timeout)
            }
        };
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
        self.bus.testdev.join();
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

/// (guest address, length, host address) of each RAM region.
fn host_ranges(mem: &GuestMemoryMmap) -> Vec<(u64, u64, u64)> {
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
