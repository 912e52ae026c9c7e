//! The backend matrix: every kind of disk a user gives, in every I/O mode of the VMM and of
//! `exitless vhost-user-blk`, with random reads and writes at depth 1 and 32 and write+FLUSH
//! pairs. Each cell must finish every request it asked for, without an error. Its median
//! latency is printed, not asserted: a test that asserts speed fails on a slower disk or a
//! busier machine (a FLUSH on one CI machine's disk took 2.9 ms). The speeds, and the cliff
//! this matrix found (requests io_uring runs in its worker threads waiting for the 4 ms
//! scheduler tick behind a spinning IOCore), are measured by `exitless bench --backends
//! all` into BENCHMARKS.md.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use test_infra::daemon::Daemon;
use test_infra::{args, exitless_within, json_lines, one_at_a_time, stderr, stdout, LoopDevice};

/// The disks' size: small, so that the files are quick to write.
const DISK_BYTES: usize = 64 << 20;
/// A run that has not finished by then hangs.
const RUN_LIMIT: Duration = Duration::from_secs(90);

/// One kind of disk.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// A file on the file system the tests build in (ext4 here), opened with O_DIRECT.
    FileDirect,
    /// The same file without O_DIRECT, its pages in the host's page cache.
    FileBuffered,
    /// The same file without O_DIRECT, its pages dropped from the page cache before each run.
    FileBufferedCold,
    /// A file on tmpfs.
    Tmpfs,
    /// A loop device over a file, opened with O_DIRECT.
    Loop,
    /// exitless's RAM disk.
    Ram,
    /// exitless's null disk: reads return zeros and writes are dropped, so it takes only
    /// workloads that do not check what they read back (the matrix has no verify workload).
    Null,
}

/// A workload: (probe.rw, queue depth). Write+FLUSH pairs at depth 32 have FLUSHes arrive while
/// an fdatasync runs, which then share one.
const WORKLOADS: &[(&str, u32)] = &[
    ("randread", 1),
    ("randread", 32),
    ("randwrite", 1),
    ("randwrite", 32),
    ("writeflush", 1),
    ("writeflush", 32),
];
const VMM_MODES: &[&str] = &["trap", "eventfd", "pv-eoi", "sidecore", "exitless", "adaptive"];
const DAEMON_MODES: &[&str] = &["sidecore", "adaptive", "eventfd"];

/// A disk of `kind` made for one test, and what is needed to serve it.
struct Disk {
    kind: Kind,
    /// The `--disk` value (for the VMM and, after `socket=...,`, for the daemon).
    spec: String,
    file: Option<PathBuf>,
    _loop_device: Option<LoopDevice>,
    _dir: tempfile::TempDir,
}

impl Disk {
    fn new(kind: Kind) -> Disk {
        let dir = match kind {
            Kind::Tmpfs => tempfile::tempdir_in("/dev/shm").unwrap(),
            _ => tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap(),
        };
        if matches!(kind, Kind::FileDirect | Kind::FileBuffered | Kind::FileBufferedCold | Kind::Loop) {
            assert!(
                !on_tmpfs(dir.path()),
                "{} is on tmpfs: the file cells need a disk",
                dir.path().display()
            );
        }
        let image = dir.path().join("disk.img");
        let in_memory = matches!(kind, Kind::Ram | Kind::Null);
        if !in_memory {
            let data: Vec<u8> = (0..DISK_BYTES).map(|i| (i / 4096) as u8).collect();
            std::fs::write(&image, data).unwrap();
        }
        let (spec, loop_device) = match kind {
            Kind::FileDirect => (format!("path={},direct", image.display()), None),
            Kind::FileBuffered | Kind::FileBufferedCold | Kind::Tmpfs => {
                (format!("path={}", image.display()), None)
            }
            Kind::Loop => {
                let device = LoopDevice::attach(&image);
                (format!("path={},direct", device.path.display()), Some(device))
            }
            Kind::Ram => (format!("ram={DISK_BYTES}"), None),
            Kind::Null => (format!("null={DISK_BYTES}"), None),
        };
        let file = (!in_memory).then_some(image);
        Disk { kind, spec, file, _loop_device: loop_device, _dir: dir }
    }

    /// Before a run: a cold disk's pages leave the page cache.
    fn prepare(&self) {
        if self.kind != Kind::FileBufferedCold {
            return;
        }
        let file =
            std::fs::OpenOptions::new().read(true).write(true).open(self.file.as_ref().unwrap()).unwrap();
        file.sync_all().unwrap();
        // SAFETY: a valid descriptor for the call's duration; advice only, no memory involved.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0, "posix_fadvise(DONTNEED)");
    }

    /// The workloads this kind is measured with: a cold cache is about reads.
    fn workloads(&self) -> impl Iterator<Item = &'static (&'static str, u32)> {
        let cold = self.kind == Kind::FileBufferedCold;
        WORKLOADS.iter().filter(move |(rw, _)| !cold || rw.ends_with("read"))
    }
}

fn on_tmpfs(path: &Path) -> bool {
    let out = std::process::Command::new("stat").args(["-f", "-c", "%T"]).arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim() == "tmpfs"
}

/// How many requests a cell at depth `qd` measures: a fixed number, so a cell hit by the cliff
/// still ends (400 requests at depth 1 take 1.6 s at 4 ms each).
fn cell_ops(qd: u32) -> u64 {
    if qd == 1 {
        400
    } else {
        4000
    }
}

/// The probe's command line for a workload.
fn probe_cmdline(rw: &str, qd: u32) -> String {
    let ops = cell_ops(qd);
    format!("probe.workload=blk probe.rw={rw} probe.qd={qd} probe.ops={ops} probe.warmup=100")
}

/// What went wrong in one cell, if anything: it must report every request it asked for, none
/// of them failed.
fn check_cell(cell: &str, qd: u32, out: &std::process::Output) -> Option<String> {
    let result = json_lines(out).into_iter().find(|l| l["probe"] == "blk");
    let Some(result) = result else {
        return Some(format!(
            "{cell}: no result (status {:?}); stdout: {}; stderr: {}",
            out.status.code(),
            stdout(out),
            stderr(out)
        ));
    };
    let p50 = result["p50_ns"].as_f64().unwrap_or(f64::INFINITY);
    let errors = result["errors"].as_u64().unwrap_or(u64::MAX);
    if !out.status.success() || errors != 0 || result.get("error").is_some() {
        return Some(format!("{cell}: failed (status {:?}, {errors} errors): {result}", out.status.code()));
    }
    let ops = result["ops"].as_u64().unwrap_or(0);
    eprintln!("{cell}: {ops} requests, p50 {:.1} us", p50 / 1000.0);
    (ops != cell_ops(qd)).then(|| format!("{cell}: {ops} requests measured, not {}: {result}", cell_ops(qd)))
}

/// Every mode of the VMM on a disk of `kind`, vCPU on CPU 0 and IOCore on CPU 1.
fn vmm_cells(kind: Kind) -> Vec<String> {
    let disk = Disk::new(kind);
    let mut failures = Vec::new();
    for mode in VMM_MODES {
        for &(rw, qd) in disk.workloads() {
            disk.prepare();
            let cmdline = probe_cmdline(rw, qd);
            let line = "run --probe --mem 128M --pin-vcpu 0 --iocore-cpu 1";
            let more = ["--disk", &disk.spec, "--io-mode", mode, "--cmdline", &cmdline];
            let out = exitless_within(RUN_LIMIT, &args(line, &more));
            failures.extend(check_cell(&format!("{kind:?} vmm {mode} {rw} qd{qd}"), qd, &out));
        }
    }
    failures
}

/// Every mode of `exitless vhost-user-blk` on a disk of `kind`, its IOCore on CPU 1, served to
/// the exitless VMM as a frontend whose guest polls, on CPU 0.
fn daemon_cells(kind: Kind) -> Vec<String> {
    let disk = Disk::new(kind);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("disk.sock");
    let mut failures = Vec::new();
    for mode in DAEMON_MODES {
        let spec = format!("socket={},{}", socket.display(), disk.spec);
        let daemon_args = ["--disk", &spec, "--io-mode", mode, "--iocore-cpu", "1"];
        let mut daemon = Daemon::start(&daemon_args, &[&socket], &dir.path().join(format!("{mode}.log")));
        for &(rw, qd) in disk.workloads() {
            disk.prepare();
            let cmdline = probe_cmdline(rw, qd);
            let vhost_user = format!("vhost-user={}", socket.display());
            let line = "run --probe --mem 128M --io-mode exitless --pin-vcpu 0";
            let out =
                exitless_within(RUN_LIMIT, &args(line, &["--disk", &vhost_user, "--cmdline", &cmdline]));
            failures.extend(check_cell(&format!("{kind:?} daemon {mode} {rw} qd{qd}"), qd, &out));
            daemon.assert_alive();
        }
        daemon.stop();
    }
    failures
}

fn assert_cells(kind: Kind) {
    let _one = one_at_a_time();
    let mut failures = vmm_cells(kind);
    failures.extend(daemon_cells(kind));
    assert!(failures.is_empty(), "{} cell(s) failed:\n{}", failures.len(), failures.join("\n"));
}

test_infra::tests! {
    file_with_o_direct_every_mode => assert_cells(Kind::FileDirect);
    buffered_file_every_mode => assert_cells(Kind::FileBuffered);
    buffered_file_with_a_cold_page_cache_every_mode => assert_cells(Kind::FileBufferedCold);
    tmpfs_file_every_mode => assert_cells(Kind::Tmpfs);
    loop_device_every_mode => assert_cells(Kind::Loop);
    ram_disk_every_mode => assert_cells(Kind::Ram);
}

#[test]
fn null_disk_every_mode() {
    assert!(WORKLOADS.iter().all(|(rw, _)| !rw.contains("verify")), "a null disk reads zeros");
    assert_cells(Kind::Null);
}
