//! Command-line interface.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use exitless_args::{IoModeArg, SeccompArgs};
use exitless_bench::BenchArgs;

#[derive(Parser)]
#[command(
    name = "exitless",
    version,
    about = "A KVM VMM whose guests do I/O without VM exits",
    long_about = None,
    after_help = ENVIRONMENT
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Boot a PVH kernel (or the built-in probe guest) and run it to its end.
    #[command(after_help = RUN_EXIT_STATUS)]
    Run(RunArgs),
    /// The built-in probe guest.
    #[command(subcommand)]
    Probe(ProbeCommand),
    /// Measure. Without a scenario: the block I/O ladder (every --io-mode) against bare metal.
    Bench(Box<BenchArgs>),
    /// A UDP echo responder: answers every datagram with itself (the network benchmark's
    /// server, for the guest and for the bare-metal baseline alike).
    UdpEcho(exitless_bench::udp::UdpEchoArgs),
    /// A UDP request-response client (like netperf UDP_RR): one datagram out, wait for its
    /// echo, repeat; prints one JSON line with transactions per second and latency.
    UdpRr(exitless_bench::udp::UdpRrArgs),
    /// A UDP flood: 18-byte datagrams (64-byte frames), as fast as the kernel takes them, for
    /// `exitless udp-count` to count; prints one JSON line with frames sent per second.
    UdpFlood(exitless_bench::udp::UdpFloodArgs),
    /// Counts `exitless udp-flood`'s (or the probe's `frames-send`) datagrams and those lost;
    /// prints one JSON line with frames received per second.
    UdpCount(exitless_bench::udp::UdpCountArgs),
    /// Serve a virtio-blk disk over vhost-user (to QEMU's vhost-user-blk and other frontends).
    VhostUserBlk(vhost_user_blk::VhostUserBlkArgs),
    /// Serve NICs over vhost-user (to QEMU's -netdev vhost-user and other frontends), joined by
    /// a switch that an IOCore runs.
    VhostUserNet(vhost_user_net::VhostUserNetArgs),
}

const ENVIRONMENT: &str = "\
Environment:
  EXITLESS_LOG=LEVEL  which messages go to standard error: off, error, warn, info (the
                      default), debug or trace";

const RUN_EXIT_STATUS: &str = "\
Exit status:
  V    the guest wrote V to the isa-debug-exit port 0xf4 (the probe: 0 ok, 1 failed, 2 bad
       parameter, 3 crashed)
  2    invalid command line
  123  the guest shut down, triple-faulted, reset or crashed
  124  --timeout passed
  125  exitless failed (bad kernel file, KVM error, ...)

The guest's serial console (COM1) goes to standard output, messages to standard error.
exitless appends `exitless.testdev=<address>` to the command line when the VM has the test
device (--probe or --testdev), `virtio_mmio.device=4K@<address>:<irq>` for each --disk and, with --probe, `probe.tsc_khz=<kHz>`
so the probe can report nanoseconds, and the guest half of --io-mode (`probe.completion=` and
`probe.pv_eoi=`) unless the command line sets them. For another kernel, the guest half of a mode
(polled or interrupt completion) is that kernel's driver's choice.

Example: exitless run --probe --disk ram=1G --io-mode exitless \
             --cmdline 'probe.workload=blk probe.rw=randread probe.qd=32'";

#[derive(Args)]
#[command(group = clap::ArgGroup::new("kernel-source").required(true))]
pub struct RunArgs {
    /// PVH ELF kernel to boot (a kernel with a XEN_ELFNOTE_PHYS32_ENTRY note).
    #[arg(long, value_name = "FILE", group = "kernel-source")]
    pub kernel: Option<PathBuf>,
    /// Boot the built-in probe guest.
    #[arg(long, group = "kernel-source")]
    pub probe: bool,
    /// Continue a VM from a snapshot (`source_url=file:///DIR`, as Cloud Hypervisor takes it) in
    /// this process: its memory, vCPUs, devices and configuration. Its disks are the ones named
    /// here with --disk, in the snapshot's order, each of the saved disk's kind, size, queues=
    /// and readonly (a path in the snapshot is never opened); its NICs the taps and vhost-user
    /// daemons named with --net, each with the saved MAC address; --testdev if it had the test
    /// device. Its other options that build a VM (--mem, --cmdline, --io-mode...) are the
    /// snapshot's; --timeout, --seccomp, CPU placement and --snapshot-dir are this run's.
    #[arg(long, value_name = "source_url=file:///DIR", group = "kernel-source")]
    pub restore: Option<String>,
    /// Wait on this Unix socket (`unix:/PATH`, created with mode 0600) for a live migration from
    /// another exitless of the same user or root (its `PUT /api/v1/vm.send-migration`; other
    /// users' connections are closed unread), then run the VM it brings. As with --restore, its
    /// disks are the ones named here with --disk (the same files: shared storage), its NICs the
    /// taps named with --net, and --testdev if it has the test device; other options that build a VM are the source's;
    /// --timeout, --seccomp, CPU placement, --api-socket are this run's.
    #[arg(long, value_name = "unix:/PATH", group = "kernel-source")]
    pub receive_migration: Option<String>,
    /// Mutual TLS for live migrations over TCP (`tcp:IP:PORT`), both to receive one
    /// (--receive-migration) and to send one later (vm.send-migration): DIR holds ca.pem (the
    /// CA certificates the other host's certificate must be signed by), cert.pem (this host's
    /// certificate; a destination's names its IP address in subjectAltName) and key.pem (its
    /// private key, mode 0600). Read once, at start. scripts/tls-certs.sh makes a set.
    #[arg(long, value_name = "DIR")]
    pub migration_tls_dir: Option<PathBuf>,
    /// Give the VM the test device (exit-cost registers and a bounded ping-pong responder, for
    /// the probe) with --kernel, or to a --restore or --receive-migration of a VM that had it.
    /// --probe has it always; other VMs have none.
    #[arg(long)]
    pub testdev: bool,
    /// Where a snapshot goes: SIGUSR1 pauses the VM (vCPUs stopped, every device drained) and
    /// writes a snapshot there (state.json and memory, mode 0600, in a directory of mode 0700
    /// that exitless creates; an existing one must be this user's, 0700, not a link); the VM
    /// stays paused. SIGUSR2 pauses a
    /// running VM or resumes a paused one. Local disks (path=, ram,path=, null= or rbd=) and NICs
    /// on taps only.
    #[arg(long, value_name = "DIR")]
    pub snapshot_dir: Option<PathBuf>,
    /// Serve Cloud Hypervisor's control verbs on this Unix socket (HTTP/1.1, `curl
    /// --unix-socket`): `PUT /api/v1/vm.pause`, `PUT /api/v1/vm.resume`, and
    /// `PUT /api/v1/vm.snapshot` with `{"destination_url": "file:///DIR"}` (of a paused VM), and
    /// `PUT /api/v1/vm.send-migration` with `{"destination_url": "unix:/PATH"}` (or
    /// `tcp:IP:PORT`, mutual TLS with --migration-tls-dir, or `tcp+plain:IP:PORT`): a live
    /// migration to an exitless started with `--receive-migration` on that URL (local disks and
    /// NICs on taps only; answers with the migration's times and page counts as JSON). The
    /// socket is made 0600 whatever the umask, and only this process's user and root are served
    /// (others are logged and closed unread): the verbs write snapshots and send guest memory
    /// where asked.
    #[arg(long, value_name = "PATH")]
    pub api_socket: Option<PathBuf>,
    /// Kernel command line (the probe's default: probe.workload=hello).
    #[arg(long, value_name = "STR")]
    pub cmdline: Option<String>,
    /// Guest memory, e.g. 256M or 2G.
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = exitless_args::size::parse)]
    pub mem: u64,
    /// Number of vCPUs.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=64))]
    pub vcpus: u8,
    /// Back guest memory with 2 MiB huge pages (the host must have enough reserved). Without it,
    /// guest memory asks for transparent huge pages, which the host gives where its policy
    /// (/sys/kernel/mm/transparent_hugepage/enabled) is `madvise` or `always` and memory allows;
    /// guest memory shared with a vhost-user daemon is a memfd, whose policy is `shmem_enabled`.
    #[arg(long)]
    pub hugepages: bool,
    /// Pin vCPU threads to host CPUs: the first CPU for vCPU 0, the next for vCPU 1, ...
    #[arg(long, value_name = "CPU", value_delimiter = ',')]
    pub pin_vcpu: Vec<usize>,
    /// Let the guest execute these without a VM exit (KVM_CAP_X86_DISABLE_EXITS).
    #[arg(long, value_name = "EXITS", value_delimiter = ',')]
    pub disable_exits: Vec<ExitKind>,
    /// Print the KVM exit statistics of the whole run, per vCPU (to standard error).
    #[arg(long)]
    pub stats: bool,
    /// With --stats: print them as one JSON line on standard output, after the console output.
    #[arg(long, requires = "stats")]
    pub json: bool,
    /// Stop the guest after this many seconds.
    #[arg(long, value_name = "SECONDS", value_parser = exitless_args::parse_seconds, allow_negative_numbers = true)]
    pub timeout: Option<f64>,
    #[command(flatten)]
    pub io: IoArgs,
    #[command(flatten)]
    pub seccomp: SeccompArgs,
}

/// Disks and how their I/O is served.
#[derive(Args, Clone)]
pub struct IoArgs {
    /// A virtio-blk disk (repeat for more): `path=FILE[,readonly][,direct]` (raw file through
    /// io_uring), `ram=SIZE` (a new RAM disk), `ram,path=FILE[,readonly]` (an existing
    /// /dev/shm file, shared with the host), `null=SIZE[,readonly]` (a null disk: reads return
    /// zeros, writes are accepted and dropped, every request completes at once with no system
    /// call; the I/O path's own cost), or `vhost-user=SOCKET[,reconnect=SECS][,daemon-uid=UID]`
    /// (served by a vhost-user daemon such as `exitless vhost-user-blk`; guest memory is then a
    /// shared memfd, and the daemon's --io-mode decides how it serves: --io-mode here only picks
    /// the guest's side; if the daemon goes away, the VM waits up to SECS seconds, default 10, 0
    /// not at all, for the next one on the socket and carries on; the daemon must run as this
    /// user or root, or as UID: a process of anyone else listening there is sent nothing).
    /// vhost-user disks come after the others on the bus. `serial=TEXT` (1 to 20 printable ASCII
    /// characters) sets the serial number the guest reads (Linux: /sys/block/vdX/serial); the
    /// default is `exitless-diskN`. With --restore or --receive-migration: the VM's own disks, in
    /// its order.
    #[arg(long = "disk", value_name = "SPEC", value_parser = exitless_args::disk::parse_run)]
    pub disks: Vec<exitless_args::disk::RunDisk>,
    /// A virtio-net device (repeat for more): on a tap, `tap=NAME[,mac=52:54:00:12:34:56][,netns=NAME]`,
    /// opened if it exists, created (and brought up) otherwise, in network namespace NAME (`ip
    /// netns add NAME`) or in ours; or on a vhost-user daemon, `vhost-user=SOCKET[,mac=MAC]
    /// [,reconnect=SECS][,daemon-uid=UID]` (`exitless vhost-user-net --nic socket=SOCKET,mac=MAC`:
    /// give both the same address; reconnect and daemon-uid as for a vhost-user disk), after the
    /// taps on the bus. Frames are at most 1518 bytes (no offloads). With --restore or
    /// --receive-migration: a tap (or, restoring, a vhost-user daemon) for each of the VM's NICs,
    /// in its order, with the MAC address it had (a restored NIC announces itself with a RARP, or
    /// has its daemon do it, so that bridges learn its new port).
    #[arg(long = "net", value_name = "SPEC", value_parser = exitless_args::net::parse)]
    pub nets: Vec<exitless_args::net::NetArg>,
    /// How disk and network I/O is served (the values below). For vhost-user disks only the
    /// guest's half applies (interrupts: eventfd, pv-eoi, sidecore; polling: exitless,
    /// adaptive; trap is refused).
    #[arg(long, value_name = "MODE", default_value = "exitless")]
    pub io_mode: IoModeArg,
    /// Pin the IOCore (polling or I/O thread) to this host CPU, which it then owns: vCPUs not
    /// pinned by --pin-vcpu stay off it, and a polling or notified IOCore runs there in the idle
    /// scheduling class, so the kernel's work on that CPU (a disk's completions) runs at once.
    /// Another busy thread on that CPU would hold it off for about a second at a time: a watcher
    /// thread sees it stall while it wants to run and, within about 40 ms, moves it to the
    /// batch class (an eventfd or pv-eoi one to the normal class) for a while, which the IOCore
    /// reports on standard error. It then shares the CPU: give it a CPU of its own.
    #[arg(long, value_name = "CPU")]
    pub iocore_cpu: Option<usize>,
    /// adaptive: microseconds the IOCore spins without a request before it sleeps.
    #[arg(long, value_name = "US", default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub idle_budget_us: u64,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ExitKind {
    Hlt,
    Pause,
}

#[derive(Subcommand)]
pub enum ProbeCommand {
    /// Write the probe guest's PVH ELF to FILE, to boot it in QEMU, Firecracker or Cloud Hypervisor.
    Export { file: PathBuf },
}
