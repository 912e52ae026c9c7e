//! The cache mode (VIRTIO_BLK_F_CONFIG_WCE) as a Linux guest switches it, against the daemon
//! (`exitless vhost-user-blk`, a buffered file disk, through QEMU's vhost-user-blk-pci, which
//! passes the driver's write of `writeback` on as VHOST_USER_SET_CONFIG) and against QEMU's own
//! virtio-blk (a buffered file too: `cache=writeback`) as the reference: one boot each under QEMU
//! TCG, busybox and coreutils' `dd` in the initramfs.
//!
//! The guest reads /sys/block/vda/cache_type ("write back"), writes "write through" to it and
//! reads that back, writes 8 MiB with O_DIRECT (no FLUSH follows), switches back to "write back"
//! and writes the next 8 MiB the same way, then waits. The host, while the guest waits, counts
//! the disk file's pages in its page cache not yet written back: none in the range written
//! through (each write was durable when it completed), and many in the range written back (the
//! control: the same writes, left to a FLUSH that never came).
//! Needs what scripts/setup.sh installs (qemu-system-x86, linux-image-cloud-amd64,
//! busybox-static, coreutils) and Linux 6.5 or later on the host (cachestat).

use std::path::Path;
use std::time::{Duration, Instant};

use test_infra::daemon::Daemon;
use test_infra::dirty_pages_in;
use test_infra::linux::{initramfs_in, kernel, DD, INIT_PRELUDE};
use test_infra::qemu::Qemu;

/// A boot runs these steps in about 10 s under TCG here (more on a busy host); one not done after
/// this is stuck.
const LIMIT: Duration = Duration::from_secs(300);
const DISK_SIZE: u64 = 32 << 20;
/// Written while the guest's cache mode is write through, then while it is write back.
const THROUGH: std::ops::Range<u64> = 0..(8 << 20);
const BACK: std::ops::Range<u64> = (8 << 20)..(16 << 20);
/// Of BACK's 2048 pages, at least this many must still be dirty when the host looks: the control
/// that shows the count sees dirty pages (the host's flusher may have started on some).
const DIRTY_CONTROL: u64 = 256;

/// After `INIT_PRELUDE` (mounts, modules, /dev/vda).
const INIT: &str = r#"
fail() { echo "LW-FAIL $*"; dmesg | tail -30; poweroff -f; }
DD=/usr/bin/dd
c=/sys/block/vda/cache_type
echo "LW-MODE initial [$(cat $c)]"
echo "write through" > $c || fail "switch to write through"
echo "LW-MODE switched [$(cat $c)]"
$DD if=/dev/urandom of=/dev/vda bs=1M count=8 oflag=direct status=none || fail "write through"
echo "write back" > $c || fail "switch to write back"
echo "LW-MODE back [$(cat $c)]"
$DD if=/dev/urandom of=/dev/vda bs=1M seek=8 count=8 oflag=direct status=none || fail "write back"
if dmesg | grep -iE 'i/o error|blk_update_request|critical|buffer i/o'; then
    fail dmesg
fi
echo LW-WRITTEN
sleep 3600
"#;

const PROGRAMS: [(&str, &str); 1] = [DD];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Device {
    /// QEMU's virtio-blk-pci over the file (`cache=writeback`, its default): the reference.
    Qemu,
    /// `exitless vhost-user-blk` (a buffered file disk) through vhost-user-blk-pci.
    Exitless,
}

fn run(device: Device) {
    let _serial = test_infra::one_at_a_time();
    let kernel = kernel();
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let initramfs = initramfs_in(dir.path(), &kernel, &format!("{INIT_PRELUDE}{INIT}"), &PROGRAMS);
    // On /tmp, a disk file system: on tmpfs no page is ever written back.
    let file_disk = test_infra::disk_file(dir.path(), "disk.img", DISK_SIZE);
    let mut qemu = Qemu::linux(&kernel, &initramfs, "256M", 1, "");
    let mut daemon = None;
    match device {
        Device::Qemu => qemu = qemu.drive_full(&file_disk, ",cache=writeback", ""),
        Device::Exitless => {
            let socket = dir.path().join("file.sock");
            let spec = format!("path={}", file_disk.display());
            daemon = Some(Daemon::builder().disk_on(&socket, &spec).start(&dir.path().join("daemon.log")));
            qemu = qemu.vhost_user_blk(&socket);
        }
    }
    let console = dir.path().join("console.log");
    let qemu_log = dir.path().join("qemu.log");
    let mut child = qemu.spawn(&console, std::fs::File::create(&qemu_log).unwrap());
    let read = |path: &Path| String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned();
    let started = Instant::now();
    loop {
        if let Some(daemon) = daemon.as_mut() {
            daemon.assert_alive();
        }
        let output = read(&console);
        if output.contains("LW-WRITTEN") {
            break;
        }
        let exited = child.try_wait().unwrap();
        if output.contains("LW-FAIL") || exited.is_some() || started.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            let log = daemon.map(Daemon::stop).unwrap_or_default();
            panic!(
                "{device:?}: the guest failed, exited ({exited:?}) or did not finish within {LIMIT:?}: {output}\nQEMU: {}\ndaemon: {log}",
                read(&qemu_log)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The guest waits: its disk is still attached, nothing has flushed it.
    let through = dirty_pages_in(&file_disk, THROUGH);
    let back = dirty_pages_in(&file_disk, BACK);
    let _ = child.kill();
    let _ = child.wait();
    let output = read(&console);
    let modes: Vec<&str> =
        output.lines().filter_map(|l| l.find("LW-MODE").map(|at| l[at..].trim_end())).collect();
    eprintln!(
        "{device:?}: {:.1} s; {modes:?}; dirty pages: {through} written through, {back} written back",
        started.elapsed().as_secs_f64()
    );
    for expected in ["initial [write back]", "switched [write through]", "back [write back]"] {
        assert!(output.contains(&format!("LW-MODE {expected}")), "{device:?}: no {expected}: {output}");
    }
    assert_eq!(through, 0, "{device:?}: written through, yet {through} pages of the file are dirty");
    assert!(back >= DIRTY_CONTROL, "{device:?}: written back, only {back} dirty pages (the control)");
    if let Some(daemon) = daemon {
        let log = daemon.stop();
        let switched = |mode: &str| {
            log.lines().filter(|l| l.contains(&format!("switched the disk to write {mode}"))).count()
        };
        assert_eq!((switched("through"), switched("back")), (1, 1), "one SET_CONFIG each way: {log}");
        let stopped: Vec<&str> = log.lines().filter(|l| l.contains("stopped at avail index")).collect();
        assert!(!stopped.is_empty(), "no session ended: {log}");
        for line in stopped {
            assert!(line.contains(" 0 I/O errors, 0 refused"), "the daemon failed requests: {log}");
        }
    }
}

test_infra::tests! {
    reference_qemu_virtio_blk => run(Device::Qemu);
    exitless_vhost_user_blk => run(Device::Exitless);
}
