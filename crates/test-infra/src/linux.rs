//! A Linux guest for QEMU TCG: Debian's cloud kernel, the modules its virtio-blk driver needs,
//! and a busybox initramfs with a given /init (what scripts/setup.sh installs).

use std::path::{Path, PathBuf};

/// The newest /boot/vmlinuz-* and the modules its virtio-blk driver needs, in load order (none
/// where they are built in).
pub struct Kernel {
    /// /boot/vmlinuz-VERSION.
    pub image: PathBuf,
    /// The modules to load, in order.
    pub modules: Vec<PathBuf>,
}

/// The kernel scripts/setup.sh installs (the newest in /boot) and its virtio-blk modules;
/// panics, saying what to install, without them.
pub fn kernel() -> Kernel {
    kernel_with(&["virtio_pci", "virtio_blk"])
}

/// As [`kernel`], with the modules of `drivers` (and what they need), in that order.
pub fn kernel_with(drivers: &[&str]) -> Kernel {
    let mut images: Vec<PathBuf> = std::fs::read_dir("/boot")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("vmlinuz-")))
        .collect();
    images.sort();
    let image = images.pop().unwrap_or_else(|| {
        panic!("no /boot/vmlinuz-*: run scripts/setup.sh (it installs Debian's linux-image-cloud-amd64)")
    });
    let version = image.file_name().unwrap().to_str().unwrap().trim_start_matches("vmlinuz-").to_owned();
    let dir = PathBuf::from("/lib/modules").join(&version);
    let builtin = std::fs::read_to_string(dir.join("modules.builtin")).unwrap_or_default();
    let deps = std::fs::read_to_string(dir.join("modules.dep")).unwrap_or_else(|e| {
        panic!("cannot read {}/modules.dep ({e}): are the modules installed?", dir.display())
    });
    let mut modules: Vec<PathBuf> = Vec::new();
    for &wanted in drivers {
        let name = format!("/{wanted}.ko");
        if builtin.lines().any(|l| l.ends_with(&name)) {
            continue;
        }
        let line = deps
            .lines()
            .find(|l| l.split(':').next().is_some_and(|m| m.ends_with(&name)))
            .unwrap_or_else(|| panic!("{wanted} is neither built into {version} nor a module"));
        let (module, needs) = line.split_once(':').unwrap();
        // modules.dep lists a module's dependencies last-loaded first.
        for path in needs.split_whitespace().rev().chain([module]) {
            let path = dir.join(path);
            assert!(
                path.extension().is_some_and(|e| e == "ko"),
                "{}: busybox insmod needs .ko",
                path.display()
            );
            if !modules.contains(&path) {
                modules.push(path);
            }
        }
    }
    Kernel { image, modules }
}

/// Write an initramfs to `path`: static busybox, `init` as /init, the kernel's modules in
/// /lib/modules and their names, in load order, in /modules.
pub fn initramfs(kernel: &Kernel, init: &str, path: &Path) {
    initramfs_with(kernel, init, &[], path)
}

/// `initramfs` with more files: (name, permissions, contents).
pub fn initramfs_with(kernel: &Kernel, init: &str, files: &[(&str, u32, &[u8])], path: &Path) {
    let busybox = std::fs::read("/bin/busybox").expect("/bin/busybox: run scripts/setup.sh (busybox-static)");
    assert!(
        !has_interpreter(&busybox),
        "/bin/busybox is dynamically linked: install busybox-static (scripts/setup.sh)"
    );
    let mut cpio = Cpio::default();
    for d in ["bin", "dev", "lib", "lib/modules"] {
        cpio.entry(d, 0o040755, &[], (0, 0));
    }
    cpio.entry("dev/console", 0o020600, &[], (5, 1));
    cpio.entry("bin/busybox", 0o100755, &busybox, (0, 0));
    cpio.entry("init", 0o100755, init.as_bytes(), (0, 0));
    let mut names = String::new();
    for module in &kernel.modules {
        let name = module.file_name().unwrap().to_str().unwrap();
        cpio.entry(&format!("lib/modules/{name}"), 0o100644, &std::fs::read(module).unwrap(), (0, 0));
        names.push_str(name);
        names.push('\n');
    }
    cpio.entry("modules", 0o100644, names.as_bytes(), (0, 0));
    let mut dirs: Vec<String> = ["bin", "dev", "lib", "lib/modules"].map(String::from).to_vec();
    for (name, mode, data) in files {
        // The kernel unpacks an archive in order and makes no parent directory itself.
        let mut parent = String::new();
        for part in name.split('/').collect::<Vec<_>>().split_last().unwrap().1 {
            parent = if parent.is_empty() { part.to_string() } else { format!("{parent}/{part}") };
            if !dirs.contains(&parent) {
                cpio.entry(&parent, 0o040755, &[], (0, 0));
                dirs.push(parent.clone());
            }
        }
        cpio.entry(name, 0o100000 | mode, data, (0, 0));
    }
    std::fs::write(path, cpio.finish()).unwrap();
}

/// `initramfs_with` host programs (as `host_programs` gives them), each executable.
pub fn initramfs_with_programs(kernel: &Kernel, init: &str, programs: &[(String, Vec<u8>)], path: &Path) {
    let files: Vec<(&str, u32, &[u8])> =
        programs.iter().map(|(name, data)| (name.as_str(), 0o755, data.as_slice())).collect();
    initramfs_with(kernel, init, &files, path);
}

/// `dd`, for `host_programs`.
pub const DD: (&str, &str) = ("/usr/bin/dd", "coreutils");
/// `fio`, for `host_programs`.
pub const FIO: (&str, &str) = ("/usr/bin/fio", "fio");

/// An initramfs at DIR/initramfs.cpio with `init` as /init and the host `programs` (path,
/// package that installs it: see `host_programs`): its path.
pub fn initramfs_in(dir: &Path, kernel: &Kernel, init: &str, programs: &[(&str, &str)]) -> PathBuf {
    let path = dir.join("initramfs.cpio");
    initramfs_with_programs(kernel, init, &host_programs(programs), &path);
    path
}

/// Host programs for an initramfs, with every shared library `ldd` says they load (the dynamic
/// loader included), each at its path on the host without the leading `/`: (path, contents).
/// Panics, naming the package, when a program is missing.
pub fn host_programs(programs: &[(&str, &str)]) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let add = |path: &str, files: &mut Vec<(String, Vec<u8>)>| {
        let name = path.trim_start_matches('/').to_owned();
        if !files.iter().any(|(n, _)| *n == name) {
            let data = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
            files.push((name, data));
        }
    };
    for &(program, package) in programs {
        assert!(
            Path::new(program).exists(),
            "{program} is missing: install {package} (scripts/setup.sh installs it)"
        );
        add(program, &mut files);
        let out = std::process::Command::new("ldd").arg(program).output().expect("ldd (libc-bin)");
        assert!(out.status.success(), "ldd {program}: {}", String::from_utf8_lossy(&out.stderr));
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)".
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let path = line.split("=>").last().unwrap().split_whitespace().next().unwrap_or("");
            if path.starts_with('/') {
                add(path, &mut files);
            }
        }
    }
    files
}

/// Does this ELF executable name a dynamic loader (PT_INTERP)?
fn has_interpreter(elf: &[u8]) -> bool {
    let u16_at = |at: usize| usize::from(u16::from_le_bytes([elf[at], elf[at + 1]]));
    let phoff = usize::try_from(u64::from_le_bytes(elf[32..40].try_into().unwrap())).unwrap();
    let (phentsize, phnum) = (u16_at(54), u16_at(56));
    (0..phnum).any(|i| elf[phoff + i * phentsize..][..4] == 3u32.to_le_bytes())
}

/// The opening of every /init, as a literal for `concat!`.
macro_rules! init_mounts {
    () => {
        r#"#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /sbin /usr/bin /usr/sbin /tmp /mnt /etc
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
mount -t tmpfs tmp /tmp
ln -s /proc/mounts /etc/mtab
export LD_LIBRARY_PATH=/lib/x86_64-linux-gnu
"#
    };
}

/// The start of an /init that loads its modules itself: busybox's applets, /proc, /sys, /dev,
/// a tmpfs /tmp, /etc/mtab and the host programs' libraries.
pub const INIT_MOUNTS: &str = init_mounts!();

/// The start of an /init: `INIT_MOUNTS`, the modules, and a wait for /dev/vda.
pub const INIT_PRELUDE: &str = concat!(
    init_mounts!(),
    r#"for m in $(cat /modules); do insmod /lib/modules/$m; done
i=0
while [ ! -b /dev/vda ]; do sleep 0.1; i=$((i + 1)); [ $i -gt 100 ] && { echo NO-VDA; poweroff -f; }; done
"#
);

/// A cpio "newc" archive (what the kernel unpacks as initramfs).
#[derive(Default)]
struct Cpio(Vec<u8>);

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8], rdev: (u32, u32)) {
        let ino = u32::try_from(self.0.len()).unwrap() + 1;
        let (size, name_size) = (u32::try_from(data.len()).unwrap(), u32::try_from(name.len()).unwrap() + 1);
        let fields = [ino, mode, 0, 0, 1, 0, size, 0, 0, rdev.0, rdev.1, name_size, 0];
        self.0.extend_from_slice(b"070701");
        for field in fields {
            self.0.extend_from_slice(format!("{field:08x}").as_bytes());
        }
        self.0.extend_from_slice(name.as_bytes());
        self.0.push(0);
        self.pad();
        self.0.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.0.len().is_multiple_of(4) {
            self.0.push(0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[], (0, 0));
        while !self.0.len().is_multiple_of(512) {
            self.0.push(0);
        }
        self.0
    }
}
