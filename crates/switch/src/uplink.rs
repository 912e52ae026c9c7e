//! The switch's uplink: an AF_PACKET socket's mapped rings on a host interface. The switch
//! queues frames for the host here ([`Uplink::queue`]), each checked against what the interface
//! takes, and they go with the pass's one flush; what it did is counted.

use std::sync::Arc;

use af_packet::{Fill, PacketRing, VNET_HDR_LEN};
use vm_memory::{Bytes, VolatileSlice};

use crate::counters::{SharedUplinkCounters, UplinkCounters};
use crate::switch::{MAX_JUMBO_FRAME_LEN, MAX_SUPER_FRAME_LEN, MIN_FRAME_LEN};

/// An 802.1Q tag's bytes.
pub(crate) const VLAN_TAG_LEN: usize = 4;

/// The host's side of the switch: an AF_PACKET socket's rings on a host interface.
pub(crate) struct Uplink {
    pub(crate) ring: PacketRing,
    /// The longest untagged frame it sends: its interface's MTU and an Ethernet header, at most
    /// a jumbo frame (a frame with a VLAN tag may be 4 bytes longer, as the kernel allows).
    pub(crate) max_frame_len: usize,
    pub(crate) counters: UplinkCounters,
    /// Where `counters` are published for other threads, once per pass that did work.
    pub(crate) shared: Arc<SharedUplinkCounters>,
}

impl Uplink {
    /// The uplink on `ring`, counting on from what `shared` holds.
    pub(crate) fn new(ring: PacketRing, shared: Arc<SharedUplinkCounters>) -> Uplink {
        let mtu = usize::try_from(ring.mtu()).unwrap_or(usize::MAX);
        let max_frame_len = mtu.saturating_add(MIN_FRAME_LEN).min(MAX_JUMBO_FRAME_LEN - VLAN_TAG_LEN);
        Uplink { ring, max_frame_len, counters: shared.read(), shared }
    }

    /// Queue one frame, written into its slot by `fill` (its length: the slot's first bytes),
    /// and count it; `fill` says whether it wrote it whole. A super-frame comes with the
    /// `vnet_header` that tells the host how to cut it, checked against the host's interface
    /// already. Whether it was queued.
    pub(crate) fn queue(
        &mut self,
        len: usize,
        vnet_header: Option<[u8; VNET_HDR_LEN]>,
        fill: impl FnOnce(&VolatileSlice<'_>) -> bool,
    ) -> bool {
        // Longer than the host's interface takes (a jumbo frame from a port of a larger MTU); a
        // tagged frame may be a tag longer, which is known once it is in the slot.
        let untagged_limit = match vnet_header {
            Some(_) => MAX_SUPER_FRAME_LEN,
            None => self.max_frame_len,
        };
        if len > untagged_limit + VLAN_TAG_LEN {
            self.counters.tx_too_big += 1;
            return false;
        }
        let (mut copied, mut too_big) = (false, false);
        let queued = self.ring.transmit(|slot| match slot.subslice(0, len) {
            Ok(into) if fill(&into) => {
                too_big = len > untagged_limit && !is_tagged(&into);
                copied = !too_big;
                match (too_big, vnet_header) {
                    (true, _) => Fill::Nothing,
                    (false, None) => Fill::Frame(len),
                    (false, Some(vnet_header)) => Fill::Offloaded { len, vnet_header },
                }
            }
            _ => Fill::Nothing,
        });
        if too_big {
            self.counters.tx_too_big += 1;
            return false;
        }
        match (queued, copied) {
            (false, _) => self.counters.tx_ring_full += 1,
            (true, true) => self.counters.tx_frames += 1,
            // The chain was checked when gathered: guest memory cannot shrink under it.
            (true, false) => {}
        }
        queued && copied
    }

    /// Log what it did, as the switch stops.
    pub(crate) fn log_counters(&self) {
        let c = &self.counters;
        log::info!(
            "uplink {}: {} frames from the host switched ({} super-frames), {} sent to it ({} super-frames); \
             dropped: {} too long, {} malformed, {} spoofed, {} with its transmit ring full, {} too long for \
             it; {} failed flushes",
            self.ring.interface(),
            c.rx_frames,
            c.rx_super_frames,
            c.tx_frames,
            c.tx_super_frames,
            c.rx_too_big,
            c.rx_malformed,
            c.rx_spoofed,
            c.tx_ring_full,
            c.tx_too_big,
            c.tx_errors
        );
    }
}

/// Does `frame` carry an 802.1Q tag after its addresses?
fn is_tagged(frame: &VolatileSlice<'_>) -> bool {
    let mut ethertype = [0u8; 2];
    frame.read_slice(&mut ethertype, 12).is_ok() && ethertype == [0x81, 0x00]
}
