//! The Linux compatibility suite: what a user first does with a Linux guest, run against QEMU's
//! own virtio-blk (the reference: whatever it handles, `exitless vhost-user-blk` must) and
//! against the daemon in each `--io-mode`, each with a file disk (with O_DIRECT in adaptive mode)
//! and a RAM disk in one boot.
//!
//! Debian's cloud kernel boots under QEMU TCG with a busybox initramfs that also holds the real
//! e2fsprogs `mke2fs` and `e2fsck`, util-linux's `blkdiscard`, coreutils' `dd` and fio, copied
//! from the host with the libraries `ldd` lists. On each disk the guest writes and reads back
//! 512 B to 1 MiB blocks with O_DIRECT and through the page cache, checked by checksum, and 512 B
//! to 1 MiB with O_DIRECT from buffers that start 512 bytes into a page (a small C program built
//! here); then it runs fio (Debian's, copied in with its ~64 libraries, ~80 MB: they add about
//! 0.3 s before /init under TCG) on both disks at once:
//! - 512 B to 1 MiB blocks, O_DIRECT and through the page cache, from buffers that do not start
//!   on a page (`--iomem_align`), each block checked by crc32c as it is read back and again, with
//!   the page cache dropped, by a second run that only reads;
//! - the mixed run: several jobs at queue depth 32 (libaio), reads and writes mixed, every write
//!   checked by crc32c, for `EXITLESS_LINUX_MIXED_SECS` seconds (default `MIXED_SECS`;
//!   `scripts/reliability.sh long` runs 60);
//!
//! and on each disk
//! - zeroes a written range with `blkdiscard -z` and reads zeros back (a WRITE_ZEROES request
//!   now that both devices offer it; before, Linux wrote chains of its zero page, the same page
//!   128 times: an indirect table of 130 descriptors on QEMU's default vhost-user-blk queue of
//!   128, the step that broke the queue before indirect tables could be longer than the queue;
//!   the probe's `blk-chains` workload keeps sending that shape);
//! - makes an ext4 file system (`mke2fs -t ext4`), writes files, remounts and checks them, and
//!   runs `e2fsck -fn`, which must find it clean;
//!
//! and finally finds no I/O error in dmesg; on the host, e2fsck finds the file disk's ext4 clean.
//!
//! The same runs on two Ceph RBD images of a throw-away cluster (`scripts/ceph.sh`): QEMU's own
//! rbd driver (`cache=none`: librbd's cache off) as the reference, and the daemon's `rbd=` disks;
//! the host's e2fsck then checks the first image, exported.
//! A daemon that breaks its queue fails the test at once (the guest would wait for ever); a guest
//! that has not finished within `BOOT_LIMIT` plus the mixed run fails it.
//! Needs what scripts/setup.sh installs (qemu-system-x86, linux-image-cloud-amd64,
//! busybox-static, e2fsprogs, util-linux, coreutils, fio).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use storage::testing::ceph::TestCluster;
use test_infra::daemon::Daemon;
use test_infra::linux::{host_programs, initramfs_with_programs, kernel, DD, FIO, INIT_MOUNTS};
use test_infra::qemu::Qemu;

/// One boot, both disks, without the mixed run: 25 to 75 s under TCG on this shared 2-CPU host
/// (a run paused by other work takes longer); a guest still running after this and the mixed run
/// is stuck.
const BOOT_LIMIT: Duration = Duration::from_secs(300);
/// The guest's RAM: fio and its libraries (about 80 MB) are in the initramfs, unpacked into RAM.
const GUEST_RAM: &str = "512M";
/// The mixed run's default length in seconds, as CI runs it; `EXITLESS_LINUX_MIXED_SECS` sets
/// another (`scripts/reliability.sh long`: 60).
const MIXED_SECS: u64 = 10;

/// The mixed run's length: `EXITLESS_LINUX_MIXED_SECS`, or `MIXED_SECS`.
fn mixed_run() -> Duration {
    let secs = match std::env::var("EXITLESS_LINUX_MIXED_SECS") {
        Ok(secs) => secs
            .parse()
            .unwrap_or_else(|_| panic!("EXITLESS_LINUX_MIXED_SECS={secs}: not a number of seconds")),
        Err(_) => MIXED_SECS,
    };
    assert!(secs > 0, "EXITLESS_LINUX_MIXED_SECS must be at least 1");
    Duration::from_secs(secs)
}
/// Each disk's size: room for the raw I/O, the zeroed range, and a small ext4.
const DISK_SIZE: u64 = 64 << 20;

/// The guest's /init after `INIT_MOUNTS`: the workload on /dev/vda (the file disk) and /dev/vdb (the RAM
/// disk). Every step prints an LC-... line, a failed one `LC-FAIL <step>`, and the guest powers off either
/// way.
const INIT: &str = r#"
fail() { echo "LC-FAIL $*"; dmesg | tail -30; poweroff -f; }
# Seconds since boot, for the step lines: where the time goes.
uptime_s() { cut -d' ' -f1 /proc/uptime; }
for m in $(cat /modules); do insmod /lib/modules/$m || fail insmod-$m; done
# The host's programs, not busybox's applets of the same names.
DD=/usr/bin/dd
MKE2FS=/usr/sbin/mke2fs
E2FSCK=/usr/sbin/e2fsck
BLKDISCARD=/usr/sbin/blkdiscard
FIO=/usr/bin/fio
# The mixed run's length in seconds, from the host.
MIXED=$(sed -n 's/.*lc\.mixed=\([0-9][0-9]*\).*/\1/p' /proc/cmdline)
[ -n "$MIXED" ] || fail "no lc.mixed= on the kernel command line"
sum() { sha256sum | cut -d' ' -f1; }
$DD if=/dev/urandom of=/tmp/src bs=1M count=4 status=none || fail source
$DD --version | head -1 | grep -q coreutils || fail "dd is not coreutils' dd"

# Blocks of 512 B to 1 MiB, O_DIRECT and through the page cache, each range written then read
# back (the page cache dropped first) and compared with what was written.
raw() {
    d=/dev/$1; off=0
    for bs in 512 4096 32768 262144 1048576; do
        len=4194304; [ $bs -le 4096 ] && len=1048576
        count=$((len / bs)); at=$((off / bs))
        for mode in direct buffered; do
            if [ $mode = direct ]; then oflag=oflag=direct; iflag=iflag=direct; else oflag=; iflag=; fi
            $DD if=/tmp/src of=$d bs=$bs count=$count seek=$at $oflag conv=fsync,notrunc status=none \
                || fail "write $1 bs=$bs $mode"
            blockdev --flushbufs $d; echo 3 > /proc/sys/vm/drop_caches
            got=$($DD if=$d bs=$bs count=$count skip=$at $iflag status=none | sum)
            [ "$got" = "$(head -c $len /tmp/src | sum)" ] || fail "read back $1 bs=$bs $mode"
            off=$((off + len)); at=$((off / bs))
        done
    done
    /usr/local/bin/unaligned $d $((30 << 20)) || fail "unaligned $1"
    echo "LC-RAW-OK $1 at $(uptime_s) s"
}

# fio on both disks at once: 512 B to 1 MiB blocks, O_DIRECT and through the page cache, from
# buffers that do not start on a page (--iomem_align: 512 bytes in for O_DIRECT, 3 through the
# page cache), each job in its own range, written with crc32c checksums and read back and checked;
# then, with the page cache dropped, checked again by a run that only reads (--verify_only: the
# same offsets, from the same seed).
sweep() {
    jobs=""
    for disk in vda vdb; do
        for direct in 1 0; do
            if [ $direct = 1 ]; then align=512; at=0; else align=3; at=16384; fi
            for bs in 512 4k 32k 256k 1m; do
                case $bs in 512) size=512;; 4k) size=1024;; 32k) size=2048;; *) size=4096;; esac
                jobs="$jobs --name=$disk-$bs-direct$direct --filename=/dev/$disk --bs=$bs --direct=$direct"
                jobs="$jobs --iomem_align=$align --offset=${at}k --size=${size}k"
                at=$((at + size))
            done
        done
    done
    args="--rw=randwrite --ioengine=libaio --iodepth=4 --verify=crc32c $jobs"
    $FIO $args > /tmp/fio 2>&1 || { cat /tmp/fio; fail "fio sweep"; }
    jobs_ok 20 || fail "fio sweep"
    for disk in vda vdb; do blockdev --flushbufs /dev/$disk; done
    echo 3 > /proc/sys/vm/drop_caches
    $FIO $args --verify_only > /tmp/fio 2>&1 || { cat /tmp/fio; fail "fio sweep, read again"; }
    jobs_ok 20 || fail "fio sweep, read again"
    echo "LC-FIO-SWEEP-OK vda at $(uptime_s) s"
    echo "LC-FIO-SWEEP-OK vdb at $(uptime_s) s"
}

# fio's output in /tmp/fio has $1 job lines, each with err= 0, and no failed check; printed
# otherwise.
jobs_ok() {
    [ "$(grep -c ': err= 0: ' /tmp/fio)" = "$1" ] && [ "$(grep -c 'err=' /tmp/fio)" = "$1" ] \
        && ! grep -q 'verify failed' /tmp/fio && return 0
    cat /tmp/fio
    return 1
}

# Several fio jobs at once on both disks, at queue depth 32 (libaio), reads and writes mixed,
# every block written checked by crc32c after at most 64 more (verify_backlog), for MIXED
# seconds: 4 KiB and 512 B to 128 KiB with O_DIRECT, 1 MiB through the page cache, each in its
# own range.
mixed() {
    jobs=""
    for disk in vda vdb; do
        jobs="$jobs --name=$disk-4k --filename=/dev/$disk --direct=1 --bs=4k --offset=0 --size=8m"
        jobs="$jobs --name=$disk-mix --filename=/dev/$disk --direct=1 --bsrange=512-128k"
        jobs="$jobs --offset=8m --size=16m"
        jobs="$jobs --name=$disk-1m --filename=/dev/$disk --direct=0 --bs=1m --offset=24m --size=32m"
    done
    $FIO --ioengine=libaio --iodepth=32 --rw=randrw --rwmixread=50 --time_based --runtime=$MIXED \
        --verify=crc32c --verify_backlog=64 --iomem_align=512 $jobs > /tmp/fio 2>&1 \
        || { cat /tmp/fio; fail "fio mixed"; }
    jobs_ok 6 || fail "fio mixed"
    grep -E '^ *(READ|WRITE): ' /tmp/fio | sed 's/^ */LC-FIO-MIXED-IO /'
    echo "LC-FIO-MIXED-OK $MIXED s at $(uptime_s) s"
}

# blkdiscard -z over 8 MiB the guest wrote first; zeros read back.
zero() {
    d=/dev/$1
    $DD if=/tmp/src of=$d bs=1M seek=40 count=4 oflag=direct status=none || fail "zero-prep $1"
    $DD if=/tmp/src of=$d bs=1M seek=44 count=4 oflag=direct status=none || fail "zero-prep $1"
    $BLKDISCARD -z -o $((40 << 20)) -l $((8 << 20)) $d || fail "blkdiscard -z $1"
    got=$($DD if=$d bs=1M skip=40 count=8 iflag=direct status=none | sum)
    [ "$got" = "$($DD if=/dev/zero bs=1M count=8 status=none | sum)" ] || fail "zeros $1"
    echo "LC-ZERO-OK $1 at $(uptime_s) s"
}

# ext4: make, fill, remount and check, then e2fsck finds it clean.
fs() {
    d=/dev/$1
    $MKE2FS -t ext4 -F -q $d || fail "mkfs.ext4 $1"
    mount -t ext4 $d /mnt || fail "mount $1"
    cp /tmp/src /mnt/big || fail "cp $1"
    mkdir /mnt/small
    i=0
    while [ $i -lt 64 ]; do head -c $((i * 1000 + 1)) /tmp/src > /mnt/small/$i || fail "small $1"; i=$((i + 1)); done
    (cd /mnt && find . -type f | sort | xargs sha256sum) > /tmp/sums
    umount /mnt || fail "umount $1"
    echo 3 > /proc/sys/vm/drop_caches
    mount -t ext4 -o ro $d /mnt || fail "remount $1"
    (cd /mnt && sha256sum -c /tmp/sums > /dev/null) || fail "files $1"
    umount /mnt || fail "umount $1"
    $E2FSCK -fn $d > /tmp/fsck 2>&1 || { cat /tmp/fsck; fail "e2fsck $1"; }
    echo "LC-FS-OK $1 at $(uptime_s) s"
}

for disk in vda vdb; do
    i=0
    while [ ! -b /dev/$disk ]; do sleep 0.1; i=$((i + 1)); [ $i -gt 100 ] && fail "no $disk"; done
    echo "LC-DISK $disk size=$(blockdev --getsize64 /dev/$disk) segments=$(cat /sys/block/$disk/queue/max_segments)"
    raw $disk
done
sweep
mixed
for disk in vda vdb; do
    zero $disk
    fs $disk
done
if dmesg | grep -iE 'i/o error|blk_update_request|critical|EXT4-fs (error|warning)|buffer i/o'; then
    fail dmesg
fi
echo LC-DONE
poweroff -f
"#;

/// O_DIRECT writes and reads from buffers that start 512 bytes into a page (dd's are
/// page-aligned), so every page-sized piece of a request straddles two pages: 512 B to 1 MiB,
/// each read back and compared. Built on the host and copied in with its libraries.
const UNALIGNED_C: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    static const unsigned sizes[] = {512, 1536, 4096, 12288, 65536, 1048576};
    if (argc != 3) return 2;
    int fd = open(argv[1], O_RDWR | O_DIRECT);
    if (fd < 0) { perror("open"); return 1; }
    off_t at = strtoll(argv[2], 0, 0);
    char *w, *r;
    if (posix_memalign((void **)&w, 4096, (1 << 20) + 4096) || posix_memalign((void **)&r, 4096, (1 << 20) + 4096))
        return 1;
    w += 512;
    r += 512;
    for (unsigned i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned n = sizes[i];
        for (unsigned j = 0; j < n; j++) w[j] = (char)(j * 7 + (j >> 9) + i);
        memset(r, 0, n);
        if (pwrite(fd, w, n, at) != (ssize_t)n || pread(fd, r, n, at) != (ssize_t)n) {
            perror("unaligned I/O");
            return 1;
        }
        if (memcmp(w, r, n)) { fprintf(stderr, "unaligned: %u bytes read back differ\n", n); return 1; }
        at += n;
    }
    return 0;
}
"#;

/// The unaligned-buffer helper, built with the host's C compiler; its initramfs files (itself
/// as /usr/local/bin/unaligned, and its libraries).
fn unaligned_helper(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let source = dir.join("unaligned.c");
    std::fs::write(&source, UNALIGNED_C).unwrap();
    let binary = dir.join("unaligned");
    let out = Command::new("cc")
        .args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&binary)
        .arg(&source)
        .output()
        .expect("a C compiler (cc) must be installed: scripts/setup.sh installs g++");
    assert!(out.status.success(), "cc unaligned.c: {}", String::from_utf8_lossy(&out.stderr));
    let mut files = host_programs(&[(binary.to_str().unwrap(), "gcc")]);
    files[0].0 = "usr/local/bin/unaligned".into();
    files
}

/// The programs the workload needs beyond busybox, and their Debian packages.
const PROGRAMS: [(&str, &str); 5] = [
    ("/usr/sbin/mke2fs", "e2fsprogs"),
    ("/usr/sbin/e2fsck", "e2fsprogs"),
    ("/usr/sbin/blkdiscard", "util-linux"),
    DD,
    FIO,
];

/// Who serves the guest's two disks.
#[derive(Clone, Copy, Debug)]
enum Device {
    /// QEMU's own virtio-blk-pci: the reference.
    Qemu,
    /// `exitless vhost-user-blk --io-mode MODE`, through vhost-user-blk-pci.
    Exitless(&'static str),
    /// QEMU's virtio-blk-pci on two RBD images, through its rbd driver: the reference there.
    QemuRbd,
    /// `exitless vhost-user-blk --io-mode MODE` serving two RBD images.
    ExitlessRbd(&'static str),
}

impl Device {
    /// How the record (scripts/reliability.sh) names it.
    fn label(self) -> String {
        match self {
            Device::Qemu => "QEMU virtio-blk-pci (reference)".to_owned(),
            Device::Exitless(mode) => format!("exitless vhost-user-blk --io-mode {mode}"),
            Device::QemuRbd => "QEMU virtio-blk-pci on RBD images (reference)".to_owned(),
            Device::ExitlessRbd(mode) => format!("exitless vhost-user-blk --io-mode {mode} on RBD images"),
        }
    }
}

/// A file disk and a RAM disk served by `device`, the workload run on both in one boot.
fn run_workload(device: Device) {
    let _serial = test_infra::one_at_a_time();
    let kernel = kernel();
    let mixed = mixed_run();
    let dir = tempfile::tempdir().unwrap();
    let mut programs = host_programs(&PROGRAMS);
    for (name, data) in unaligned_helper(dir.path()) {
        if !programs.iter().any(|(known, _)| *known == name) {
            programs.push((name, data));
        }
    }
    let initramfs = dir.path().join("initramfs.cpio");
    initramfs_with_programs(&kernel, &format!("{INIT_MOUNTS}{INIT}"), &programs, &initramfs);
    let file_disk = test_infra::disk_file(dir.path(), "disk.img", DISK_SIZE);

    let append = format!("lc.mixed={}", mixed.as_secs());
    let mut qemu = Qemu::linux(&kernel, &initramfs, GUEST_RAM, 1, &append);
    // Kept until the guest is done: the reference's RAM disk, or the daemon.
    let mut daemon = None;
    let _ram_file;
    match device {
        Device::Qemu => {
            // The RAM disk: a file in /dev/shm, as the daemon's `ram=` is.
            let ram =
                tempfile::Builder::new().prefix("exitless-linux-compat").tempfile_in("/dev/shm").unwrap();
            ram.as_file().set_len(DISK_SIZE).unwrap();
            qemu = qemu.drive(&file_disk).drive(ram.path());
            _ram_file = Some(ram);
        }
        Device::Exitless(mode) => {
            // The file through the host's page cache, and in one mode with O_DIRECT.
            let direct = if mode == "adaptive" { ",direct" } else { "" };
            let sockets = [dir.path().join("file.sock"), dir.path().join("ram.sock")];
            daemon = Some(
                Daemon::builder()
                    .disk_on(&sockets[0], &format!("path={}{direct}", file_disk.display()))
                    .disk_on(&sockets[1], &format!("ram={}M", DISK_SIZE >> 20))
                    .io_mode(mode)
                    .start(&dir.path().join("daemon.log")),
            );
            qemu = qemu.vhost_user_blk(&sockets[0]).vhost_user_blk(&sockets[1]);
            _ram_file = None;
        }
        Device::QemuRbd | Device::ExitlessRbd(_) => {
            let cluster = TestCluster::get();
            let images = rbd_images(device).map(|name| {
                cluster.image(&name, DISK_SIZE);
                name
            });
            _ram_file = None;
            if let Device::ExitlessRbd(mode) = device {
                let sockets = [dir.path().join("rbd0.sock"), dir.path().join("rbd1.sock")];
                let mut builder = Daemon::builder().io_mode(mode);
                for (socket, image) in sockets.iter().zip(&images) {
                    let disk = format!("rbd=rbd/{image},conf={},queues=2", cluster.conf().display());
                    builder = builder.disk_on(socket, &disk);
                }
                daemon = Some(builder.start(&dir.path().join("daemon.log")));
                qemu = qemu.vhost_user_blk(&sockets[0]).vhost_user_blk(&sockets[1]);
            } else {
                for image in &images {
                    let file = format!("rbd:rbd/{image}:conf={}:id=admin", cluster.conf().display());
                    qemu = qemu.drive_full(Path::new(&file), ",cache=none", "");
                }
            }
        }
    }
    let console = dir.path().join("console.log");
    let child = qemu.spawn(&console, std::fs::File::create(dir.path().join("qemu.log")).unwrap());
    let guest = Guest { qemu: test_infra::KillOnDrop(child), console, qemu_log: dir.path().join("qemu.log") };
    let output = guest.finish(device, daemon.as_mut(), BOOT_LIMIT + mixed);

    for disk in ["vda", "vdb"] {
        let size = format!("LC-DISK {disk} size={DISK_SIZE} ");
        assert!(output.contains(&size), "{disk} is not the {DISK_SIZE}-byte disk: {output}");
        for step in ["LC-RAW-OK", "LC-FIO-SWEEP-OK", "LC-ZERO-OK", "LC-FS-OK"] {
            assert!(output.contains(&format!("{step} {disk}")), "{step} {disk} missing: {output}");
        }
    }
    let mixed_ok = format!("LC-FIO-MIXED-OK {} s", mixed.as_secs());
    assert!(output.contains(&mixed_ok), "{device:?}: {mixed_ok} missing: {output}");
    // fio's totals for the mixed run (every read, the checking ones included, and every write),
    // for the record (scripts/reliability.sh).
    let totals: Vec<&str> = output
        .lines()
        .filter_map(|l| l.split_once("LC-FIO-MIXED-IO ").map(|(_, total)| total.trim_end()))
        .collect();
    assert_eq!(totals.len(), 2, "{device:?}: fio's READ and WRITE totals of the mixed run: {output}");
    let io = |total: &str| {
        total.split("io=").nth(1).and_then(|t| t.split_whitespace().next()).unwrap_or("?").to_owned()
    };
    // Printed once every check passed.
    let record = format!(
        "linux-compat {}: mixed run {} s, 6 fio jobs at depth 32 on 2 disks, read {}, written {}, \
         0 errors, 0 verify failures, no I/O error in dmesg",
        device.label(),
        mixed.as_secs(),
        io(totals[0]),
        io(totals[1])
    );
    // What the guest wrote reached the file (or the first image): the host's e2fsck finds the
    // same clean ext4.
    if let Device::QemuRbd | Device::ExitlessRbd(_) = device {
        std::fs::remove_file(&file_disk).unwrap();
        let [first, _] = rbd_images(device);
        TestCluster::get().rbd(&["export", &format!("rbd/{first}"), &file_disk.display().to_string()]);
    }
    let fsck = Command::new("/usr/sbin/e2fsck").arg("-fn").arg(&file_disk).output().expect("run e2fsck");
    assert!(
        fsck.status.success(),
        "{device:?}: the file disk's ext4 is not clean on the host: {}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
    if let Some(daemon) = daemon {
        let log = daemon.stop();
        assert!(!log.contains("needs a reset"), "the daemon broke a queue: {log}");
        // A vring's session ends with a line of what it served: the firmware's (SeaBIOS reads
        // each disk once at boot) and Linux's. Every one must be clean. (SeaBIOS's read once
        // came with a zero-length buffer and was refused: see SIZE_MAX in virtio's block device.)
        let stopped: Vec<&str> = log.lines().filter(|l| l.contains("stopped at avail index")).collect();
        for disk in ["disk 0 ", "disk 1 "] {
            assert!(stopped.iter().any(|l| l.contains(disk)), "no session on {disk}: {log}");
        }
        for line in stopped {
            assert!(line.contains(" 0 I/O errors, 0 refused"), "the daemon failed requests: {log}");
        }
    }
    eprintln!("{record}");
}

/// The two RBD images `device` serves, named after it (each test has its own).
fn rbd_images(device: Device) -> [String; 2] {
    let name = match device {
        Device::ExitlessRbd(mode) => format!("linux-exitless-{mode}"),
        _ => "linux-qemu".to_owned(),
    };
    [format!("{name}-0"), format!("{name}-1")]
}

/// A booted guest: QEMU, its console in a file.
struct Guest {
    qemu: test_infra::KillOnDrop,
    console: PathBuf,
    qemu_log: PathBuf,
}

impl Guest {
    fn console(&self) -> String {
        read(&self.console)
    }

    /// Wait for the guest to power off and return its console, failing at once if the daemon
    /// broke a queue (the guest would wait for ever) or the guest failed a step, and after
    /// `limit` if it never finished.
    fn finish(mut self, device: Device, mut daemon: Option<&mut Daemon>, limit: Duration) -> String {
        let started = Instant::now();
        let status = loop {
            if let Some(status) = self.qemu.try_wait().unwrap() {
                break status;
            }
            if let Some(daemon) = daemon.as_deref_mut() {
                daemon.assert_alive();
                let log = daemon.log();
                assert!(
                    !log.contains("needs a reset"),
                    "{device:?}: the daemon broke a queue, the guest would hang: {log}\nconsole: {}",
                    self.console()
                );
            }
            let console = self.console();
            assert!(!console.contains("LC-FAIL"), "{device:?}: the guest failed a step: {console}");
            assert!(
                started.elapsed() < limit,
                "{device:?}: the guest did not finish within {limit:?}: {console}"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let output = self.console();
        let steps: Vec<&str> =
            output.lines().filter_map(|l| l.find("LC-").map(|at| l[at..].trim_end())).collect();
        eprintln!("{device:?}: {:.1} s: {}", started.elapsed().as_secs_f64(), steps.join(", "));
        assert!(status.success(), "{device:?}: QEMU failed ({status}): {}", read(&self.qemu_log));
        assert!(!output.contains("LC-FAIL"), "{device:?}: the guest failed a step: {output}");
        assert!(output.contains("LC-DONE"), "{device:?}: the guest did not finish: {output}");
        output
    }
}

fn read(path: &Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
}

test_infra::tests! {
    reference_qemu_virtio_blk => run_workload(Device::Qemu);
    exitless_sidecore => run_workload(Device::Exitless("sidecore"));
    exitless_adaptive => run_workload(Device::Exitless("adaptive"));
    exitless_eventfd => run_workload(Device::Exitless("eventfd"));
    reference_qemu_virtio_blk_on_rbd => run_workload(Device::QemuRbd);
    exitless_adaptive_on_rbd => run_workload(Device::ExitlessRbd("adaptive"));
}
