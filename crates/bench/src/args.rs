//! The command line of `exitless bench` and its scenarios, which the `exitless` binary nests
//! under its own (`Command::Bench`): clap `Args`, so `--help` and parsing stay the binary's.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use exitless_args::{IoModeArg, SeccompArgs, VhostIoMode};

/// `exitless bench`: a scenario, or without one the block ladder.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, after_help = BENCH_HELP)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub(crate) scenario: Option<BenchScenario>,
    #[command(flatten)]
    pub(crate) blk: BlkBenchArgs,
}

const BENCH_HELP: &str = "\
Without a scenario, `exitless bench` runs the probe guest's block workload on a virtio-blk disk
in every I/O mode of the ladder (trap, eventfd, pv-eoi, sidecore, exitless, adaptive), the same
workload on the host with fio against the very same file (the bare-metal baseline: with the
disk's caching, O_DIRECT or through the page cache, one job allowed the vCPU's and the IOCore's CPUs, the best of psync, libaio and io_uring; the row
says which won), and in QEMU-KVM (--peers qemu, the default): its own virtio-blk on an iothread
with interrupt and with polled completion, QEMU with exitless's vhost-user-blk backend, and QEMU
with qemu-storage-daemon's vhost-user-blk export (its own iothread, pinned to the IOCore's CPU).
On a null disk QEMU's own virtio-blk and qemu-storage-daemon run on QEMU's null device (null-co,
read-zeroes=on), and the bare-metal baseline is fio's null engine.

Disks (--disk, repeatable; the default is `--disk scratch --disk ram=1G --disk null=1G`, the real
disk first):
  scratch[=SIZE]     a real disk: a file of SIZE (default 1G) in --scratch DIR, written with data
                     once and kept for later runs, served with O_DIRECT; DIR must be a writable
                     directory on a real file system (not tmpfs or ramfs)
  ram=SIZE           a RAM disk: a new /dev/shm file filled with data, removed at the end, served
                     as a memory copy from a mapping of it (fio's mmap engine adds a row with the
                     same copy on the host); QEMU cannot map the file, so its rows read it through
                     io_uring (tmpfs-direct) and the RAM disk's own rows have no x QEMU
  ram,path=FILE      an existing /dev/shm file
  null=SIZE          a null disk: holds nothing, reads return zeros, writes are dropped, no
                     system call per request: the I/O path's own cost, against fio's null engine
                     and QEMU's null-co (virtio-blk and qemu-storage-daemon)
  path=FILE[,direct] an existing file through io_uring (direct: O_DIRECT)
Naming --disk replaces the default three.

The backend matrix (--backends KIND,..., or all; instead of --disk): the same workloads on each
kind of disk a user gives, every peer on the same backend with the same caching:
  direct    a file of --backend-size (1G) in --scratch DIR, O_DIRECT (fio --direct=1, QEMU
            cache=none)
  buffered  the same file through the host's page cache, read into it before every run: reads
            that hit it (fio --direct=0, QEMU cache=writeback, qemu-storage-daemon
            cache.direct=off)
  cold      the same file through the page cache, dropped from it (POSIX_FADV_DONTNEED) before
            every run: reads that miss it
  tmpfs     a file in /dev/shm served through io_uring (path=), through the page cache
  loop      a loop device over the scratch file (losetup --direct-io=on), O_DIRECT
  ram       the RAM disk (a memory copy; fio mmap; QEMU on its file through io_uring)
  null      the null disk; fio's null engine, QEMU and qemu-storage-daemon on null-co
  rbd       an image of --backend-size on a Ceph cluster through librbd, its cache off: exitless's
            rbd= disk in the VMM and in exitless vhost-user-blk, fio's rbd engine, QEMU's and
            qemu-storage-daemon's driver=rbd (cache.direct=on). The bench starts a throw-away
            cluster (scripts/ceph.sh of the repository this exitless was built in; one monitor,
            one OSD in --scratch DIR, on this host's CPUs) and takes it down at the end, or uses
            the one --ceph-conf FILE names (pool rbd, client.admin); it fills the image first
e.g. exitless bench --backends all --rw randread,randwrite,writeflush --qd 1,32.

Per row: IOPS, p50/p99 latency, the latency it adds per I/O (its p50 less bare metal's), exits
per I/O by cause (KVM's statistics between two marks around the measured phase; QEMU's through
QMP query-stats), cores used (vCPU plus IOCore CPU time over wall time; QEMU's plus its
backend's), the backend the I/O ended up on (null: exitless's null disk, fio's null engine,
QEMU's null-co; ram: exitless's RAM disk, fio mmap; or the file by file system and cache mode),
the ratio to bare metal and to QEMU's best configuration on the same backend (null against
null, a file against the same file and cache mode; n/a where QEMU ran on no such backend, as on
ram).

Defaults: 4 KiB random reads at queue depths 1 and 32 on the three disks, each run (guest or
fio) measuring --duration-ms 1000 after --warmup 2000 requests: 78 runs, about 2 minutes on a
2-CPU host (plus writing the real disk's file the first time).
One progress line per run goes to standard error, with an estimate of the time left. A bad
--scratch ends the bench at once with status 2. A guest run that fails (or hangs past duration +
1 ms per warm-up request, 10 ms on rbd, + 15 s) is run once more and its row says so; one that
fails twice leaves a row that says why, and the bench ends with status 125 after printing its
report.

`exitless bench net` measures the network ladder, `exitless bench exitcost` what each kind of
exit costs.";

/// The block ladder.
#[derive(Args)]
pub struct BlkBenchArgs {
    /// Access patterns.
    #[arg(long, value_delimiter = ',', default_value = "randread")]
    pub rw: Vec<RwArg>,
    /// Block sizes in bytes (multiples of 512, at most 128K).
    #[arg(long, value_delimiter = ',', default_value = "4096", value_parser = parse_block_size)]
    pub bs: Vec<u32>,
    /// Queue depths (1 to 256, the queue size: the probe puts each request in an indirect
    /// descriptor table, one ring entry; a device without VIRTIO_F_INDIRECT_DESC holds only 85
    /// requests of one data descriptor, and the probe refuses a deeper queue).
    #[arg(long, value_delimiter = ',', default_value = "1,32", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub qd: Vec<u32>,
    /// I/O modes to measure.
    #[arg(long, value_delimiter = ',', default_value = "trap,eventfd,pv-eoi,sidecore,exitless,adaptive")]
    pub modes: Vec<IoModeArg>,
    /// A disk to measure (repeat for more; see below): `scratch[=SIZE]` (a real disk: a file in
    /// --scratch DIR, O_DIRECT), `ram=SIZE` (a new RAM disk), `ram,path=FILE`, `null=SIZE` (a
    /// null disk) or `path=FILE[,direct]`. Write workloads overwrite what is there.
    #[arg(long = "disk", value_name = "SPEC", default_values = ["scratch", "ram=1G", "null=1G"], value_parser = parse_bench_disk)]
    pub disks: Vec<BenchDiskArg>,
    /// The backend matrix instead of --disk: the same workloads on each of these kinds of disk
    /// (`direct`, `buffered`, `cold`, `tmpfs`, `loop`, `ram`, `null`, `rbd` or `all`; see below),
    /// each against fio with the same caching and QEMU on the same backend with the matching
    /// cache mode.
    #[arg(long, value_delimiter = ',', value_name = "KIND", conflicts_with = "disks")]
    pub backends: Vec<BackendArg>,
    /// `--backends rbd` on an existing Ceph cluster, this configuration file's (its pool `rbd`,
    /// as `client.admin`; the image is made there and removed at the end), instead of a
    /// throw-away cluster the bench starts on this host.
    #[arg(long, value_name = "FILE")]
    pub ceph_conf: Option<PathBuf>,
    /// The size of each --backends disk (a multiple of 1 MiB).
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = parse_backend_size)]
    pub backend_size: u64,
    /// Where the real disk's file lives (default: the system's temporary directory, $TMPDIR or
    /// /tmp); a writable directory on a real file system, not tmpfs.
    #[arg(long, value_name = "DIR")]
    pub scratch: Option<PathBuf>,
    /// How long each measured run lasts (and each fio run), in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=600_000))]
    pub duration_ms: u64,
    /// Unmeasured requests before each run.
    #[arg(long, value_name = "N", default_value_t = 2000)]
    pub warmup: u64,
    /// Measure each scenario's guest rows N times in turn (exitless's modes, then QEMU's
    /// configurations, then all again) and report each row's median run, with every round's
    /// IOPS: this host's speed drifts within minutes, and rows measured in turn share the drift.
    /// fio's baseline runs before the rounds (and on a disk, once more after them), as with one.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=99))]
    pub rounds: u32,
    /// Host CPU for the vCPU (fio's job may use it and the IOCore's).
    #[arg(long, value_name = "CPU", default_value_t = 0)]
    pub vcpu_cpu: usize,
    /// Host CPU for the IOCore (and for qemu-storage-daemon's threads).
    #[arg(long, value_name = "CPU", default_value_t = 1)]
    pub iocore_cpu: usize,
    /// Skip the bare-metal baseline (fio).
    #[arg(long)]
    pub no_baseline: bool,
    /// Peer VMMs to run the same guest and workload in (`qemu`: its own virtio-blk with
    /// interrupt and polled completion, with exitless's vhost-user-blk backend and with
    /// qemu-storage-daemon's), or `none`.
    #[arg(long, value_delimiter = ',', default_value = "qemu")]
    pub peers: Vec<Peer>,
    /// Also draw the results: one SVG per scenario in DIR (made if missing), named after it
    /// (`randread-4k-qd32.svg`), with IOPS per row (bare metal and the best peer marked), exits
    /// per I/O stacked by cause, and p50/p99 latency.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) output: ReportFormat,
    #[command(flatten)]
    pub(crate) seccomp: SeccompArgs,
}

/// One of the block bench's disks (`--disk`, or one of `--backends`).
#[derive(Clone, Debug)]
pub enum BenchDiskArg {
    /// A file of `size` bytes in the scratch directory, on a real disk, used with O_DIRECT.
    Scratch {
        /// In bytes, a multiple of 1 MiB.
        size: u64,
    },
    /// A disk as `exitless run --disk` takes it.
    Disk(vmm::DiskBackend),
    /// One kind of disk of the backend matrix, of `size` bytes.
    Matrix {
        /// Which kind (never `All`).
        kind: BackendArg,
        /// In bytes (`--backend-size`), a multiple of 1 MiB.
        size: u64,
    },
}

impl BenchDiskArg {
    /// Whether it is a RAM disk (memory, not a device).
    pub fn is_ram(&self) -> bool {
        matches!(
            self,
            BenchDiskArg::Disk(vmm::DiskBackend::Ram { .. } | vmm::DiskBackend::RamFile { .. })
                | BenchDiskArg::Matrix { kind: BackendArg::Ram, .. }
        )
    }

    /// Whether it is a null disk (it holds nothing).
    pub fn is_null(&self) -> bool {
        matches!(
            self,
            BenchDiskArg::Disk(vmm::DiskBackend::Null { .. })
                | BenchDiskArg::Matrix { kind: BackendArg::Null, .. }
        )
    }

    /// Whether it is the backend matrix's RBD image.
    pub fn is_rbd(&self) -> bool {
        matches!(self, BenchDiskArg::Matrix { kind: BackendArg::Rbd, .. })
    }

    /// Whether its file lives in the scratch directory (the RBD image's throw-away cluster
    /// lives there too, unless `--ceph-conf` names another).
    pub fn in_scratch(&self) -> bool {
        matches!(self, BenchDiskArg::Scratch { .. })
            || matches!(self, BenchDiskArg::Matrix { kind, .. } if kind.in_scratch())
    }
}

/// A kind of disk of the backend matrix (`--backends`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// A file in --scratch DIR, O_DIRECT (as `--disk scratch`).
    Direct,
    /// The same file through the host's page cache, read into it before every run.
    Buffered,
    /// The same file through the page cache, its pages dropped from it before every run.
    Cold,
    /// A file on tmpfs (/dev/shm) through io_uring, through the page cache.
    Tmpfs,
    /// A loop device over the scratch file (losetup --direct-io=on), O_DIRECT.
    Loop,
    /// The RAM disk (a memory copy); QEMU's rows read its file through io_uring.
    Ram,
    /// The null disk; fio's null engine, QEMU's rows on its null device (null-co).
    Null,
    /// An image on a Ceph cluster through librbd, its cache off; fio's rbd engine, QEMU's rows
    /// on driver=rbd.
    Rbd,
    /// Every kind above.
    All,
}

impl BackendArg {
    /// The kinds `All` stands for, in the order the bench measures them.
    pub const EACH: [BackendArg; 8] = [
        BackendArg::Direct,
        BackendArg::Buffered,
        BackendArg::Cold,
        BackendArg::Tmpfs,
        BackendArg::Loop,
        BackendArg::Ram,
        BackendArg::Null,
        BackendArg::Rbd,
    ];

    /// The disk's label in the tables and `--json` (`disk`).
    pub fn name(self) -> &'static str {
        match self {
            BackendArg::Direct => "direct",
            BackendArg::Buffered => "buffered",
            BackendArg::Cold => "cold",
            BackendArg::Tmpfs => "tmpfs",
            BackendArg::Loop => "loop",
            BackendArg::Ram => "ram",
            BackendArg::Null => "null",
            BackendArg::Rbd => "rbd",
            BackendArg::All => "all",
        }
    }

    fn in_scratch(self) -> bool {
        matches!(self, BackendArg::Direct | BackendArg::Buffered | BackendArg::Cold | BackendArg::Loop)
    }

    /// The disks `--backends KINDS` measures, of `size` bytes: each kind once, in the order of
    /// `EACH`.
    pub fn disks(kinds: &[BackendArg], size: u64) -> Vec<BenchDiskArg> {
        let wanted = |kind| kinds.contains(&BackendArg::All) || kinds.contains(&kind);
        BackendArg::EACH
            .into_iter()
            .filter(|&kind| wanted(kind))
            .map(|kind| BenchDiskArg::Matrix { kind, size })
            .collect()
    }
}

/// Why a value of the bench's options is not one.
#[derive(Debug, thiserror::Error)]
enum ArgError {
    /// Not a size.
    #[error(transparent)]
    Size(#[from] exitless_args::size::SizeError),
    /// Not a disk spec.
    #[error(transparent)]
    Disk(#[from] exitless_args::disk::DiskArgError),
    /// `--backend-size` is zero or not a whole number of MiB.
    #[error("--backend-size {0} is not a non-zero multiple of 1 MiB")]
    BackendSize(String),
    /// `--disk scratch...` that is neither `scratch` nor `scratch=SIZE`.
    #[error("unknown disk `{0}`: `scratch` or `scratch=SIZE`")]
    UnknownDisk(String),
    /// The scratch disk's size is zero or not a whole number of MiB.
    #[error("scratch disk size {0} is not a non-zero multiple of 1 MiB")]
    ScratchSize(u64),
    /// `--bs` is not a multiple of 512 up to 128 KiB.
    #[error("block size `{0}` must be a multiple of 512 up to 128K")]
    BlockSize(String),
}

fn parse_backend_size(text: &str) -> Result<u64, ArgError> {
    let size = exitless_args::size::parse(text)?;
    if size == 0 || !size.is_multiple_of(1 << 20) {
        return Err(ArgError::BackendSize(text.into()));
    }
    Ok(size)
}

fn parse_bench_disk(text: &str) -> Result<BenchDiskArg, ArgError> {
    let size = match text.strip_prefix("scratch") {
        None => return Ok(exitless_args::disk::parse(text).map(BenchDiskArg::Disk)?),
        Some("") => 1 << 30,
        Some(rest) => match rest.strip_prefix('=') {
            Some(size) => exitless_args::size::parse(size)?,
            None => return Err(ArgError::UnknownDisk(text.into())),
        },
    };
    if size == 0 || !size.is_multiple_of(1 << 20) {
        return Err(ArgError::ScratchSize(size));
    }
    Ok(BenchDiskArg::Scratch { size })
}

/// An access pattern of the block bench (`--rw`).
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RwArg {
    /// Random reads.
    Randread,
    /// Random writes.
    Randwrite,
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random writes, each followed by a FLUSH (on the host: an fdatasync); both count as
    /// requests.
    Writeflush,
}

impl RwArg {
    /// Its name on the command line and in the reports.
    pub fn name(self) -> &'static str {
        match self {
            RwArg::Randread => "randread",
            RwArg::Randwrite => "randwrite",
            RwArg::Read => "read",
            RwArg::Write => "write",
            RwArg::Writeflush => "writeflush",
        }
    }
}

fn parse_block_size(text: &str) -> Result<u32, ArgError> {
    let size = exitless_args::size::parse(text)?;
    if size == 0 || size % 512 != 0 || size > 128 * 1024 {
        return Err(ArgError::BlockSize(text.into()));
    }
    Ok(size as u32)
}

/// The scenarios beside the block ladder.
#[derive(Subcommand)]
pub enum BenchScenario {
    /// Cost of each kind of exit from a ring-3 guest: user-space MMIO, ioeventfd, cpuid, a
    /// shared-memory ping-pong with a host thread (no exit) and an interrupt round trip, in
    /// exitless and in QEMU-KVM.
    Exitcost(ExitcostArgs),
    /// UDP request-response latency through virtio-net and a tap in each I/O mode, against
    /// the same request-response between two network namespaces over veth (bare metal) and
    /// QEMU-KVM's virtio-net on the same tap.
    Net(NetBenchArgs),
    /// Many VMs at once, each on its own disk: one shared IOCore (`exitless vhost-user-blk`
    /// with exitless VMs as frontends), an IOCore per VM, QEMU with an iothread per VM, and
    /// QEMU with one qemu-storage-daemon; aggregate and per-VM IOPS, Jain's fairness, host
    /// cores and exits per I/O, and a mixed run (half the VMs at a low queue depth, half high).
    #[command(after_help = SCALE_HELP)]
    Scale(ScaleBenchArgs),
    /// How long a guest's I/O stops while its vhost-user-blk daemon is replaced: the exitless
    /// VMM and QEMU-KVM as frontends of `exitless vhost-user-blk`, the daemon stopped by
    /// SIGTERM (a graceful upgrade) or killed (kill -9) and a new one started on the same socket,
    /// once per round.
    #[command(after_help = UPGRADE_HELP)]
    Upgrade(UpgradeBenchArgs),
    /// Live migration of a probe guest mid-verify between two `exitless run` processes, per
    /// transport (a Unix socket; TCP with mutual TLS between two simulated hosts), load (an
    /// idle guest; one under I/O) and I/O mode: downtime (source pause to destination resume)
    /// and the pause in it, total time, pre-copy rounds and pages per round, the pages the
    /// IOCore and KVM reported dirty, and the verify's verdict on the destination.
    #[command(after_help = MIGRATE_HELP)]
    Migrate(MigrateBenchArgs),
}

const UPGRADE_HELP: &str = "\
Each round boots one probe VM doing `probe.rw=verify` (writes a pattern over --blocks 4 KiB
blocks at --qd, flushes, reads them back and compares) on a file in --scratch DIR served by
`exitless vhost-user-blk` with O_DIRECT, capped at --iops requests per second so that the run
lasts long enough on any host; --restart-after-ms after the guest's first write reached the file,
the daemon is stopped (SIGTERM: it finishes what it holds and exits; or kill -9) and a new one
started on the same socket and disk; or a new one is started with the old one's
--handover-socket and takes the disk, its socket and the frontend's connection over (the old one
then exits; the frontend does not reconnect); or, in the control row (`--stops none`), left to
serve the whole run. The frontends:
  exitless  `exitless run --probe --disk vhost-user=SOCKET,reconnect=10` (retries every 10 ms)
  qemu      QEMU-KVM microvm, `-chardev socket,...,reconnect=1` (QEMU 7.2 retries a second
            after the hang-up, and each second after that)
Per row, over --rounds rounds: the guest's I/O pause (the longest request of the round's run,
the probe's max_ns: the request that waited through the restart; in the control row, the
longest with no restart) as min/median/max, the
frontend's own `reconnected to a daemon after N ms` (exitless only), the reconnections (the
exitless frontend's count; for QEMU, the daemons' logged connections less the first), the old
daemon's time from SIGTERM (or from the successor's start) to its exit, the requests the new daemons resubmitted from the in-flight region, and the
guest's errors and mismatches (0, or the round fails). A frontend that cannot run (QEMU missing)
gets rows that say why.";

/// `exitless bench upgrade`.
#[derive(Args)]
pub struct UpgradeBenchArgs {
    /// Restarts per row: one probe run, with one restart in it, per round (1 to 100).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,
    /// Frontends to measure.
    #[arg(long, value_delimiter = ',', default_value = "exitless,qemu")]
    pub frontends: Vec<UpgradeFrontend>,
    /// How the old daemon is ended (`none`: no restart, the control row).
    #[arg(long, value_delimiter = ',', default_value = "none,sigterm,kill,handover")]
    pub stops: Vec<UpgradeStop>,
    /// 4 KiB blocks the verify run writes and reads back (at most the disk's 16384).
    #[arg(long, value_name = "N", default_value_t = 4000, value_parser = clap::value_parser!(u64).range(100..=16_384))]
    pub blocks: u64,
    /// The guest's queue depth (1 to 128).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=128))]
    pub qd: u32,
    /// The daemon's rate limit (`iops=N`; each daemon starts with a second's worth).
    #[arg(long, value_name = "N", default_value_t = 2000, value_parser = clap::value_parser!(u64).range(100..=1_000_000))]
    pub iops: u64,
    /// The daemon's `--io-mode`.
    #[arg(long, value_name = "MODE", default_value = "adaptive")]
    pub daemon_io_mode: DaemonIoMode,
    /// How long after the guest's first write the daemon is replaced, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub restart_after_ms: u64,
    /// Where the disk's file lives (default: $TMPDIR or /tmp); a real file system, not tmpfs.
    #[arg(long, value_name = "DIR")]
    pub scratch: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) output: ReportFormat,
    #[command(flatten)]
    pub(crate) seccomp: SeccompArgs,
}

const MIGRATE_HELP: &str = "\
Each row boots a probe guest doing `probe.rw=verify` over 16384 blocks (qd 8) on an O_DIRECT file
in --scratch DIR, which both ends name with --disk (shared storage), migrates it, and checks the
verify on the destination. Transports:
  unix       both exitless processes on this host, `--receive-migration unix:PATH`
  tcp+tls    two simulated hosts: network namespaces joined by a veth pair (10.213.0.1/30 and
             10.213.0.2/30, made and removed by the bench, as root), `--receive-migration
             tcp:10.213.0.2:PORT`, mutual TLS 1.3 with certificates from scripts/tls-certs.sh
  tcp+plain  the same two hosts, TCP without TLS (`tcp+plain:`): what TLS costs (run only when
             named)
Loads:
  io         migrated once the guest has written its first block: writes in flight
  idle       migrated once the guest has written and flushed every block and waits at its
             gate, reading it every 50 ms (`probe.gate_poll_ms=50`), writing no memory meanwhile
Each JSON row names its `transport` and its `load`.";

/// `exitless bench migrate`.
#[derive(Args)]
pub struct MigrateBenchArgs {
    /// Guest memory.
    #[arg(long, default_value = "256M")]
    pub mem: String,
    /// I/O modes to migrate in, one migration each.
    #[arg(long, value_delimiter = ',', default_value = "trap,eventfd,exitless")]
    pub modes: Vec<IoModeArg>,
    /// How the stream goes (see below).
    #[arg(long, value_delimiter = ',', default_value = "unix,tcp+tls")]
    pub transports: Vec<MigrateTransport>,
    /// What the guest does while it migrates (see below).
    #[arg(long, value_delimiter = ',', default_value = "idle,io")]
    pub loads: Vec<MigrateLoad>,
    /// Where the disk files and sockets go (a local file system that takes O_DIRECT).
    #[arg(long, value_name = "DIR", default_value = "/tmp")]
    pub scratch: PathBuf,
    #[command(flatten)]
    pub(crate) output: ReportFormat,
    #[command(flatten)]
    pub(crate) seccomp: SeccompArgs,
}

/// How `bench migrate`'s stream goes.
#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum)]
pub enum MigrateTransport {
    /// A Unix socket on this host.
    Unix,
    /// TCP with mutual TLS between two simulated hosts (network namespaces).
    #[value(name = "tcp+tls")]
    TcpTls,
    /// TCP without TLS (`tcp+plain:`) between the same two simulated hosts: what TLS costs.
    #[value(name = "tcp+plain")]
    TcpPlain,
}

impl MigrateTransport {
    /// Its name on the command line and in the reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            MigrateTransport::Unix => "unix",
            MigrateTransport::TcpTls => "tcp+tls",
            MigrateTransport::TcpPlain => "tcp+plain",
        }
    }
}

/// What `bench migrate`'s guest does while it migrates.
#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum)]
pub enum MigrateLoad {
    /// Waits at its verify's gate, all but idle.
    Idle,
    /// Mid-write.
    Io,
}

impl MigrateLoad {
    /// Its name on the command line and in the reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            MigrateLoad::Idle => "idle",
            MigrateLoad::Io => "io",
        }
    }
}

/// A frontend of `bench upgrade`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum)]
pub enum UpgradeFrontend {
    /// `exitless run --disk vhost-user=SOCKET,reconnect=10`.
    Exitless,
    /// QEMU-KVM with a reconnecting chardev (`reconnect=1`).
    Qemu,
}

/// `exitless vhost-user-blk --io-mode`, as `bench upgrade` runs the daemon.
#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum)]
pub enum DaemonIoMode {
    /// Its IOCore polls the rings.
    Sidecore,
    /// It polls while busy and waits on the kicks when idle.
    Adaptive,
    /// It waits on the kicks.
    Eventfd,
}

impl DaemonIoMode {
    /// Its name on the daemon's command line.
    pub fn name(self) -> &'static str {
        match self {
            DaemonIoMode::Sidecore => "sidecore",
            DaemonIoMode::Adaptive => "adaptive",
            DaemonIoMode::Eventfd => "eventfd",
        }
    }
}

/// How `bench upgrade` ends the old daemon.
#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum)]
pub enum UpgradeStop {
    /// No restart: the same run on one daemon, the control (its longest request is the floor
    /// under the others' pause).
    None,
    /// SIGTERM: the daemon finishes the requests it holds and exits (a graceful upgrade).
    Sigterm,
    /// SIGKILL (kill -9): a crash.
    Kill,
    /// A new daemon started with the old one's `--handover-socket` takes its disks, sockets
    /// and connected frontends over; the old one exits (an upgrade without a hang-up).
    Handover,
}

/// The most VMs `bench scale` starts at once.
pub const MAX_SCALE_VMS: u32 = 32;

const SCALE_HELP: &str = "\
Every VM runs the probe's 4 KiB random reads for --duration-ms after --warmup-ms of unmeasured
requests (so that all VMs, started together, measure at the same time), on its own disk, its
vCPU on --vcpu-cpu and the set-up's I/O side on --iocore-cpu:
  shared-iocore        one `exitless vhost-user-blk` (--io-mode sidecore, one IOCore) serving
                       every disk; `exitless run --probe --disk vhost-user=SOCKET --io-mode
                       exitless` VMs (the guest polls)
  iocore-per-vm        `exitless run --probe --io-mode exitless`, each VM its own IOCore
  qemu-iothread        QEMU-KVM microvm, each VM its own virtio-blk on its own iothread
                       (aio=io_uring, cache=none), the guest polling; QEMU's non-vCPU threads on
                       the I/O CPU
  qemu-storage-daemon  one qemu-storage-daemon exporting every disk as vhost-user-blk from one
                       iothread (pinned to the I/O CPU), QEMU VMs as frontends, the guest polling
Per set-up and VM count: aggregate IOPS, per-VM minimum and maximum, Jain's fairness index
((sum x)^2 / (n sum x^2)), host cores (CPU time of every process of the set-up over the VMs'
common measured window), IOPS per core, exits per I/O (KVM's statistics between the probe's
marks; QEMU's through QMP query-stats). The mixed run (the largest VM count, half the VMs at the
first --mixed-qd, half at the second) shows the fair share: each half's per-VM IOPS and Jain's
index. A set-up that cannot run (QEMU missing) gets rows that say why.
Default: 4 set-ups x (1, 2, 4, 8 VMs + mixed) = 20 runs of about 2 s: under a minute.";

/// `exitless bench scale`.
#[derive(Args)]
pub struct ScaleBenchArgs {
    /// How many VMs run at once, one run per count (1 to 32).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8", value_parser = clap::value_parser!(u32).range(1..=MAX_SCALE_VMS as i64))]
    pub vms: Vec<u32>,
    /// Every VM's queue depth (1 to 256).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub qd: u32,
    /// The mixed run's two queue depths: half the VMs (the largest --vms) at each.
    #[arg(long, value_name = "LOW,HIGH", value_delimiter = ',', num_args = 1, default_value = "1,32", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub mixed_qd: Vec<u32>,
    /// Skip the mixed run.
    #[arg(long)]
    pub no_mixed: bool,
    /// Each VM's disk (the values below).
    #[arg(long, value_name = "KIND", default_value = "ram")]
    pub disk: ScaleDiskArg,
    /// Size of each VM's disk.
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = exitless_args::size::parse)]
    pub disk_size: u64,
    /// Where `--disk file` keeps its files (default: $TMPDIR or /tmp); a real file system.
    #[arg(long, value_name = "DIR")]
    pub scratch: Option<PathBuf>,
    /// How long every VM measures, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=600_000))]
    pub duration_ms: u64,
    /// Unmeasured time before it, in milliseconds (covers the VMs' staggered boots).
    #[arg(long, value_name = "MS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub warmup_ms: u64,
    /// Set-ups to measure.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "shared-iocore,iocore-per-vm,qemu-iothread,qemu-storage-daemon"
    )]
    pub setups: Vec<ScaleSetup>,
    /// Host CPU of every VM's vCPU.
    #[arg(long, value_name = "CPU", default_value_t = 0)]
    pub vcpu_cpu: usize,
    /// Host CPU of the I/O side: IOCores, the daemons, QEMU's iothreads and other threads.
    #[arg(long, value_name = "CPU", default_value_t = 1)]
    pub iocore_cpu: usize,
    #[command(flatten)]
    pub(crate) output: ReportFormat,
    #[command(flatten)]
    pub(crate) seccomp: SeccompArgs,
}

/// `bench scale --disk`.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ScaleDiskArg {
    /// A /dev/shm file, removed at the end.
    Ram,
    /// A file in --scratch DIR on a real disk, kept for later runs, O_DIRECT.
    File,
}

/// One of `bench scale`'s set-ups.
#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum)]
pub enum ScaleSetup {
    /// One exitless vhost-user-blk daemon, one IOCore, serving every VM's disk.
    SharedIocore,
    /// exitless VMs, each with its own IOCore.
    IocorePerVm,
    /// QEMU VMs, each with its own virtio-blk on its own iothread.
    QemuIothread,
    /// QEMU VMs as vhost-user-blk frontends of one qemu-storage-daemon.
    QemuStorageDaemon,
}

impl ScaleSetup {
    /// Its name on the command line and in the reports.
    pub fn name(self) -> &'static str {
        match self {
            ScaleSetup::SharedIocore => "shared-iocore",
            ScaleSetup::IocorePerVm => "iocore-per-vm",
            ScaleSetup::QemuIothread => "qemu-iothread",
            ScaleSetup::QemuStorageDaemon => "qemu-storage-daemon",
        }
    }

    /// Whether its VMs are QEMU's.
    pub fn is_qemu(self) -> bool {
        matches!(self, ScaleSetup::QemuIothread | ScaleSetup::QemuStorageDaemon)
    }
}

/// `exitless bench net`.
#[derive(Args)]
pub struct NetBenchArgs {
    /// I/O modes to measure.
    #[arg(long, value_delimiter = ',', default_value = "trap,eventfd,pv-eoi,sidecore,exitless,adaptive")]
    pub modes: Vec<IoModeArg>,
    /// `exitless vhost-user-net --io-mode`s to measure exitless's own VM through, one row each
    /// (the QEMU guests' rows on the daemon run it in sidecore mode).
    #[arg(long, value_name = "MODES", value_delimiter = ',', default_value = "sidecore,adaptive,eventfd")]
    pub daemon_modes: Vec<VhostIoMode>,
    /// VMs at once on one daemon's IOCore (sidecore) for the many-VM row: each does the same
    /// request-response through the uplink, their vCPUs sharing the vCPU's CPU; per-VM rates
    /// and Jain's fairness index. 0 leaves the row out.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u16).range(0..=32))]
    pub fairness_vms: u16,
    /// UDP payload bytes per request (and answer).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1472))]
    pub size: u64,
    /// How long each measured run lasts, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=600_000))]
    pub duration_ms: u64,
    /// Unmeasured transactions before each run.
    #[arg(long, value_name = "N", default_value_t = 200)]
    pub warmup: u64,
    /// Host CPU for the vCPU (and the bare-metal client).
    #[arg(long, value_name = "CPU", default_value_t = 0)]
    pub vcpu_cpu: usize,
    /// Host CPU for the IOCore.
    #[arg(long, value_name = "CPU", default_value_t = 1)]
    pub iocore_cpu: usize,
    /// Host CPU for the echo responder (default: the IOCore's, so that waking it preempts the
    /// IOCore rather than the vCPU, whose every preemption is a VM exit).
    #[arg(long, value_name = "CPU")]
    pub responder_cpu: Option<usize>,
    /// Host CPU for the VM-to-VM rows' responder guest. Its vCPU spins (the probe waits in ring
    /// 3, even for an interrupt), so it needs a CPU of its own besides the client's vCPU and the
    /// IOCore: by default the first CPU that is neither, and without one (a two-CPU host) the
    /// VM-to-VM rows are not measured unless this names a CPU to share.
    #[arg(long, value_name = "CPU")]
    pub vm_responder_cpu: Option<usize>,
    /// Skip the bare-metal baseline.
    #[arg(long)]
    pub no_baseline: bool,
    /// Peer VMMs to run the same guest, workload, tap and responder in (`qemu`: its virtio-net
    /// on its user-space tap backend with guest interrupts and with the guest polling, and on
    /// kernel vhost-net with busy polling where the host has /dev/vhost-net), or `none`.
    #[arg(long, value_delimiter = ',', default_value = "qemu")]
    pub peers: Vec<Peer>,
    /// Also draw the results: `net-udp-rr-<SIZE>b.svg` in DIR (made if missing), with
    /// transactions/s per row (bare metal marked), exits per transaction stacked by cause, and
    /// p50/p99 latency.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) output: ReportFormat,
    #[command(flatten)]
    pub(crate) seccomp: SeccompArgs,
}

/// `exitless bench exitcost`.
#[derive(Args)]
pub struct ExitcostArgs {
    /// Operations per exit kind.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub n: u64,
    /// Ping-pong round trips.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub pingpong_n: u64,
    /// Peer VMMs to run the same guest in (`qemu`), or `none`.
    #[arg(long, value_delimiter = ',', default_value = "qemu")]
    pub peers: Vec<Peer>,
    #[command(flatten)]
    pub(crate) output: ReportFormat,
    #[command(flatten)]
    pub(crate) seccomp: SeccompArgs,
}

/// Another VMM to measure beside exitless (`--peers`).
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Peer {
    /// QEMU-KVM.
    Qemu,
    /// exitless alone.
    None,
}

/// How a benchmark prints its report.
#[derive(Args, Clone, Copy)]
pub struct ReportFormat {
    /// Print one JSON document instead of the tables.
    #[arg(long)]
    pub json: bool,
    /// Print the tables as Markdown, with date, command and machine (for BENCHMARKS.md).
    #[arg(long, conflicts_with = "json")]
    pub markdown: bool,
}
