//! Restarting `exitless vhost-user-blk` under a running guest (QEMU with a reconnecting
//! chardev, a Linux guest under TCG) with requests in flight: VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD.
//!
//! - The out-of-order case: the guest writes block 1000, which a FUSE file system in front of the
//!   disk file (`held_disk.c`, built here against libfuse3) holds in the kernel, then reads block
//!   2000, which completes; the daemon is killed (SIGKILL) with the write still in flight behind a
//!   completed request, the held write is then failed to the dead daemon, and a new daemon is
//!   started on the same socket and disk file. It must resubmit the write: the guest's `dd`
//!   finishes and reads its data back, and the file holds it. (Without in-flight tracking QEMU
//!   rewinds the ring to the used index, which is past the write: it is never offered again and
//!   the guest hangs.)
//! - Restarts under load: fio with crc32c verify at queue depth 32 (libaio, O_DIRECT, on a file
//!   of an ext4 file system on the disk) while the daemon is killed with SIGKILL and started again
//!   `EXITLESS_INFLIGHT_RESTARTS` times (default `RESTARTS`; scripts/reliability.sh runs 20),
//!   each time with a request held by the FUSE server and so in flight: fio must finish with no
//!   I/O error and no failed verify, the guest's kernel log must hold no I/O error, and every
//!   daemon after a kill must resubmit requests.
//! - A graceful hand-over: SIGTERM while fio runs; the daemon finishes what it holds, leaves
//!   none marked in flight, exits 0, and a new daemon takes over. The longest pause the guest
//!   saw is printed (not asserted).
//! - Hand-overs without a hang-up (`--handover-socket`) while fio runs on the slow disk: each
//!   old daemon drains what it holds and exits 0, QEMU connects once over the whole run and sees
//!   no hang-up, and fio verifies.
//!
//! Needs root (FUSE mounts), libfuse3-dev and fuse3, a C compiler, QEMU, Debian's cloud kernel,
//! busybox-static, coreutils, e2fsprogs and fio: what scripts/setup.sh installs.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use test_infra::daemon::Daemon;
use test_infra::held_disk::HeldDisk;
use test_infra::linux::{initramfs_in, kernel, DD, FIO, INIT_PRELUDE};
use test_infra::qemu::Qemu;

/// A hang guard for one step of a guest under TCG on a shared machine.
const WAIT: Duration = Duration::from_secs(120);
const BLOCK: usize = 4096;

/// The block the out-of-order case holds: away from what the kernel reads as it probes the disk
/// (its partition table), which must not be held.
const HELD_BLOCK: u64 = 1000;

/// What the guest writes to `HELD_BLOCK` in the out-of-order case (busybox `yes | head -c 4096`).
const HELD_LINE: &str = "exitless in-flight write, held then resubmitted";

fn held_pattern() -> Vec<u8> {
    format!("{HELD_LINE}\n").repeat(BLOCK / HELD_LINE.len() + 1).into_bytes()[..BLOCK].to_vec()
}

/// The out-of-order guest: a write of block 1000 (held), then a read of block 2000 that
/// completes behind it; then it waits for the write and reads block 1000 back. coreutils' dd
/// for O_DIRECT.
const OUT_OF_ORDER_INIT: &str = r#"
DD=/usr/bin/dd
yes 'exitless in-flight write, held then resubmitted' | head -c 4096 > /pattern
$DD if=/pattern of=/dev/vda bs=4096 seek=1000 count=1 oflag=direct conv=notrunc 2>/tmp/first &
first=$!
# The read goes only once the write is in flight on the disk, however long dd takes to start.
while read reads writes < /sys/block/vda/inflight && [ "$writes" -eq 0 ]; do sleep 0.1; done
$DD if=/dev/vda of=/tmp/second bs=4096 skip=2000 count=1 iflag=direct 2>/tmp/second.err \
    && echo OOO-SECOND-DONE || { echo OOO-SECOND-FAILED; cat /tmp/second.err; }
wait $first
echo "OOO-FIRST-DONE rc=$?"
cat /tmp/first
$DD if=/dev/vda of=/tmp/back bs=4096 skip=1000 count=1 iflag=direct 2>/dev/null
cmp /pattern /tmp/back && echo OOO-VERIFY-OK || echo OOO-VERIFY-BAD
dmesg | grep -i -E 'i/o error|blk_update_request|critical' | sed 's/^/OOO-DMESG /'
echo OOO-END
poweroff -f
"#;

#[test]
fn a_write_held_behind_a_completed_read_is_resubmitted_by_the_next_daemon_after_kill_9() {
    let _one = test_infra::one_at_a_time();
    let kernel = kernel();
    let dir = tempfile::tempdir().unwrap();
    let initramfs = initramfs_in(dir.path(), &kernel, &format!("{INIT_PRELUDE}{OUT_OF_ORDER_INIT}"), &[DD]);
    let file = test_infra::disk_file(dir.path(), "disk.img", 16 << 20);
    let held = HeldDisk::start(dir.path(), &file, HELD_BLOCK * BLOCK as u64);
    held.hold();
    let socket = dir.path().join("vhost.sock");

    let first = Daemon::builder()
        .io_mode("adaptive")
        .socket(&socket)
        .disk(&format!("path={},direct", held.disk().display()))
        .start_console(&dir.path().join("daemon1.err"));
    let mut guest = Qemu::linux(&kernel, &initramfs, "256M", 1, "")
        .vhost_user_blk_with(&socket, ",reconnect=1", "")
        .spawn_console(&dir.path().join("qemu.err"));
    guest.wait_for(WAIT, |l| l.contains("OOO-SECOND-"));
    // The daemon handed the write to the kernel before the read behind it; the held disk may
    // record it a moment later.
    let held_request = format!("write {} 4096", HELD_BLOCK * BLOCK as u64);
    let deadline = Instant::now() + Duration::from_secs(30);
    while held.held().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(held.held(), Some(held_request), "the write of block {HELD_BLOCK} is held in the kernel");

    // SIGKILL: from here no thread of the daemon runs user code again, so the held write, once
    // let go (as a failure: it must not reach the file), is never answered to the guest.
    let pid = first.pid();
    // SAFETY: kill(2) on our own child, not yet waited for.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    held.release(true);
    let (status, _) = first.finish(WAIT);
    assert_eq!(status.signal(), Some(libc::SIGKILL), "the first daemon was killed");
    let held_bytes = |file: &Path| {
        let at = HELD_BLOCK as usize * BLOCK;
        std::fs::read(file).unwrap()[at..at + BLOCK].to_vec()
    };
    assert_ne!(held_bytes(&file), held_pattern(), "the held write did not land");

    // The next daemon, on the disk file itself now, the same socket.
    let second = Daemon::builder()
        .io_mode("adaptive")
        .socket(&socket)
        .disk(&format!("path={},direct", file.display()))
        .start(&dir.path().join("daemon2.err"));
    guest.wait_for(WAIT, |l| l.contains("OOO-END"));
    let (_, lines) = guest.finish(WAIT);
    let console = lines.join("\n");
    let log = second.stop();
    assert!(console.contains("OOO-SECOND-DONE"), "the read behind the held write completed: {console}");
    assert!(console.contains("OOO-FIRST-DONE rc=0"), "the held write completed after the restart: {console}");
    assert!(console.contains("OOO-VERIFY-OK"), "block {HELD_BLOCK} reads back as written: {console}");
    assert!(!console.contains("OOO-DMESG"), "no I/O error in the guest: {console}");
    assert!(
        log.contains("resubmitting 1 request(s) in flight"),
        "the new daemon resubmitted the write: {log}"
    );
    assert_eq!(held_bytes(&file), held_pattern(), "the disk file holds the write");
    println!("inflight out-of-order: the write held behind a completed read was resubmitted after kill -9");
}

/// Restarts of the load test by default (CI); `EXITLESS_INFLIGHT_RESTARTS` sets another
/// (scripts/reliability.sh: 20).
const RESTARTS: u64 = 3;

fn restarts() -> u64 {
    match std::env::var("EXITLESS_INFLIGHT_RESTARTS") {
        Ok(n) => n.parse().unwrap_or_else(|_| panic!("EXITLESS_INFLIGHT_RESTARTS={n}: not a number")),
        Err(_) => RESTARTS,
    }
}

/// The load guest: `inflight.runs=N` fio runs one after the other on /dev/vda (O_DIRECT, libaio,
/// queue depth 32, 4 KiB random writes over 16 MiB, each checked by crc32c as it is read back
/// during the run and at its end); each says FIO-RUN-START, FIO-RUN-IO once its first requests
/// are on the disk, and FIO-RUN-OK (with fio's completion latency lines) or FIO-RUN-FAIL; then
/// the kernel's I/O errors, if any.
const FIO_INIT: &str = r#"
runs=$(sed -n 's/.*inflight\.runs=\([0-9]*\).*/\1/p' /proc/cmdline)
r=1
while [ "$r" -le "$runs" ]; do
    echo "FIO-RUN-START $r"
    /usr/bin/fio --name=restart --filename=/dev/vda --direct=1 --ioengine=libaio --iodepth=32 \
        --rw=randwrite --bs=4k --size=16M --verify=crc32c --verify_fatal=1 --verify_backlog=256 \
        --randseed=$r > /tmp/fio 2>&1 &
    fio=$!
    # Once the run's requests are on the disk (however long fio takes to start).
    while kill -0 $fio 2>/dev/null && read reads writes < /sys/block/vda/inflight \
        && [ $((reads + writes)) -eq 0 ]; do sleep 0.05; done
    echo "FIO-RUN-IO $r"
    wait $fio
    rc=$?
    if [ $rc -ne 0 ] || [ "$(grep -c ': err= 0: ' /tmp/fio)" != 1 ] || grep -q -i 'verify' /tmp/fio; then
        cat /tmp/fio
        echo "FIO-RUN-FAIL $r rc=$rc"
        break
    fi
    grep -E '^ +(clat|lat) \((u|m|n)sec\)' /tmp/fio | sed "s/^ */FIO-LAT $r /"
    grep -E '^ +(READ|WRITE):' /tmp/fio | sed "s/^ */FIO-IO $r /"
    echo "FIO-RUN-OK $r"
    r=$((r + 1))
done
dmesg | grep -i -E 'i/o error|blk_update_request|critical|not a head' | sed 's/^/FIO-DMESG /'
echo FIO-END
poweroff -f
"#;

/// A Linux guest with fio, on `socket` with a reconnecting chardev, running `runs` fio runs.
fn fio_guest(dir: &Path, socket: &Path, runs: u64) -> test_infra::console::Console {
    let kernel = kernel();
    let initramfs = initramfs_in(dir, &kernel, &format!("{INIT_PRELUDE}{FIO_INIT}"), &[FIO]);
    // fio and its libraries (about 80 MB) are unpacked into the guest's RAM.
    Qemu::linux(&kernel, &initramfs, "512M", 1, &format!("inflight.runs={runs}"))
        .vhost_user_blk_with(socket, ",reconnect=1", "")
        .spawn_console(&dir.join("qemu.err"))
}

/// The daemon in `adaptive` mode serving `file` with O_DIRECT on `socket`, its standard output
/// read line by line and its log in `log`.
fn adaptive_daemon(socket: &Path, file: &Path, log: &Path) -> test_infra::console::Console {
    adaptive_daemon_on(socket, &format!("path={},direct", file.display()), log)
}

/// As `adaptive_daemon`, serving the `--disk` spec `disk`.
fn adaptive_daemon_on(socket: &Path, disk: &str, log: &Path) -> test_infra::console::Console {
    Daemon::builder().io_mode("adaptive").socket(socket).disk(disk).start_console(log)
}

/// What the guest's fio runs said: every run OK, no kernel I/O error.
fn check_fio(lines: &[String], runs: u64) -> String {
    let console = lines.join("\n");
    assert!(!console.contains("FIO-RUN-FAIL"), "a fio run failed: {console}");
    assert!(!console.contains("FIO-DMESG"), "the guest's kernel logged I/O errors: {console}");
    for run in 1..=runs {
        assert!(console.contains(&format!("FIO-RUN-OK {run}")), "fio run {run} did not finish: {console}");
    }
    console
}

/// "resubmitting N request(s)" summed over a daemon log.
fn resubmitted(log: &str) -> u64 {
    log.lines()
        .filter_map(|l| l.split("resubmitting ").nth(1))
        .filter_map(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// A 64 MiB disk file served through the FUSE file system, holding nothing back but answering
/// each write in turn after 1 ms (a slow disk), so that a daemon holds many of fio's 32 requests
/// at any moment; in a new directory that holds the daemons' socket and logs too.
struct SlowDisk {
    /// The mount, kept while the test runs.
    fuse: HeldDisk,
    /// The path to serve.
    disk: PathBuf,
    /// Where the daemons serve it.
    socket: PathBuf,
    /// Dropped last: it holds the mount point.
    dir: tempfile::TempDir,
}

impl SlowDisk {
    fn new() -> SlowDisk {
        let dir = tempfile::tempdir().unwrap();
        let file = test_infra::disk_file(dir.path(), "disk.img", 64 << 20);
        let fuse = HeldDisk::start_slow(dir.path(), &file, HELD_BLOCK * BLOCK as u64, 1000);
        let (disk, socket) = (fuse.disk(), dir.path().join("vhost.sock"));
        SlowDisk { fuse, disk, socket, dir }
    }
}

#[test]
fn fio_verify_at_depth_32_survives_the_daemon_killed_and_restarted_under_it() {
    let _one = test_infra::one_at_a_time();
    let restarts = restarts();
    let slow = SlowDisk::new();
    let (fuse, disk, socket, dir) = (&slow.fuse, &slow.disk, &slow.socket, slow.dir.path());
    let mut daemon = adaptive_daemon(socket, disk, &dir.join("daemon0.err"));
    let runs = restarts + 1;
    let mut guest = fio_guest(dir, socket, runs);
    let mut logs = String::new();
    for restart in 1..=restarts {
        guest.wait_for(WAIT, |l| l.contains(&format!("FIO-RUN-START {restart}")));
        // Into the run: the FUSE server holds fio's first request on HELD_BLOCK (each run
        // writes every block once, in random order), so the daemon is killed with requests in
        // flight however fast the run goes.
        fuse.hold();
        let deadline = Instant::now() + WAIT;
        while fuse.held().is_none() {
            assert!(Instant::now() < deadline, "restart {restart}: fio never reached block {HELD_BLOCK}");
            std::thread::sleep(Duration::from_millis(10));
        }
        let (status, _) = daemon.kill(WAIT);
        assert_eq!(status.signal(), Some(libc::SIGKILL), "restart {restart}: the daemon was killed");
        // The held request fails to the dead daemon, as a disk's answer to it would be lost.
        fuse.release(true);
        logs.push_str(&std::fs::read_to_string(dir.join(format!("daemon{}.err", restart - 1))).unwrap());
        daemon = adaptive_daemon(socket, disk, &dir.join(format!("daemon{restart}.err")));
    }
    guest.wait_for(WAIT, |l| l.contains("FIO-END"));
    let (_, lines) = guest.finish(WAIT);
    let (_, _) = daemon.kill(WAIT);
    logs.push_str(&std::fs::read_to_string(dir.join(format!("daemon{restarts}.err"))).unwrap());
    let console = check_fio(&lines, runs);
    // Each kill came with the held request, at least, in flight: every daemon after one had
    // requests to resubmit.
    for restart in 1..=restarts {
        let log = std::fs::read_to_string(dir.join(format!("daemon{restart}.err"))).unwrap();
        assert!(resubmitted(&log) > 0, "daemon {restart} resubmitted nothing after a kill: {log}");
    }
    let count = resubmitted(&logs);
    println!(
        "inflight restarts: {restarts} kill -9 restarts under fio verify at depth 32 ({runs} runs), 0 I/O errors, \
         0 failed verifies; the daemons resubmitted {count} request(s) in all"
    );
    for line in console.lines().filter(|l| l.contains("FIO-LAT") || l.contains("FIO-IO")) {
        println!("  {}", line.trim());
    }
}

#[test]
fn sigterm_hands_the_disk_over_to_the_next_daemon_under_fio() {
    let _one = test_infra::one_at_a_time();
    // The daemon holds requests when SIGTERM comes.
    let slow = SlowDisk::new();
    let (disk, socket, dir) = (&slow.disk, &slow.socket, slow.dir.path());
    let first = adaptive_daemon(socket, disk, &dir.join("daemon0.err"));
    let runs = 2;
    let mut guest = fio_guest(dir, socket, runs);
    guest.wait_for(WAIT, |l| l.contains("FIO-RUN-START 1"));
    std::thread::sleep(Duration::from_millis(1500));

    let sent = Instant::now();
    // SAFETY: kill(2) on our own child, not yet waited for.
    unsafe { libc::kill(first.pid(), libc::SIGTERM) };
    let (status, _) = first.finish(WAIT);
    let stopped = sent.elapsed();
    let second = adaptive_daemon(socket, disk, &dir.join("daemon1.err"));
    let taken_over = sent.elapsed();
    assert_eq!(status.code(), Some(0), "the first daemon exits 0 on SIGTERM");
    let first_log = std::fs::read_to_string(dir.join("daemon0.err")).unwrap();
    assert!(
        first_log.contains("marks 0 request(s) in flight as the connection ends"),
        "the first daemon finished every request it held: {first_log}"
    );

    guest.wait_for(WAIT, |l| l.contains("FIO-END"));
    let (_, lines) = guest.finish(WAIT);
    let (_, _) = second.kill(WAIT);
    let second_log = std::fs::read_to_string(dir.join("daemon1.err")).unwrap();
    let console = check_fio(&lines, runs);
    assert_eq!(resubmitted(&second_log), 0, "nothing was left to resubmit: {second_log}");
    assert!(second_log.contains("frontend connected"), "QEMU reconnected to the next daemon: {second_log}");
    println!(
        "inflight hand-over: SIGTERM to exit {} ms, SIGTERM to the next daemon listening {} ms; fio run 1 \
         (across the hand-over) completion latencies:",
        stopped.as_millis(),
        taken_over.as_millis()
    );
    for line in console.lines().filter(|l| l.contains("FIO-LAT 1 ") && l.contains("max=")) {
        println!("  {}", line.trim());
    }
}

/// A daemon with `--handover-socket handover`: the first one listens there, the next ones take
/// its disk and QEMU's connection over.
fn start_handover_daemon(
    socket: &Path,
    file: &Path,
    handover: &Path,
    log: &Path,
) -> test_infra::console::Console {
    // The first one is waited for until it listens there too.
    let listens: Vec<&Path> = if handover.exists() { vec![] } else { vec![handover] };
    Daemon::builder()
        .io_mode("adaptive")
        .socket(socket)
        .disk(&format!("path={},direct", file.display()))
        .args(&["--handover-socket".as_ref(), handover.as_os_str()], &listens)
        .start_console(log)
}

#[test]
fn handovers_under_fio_keep_the_linux_guests_connection_and_drain_what_the_disk_holds() {
    let _one = test_infra::one_at_a_time();
    // The daemon holds many of fio's 32 requests when it hands over.
    let slow = SlowDisk::new();
    let (disk, socket, dir) = (&slow.disk, &slow.socket, slow.dir.path());
    let handover = dir.join("handover.sock");
    let log = |n: usize| dir.join(format!("daemon{n}.err"));
    let mut daemon = start_handover_daemon(socket, disk, &handover, &log(0));
    let runs = 2;
    let mut guest = fio_guest(dir, socket, runs);
    guest.wait_for(WAIT, |l| l.contains("FIO-RUN-START 1"));
    for round in 1..=2 {
        std::thread::sleep(Duration::from_millis(1000));
        let next = start_handover_daemon(socket, disk, &handover, &log(round));
        let (status, _) = daemon.finish(WAIT);
        let old_log = std::fs::read_to_string(log(round - 1)).unwrap();
        assert_eq!(status.code(), Some(0), "the old daemon exits 0 after the hand-over: {old_log}");
        assert!(
            old_log.contains("rings stopped for a hand-over; the in-flight region marks 0 request(s)"),
            "the old daemon finished every request it held before handing over: {old_log}"
        );
        daemon = next;
    }
    guest.wait_for(WAIT, |l| l.contains("FIO-END"));
    let (_, lines) = guest.finish(WAIT);
    let (_, _) = daemon.kill(WAIT);
    check_fio(&lines, runs);
    let logs: Vec<String> = (0..=2).map(|n| std::fs::read_to_string(log(n)).unwrap()).collect();
    let all = logs.join("\n----\n");
    // QEMU connected once; each successor took its connection over and had nothing to resubmit.
    assert_eq!(all.matches("frontend connected").count(), 1, "{all}");
    for successor in &logs[1..] {
        assert!(successor.contains("took over the frontend's connection"), "{successor}");
        assert_eq!(resubmitted(successor), 0, "{successor}");
    }
    let qemu_err = std::fs::read_to_string(dir.join("qemu.err")).unwrap();
    assert!(!qemu_err.contains("msg fds") && !qemu_err.contains("ring restore failed"), "{qemu_err}");
}

/// The same under fio on an RBD image: before each kill the cluster's OSD stops, so that the
/// guest's requests stay in flight in librbd however fast the cluster is; the OSD starts again,
/// a new daemon opens the image, resubmits them and, to write, takes the image's exclusive lock
/// from the killed one (librbd breaks a dead owner's lock once the cluster has timed its watch
/// out).
#[test]
fn fio_verify_on_an_rbd_image_survives_the_daemon_killed_with_requests_in_the_cluster() {
    let _one = test_infra::one_at_a_time();
    let restarts = restarts().min(RESTARTS);
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let cluster = storage::testing::ceph::TestCluster::own("inflight");
    cluster.image("inflight", 64 << 20);
    let disk = format!("rbd=rbd/inflight,conf={}", cluster.conf().display());
    let socket = dir.join("vhost.sock");
    let mut daemon = adaptive_daemon_on(&socket, &disk, &dir.join("daemon0.err"));
    let runs = restarts + 1;
    let mut guest = fio_guest(dir, &socket, runs);
    for restart in 1..=restarts {
        guest.wait_for(WAIT, |l| l.contains(&format!("FIO-RUN-START {restart}")));
        // Stopped before the run's requests reach the daemon (on a loaded host fio takes
        // seconds to start), so that none of them finishes: the daemon is killed holding them.
        cluster.osd(false);
        guest.wait_for(WAIT, |l| l.contains(&format!("FIO-RUN-IO {restart}")));
        let (status, _) = daemon.kill(WAIT);
        assert_eq!(status.signal(), Some(libc::SIGKILL), "restart {restart}: the daemon was killed");
        cluster.osd(true);
        daemon = adaptive_daemon_on(&socket, &disk, &dir.join(format!("daemon{restart}.err")));
    }
    guest.wait_for(WAIT * 2, |l| l.contains("FIO-END"));
    let (_, lines) = guest.finish(WAIT);
    let (_, _) = daemon.kill(WAIT);
    check_fio(&lines, runs);
    let mut count = 0;
    for restart in 1..=restarts {
        let log = std::fs::read_to_string(dir.join(format!("daemon{restart}.err"))).unwrap();
        assert!(resubmitted(&log) > 0, "daemon {restart} resubmitted nothing after a kill: {log}");
        count += resubmitted(&log);
    }
    println!(
        "inflight restarts on RBD: {restarts} kill -9 restarts with the OSD stopped under fio verify at depth 32, \
         0 I/O errors, 0 failed verifies; the daemons resubmitted {count} request(s) in all"
    );
}
