//! QEMU-KVM as a peer in the block ladder: the same probe guest, workload and backing file,
//! under QEMU's own virtio-blk (microvm, virtio-mmio, an iothread, aio=io_uring, the disk's
//! cache mode: cache=none with O_DIRECT) with interrupt and with polled completion, and under
//! QEMU with a vhost-user-blk backend: exitless's (`exitless vhost-user-blk`, sidecore, its
//! IOCore pinned to the IOCore CPU) and QEMU's own (`qemu-storage-daemon` exporting the file with
//! its own iothread, aio=io_uring, the same cache mode, the whole process pinned to the IOCore
//! CPU). On a null disk, QEMU's own device and qemu-storage-daemon run on QEMU's null device
//! (`null-co`, read-zeroes=on) instead, so that "x QEMU" compares null device with null device
//! (exitless's vhost-user-blk backend serves the null disk itself). QEMU's vCPU thread runs on the vCPU
//! CPU and its other threads (the iothread) on the IOCore CPU, as exitless's would. Exits come
//! from QMP `query-stats`, sampled at the probe's marks; cores are QEMU's and the backend's CPU
//! time over wall time. On an RBD image, QEMU's own device and qemu-storage-daemon open the
//! image with QEMU's `driver=rbd` (`cache.direct=on`: librbd's cache off, as exitless's), and
//! each row's note says how much CPU the cluster's daemons on this host used over its run.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use thiserror::Error;

// `Backend` here is a vhost-user backend process.
use super::backend::Backend as RowBackend;
use super::blk::{Row, Scenario};
use super::causes_per;
use super::ceph::Cluster;
use super::progress::{Kind, Progress};
use super::scratch::PageCache;
use crate::args::BlkBenchArgs;
use crate::probe_dir::{ProbeDir, ProbeDirError};
use crate::qemu::{CpuOutOfRange, PeerMark, ProbeError, Qemu, QemuError};
use exitless_args::SeccompArgs;
use storage::RbdSpec;
use vmm::Counters;

/// How long the probe idles at each mark while the runner samples QEMU's counters: 30 ms was
/// too short on a busy host, where the guest ran past its last mark and QEMU had exited before
/// the sample (QMP: broken pipe).
const MARK_LINGER_MS: u64 = 100;

/// QEMU's guest RAM, as exitless's own (the VM config's default).
const MEM_MIB: u64 = 256;

/// Whether QEMU's guest RAM, a memfd it shares with the vhost-user daemon, goes on reserved
/// 2 MiB huge pages: for requests larger than a page when exitless's own guest RAM gets
/// transparent huge pages (see `baseline::buffers_on_huge_pages`: fio's buffers then go on huge
/// pages too), where the host has enough free. A memfd gets transparent huge pages only if the
/// host's `shmem_enabled` policy allows, which it seldom does, so without this QEMU's rows alone
/// ran on 4 KiB pages.
fn shared_ram_on_huge_pages(block_size: u32) -> bool {
    block_size > 4096
        && vmm::memory::transparent_huge_pages()
        && vmm::memory::free_huge_pages().is_ok_and(|free| free >= MEM_MIB / 2)
}

/// What serves QEMU's disk.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// QEMU's own virtio-blk device on an iothread.
    Qemu,
    /// `exitless vhost-user-blk`.
    Exitless,
    /// `qemu-storage-daemon`'s vhost-user-blk export.
    StorageDaemon,
}

/// What QEMU's own configurations read and write.
#[derive(Clone, Copy, PartialEq, Eq)]
enum On {
    /// The bench's disk file.
    File,
    /// QEMU's null device, `null-co` with `read-zeroes=on`, of the disk's size: null disks only.
    Null,
    /// Whatever exitless's vhost-user-blk backend serves: the disk as exitless serves it.
    Disk,
}

/// The peer configurations, in report order: (mode name, guest completion, server, what it is
/// on).
const CONFIGS: [(&str, &str, Served, On); 7] = [
    ("qemu virtio-blk, interrupt", "interrupt", Served::Qemu, On::File),
    ("qemu virtio-blk, poll", "poll", Served::Qemu, On::File),
    ("qemu virtio-blk null-co, interrupt", "interrupt", Served::Qemu, On::Null),
    ("qemu virtio-blk null-co, poll", "poll", Served::Qemu, On::Null),
    ("qemu + exitless vhost-user-blk, poll", "poll", Served::Exitless, On::Disk),
    ("qemu + qemu-storage-daemon, poll", "poll", Served::StorageDaemon, On::File),
    ("qemu + qemu-storage-daemon null-co, poll", "poll", Served::StorageDaemon, On::Null),
];

/// The configurations run on a disk: QEMU's own on null-co for a null disk, on the file for the
/// others; exitless's backend on every disk.
fn configs(null: bool) -> impl Iterator<Item = &'static (&'static str, &'static str, Served, On)> {
    let wanted = if null { On::Null } else { On::File };
    CONFIGS.iter().filter(move |c| c.3 == On::Disk || c.3 == wanted)
}

/// How many QEMU runs a scenario on a disk takes (a null disk or not).
pub fn runs(null: bool) -> usize {
    configs(null).count()
}

/// The bench's disk, as QEMU's rows use it.
pub struct PeerDisk<'a> {
    /// The file (or block device) QEMU's own device and qemu-storage-daemon open.
    pub path: &'a Path,
    /// Its `--disk` spec, for `exitless vhost-user-blk`.
    pub spec: &'a str,
    /// Whether QEMU opens the file with O_DIRECT (cache=none, cache.direct=on).
    pub direct: bool,
    /// [`Row::backend`] of QEMU's own rows on the file.
    pub file_backend: RowBackend,
    /// A null disk's size: QEMU's own configurations run on a null device of that size.
    pub null_size: Option<u64>,
    /// What the file's pages in the host's page cache are made before every run.
    pub page_cache: PageCache,
    /// An RBD image: QEMU's own configurations open it with `driver=rbd` (`path` is not used).
    pub rbd: Option<&'a RbdSpec>,
    /// The RBD image's cluster, whose daemons' CPU time each row's note gives.
    pub cluster: Option<&'a Cluster>,
}

impl PeerDisk<'_> {
    fn before_run(&self) {
        self.page_cache.prepare(self.path);
    }
}

/// Why a QEMU peer could not be set up, or one of its runs failed.
#[derive(Debug, Error)]
pub enum PeerError {
    /// The directory of its sockets and the probe could not be made.
    #[error(transparent)]
    Dir(#[from] ProbeDirError),
    /// A qemu-storage-daemon row, and it is not installed.
    #[error(
        "qemu-storage-daemon not found (install qemu-system-common, or set $EXITLESS_QEMU_STORAGE_DAEMON)"
    )]
    NoStorageDaemon,
    /// The path of this executable, which serves as exitless's backend, is unknown.
    #[error("cannot find this executable: {0}")]
    CurrentExe(#[source] std::io::Error),
    /// `exitless vhost-user-blk` could not be started.
    #[error("cannot start the vhost-user backend: {0}")]
    StartBackend(#[source] std::io::Error),
    /// The vhost-user backend exited, or took too long, before its socket existed.
    #[error("the vhost-user backend did not create its socket")]
    NoSocket,
    /// qemu-storage-daemon could not be started.
    #[error("cannot start {}: {source}", .binary.display())]
    StartStorageDaemon {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The storage daemon's CPU cannot be pinned.
    #[error(transparent)]
    Pin(#[from] CpuOutOfRange),
    /// QEMU failed.
    #[error(transparent)]
    Qemu(#[from] QemuError),
    /// The probe's run under QEMU gave no usable result.
    #[error(transparent)]
    Probe(#[from] ProbeError),
}

/// QEMU, and qemu-storage-daemon if it is installed, with the probe exported for them.
pub struct QemuPeer {
    qemu: Qemu,
    storage_daemon: Option<StorageDaemon>,
    probe: ProbeDir,
}

impl QemuPeer {
    pub fn new(qemu: Qemu) -> Result<QemuPeer, PeerError> {
        Ok(QemuPeer { qemu, storage_daemon: StorageDaemon::find(), probe: ProbeDir::make("qemu")? })
    }

    pub fn version(&self) -> &str {
        &self.qemu.version
    }

    /// qemu-storage-daemon's version line, if it is installed.
    pub fn storage_daemon_version(&self) -> Option<String> {
        self.storage_daemon.as_ref().map(|d| d.version.clone())
    }

    /// One row per configuration for `scenario` on `disk` (QEMU's own on its null device for a
    /// null disk).
    pub fn rows(
        &mut self,
        scenario: Scenario,
        args: &BlkBenchArgs,
        disk: &PeerDisk,
        tsc_khz: u32,
        progress: &mut Progress,
    ) -> Vec<Row> {
        configs(disk.null_size.is_some())
            .map(|&(name, completion, served, on)| {
                let at = format!("{}, {} {} B QD {}", scenario.disk, scenario.rw, scenario.bs, scenario.qd);
                progress.start(Kind::Qemu, format_args!("{name}, {at}"));
                let mut row = Row::new("qemu", name.to_string(), scenario);
                row.backend = match on {
                    On::Disk => scenario.backend,
                    On::Null => RowBackend::Null,
                    On::File => disk.file_backend,
                };
                if served != Served::Qemu {
                    row.device = "vhost-user-blk";
                }
                let block = match (on, disk.null_size, disk.rbd) {
                    (On::Null, Some(size), _) => Block::Null { size },
                    (_, _, Some(spec)) => Block::Rbd(spec),
                    _ => Block::File { path: disk.path, direct: disk.direct },
                };
                let served_on = (served, block, disk.spec);
                row.cpu_round_trip_ns = super::cache_line::round_trip_ns(args.vcpu_cpu, args.iocore_cpu);
                let blank = row.clone();
                disk.before_run();
                let (measured, cluster) = super::ceph::cores_during(disk.cluster, || {
                    self.measure(&mut row, scenario, args, served_on, tsc_khz, completion)
                });
                let Err(first) = measured else {
                    row.add_note(super::ceph::cores_note(cluster));
                    return row;
                };
                // Once more, as exitless's own runs: one failed run must not cost the row.
                super::progress(format_args!("that run failed ({first}); running it again"));
                row = blank;
                disk.before_run();
                let (measured, cluster) = super::ceph::cores_during(disk.cluster, || {
                    self.measure(&mut row, scenario, args, served_on, tsc_khz, completion)
                });
                row.add_note(super::ceph::cores_note(cluster));
                match measured {
                    Ok(()) => {
                        let retried = format!("measured on the second attempt; the first failed: {first}");
                        row.note = Some(row.note.map_or(retried.clone(), |n| format!("{n}; {retried}")));
                    }
                    Err(second) => row.note = Some(format!("not measured: {first}; then: {second}")),
                }
                row
            })
            .collect()
    }

    /// Runs one configuration: `served` on `block` (`spec`: the disk for exitless's backend).
    fn measure(
        &mut self,
        row: &mut Row,
        scenario: Scenario,
        args: &BlkBenchArgs,
        (served, block, spec): (Served, Block, &str),
        tsc_khz: u32,
        completion: &str,
    ) -> Result<(), PeerError> {
        let Scenario { rw, bs, qd, .. } = scenario;
        let cmdline = format!(
            "probe.workload=blk probe.rw={rw} probe.bs={bs} probe.qd={qd} probe.duration_ms={} probe.warmup={} \
             probe.tsc_khz={tsc_khz} probe.completion={completion} probe.mark_linger_ms={MARK_LINGER_MS} \
             probe.seed={}",
            args.duration_ms,
            args.warmup,
            super::fresh_seed()
        );
        let mut machine = "microvm,acpi=off".to_string();
        let mut extra: Vec<String> = Vec::new();
        let mut backend = None;
        let huge_ram = served != Served::Qemu && shared_ram_on_huge_pages(bs);
        if served != Served::Qemu {
            let socket = self.probe.path().join("vhost-user-blk.sock");
            backend = Some(match served {
                Served::StorageDaemon => {
                    let daemon = self.storage_daemon.as_ref().ok_or(PeerError::NoStorageDaemon)?;
                    daemon.start(&socket, block, args.iocore_cpu)?
                }
                _ => Backend::start(&socket, spec, args.iocore_cpu, args.seccomp)?,
            });
            machine += ",memory-backend=mem";
            let memory = if huge_ram {
                format!("memory-backend-memfd,id=mem,size={MEM_MIB}M,share=on,hugetlb=on,hugetlbsize=2M")
            } else {
                format!("memory-backend-memfd,id=mem,size={MEM_MIB}M,share=on")
            };
            extra.extend(
                [
                    "-object",
                    &memory,
                    "-chardev",
                    &format!("socket,id=vu,path={}", socket.display()),
                    "-device",
                    "vhost-user-blk,chardev=vu",
                ]
                .map(String::from),
            );
        } else {
            let drive = match block {
                Block::File { path, direct } => format!(
                    "file={},format=raw,if=none,id=d0,cache={},aio=io_uring",
                    path.display(),
                    if direct { "none" } else { "writeback" }
                ),
                Block::Null { size } => format!("driver=null-co,read-zeroes=on,size={size},if=none,id=d0"),
                Block::Rbd(spec) => rbd_blockdev(spec, "d0"),
            };
            extra.extend(
                [
                    "-object",
                    "iothread,id=io0",
                    if matches!(block, Block::Rbd(_)) { "-blockdev" } else { "-drive" },
                    &drive,
                    "-device",
                    "virtio-blk-device,drive=d0,iothread=io0",
                ]
                .map(String::from),
            );
        }
        let mut qemu_args = Qemu::probe_args(&machine, self.probe.elf(), &cmdline, MEM_MIB);
        qemu_args.extend(["-global".to_string(), "virtio-mmio.force-legacy=false".to_string()]);
        // Thread names, so that `pin_threads` can tell the vCPU thread from the others.
        qemu_args.extend(["-name".to_string(), "exitless-bench,debug-threads=on".to_string()]);
        qemu_args.extend(extra);
        let helpers: Vec<u32> = backend.iter().map(|b| b.child.id()).collect();
        let qmp = self.probe.path().join("qmp.sock");
        let _ = std::fs::remove_file(&qmp);
        let timeout = super::blk::run_timeout(args, scenario);
        // As exitless's own: the vCPU on its CPU, everything else (QEMU's iothread) on the IOCore's.
        let (vcpu_cpu, io_cpu) = (args.vcpu_cpu, args.iocore_cpu);
        let (run, marks) = self.qemu.run_marked_with(&qemu_args, Some(&qmp), &helpers, timeout, |pid| {
            crate::qemu::pin_threads(pid, vcpu_cpu, io_cpu)
        })?;
        row.command = Some(match &backend {
            Some(Backend { command: Some(daemon), .. }) => format!("{daemon} & {}", run.command_line),
            _ => run.command_line.clone(),
        });
        drop(backend);
        if served != Served::Qemu && bs > 4096 && !huge_ram {
            row.note = Some(format!(
                "QEMU's guest RAM, a memfd shared with the daemon, on 4 KiB pages: 2 MiB ones need {} free \
                 reserved huge pages",
                MEM_MIB / 2
            ));
        }
        let line = crate::qemu::blk_result(&run)?;
        let ops = line["ops"].as_u64().unwrap_or(0);
        row.ops = ops;
        row.iops = line["iops"].as_f64();
        row.p50_us = line["p50_ns"].as_f64().map(|ns| ns / 1000.0);
        row.p99_us = line["p99_ns"].as_f64().map(|ns| ns / 1000.0);
        let (start, end) = (find(&marks, 0)?, find(&marks, 1)?);
        let counters = exits_between(start, end);
        row.exits_per_io = Some(counters.get("exits") as f64 / ops.max(1) as f64);
        row.exits_by_cause = causes_per(&counters, ops);
        let wall = end.at.duration_since(start.at).as_secs_f64();
        row.cpu_cores_used = (wall > 0.0).then(|| end.cpu.saturating_sub(start.cpu).as_secs_f64() / wall);
        Ok(())
    }
}

pub(super) fn find(marks: &[PeerMark], label: u32) -> Result<&PeerMark, ProbeError> {
    marks.iter().find(|m| m.label == label).ok_or(ProbeError::NoSample(label))
}

/// Counter growth between two samples, less the exits the closing mark's console line cost.
pub(super) fn exits_between(start: &PeerMark, end: &PeerMark) -> Counters {
    let before: Map<String, Value> = start.stats.iter().map(|(k, v)| (k.clone(), (*v).into())).collect();
    Counters(
        end.stats
            .iter()
            .map(|(name, value)| {
                let mut grown = value.saturating_sub(before.get(name).and_then(Value::as_u64).unwrap_or(0));
                if name == "exits" {
                    grown = grown.saturating_sub(end.line_bytes);
                }
                (name.clone(), grown)
            })
            .collect(),
    )
}

/// What QEMU's own device or qemu-storage-daemon serves.
#[derive(Clone, Copy)]
enum Block<'a> {
    File {
        path: &'a Path,
        direct: bool,
    },
    /// `null-co`, read-zeroes=on: reads fill the buffer with zeroes, writes are dropped.
    Null {
        size: u64,
    },
    /// An RBD image through QEMU's `driver=rbd`.
    Rbd(&'a RbdSpec),
}

/// `-blockdev` / `--blockdev` options of QEMU's rbd driver for `spec`, node `node`: the image
/// with its cluster's configuration file and cephx user, `cache.direct=on` (QEMU then turns
/// librbd's cache off, as exitless does).
fn rbd_blockdev(spec: &RbdSpec, node: &str) -> String {
    let conf = spec.conf.as_ref().map_or(String::new(), |conf| format!(",conf={}", conf.display()));
    format!(
        "driver=rbd,node-name={node},pool={},image={}{conf},user={},cache.direct=on",
        spec.pool,
        spec.image,
        spec.user()
    )
}

/// A vhost-user-blk backend serving the bench's disk, for QEMU: `exitless vhost-user-blk` or
/// qemu-storage-daemon.
struct Backend {
    child: Child,
    /// The backend's command line, shown with the row (qemu-storage-daemon's; exitless's own is
    /// implied by the row).
    command: Option<String>,
}

impl Backend {
    fn start(
        socket: &Path,
        disk: &str,
        iocore_cpu: usize,
        seccomp: SeccompArgs,
    ) -> Result<Backend, PeerError> {
        let _ = std::fs::remove_file(socket);
        let exe = std::env::current_exe().map_err(PeerError::CurrentExe)?;
        let child = Command::new(exe)
            .args(["vhost-user-blk", "--socket"])
            .arg(socket)
            .args(["--disk", disk])
            .args(["--io-mode", "sidecore", "--iocore-cpu", &iocore_cpu.to_string()])
            .args(seccomp.flag())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(PeerError::StartBackend)?;
        Backend { child, command: None }.wait_for(socket)
    }

    /// Waits until the backend listens on `socket` (it is stopped if it does not within 10 s).
    fn wait_for(mut self, socket: &Path) -> Result<Backend, PeerError> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            if Instant::now() > deadline || self.child.try_wait().ok().flatten().is_some() {
                return Err(PeerError::NoSocket);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(self)
    }
}

/// qemu-storage-daemon: QEMU's block layer as a process of its own.
struct StorageDaemon {
    binary: PathBuf,
    version: String,
}

impl StorageDaemon {
    /// `$EXITLESS_QEMU_STORAGE_DAEMON` or `qemu-storage-daemon` from PATH, if it runs.
    fn find() -> Option<StorageDaemon> {
        let binary = std::env::var_os("EXITLESS_QEMU_STORAGE_DAEMON")
            .map_or_else(|| "qemu-storage-daemon".into(), PathBuf::from);
        let output = Command::new(&binary).arg("--version").stdin(Stdio::null()).output().ok()?;
        let version = String::from_utf8_lossy(&output.stdout).lines().next()?.trim().to_string();
        output.status.success().then_some(StorageDaemon { binary, version })
    }

    /// Exports `block` as vhost-user-blk on `socket`, served by an iothread of its own (a file
    /// through io_uring, with O_DIRECT as QEMU's own device in the other rows), every thread of
    /// the process on `cpu` (as exitless's IOCore).
    fn start(&self, socket: &Path, block: Block, cpu: usize) -> Result<Backend, PeerError> {
        let _ = std::fs::remove_file(socket);
        let blockdev = match block {
            Block::File { path, direct } => {
                // QEMU's `file` driver takes regular files only; a block device needs `host_device`.
                let block_device = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device());
                let driver = if block_device { "host_device" } else { "file" };
                format!(
                    "driver={driver},filename={},aio=io_uring,cache.direct={},node-name=disk0",
                    path.display(),
                    if direct { "on" } else { "off" }
                )
            }
            Block::Null { size } => format!("driver=null-co,node-name=disk0,read-zeroes=on,size={size}"),
            Block::Rbd(spec) => rbd_blockdev(spec, "disk0"),
        };
        let args = [
            "--blockdev".to_string(),
            blockdev,
            "--object".to_string(),
            "iothread,id=iothread0".to_string(),
            "--export".to_string(),
            format!(
                "type=vhost-user-blk,id=export0,node-name=disk0,addr.type=unix,addr.path={},\
                 iothread=iothread0,writable=on",
                socket.display()
            ),
        ];
        let mut command = Command::new(&self.binary);
        command.args(&args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        crate::qemu::pin_child(&mut command, cpu)?;
        let child = command
            .spawn()
            .map_err(|source| PeerError::StartStorageDaemon { binary: self.binary.clone(), source })?;
        let shown = format!("taskset -c {cpu} {} {}", self.binary.display(), crate::qemu::shell_words(&args));
        Backend { child, command: Some(shown) }.wait_for(socket)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
