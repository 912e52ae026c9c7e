//! The `virtio_net_hdr` before every frame (virtio 1.x §5.1.6), and which offloads a NIC's
//! driver took: a checksum left to whoever takes the frame (`NEEDS_CSUM`), a TCP super-frame
//! to be cut into segments (`gso_type`), and receive chains merged for one frame
//! (`num_buffers`).

/// The header's length (VERSION_1: with `num_buffers`).
pub const NET_HDR_LEN: usize = 12;

/// Feature bit: the device takes frames whose checksum is left to it (`NEEDS_CSUM`).
pub const VIRTIO_NET_F_CSUM: u32 = 0;
/// Feature bit: the driver takes frames whose checksum is left to it.
pub const VIRTIO_NET_F_GUEST_CSUM: u32 = 1;
/// Feature bit: the driver takes TCP/IPv4 super-frames.
pub const VIRTIO_NET_F_GUEST_TSO4: u32 = 7;
/// Feature bit: the driver takes TCP/IPv6 super-frames.
pub const VIRTIO_NET_F_GUEST_TSO6: u32 = 8;
/// Feature bit: the device takes TCP/IPv4 super-frames.
pub const VIRTIO_NET_F_HOST_TSO4: u32 = 11;
/// Feature bit: the device takes TCP/IPv6 super-frames.
pub const VIRTIO_NET_F_HOST_TSO6: u32 = 12;
/// Feature bit: one received frame may span several receive chains.
pub const VIRTIO_NET_F_MRG_RXBUF: u32 = 15;

/// `flags`: the checksum from `csum_start` on is not filled in.
const NEEDS_CSUM: u8 = 1;
/// `gso_type`: a plain frame.
const GSO_NONE: u8 = 0;
/// `gso_type`: a TCP/IPv4 super-frame.
const GSO_TCPV4: u8 = 1;
/// `gso_type`: a TCP/IPv6 super-frame.
const GSO_TCPV6: u8 = 4;
/// The smallest segment payload a super-frame may ask for: Linux's own floor for TCP
/// (`tcp_min_snd_mss`). Smaller, a 64 KiB super-frame would make over a thousand segments.
pub const MIN_MSS: u16 = 48;

/// What a super-frame is, for whoever cuts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segmentation {
    /// TCP over IPv4, cut into segments of `mss` payload bytes.
    Tcp4 {
        /// The payload of each segment but the last.
        mss: u16,
    },
    /// TCP over IPv6.
    Tcp6 {
        /// The payload of each segment but the last.
        mss: u16,
    },
}

/// A frame's header: what its sender left for the device (or the receiver) to do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetHeader {
    /// The checksum to fill in: the bytes it covers start at the first, and it goes at the
    /// second, counted from the first (the sender put the pseudo-header's sum there).
    pub checksum: Option<(u16, u16)>,
    /// A super-frame, and how to cut it.
    pub segmentation: Option<Segmentation>,
}

impl NetHeader {
    /// The header a transmit chain starts with; `None` for a header that is not one a driver
    /// of the features offered sends (an unknown segmentation, ECN, a super-frame whose
    /// checksum is not left to the device).
    pub fn parse(bytes: &[u8; NET_HDR_LEN]) -> Option<NetHeader> {
        let word = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
        let (flags, gso_type, gso_size) = (bytes[0], bytes[1], word(4));
        let checksum = (flags & NEEDS_CSUM != 0).then(|| (word(6), word(8)));
        let segmentation = match gso_type {
            GSO_NONE => None,
            GSO_TCPV4 if gso_size >= MIN_MSS => Some(Segmentation::Tcp4 { mss: gso_size }),
            GSO_TCPV6 if gso_size >= MIN_MSS => Some(Segmentation::Tcp6 { mss: gso_size }),
            _ => return None,
        };
        if segmentation.is_some() && checksum.is_none() {
            return None;
        }
        Some(NetHeader { checksum, segmentation })
    }

    /// The header's bytes, for a receiver that took `num_buffers` chains.
    pub fn to_bytes(self, num_buffers: u16) -> [u8; NET_HDR_LEN] {
        let mut bytes = [0u8; NET_HDR_LEN];
        if let Some((start, offset)) = self.checksum {
            bytes[0] = NEEDS_CSUM;
            bytes[6..8].copy_from_slice(&start.to_le_bytes());
            bytes[8..10].copy_from_slice(&offset.to_le_bytes());
        }
        if let Some(segmentation) = self.segmentation {
            let (gso_type, mss) = match segmentation {
                Segmentation::Tcp4 { mss } => (GSO_TCPV4, mss),
                Segmentation::Tcp6 { mss } => (GSO_TCPV6, mss),
            };
            bytes[1] = gso_type;
            bytes[4..6].copy_from_slice(&mss.to_le_bytes());
        }
        bytes[10..12].copy_from_slice(&num_buffers.to_le_bytes());
        bytes
    }

    /// Does the checksum it names lie in a frame of `len` bytes?
    pub fn fits(&self, len: usize) -> bool {
        self.checksum.is_none_or(|(start, offset)| usize::from(start) + usize::from(offset) + 2 <= len)
    }
}

/// The features offered to a NIC's driver for offloads: a frame may leave its checksum, and
/// be a TCP super-frame, both ways, and spread over several receive chains.
pub const OFFERED: u64 = 1 << VIRTIO_NET_F_CSUM
    | 1 << VIRTIO_NET_F_GUEST_CSUM
    | 1 << VIRTIO_NET_F_GUEST_TSO4
    | 1 << VIRTIO_NET_F_GUEST_TSO6
    | 1 << VIRTIO_NET_F_HOST_TSO4
    | 1 << VIRTIO_NET_F_HOST_TSO6
    | 1 << VIRTIO_NET_F_MRG_RXBUF;

/// What a NIC's driver takes on receive, from the features it accepted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Offloads {
    /// Frames whose checksum is left (GUEST_CSUM).
    pub checksum: bool,
    /// TCP/IPv4 super-frames (GUEST_TSO4).
    pub tso4: bool,
    /// TCP/IPv6 super-frames (GUEST_TSO6).
    pub tso6: bool,
    /// One frame over several receive chains (MRG_RXBUF).
    pub merged_buffers: bool,
}

impl Offloads {
    /// What a driver that accepted `features` takes.
    pub fn from_features(features: u64) -> Offloads {
        let has = |bit: u32| features & (1 << bit) != 0;
        // Super-frames come with their checksum left: only with GUEST_CSUM (virtio 1.x §5.1.3.1).
        let checksum = has(VIRTIO_NET_F_GUEST_CSUM);
        Offloads {
            checksum,
            tso4: checksum && has(VIRTIO_NET_F_GUEST_TSO4),
            tso6: checksum && has(VIRTIO_NET_F_GUEST_TSO6),
            merged_buffers: has(VIRTIO_NET_F_MRG_RXBUF),
        }
    }

    /// Can the frame `header` describes be handed over as it is?
    pub fn take(&self, header: &NetHeader) -> bool {
        let checksum = header.checksum.is_none() || self.checksum;
        let segmentation = match header.segmentation {
            None => true,
            Some(Segmentation::Tcp4 { .. }) => self.tso4,
            Some(Segmentation::Tcp6 { .. }) => self.tso6,
        };
        checksum && segmentation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_goes_through_parse_and_back_and_odd_ones_are_refused() {
        let header =
            NetHeader { checksum: Some((34, 16)), segmentation: Some(Segmentation::Tcp4 { mss: 1448 }) };
        let bytes = header.to_bytes(3);
        assert_eq!(bytes[10..], [3, 0]);
        assert_eq!(NetHeader::parse(&bytes), Some(header));
        assert_eq!(NetHeader::parse(&[0; NET_HDR_LEN]), Some(NetHeader::default()));
        let mut ecn = bytes;
        ecn[1] |= 0x80;
        assert_eq!(NetHeader::parse(&ecn), None, "ECN is not offered");
        let mut no_checksum = bytes;
        no_checksum[0] = 0;
        assert_eq!(NetHeader::parse(&no_checksum), None, "a super-frame leaves its checksum");
        let mut no_mss = bytes;
        no_mss[4..6].copy_from_slice(&(MIN_MSS - 1).to_le_bytes());
        assert_eq!(NetHeader::parse(&no_mss), None, "segments too small to be worth cutting");
        assert!(header.fits(52) && !header.fits(51));
    }

    #[test]
    fn a_driver_takes_what_it_accepted_and_super_frames_only_with_checksums() {
        let tso4 =
            NetHeader { checksum: Some((34, 16)), segmentation: Some(Segmentation::Tcp4 { mss: 1448 }) };
        let all = Offloads::from_features(OFFERED);
        assert!(all.take(&tso4) && all.merged_buffers);
        let none = Offloads::from_features(0);
        assert!(none.take(&NetHeader::default()));
        assert!(!none.take(&NetHeader { checksum: Some((34, 16)), segmentation: None }));
        let without_csum = Offloads::from_features(OFFERED & !(1 << VIRTIO_NET_F_GUEST_CSUM));
        assert!(!without_csum.take(&tso4));
    }
}
