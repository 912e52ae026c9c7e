//! `held_disk.c`, a FUSE file system in front of a disk file that can hold the requests touching
//! one byte of it in the kernel: a real request, really in flight, on a disk that does not
//! answer until told to. Needs root (FUSE mounts), libfuse3-dev, fuse3 and a C compiler.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Build `held_disk.c` into `dir`.
pub fn held_disk_program(dir: &Path) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/held_disk.c");
    let binary = dir.join("held_disk");
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", "fuse3"])
        .output()
        .expect("pkg-config (scripts/setup.sh installs it with libfuse3-dev)");
    assert!(
        flags.status.success(),
        "libfuse3 is missing: install libfuse3-dev and fuse3 (scripts/setup.sh does): {}",
        String::from_utf8_lossy(&flags.stderr)
    );
    let flags = String::from_utf8(flags.stdout).unwrap();
    let out = Command::new("cc")
        .args(["-O2", "-Wall", "-o"])
        .arg(&binary)
        .arg(&source)
        .args(flags.split_whitespace())
        .output()
        .expect("a C compiler (cc) must be installed: scripts/setup.sh installs g++");
    assert!(out.status.success(), "cc held_disk.c: {}", String::from_utf8_lossy(&out.stderr));
    binary
}

/// `file` behind a FUSE mount that can hold the requests touching one byte of it.
pub struct HeldDisk {
    mount: PathBuf,
    control: PathBuf,
    server: Child,
}

impl HeldDisk {
    /// Serve `file` at DIR/held/disk; requests touching byte `held_offset` can be held.
    pub fn start(dir: &Path, file: &Path, held_offset: u64) -> HeldDisk {
        HeldDisk::start_slow(dir, file, held_offset, 0)
    }

    /// As `start`, each write taking `write_delay_us` longer.
    pub fn start_slow(dir: &Path, file: &Path, held_offset: u64, write_delay_us: u64) -> HeldDisk {
        let program = held_disk_program(dir);
        let mount = dir.join("held");
        let control = dir.join("held-control");
        std::fs::create_dir_all(&mount).unwrap();
        std::fs::create_dir_all(&control).unwrap();
        let server = Command::new(program)
            .arg(&mount)
            .arg("-f")
            .env("HELD_BACKING", file)
            .env("HELD_OFFSET", held_offset.to_string())
            .env("HELD_CONTROL", &control)
            .env("HELD_WRITE_DELAY_US", write_delay_us.to_string())
            .stderr(std::fs::File::create(dir.join("held_disk.err")).unwrap())
            .spawn()
            .expect("start held_disk");
        let disk = HeldDisk { mount, control, server };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !disk.disk().exists() {
            assert!(
                Instant::now() < deadline,
                "the FUSE file system did not come up (needs root and /dev/fuse)"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        disk
    }

    /// The disk as the FUSE file system serves it (DIR/held/disk).
    pub fn disk(&self) -> PathBuf {
        self.mount.join("disk")
    }

    /// Hold the requests touching the byte from now on ([`HeldDisk::held`] forgets the last
    /// one held).
    pub fn hold(&self) {
        let _ = std::fs::remove_file(self.control.join("held"));
        std::fs::write(self.control.join("hold"), b"").unwrap();
    }

    /// Hold the first request touching the byte, and let the later ones pass while it waits.
    pub fn hold_one(&self) {
        std::fs::write(self.control.join("one"), b"").unwrap();
        self.hold();
    }

    /// Let held requests go; `drop`: they fail with EIO without reaching the file.
    pub fn release(&self, drop: bool) {
        if drop {
            std::fs::write(self.control.join("drop"), b"").unwrap();
        }
        let _ = std::fs::remove_file(self.control.join("hold"));
        let _ = std::fs::remove_file(self.control.join("one"));
    }

    /// Hold every open of the disk from now on, until `release_open`.
    pub fn hold_open(&self) {
        std::fs::write(self.control.join("hold-open"), b"").unwrap();
    }

    /// Let held opens go.
    pub fn release_open(&self) {
        let _ = std::fs::remove_file(self.control.join("hold-open"));
    }

    /// Has an open of the disk been held?
    pub fn open_held(&self) -> bool {
        self.control.join("opening").exists()
    }

    /// What the request being held is ("write 0 4096"), if one is.
    pub fn held(&self) -> Option<String> {
        std::fs::read_to_string(self.control.join("held")).ok().map(|s| s.trim().to_owned())
    }
}

impl Drop for HeldDisk {
    fn drop(&mut self) {
        self.release_open();
        self.release(true);
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}
