//! Faults in a disk's backing file under a running guest: the file system runs out of space,
//! the file is truncated, the file system turns read-only. The probe's `blk-faults` workload
//! does rounds of writes and checked reads on the disk under test, steered step by step through
//! a second (control) disk of the same VM; the host breaks the file while the guest is between
//! steps, then mends it. Each time the guest must get VIRTIO_BLK_S_IOERR for exactly the requests
//! the fault hits, valid requests must keep working (and work again once the fault is mended),
//! the control disk must keep serving, no read may return wrong data, and the host must count the
//! errors. Both frontends: `exitless run` (IOCore polling, `exitless` mode) and the
//! `exitless vhost-user-blk` daemon serving the probe under QEMU-KVM (microvm).
//!
//! Needs root (mount, loop devices), mkfs.ext4 (e2fsprogs) and, for the vhost-user cases,
//! qemu-system-x86_64: what scripts/setup.sh installs.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use probe_abi::fault_control as control;
use serde_json::Value;
use test_infra::console::Console;
use test_infra::daemon::Daemon;
use test_infra::qemu::Qemu;

const BLOCK: u64 = 4096;
const SEED: u64 = 77;
/// A step's wait for the guest: generous, as the machine is shared.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);
/// A range of 4 KiB blocks: (first, count).
type Range = (u64, u64);
const NONE: Range = (0, 0);

/// A small ext4 file system on a loop device, unmounted when dropped.
struct Ext4 {
    mount_point: PathBuf,
    /// Holds the image and the mount point; removed after the file system is detached.
    _dir: tempfile::TempDir,
}

impl Ext4 {
    fn mount(size_mib: u64, options: &str) -> Ext4 {
        let dir = tempfile::tempdir().unwrap();
        let image = test_infra::disk_file(dir.path(), "fs.img", size_mib << 20);
        run_ok(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image));
        let mount_point = dir.path().join("mnt");
        std::fs::create_dir(&mount_point).unwrap();
        run_ok(Command::new("mount").args(["-o", &format!("loop,{options}")]).arg(&image).arg(&mount_point));
        Ext4 { mount_point, _dir: dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.mount_point.join(name)
    }

    /// The loop device's name (`loop3`), as /sys/fs/ext4 knows it.
    fn device(&self) -> String {
        let out = Command::new("findmnt").args(["-no", "SOURCE"]).arg(&self.mount_point).output().unwrap();
        let source = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        source.rsplit('/').next().unwrap().to_owned()
    }

    /// Write a file until the file system is full; returns its path. ext4 keeps a pool of
    /// clusters for converting unwritten extents, which O_DIRECT writes to holes may use: it is
    /// emptied first, so that no write that needs a block finds one.
    fn fill(&self) -> PathBuf {
        let pool = format!("/sys/fs/ext4/{}/reserved_clusters", self.device());
        std::fs::write(&pool, "0").unwrap_or_else(|e| panic!("{pool}: {e}"));
        let path = self.path("filler");
        let mut file = std::fs::File::create(&path).unwrap();
        for chunk in [1 << 20, 4096] {
            let data = vec![0xeeu8; chunk];
            while file.write_all(&data).and_then(|_| file.sync_data()).is_ok() {}
        }
        path
    }

    /// Commit freed blocks, so they can be allocated again.
    fn sync(&self) {
        run_ok(Command::new("sync").arg("-f").arg(&self.mount_point));
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        // Lazily, so a failed test that left a process holding a file still cleans up.
        let _ = Command::new("umount").arg("-l").arg(&self.mount_point).status();
    }
}

fn run_ok(command: &mut Command) {
    let out = command.output().unwrap_or_else(|e| panic!("cannot run {command:?}: {e} (scripts/setup.sh)"));
    assert!(out.status.success(), "{command:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The control disk: one page in /dev/shm, shared with the guest through a RAM disk (exitless)
/// or read by QEMU's own virtio-blk.
struct Control(tempfile::TempPath);

impl Control {
    fn new() -> Control {
        let file = tempfile::Builder::new().prefix("exitless-fault-control").tempfile_in("/dev/shm").unwrap();
        file.as_file().set_len(BLOCK).unwrap();
        Control(file.into_temp_path())
    }

    fn set(&self, step: u64, write: Range, read: Range) {
        let mut words = [0u64; control::WORDS];
        words[0] = control::MAGIC;
        words[control::STEP] = step;
        (words[control::WRITE_FIRST], words[control::WRITE_BLOCKS]) = write;
        (words[control::READ_FIRST], words[control::READ_BLOCKS]) = read;
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        std::fs::OpenOptions::new().write(true).open(&self.0).unwrap().write_all_at(&bytes, 0).unwrap();
    }
}

/// Which frontend drives the disk under test.
#[derive(Clone, Copy, Debug)]
enum Frontend {
    /// `exitless run`, the IOCore polling (`--io-mode exitless`); both disks are its own.
    Exitless,
    /// The probe under QEMU-KVM, the disk under test served by `exitless vhost-user-blk`, the
    /// control disk by QEMU's virtio-blk.
    VhostUser,
}

/// The running guest, its backend, and the steps it has been asked for.
struct Faulty {
    frontend: Frontend,
    guest: Console,
    daemon: Option<Console>,
    control: Control,
    dir: tempfile::TempDir,
}

/// What the guest saw during one step (its `{"probe":"blk-faults","step":..}` line).
#[derive(Debug)]
struct Seen(Value);

impl Seen {
    fn count(&self, kind: &str, outcome: &str) -> u64 {
        self.0[kind][outcome].as_u64().unwrap_or_else(|| panic!("no {kind}.{outcome} in {}", self.0))
    }

    fn rounds(&self) -> u64 {
        self.0["rounds"].as_u64().unwrap()
    }

    /// Every request of `kind` ended `outcome`, `per_round` of them a round; none otherwise.
    fn all(&self, kind: &str, outcome: &str, per_round: u64) {
        let expected = self.rounds() * per_round;
        for o in ["ok", "ioerr", "other"] {
            let want = if o == outcome { expected } else { 0 };
            assert_eq!(self.count(kind, o), want, "{kind}.{o}: {}", self.0);
        }
        assert_eq!(self.count(kind, "mismatches"), 0, "a read answered OK returned wrong data: {}", self.0);
    }

    /// Every request of `kind` ended OK or IOERR, some of them IOERR; no read returned wrong data.
    fn some_failed(&self, kind: &str, per_round: u64) {
        let (ok, ioerr) = (self.count(kind, "ok"), self.count(kind, "ioerr"));
        assert_eq!(ok + ioerr, self.rounds() * per_round, "{kind}: {}", self.0);
        assert!(ioerr > 0, "{kind}: none failed: {}", self.0);
        assert_eq!(self.count(kind, "other") + self.count(kind, "mismatches"), 0, "{kind}: {}", self.0);
    }

    /// The control disk served every read of the step.
    fn control_served(&self) {
        assert!(self.count("control", "ok") >= self.rounds(), "{}", self.0);
        for o in ["ioerr", "other"] {
            assert_eq!(self.count("control", o), 0, "the other disk failed: {}", self.0);
        }
    }
}

/// The guest's lines and the host's counts once the guest stopped.
struct Outcome {
    steps: Vec<Seen>,
    /// I/O errors the host counted on the disk under test, and on the control disk (`None`
    /// where the frontend does not report them).
    host_io_errors: Option<u64>,
    control_host_io_errors: Option<u64>,
}

impl Outcome {
    fn step(&self, step: u64) -> &Seen {
        self.steps
            .iter()
            .find(|s| s.0["step"] == step)
            .unwrap_or_else(|| panic!("no step {step}: {:?}", self.steps))
    }

    fn guest_ioerrs(&self) -> u64 {
        self.steps.iter().map(|s| s.count("writes", "ioerr") + s.count("reads", "ioerr")).sum()
    }

    /// One line of what each side counted, for scripts/reliability.sh (after the checks passed).
    fn print(&self, fault: &str, frontend: Frontend) {
        let per_kind = |s: &Seen, kind: &str| {
            let counts: Vec<String> = ["ok", "ioerr", "other", "mismatches"]
                .iter()
                .filter_map(|o| Some(format!("{} {o}", s.0[kind][o].as_u64()?)))
                .collect();
            format!("{kind} {}", counts.join(" "))
        };
        let steps: Vec<String> = self
            .steps
            .iter()
            .map(|s| {
                let kinds: Vec<String> =
                    ["writes", "reads", "control"].iter().map(|k| per_kind(s, k)).collect();
                format!("step {} ({} rounds): {}", s.0["step"], s.rounds(), kinds.join(", "))
            })
            .collect();
        let host = self.host_io_errors.map_or("-".to_string(), |n| n.to_string());
        let frontend = match frontend {
            Frontend::Exitless => "exitless run",
            Frontend::VhostUser => "exitless vhost-user-blk",
        };
        println!(
            "fault {fault} ({frontend}): guest IOERRs {}, host counted {host}; {}",
            self.guest_ioerrs(),
            steps.join("; ")
        );
    }

    /// The errors stayed on the disk under test: the control disk served every step, and the host
    /// counted the errors the guest saw, on the disk under test only.
    fn errors_stayed_on_the_faulty_disk(&self) {
        for step in &self.steps {
            step.control_served();
        }
        if let Some(counted) = self.host_io_errors {
            assert_eq!(counted, self.guest_ioerrs(), "host-side I/O errors vs what the guest saw");
        }
        if let Some(counted) = self.control_host_io_errors {
            assert_eq!(counted, 0, "the control disk had no errors");
        }
    }
}

impl Faulty {
    /// Boot the guest on a sparse file of `bytes` in a new 16 MiB ext4 file system mounted with
    /// `options`: the file system, the file and the guest.
    fn on_ext4(frontend: Frontend, options: &str, bytes: u64) -> (Ext4, PathBuf, Faulty) {
        let fs = Ext4::mount(16, options);
        let disk = fs.path("disk.img");
        std::fs::File::create(&disk).unwrap().set_len(bytes).unwrap();
        let vm = Faulty::start(frontend, &disk);
        (fs, disk, vm)
    }

    /// Boot the guest on `disk` (a file) with a fresh control disk; it waits for step 1.
    fn start(frontend: Frontend, disk: &Path) -> Faulty {
        let control = Control::new();
        let dir = tempfile::tempdir().unwrap();
        let cmdline = format!("probe.workload=blk-faults probe.seed={SEED} probe.qd=4 probe.min_rounds=3");
        let (guest, daemon) = match frontend {
            Frontend::Exitless => {
                let mut command = Command::new(env!("CARGO_BIN_EXE_exitless"));
                command
                    .args([
                        "run",
                        "--probe",
                        "--io-mode",
                        "exitless",
                        "--timeout",
                        "240",
                        "--stats",
                        "--json",
                    ])
                    .args(["--disk", &format!("path={},direct", disk.display())])
                    .args(["--disk", &format!("ram,path={}", control.0.display())])
                    .args(["--cmdline", &cmdline]);
                (Console::spawn(&mut command, &dir.path().join("exitless.err")), None)
            }
            Frontend::VhostUser => {
                let socket = dir.path().join("vhost.sock");
                let daemon = Daemon::builder()
                    .io_mode("adaptive")
                    .socket(&socket)
                    .disk(&format!("path={},direct", disk.display()))
                    .start_console(&dir.path().join("daemon.err"));
                let elf = test_infra::probe_elf(dir.path());
                // The probe counts microvm's virtio-mmio devices in the order they are given: the
                // disk under test first, the control disk second.
                let guest = Qemu::probe(&elf, "256M", &cmdline)
                    .vhost_user_blk(&socket)
                    .drive(&control.0)
                    .spawn_console(&dir.path().join("qemu.err"));
                (guest, Some(daemon))
            }
        };
        let mut faulty = Faulty { frontend, guest, daemon, control, dir };
        let first = faulty.guest.wait_for(STEP_TIMEOUT, |l| l.contains("capacity_bytes"));
        let first: Value = serde_json::from_str(&first).unwrap();
        assert_eq!(first["control_capacity_bytes"], BLOCK, "the control disk is the probe's second: {first}");
        faulty
    }

    /// Ask for a step and wait until the guest has run its minimum rounds of it.
    fn step(&mut self, step: u64, write: Range, read: Range) {
        self.control.set(step, write, read);
        let ready = format!("{{\"probe\":\"blk-faults\",\"ready\":{step}}}");
        self.guest.wait_for(STEP_TIMEOUT, |l| l == ready);
    }

    /// Stop the guest (and the daemon); what each side saw.
    fn stop(mut self) -> Outcome {
        self.control.set(control::STOP, NONE, NONE);
        let (status, lines) = self.guest.finish(STEP_TIMEOUT);
        let lines: Vec<Value> = lines.iter().filter_map(|l| serde_json::from_str(l).ok()).collect();
        let steps: Vec<Seen> = lines
            .iter()
            .filter(|l| l["probe"] == "blk-faults" && l["step"].is_u64())
            .cloned()
            .map(Seen)
            .collect();
        let mut outcome = Outcome { steps, host_io_errors: None, control_host_io_errors: None };
        match self.frontend {
            Frontend::Exitless => {
                let log = std::fs::read_to_string(self.dir.path().join("exitless.err")).unwrap();
                assert_eq!(status.code(), Some(0), "the probe ended OK: {lines:?} {log}");
                assert!(!log.contains("panicked"), "{log}");
                let stats = lines.iter().find(|l| l["exitless"] == "run").expect("the --stats --json line");
                let devices = stats["devices"].as_array().expect("the device counters");
                let errors = |i: usize| devices[i]["io_errors"].as_u64().expect("io_errors");
                outcome.host_io_errors = Some(errors(0));
                outcome.control_host_io_errors = Some(errors(1));
                for device in devices {
                    assert_eq!(device["needs_reset"], 0, "a file error is no reason to reset: {device}");
                }
            }
            Frontend::VhostUser => {
                // QEMU reports a debug-exit write of V as (V << 1) | 1.
                assert_eq!(status.code(), Some(1), "the probe ended OK: {lines:?}");
                let daemon = self.daemon.take().unwrap();
                // SAFETY: kill(2) on our own child.
                unsafe { libc::kill(daemon.pid(), libc::SIGTERM) };
                let log_path = self.dir.path().join("daemon.err");
                let (status, _) = daemon.finish(STEP_TIMEOUT);
                let log = std::fs::read_to_string(log_path).unwrap();
                assert_eq!(status.code(), Some(0), "the daemon ends cleanly on SIGTERM: {log}");
                assert!(!log.contains("panicked"), "{log}");
                outcome.host_io_errors = Some(daemon_io_errors(&log));
            }
        }
        outcome
    }
}

/// The I/O errors of every vring, from the daemon's "vring N stopped ..." log lines.
fn daemon_io_errors(log: &str) -> u64 {
    log.lines()
        .filter_map(|l| {
            l.split_once(" requests completed, ")?.1.split(" I/O errors").next()?.parse::<u64>().ok()
        })
        .sum()
}

/// The first `blocks` blocks from `first` of `path` hold the probe's pattern.
fn assert_holds_pattern(path: &Path, (first, blocks): Range) {
    let bytes = std::fs::read(path).unwrap();
    for block in first..first + blocks {
        let data = &bytes[(block * BLOCK) as usize..][..BLOCK as usize];
        assert!(probe_abi::pattern::check(SEED, block * 8, data), "block {block} of {}", path.display());
    }
}

/// A sparse disk four times the size of its file system: once the space is gone, writes to
/// blocks not yet allocated fail (all but a few), blocks already written stay readable, and
/// writes work again once the space is freed.
fn out_of_space(frontend: Frontend) {
    let _one = test_infra::one_at_a_time();
    let (fs, disk, mut vm) = Faulty::on_ext4(frontend, "errors=continue", 64 << 20);
    let (written, fresh) = ((0, 64), (4096, 64));
    vm.step(1, written, written);
    vm.step(2, NONE, NONE);
    let filler = fs.fill();
    vm.step(3, fresh, written);
    std::fs::remove_file(filler).unwrap();
    fs.sync();
    vm.step(4, fresh, fresh);
    let outcome = vm.stop();
    let (before, full, freed) = (outcome.step(1), outcome.step(3), outcome.step(4));
    before.all("writes", "ok", 64);
    before.all("reads", "ok", 64);
    // Not every write fails: ext4 still finds a few blocks (for metadata, from the journal's
    // late frees) that a filler file cannot take; which ones varies from run to run.
    full.some_failed("writes", 64);
    full.all("reads", "ok", 64);
    freed.all("writes", "ok", 64);
    freed.all("reads", "ok", 64);
    outcome.errors_stayed_on_the_faulty_disk();
    assert_holds_pattern(&disk, written);
    assert_holds_pattern(&disk, fresh);
    outcome.print("out of space", frontend);
}

/// The file is cut to half its blocks: reads beyond the new end fail (a short read is no
/// success), reads before it still work, and writing the lost half back makes it readable.
fn truncated(frontend: Frontend) {
    let _one = test_infra::one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let disk = test_infra::disk_file(dir.path(), "disk.img", 128 * BLOCK);
    let mut vm = Faulty::start(frontend, &disk);
    let (all, lost) = ((0, 128), (64, 64));
    vm.step(1, all, all);
    vm.step(2, NONE, NONE);
    std::fs::OpenOptions::new().write(true).open(&disk).unwrap().set_len(64 * BLOCK).unwrap();
    vm.step(3, NONE, all);
    vm.step(4, lost, all);
    let outcome = vm.stop();
    outcome.step(1).all("reads", "ok", 128);
    let cut = outcome.step(3);
    assert_eq!(cut.count("reads", "ok"), cut.rounds() * 64, "the blocks still in the file: {}", cut.0);
    assert_eq!(cut.count("reads", "ioerr"), cut.rounds() * 64, "the blocks cut off: {}", cut.0);
    assert_eq!(cut.count("reads", "mismatches") + cut.count("reads", "other"), 0, "{}", cut.0);
    outcome.step(4).all("writes", "ok", 64);
    outcome.step(4).all("reads", "ok", 128);
    outcome.errors_stayed_on_the_faulty_disk();
    assert_holds_pattern(&disk, all);
    outcome.print("truncated file", frontend);
}

/// The file system turns read-only under the guest. Linux refuses `mount -o remount,ro` while a
/// file is open for writing (EBUSY: the VMM holds the disk open), so the file system is made to
/// turn read-only the way a failing disk does: ext4 `errors=remount-ro` and an error (sysfs
/// `trigger_fs_error`). Writes fail from then on; reads keep working, and keep working after
/// the writes failed.
fn turned_read_only(frontend: Frontend) {
    let _one = test_infra::one_at_a_time();
    let (fs, disk, mut vm) = Faulty::on_ext4(frontend, "errors=remount-ro", 1 << 20);
    let written = (0, 64);
    vm.step(1, written, written);
    vm.step(2, NONE, NONE);
    let remount = Command::new("mount").args(["-o", "remount,ro"]).arg(&fs.mount_point).output().unwrap();
    if !remount.status.success() {
        let trigger = format!("/sys/fs/ext4/{}/trigger_fs_error", fs.device());
        std::fs::write(&trigger, "1").unwrap_or_else(|e| panic!("{trigger}: {e}"));
    }
    vm.step(3, written, written);
    vm.step(4, NONE, written);
    let outcome = vm.stop();
    outcome.step(1).all("writes", "ok", 64);
    outcome.step(3).all("writes", "ioerr", 64);
    outcome.step(3).all("reads", "ok", 64);
    outcome.step(4).all("reads", "ok", 64);
    outcome.errors_stayed_on_the_faulty_disk();
    assert_holds_pattern(&disk, written);
    outcome.print("file system turned read-only", frontend);
}

test_infra::tests! {
    out_of_space_fails_the_writes_that_need_space_and_the_disk_recovers =>
        out_of_space(Frontend::Exitless);
    a_truncated_file_fails_reads_past_its_end_and_the_disk_recovers => truncated(Frontend::Exitless);
    a_file_system_turned_read_only_fails_writes_and_keeps_reads => turned_read_only(Frontend::Exitless);
    vhost_user_out_of_space_fails_the_writes_that_need_space_and_the_disk_recovers =>
        out_of_space(Frontend::VhostUser);
    vhost_user_a_truncated_file_fails_reads_past_its_end_and_the_disk_recovers =>
        truncated(Frontend::VhostUser);
    vhost_user_a_file_system_turned_read_only_fails_writes_and_keeps_reads =>
        turned_read_only(Frontend::VhostUser);
}
