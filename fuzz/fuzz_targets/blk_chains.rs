//! Long virtio-blk chains in indirect tables, the shapes Linux sends and those just past them: up
//! to and beyond `seg_max` (128) data segments in a table that may be longer than the queue
//! (130 descriptors on a queue of 128), 512-byte and 4 KiB segments, the same guest page many
//! times in one chain, tables of more than 1024 descriptors, bent links. Each input is a few
//! requests, each in its own table, on a queue that negotiated VIRTIO_F_INDIRECT_DESC.
//!
//! The input is read a byte or a word at a time (see `Shape::draw`), so seeds for these shapes
//! are written by hand. Checks: nothing is left in flight; a table the driver laid out well (at
//! most 1024 descriptors, in RAM, links unbent) never breaks the queue, gets one used entry, and
//! its status says IOERR when it holds more than `seg_max` data segments and OK when its
//! segments are sectors in RAM and on the disk; a table of more than 1024 descriptors breaks it.
#![no_main]

use std::sync::atomic::Ordering;

use arbitrary::{Result, Unstructured};
use exitless_fuzz::{guest_memory, ram_disk, signals, DriverRing, DISK_SIZE, REGION_B};
use libfuzzer_sys::fuzz_target;
use storage::Backend;
use virtio::block::request::{
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN,
    VIRTIO_BLK_T_OUT,
};
use virtio::block::{BlockWorker, DiskInfo};
use virtqueue::queue::{
    Queue, QueueConfig, MAX_INDIRECT_DESCRIPTORS, VIRTQ_DESC_F_INDIRECT, VIRTQ_DESC_F_NEXT,
    VIRTQ_DESC_F_WRITE,
};
use virtqueue::QueueWorker;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Where the request's header and status byte go (queue 1's ring area, unused here).
const HEADER: u64 = 0x5e00;
const STATUS: u64 = 0x5f00;
/// Data buffers: 32 KiB (plus one buffer's length) from here lie in region A.
const DATA: u64 = 0x6000;
const DATA_SPAN: u64 = 0x8000;
/// The indirect table, at the start of region B (room for 1100 descriptors and more).
const TABLE: u64 = REGION_B.0;
/// `seg_max`: the most data segments one request may have.
const SEG_MAX: usize = 128;
/// The most requests one input makes.
const REQUESTS: usize = 4;

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});

fn run(u: &mut Unstructured) -> Result<()> {
    let mem = guest_memory();
    // Rings where the harness lays out queue 0 (what is under test here is the chains), of 1 to
    // 256 descriptors.
    let size: u16 = 1 << (u.arbitrary::<u8>()? % 9);
    let config = QueueConfig { size, desc: 0, avail: 0x1000, used: 0x2000 };
    let queue = Queue::new(&mem, config, false).expect("laid-out rings").with_indirect_descriptors(true);
    let disk = ram_disk(false);
    let info = DiskInfo {
        capacity: disk.capacity(),
        read_only: false,
        id: *b"exitless-fuzz-disk\0\0",
        discard: true,
        write_zeroes: true,
        ..DiskInfo::default()
    };
    let (signals, needs_reset) = signals();
    let mut worker = BlockWorker::new(queue, Box::new(disk), info, signals);
    let mut ring = DriverRing::new(config, true);
    ring.clear_used_idx(&mem);
    for done in 0..REQUESTS {
        if u.is_empty() {
            break;
        }
        let shape = Shape::draw(u)?;
        shape.lay_out(u, &ring, &mem)?;
        ring.make_available(&mem, 0);
        worker.poll();
        assert_eq!(worker.in_flight(), 0, "requests left in flight after a poll of a RAM disk");
        let broken = needs_reset.load(Ordering::Acquire);
        let descriptors = shape.segments + 2;
        if shape.table_at.is_none() && !shape.bent && descriptors <= MAX_INDIRECT_DESCRIPTORS as usize {
            assert!(!broken, "a well-formed table of {descriptors} descriptors broke the queue: {shape:?}");
            assert_eq!(ring.used_idx(&mem), Some(done as u16 + 1), "{shape:?}");
            let status: u8 = mem.read_obj(GuestAddress(STATUS)).expect("in RAM");
            if shape.segments > SEG_MAX {
                assert_eq!(status, VIRTIO_BLK_S_IOERR, "more than seg_max data segments: {shape:?}");
            } else if shape.servable() {
                assert_eq!(status, VIRTIO_BLK_S_OK, "{shape:?}");
            }
        }
        if shape.table_at.is_none() && descriptors > MAX_INDIRECT_DESCRIPTORS as usize {
            assert!(broken, "a table of {descriptors} descriptors was accepted");
        }
        if broken {
            break;
        }
    }
    Ok(())
}

/// One request's table, as drawn from the input.
#[derive(Debug)]
struct Shape {
    kind: u32,
    sector: u64,
    /// Data segments: the table holds these plus the header and the status.
    segments: usize,
    /// Where segment `i` lies: 0 the same 512 bytes every time, 1 consecutive sectors, 2 drawn
    /// from the input, 3 consecutive 4 KiB pages.
    places: u8,
    /// Each segment's length: 0 512 bytes, 1 4 KiB, 2 drawn from the input, 3 1 KiB.
    lengths: u8,
    /// One descriptor's flags and next were drawn from the input.
    bent: bool,
    /// The table lies at this address (drawn from the input) rather than at `TABLE`.
    table_at: Option<u64>,
}

impl Shape {
    /// Bytes in order: kind (mod 5: in, out, flush, get-id, unknown), segments (u16 LE, mod
    /// 1100), layout (bits 0-1 places, 2-3 lengths, 4 bent, 5 table elsewhere), sector (u16 LE,
    /// mod the disk's sectors + 8).
    fn draw(u: &mut Unstructured) -> Result<Shape> {
        const KINDS: [u32; 5] =
            [VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, 7];
        let kind = KINDS[usize::from(u.arbitrary::<u8>()? % 5)];
        let segments = usize::from(u.arbitrary::<u16>()? % 1100);
        let layout: u8 = u.arbitrary()?;
        let sector = u64::from(u.arbitrary::<u16>()?) % (DISK_SIZE / 512 + 8);
        let table_at = if layout & 0x20 != 0 { Some(u.arbitrary::<u32>()?.into()) } else { None };
        Ok(Shape {
            kind,
            sector,
            segments,
            places: layout & 3,
            lengths: (layout >> 2) & 3,
            bent: layout & 0x10 != 0,
            table_at,
        })
    }

    /// Write the header, the table and the ring's indirect descriptor 0; the status byte 0xff.
    /// Per-segment places and lengths, and a bend, come from the input after the shape.
    fn lay_out(&self, u: &mut Unstructured, ring: &DriverRing, mem: &GuestMemoryMmap) -> Result<()> {
        let mut header = [0u8; 16];
        header[0..4].copy_from_slice(&self.kind.to_le_bytes());
        header[8..16].copy_from_slice(&self.sector.to_le_bytes());
        ring.write(mem, HEADER, &header);
        ring.write(mem, STATUS, &[0xff]);
        let table = self.table_at.unwrap_or(TABLE);
        let entry = |index: usize, addr: u64, len: u32, flags: u16, next: u16| {
            let mut raw = [0u8; 16];
            raw[0..8].copy_from_slice(&addr.to_le_bytes());
            raw[8..12].copy_from_slice(&len.to_le_bytes());
            raw[12..14].copy_from_slice(&flags.to_le_bytes());
            raw[14..16].copy_from_slice(&next.to_le_bytes());
            ring.write(mem, table.wrapping_add(16 * index as u64), &raw);
        };
        let device_writes = matches!(self.kind, VIRTIO_BLK_T_IN | VIRTIO_BLK_T_GET_ID);
        let data_flags = if device_writes { VIRTQ_DESC_F_WRITE } else { 0 } | VIRTQ_DESC_F_NEXT;
        entry(0, HEADER, 16, VIRTQ_DESC_F_NEXT, 1);
        for i in 0..self.segments {
            let len = match self.lengths {
                0 => 512,
                1 => 4096,
                2 => u32::from(u.arbitrary::<u16>()?),
                _ => 1024,
            };
            let addr = match self.places {
                0 => DATA,
                1 => DATA + (512 * i as u64) % DATA_SPAN,
                2 => DATA + u64::from(u.arbitrary::<u16>()?),
                _ => DATA + (4096 * i as u64) % DATA_SPAN,
            };
            entry(i + 1, addr, len, data_flags, i as u16 + 2);
        }
        let last = self.segments + 1;
        entry(last, STATUS, 1, VIRTQ_DESC_F_WRITE, 0);
        if self.bent {
            let index = usize::from(u.arbitrary::<u16>()?) % (last + 1);
            let (flags, next): (u16, u16) = (u.arbitrary()?, u.arbitrary()?);
            let mut raw = [0u8; 4];
            raw[0..2].copy_from_slice(&flags.to_le_bytes());
            raw[2..4].copy_from_slice(&next.to_le_bytes());
            ring.write(mem, table.wrapping_add(16 * index as u64 + 12), &raw);
        }
        let table_len = u32::try_from(16 * (last + 1)).expect("at most 1101 descriptors");
        ring.descriptor(mem, 0, table, table_len, VIRTQ_DESC_F_INDIRECT, 0);
        Ok(())
    }

    /// A read or write of sectors in RAM and on the disk: the device must do it.
    fn servable(&self) -> bool {
        let len = match self.lengths {
            0 => 512,
            1 => 4096,
            3 => 1024,
            _ => return false,
        };
        let in_ram = self.places != 2;
        let end = self.sector * 512 + len * self.segments as u64;
        matches!(self.kind, VIRTIO_BLK_T_IN | VIRTIO_BLK_T_OUT)
            && self.segments > 0
            && in_ram
            && end <= DISK_SIZE
    }
}
