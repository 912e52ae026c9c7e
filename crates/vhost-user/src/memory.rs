//! The frontend's memory table (SET_MEM_TABLE) mapped into this process as guest memory.
//!
//! Each region is a file (a memfd, a hugetlbfs file) the frontend shares with us, mapped at its
//! `mmap_offset`; together they make one `GuestMemoryMmap` addressed by guest-physical address,
//! the same type the built-in device model works on. Rings are given to us in the frontend's
//! own address space (`userspace_addr`), which `translate` turns into guest-physical addresses.
//!
//! Regions are refused, before anything is mapped, when they are empty, wrap around, overlap
//! one another (as guest-physical or as frontend addresses), start at an offset that is not
//! page-aligned, or reach past the end of their file (touching such a page would raise SIGBUS
//! here). A frontend that shrinks a file after we mapped it makes the next access fault: every
//! mapped region is registered with [`crate::fault`], which turns that SIGBUS into zero pages
//! and a readable [`GuestMemoryTable::fault`] descriptor instead of the end of the daemon.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::Arc;

use vhost_user_protocol::message::MemoryRegion;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap, MmapRegion};
use vmm_sys_util::eventfd::EventFd;

use crate::error::Error;
use crate::fault::{self, Registration};

/// The frontend's memory, mapped. Fields drop in order: the SIGBUS registrations go before
/// the mappings they describe, the fault eventfd after both.
pub struct GuestMemoryTable {
    _registrations: Vec<Registration>,
    memory: GuestMemoryMmap,
    regions: Vec<MemoryRegion>,
    /// The mapped regions in the table's order, for their files (a hand-over sends them on).
    mapped: Vec<Arc<GuestRegionMmap>>,
    fault: OwnedFd,
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no side effects.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    match u64::try_from(size) {
        Ok(size) if size > 0 => size,
        _ => 4096,
    }
}

/// `[start, start + len)` as an exclusive end, if it does not wrap.
fn end(start: u64, len: u64) -> Option<u64> {
    start.checked_add(len)
}

impl GuestMemoryTable {
    /// Check and map the regions of a SET_MEM_TABLE message.
    pub fn map(table: Vec<(MemoryRegion, OwnedFd)>) -> Result<GuestMemoryTable, Error> {
        let page = page_size();
        for (index, (region, _)) in table.iter().enumerate() {
            if region.memory_size == 0 {
                return Err(Error::EmptyRegion(index));
            }
            let fits = end(region.guest_phys_addr, region.memory_size).is_some()
                && end(region.userspace_addr, region.memory_size).is_some()
                && end(region.mmap_offset, region.memory_size).is_some_and(|e| e <= i64::MAX as u64)
                && usize::try_from(region.memory_size).is_ok();
            if !fits {
                return Err(Error::RegionOverflow(index));
            }
            if !region.mmap_offset.is_multiple_of(page) {
                return Err(Error::UnalignedOffset(index, region.mmap_offset));
            }
        }
        for (a, (first, _)) in table.iter().enumerate() {
            for (b, (second, _)) in table.iter().enumerate().skip(a + 1) {
                let overlap = |x: u64, y: u64| x < y + second.memory_size && y < x + first.memory_size;
                if overlap(first.guest_phys_addr, second.guest_phys_addr)
                    || overlap(first.userspace_addr, second.userspace_addr)
                {
                    return Err(Error::RegionsOverlap(a, b));
                }
            }
        }
        let fault = EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC).map_err(Error::EventFd)?;
        // SAFETY: `into_raw_fd` hands over the open descriptor the EventFd owned.
        let fault = unsafe { OwnedFd::from_raw_fd(fault.into_raw_fd()) };
        let mut mapped = Vec::with_capacity(table.len());
        let mut regions = Vec::with_capacity(table.len());
        // Declared after `mapped`, so that on an early return the registrations go before the
        // mappings they guard (locals drop in reverse order; see `fault::register`).
        let mut registrations = Vec::with_capacity(table.len());
        for (index, (region, fd)) in table.into_iter().enumerate() {
            check_file(index, &fd, &region)?;
            let file = File::from(fd);
            let size = usize::try_from(region.memory_size)
                .map_err(|_| Error::Map { index, why: "larger than the address space".to_string() })?;
            let mapping = MmapRegion::from_file(FileOffset::new(file, region.mmap_offset), size)
                .map_err(|e| Error::Map { index, why: e.to_string() })?;
            let guest = Arc::new(
                GuestRegionMmap::new(mapping, GuestAddress(region.guest_phys_addr))
                    .ok_or(Error::RegionOverflow(index))?,
            );
            let registration = fault::register(guest.as_ptr() as usize, guest.size(), fault.as_raw_fd())
                .map_err(|e| Error::Map { index, why: format!("cannot install the SIGBUS handler: {e}") })?
                .ok_or(Error::TooManyMappedRegions(fault::MAX_REGIONS))?;
            mapped.push(guest);
            registrations.push(registration);
            regions.push(region);
        }
        let in_table_order = mapped.clone();
        mapped.sort_by_key(|region| vm_memory::GuestMemoryRegion::start_addr(region.as_ref()));
        // From clones of the regions, which `mapped` keeps mapped until `registrations` is gone
        // should this fail.
        let memory = GuestMemoryMmap::from_arc_regions(mapped.clone())
            .map_err(|e| Error::Map { index: 0, why: e.to_string() })?;
        Ok(GuestMemoryTable { _registrations: registrations, memory, regions, mapped: in_table_order, fault })
    }

    /// Readable once an access to one of the regions raised SIGBUS (the frontend shrank its
    /// file); that region then reads as zeros.
    pub fn fault(&self) -> BorrowedFd<'_> {
        self.fault.as_fd()
    }

    /// The regions as guest memory, addressed by guest-physical address.
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.memory
    }

    /// The regions as the frontend described them, in the table's order.
    pub fn regions(&self) -> &[MemoryRegion] {
        &self.regions
    }

    /// Each region's file, in the table's order (as SET_MEM_TABLE gave them).
    pub fn files(&self) -> Vec<BorrowedFd<'_>> {
        self.mapped
            .iter()
            .filter_map(|region| vm_memory::GuestMemoryRegion::file_offset(region.as_ref()))
            .map(|file| file.file().as_fd())
            .collect()
    }

    /// The guest-physical address of `len` bytes at frontend address `addr`, if they lie inside
    /// one region.
    pub fn translate(&self, addr: u64, len: u64) -> Option<u64> {
        self.regions.iter().find_map(|r| {
            let offset = addr.checked_sub(r.userspace_addr)?;
            let last = offset.checked_add(len)?;
            (last <= r.memory_size).then(|| r.guest_phys_addr + offset)
        })
    }
}

/// The descriptor must be a regular file (memfd, tmpfs, hugetlbfs) long enough for the region.
fn check_file(index: usize, fd: &OwnedFd, region: &MemoryRegion) -> Result<(), Error> {
    // SAFETY: an all-zero stat is valid; fstat fills it for a descriptor we own.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open (owned); `stat` is a valid out-pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
        let why = format!("fstat failed: {}", std::io::Error::last_os_error());
        return Err(Error::BadRegionFd { index, why });
    }
    if stat.st_mode & libc::S_IFMT != libc::S_IFREG {
        let why = "its descriptor is not a memory file (memfd, tmpfs or hugetlbfs)".to_string();
        return Err(Error::BadRegionFd { index, why });
    }
    let needed = region.mmap_offset.checked_add(region.memory_size);
    if needed.is_none_or(|needed| u64::try_from(stat.st_size).is_ok_and(|size| size < needed)) {
        let why = format!(
            "offset {:#x} + size {:#x} reach past the end of its file ({:#x} bytes)",
            region.mmap_offset, region.memory_size, stat.st_size
        );
        return Err(Error::BadRegionFd { index, why });
    }
    Ok(())
}
