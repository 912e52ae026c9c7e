#!/usr/bin/env bash
# Installs what exitless needs on a fresh Debian machine; safe to run again.
#   - Debian packages: QEMU (peer VMM for tests and benchmarks), fio (the bare-metal baseline),
#     iproute2 (network namespaces, taps and veth pairs for the network tests and benchmark),
#     Debian's cloud kernel and a static busybox (the Linux guest that tests the vhost-user-blk
#     backend under QEMU TCG; the test builds its initramfs itself), e2fsprogs (mkfs.ext4: the
#     small file systems the fault tests fill, and turn read-only, under a running guest; mke2fs
#     and e2fsck in the Linux compatibility suite's guest), util-linux and coreutils (that guest's
#     blkdiscard and dd), gcc and libc6-dev (`cc -static`: the polled-I/O helper in the Linux
#     guest's initramfs), mount (losetup: the loop devices the hostile-queue and loop-device tests
#     attach), fuse3, libfuse3-dev and pkg-config (tests/inflight.rs builds a FUSE file system
#     that holds one request of a disk in the kernel, or makes its writes slow),
#     python3-prometheus-client (Prometheus's own parser reads the daemon's /metrics in the
#     control API's tests), ceph-mon, ceph-osd and ceph-common (scripts/ceph.sh's throw-away
#     cluster for the RBD tests and benchmarks; they bring librbd1, which exitless loads for
#     `rbd=` disks), qemu-block-extra (QEMU's and qemu-storage-daemon's rbd driver, the peers on
#     the same cluster), bc (ceph.sh's timing), openssl
#     (scripts/tls-certs.sh: certificates for migrations over TCP with mutual TLS, in tests and
#     bench migrate)
#   - the x86_64-unknown-none Rust target (the probe guest)
#   - tracefs mounted at /sys/kernel/tracing (the FLUSH tests read io_uring's tracepoints)
#   - cargo-fuzz and a C++ compiler (libFuzzer), for scripts/fuzz.sh; its gcc is also the C
#     compiler the Linux compatibility suite builds a small helper with
# and checks that /dev/kvm is usable.
set -euo pipefail

packages=(qemu-system-x86 fio iproute2 linux-image-cloud-amd64 busybox-static e2fsprogs util-linux coreutils
    gcc libc6-dev mount fuse3 libfuse3-dev pkg-config
    python3-prometheus-client ceph-mon ceph-osd ceph-common librbd1 qemu-block-extra bc openssl ethtool)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null || ! command -v rustup >/dev/null; then
    echo "setup: exitless needs Rust through rustup (cargo and rustup on PATH)" >&2
    exit 1
fi
rustup target list --installed | grep -qx x86_64-unknown-none || rustup target add x86_64-unknown-none

# Fuzzing (scripts/fuzz.sh): cargo-fuzz builds libFuzzer (C++) into each target; stable
# toolchain, no sanitizer.
if ! command -v c++ >/dev/null; then
    echo "setup: installing g++ (libFuzzer)" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends g++ >/dev/null
fi
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --version 0.13.2 --locked

# Huge pages, which the tests use for real rather than only checking the error for too few:
# 2 MiB pages reserved (a 48 MiB guest with --hugepages takes 24, fio's huge-page buffers a
# few; room for two such guests), as .ci/run does; and transparent huge pages not switched off
# (guest RAM asks for them).
# Neither survives a reboot: scripts/test.sh runs this first.
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
huge_pages=64
if [ "$(cat /proc/sys/vm/nr_hugepages)" -lt "$huge_pages" ]; then
    echo "setup: reserving $huge_pages 2 MiB huge pages (vm.nr_hugepages)" >&2
    echo "$huge_pages" | as_root tee /proc/sys/vm/nr_hugepages >/dev/null
    got=$(cat /proc/sys/vm/nr_hugepages)
    [ "$got" -ge "$huge_pages" ] || echo "setup: the kernel gave only $got huge pages (memory fragmented?); the --hugepages tests will say what is missing" >&2
fi
thp=/sys/kernel/mm/transparent_hugepage/enabled
if [ -e "$thp" ] && grep -q '\[never\]' "$thp"; then
    echo "setup: letting programs ask for transparent huge pages ($thp: madvise)" >&2
    echo madvise | as_root tee "$thp" >/dev/null
fi

# tracefs: tests/flush.rs reads io_uring's tracepoints to show that every FLUSH is an fsync.
if [ ! -d /sys/kernel/tracing/instances ]; then
    as_root mount -t tracefs nodev /sys/kernel/tracing
fi

if [ ! -r /dev/kvm ] || [ ! -w /dev/kvm ]; then
    echo "setup: /dev/kvm is missing or not accessible to $(id -un); exitless needs KVM" >&2
    exit 1
fi
