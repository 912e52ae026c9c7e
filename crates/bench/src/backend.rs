//! What a bench row's I/O ended up on, so that a row is compared with QEMU only on the same kind
//! of backend: exitless's null disk against QEMU's null device, a file against the same file
//! with the same cache mode; never a RAM disk's memory copy against QEMU reading the same tmpfs
//! file through io_uring, nor against QEMU's null device (that compares backends, not VMMs).

use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use serde::Serialize;

/// The kind of backend behind a row, with its cache mode where it has one (`--json`: `backend`).
#[derive(Serialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// A disk that holds nothing, no system call per request: exitless's null disk (reads zero
    /// the guest's buffer, writes are dropped), fio's `null` engine, QEMU's `null-co` with
    /// `read-zeroes=on` (a memset on reads, nothing on writes) in its own virtio-blk and in
    /// qemu-storage-daemon.
    Null,
    /// A memory copy to or from a mapping of a /dev/shm file, no system call per request:
    /// exitless's RAM disk, fio's `mmap` engine on the same file. QEMU has no such backend.
    Ram,
    /// A file on a disk's file system, opened with O_DIRECT.
    FileDirect,
    /// A file on a disk's file system, through the page cache.
    FileBuffered,
    /// A file on tmpfs, read with O_DIRECT (tmpfs takes it since Linux 6.6: a copy from its pages).
    TmpfsDirect,
    /// A file on tmpfs, through the page cache.
    TmpfsBuffered,
    /// A block device opened with O_DIRECT.
    BlockDeviceDirect,
    /// A block device through the page cache.
    BlockDeviceBuffered,
    /// An RBD image on a Ceph cluster, through librbd with its cache off (a write is answered
    /// once the OSD has it): exitless's `rbd=` disk, fio's `rbd` engine, QEMU's `driver=rbd`
    /// with `cache.direct=on` in its own virtio-blk and in qemu-storage-daemon.
    Rbd,
}

impl Backend {
    /// `path` (a file on a disk, on tmpfs, or a block device) opened with O_DIRECT or not. A
    /// path that cannot be examined counts as a file on a disk.
    pub fn of_file(path: &Path, direct: bool) -> Backend {
        let block_device = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device());
        match (block_device, on_tmpfs(path), direct) {
            (true, _, true) => Backend::BlockDeviceDirect,
            (true, _, false) => Backend::BlockDeviceBuffered,
            (false, true, true) => Backend::TmpfsDirect,
            (false, true, false) => Backend::TmpfsBuffered,
            (false, false, true) => Backend::FileDirect,
            (false, false, false) => Backend::FileBuffered,
        }
    }

    /// The name `--json` and the tables use.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Null => "null",
            Backend::Ram => "ram",
            Backend::FileDirect => "file-direct",
            Backend::FileBuffered => "file-buffered",
            Backend::TmpfsDirect => "tmpfs-direct",
            Backend::TmpfsBuffered => "tmpfs-buffered",
            Backend::BlockDeviceDirect => "block-device-direct",
            Backend::BlockDeviceBuffered => "block-device-buffered",
            Backend::Rbd => "rbd",
        }
    }

    /// How the backend's file is opened, for the baseline's description: "O_DIRECT" or
    /// "through the page cache" (the null and RAM disks' baselines count as O_DIRECT: fio's null
    /// engine has no file, and the RAM disk's system-call engines read its file with O_DIRECT);
    /// an RBD image has no file: librbd with its cache off.
    pub fn caching(self) -> &'static str {
        match self {
            Backend::FileBuffered | Backend::TmpfsBuffered | Backend::BlockDeviceBuffered => {
                "through the page cache"
            }
            Backend::Rbd => "librbd with its cache off (rbd_cache=false)",
            _ => "O_DIRECT",
        }
    }

    /// One line for a table's notes: what the name stands for.
    pub fn describe(self) -> &'static str {
        match self {
            Backend::Null => {
                "null: a disk that holds nothing, no system call per I/O: exitless's null disk (reads \
                 zero the buffer, writes are dropped), fio's null engine, QEMU's null-co with \
                 read-zeroes=on (its virtio-blk and qemu-storage-daemon)"
            }
            Backend::Ram => {
                "ram: a memory copy to or from a mapping of the /dev/shm file, no system call per I/O: \
                 exitless's RAM disk, fio mmap; no x QEMU: QEMU cannot map a /dev/shm file as a disk \
                 (its rows on that file go through io_uring, tmpfs-direct), and its null-co is the null \
                 disk's peer"
            }
            Backend::FileDirect => "file-direct: a file on a disk's file system, O_DIRECT",
            Backend::FileBuffered => "file-buffered: a file on a disk's file system, through the page cache",
            Backend::TmpfsDirect => {
                "tmpfs-direct: the file on tmpfs through a system call or io_uring, O_DIRECT (QEMU: \
                 cache=none / cache.direct=on)"
            }
            Backend::TmpfsBuffered => "tmpfs-buffered: the file on tmpfs, through the page cache",
            Backend::BlockDeviceDirect => "block-device-direct: the block device, O_DIRECT",
            Backend::BlockDeviceBuffered => "block-device-buffered: the block device, through the page cache",
            Backend::Rbd => {
                "rbd: an RBD image through librbd with its cache off (a write is answered once the OSD \
                 has it): exitless's rbd= disk (in the VMM, and behind QEMU as exitless's vhost-user \
                 backend), fio's rbd engine, QEMU's driver=rbd with cache.direct=on (its virtio-blk and \
                 qemu-storage-daemon)"
            }
        }
    }
}

/// Whether `path` lives on tmpfs (false if it cannot be examined).
fn on_tmpfs(path: &Path) -> bool {
    super::scratch::file_system(path).is_ok_and(|kind| kind == super::scratch::TMPFS_MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_told_apart_by_its_file_system_and_cache_mode() {
        let shm = tempfile::NamedTempFile::new_in("/dev/shm").unwrap();
        assert_eq!(Backend::of_file(shm.path(), true), Backend::TmpfsDirect);
        assert_eq!(Backend::of_file(shm.path(), false), Backend::TmpfsBuffered);
        // /tmp is on the root file system (ext4) here.
        let disk = tempfile::NamedTempFile::new_in("/tmp").unwrap();
        assert_eq!(Backend::of_file(disk.path(), true), Backend::FileDirect);
        assert_eq!(Backend::of_file(disk.path(), false), Backend::FileBuffered);
        assert_eq!(serde_json::to_value(Backend::BlockDeviceDirect).unwrap(), "block-device-direct");
        for backend in [
            Backend::Null,
            Backend::Ram,
            Backend::FileDirect,
            Backend::TmpfsBuffered,
            Backend::BlockDeviceBuffered,
            Backend::Rbd,
        ] {
            assert_eq!(serde_json::to_value(backend).unwrap(), backend.name());
        }
    }
}
