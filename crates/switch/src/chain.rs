//! A descriptor chain as the switch sees it: its segments, each checked to lie in guest memory
//! and to go the one direction the ring allows, and copies between two chains in two guests'
//! memory with no buffer in between.

use virtqueue::queue::{Descriptor, Queue, QueueError};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, VolatileSlice};

/// Descriptors one frame may use; a longer chain is dropped as malformed.
pub const MAX_SEGMENTS: usize = 64;

/// One descriptor of a chain: a range of guest memory.
#[derive(Debug, Clone, Copy, Default)]
pub struct Segment {
    addr: u64,
    len: u32,
}

/// A chain's segments, in order.
pub struct Chain {
    segments: [Segment; MAX_SEGMENTS],
    count: usize,
    /// The bytes all segments hold.
    pub len: usize,
}

impl Default for Chain {
    fn default() -> Self {
        Chain { segments: [Segment::default(); MAX_SEGMENTS], count: 0, len: 0 }
    }
}

impl Chain {
    /// Gather chain `head` of `queue`: `Ok(false)` (and an empty chain) when one of its
    /// descriptors is outside guest memory, goes the wrong way (`writable`: the device writes
    /// them), or the chain is longer than [`MAX_SEGMENTS`]; `Err` when the chain breaks the
    /// queue (a loop, an index out of range).
    pub fn gather(&mut self, queue: &Queue, head: u16, writable: bool) -> Result<bool, QueueError> {
        let mem = queue.memory();
        self.count = 0;
        self.len = 0;
        let mut valid = true;
        queue.walk_chain(head, |d: Descriptor| {
            let in_memory = mem.get_slice(GuestAddress(d.addr), d.len as usize).is_ok();
            if !in_memory || d.is_write_only() != writable || self.count == MAX_SEGMENTS {
                valid = false;
                return false;
            }
            self.segments[self.count] = Segment { addr: d.addr, len: d.len };
            self.count += 1;
            self.len += d.len as usize;
            true
        })?;
        if !valid {
            self.count = 0;
            self.len = 0;
        }
        Ok(valid)
    }

    /// The pieces of guest memory that bytes `offset..offset + len` of the chain occupy, in
    /// order, as (address, length).
    fn pieces(&self, mut offset: usize, mut len: usize) -> impl Iterator<Item = (u64, usize)> + '_ {
        self.segments[..self.count].iter().filter_map(move |s| {
            let seg_len = s.len as usize;
            if offset >= seg_len {
                offset -= seg_len;
                return None;
            }
            if len == 0 {
                return None;
            }
            let n = (seg_len - offset).min(len);
            let piece = (s.addr + offset as u64, n);
            offset = 0;
            len -= n;
            Some(piece)
        })
    }

    /// Read bytes `offset..offset + out.len()` of the chain into `out`; `false` if the chain is
    /// shorter.
    pub fn read(&self, mem: &GuestMemoryMmap, offset: usize, out: &mut [u8]) -> bool {
        if offset.saturating_add(out.len()) > self.len {
            return false;
        }
        let mut done = 0;
        for (addr, n) in self.pieces(offset, out.len()) {
            match mem.get_slice(GuestAddress(addr), n) {
                Ok(slice) => done += slice.copy_to(&mut out[done..done + n]),
                Err(_) => return false,
            }
        }
        done == out.len()
    }

    /// Copy bytes `offset..offset + to.len()` of the chain into `to` (host memory); `false` if
    /// the chain is shorter.
    pub fn read_volatile(&self, mem: &GuestMemoryMmap, offset: usize, to: &VolatileSlice<'_>) -> bool {
        if offset.saturating_add(to.len()) > self.len {
            return false;
        }
        let mut done = 0;
        for (addr, n) in self.pieces(offset, to.len()) {
            let (Ok(from), Ok(into)) = (mem.get_slice(GuestAddress(addr), n), to.subslice(done, n)) else {
                return false;
            };
            from.copy_to_volatile_slice(into);
            done += n;
        }
        done == to.len()
    }

    /// Copy `from` (the switch's own bytes) to byte `offset` of the chain; `false` if the chain
    /// is shorter. Calls `written` with each guest range written, for the dirty log.
    pub fn write_bytes(
        &self,
        mem: &GuestMemoryMmap,
        offset: usize,
        from: &[u8],
        written: impl FnMut(u64, usize),
    ) -> bool {
        let copy = |into: &VolatileSlice<'_>, done: usize| {
            into.copy_from(&from[done..done + into.len()]);
            true
        };
        self.write_pieces(mem, offset, from.len(), copy, written)
    }

    /// Copy `from` (host memory) to byte `offset` of the chain; `false` if the chain is shorter.
    /// Calls `written` with each guest range written, for the dirty log.
    pub fn write_volatile(
        &self,
        mem: &GuestMemoryMmap,
        offset: usize,
        from: &VolatileSlice<'_>,
        written: impl FnMut(u64, usize),
    ) -> bool {
        let copy = |into: &VolatileSlice<'_>, done: usize| {
            from.subslice(done, into.len()).map(|piece| piece.copy_to_volatile_slice(*into)).is_ok()
        };
        self.write_pieces(mem, offset, from.len(), copy, written)
    }

    /// Write bytes `offset..offset + len` of the chain piece by piece: `copy` fills each piece
    /// with the source's bytes from its second argument on; `false` if the chain is shorter or
    /// `copy` fails.
    fn write_pieces(
        &self,
        mem: &GuestMemoryMmap,
        offset: usize,
        len: usize,
        mut copy: impl FnMut(&VolatileSlice<'_>, usize) -> bool,
        mut written: impl FnMut(u64, usize),
    ) -> bool {
        if offset.saturating_add(len) > self.len {
            return false;
        }
        let mut done = 0;
        for (addr, n) in self.pieces(offset, len) {
            let Ok(into) = mem.get_slice(GuestAddress(addr), n) else { return false };
            if !copy(&into, done) {
                return false;
            }
            written(addr, n);
            done += n;
        }
        done == len
    }
}

/// A place in a chain: the chain, the guest memory it lies in, and a byte offset into it.
#[derive(Clone, Copy)]
pub struct At<'a> {
    /// The chain.
    pub chain: &'a Chain,
    /// The memory of the guest that posted it.
    pub mem: &'a GuestMemoryMmap,
    /// Bytes into the chain.
    pub offset: usize,
}

/// Copy `len` bytes from `from` to `to`, piece by piece, with no buffer in between; `false` if
/// either chain is shorter. Calls `written` with each guest range written, for the dirty log.
pub fn copy(to: At, from: At, len: usize, mut written: impl FnMut(u64, usize)) -> bool {
    if to.offset.saturating_add(len) > to.chain.len || from.offset.saturating_add(len) > from.chain.len {
        return false;
    }
    let mut sources = from.chain.pieces(from.offset, len);
    let mut current: Option<(u64, usize)> = None;
    for (dst_addr, dst_len) in to.chain.pieces(to.offset, len) {
        let mut filled = 0;
        while filled < dst_len {
            let Some((src_addr, src_len)) = current.take().or_else(|| sources.next()) else {
                return false;
            };
            let n = src_len.min(dst_len - filled);
            let dst_at = dst_addr + filled as u64;
            let (Ok(src), Ok(dst)) =
                (from.mem.get_slice(GuestAddress(src_addr), n), to.mem.get_slice(GuestAddress(dst_at), n))
            else {
                return false;
            };
            src.copy_to_volatile_slice(dst);
            written(dst_at, n);
            filled += n;
            if n < src_len {
                current = Some((src_addr + n as u64, src_len - n));
            }
        }
    }
    true
}
