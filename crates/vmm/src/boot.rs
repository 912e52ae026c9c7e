//! Loading a PVH ELF kernel and the boot information it expects: `hvm_start_info`, the memory
//! map and the command line. PVH enters the kernel in 32-bit protected mode without paging.

use std::io::{Read, Seek, SeekFrom};

use linux_loader::cmdline::Cmdline;
use linux_loader::configurator::pvh::PvhBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::elf::start_info::{hvm_memmap_table_entry, hvm_start_info};
use linux_loader::loader::elf::{Elf, PvhBootCapability};
use linux_loader::loader::KernelLoader;
use thiserror::Error;
use vm_memory::{Address, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

/// Where the boot structures go, below the kernel at 1 MiB.
pub(crate) const GDT_ADDR: u64 = 0x500;
pub(crate) const START_INFO_ADDR: u64 = 0x6000;
pub(crate) const MEMMAP_ADDR: u64 = 0x7000;
pub(crate) const CMDLINE_ADDR: u64 = 0x20000;
/// The longest command line we pass (bytes, without the terminating NUL).
pub const CMDLINE_MAX: usize = 4095;
/// Kernels load at or above 1 MiB, clear of the boot structures and legacy areas.
pub const KERNEL_MIN_ADDR: u64 = 0x10_0000;
const EBDA_START: u64 = 0x9_fc00;
const XEN_HVM_START_MAGIC: u32 = 0x336e_c578;
const E820_RAM: u32 = 1;

/// Why a kernel could not be loaded or its boot information written.
#[derive(Debug, Error)]
#[allow(missing_docs)] // Each variant's message says what it is.
pub enum BootError {
    #[error("cannot read the kernel image: {0}")]
    Read(#[source] std::io::Error),
    #[error("the kernel is not an ELF file (expected a PVH ELF such as `exitless probe export` writes)")]
    NotElf,
    #[error("the kernel ELF is malformed: {0}")]
    BadElf(&'static str),
    #[error("the kernel ELF has no PVH entry point (XEN_ELFNOTE_PHYS32_ENTRY note); exitless boots PVH kernels only")]
    NoPvhEntry,
    #[error("the kernel has a segment at {start:#x}..{end:#x}, which is not in guest RAM: load address below 1 MiB or --mem too small (the VM has {ram_bytes} bytes)")]
    SegmentOutsideRam { start: u64, end: u64, ram_bytes: u64 },
    #[error("cannot load the kernel: {0}")]
    Load(#[from] linux_loader::loader::Error),
    #[error("the kernel command line is invalid: {0}")]
    Cmdline(#[from] linux_loader::cmdline::Error),
    #[error("cannot write the PVH boot information: {0}")]
    BootParams(#[from] linux_loader::configurator::Error),
}

/// Load a PVH ELF kernel; returns its 32-bit entry point.
pub fn load_kernel<F>(mem: &GuestMemoryMmap, image: &mut F) -> Result<GuestAddress, BootError>
where
    F: Read + Seek + vm_memory::ReadVolatile,
{
    check_segments(mem, image)?;
    let loaded = Elf::load(mem, None, image, Some(GuestAddress(KERNEL_MIN_ADDR)))?;
    match loaded.pvh_boot_cap {
        PvhBootCapability::PvhEntryPresent(entry) => Ok(entry),
        _ => Err(BootError::NoPvhEntry),
    }
}

/// Check the ELF header and that every loadable segment lands in RAM, so that a kernel too large
/// for `--mem` gets a clear error rather than a loader failure.
fn check_segments<F: Read + Seek>(mem: &GuestMemoryMmap, image: &mut F) -> Result<(), BootError> {
    let mut header = [0u8; 64];
    image.seek(SeekFrom::Start(0)).map_err(BootError::Read)?;
    let read = read_up_to(image, &mut header).map_err(BootError::Read)?;
    if read < 4 || &header[..4] != b"\x7fELF" {
        return Err(BootError::NotElf);
    }
    if read < 64 || header[4] != 2 || header[5] != 1 {
        return Err(BootError::BadElf("not a 64-bit little-endian ELF"));
    }
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let phoff = u64_at(&header, 32);
    let phentsize = u16_at(&header, 54);
    let phnum = u16_at(&header, 56);
    if phentsize != 56 {
        return Err(BootError::BadElf("unexpected program header size"));
    }
    let ram_bytes: u64 = mem.iter().map(|r| r.len()).sum();
    for i in 0..phnum as u64 {
        let mut phdr = [0u8; 56];
        image.seek(SeekFrom::Start(phoff + i * 56)).map_err(BootError::Read)?;
        image.read_exact(&mut phdr).map_err(|_| BootError::BadElf("truncated program headers"))?;
        const PT_LOAD: u32 = 1;
        if u32::from_le_bytes(phdr[..4].try_into().unwrap()) != PT_LOAD {
            continue;
        }
        let start = u64_at(&phdr, 24); // p_paddr
        let memsz = u64_at(&phdr, 40);
        let filesz = u64_at(&phdr, 32);
        if filesz > memsz {
            return Err(BootError::BadElf("segment file size exceeds its memory size"));
        }
        let end = start.checked_add(memsz).ok_or(BootError::BadElf("segment wraps around"))?;
        // One RAM region must hold the whole segment.
        let in_ram = memsz == 0
            || (start >= KERNEL_MIN_ADDR && mem.get_slice(GuestAddress(start), memsz as usize).is_ok());
        if !in_ram {
            return Err(BootError::SegmentOutsideRam { start, end, ram_bytes });
        }
    }
    Ok(())
}

fn read_up_to<R: Read>(reader: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut total = 0;
    while total < buf.len() {
        match reader.read(&mut buf[total..])? {
            0 => break,
            n => total += n,
        }
    }
    Ok(total)
}

/// Write the command line, the memory map and `hvm_start_info` for a PVH kernel.
pub fn write_boot_info(mem: &GuestMemoryMmap, cmdline: &str) -> Result<(), BootError> {
    let mut line = Cmdline::new(CMDLINE_MAX + 1)?;
    line.insert_str(cmdline)?;
    linux_loader::loader::load_cmdline(mem, GuestAddress(CMDLINE_ADDR), &line)?;

    let mut memmap = Vec::new();
    for region in mem.iter() {
        let (start, end) = (region.start_addr().raw_value(), region.last_addr().raw_value() + 1);
        if start == 0 {
            // Below 1 MiB only the conventional 640 KiB is RAM; the kernel goes above it.
            memmap.push(e820(0, EBDA_START));
            memmap.push(e820(KERNEL_MIN_ADDR, end));
        } else {
            memmap.push(e820(start, end));
        }
    }
    let start_info = hvm_start_info {
        magic: XEN_HVM_START_MAGIC,
        version: 1,
        cmdline_paddr: CMDLINE_ADDR,
        memmap_paddr: MEMMAP_ADDR,
        memmap_entries: memmap.len() as u32,
        ..Default::default()
    };
    let mut params = BootParams::new(&start_info, GuestAddress(START_INFO_ADDR));
    params.set_sections(&memmap, GuestAddress(MEMMAP_ADDR));
    PvhBootConfigurator::write_bootparams::<GuestMemoryMmap>(&params, mem)?;
    Ok(())
}

fn e820(start: u64, end: u64) -> hvm_memmap_table_entry {
    hvm_memmap_table_entry { addr: start, size: end - start, type_: E820_RAM, reserved: 0 }
}
