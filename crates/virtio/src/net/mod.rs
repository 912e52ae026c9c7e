//! virtio-net (virtio 1.x §5.1): one receive and one transmit queue, no offloads, no control
//! queue, no mergeable receive buffers.
//!
//! Every packet in either direction is a 12-byte `virtio_net_hdr` (the VERSION_1 layout, all
//! zeroes: no checksum or segmentation offload; `num_buffers` is 1 on receive) followed by one
//! Ethernet frame of at most [`MAX_FRAME_LEN`] bytes. The driver posts receive chains big enough
//! for that (a fixed buffer size, as without VIRTIO_NET_F_MRG_RXBUF); a frame that does not fit
//! the chain it would land in is dropped and counted.

pub mod backend;
pub mod device;
pub mod worker;

pub use backend::NetBackend;
pub use device::{rarp_announcement, Net};
pub use worker::{NetCounters, NetWorker};

/// The virtio device ID of a network card (virtio 1.x §5).
pub const VIRTIO_ID_NET: u32 = 1;
/// Feature bit (virtio 1.x §5.1.3): configuration space holds the MAC address the driver uses.
pub const VIRTIO_NET_F_MAC: u32 = 5;
/// The header before every frame (VERSION_1: with `num_buffers`).
pub const NET_HDR_LEN: usize = 12;
/// The longest frame without offloads: 1500 bytes of payload, an Ethernet header and a VLAN tag.
pub const MAX_FRAME_LEN: usize = 1518;
/// The shortest frame worth passing on: an Ethernet header.
pub const MIN_FRAME_LEN: usize = 14;
/// Index of the receive queue, receiveq1 (virtio 1.x §5.1.2).
pub const RX_QUEUE: usize = 0;
/// Index of the transmit queue, transmitq1 (virtio 1.x §5.1.2).
pub const TX_QUEUE: usize = 1;

/// `52:54:00:12:34:56`.
pub fn mac_text(mac: [u8; 6]) -> String {
    mac.map(|b| format!("{b:02x}")).join(":")
}

/// The six bytes of a MAC address written as `mac_text` writes it; `None` for anything else.
pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        let part = parts.next().filter(|p| p.len() == 2)?;
        *byte = u8::from_str_radix(part, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

#[cfg(test)]
mod tests;
