//! QEMU as the tests start it: a Linux guest under TCG (`-M pc`) or the probe under KVM
//! (`-M microvm`), its disks QEMU's own virtio-blk or vhost-user-blk back-ends, its console on
//! standard output.

use std::ffi::OsString;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use crate::console::Console;
use crate::linux::Kernel;

/// What to start: `Qemu::linux` or `Qemu::probe`, then its disks, then `spawn`, `spawn_console`
/// or `output`.
pub struct Qemu {
    machine: Machine,
    ram: String,
    /// Guest RAM in a shared memfd, as a vhost-user back-end needs it.
    shared_ram: bool,
    /// Everything but the machine and its RAM, in order (devices are numbered in it).
    args: Vec<OsString>,
    /// vhost-user chardevs and drives so far, to name the next one.
    chardevs: usize,
    drives: usize,
    /// The network namespace it runs in (a simulated host), if not the test's.
    netns: Option<String>,
}

#[derive(Clone, Copy, PartialEq)]
enum Machine {
    /// `-M pc` under TCG: PCI devices.
    Pc,
    /// `-M microvm` under KVM: virtio-mmio devices.
    Microvm,
}

impl Qemu {
    /// Debian's `kernel` under TCG with `initramfs`, `vcpus` CPUs and `ram` (QEMU's `-m`), its
    /// console on the first serial port; `append` follows `console=ttyS0 panic=-1 quiet no_timer_check`.
    pub fn linux(kernel: &Kernel, initramfs: &Path, ram: &str, vcpus: u32, append: &str) -> Qemu {
        let mut qemu = Qemu::new(Machine::Pc, ram);
        // Room for a second CPU even when one runs: QEMU 7.2 (Debian 12's) drops every guest
        // memory barrier from the code it translates for a guest that can only ever have one
        // CPU (`-d op` shows no `mb` op at all). A device in another thread (a vhost-user
        // back-end, QEMU's own I/O threads) then races the driver: the driver's store to
        // `used_event` can pass its load of the used index, the device reads the old
        // `used_event` and does not interrupt, and the guest waits for ever for a request that
        // completed (a guest hung in fio on a polling daemon). QEMU 8.1 keeps the barriers.
        let smp = format!("{vcpus},maxcpus={}", vcpus.max(2));
        qemu.args.extend(["-accel".into(), "tcg".into(), "-smp".into(), smp.into()]);
        qemu.args.extend(["-nographic", "-nodefaults", "-serial", "stdio", "-no-reboot"].map(OsString::from));
        qemu.args.extend(["-kernel".into(), kernel.image.clone().into_os_string()]);
        qemu.args.extend(["-initrd".into(), initramfs.into()]);
        // no_timer_check: under TCG on a busy host the kernel's check that the IO-APIC timer
        // ticks can fail, and the guest panics at boot ("IO-APIC + timer doesn't work!").
        let append = format!("console=ttyS0 panic=-1 quiet no_timer_check {append}");
        qemu.args.extend(["-append".into(), append.trim_end().into()]);
        qemu
    }

    /// The probe's ELF (`exitless probe export`) under KVM on microvm with `ram`, its command
    /// line `cmdline`, and the debug-exit port: QEMU exits with (V << 1) | 1 when the probe
    /// writes V there.
    pub fn probe(elf: &Path, ram: &str, cmdline: &str) -> Qemu {
        let mut qemu = Qemu::new(Machine::Microvm, ram);
        qemu.args.extend(["-accel", "kvm", "-nographic", "-nodefaults", "-no-reboot"].map(OsString::from));
        qemu.args.extend(
            ["-serial", "stdio", "-device", "isa-debug-exit,iobase=0xf4,iosize=1"].map(OsString::from),
        );
        qemu.args.extend(["-global", "virtio-mmio.force-legacy=false"].map(OsString::from));
        qemu.args.extend(["-kernel".into(), elf.into(), "-append".into(), cmdline.into()]);
        qemu
    }

    fn new(machine: Machine, ram: &str) -> Qemu {
        Qemu {
            machine,
            ram: ram.to_owned(),
            shared_ram: false,
            args: Vec::new(),
            chardevs: 0,
            drives: 0,
            netns: None,
        }
    }

    /// A disk served by QEMU itself from the raw file `path` (virtio-blk-pci or
    /// virtio-blk-device).
    pub fn drive(self, path: &Path) -> Qemu {
        self.drive_with(path, "")
    }

    /// As `drive`, with more device options (`,indirect_desc=off`).
    pub fn drive_with(self, path: &Path, device_options: &str) -> Qemu {
        self.drive_full(path, "", device_options)
    }

    /// As `drive`, with more drive options (`,discard=unmap`) and device options
    /// (`,serial=NAME`).
    pub fn drive_full(mut self, path: &Path, drive_options: &str, device_options: &str) -> Qemu {
        let id = format!("d{}", self.drives);
        self.drives += 1;
        let device = match self.machine {
            Machine::Pc => "virtio-blk-pci",
            Machine::Microvm => "virtio-blk-device",
        };
        self.args.extend([
            "-drive".into(),
            format!("file={},format=raw,if=none,id={id}{drive_options}", path.display()).into(),
            "-device".into(),
            format!("{device},drive={id}{device_options}").into(),
        ]);
        self
    }

    /// A vhost-user-blk disk whose back-end listens on `socket`; guest RAM becomes shared.
    pub fn vhost_user_blk(self, socket: &Path) -> Qemu {
        self.vhost_user_blk_with(socket, "", "")
    }

    /// As `vhost_user_blk`, with more chardev options (`,reconnect=1`) and device options
    /// (`,num-queues=2`).
    pub fn vhost_user_blk_with(mut self, socket: &Path, chardev: &str, device: &str) -> Qemu {
        let id = format!("vu{}", self.chardevs);
        self.chardevs += 1;
        self.shared_ram = true;
        let kind = match self.machine {
            Machine::Pc => "vhost-user-blk-pci",
            Machine::Microvm => "vhost-user-blk",
        };
        self.args.extend([
            "-chardev".into(),
            format!("socket,id={id},path={}{chardev}", socket.display()).into(),
            "-device".into(),
            format!("{kind},chardev={id}{device}").into(),
        ]);
        self
    }

    /// A NIC (virtio-net-pci) with address `mac` whose back-end listens on `socket`; guest RAM
    /// becomes shared. On `pc` the NIC takes legacy interrupts (`vectors=0`): with MSI-X, QEMU
    /// 7.2 under TCG crashes (SIGSEGV in `msix_set_vector_notifiers`, from `vhost_net_start`)
    /// as the driver starts a vhost-user NIC.
    pub fn vhost_user_net(self, socket: &Path, mac: &str) -> Qemu {
        self.vhost_user_net_with(socket, mac, "", "")
    }

    /// [`Qemu::vhost_user_net`] with more options for the chardev (`,reconnect=1`: connect
    /// again, every second, to a back-end that went away) and for the device (`,csum=off`).
    pub fn vhost_user_net_with(self, socket: &Path, mac: &str, chardev: &str, device: &str) -> Qemu {
        self.vhost_user_net_of(socket, mac, [chardev, "", device])
    }

    /// [`Qemu::vhost_user_net`] with `pairs` queue pairs (the guest uses as many as it has CPUs).
    pub fn vhost_user_net_pairs(self, socket: &Path, mac: &str, pairs: usize) -> Qemu {
        self.vhost_user_net_of(socket, mac, ["", &format!(",queues={pairs}"), ",mq=on"])
    }

    /// A vhost-user NIC with more options for its chardev, netdev and device.
    fn vhost_user_net_of(mut self, socket: &Path, mac: &str, [chardev, netdev, device]: [&str; 3]) -> Qemu {
        let id = format!("vu{}", self.chardevs);
        self.chardevs += 1;
        self.shared_ram = true;
        let kind = match self.machine {
            Machine::Pc => "virtio-net-pci",
            Machine::Microvm => "virtio-net-device",
        };
        self.args.extend([
            "-chardev".into(),
            format!("socket,id={id},path={}{chardev}", socket.display()).into(),
            "-netdev".into(),
            format!("vhost-user,id=net-{id},chardev={id}{netdev}").into(),
            "-device".into(),
            format!(
                "{kind},netdev=net-{id},mac={mac}{}{device}",
                if kind == "virtio-net-pci" { ",vectors=0" } else { "" }
            )
            .into(),
        ]);
        self
    }

    /// Run it in network namespace `netns` (a simulated host: its migration listens and
    /// connects there).
    pub fn netns(mut self, netns: &str) -> Qemu {
        self.netns = Some(netns.to_owned());
        self
    }

    /// More arguments, as they are (`-qmp`, `-incoming`).
    pub fn args(mut self, args: &[&str]) -> Qemu {
        self.args.extend(args.iter().map(OsString::from));
        self
    }

    /// The command line, standard input from /dev/null.
    pub fn command(&self) -> Command {
        let mut command = crate::command_in(self.netns.as_deref(), "qemu-system-x86_64");
        let backend = if self.shared_ram { ",memory-backend=mem" } else { "" };
        match self.machine {
            Machine::Pc if self.shared_ram => {
                command.args(["-machine", &format!("pc{backend}")]);
            }
            Machine::Pc => {}
            Machine::Microvm => {
                command.args(["-M", &format!("microvm,acpi=off{backend}")]);
            }
        }
        command.args(["-m", &self.ram]);
        if self.shared_ram {
            command.args(["-object", &format!("memory-backend-memfd,id=mem,size={},share=on", self.ram)]);
        }
        command.args(&self.args).stdin(Stdio::null());
        command
    }

    /// Run it to the end: its status, console and standard error.
    pub fn output(&self) -> Output {
        self.command().output().expect("qemu-system-x86_64 must be installed (scripts/setup.sh installs it)")
    }

    /// Start it, its console read line by line, its standard error in `stderr`.
    pub fn spawn_console(&self, stderr: &Path) -> Console {
        Console::spawn(&mut self.command(), stderr)
    }

    /// Start it, its console in the file `console` and its standard error as `stderr` says.
    pub fn spawn(&self, console: &Path, stderr: impl Into<Stdio>) -> Child {
        self.command()
            .stdout(std::fs::File::create(console).unwrap())
            .stderr(stderr)
            .spawn()
            .expect("qemu-system-x86_64 must be installed (scripts/setup.sh installs it)")
    }
}
