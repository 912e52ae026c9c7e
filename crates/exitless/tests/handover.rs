//! `exitless vhost-user-blk --handover-socket`: the daemon replaced under a running guest by a
//! successor that takes its sockets, its frontend's connection and the session over, so the
//! frontend never reconnects. Real KVM and QEMU; behaviour and counts, not timings.
//!
//! - QEMU-KVM (the probe guest, a reconnecting chardev as in `bench upgrade`) doing a verify run
//!   on an O_DIRECT file disk while the daemon is replaced three times: no I/O error, the verify
//!   passes, the daemons logged one frontend connection over the whole run and no hang-up, QEMU
//!   logged none either, each old daemon exits 0.
//! - The exitless VMM as the frontend: the same across a hand-over, and the frontend counts no
//!   reconnection.
//! - Refusals: a successor with other disks is refused with one line and exits with the failure status; a successor
//!   that dies after the old daemon drained and sent its state, one that connects and closes,
//!   and one that sends nonsense leave the old daemon serving (the guest's verify passes, no
//!   reconnection); a real hand-over then still works.
//! - The NIC daemon: a successor with other NICs is refused; one with the same NICs takes them.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Output};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use test_infra::daemon::Daemon;
use test_infra::qemu::Qemu;
use test_infra::{exitless_within, json_lines, line_with, stderr, verify_cmdline};

/// A hang guard for a daemon's exit or a guest's first write.
const WAIT: Duration = Duration::from_secs(60);
/// The disk: the verify runs' blocks fit in it.
const DISK_BYTES: u64 = 64 << 20;
/// The daemons' rate limit, so that a verify run lasts long enough for the hand-overs in it.
const IOPS: u32 = 2000;

/// The test's files: the disk, the sockets, the logs.
struct Rig {
    dir: tempfile::TempDir,
    disk: PathBuf,
    socket: PathBuf,
    handover: PathBuf,
}

impl Rig {
    fn new() -> Rig {
        let dir = tempfile::tempdir_in("/tmp").unwrap();
        let disk = test_infra::disk_file(dir.path(), "disk.img", DISK_BYTES);
        let socket = dir.path().join("vu.sock");
        let handover = dir.path().join("handover.sock");
        Rig { dir, disk, socket, handover }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn disk_spec(&self, file: &Path) -> String {
        format!("path={},direct,iops={IOPS}", file.display())
    }

    /// The first daemon, and the exitless VMM verifying `blocks` blocks with `seed` on it
    /// (`exitless_guest`), once the guest has begun writing.
    fn first_daemon_under_verify(&self, blocks: u64, seed: u64) -> (Daemon, JoinHandle<Output>) {
        let daemon = self.first_daemon();
        let before = modified(&self.disk);
        let vm = exitless_guest(&self.socket, verify(blocks, seed));
        self.wait_for_first_write(before);
        (daemon, vm)
    }

    /// The first daemon: returns once it listens on the disk's socket and the hand-over socket.
    fn first_daemon(&self) -> Daemon {
        Daemon::builder()
            .disk_on(&self.socket, &self.disk_spec(&self.disk))
            .args(&["--handover-socket".as_ref(), self.handover.as_os_str()], &[&self.handover])
            .start(&self.path("daemon0.log"))
    }

    /// A successor, started with `file` as its disk, and `env` set: it connects to the running
    /// daemon at once (the sockets exist).
    fn successor(&self, round: usize, file: &Path, env: Option<(&str, &str)>) -> Daemon {
        let mut builder = Daemon::builder()
            .disk_on(&self.socket, &self.disk_spec(file))
            .args(&["--handover-socket".as_ref(), self.handover.as_os_str()], &[]);
        if let Some((key, value)) = env {
            builder = builder.env(key, value);
        }
        builder.start(&self.path(&format!("daemon{round}.log")))
    }

    /// Start a successor and wait for the old daemon to exit 0: the successor serves now.
    fn hand_over(&self, old: Daemon, round: usize) -> (Daemon, String) {
        let mut new = self.successor(round, &self.disk, None);
        let mut old = old;
        let status = wait_exit(&mut old);
        let log = old.log();
        assert_eq!(
            status.code(),
            Some(0),
            "the old daemon's exit; its log: {log}\nthe new one's: {}",
            new.log()
        );
        assert!(log.contains("handed every disk over to the successor"), "{log}");
        new.assert_alive();
        (new, log)
    }

    /// Wait until the guest has written to the disk (its verify run is under way).
    fn wait_for_first_write(&self, before: SystemTime) {
        let deadline = Instant::now() + WAIT;
        while modified(&self.disk) <= before {
            assert!(Instant::now() < deadline, "the guest wrote nothing within {WAIT:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn modified(path: &Path) -> SystemTime {
    std::fs::metadata(path).and_then(|m| m.modified()).unwrap()
}

/// Wait (within `WAIT`) for a daemon to exit by itself.
fn wait_exit(daemon: &mut Daemon) -> ExitStatus {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(status) = daemon.child().try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "the daemon did not exit within {WAIT:?}: {}", daemon.log());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The guests' verify across hand-overs: `blocks` blocks at depth 4 with `seed`.
fn verify(blocks: u64, seed: u64) -> String {
    format!("{} probe.bs=4096 probe.timeout_ms=30000", verify_cmdline(blocks, 4, seed))
}

/// The exitless VMM on the disk (reconnecting, so that a reconnection would be counted rather
/// than fatal), in a thread: its output.
fn exitless_guest(socket: &Path, cmdline: String) -> JoinHandle<Output> {
    let disk = format!("vhost-user={},reconnect=10", socket.display());
    std::thread::spawn(move || {
        let args = ["run", "--probe", "--io-mode", "eventfd", "--disk", &disk, "--cmdline", &cmdline];
        exitless_within(
            Duration::from_secs(180),
            &[&args[..], &["--timeout", "150", "--stats", "--json"]].concat(),
        )
    })
}

/// The exitless guest's run passed its verify, and its frontend never reconnected.
fn assert_verified_without_reconnection(out: &std::process::Output, logs: &str) {
    assert_eq!(out.status.code(), Some(0), "{}\n{logs}", stderr(out));
    let result = line_with(out, "probe", "blk");
    assert_eq!((result["errors"].as_u64(), result["mismatches"].as_u64()), (Some(0), Some(0)), "{result}");
    let stats = json_lines(out).into_iter().find(|l| l["exitless"] == "run").expect("stats line");
    let device = &stats["devices"][0];
    assert_eq!(device["reconnections"], 0, "{device}\n{}\n{logs}", stderr(out));
    assert_eq!(device["daemon_gone"], false, "{device}");
    assert_eq!(device["needs_reset"], 0, "{device}");
}

fn connections(log: &str) -> usize {
    log.matches("frontend connected").count()
}

#[test]
fn a_qemu_guest_keeps_its_connection_through_three_handovers() {
    let _one = test_infra::one_at_a_time();
    let rig = Rig::new();
    let elf = test_infra::probe_elf(rig.dir.path());
    let mut daemon = rig.first_daemon();
    // 12000 blocks written then read back at 2000 requests/s: a run of several seconds, each
    // new daemon adding a second's burst.
    let (blocks, seed) = (12_000, 4242);
    let before = modified(&rig.disk);
    let guest = Qemu::probe(&elf, "128M", &verify(blocks, seed))
        .vhost_user_blk_with(&rig.socket, ",reconnect=1", ",queue-size=256")
        .spawn_console(&rig.path("qemu.err"));
    rig.wait_for_first_write(before);
    let mut logs = Vec::new();
    for round in 1..=3 {
        std::thread::sleep(Duration::from_millis(300));
        let (new, log) = rig.hand_over(daemon, round);
        logs.push(log);
        daemon = new;
    }
    let (status, console) = guest.finish(Duration::from_secs(180));
    let last = daemon.stop();
    logs.push(last);
    let all = logs.join("\n----\n");
    // QEMU exits with (V << 1) | 1 for the probe's exit value V (0: verified).
    assert_eq!(status.code(), Some(1), "{}\n{all}", console.join("\n"));
    let result = console
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["probe"] == "blk")
        .expect("the probe's result line");
    assert_eq!((result["errors"].as_u64(), result["mismatches"].as_u64()), (Some(0), Some(0)), "{result}");
    assert_eq!(result["ops"].as_u64(), Some(2 * blocks), "{result}");
    // QEMU connected once, to the first daemon; each successor took its connection over.
    assert_eq!(logs.iter().map(|l| connections(l)).sum::<usize>(), 1, "{all}");
    assert_eq!(connections(&logs[0]), 1, "{all}");
    for log in &logs[1..] {
        assert!(log.contains("took over the frontend's connection"), "{log}");
    }
    // Nor did QEMU see its back-end go: after a hang-up 7.2 says "Failed to set msg fds." and
    // "vhost VQ 0 ring restore failed" as it stops the device.
    let qemu_err = std::fs::read_to_string(rig.path("qemu.err")).unwrap();
    assert!(!qemu_err.contains("vhost") && !qemu_err.contains("msg fds"), "{qemu_err}");
    // No daemon saw the frontend go but the last, when QEMU exited.
    for log in &logs[..3] {
        assert!(!log.contains("frontend disconnected"), "{log}");
        // Drained before the hand-over: nothing left in flight.
        assert!(
            log.contains("rings stopped for a hand-over; the in-flight region marks 0 request(s)"),
            "{log}"
        );
    }
    test_infra::assert_holds_pattern(&rig.disk, seed, blocks);
}

#[test]
fn the_exitless_frontend_counts_no_reconnection_across_handovers() {
    let _one = test_infra::one_at_a_time();
    let rig = Rig::new();
    let (blocks, seed) = (8000, 99);
    let (mut daemon, vm) = rig.first_daemon_under_verify(blocks, seed);
    let mut logs = Vec::new();
    for round in 1..=2 {
        std::thread::sleep(Duration::from_millis(300));
        let (new, log) = rig.hand_over(daemon, round);
        logs.push(log);
        daemon = new;
    }
    let out = vm.join().unwrap();
    logs.push(daemon.stop());
    let all = logs.join("\n----\n");
    assert_verified_without_reconnection(&out, &all);
    assert_eq!(logs.iter().map(|l| connections(l)).sum::<usize>(), 1, "{all}");
    test_infra::assert_holds_pattern(&rig.disk, seed, blocks);
}

#[test]
fn refused_and_failed_handovers_leave_the_old_daemon_serving() {
    let _one = test_infra::one_at_a_time();
    let rig = Rig::new();
    let (blocks, seed) = (8000, 7);
    let (mut daemon, vm) = rig.first_daemon_under_verify(blocks, seed);

    // Another disk file: refused with one line, the successor exits with the failure status.
    let other = test_infra::disk_file(rig.dir.path(), "other.img", DISK_BYTES);
    let mut refused = rig.successor(1, &other, None);
    let status = wait_exit(&mut refused);
    let said = refused.log();
    // exitless's failure status.
    assert_eq!(status.code(), Some(125), "{said}");
    let line = said.lines().find(|l| l.contains("error:")).unwrap_or_default();
    assert!(line.contains("refused") && line.contains("disk 0 differs"), "{said}");
    daemon.assert_alive();

    // A successor that takes the state (the old daemon has drained and stopped its ring) and
    // dies before it says it is ready: the old daemon starts its ring again.
    let exit_before_ready = ("EXITLESS_TEST_HANDOVER_EXIT_BEFORE_READY", "1");
    let mut dying = rig.successor(2, &rig.disk, Some(exit_before_ready));
    assert_eq!(wait_exit(&mut dying).code(), Some(3), "{}", dying.log());
    // One that connects and closes, and one that sends what is not a hand-over request.
    drop(std::os::unix::net::UnixStream::connect(&rig.handover).unwrap());
    {
        use std::io::Write;
        let mut nonsense = std::os::unix::net::UnixStream::connect(&rig.handover).unwrap();
        nonsense.write_all(&[0xff; 64]).unwrap();
        let _ = std::io::Read::read(&mut nonsense, &mut [0u8; 64]);
    }
    // A process of another user that reaches the socket (here made reachable to all) is
    // refused before anything is read from it or sent to it.
    connect_as_nobody(&rig);
    // Each failure is logged as the old daemon serves on, in order.
    let deadline = Instant::now() + WAIT;
    while daemon.log().matches("hand-over to the successor").count() < 4 {
        assert!(Instant::now() < deadline, "{}", daemon.log());
        daemon.assert_alive();
        std::thread::sleep(Duration::from_millis(10));
    }
    let log = daemon.log();
    assert!(log.contains("did not happen: refused: disk 0 differs"), "{log}");
    assert!(log.contains("the hand-over did not happen; serving on"), "the ring started again: {log}");
    assert!(log.contains("the other daemon closed the hand-over channel"), "{log}");
    assert!(log.contains("refused a successor of another user (uid 65534"), "{log}");

    // And a real hand-over still works after all that.
    let (new, old_log) = rig.hand_over(daemon, 3);
    let out = vm.join().unwrap();
    let all = format!("{old_log}\n----\n{}", new.stop());
    assert_verified_without_reconnection(&out, &all);
    assert_eq!(connections(&all), 1, "{all}");
    test_infra::assert_holds_pattern(&rig.disk, seed, blocks);
}

/// Connect to the hand-over socket as user nobody (65534), once the test has let every user
/// reach it (the daemon makes it its owner's alone), and wait for the daemon to close it.
fn connect_as_nobody(rig: &Rig) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(rig.dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&rig.handover, std::fs::Permissions::from_mode(0o666)).unwrap();
    let connect = "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); \
                   sys.exit(0 if s.recv(1) == b'' else 1)";
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", connect])
        .arg(&rig.handover)
        .output()
        .expect("setpriv (util-linux) and /usr/bin/python3 (scripts/setup.sh installs both)");
    assert!(out.status.success(), "nobody's connection: {}", String::from_utf8_lossy(&out.stderr));
}

/// `exitless vhost-user-net --handover-socket`: a successor with other NICs is refused with one
/// line and exits with the failure status, the old daemon serving on; one with the same NICs
/// takes them over (no frontend connected), the old one exits 0, and the successor serves the
/// sockets. (`linux_net.rs` hands NICs over under a TCP transfer between two Linux guests.)
#[test]
fn a_nic_daemon_hands_over_only_to_a_successor_with_the_same_nics() {
    let _shared = test_infra::alongside_others();
    use test_infra::console::Console;
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let (socket, handover) = (dir.path().join("a.net"), dir.path().join("handover.sock"));
    let daemon = |mac: &str, log: &str| {
        let mut command = std::process::Command::new(test_infra::exitless_bin());
        command.arg("vhost-user-net").arg("--nic").arg(format!("socket={},mac={mac}", socket.display()));
        command.arg("--handover-socket").arg(&handover);
        Console::spawn(&mut command, &dir.path().join(log))
    };
    let mut old = daemon("52:54:00:00:00:01", "old.log");
    let deadline = Instant::now() + WAIT;
    while !(socket.exists() && handover.exists()) {
        old.assert_running("the first daemon");
        assert!(Instant::now() < deadline, "no sockets: {}", old.stderr());
        std::thread::sleep(Duration::from_millis(10));
    }
    let (status, _) = daemon("52:54:00:00:00:02", "refused.log").finish(WAIT);
    let said = std::fs::read_to_string(dir.path().join("refused.log")).unwrap();
    assert_eq!(status.code(), Some(125), "{said}");
    let line = said.lines().find(|l| l.contains("error:")).unwrap_or_default();
    assert!(line.contains("refused") && line.contains("NIC 0 differs"), "{said}");
    old.assert_running("the old daemon, after a refusal");

    let mut new = daemon("52:54:00:00:00:01", "new.log");
    let (status, _) = old.finish(WAIT);
    let log = std::fs::read_to_string(dir.path().join("old.log")).unwrap();
    assert!(status.success(), "the old daemon's exit: {status}\n{log}");
    assert!(log.contains("refused: NIC 0 differs"), "{log}");
    assert!(log.contains("handed every NIC over to the successor"), "{log}");
    let deadline = Instant::now() + WAIT;
    while !new.stderr().contains("took every NIC over") {
        new.assert_running("the successor");
        assert!(Instant::now() < deadline, "{}", new.stderr());
        std::thread::sleep(Duration::from_millis(10));
    }
    // The socket is the successor's now: a frontend's connection is accepted there.
    std::os::unix::net::UnixStream::connect(&socket).expect("the NIC's socket answers");
    assert!(handover.exists(), "the successor listens on the hand-over socket for its own");
}
