//! Frames from the host, as the uplink's receive ring holds them, switched to the NICs they are
//! for: this switch's straight away, the others' through their switches' rings.
//!
//! A frame the host's stack left its checksum in gets it filled in, in the ring. A TCP
//! super-frame (the host's TSO or GSO, up to [`MAX_SUPER_FRAME_LEN`] bytes) goes whole, with its
//! header, to a NIC whose driver takes super-frames; any other NIC, and every other switch, gets
//! it cut into segments, as a NIC would have cut it.

use af_packet::{Received, VNET_HDR_LEN};
use vm_memory::Bytes;

use crate::control::{Links, SwitchControl};
use crate::counters::UplinkCounters;
use crate::delivery::{deliver, Frame};
use crate::ethernet::{flow_of, Addresses, FLOW_BYTES};
use crate::handoff::{Record, FLOOD};
use crate::offload::{NetHeader, NET_HDR_LEN};
use crate::port::Port;
use crate::rework::Rework;
use crate::switch::{
    deliver_plain, destination_of, MAX_JUMBO_FRAME_LEN, MAX_SUPER_FRAME_LEN, MIN_FRAME_LEN, UPLINK,
};

/// Where a switch delivers: its own ports, and the switches that serve the others; and its
/// buffers for frames it cuts.
pub(crate) struct Destinations<'a> {
    pub(crate) index: usize,
    pub(crate) control: &'a SwitchControl,
    pub(crate) ports: &'a mut [Option<Box<Port>>],
    pub(crate) links: &'a mut Links,
    /// Which switches were handed a frame this pass (to be woken).
    pub(crate) handed_to: &'a mut [bool],
    pub(crate) rework: &'a mut Rework,
}

/// Switch frame `got` from the host to the NICs it is for.
pub(crate) fn from_host(got: &Received<'_>, counters: &mut UplinkCounters, to: &mut Destinations<'_>) {
    let frame_len = got.frame.len() + got.vlan_tag.map_or(0, |tag| tag.len());
    let offload = got.offload();
    let longest = if offload.segmented { MAX_SUPER_FRAME_LEN } else { MAX_JUMBO_FRAME_LEN };
    if got.truncated || frame_len > longest {
        counters.rx_too_big += 1;
        return;
    }
    let mut start = [0u8; FLOW_BYTES];
    let start = &mut start[..got.frame.len().min(FLOW_BYTES)];
    let header = match offload.segmented {
        // Not with a VLAN tag the interface took off: its offsets are the untagged frame's.
        true => {
            super_frame_header(got).filter(|header| header.fits(got.frame.len()) && got.vlan_tag.is_none())
        }
        false => (!offload.needs_checksum || got.finish_checksum()).then_some(NetHeader::default()),
    };
    let (true, Some(header), Ok(())) =
        (got.frame.len() >= MIN_FRAME_LEN, header, got.frame.read_slice(start, 0))
    else {
        counters.rx_malformed += 1;
        return;
    };
    let Some(Addresses { destination, source }) = Addresses::parse(start) else { return };
    // Without the VLAN tag the interface took off: the flow of every frame of a VLAN alike.
    let flow = flow_of(start);
    if !to.control.table.learn(source, UPLINK) {
        counters.rx_spoofed += 1;
        return;
    }
    counters.rx_frames += 1;
    counters.rx_super_frames += u64::from(header.segmentation.is_some());
    to.rework.next_frame();
    let mut tag = got.vlan_tag;
    let Some(frame) = Frame::from_host(got.frame, tag.as_mut()) else { return };
    let from_host = FromHost { frame, len: frame_len, header, flow };
    let record = |to| Record { to, from: UPLINK, isolated: false, flow };
    let switches = to.handed_to.len();
    let mut whole = true;
    match destination_of(&to.control.table, destination) {
        // A frame between two of the host's own addresses is not ours to deliver.
        Some(UPLINK) => {}
        Some(id) => match to.ports.get_mut(id).and_then(|port| port.as_deref_mut()) {
            Some(port) => whole &= from_host.to_port(port, to.rework),
            None => {
                if let Some(home) = to.control.home_of(id).filter(|&home| home != to.index) {
                    whole &= from_host.to_switch(home, record(id), to);
                }
            }
        },
        None => {
            for port in to.ports.iter_mut().flatten() {
                whole &= from_host.to_port(port, to.rework);
            }
            let (index, control) = (to.index, to.control);
            for home in (0..switches).filter(|&home| home != index && control.has_ports(home)) {
                whole &= from_host.to_switch(home, record(FLOOD), to);
            }
        }
    }
    if !whole {
        // A super-frame that is not what its header says: it could not be cut.
        counters.rx_malformed += 1;
    }
}

/// The header of a super-frame from the host, if it is one the switch can pass on or cut: TCP
/// over IPv4 or IPv6, its checksum left, no ECN.
fn super_frame_header(got: &Received<'_>) -> Option<NetHeader> {
    let mut bytes = [0u8; NET_HDR_LEN];
    bytes[..VNET_HDR_LEN].copy_from_slice(&got.vnet_header);
    NetHeader::parse(&bytes).filter(|header| header.segmentation.is_some())
}

/// One frame from the host being switched.
struct FromHost<'a> {
    frame: Frame<'a>,
    len: usize,
    /// No offload, or a super-frame's (its checksum left to the receiver).
    header: NetHeader,
    flow: u32,
}

impl FromHost<'_> {
    /// Deliver the frame to `port`: a plain frame if the port's MTU takes it, a super-frame as
    /// it is if the port's driver takes it, cut into segments otherwise. `false`: a super-frame
    /// that could not be cut.
    fn to_port(&self, port: &mut Port, rework: &mut Rework) -> bool {
        let FromHost { frame, len, header, flow } = *self;
        if header.segmentation.is_none() {
            deliver_plain(port, frame, len, flow);
            return true;
        }
        if port.offloads.take(&header) {
            deliver(port, frame, len, header, flow);
            return true;
        }
        let each = |segment: &[u8]| match segment.len() > port.max_frame_len {
            true => {
                port.counters.rx_too_big += 1;
                false
            }
            false => deliver(port, Frame::Bytes(segment), segment.len(), NetHeader::default(), flow),
        };
        rework.frames(|into| frame.copy_to(into), header, len, each)
    }

    /// Hand the frame to switch `home`, as `record` says: whole, or a super-frame's segments
    /// (frames cross between switches in their plain form). `false`: a super-frame that could
    /// not be cut.
    fn to_switch(&self, home: usize, record: Record, to: &mut Destinations<'_>) -> bool {
        let FromHost { frame, len, header, .. } = *self;
        let Some(link) = to.links.to.get_mut(home).and_then(Option::as_mut) else { return true };
        let handed = &mut to.handed_to[home];
        if header.segmentation.is_none() {
            *handed |= link.push(record, len, |into| frame.copy_to(into));
            return true;
        }
        let each = |segment: &[u8]| {
            let pushed = link.push(record, segment.len(), |into| {
                into.copy_from_slice(segment);
                true
            });
            *handed |= pushed;
            pushed
        };
        to.rework.frames(|into| frame.copy_to(into), header, len, each)
    }
}
