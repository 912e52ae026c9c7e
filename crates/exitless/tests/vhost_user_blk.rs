//! `exitless vhost-user-blk` with a driver we did not write: QEMU (TCG: Linux cannot run under
//! this host's KVM) boots Debian's cloud kernel with a busybox initramfs built here, its
//! virtio-blk driver talks to our backend through `vhost-user-blk-pci`, and the guest writes,
//! reads back and checks a pattern with O_DIRECT, flushes, and powers off; the test then checks
//! the backing file on the host. Needs what scripts/setup.sh installs (qemu-system-x86,
//! linux-image-cloud-amd64, busybox-static, gcc and libc6-dev for the polled-I/O helper).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use test_infra::daemon::Daemon;
use test_infra::linux::{kernel, Kernel};
use test_infra::qemu::Qemu;

const QEMU_TIMEOUT: Duration = Duration::from_secs(180);
const PATTERN_LEN: usize = 64 * 1024;
/// Where the guest writes the pattern on the disk (4 KiB blocks).
const PATTERN_BLOCK: usize = 256;

/// The guest's /init after `INIT_MOUNTS`. Steps come from the kernel command line (`vu.write=1` ...); every
/// step prints a VU-... line, a failed one `VU-FAIL <step>`, and the guest powers off either way.
const INIT: &str = r#"
fail() { echo "VU-FAIL $1"; poweroff -f; }
opts=""
for w in $(cat /proc/cmdline); do
    case $w in
        virtio_blk.*) opts="$opts ${w#virtio_blk.}" ;;
        vu.write=1) write=1 ;;
        vu.waitgo=1) waitgo=1 ;;
        vu.read=1) read=1 ;;
        vu.rocheck=1) rocheck=1 ;;
        vu.iopoll=1) iopoll=1 ;;
    esac
done
# busybox insmod does not read module options from the command line (modprobe would).
for m in $(cat /modules); do
    if [ "$m" = virtio_blk.ko ]; then insmod /lib/modules/$m $opts || fail insmod-$m
    else insmod /lib/modules/$m || fail insmod-$m; fi
done
i=0
while [ ! -b /dev/vda ]; do sleep 0.1; i=$((i + 1)); [ $i -gt 100 ] && fail no-vda; done
echo "VU-DISK size=$(blockdev --getsize64 /dev/vda) ro=$(blockdev --getro /dev/vda) cache=$(cat /sys/block/vda/queue/write_cache | tr ' ' -) poll=$(cat /sys/block/vda/queue/io_poll)"
dmesg | grep 'poll queues' | sed 's/^.*virtio_blk/VU-QUEUES virtio_blk/'
if [ -n "$write" ]; then
    dd if=/pattern of=/dev/vda bs=4096 seek=256 count=16 oflag=direct conv=fsync 2>/dev/null || fail write
    echo VU-WRITE-OK
    blockdev --flushbufs /dev/vda || fail flush
    echo VU-FLUSH-OK
fi
if [ -n "$waitgo" ]; then
    # The host writes GO-AHEAD into sector 16 of the backing file while no backend runs; every
    # poll reads the disk through whichever backend serves it.
    echo VU-WAITING
    i=0
    until dd if=/dev/vda bs=512 skip=16 count=1 iflag=direct 2>/dev/null | grep -q GO-AHEAD; do
        sleep 0.2; i=$((i + 1)); [ $i -gt 300 ] && fail waitgo
    done
    echo VU-GO
fi
if [ -n "$read" ]; then
    dd if=/dev/vda of=/readback bs=4096 skip=256 count=16 iflag=direct 2>/dev/null || fail read
    cmp /pattern /readback || fail verify
    echo VU-VERIFY-OK
fi
if [ -n "$rocheck" ]; then
    [ "$(blockdev --getro /dev/vda)" = 1 ] || fail not-read-only
    dd if=/pattern of=/dev/vda bs=4096 count=1 oflag=direct 2>/dev/null && fail read-only-write-accepted
    echo VU-RO-OK
fi
if [ -n "$iopoll" ]; then
    /iopoll /dev/vda 2097152 64 || fail iopoll
fi
echo VU-DONE
poweroff -f
"#;

/// Polled I/O from user space: O_DIRECT writes and reads through an io_uring set up with
/// IORING_SETUP_IOPOLL, which the kernel sends to a poll queue and completes by polling it (no
/// interrupt). Busybox cannot do this, and on Linux 6.1 plain `preadv2(RWF_HIPRI)` no longer
/// polls (its requests go to the interrupt-driven queue), hence raw io_uring.
const IOPOLL_C: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/io_uring.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static int ring_fd;
static unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
static struct io_uring_sqe *sqes;
static struct io_uring_cqe *cqes;

static int setup(void) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    p.flags = IORING_SETUP_IOPOLL;
    ring_fd = syscall(__NR_io_uring_setup, 4, &p);
    if (ring_fd < 0) { perror("io_uring_setup"); return -1; }
    size_t sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    size_t cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    size_t len = sq_len > cq_len ? sq_len : cq_len;
    char *sq = mmap(0, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring_fd, IORING_OFF_SQ_RING);
    char *cq = (p.features & IORING_FEAT_SINGLE_MMAP) ? sq
        : mmap(0, cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring_fd, IORING_OFF_CQ_RING);
    sqes = mmap(0, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                ring_fd, IORING_OFF_SQES);
    if (sq == MAP_FAILED || cq == MAP_FAILED || sqes == MAP_FAILED) { perror("mmap"); return -1; }
    sq_tail = (unsigned *)(sq + p.sq_off.tail);
    sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    sq_array = (unsigned *)(sq + p.sq_off.array);
    cq_head = (unsigned *)(cq + p.cq_off.head);
    cq_tail = (unsigned *)(cq + p.cq_off.tail);
    cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
    return 0;
}

/* One request, completed by polling (io_uring_enter with GETEVENTS polls an IOPOLL ring). */
static int rw(int op, int fd, void *buf, unsigned len, unsigned long long off) {
    unsigned tail = *sq_tail, index = tail & *sq_mask;
    struct io_uring_sqe *sqe = &sqes[index];
    memset(sqe, 0, sizeof *sqe);
    sqe->opcode = op;
    sqe->fd = fd;
    sqe->addr = (unsigned long)buf;
    sqe->len = len;
    sqe->off = off;
    sq_array[index] = index;
    __atomic_store_n(sq_tail, tail + 1, __ATOMIC_RELEASE);
    if (syscall(__NR_io_uring_enter, ring_fd, 1, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0) {
        perror("io_uring_enter");
        return -1;
    }
    unsigned head = *cq_head;
    while (head == __atomic_load_n(cq_tail, __ATOMIC_ACQUIRE))
        syscall(__NR_io_uring_enter, ring_fd, 0, 1, IORING_ENTER_GETEVENTS, NULL, 0);
    int res = cqes[head & *cq_mask].res;
    __atomic_store_n(cq_head, head + 1, __ATOMIC_RELEASE);
    return res;
}

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    int fd = open(argv[1], O_RDWR | O_DIRECT);
    if (fd < 0) { perror("open"); return 1; }
    unsigned long long base = strtoull(argv[2], 0, 0);
    int n = atoi(argv[3]);
    void *w, *r;
    if (posix_memalign(&w, 4096, 4096) || posix_memalign(&r, 4096, 4096) || setup()) return 1;
    for (int i = 0; i < n; i++) {
        memset(w, 'A' + i % 26, 4096);
        int wrote = rw(IORING_OP_WRITE, fd, w, 4096, base + 4096ULL * i);
        int read = rw(IORING_OP_READ, fd, r, 4096, base + 4096ULL * i);
        if (wrote != 4096 || read != 4096) { printf("VU-FAIL iopoll write %d read %d\n", wrote, read); return 1; }
        if (memcmp(w, r, 4096)) { printf("VU-FAIL iopoll-mismatch %d\n", i); return 1; }
    }
    printf("VU-IOPOLL-OK %d\n", n);
    return 0;
}
"#;

fn pattern() -> Vec<u8> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    (0..PATTERN_LEN)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The initramfs: /init, the pattern and, with `iopoll`, the polled-I/O helper.
fn initramfs(kernel: &Kernel, dir: &Path, iopoll: bool) -> PathBuf {
    let pattern = pattern();
    let helper = iopoll.then(|| std::fs::read(iopoll_helper(dir)).unwrap());
    let mut files: Vec<(&str, u32, &[u8])> = vec![("pattern", 0o644, &pattern)];
    if let Some(helper) = &helper {
        files.push(("iopoll", 0o755, helper));
    }
    let path = dir.join("initramfs.cpio");
    test_infra::linux::initramfs_with(
        kernel,
        &format!("{}{INIT}", test_infra::linux::INIT_MOUNTS),
        &files,
        &path,
    );
    path
}

/// Build the polled-I/O helper statically (the initramfs has no C library); the test fails,
/// saying what is missing, without a C compiler and a static C library.
fn iopoll_helper(dir: &Path) -> PathBuf {
    const MISSING: &str =
        "the polled-I/O helper needs `cc -static`: install gcc and libc6-dev (scripts/setup.sh does)";
    let source = dir.join("iopoll.c");
    std::fs::write(&source, IOPOLL_C).unwrap();
    let binary = dir.join("iopoll");
    let built = Command::new("cc").args(["-static", "-O2", "-o"]).arg(&binary).arg(&source).output();
    match built {
        Ok(out) if out.status.success() => binary,
        Ok(out) => panic!("{MISSING}; cc -static failed: {}", String::from_utf8_lossy(&out.stderr)),
        Err(e) => panic!("{MISSING}; cannot run cc: {e}"),
    }
}

/// `exitless vhost-user-blk --socket SOCKET ARGS` (a socket file left from before removed first),
/// its log in `log`.
fn start_backend(socket: &Path, args: &[&str], log: &Path) -> Daemon {
    let _ = std::fs::remove_file(socket);
    let args = [&["--socket", socket.to_str().unwrap()], args].concat();
    Daemon::start(&args, &[socket], log)
}

/// What a Linux guest on the daemon needs: the kernel, and a new directory holding an initramfs
/// (with `iopoll` if asked) and the daemon's socket (`vhost.sock`).
struct LinuxFiles {
    kernel: Kernel,
    dir: tempfile::TempDir,
    initramfs: PathBuf,
    socket: PathBuf,
}

impl LinuxFiles {
    fn new(iopoll: bool) -> LinuxFiles {
        let kernel = kernel();
        let dir = tempfile::tempdir().unwrap();
        let initramfs = initramfs(&kernel, dir.path(), iopoll);
        let socket = dir.path().join("vhost.sock");
        LinuxFiles { kernel, dir, initramfs, socket }
    }

    /// A zeroed 64 MiB disk file in the directory, and the `--disk` spec that serves it.
    fn disk(&self) -> (PathBuf, String) {
        let disk = test_infra::disk_file(self.dir.path(), "disk.img", 64 << 20);
        let spec = format!("path={}", disk.display());
        (disk, spec)
    }

    /// The guest on these files, its console in the directory.
    fn guest(&self) -> Guest<'_> {
        Guest { kernel: &self.kernel, initramfs: &self.initramfs, socket: &self.socket, dir: self.dir.path() }
    }
}

struct Guest<'a> {
    kernel: &'a Kernel,
    initramfs: &'a Path,
    socket: &'a Path,
    dir: &'a Path,
}

struct Running {
    qemu: test_infra::KillOnDrop,
    console: PathBuf,
    started: Instant,
    what: String,
}

impl Guest<'_> {
    /// Boot, run the steps in `cmdline` and return the console output.
    fn run(&self, cmdline: &str, vcpus: u32, queues: u32) -> String {
        self.spawn(cmdline, vcpus, queues, false).finish()
    }

    /// Boot in the background; `reconnect`: QEMU reconnects to a backend that went away.
    fn spawn(&self, cmdline: &str, vcpus: u32, queues: u32, reconnect: bool) -> Running {
        let console = self.dir.join("console.log");
        let reconnect = if reconnect { ",reconnect=1" } else { "" };
        let qemu = Qemu::linux(self.kernel, self.initramfs, "256M", vcpus, cmdline)
            .vhost_user_blk_with(self.socket, reconnect, &format!(",num-queues={queues}"))
            .spawn(&console, Stdio::piped());
        let what = format!("{cmdline}, {vcpus} vCPUs, {queues} queues");
        Running { qemu: test_infra::KillOnDrop(qemu), console, started: Instant::now(), what }
    }
}

impl Running {
    fn console(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.console).unwrap_or_default()).into_owned()
    }

    /// Wait until the console shows `marker`.
    fn wait_for(&mut self, marker: &str) {
        while !has(&self.console(), marker) {
            if let Some(status) = self.qemu.try_wait().unwrap() {
                panic!("QEMU ended ({status}) before {marker}: {}", self.console());
            }
            self.check_timeout();
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn check_timeout(&mut self) {
        if self.started.elapsed() > QEMU_TIMEOUT {
            let _ = self.qemu.kill();
            let _ = self.qemu.wait();
            panic!("QEMU did not finish within {QEMU_TIMEOUT:?}: {}", self.console());
        }
    }

    /// Wait for the guest to power off; the console output, checked for success.
    fn finish(mut self) -> String {
        let status = loop {
            if let Some(status) = self.qemu.try_wait().unwrap() {
                break status;
            }
            self.check_timeout();
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut self.qemu.stderr.take().unwrap(), &mut stderr).unwrap();
        let output = self.console();
        eprintln!("QEMU ({}): {:.1} s", self.what, self.started.elapsed().as_secs_f64());
        assert!(status.success(), "QEMU failed ({status}): {stderr}\nconsole: {output}");
        assert!(!output.contains("VU-FAIL"), "the guest failed a step: {output}");
        assert!(output.contains("VU-DONE"), "the guest did not finish: {output}\nQEMU: {stderr}");
        output
    }
}

/// The line that holds `prefix`, from `prefix` on (the firmware's escape codes may precede it).
fn line<'a>(console: &'a str, prefix: &str) -> &'a str {
    console
        .lines()
        .find_map(|l| l.find(prefix).map(|at| l[at..].trim_end()))
        .unwrap_or_else(|| panic!("no {prefix} line in: {console}"))
}

fn has(console: &str, marker: &str) -> bool {
    console.lines().any(|l| l.trim_end().ends_with(marker))
}

#[test]
fn linux_virtio_blk_writes_reads_and_flushes_through_the_backend_across_restarts() {
    let _shared = test_infra::alongside_others();
    let files = LinuxFiles::new(false);
    let (dir, socket, guest) = (&files.dir, &files.socket, files.guest());
    let (disk, disk_arg) = files.disk();

    // 1. Write, read back, check, flush, with the IOCore sleeping on the kick eventfd.
    let backend =
        start_backend(socket, &["--disk", &disk_arg, "--io-mode", "eventfd"], &dir.path().join("b1.log"));
    let console = guest.run("vu.write=1 vu.read=1", 1, 1);
    assert_eq!(
        line(&console, "VU-DISK"),
        "VU-DISK size=67108864 ro=0 cache=write-back poll=0",
        "capacity, writable, FLUSH offered (write-back cache)"
    );
    for marker in ["VU-WRITE-OK", "VU-FLUSH-OK", "VU-VERIFY-OK"] {
        assert!(has(&console, marker), "{marker} missing: {console}");
    }
    let on_host = std::fs::read(&disk).unwrap();
    let at = PATTERN_BLOCK * 4096;
    assert!(on_host[at..at + PATTERN_LEN] == pattern()[..], "the backing file holds the guest's pattern");

    // 2. QEMU restarts (a new frontend on the same backend): the data is there.
    let console = guest.run("vu.read=1", 1, 1);
    assert!(has(&console, "VU-VERIFY-OK"), "{console}");
    let log = backend.stop();
    assert!(log.lines().filter(|l| l.contains("frontend connected")).count() == 2, "{log}");
    assert!(log.contains("requests completed, 0 I/O errors, 0 refused"), "{log}");
    assert!(!Path::new(&socket).exists(), "the backend removes its socket when stopped");

    // 3. The backend restarts (read-only now, and polling): the data is still there, and the
    //    guest sees a read-only disk.
    let ro_arg = format!("{disk_arg},readonly");
    let backend =
        start_backend(socket, &["--disk", &ro_arg, "--io-mode", "sidecore"], &dir.path().join("b3.log"));
    let console = guest.run("vu.read=1 vu.rocheck=1", 1, 1);
    assert!(has(&console, "VU-VERIFY-OK") && has(&console, "VU-RO-OK"), "{console}");
    assert!(line(&console, "VU-DISK").contains(" ro=1 "), "{console}");
    backend.stop();
    assert!(std::fs::read(&disk).unwrap() == on_host, "nothing changed the read-only disk");
}

#[test]
fn linux_keeps_its_disk_while_the_backend_restarts_under_it() {
    let _shared = test_infra::alongside_others();
    let files = LinuxFiles::new(false);
    let (dir, socket, guest) = (&files.dir, &files.socket, files.guest());
    let (disk, disk_arg) = files.disk();
    let args = ["--disk", disk_arg.as_str(), "--io-mode", "adaptive"];

    let first = start_backend(socket, &args, &dir.path().join("b1.log"));
    // QEMU stays up; it reconnects to the socket when the backend comes back.
    let mut running = guest.spawn("vu.write=1 vu.waitgo=1 vu.read=1", 1, 1, true);
    running.wait_for("VU-WAITING");
    first.stop();
    let mut file = std::fs::OpenOptions::new().write(true).open(&disk).unwrap();
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(16 * 512)).unwrap();
    file.write_all(b"GO-AHEAD").unwrap();
    drop(file);
    let second = start_backend(socket, &args, &dir.path().join("b2.log"));
    let console = running.finish();
    assert!(has(&console, "VU-GO") && has(&console, "VU-VERIFY-OK"), "{console}");
    let log = second.stop();
    assert!(log.contains("frontend connected"), "QEMU reconnected: {log}");
}

#[test]
fn linux_polled_io_on_a_poll_queue_of_a_two_queue_device() {
    let _shared = test_infra::alongside_others();
    let files = LinuxFiles::new(true);
    let (dir, socket, guest) = (&files.dir, &files.socket, files.guest());
    let backend = start_backend(
        socket,
        &["--disk", "ram=64M", "--queues", "2", "--io-mode", "adaptive"],
        &dir.path().join("b.log"),
    );
    // virtio_blk gives at most one queue per CPU, and keeps one for interrupt-driven I/O.
    let console = guest.run("virtio_blk.poll_queues=1 vu.write=1 vu.read=1 vu.iopoll=1", 2, 2);
    let log = backend.stop();
    assert!(line(&console, "VU-QUEUES").ends_with("1/0/1 default/read/poll queues"), "{console}");
    assert!(line(&console, "VU-DISK").ends_with(" poll=1"), "{console}");
    assert!(has(&console, "VU-VERIFY-OK"), "{console}");
    assert!(console.contains("VU-IOPOLL-OK 64"), "{console}");
    // The polled requests went to the poll queue (vring 1): 64 writes and 64 reads.
    let served: u64 = log
        .lines()
        .filter_map(|l| {
            l.split_once("vring 1 stopped at avail index ")?.1.split_once(": ")?.1.split(' ').next()
        })
        .map(|n| n.parse::<u64>().unwrap())
        .sum();
    assert!(served >= 128, "vring 1 served {served} requests: {log}");
    std::io::stderr().write_all(log.as_bytes()).unwrap();
}

#[test]
fn bad_command_lines_and_socket_paths_are_refused() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, b"keep me").unwrap();
    let run = |args: &[&str]| Daemon::builder().args(args, &[]).command().output().unwrap();
    let out = run(&["--socket", file.to_str().unwrap(), "--disk", "ram=1M"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a socket"), "{out:?}");
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
    let socket = dir.path().join("s");
    let socket = socket.to_str().unwrap();
    for bad in [
        &["--socket", socket, "--disk", "ram=1M", "--queues", "0"][..],
        &["--socket", socket, "--disk", "ram=1M", "--queues", "17"],
        &["--socket", socket, "--disk", "ram=1M", "--io-mode", "trap"],
        &["--socket", socket, "--disk", "size=1M"],
        &["--socket", socket],
        &["--disk", "ram=1M"],
    ] {
        assert_eq!(run(bad).status.code(), Some(2), "{bad:?}");
    }
    let missing = dir.path().join("missing.img");
    let out = run(&["--socket", socket, "--disk", &format!("path={}", missing.display())]);
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot open the disk"), "{out:?}");
}

/// One daemon, two frontends at once on one IOCore: this Linux guest with its own virtio-blk
/// driver on one disk, reading it over and over while it waits for a go-ahead, and an exitless
/// VM (the VMM as a vhost-user frontend) verifying another disk meanwhile. Both host files hold
/// what their guest wrote.
#[test]
fn linux_and_an_exitless_vm_share_one_daemon_at_once() {
    let _shared = test_infra::alongside_others();
    let kernel = kernel();
    let dir = tempfile::tempdir().unwrap();
    let initramfs = initramfs(&kernel, dir.path(), false);
    let (linux_disk, probe_disk) = (dir.path().join("linux.img"), dir.path().join("probe.img"));
    std::fs::File::create(&linux_disk).unwrap().set_len(64 << 20).unwrap();
    std::fs::File::create(&probe_disk).unwrap().set_len(16 << 20).unwrap();
    let (socket, probe_socket) = (dir.path().join("linux.sock"), dir.path().join("probe.sock"));
    // Each disk's socket listens in turn: wait for both, not only the first.
    let backend = Daemon::start(
        &[
            "--socket",
            socket.to_str().unwrap(),
            "--disk",
            &format!("path={}", linux_disk.display()),
            "--disk",
            &format!("socket={},path={},direct", probe_socket.display(), probe_disk.display()),
        ],
        &[&socket, &probe_socket],
        &dir.path().join("daemon.log"),
    );
    let guest = Guest { kernel: &kernel, initramfs: &initramfs, socket: &socket, dir: dir.path() };
    let mut linux = guest.spawn("vu.write=1 vu.waitgo=1 vu.read=1", 1, 1, false);
    linux.wait_for("VU-WAITING");

    let (seed, blocks) = (77, 2048);
    let cmdline =
        format!("probe.workload=blk probe.rw=verify probe.ops={blocks} probe.qd=8 probe.seed={seed}");
    let disk = format!("vhost-user={}", probe_socket.display());
    let out = test_infra::exitless_within(
        QEMU_TIMEOUT,
        &[
            "run",
            "--probe",
            "--disk",
            &disk,
            "--io-mode",
            "exitless",
            "--cmdline",
            &cmdline,
            "--timeout",
            "120",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}\n{}", test_infra::stdout(&out), test_infra::stderr(&out));
    let result = test_infra::line_with(&out, "probe", "blk");
    assert_eq!((result["errors"].as_u64(), result["mismatches"].as_u64()), (Some(0), Some(0)), "{result}");
    test_infra::assert_holds_only_pattern(&probe_disk, seed, blocks);
    assert!(!has(&linux.console(), "VU-GO"), "Linux was still reading its disk: {}", linux.console());

    // The go-ahead, written on the host into the sector Linux keeps reading.
    let mut file = std::fs::OpenOptions::new().write(true).open(&linux_disk).unwrap();
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(16 * 512)).unwrap();
    file.write_all(b"GO-AHEAD").unwrap();
    file.sync_all().unwrap();
    let console = linux.finish();
    for marker in ["VU-WRITE-OK", "VU-FLUSH-OK", "VU-GO", "VU-VERIFY-OK"] {
        assert!(has(&console, marker), "{marker} missing: {console}");
    }
    let on_host = std::fs::read(&linux_disk).unwrap();
    let at = PATTERN_BLOCK * 4096;
    assert!(on_host[at..at + PATTERN_LEN] == pattern()[..], "the backing file holds Linux's pattern");
    let log = backend.stop();
    assert_eq!(log.matches("frontend connected").count(), 2, "{log}");
}
