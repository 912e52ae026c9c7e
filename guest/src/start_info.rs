//! The PVH `hvm_start_info` block a loader leaves for us (its address arrives in %ebx).

const MAGIC: u32 = 0x336e_c578;
const E820_RAM: u32 = 1;

#[repr(C)]
struct StartInfo {
    magic: u32,
    version: u32,
    flags: u32,
    nr_modules: u32,
    modlist_paddr: u64,
    cmdline_paddr: u64,
    rsdp_paddr: u64,
    memmap_paddr: u64,
    memmap_entries: u32,
    reserved: u32,
}

#[repr(C)]
struct MemmapEntry {
    addr: u64,
    size: u64,
    kind: u32,
    reserved: u32,
}

/// What the probe learns from the loader.
pub struct BootInfo {
    pub cmdline: &'static str,
    /// Bytes of RAM in the memory map (0 when the loader gave none).
    pub ram_bytes: u64,
}

/// Read the start-info block, or `None` if `addr` does not hold one.
pub fn read(addr: u64) -> Option<BootInfo> {
    if addr == 0 {
        return None;
    }
    // SAFETY: the loader placed a start-info block at `addr` in identity-mapped RAM; the magic
    // is checked before any other field is trusted.
    let info = unsafe { &*(addr as *const StartInfo) };
    if info.magic != MAGIC {
        return None;
    }
    let cmdline = if info.cmdline_paddr == 0 { "" } else { c_str(info.cmdline_paddr) };
    let mut ram_bytes = 0;
    if info.version >= 1 && info.memmap_paddr != 0 {
        for i in 0..info.memmap_entries as u64 {
            // SAFETY: the loader's memory map has `memmap_entries` entries at `memmap_paddr`.
            let entry = unsafe { &*((info.memmap_paddr + i * 24) as *const MemmapEntry) };
            if entry.kind == E820_RAM {
                ram_bytes += entry.size;
            }
        }
    }
    Some(BootInfo { cmdline, ram_bytes })
}

/// The NUL-terminated command line at `addr` (up to 4 KiB, non-UTF-8 bytes cut it short).
fn c_str(addr: u64) -> &'static str {
    // SAFETY: the loader wrote a NUL-terminated string at `addr`; the scan stops at 4 KiB.
    let bytes = unsafe { core::slice::from_raw_parts(addr as *const u8, 4096) };
    let len = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    match core::str::from_utf8(&bytes[..len]) {
        Ok(s) => s,
        Err(e) => core::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or(""),
    }
}
