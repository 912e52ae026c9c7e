//! The in-flight tracking region (VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD): shared memory in
//! which each ring's worker marks the requests it holds (`virtqueue::inflight`), so that a daemon
//! restarted after a crash resubmits them. GET_INFLIGHT_FD makes one (a sealed memfd, zeroed);
//! the frontend keeps it and hands it back with SET_INFLIGHT_FD, to this daemon or to the next.
//!
//! SET_INFLIGHT_FD's region is the frontend's word: it is refused, before anything is mapped,
//! unless its queue count and size fit this device, its size holds every queue's area, its
//! offset is page-aligned, and its descriptor is a memory file that reaches that far and is
//! sealed against shrinking (so that no access to it can raise SIGBUS). Its contents are checked
//! when a ring starts (`virtqueue::inflight::InflightTracker::recover`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use vhost_user_protocol::message::InflightInfo;
use virtqueue::inflight::{queue_region_size, InflightArea};
use virtqueue::queue::MAX_QUEUE_SIZE;

use crate::error::Error;
use crate::shm::SharedMapping;

/// A mapped in-flight region: `num_queues` areas of `queue_size` entries each.
pub struct InflightRegion {
    mapping: SharedMapping,
    num_queues: u16,
    queue_size: u16,
    /// The file, kept for GET_INFLIGHT_FD's reply.
    fd: OwnedFd,
    /// Where the region lies in its file (`mmap_size`, `mmap_offset`) and its counts.
    info: InflightInfo,
}

/// The bytes `info`'s queues take, once its counts are checked against `max_queues`.
fn checked_size(info: &InflightInfo, max_queues: usize) -> Result<u64, Error> {
    if info.num_queues == 0 || usize::from(info.num_queues) > max_queues {
        return Err(Error::BadInflightQueues { num_queues: info.num_queues, max: max_queues });
    }
    if info.queue_size == 0 || info.queue_size > MAX_QUEUE_SIZE {
        return Err(Error::BadInflightQueueSize { queue_size: info.queue_size, max: MAX_QUEUE_SIZE });
    }
    Ok(queue_region_size(info.queue_size) * u64::from(info.num_queues))
}

fn last_os_error(what: &'static str) -> Error {
    Error::Inflight { what, source: std::io::Error::last_os_error() }
}

fn mmap_shared(fd: &OwnedFd, len: usize, offset: u64) -> Result<SharedMapping, Error> {
    let offset = libc::off_t::try_from(offset)
        .map_err(|_| Error::BadInflightRegion("its offset is too large".into()))?;
    SharedMapping::map(fd, len, offset).map_err(|source| Error::Inflight { what: "mmap", source })
}

impl InflightRegion {
    /// GET_INFLIGHT_FD: a new zeroed region for `info`'s queues, in a memfd sealed against
    /// resizing; the reply's `mmap_size` and `mmap_offset` say where it lies.
    pub fn create(
        info: InflightInfo,
        max_queues: usize,
    ) -> Result<(Arc<InflightRegion>, InflightInfo), Error> {
        let size = checked_size(&info, max_queues)?;
        let len = usize::try_from(size).map_err(|_| Error::BadInflightRegion("too large".into()))?;
        // SAFETY: the name is a NUL-terminated string; the descriptor is ours if valid.
        let raw = unsafe {
            libc::memfd_create(c"exitless-inflight".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if raw < 0 {
            return Err(last_os_error("memfd_create"));
        }
        // SAFETY: `raw` is a new descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let file_len =
            libc::off_t::try_from(size).map_err(|_| Error::BadInflightRegion("too large".into()))?;
        // SAFETY: ftruncate and fcntl on a descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), file_len) } != 0 {
            return Err(last_os_error("ftruncate"));
        }
        let seals = libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(last_os_error("fcntl(F_ADD_SEALS)"));
        }
        let mapping = mmap_shared(&fd, len, 0)?;
        let region = Arc::new(InflightRegion {
            mapping,
            num_queues: info.num_queues,
            queue_size: info.queue_size,
            fd,
            info: InflightInfo { mmap_size: size, mmap_offset: 0, ..info },
        });
        region.write_desc_nums();
        let reply = region.info;
        Ok((region, reply))
    }

    /// SET_INFLIGHT_FD: check and map the region the frontend hands back.
    pub fn map(info: InflightInfo, fd: OwnedFd, max_queues: usize) -> Result<Arc<InflightRegion>, Error> {
        let size = checked_size(&info, max_queues)?;
        if info.mmap_size < size {
            return Err(Error::BadInflightRegion(format!(
                "mmap_size {:#x} is smaller than the {:#x} bytes {} queues of {} descriptors take",
                info.mmap_size, size, info.num_queues, info.queue_size
            )));
        }
        // SAFETY: sysconf has no side effects.
        let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        if !info.mmap_offset.is_multiple_of(page) {
            return Err(Error::BadInflightRegion(format!(
                "mmap_offset {:#x} is not a multiple of the page size",
                info.mmap_offset
            )));
        }
        // SAFETY: an all-zero stat is valid; fstat fills it for a descriptor we own.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open (owned); `stat` is a valid out-pointer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
            return Err(last_os_error("fstat"));
        }
        if stat.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Error::BadInflightRegion("its descriptor is not a memory file".into()));
        }
        let needed = info.mmap_offset.checked_add(size);
        if needed.is_none_or(|needed| u64::try_from(stat.st_size).is_ok_and(|file| file < needed)) {
            return Err(Error::BadInflightRegion(format!(
                "offset {:#x} + {size:#x} bytes reach past the end of its file ({:#x} bytes)",
                info.mmap_offset, stat.st_size
            )));
        }
        // SAFETY: F_GET_SEALS on a descriptor we own.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(Error::BadInflightRegion(
                "its file is not sealed against shrinking (F_SEAL_SHRINK), so it could vanish under the daemon"
                    .into(),
            ));
        }
        let len = usize::try_from(size).map_err(|_| Error::BadInflightRegion("too large".into()))?;
        let mapping = mmap_shared(&fd, len, info.mmap_offset)?;
        let region = Arc::new(InflightRegion {
            mapping,
            num_queues: info.num_queues,
            queue_size: info.queue_size,
            fd,
            info,
        });
        region.write_desc_nums();
        Ok(region)
    }

    fn write_desc_nums(self: &Arc<Self>) {
        for index in 0..usize::from(self.num_queues) {
            if let Some(area) = self.area(index) {
                area.set_desc_num();
            }
        }
    }

    /// Queue `index`'s area, keeping the region mapped; `None` for a queue the region lacks.
    pub fn area(self: &Arc<Self>, index: usize) -> Option<InflightArea> {
        let base = self.area_base(index)?;
        // SAFETY: `area_base` is inside the mapping, 64-byte aligned (page-aligned mapping,
        // areas a multiple of 64 bytes apart), with `queue_region_size(queue_size)` bytes after
        // it; the clone of `self` keeps the mapping.
        Some(unsafe { InflightArea::new(base, self.queue_size, self.clone()) })
    }

    fn area_base(&self, index: usize) -> Option<*mut u8> {
        if index >= usize::from(self.num_queues) {
            return None;
        }
        let stride = usize::try_from(queue_region_size(self.queue_size)).ok()?;
        // SAFETY: `index < num_queues`, so the offset is inside the `num_queues * stride` bytes
        // mapped.
        Some(unsafe { self.mapping.addr().add(index * stride) })
    }

    /// The region's file (GET_INFLIGHT_FD's reply carries it).
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Where the region lies in its file, as SET_INFLIGHT_FD gives it.
    pub fn info(&self) -> InflightInfo {
        self.info
    }

    /// How many descriptors each queue's area holds.
    pub fn queue_size(&self) -> u16 {
        self.queue_size
    }

    /// How many queues it tracks.
    pub fn num_queues(&self) -> u16 {
        self.num_queues
    }

    /// How many heads are marked in flight, over every queue.
    pub fn count_in_flight(self: &Arc<Self>) -> usize {
        (0..usize::from(self.num_queues)).filter_map(|i| self.area(i)).map(|a| a.count_in_flight()).sum()
    }
}
