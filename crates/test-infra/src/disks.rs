//! One disk of each backend kind the VMM and the daemon serve, for the tests that must hold on
//! every one of them (the hostile-queue cases): a RAM disk, a file with O_DIRECT, a buffered
//! file, and a loop device. The three io_uring kinds differ in what the kernel does with a
//! request (a direct write to the file system, the page cache, a block device's own queue), and
//! so in when it finishes and whether a request left unsubmitted ever would.

use std::path::Path;

use crate::LoopDevice;

/// A backend kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskKind {
    /// A /dev/shm file mapped into the process: requests finish inside `submit`.
    Ram,
    /// An ext4 file through io_uring with O_DIRECT.
    DirectFile,
    /// An ext4 file through io_uring, through the page cache.
    BufferedFile,
    /// A loop device (doing direct I/O over an ext4 file) through io_uring with O_DIRECT.
    LoopDevice,
}

/// Every kind, the RAM disk first.
pub const DISK_KINDS: [DiskKind; 4] =
    [DiskKind::Ram, DiskKind::DirectFile, DiskKind::BufferedFile, DiskKind::LoopDevice];

impl DiskKind {
    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            DiskKind::Ram => "ram",
            DiskKind::DirectFile => "direct file",
            DiskKind::BufferedFile => "buffered file",
            DiskKind::LoopDevice => "loop device",
        }
    }

    /// A zeroed disk of `bytes` of this kind: the RAM disk's file in /dev/shm, the others' in
    /// /tmp (which must take O_DIRECT: ext4 here). A loop device is attached with `losetup`
    /// (as root) and detached when the disk is dropped; without it the test fails saying so.
    pub fn make(self, bytes: u64) -> TestDisk {
        let dir = if self == DiskKind::Ram { "/dev/shm" } else { "/tmp" };
        let file = tempfile::Builder::new().prefix("exitless-disk").tempfile_in(dir).unwrap();
        file.as_file().set_len(bytes).unwrap();
        let file = file.into_temp_path();
        let (spec, device) = match self {
            DiskKind::Ram => (format!("ram,path={}", file.display()), None),
            DiskKind::DirectFile => (format!("path={},direct", file.display()), None),
            DiskKind::BufferedFile => (format!("path={}", file.display()), None),
            DiskKind::LoopDevice => {
                let device = LoopDevice::attach(&file);
                (format!("path={},direct", device.path.display()), Some(device))
            }
        };
        TestDisk { _device: device, file, spec, kind: self }
    }
}

/// A disk made by [`DiskKind::make`]; its loop device is detached, then its file removed, when
/// dropped.
pub struct TestDisk {
    /// Declared first so it is detached before the file goes.
    _device: Option<LoopDevice>,
    file: tempfile::TempPath,
    /// The `--disk` value that serves it (add `socket=PATH,` in front for the daemon).
    pub spec: String,
    /// Its kind.
    pub kind: DiskKind,
}

impl TestDisk {
    /// The file that holds the disk's bytes (a loop device's backing file).
    pub fn file(&self) -> &Path {
        &self.file
    }
}
