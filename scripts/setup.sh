#!/usr/bin/env bash
# Installs what exitless needs on a fresh Debian machine; safe to run again.
#   - Debian packages: QEMU (peer VMM for tests and benchmarks), fio (the bare-metal baseline),
#     iproute2 (network namespaces, taps and veth pairs for the network tests and benchmark),
#     Debian's cloud kernel and a static busybox (the Linux guest that tests the vhost-user-blk
#     backend under QEMU TCG; the test builds its initramfs itself), e2fsprogs (mkfs.ext4: the
#     small file systems the fault tests fill, and turn read-only, under a running guest; mke2fs
#     and e2fsck in the Linux compatibility suite's guest), util-linux and coreutils (that guest's
#     blkdiscard and dd)
#   - the x86_64-unknown-none Rust target (the probe guest)
#   - cargo-fuzz and a C++ compiler (libFuzzer), for scripts/fuzz.sh; its gcc is also the C
#     compiler the Linux compatibility suite builds a small helper with
# and checks that /dev/kvm is usable.
set -euo pipefail

packages=(qemu-system-x86 fio iproute2 linux-image-cloud-amd64 busybox-static e2fsprogs util-linux coreutils)
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

if [ ! -r /dev/kvm ] || [ ! -w /dev/kvm ]; then
    echo "setup: /dev/kvm is missing or not accessible to $(id -un); exitless needs KVM" >&2
    exit 1
fi
