//! Which disk to serve, and opening it: the one place that turns a disk's description (from
//! `exitless run --disk` or `exitless vhost-user-blk --disk`) into backends, shared by the VMM's
//! own devices and the vhost-user daemon.

use std::path::PathBuf;

use crate::open::{open_without_blocking, Wanted};
use crate::{Backend, BackendError, FileDisk, FileDiskOptions, NullDisk, RamDisk, RbdDisk, RbdSpec};

/// Where a disk's bytes live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskSpec {
    /// A raw file (or block device) through io_uring; `direct`: O_DIRECT.
    File {
        /// The file or block device.
        path: PathBuf,
        /// Writes fail (VIRTIO_BLK_F_RO is offered).
        read_only: bool,
        /// Bypass the host page cache (O_DIRECT) where the file system allows it.
        direct: bool,
    },
    /// A new RAM disk of `size` bytes (a memfd, which no path leads to), gone when its last
    /// backend is dropped.
    Ram {
        /// Bytes, a non-zero multiple of 512.
        size: u64,
    },
    /// An existing file on a memory file system (/dev/shm), mapped and shared with the host.
    RamFile {
        /// The /dev/shm file.
        path: PathBuf,
        /// Writes fail.
        read_only: bool,
    },
    /// An image in a Ceph cluster, through librbd.
    Rbd(RbdSpec),
    /// A disk of `size` bytes that holds nothing: reads return zeros, writes are dropped.
    Null {
        /// Bytes, a non-zero multiple of 512.
        size: u64,
        /// Writes fail.
        read_only: bool,
    },
}

impl DiskSpec {
    /// Open the disk once, for a single-queue device.
    pub fn open(&self) -> Result<Box<dyn Backend>, BackendError> {
        let mut backends = self.open_queues(1)?;
        Ok(backends.remove(0))
    }

    /// Open the disk `count` times (at least once), one backend per queue of a multi-queue
    /// device: a queue's worker owns its backend, so each is opened on its own (its own io_uring
    /// for a file, its own mapping of one shared RAM disk file, its own null disk).
    pub fn open_queues(&self, count: usize) -> Result<Vec<Box<dyn Backend>>, BackendError> {
        let count = count.max(1);
        let mut backends: Vec<Box<dyn Backend>> = Vec::with_capacity(count);
        match self {
            DiskSpec::Ram { size } => {
                // One memfd, mapped once per queue: no file another user could plant, open or
                // read.
                for disk in RamDisk::anonymous_queues(*size, count)? {
                    backends.push(Box::new(disk));
                }
            }
            DiskSpec::File { path, read_only, direct } => {
                let options =
                    FileDiskOptions { read_only: *read_only, direct: *direct, ..Default::default() };
                for disk in FileDisk::open_queues(path, options, count)? {
                    backends.push(Box::new(disk));
                }
            }
            DiskSpec::RamFile { path, read_only } => {
                // RamDisk::open would wait on a FIFO and map a device: refuse anything but a
                // regular file first.
                open_without_blocking(path, *read_only, 0, Wanted::RegularFile)
                    .map_err(|e| BackendError::opening(path, e))?;
                for _ in 0..count {
                    backends.push(Box::new(RamDisk::open(path, *read_only)?));
                }
            }
            DiskSpec::Rbd(spec) => {
                // One connection and image handle, shared by every queue's backend.
                for disk in RbdDisk::open_queues(spec, count, crate::DEFAULT_MAX_IN_FLIGHT)? {
                    backends.push(Box::new(disk));
                }
            }
            DiskSpec::Null { size, read_only } => {
                for _ in 0..count {
                    backends.push(Box::new(NullDisk::new(*size, *read_only)?));
                }
            }
        }
        Ok(backends)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ram_disk_opened_for_several_queues_is_one_disk() {
        let mut backends = DiskSpec::Ram { size: 1 << 20 }.open_queues(3).unwrap();
        assert_eq!(backends.len(), 3);
        assert!(backends.iter().all(|b| b.capacity() == 1 << 20));
        let mut block = vec![0x5au8; 512];
        // SAFETY: `block` outlives the request, which the RAM disk completes at once.
        let segment = unsafe { crate::Segment::new(block.as_mut_ptr(), 512) };
        assert!(backends[0].submit(1, crate::Op::Write, 4096, &[segment]));
        backends[0].poll(&mut |c| assert_eq!(c.result, Ok(512)));
        let mut back = vec![0u8; 512];
        // SAFETY: as above.
        let segment = unsafe { crate::Segment::new(back.as_mut_ptr(), 512) };
        assert!(backends[2].submit(2, crate::Op::Read, 4096, &[segment]));
        backends[2].poll(&mut |c| assert_eq!(c.result, Ok(512)));
        assert_eq!(back, block);
    }

    #[test]
    fn a_null_disk_has_a_backend_per_queue() {
        let backends = DiskSpec::Null { size: 1 << 20, read_only: true }.open_queues(4).unwrap();
        assert_eq!(backends.len(), 4);
        assert!(backends.iter().all(|b| b.capacity() == 1 << 20 && b.read_only()));
        let error = DiskSpec::Null { size: 100, read_only: false }.open().err().unwrap().to_string();
        assert!(error.contains("100"), "{error}");
    }

    #[test]
    fn a_missing_file_is_an_error_that_names_it() {
        let spec = DiskSpec::File { path: "/nonexistent/disk.img".into(), read_only: false, direct: false };
        let error = spec.open().err().unwrap().to_string();
        assert!(error.contains("/nonexistent/disk.img"), "{error}");
    }
}
