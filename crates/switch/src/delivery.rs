//! Copying one frame, from a NIC's transmit chain, the uplink's ring or the switch's own
//! buffer, into a NIC's next receive chain (or chains, when its driver merges them).

use vm_memory::{GuestMemoryMmap, VolatileSlice};

use crate::chain::{copy, At, Chain};
use crate::ethernet::ADDRESSES_LEN;
use crate::offload::{NetHeader, NET_HDR_LEN};
use crate::port::{Port, MAX_MERGED};

/// Where the bytes of the frame being delivered are.
#[derive(Clone, Copy)]
pub(crate) enum Frame<'a> {
    /// In a NIC's transmit chain, after its header.
    Guest(At<'a>),
    /// In the uplink's receive ring: the frame is these pieces one after the other (the
    /// addresses, the VLAN tag the interface took off, the rest; or the frame and two empty
    /// pieces).
    Host([VolatileSlice<'a>; 3]),
    /// In the switch's own buffer (a frame it changed: see `rework`).
    Bytes(&'a [u8]),
}

impl<'a> Frame<'a> {
    /// A frame of the uplink's ring, `bytes`, with the VLAN tag the interface took off, if any,
    /// put back after the addresses; `None` if it is shorter than the addresses.
    pub(crate) fn from_host(bytes: VolatileSlice<'a>, tag: Option<&'a mut [u8; 4]>) -> Option<Frame<'a>> {
        let none = bytes.subslice(0, 0).ok()?;
        Some(match tag {
            None => Frame::Host([bytes, none, none]),
            Some(tag) => Frame::Host([
                bytes.subslice(0, ADDRESSES_LEN).ok()?,
                VolatileSlice::from(&mut tag[..]),
                bytes.offset(ADDRESSES_LEN).ok()?,
            ]),
        })
    }

    /// Copy the whole frame into `into`, which is as long; `false` if it is not, or the frame
    /// is in a guest's chain (read those with `Chain::read`).
    pub(crate) fn copy_to(self, into: &mut [u8]) -> bool {
        match self {
            Frame::Guest(_) => false,
            Frame::Bytes(bytes) => {
                let fits = bytes.len() == into.len();
                if fits {
                    into.copy_from_slice(bytes);
                }
                fits
            }
            Frame::Host(pieces) => {
                let mut at = 0;
                for piece in pieces {
                    let Some(part) = into.get_mut(at..at + piece.len()) else { return false };
                    at += piece.copy_to(part);
                }
                at == into.len()
            }
        }
    }

    /// Copy the frame's bytes `from..from + len` to byte `offset` of `chain`, in `mem`; `false`
    /// if either is shorter. Calls `mark` with each guest range written.
    fn copy_range(
        self,
        chain: &Chain,
        mem: &GuestMemoryMmap,
        offset: usize,
        from: usize,
        len: usize,
        mut mark: impl FnMut(u64, usize),
    ) -> bool {
        match self {
            Frame::Guest(at) => {
                let to = At { chain, mem, offset };
                copy(to, At { offset: at.offset + from, ..at }, len, mark)
            }
            Frame::Bytes(bytes) => {
                bytes.get(from..from + len).is_some_and(|bytes| chain.write_bytes(mem, offset, bytes, mark))
            }
            Frame::Host(pieces) => {
                let (mut skip, mut left, mut into) = (from, len, offset);
                for piece in pieces {
                    if skip >= piece.len() {
                        skip -= piece.len();
                        continue;
                    }
                    let n = (piece.len() - skip).min(left);
                    let Ok(part) = piece.subslice(skip, n) else { return false };
                    if !chain.write_volatile(mem, into, &part, &mut mark) {
                        return false;
                    }
                    (skip, left, into) = (0, left - n, into + n);
                    if left == 0 {
                        break;
                    }
                }
                left == 0
            }
        }
    }
}

/// Copy `frame`, of `frame_len` bytes, after `header`, into the next receive chain of the queue
/// pair of `receiver` that takes flow `flow`, or the next few chains if its driver merges them
/// (MRG_RXBUF). A frame that finds too few chains is dropped and counted; the chains it took
/// wait for the next frame. Returns whether that ring has chains left to try (`false`: it ran
/// dry, or broke).
pub(crate) fn deliver(
    receiver: &mut Port,
    frame: Frame<'_>,
    frame_len: usize,
    header: NetHeader,
    flow: u32,
) -> bool {
    if receiver.broken {
        return false;
    }
    let index = receiver.rx_pair(flow);
    let Port { pairs, log, counters, .. } = receiver;
    let pair = &mut pairs[index];
    let needed = NET_HDR_LEN + frame_len;
    let mut room = pair.staged.room();
    while room < needed {
        if pair.staged.count == pair.staged.most() {
            counters.rx_too_big += 1;
            return true;
        }
        let broke = match pair.rx.pop_avail() {
            Ok(Some(head)) => {
                let staged = &mut pair.staged;
                let chain = &mut staged.chains[staged.count];
                match chain.gather(&pair.rx, head, true) {
                    Ok(true) if chain.len >= NET_HDR_LEN => {
                        room += chain.len;
                        staged.heads[staged.count] = head;
                        staged.count += 1;
                        continue;
                    }
                    Ok(_) => {
                        counters.rx_malformed += 1;
                        pair.rx_done(head, 0);
                        return true;
                    }
                    Err(why) => why,
                }
            }
            Ok(None) => {
                counters.rx_no_buffer += 1;
                return false;
            }
            Err(why) => why,
        };
        receiver.break_ring(index, true, broke);
        return false;
    }
    // Fill the chains in order: the header, then as much of the frame as each holds.
    let mut lengths = [0u32; MAX_MERGED];
    let (mut used, mut copied, mut whole) = (0, 0, true);
    let mut mark = |gpa: u64, len: usize| {
        if let Some(log) = log {
            log.mark(gpa, len as u64);
        }
    };
    let mem = pair.rx.memory();
    while used == 0 || copied < frame_len {
        let chain = &pair.staged.chains[used];
        let start = if used == 0 { NET_HDR_LEN } else { 0 };
        let n = (chain.len - start).min(frame_len - copied);
        whole &= frame.copy_range(chain, mem, start, copied, n, &mut mark);
        // A chain holds at most a frame and its header, under 64 KiB.
        lengths[used] = u32::try_from(start + n).unwrap_or(u32::MAX);
        (used, copied) = (used + 1, copied + n);
    }
    // `used` is at most MAX_MERGED.
    let header = header.to_bytes(u16::try_from(used).unwrap_or(u16::MAX));
    whole &= pair.staged.chains[0].write_bytes(mem, 0, &header, &mut mark);
    for (i, &length) in lengths[..used].iter().enumerate() {
        let head = pair.staged.heads[i];
        pair.rx_done(head, if whole { length } else { 0 });
    }
    pair.staged.consume(used);
    let used = used as u64;
    match whole {
        true => {
            (counters.rx_frames, counters.rx_buffers) = (counters.rx_frames + 1, counters.rx_buffers + used)
        }
        false => counters.rx_malformed += used,
    }
    true
}
