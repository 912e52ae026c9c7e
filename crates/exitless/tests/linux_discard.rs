//! DISCARD, WRITE_ZEROES and the serial number as a Linux guest uses them, against the daemon
//! (`exitless vhost-user-blk`, a file disk with O_DIRECT and a RAM disk) and against QEMU's own
//! virtio-blk (`discard=unmap`) as the reference: one boot each under QEMU TCG, with the real
//! e2fsprogs `mke2fs` and util-linux `fstrim` and `blkdiscard` copied into a busybox initramfs.
//!
//! On each disk the guest
//! - reads the serial number from /sys/block/vdX/serial and the discard and write-zeroes limits
//!   from the queue's sysfs;
//! - fills the whole disk with random data (so every block of the file disk is allocated on the
//!   host), makes an ext4 without discarding (`mke2fs -E nodiscard`), writes a 24 MiB file,
//!   syncs, deletes it, and runs `fstrim`, which must trim at least those 24 MiB;
//! - `blkdiscard`s 8 MiB (plain DISCARD);
//! - writes 8 MiB of random data, checks it is not zeros, `blkdiscard -z`s it (WRITE_ZEROES) and
//!   reads zeros back.
//!
//! On the host afterwards: the file disk's allocated blocks (st_blocks) dropped below half the
//! disk, and the range zeroed in the guest holds zeros in the file. No I/O error in dmesg, and
//! the daemon answered every request without an error or a refusal.
//! Needs what scripts/setup.sh installs (qemu-system-x86, linux-image-cloud-amd64,
//! busybox-static, e2fsprogs, util-linux, coreutils).

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use test_infra::daemon::Daemon;
use test_infra::linux::{initramfs_in, kernel, DD, INIT_MOUNTS};
use test_infra::qemu::Qemu;

/// A boot runs these steps in 12 to 14 s under TCG here (more on a busy host); one not done after
/// this is stuck.
const LIMIT: Duration = Duration::from_secs(300);
const DISK_SIZE: u64 = 64 << 20;
/// The file disk's serial number (vda); the RAM disk (vdb) keeps the default.
const SERIAL: &str = "lc-file-disk-01";
/// Where the guest zeroes with `blkdiscard -z`: the last 8 MiB.
const ZEROED: std::ops::Range<u64> = (56 << 20)..(64 << 20);

/// The guest's /init after `INIT_MOUNTS`.
const INIT: &str = r#"
fail() { echo "LD-FAIL $*"; dmesg | tail -30; poweroff -f; }
for m in $(cat /modules); do insmod /lib/modules/$m || fail insmod-$m; done
DD=/usr/bin/dd
MKE2FS=/usr/sbin/mke2fs
FSTRIM=/usr/sbin/fstrim
BLKDISCARD=/usr/sbin/blkdiscard
sum() { sha256sum | cut -d' ' -f1; }
ZERO8=$($DD if=/dev/zero bs=1M count=8 status=none | sum)
$DD if=/dev/urandom of=/tmp/chunk bs=1M count=8 status=none || fail chunk

disk() {
    d=/dev/$1; q=/sys/block/$1/queue
    i=0
    while [ ! -b $d ]; do sleep 0.1; i=$((i + 1)); [ $i -gt 100 ] && fail "no $1"; done
    echo "LD-SERIAL $1 [$(cat /sys/block/$1/serial)]"
    echo "LD-LIMITS $1 discard=$(cat $q/discard_max_bytes) zeroes=$(cat $q/write_zeroes_max_bytes) granularity=$(cat $q/discard_granularity) physical=$(cat $q/physical_block_size)"
    i=0
    while [ $i -lt 64 ]; do
        $DD if=/tmp/chunk of=$d bs=1M seek=$i oflag=direct conv=notrunc status=none || fail "fill $1"
        i=$((i + 8))
    done
    $MKE2FS -t ext4 -F -q -E nodiscard $d || fail "mke2fs $1"
    mount -t ext4 $d /mnt || fail "mount $1"
    $DD if=/dev/urandom of=/mnt/big bs=1M count=24 status=none || fail "write $1"
    sync
    rm /mnt/big
    sync
    $FSTRIM -v /mnt > /tmp/trim 2>&1 || { cat /tmp/trim; fail "fstrim $1"; }
    echo "LD-FSTRIM $1 $(cat /tmp/trim)"
    umount /mnt || fail "umount $1"
    $BLKDISCARD -f -o $((48 << 20)) -l $((8 << 20)) $d || fail "blkdiscard $1"
    echo "LD-DISCARD-OK $1"
    $DD if=/tmp/chunk of=$d bs=1M seek=56 oflag=direct conv=notrunc status=none || fail "zero-prep $1"
    [ "$($DD if=$d bs=1M skip=56 count=8 iflag=direct status=none | sum)" != "$ZERO8" ] || fail "data $1"
    $BLKDISCARD -f -z -o $((56 << 20)) -l $((8 << 20)) $d || fail "blkdiscard -z $1"
    echo 3 > /proc/sys/vm/drop_caches
    [ "$($DD if=$d bs=1M skip=56 count=8 iflag=direct status=none | sum)" = "$ZERO8" ] || fail "zeros $1"
    echo "LD-ZERO-OK $1"
}

disk vda
disk vdb
if dmesg | grep -iE 'i/o error|blk_update_request|critical|EXT4-fs (error|warning)|buffer i/o'; then
    fail dmesg
fi
echo LD-DONE
poweroff -f
"#;

const PROGRAMS: [(&str, &str); 4] = [
    ("/usr/sbin/mke2fs", "e2fsprogs"),
    ("/usr/sbin/fstrim", "util-linux"),
    ("/usr/sbin/blkdiscard", "util-linux"),
    DD,
];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Device {
    /// QEMU's virtio-blk-pci with `discard=unmap`: the reference.
    Qemu,
    /// `exitless vhost-user-blk` through vhost-user-blk-pci.
    Exitless,
}

/// The guest's console once it powered off, failing at once on a failed step.
fn run(device: Device) -> (String, tempfile::TempDir) {
    let _serial = test_infra::one_at_a_time();
    let kernel = kernel();
    let dir = tempfile::tempdir().unwrap();
    let initramfs = initramfs_in(dir.path(), &kernel, &format!("{INIT_MOUNTS}{INIT}"), &PROGRAMS);
    let file_disk = test_infra::disk_file(dir.path(), "disk.img", DISK_SIZE);
    let mut qemu = Qemu::linux(&kernel, &initramfs, "256M", 1, "");
    let mut daemon = None;
    let ram = tempfile::Builder::new().prefix("exitless-linux-discard").tempfile_in("/dev/shm").unwrap();
    match device {
        Device::Qemu => {
            ram.as_file().set_len(DISK_SIZE).unwrap();
            qemu = qemu.drive_full(&file_disk, ",discard=unmap", &format!(",serial={SERIAL}")).drive_full(
                ram.path(),
                ",discard=unmap",
                "",
            );
        }
        Device::Exitless => {
            let sockets = [dir.path().join("file.sock"), dir.path().join("ram.sock")];
            let file_spec = format!("path={},direct,serial={SERIAL}", file_disk.display());
            daemon = Some(
                Daemon::builder()
                    .disk_on(&sockets[0], &file_spec)
                    .disk_on(&sockets[1], &format!("ram={}M", DISK_SIZE >> 20))
                    .io_mode("adaptive")
                    .start(&dir.path().join("daemon.log")),
            );
            qemu = qemu.vhost_user_blk(&sockets[0]).vhost_user_blk(&sockets[1]);
        }
    }
    let console = dir.path().join("console.log");
    let qemu_log = dir.path().join("qemu.log");
    let mut child = qemu.spawn(&console, std::fs::File::create(&qemu_log).unwrap());
    let read = |path: &Path| String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if let Some(daemon) = daemon.as_mut() {
            daemon.assert_alive();
            assert!(!daemon.log().contains("needs a reset"), "the daemon broke a queue: {}", daemon.log());
        }
        let output = read(&console);
        if output.contains("LD-FAIL") || started.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{device:?}: the guest failed or did not finish within {LIMIT:?}: {output}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = read(&console);
    assert!(status.success(), "{device:?}: QEMU failed ({status}): {}", read(&qemu_log));
    assert!(output.contains("LD-DONE"), "{device:?}: the guest did not finish: {output}");
    let steps: Vec<&str> =
        output.lines().filter_map(|l| l.find("LD-").map(|at| l[at..].trim_end())).collect();
    eprintln!("{device:?}: {:.1} s:\n  {}", started.elapsed().as_secs_f64(), steps.join("\n  "));

    // The host's view of the file disk.
    let allocated = std::fs::metadata(&file_disk).unwrap().blocks() * 512;
    eprintln!("{device:?}: the {DISK_SIZE}-byte file disk has {allocated} bytes allocated");
    assert!(allocated < DISK_SIZE / 2, "{device:?}: fstrim and blkdiscard freed too little: {allocated}");
    let bytes = std::fs::read(&file_disk).unwrap();
    let zeroed = &bytes[ZEROED.start as usize..ZEROED.end as usize];
    assert!(
        zeroed.iter().all(|&b| b == 0),
        "{device:?}: the range blkdiscard -z zeroed is not zeros on the host"
    );

    for disk in ["vda", "vdb"] {
        let limits = line(&output, &format!("LD-LIMITS {disk} "));
        let value = |key: &str| -> u64 {
            limits.split_whitespace().find_map(|kv| kv.strip_prefix(key)).unwrap().parse().unwrap()
        };
        assert!(value("discard=") > 0 && value("zeroes=") > 0, "{device:?}: {limits}");
        // "/mnt: 40.8 MiB (42781696 bytes) trimmed"
        let trim = line(&output, &format!("LD-FSTRIM {disk} "));
        let trimmed: u64 = trim.split('(').nth(1).and_then(|t| t.split(' ').next()).unwrap().parse().unwrap();
        assert!(trimmed >= 24 << 20, "{device:?}: fstrim trimmed only {trimmed} bytes: {trim}");
        for step in ["LD-DISCARD-OK", "LD-ZERO-OK"] {
            assert!(
                output.contains(&format!("{step} {disk}")),
                "{device:?}: {step} {disk} missing: {output}"
            );
        }
    }
    assert!(output.contains(&format!("LD-SERIAL vda [{SERIAL}]")), "{device:?}: vda's serial: {output}");
    if let Some(daemon) = daemon {
        assert!(output.contains("LD-SERIAL vdb [vhost-user-disk1]"), "vdb's default serial: {output}");
        let log = daemon.stop();
        let stopped: Vec<&str> = log.lines().filter(|l| l.contains("stopped at avail index")).collect();
        assert!(!stopped.is_empty(), "no session ended: {log}");
        for line in stopped {
            assert!(line.contains(" 0 I/O errors, 0 refused"), "the daemon failed requests: {log}");
        }
    }
    (output, dir)
}

fn line<'a>(output: &'a str, prefix: &str) -> &'a str {
    output
        .lines()
        .find_map(|l| l.find(prefix).map(|at| &l[at..]))
        .unwrap_or_else(|| panic!("no {prefix}: {output}"))
}

test_infra::tests! {
    reference_qemu_virtio_blk => run(Device::Qemu);
    exitless_vhost_user_blk => run(Device::Exitless);
}
