//! Copying one frame, from a NIC's transmit chain or the uplink's ring, into a NIC's next
//! receive chain.

use vm_memory::{GuestMemoryMmap, VolatileSlice};

use crate::chain::{copy, At, Chain};
use crate::ethernet::ADDRESSES_LEN;
use crate::port::Port;
use crate::switch::NET_HDR_LEN;

/// Where the bytes of the frame being delivered are.
#[derive(Clone, Copy)]
pub(crate) enum Frame<'a> {
    /// In a NIC's transmit chain, after its header.
    Guest(At<'a>),
    /// In the uplink's receive ring, less the VLAN tag the interface took off, if any.
    Host { bytes: VolatileSlice<'a>, vlan_tag: Option<[u8; 4]> },
}

impl Frame<'_> {
    /// Copy the frame's `len` bytes after the header of `chain`, in `mem`; `false` if it is
    /// shorter. Calls `mark` with each guest range written.
    fn write_to(
        self,
        chain: &Chain,
        mem: &GuestMemoryMmap,
        len: usize,
        mut mark: impl FnMut(u64, usize),
    ) -> bool {
        let to = At { chain, mem, offset: NET_HDR_LEN };
        match self {
            Frame::Guest(from) => copy(to, from, len, mark),
            Frame::Host { bytes, vlan_tag: None } => chain.write_volatile(mem, NET_HDR_LEN, &bytes, mark),
            Frame::Host { bytes, vlan_tag: Some(mut tag) } => {
                // The tag goes back where it was: after the two addresses.
                let (Ok(addresses), Ok(rest)) =
                    (bytes.subslice(0, ADDRESSES_LEN), bytes.offset(ADDRESSES_LEN))
                else {
                    return false;
                };
                let tag = VolatileSlice::from(&mut tag[..]);
                chain.write_volatile(mem, NET_HDR_LEN, &addresses, &mut mark)
                    && chain.write_volatile(mem, NET_HDR_LEN + ADDRESSES_LEN, &tag, &mut mark)
                    && chain.write_volatile(mem, NET_HDR_LEN + ADDRESSES_LEN + tag.len(), &rest, &mut mark)
            }
        }
    }
}

/// Copy `frame`, of `frame_len` bytes, into `receiver`'s next receive chain.
pub(crate) fn deliver(receiver: &mut Port, frame: Frame<'_>, frame_len: usize) {
    if receiver.broken {
        return;
    }
    if receiver.staged.is_none() {
        let head = match receiver.rx.pop_avail() {
            Ok(Some(head)) => head,
            Ok(None) => {
                receiver.counters.rx_no_buffer += 1;
                return;
            }
            Err(why) => return receiver.break_ring(true, why),
        };
        match receiver.staged_chain.gather(&receiver.rx, head, true) {
            Err(why) => return receiver.break_ring(true, why),
            Ok(true) if receiver.staged_chain.len >= NET_HDR_LEN => receiver.staged = Some(head),
            Ok(_) => {
                receiver.counters.rx_malformed += 1;
                return receiver.rx_done(head, 0);
            }
        }
    }
    if frame_len > receiver.staged_chain.len - NET_HDR_LEN {
        // The chain waits for a shorter frame.
        receiver.counters.rx_too_big += 1;
        return;
    }
    let Some(head) = receiver.staged.take() else { return };
    let Port { rx, staged_chain, log, .. } = &*receiver;
    let mut mark = |gpa: u64, len: usize| {
        if let Some(log) = log {
            log.mark(gpa, len as u64);
        }
    };
    // No offload was negotiated: all fields 0 but `num_buffers`, 1.
    let mut header = [0u8; NET_HDR_LEN];
    header[10] = 1;
    let mem = rx.memory();
    let copied = staged_chain.write_volatile(mem, 0, &VolatileSlice::from(&mut header[..]), &mut mark)
        && frame.write_to(staged_chain, mem, frame_len, &mut mark);
    match copied {
        true => {
            receiver.counters.rx_frames += 1;
            receiver.rx_done(head, (NET_HDR_LEN + frame_len) as u32);
        }
        false => {
            receiver.counters.rx_malformed += 1;
            receiver.rx_done(head, 0);
        }
    }
}
