//! Guest RAM: anonymous memory (2 MiB huge pages reserved with `--hugepages`, else transparent
//! huge pages where the host allows them) laid out around the 3-4 GiB hole where device MMIO,
//! the IOAPIC and the LAPIC live; or, for a VM whose disks a vhost-user daemon serves, one memfd
//! mapped shared, so the daemon maps the very same pages.

use std::fs::File;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

use thiserror::Error;
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap};

/// Start of the MMIO hole below 4 GiB; RAM above this size continues at 4 GiB.
pub const MMIO_HOLE_START: u64 = 3 << 30;
pub(crate) const MMIO_HOLE_END: u64 = 4 << 30;
/// The smallest VM we build: room for the boot structures and a small kernel.
pub const MIN_MEM_BYTES: u64 = 4 << 20;
/// Upper bound on guest RAM, a guard against typos like `--mem 64T`.
pub const MAX_MEM_BYTES: u64 = 1 << 40;
const HUGE_PAGE_BYTES: u64 = 2 << 20;

/// Why guest memory could not be made.
#[derive(Debug, Error)]
#[allow(missing_docs)] // Each variant's message says what it is.
pub enum MemoryError {
    #[error("guest memory of {0} bytes is too small: at least {MIN_MEM_BYTES} bytes (4M) are needed")]
    TooSmall(u64),
    #[error("guest memory of {0} bytes is larger than the {MAX_MEM_BYTES}-byte limit")]
    TooLarge(u64),
    #[error("--hugepages needs the memory size to be a multiple of 2 MiB, got {0} bytes")]
    HugePageAlignment(u64),
    #[error(
        "--hugepages needs {needed} free 2 MiB huge pages but the host has {free}; reserve them \
         with `echo {needed} > /proc/sys/vm/nr_hugepages` (as root) or run without --hugepages"
    )]
    NotEnoughHugePages { needed: u64, free: u64 },
    #[error("cannot map {size} bytes of guest memory{}: {source}", if *.hugepages { " from huge pages" } else { "" })]
    Map { size: u64, hugepages: bool, source: vm_memory::mmap::MmapRegionError },
    #[error("cannot assemble guest memory regions: {0}")]
    Regions(#[from] vm_memory::GuestRegionCollectionError),
    #[error("cannot create the shared guest memory file (memfd{}): {source}", if *.hugepages { " with MFD_HUGETLB" } else { "" })]
    Memfd { hugepages: bool, source: io::Error },
    #[error("cannot size the shared guest memory file to {size} bytes: {source}")]
    Resize { size: u64, source: io::Error },
}

/// The guest-physical RAM ranges for `size` bytes of RAM.
pub fn ram_ranges(size: u64) -> Vec<(GuestAddress, u64)> {
    if size <= MMIO_HOLE_START {
        vec![(GuestAddress(0), size)]
    } else {
        vec![(GuestAddress(0), MMIO_HOLE_START), (GuestAddress(MMIO_HOLE_END), size - MMIO_HOLE_START)]
    }
}

/// Allocate `size` bytes of guest RAM.
pub fn create(size: u64, hugepages: bool) -> Result<GuestMemoryMmap, MemoryError> {
    check_size(size, hugepages)?;
    let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    // Without huge pages, reserve lazily; with them, fail now rather than SIGBUS later.
    flags |= if hugepages { libc::MAP_HUGETLB } else { libc::MAP_NORESERVE };
    let regions = ram_ranges(size)
        .into_iter()
        .map(|(base, len)| {
            let mapping = MmapRegionBuilder::new(len as usize)
                .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
                .with_mmap_flags(flags)
                .with_hugetlbfs(hugepages)
                .build()
                .map_err(|source| MemoryError::Map { size: len, hugepages, source })?;
            if !hugepages {
                advise_huge_pages(&mapping);
            }
            // The ranges end below 2^41, so the region cannot overflow the address space.
            Ok(GuestRegionMmap::new(mapping, base).expect("RAM range within the address space"))
        })
        .collect::<Result<Vec<_>, MemoryError>>()?;
    Ok(GuestMemoryMmap::from_regions(regions)?)
}

/// Ask for transparent huge pages on `mapping` (host policy `madvise` or `always`). A guest
/// buffer then lies in a few physically contiguous runs, and the host's block layer hands the
/// disk one segment where 4 KiB pages made up to 32, which doubled large O_DIRECT reads
/// (docs/tuning.md). Best effort: where the host refuses (policy `never`, or no THP at all; for
/// a memfd, its `shmem_enabled` policy), the pages stay small.
fn advise_huge_pages(mapping: &vm_memory::mmap::MmapRegion) {
    // SAFETY: the range is exactly the mapping `mapping` owns and keeps mapped; MADV_HUGEPAGE
    // only changes how the kernel backs it, never its contents.
    unsafe { libc::madvise(mapping.as_ptr().cast(), mapping.size(), libc::MADV_HUGEPAGE) };
}

/// Whether the host backs anonymous memory that asks for them (`advise_huge_pages`) with
/// transparent huge pages: its policy, /sys/kernel/mm/transparent_hugepage/enabled, is
/// `madvise` or `always`.
pub fn transparent_huge_pages() -> bool {
    let policy = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    !policy.is_empty() && !policy.contains("[never]")
}

/// Allocate `size` bytes of guest RAM in one memfd (`MFD_HUGETLB` with `hugepages`) mapped
/// `MAP_SHARED`, the RAM ranges at consecutive offsets of the file: each region then has a file
/// and an offset to send a vhost-user daemon (SET_MEM_TABLE), which maps the same pages.
pub fn create_shared(size: u64, hugepages: bool) -> Result<GuestMemoryMmap, MemoryError> {
    check_size(size, hugepages)?;
    let mut memfd_flags = libc::MFD_CLOEXEC;
    if hugepages {
        memfd_flags |= libc::MFD_HUGETLB | libc::MFD_HUGE_2MB;
    }
    // SAFETY: memfd_create with a static NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(c"exitless-guest-ram".as_ptr(), memfd_flags) };
    if fd < 0 {
        return Err(MemoryError::Memfd { hugepages, source: io::Error::last_os_error() });
    }
    // SAFETY: `fd` was just created, is open and nobody else owns it.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.set_len(size).map_err(|source| MemoryError::Resize { size, source })?;
    let file = Arc::new(file);
    let mut offset = 0;
    let mut regions = Vec::new();
    for (base, len) in ram_ranges(size) {
        // A huge-page memfd is on hugetlbfs: its pages are huge without MAP_HUGETLB, and its
        // mapping reserves them now (MAP_SHARED), so a short host fails here, not with SIGBUS.
        let mapping = MmapRegionBuilder::new(len as usize)
            .with_file_offset(FileOffset::from_arc(file.clone(), offset))
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(libc::MAP_SHARED)
            .with_hugetlbfs(hugepages)
            .build()
            .map_err(|source| MemoryError::Map { size: len, hugepages, source })?;
        if !hugepages {
            advise_huge_pages(&mapping);
        }
        // The ranges end below 2^41, so the region cannot overflow the address space.
        regions.push(GuestRegionMmap::new(mapping, base).expect("RAM range within the address space"));
        offset += len;
    }
    Ok(GuestMemoryMmap::from_regions(regions)?)
}

/// The size limits, and enough free huge pages for `hugepages`.
fn check_size(size: u64, hugepages: bool) -> Result<(), MemoryError> {
    if size < MIN_MEM_BYTES {
        return Err(MemoryError::TooSmall(size));
    }
    if size > MAX_MEM_BYTES {
        return Err(MemoryError::TooLarge(size));
    }
    if hugepages {
        if !size.is_multiple_of(HUGE_PAGE_BYTES) {
            return Err(MemoryError::HugePageAlignment(size));
        }
        let needed = size / HUGE_PAGE_BYTES;
        let free = free_huge_pages().unwrap_or(0);
        if free < needed {
            return Err(MemoryError::NotEnoughHugePages { needed, free });
        }
    }
    Ok(())
}

/// `HugePages_Free` from /proc/meminfo (2 MiB pages on x86_64).
/// The host's free reserved 2 MiB huge pages (`HugePages_Free`).
pub fn free_huge_pages() -> io::Result<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")?;
    Ok(meminfo
        .lines()
        .find_map(|line| line.strip_prefix("HugePages_Free:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryBackend;

    #[test]
    fn ram_skips_the_mmio_hole() {
        assert_eq!(ram_ranges(256 << 20), vec![(GuestAddress(0), 256 << 20)]);
        assert_eq!(ram_ranges(5 << 30), vec![(GuestAddress(0), 3 << 30), (GuestAddress(4 << 30), 2 << 30)]);
    }

    #[test]
    fn sizes_are_checked() {
        assert!(matches!(create(1 << 20, false), Err(MemoryError::TooSmall(_))));
        assert!(matches!(create(1 << 50, false), Err(MemoryError::TooLarge(_))));
        assert!(matches!(create((8 << 20) + 4096, true), Err(MemoryError::HugePageAlignment(_))));
        let mem = create(8 << 20, false).unwrap();
        assert_eq!(mem.num_regions(), 1);
        assert!(matches!(create_shared(1 << 20, false), Err(MemoryError::TooSmall(_))));
    }

    /// Whether the mapping that starts at `start` may get transparent huge pages (smaps'
    /// `THPeligible`).
    fn thp_eligible(start: usize) -> bool {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut lines = smaps.lines().skip_while(|line| {
            line.split('-').next().and_then(|from| usize::from_str_radix(from, 16).ok()) != Some(start)
        });
        assert!(lines.next().is_some(), "no mapping at {start:#x}");
        let eligible =
            lines.find_map(|line| line.strip_prefix("THPeligible:")).expect("smaps has THPeligible");
        eligible.trim() == "1"
    }

    #[test]
    fn anonymous_ram_asks_for_transparent_huge_pages() {
        use vm_memory::GuestMemoryRegion;
        assert!(
            transparent_huge_pages(),
            "this test needs transparent huge pages, which this host has switched off \
             (/sys/kernel/mm/transparent_hugepage/enabled is `never` or missing): run scripts/setup.sh \
             (it sets `madvise`)"
        );
        let mem = create(64 << 20, false).unwrap();
        let region = mem.iter().next().unwrap();
        let start = region.get_host_address(vm_memory::MemoryRegionAddress(0)).unwrap() as usize;
        assert!(thp_eligible(start), "guest RAM at {start:#x} is not eligible for huge pages");
    }

    #[test]
    fn shared_memory_is_one_file_at_consecutive_offsets() {
        use vm_memory::{Bytes, GuestMemoryRegion};
        // 3 GiB + 4 MiB: two regions, the second at file offset 3 GiB (sparse: nothing touched
        // but two words).
        let mem = create_shared((3 << 30) + (4 << 20), false).unwrap();
        let regions: Vec<_> = mem.iter().collect();
        assert_eq!(regions.len(), 2);
        let offsets: Vec<u64> = regions.iter().map(|r| r.file_offset().unwrap().start()).collect();
        assert_eq!(offsets, vec![0, MMIO_HOLE_START]);
        mem.write_obj(0x1234_5678u32, GuestAddress(MMIO_HOLE_END)).unwrap();
        // The second region's first bytes are the file's bytes at 3 GiB.
        let file = regions[1].file_offset().unwrap().file();
        let mut word = [0u8; 4];
        std::os::unix::fs::FileExt::read_exact_at(file, &mut word, MMIO_HOLE_START).unwrap();
        assert_eq!(u32::from_le_bytes(word), 0x1234_5678);
    }
}
