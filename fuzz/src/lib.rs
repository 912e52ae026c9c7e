//! What the fuzz targets share: a small guest RAM with a hole in it, split rings laid out in it,
//! a hostile driver that writes descriptors, requests and ring indices from the fuzz input, and
//! a RAM disk on a memfd (no file left behind, nothing shared between concurrent fuzzers).
//!
//! Generators draw most values from the shapes a driver uses (addresses in RAM, lengths in
//! sectors, powers of two) and some from anywhere, so both the accepting and the refusing paths
//! are reached quickly.

pub mod vhost;

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::{Arc, OnceLock};

use arbitrary::{Result, Unstructured};
use storage::RamDisk;
use virtio::block::request::{
    VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
    VIRTIO_BLK_T_WRITE_ZEROES,
};
use virtio::interrupt::InterruptLine;
use virtio::DeviceSignals;
use virtqueue::queue::{
    QueueConfig, MAX_QUEUE_SIZE, VIRTQ_DESC_F_INDIRECT, VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE,
};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

/// Guest RAM: two 64 KiB regions with a 64 KiB hole between them, so chains can point into
/// the hole and buffers can straddle a region's end.
pub const REGION_A: (u64, usize) = (0, 0x1_0000);
pub const REGION_B: (u64, usize) = (0x2_0000, 0x1_0000);
/// Each queue's rings: descriptors at `+0`, avail at `+0x1000`, used at `+0x2000` (room for
/// 256 entries each).
const RING_AREA: u64 = 0x3000;
const AVAIL_RING: u64 = 0x1000;
const USED_RING: u64 = 0x2000;
/// Buffers live here in region A (after the rings of two queues) and in all of region B.
const DATA_A: u64 = 0x6000;
/// The RAM disk's size: 128 sectors, so in-range sectors are easy to hit.
pub const DISK_SIZE: u64 = 64 << 10;
/// The most driver actions or requests one input makes: keeps every run short.
pub const MAX_STEPS: usize = 64;

/// Zeroed guest RAM. One mapping per thread, cleared for every input (its pages given back):
/// mapping afresh, or writing zeroes, would cost more than the target's own work.
pub fn guest_memory() -> GuestMemoryMmap {
    thread_local! {
        static MEMORY: GuestMemoryMmap = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(REGION_A.0), REGION_A.1),
            (GuestAddress(REGION_B.0), REGION_B.1),
        ])
        .expect("mapping 128 KiB of anonymous memory");
    }
    MEMORY.with(|mem| {
        for (start, len) in [REGION_A, REGION_B] {
            let host = mem.get_host_address(GuestAddress(start)).expect("a region's start");
            // SAFETY: `host..host + len` is one region of this GuestMemoryMmap, a private
            // anonymous mapping; MADV_DONTNEED makes its pages read as zeroes again. Nothing
            // holds a reference into it between inputs (vm-memory's accesses are copies).
            let rc = unsafe { libc::madvise(host.cast(), len, libc::MADV_DONTNEED) };
            assert_eq!(rc, 0, "clearing guest RAM: {}", std::io::Error::last_os_error());
        }
        mem.clone()
    })
}

/// A queue size: mostly a valid power of two, sometimes anything.
pub fn queue_size(u: &mut Unstructured) -> Result<u16> {
    if u.ratio(1, 16)? {
        return u.arbitrary();
    }
    let shift = u.int_in_range(0..=MAX_QUEUE_SIZE.trailing_zeros())?;
    Ok(1 << shift)
}

/// Queue `index`'s rings where a driver would put them, or (sometimes) anywhere at all.
pub fn queue_config(u: &mut Unstructured, index: u64) -> Result<(QueueConfig, bool)> {
    let size = queue_size(u)?;
    if u.ratio(1, 16)? {
        let config = QueueConfig { size, desc: address(u)?, avail: address(u)?, used: address(u)? };
        return Ok((config, false));
    }
    let base = RING_AREA * index;
    Ok((QueueConfig { size, desc: base, avail: base + AVAIL_RING, used: base + USED_RING }, true))
}

/// A guest-physical address: mostly in the buffer areas, sometimes at a region's edge, in the
/// rings, or anywhere.
pub fn address(u: &mut Unstructured) -> Result<u64> {
    Ok(match u.int_in_range(0..=11)? {
        0 => u.arbitrary()?,
        1 => REGION_A.0 + REGION_A.1 as u64 - u.int_in_range(0..=32)?,
        2 => REGION_B.0 + REGION_B.1 as u64 - u.int_in_range(0..=32)?,
        3 => u.int_in_range(0..=2 * RING_AREA)?,
        4 => u64::MAX - u.int_in_range(0..=32)?,
        5..=7 => DATA_A + 64 * u.int_in_range(0..=(REGION_A.1 as u64 - DATA_A) / 64 - 1)?,
        _ => REGION_B.0 + 64 * u.int_in_range(0..=REGION_B.1 as u64 / 64 - 1)?,
    })
}

/// A buffer length: mostly sector multiples or small, sometimes anything.
pub fn length(u: &mut Unstructured) -> Result<u32> {
    Ok(match u.int_in_range(0..=7)? {
        0 => u.arbitrary()?,
        1 | 2 => u.int_in_range(0..=64)?,
        _ => 512 * u.int_in_range(1..=8)?,
    })
}

/// Descriptor flags: mostly NEXT and WRITE combinations, sometimes INDIRECT or any bits.
pub fn flags(u: &mut Unstructured) -> Result<u16> {
    Ok(match u.int_in_range(0..=15)? {
        0 => u.arbitrary()?,
        1 => VIRTQ_DESC_F_INDIRECT,
        n => n as u16 & (VIRTQ_DESC_F_NEXT | VIRTQ_DESC_F_WRITE),
    })
}

/// The driver's side of one split ring in guest memory. It never writes the used ring's index,
/// so the index there is always the device's: targets check it against what they expect.
pub struct DriverRing {
    pub config: QueueConfig,
    /// The avail index the driver has published.
    pub avail_idx: u16,
    /// The rings are where a driver would put them (apart): the used index is checkable.
    pub laid_out: bool,
}

impl DriverRing {
    pub fn new(config: QueueConfig, laid_out: bool) -> DriverRing {
        DriverRing { config, avail_idx: 0, laid_out }
    }

    fn size(&self) -> u16 {
        self.config.size.max(1)
    }

    /// Write `bytes` at `addr` as the guest would: anywhere in RAM except a used ring's index
    /// (this ring's, or either laid-out queue's: the device's alone). Writes outside RAM are
    /// dropped.
    pub fn write(&self, mem: &GuestMemoryMmap, addr: u64, bytes: &[u8]) {
        let end = addr.saturating_add(bytes.len() as u64);
        let used_indices =
            [self.config.used, USED_RING, RING_AREA + USED_RING].map(|used| used.wrapping_add(2));
        if used_indices.iter().any(|&idx| addr < idx.saturating_add(2) && idx < end) {
            return;
        }
        let _ = mem.write_slice(bytes, GuestAddress(addr));
    }

    pub fn descriptor(&self, mem: &GuestMemoryMmap, index: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let mut raw = [0u8; 16];
        raw[0..8].copy_from_slice(&addr.to_le_bytes());
        raw[8..12].copy_from_slice(&len.to_le_bytes());
        raw[12..14].copy_from_slice(&flags.to_le_bytes());
        raw[14..16].copy_from_slice(&next.to_le_bytes());
        self.write(mem, self.config.desc.wrapping_add(16 * u64::from(index)), &raw);
    }

    /// Put `head` in the avail ring and publish it.
    pub fn make_available(&mut self, mem: &GuestMemoryMmap, head: u16) {
        let slot = u64::from(self.avail_idx % self.size());
        self.write(mem, self.config.avail.wrapping_add(4 + 2 * slot), &head.to_le_bytes());
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.write(mem, self.config.avail.wrapping_add(2), &self.avail_idx.to_le_bytes());
    }

    /// Zero the used index, as a driver does before it makes the queue ready (the device then
    /// starts counting from 0).
    pub fn clear_used_idx(&self, mem: &GuestMemoryMmap) {
        let _ = mem.write_obj(0u16, GuestAddress(self.config.used.wrapping_add(2)));
    }

    /// The device's used index, if the ring is in RAM.
    pub fn used_idx(&self, mem: &GuestMemoryMmap) -> Option<u16> {
        mem.read_obj(GuestAddress(self.config.used.wrapping_add(2))).ok()
    }

    /// A descriptor index: mostly inside the queue, sometimes anything.
    pub fn index(&self, u: &mut Unstructured) -> Result<u16> {
        if u.ratio(1, 16)? {
            return u.arbitrary();
        }
        u.int_in_range(0..=self.size() - 1)
    }

    /// One chain of `lens.len()` descriptors from `head` on, linked in order (a link may be
    /// fuzzed into a loop or out of range), made available.
    pub fn chain(
        &mut self,
        u: &mut Unstructured,
        mem: &GuestMemoryMmap,
        parts: &[(u64, u32, u16)],
    ) -> Result<()> {
        let head = self.index(u)?;
        let mut index = head;
        for (i, &(addr, len, flags)) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            let next = if u.ratio(1, 32)? { self.index(u)? } else { index.wrapping_add(1) % self.size() };
            let flags = if last { flags & !VIRTQ_DESC_F_NEXT } else { flags | VIRTQ_DESC_F_NEXT };
            self.descriptor(mem, index, addr, len, flags, next);
            index = next;
        }
        self.make_available(mem, head);
        Ok(())
    }

    /// A virtio-net receive chain of 1-3 device-writable buffers (now and then one the device
    /// may not write), sized mostly to fit a frame, made available.
    pub fn net_receive_chain(&mut self, u: &mut Unstructured, mem: &GuestMemoryMmap) -> Result<()> {
        let count = u.int_in_range(1..=3)?;
        let mut parts = [(0, 0, 0); 3];
        for part in &mut parts[..count] {
            let len = if u.ratio(1, 4)? { u.int_in_range(0..=64)? } else { u.int_in_range(64..=2048)? };
            let flags = if u.ratio(1, 16)? { 0 } else { VIRTQ_DESC_F_WRITE };
            *part = (address(u)?, len, flags);
        }
        self.chain(u, mem, &parts[..count])
    }

    /// One hostile or ordinary driver action on this ring.
    pub fn driver_step(&mut self, u: &mut Unstructured, mem: &GuestMemoryMmap) -> Result<()> {
        match u.int_in_range(0..=6)? {
            0 => {
                let index = self.index(u)?;
                let next = self.index(u)?;
                self.descriptor(mem, index, address(u)?, length(u)?, flags(u)?, next);
            }
            1 => {
                let count = u.int_in_range(1..=4)?;
                let mut parts = [(0, 0, 0); 4];
                for part in &mut parts[..count] {
                    *part = (address(u)?, length(u)?, flags(u)?);
                }
                self.chain(u, mem, &parts[..count])?;
            }
            2 => {
                let head = self.index(u)?;
                self.make_available(mem, head);
            }
            3 => {
                // The avail index jumps (possibly by more than the queue size).
                self.avail_idx = self.avail_idx.wrapping_add(u.arbitrary()?);
                self.write(mem, self.config.avail.wrapping_add(2), &self.avail_idx.to_le_bytes());
            }
            4 => {
                let flags: u16 = u.int_in_range(0..=1)?;
                self.write(mem, self.config.avail, &flags.to_le_bytes());
            }
            5 => {
                // used_event (EVENT_IDX), after the avail ring.
                let event: u16 = u.arbitrary()?;
                let at = self.config.avail.wrapping_add(4 + 2 * u64::from(self.size()));
                self.write(mem, at, &event.to_le_bytes());
            }
            _ => {
                let addr = address(u)?;
                let len = u.int_in_range(0..=32)?;
                let bytes = u.bytes(len)?;
                self.write(mem, addr, bytes);
            }
        }
        Ok(())
    }

    /// A virtio-blk request: header (a known or unknown type, a sector mostly on the disk), data
    /// buffers and a status byte, each descriptor sometimes bent out of shape. DISCARD and
    /// WRITE_ZEROES mostly carry one 16-byte range (mostly on the disk, flags mostly valid).
    pub fn blk_request(&mut self, u: &mut Unstructured, mem: &GuestMemoryMmap) -> Result<()> {
        const TYPES: [u32; 7] = [
            VIRTIO_BLK_T_IN,
            VIRTIO_BLK_T_OUT,
            VIRTIO_BLK_T_FLUSH,
            VIRTIO_BLK_T_GET_ID,
            7,
            VIRTIO_BLK_T_DISCARD,
            VIRTIO_BLK_T_WRITE_ZEROES,
        ];
        let kind = if u.ratio(1, 16)? { u.arbitrary()? } else { *u.choose(&TYPES)? };
        let sector: u64 = if u.ratio(1, 8)? { u.arbitrary()? } else { u.int_in_range(0..=DISK_SIZE / 512)? };
        let header_at = address(u)?;
        let mut header = [0u8; 16];
        header[0..4].copy_from_slice(&kind.to_le_bytes());
        header[8..16].copy_from_slice(&sector.to_le_bytes());
        self.write(mem, header_at, &header);
        let device_writes = matches!(kind, VIRTIO_BLK_T_IN | VIRTIO_BLK_T_GET_ID);
        let data_flags = if device_writes { VIRTQ_DESC_F_WRITE } else { 0 };
        let bend = |u: &mut Unstructured, flags: u16| -> Result<u16> {
            Ok(if u.ratio(1, 16)? { flags ^ VIRTQ_DESC_F_WRITE } else { flags })
        };
        let mut parts = [(0, 0, 0); 6];
        let header_len = if u.ratio(1, 16)? { length(u)? } else { 16 };
        parts[0] = (header_at, header_len, bend(u, 0)?);
        let data = u.int_in_range(0..=4)?;
        for part in &mut parts[1..=data] {
            *part = (address(u)?, length(u)?, bend(u, data_flags)?);
        }
        let ranged = matches!(kind, VIRTIO_BLK_T_DISCARD | VIRTIO_BLK_T_WRITE_ZEROES);
        if ranged && data > 0 && u.ratio(3, 4)? {
            let sector: u64 =
                if u.ratio(1, 8)? { u.arbitrary()? } else { u.int_in_range(0..=DISK_SIZE / 512)? };
            let sectors: u32 = if u.ratio(1, 8)? { u.arbitrary()? } else { u.int_in_range(0..=64)? };
            let flags: u32 = if u.ratio(1, 8)? { u.arbitrary()? } else { u.int_in_range(0..=1)? };
            let mut range = [0u8; 16];
            range[0..8].copy_from_slice(&sector.to_le_bytes());
            range[8..12].copy_from_slice(&sectors.to_le_bytes());
            range[12..16].copy_from_slice(&flags.to_le_bytes());
            self.write(mem, parts[1].0, &range);
            if u.ratio(3, 4)? {
                parts[1].1 = 16;
            }
        }
        let status_len = if u.ratio(1, 16)? { length(u)? } else { 1 };
        parts[data + 1] = (address(u)?, status_len, bend(u, VIRTQ_DESC_F_WRITE)?);
        self.chain(u, mem, &parts[..data + 2])
    }
}

/// Interrupt and reset signals nobody else sees; the flag is DEVICE_NEEDS_RESET.
pub fn signals() -> (DeviceSignals, Arc<AtomicBool>) {
    let needs_reset = Arc::new(AtomicBool::new(false));
    let interrupt = InterruptLine::new(Arc::new(AtomicU32::new(0)), None);
    (DeviceSignals::new(interrupt, needs_reset.clone()), needs_reset)
}

/// Zero the first `len` bytes of a memfd by giving its pages back: far cheaper than writing
/// zeroes when an input touched few of them, and every mapping of the file sees zeroes.
pub fn clear_memfd(file: &File, len: u64) {
    let len = libc::off_t::try_from(len).expect("a memfd length");
    // SAFETY: fallocate on a descriptor we hold; no memory of ours is involved.
    let rc = unsafe {
        libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 0, len)
    };
    assert_eq!(rc, 0, "clearing a memfd: {}", std::io::Error::last_os_error());
}

/// A zeroed RAM disk of `DISK_SIZE` bytes over one memfd per process, mapped afresh for each
/// caller (zeroed so that every run of an input reads the same bytes).
pub fn ram_disk(read_only: bool) -> RamDisk {
    static FILE: OnceLock<File> = OnceLock::new();
    let file = FILE.get_or_init(|| {
        // SAFETY: a NUL-terminated name; the result is checked before it is owned.
        let fd = unsafe { libc::memfd_create(c"exitless-fuzz-disk".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(DISK_SIZE).expect("sizing the RAM disk memfd");
        file
    });
    clear_memfd(file, DISK_SIZE);
    RamDisk::open(format!("/proc/self/fd/{}", file.as_raw_fd()), read_only).expect("mapping the RAM disk")
}
