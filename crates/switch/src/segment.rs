//! Cutting a TCP super-frame into segments, for a receiver that does not take super-frames (a
//! driver without GUEST_TSO, or the uplink): what a NIC's segmentation offload does. Each
//! segment carries the super-frame's headers with its own lengths, IPv4 identification, TCP
//! sequence number, flags and checksums, and at most `mss` bytes of the payload.

use af_packet::checksum::{fold, ones_complement_sum};

use af_packet::VNET_HDR_LEN;

use crate::offload::{NetHeader, Segmentation};

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETHERTYPE_VLAN: u16 = 0x8100;
const IPPROTO_TCP: u8 = 6;
const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_CWR: u8 = 0x80;
/// Where the checksum is in a TCP header.
const TCP_CHECKSUM_OFFSET: u16 = 16;

/// Where a super-frame's headers are.
struct Layout {
    /// The IP header's first byte.
    ip: usize,
    /// The TCP header's first byte.
    tcp: usize,
    /// The payload's first byte.
    payload: usize,
    ipv6: bool,
}

/// Find the headers of `frame`, a TCP/IP super-frame as `segmentation` says; `None` if it is
/// not one (another protocol, IPv6 extension headers, headers past its end).
fn layout(frame: &[u8], segmentation: Segmentation) -> Option<Layout> {
    let word = |at: usize| Some(u16::from_be_bytes([*frame.get(at)?, *frame.get(at + 1)?]));
    let (mut ip, mut ethertype) = (14, word(12)?);
    if ethertype == ETHERTYPE_VLAN {
        (ip, ethertype) = (18, word(16)?);
    }
    let (tcp, ipv6) = match segmentation {
        Segmentation::Tcp4 { .. } if ethertype == ETHERTYPE_IPV4 => {
            let header_len = usize::from(*frame.get(ip)? & 0x0f) * 4;
            (header_len >= 20 && *frame.get(ip + 9)? == IPPROTO_TCP).then_some((ip + header_len, false))?
        }
        Segmentation::Tcp6 { .. } if ethertype == ETHERTYPE_IPV6 => {
            (*frame.get(ip + 6)? == IPPROTO_TCP).then_some((ip + 40, true))?
        }
        _ => return None,
    };
    let tcp_len = usize::from(*frame.get(tcp + 12)? >> 4) * 4;
    let payload = tcp + tcp_len;
    (tcp_len >= 20 && payload <= frame.len()).then_some(Layout { ip, tcp, payload, ipv6 })
}

/// Cut `frame` into segments, each built in `out` and handed to `each`, which says whether to go
/// on (a receiver out of buffers takes no more). `false`, with nothing handed over, when `frame`
/// is not the super-frame `segmentation` says or a segment would not fit `out`.
pub fn cut(
    frame: &[u8],
    segmentation: Segmentation,
    out: &mut [u8],
    mut each: impl FnMut(&[u8]) -> bool,
) -> bool {
    let mss = match segmentation {
        Segmentation::Tcp4 { mss } | Segmentation::Tcp6 { mss } => usize::from(mss),
    };
    let Some(Layout { ip, tcp, payload, ipv6 }) = layout(frame, segmentation) else { return false };
    // The longest segment: the headers and a full `mss`, or all the payload if less.
    if payload + mss.min(frame.len() - payload) > out.len() {
        return false;
    }
    let headers = &frame[..payload];
    let ipv4_id = u16::from_be_bytes([frame[ip + 4], frame[ip + 5]]);
    let sequence = u32::from_be_bytes([frame[tcp + 4], frame[tcp + 5], frame[tcp + 6], frame[tcp + 7]]);
    let chunks = frame[payload..].chunks(mss.max(1));
    let count = chunks.len().max(1);
    // A super-frame with no payload still goes out, as one segment.
    let empty: [&[u8]; 1] = [&[]];
    let pieces = chunks.chain(empty.into_iter().take(usize::from(frame.len() == payload)));
    for (i, chunk) in pieces.enumerate() {
        let len = payload + chunk.len();
        let Some(segment) = out.get_mut(..len) else { return false };
        segment[..payload].copy_from_slice(headers);
        segment[payload..].copy_from_slice(chunk);
        // Lengths and identification.
        if ipv6 {
            put(segment, ip + 4, be16(len - ip - 40));
        } else {
            put(segment, ip + 2, be16(len - ip));
            put(segment, ip + 4, ipv4_id.wrapping_add(i as u16).to_be_bytes());
            put(segment, ip + 10, [0, 0]);
            let header_sum = !ones_complement_sum(&segment[ip..tcp]);
            put(segment, ip + 10, header_sum.to_be_bytes());
        }
        // Sequence number and flags: FIN and PSH on the last segment only, CWR on the first.
        let offset = u32::try_from(i * mss).unwrap_or(u32::MAX);
        segment[tcp + 4..tcp + 8].copy_from_slice(&sequence.wrapping_add(offset).to_be_bytes());
        if i + 1 < count {
            segment[tcp + 13] &= !(TCP_FIN | TCP_PSH);
        }
        if i > 0 {
            segment[tcp + 13] &= !TCP_CWR;
        }
        // The TCP checksum over the pseudo-header, the header and the payload.
        put(segment, tcp + 16, [0, 0]);
        let tcp_len = len - tcp;
        let pseudo = match ipv6 {
            true => fold(
                u64::from(ones_complement_sum(&segment[ip + 8..ip + 40]))
                    + u64::from(ones_complement_sum(&u32::try_from(tcp_len).unwrap_or(0).to_be_bytes()))
                    + u64::from(IPPROTO_TCP),
            ),
            false => fold(
                u64::from(ones_complement_sum(&segment[ip + 12..ip + 20]))
                    + u64::from(u16::from_be_bytes(be16(tcp_len)))
                    + u64::from(IPPROTO_TCP),
            ),
        };
        let sum = !fold(u64::from(pseudo) + u64::from(ones_complement_sum(&segment[tcp..])));
        put(segment, tcp + 16, sum.to_be_bytes());
        if !each(segment) {
            break;
        }
    }
    true
}

/// The most bytes a TCP super-frame's headers take: an Ethernet header with a VLAN tag, an IPv4
/// header with options (longer than IPv6's without extensions) and a TCP header with options.
pub const MAX_HEADERS_LEN: usize = 18 + 60 + 60;

/// Why a super-frame is not passed to the host whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotForHost {
    /// It is not the TCP super-frame its header says, or its checksum is not TCP's.
    Malformed,
    /// Its segments would be longer than the host's interface takes.
    TooBig,
    /// It carries a VLAN tag, which the kernel does not look past when it cuts a super-frame
    /// it was given: the switch cuts it.
    Tagged,
}

/// The virtio-net header that passes a TCP super-frame, whose first bytes (all its headers,
/// up to [`MAX_HEADERS_LEN`]) are `start`, to the host's kernel whole, for its stack or its
/// NIC to cut into segments of at most `max_segment_len` bytes. It is checked as the kernel
/// checks what it takes from an untrusted sender: TCP over the IP version the header says,
/// the checksum left at TCP's.
pub fn host_header(
    start: &[u8],
    header: NetHeader,
    max_segment_len: usize,
) -> Result<[u8; VNET_HDR_LEN], NotForHost> {
    let Some(segmentation) = header.segmentation else { return Err(NotForHost::Malformed) };
    let Layout { ip, tcp, payload, .. } = layout(start, segmentation).ok_or(NotForHost::Malformed)?;
    if header.checksum != Some((small(tcp), TCP_CHECKSUM_OFFSET)) {
        return Err(NotForHost::Malformed);
    }
    let (Segmentation::Tcp4 { mss } | Segmentation::Tcp6 { mss }) = segmentation;
    if ip != 14 {
        return Err(NotForHost::Tagged);
    }
    if payload + usize::from(mss) > max_segment_len {
        return Err(NotForHost::TooBig);
    }
    let mut bytes = [0u8; VNET_HDR_LEN];
    bytes.copy_from_slice(&header.to_bytes(0)[..VNET_HDR_LEN]);
    bytes[2..4].copy_from_slice(&small(payload).to_le_bytes());
    Ok(bytes)
}

/// A header offset: below [`MAX_HEADERS_LEN`].
fn small(offset: usize) -> u16 {
    u16::try_from(offset).unwrap_or(u16::MAX)
}

fn put(bytes: &mut [u8], at: usize, value: [u8; 2]) {
    bytes[at..at + 2].copy_from_slice(&value);
}

/// A length within a frame (under 64 KiB) as a big-endian 16-bit field.
fn be16(len: usize) -> [u8; 2] {
    u16::try_from(len).unwrap_or(u16::MAX).to_be_bytes()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A TCP super-frame: Ethernet, IPv4 or IPv6, a 20-byte TCP header with PSH|FIN|CWR|ACK,
    /// and `payload`.
    pub(crate) fn super_frame(ipv6: bool, payload: &[u8]) -> Vec<u8> {
        let mut frame = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
        if ipv6 {
            frame.extend_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
            frame.extend_from_slice(&[0x60, 0, 0, 0]);
            frame.extend_from_slice(&be16(20 + payload.len()));
            frame.extend_from_slice(&[IPPROTO_TCP, 64]);
            frame.extend((0..32).map(|i| i as u8));
        } else {
            frame.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
            frame.extend_from_slice(&[0x45, 0]);
            frame.extend_from_slice(&be16(40 + payload.len()));
            frame.extend_from_slice(&[0x12, 0x34, 0x40, 0, 64, IPPROTO_TCP, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        }
        frame.extend_from_slice(&[0x30, 0x39, 0x00, 0x50]); // ports
        frame.extend_from_slice(&0xffff_fff0u32.to_be_bytes()); // sequence, about to wrap
        frame.extend_from_slice(&[0, 0, 0, 1, 0x50, TCP_CWR | TCP_PSH | TCP_FIN | 0x10, 0xff, 0xff]);
        frame.extend_from_slice(&[0xab, 0xcd, 0, 0]); // checksum (the pseudo-header's, left), urgent
        frame.extend_from_slice(payload);
        frame
    }

    /// Does `segment`'s TCP checksum verify, as a receiver checks it?
    pub(crate) fn tcp_checksum_verifies(segment: &[u8], ipv6: bool) -> bool {
        let layout =
            layout(segment, if ipv6 { Segmentation::Tcp6 { mss: 1 } } else { Segmentation::Tcp4 { mss: 1 } })
                .expect("a TCP segment");
        let tcp_len = segment.len() - layout.tcp;
        let addresses = match ipv6 {
            true => &segment[layout.ip + 8..layout.ip + 40],
            false => &segment[layout.ip + 12..layout.ip + 20],
        };
        let sum = u64::from(ones_complement_sum(addresses))
            + u64::from(IPPROTO_TCP)
            + tcp_len as u64
            + u64::from(ones_complement_sum(&segment[layout.tcp..]));
        fold(sum) == 0xffff
    }

    #[test]
    fn a_super_frame_is_cut_into_segments_a_receiver_checks_and_puts_back_together() {
        for ipv6 in [false, true] {
            let payload: Vec<u8> = (0..3000u32).map(|i| (i * 7 % 251) as u8).collect();
            let frame = super_frame(ipv6, &payload);
            let segmentation =
                if ipv6 { Segmentation::Tcp6 { mss: 1400 } } else { Segmentation::Tcp4 { mss: 1400 } };
            let mut out = [0u8; 1518];
            let mut segments = Vec::new();
            assert!(cut(&frame, segmentation, &mut out, |s| {
                segments.push(s.to_vec());
                true
            }));
            assert_eq!(segments.len(), 3, "1400 + 1400 + 200");
            let header_len = frame.len() - payload.len();
            let tcp = header_len - 20;
            let mut rebuilt = Vec::new();
            for (i, segment) in segments.iter().enumerate() {
                assert!(tcp_checksum_verifies(segment, ipv6), "segment {i} (IPv6: {ipv6})");
                let flags = segment[tcp + 13];
                assert_eq!(flags & (TCP_FIN | TCP_PSH) != 0, i == 2, "FIN and PSH on the last only");
                assert_eq!(flags & TCP_CWR != 0, i == 0, "CWR on the first only");
                let sequence = u32::from_be_bytes(segment[tcp + 4..tcp + 8].try_into().unwrap());
                assert_eq!(sequence, 0xffff_fff0u32.wrapping_add(1400 * i as u32));
                if !ipv6 {
                    assert_eq!(
                        usize::from(u16::from_be_bytes([segment[16], segment[17]])),
                        segment.len() - 14
                    );
                    assert_eq!(u16::from_be_bytes([segment[18], segment[19]]), 0x1234 + i as u16);
                    assert_eq!(ones_complement_sum(&segment[14..34]), 0xffff, "the IPv4 header checksum");
                } else {
                    assert_eq!(
                        usize::from(u16::from_be_bytes([segment[18], segment[19]])),
                        segment.len() - 54
                    );
                }
                rebuilt.extend_from_slice(&segment[header_len..]);
            }
            assert_eq!(rebuilt, payload);
        }
    }

    #[test]
    fn what_is_not_a_tcp_super_frame_or_does_not_fit_is_refused() {
        let frame = super_frame(false, &[7; 3000]);
        let mut out = [0u8; 1518];
        let never = |_: &[u8]| -> bool { panic!("nothing is handed over") };
        assert!(!cut(&frame, Segmentation::Tcp6 { mss: 1400 }, &mut out, never), "IPv4 named IPv6");
        assert!(!cut(&frame, Segmentation::Tcp4 { mss: 1500 }, &mut out, never), "segments over 1518 bytes");
        let mut udp = frame.clone();
        udp[23] = 17;
        assert!(!cut(&udp, Segmentation::Tcp4 { mss: 1400 }, &mut out, never));
        assert!(!cut(&frame[..40], Segmentation::Tcp4 { mss: 1400 }, &mut out, never), "headers cut short");
        let mut got = 0;
        let mut count = |_: &[u8]| {
            got += 1;
            true
        };
        assert!(cut(&super_frame(false, &[]), Segmentation::Tcp4 { mss: 1400 }, &mut out, &mut count));
        assert_eq!(got, 1, "no payload: one segment");
        let mut taken = 0;
        let two = |_: &[u8]| {
            taken += 1;
            taken < 2
        };
        assert!(cut(&frame, Segmentation::Tcp4 { mss: 1400 }, &mut out, two));
        assert_eq!(taken, 2, "a receiver out of buffers stops the cutting");
    }

    #[test]
    fn the_host_is_passed_only_a_super_frame_its_kernel_can_cut() {
        let tso = |ipv6: bool, checksum: (u16, u16), mss: u16| NetHeader {
            checksum: Some(checksum),
            segmentation: Some(match ipv6 {
                true => Segmentation::Tcp6 { mss },
                false => Segmentation::Tcp4 { mss },
            }),
        };
        let (v4, v6) = (super_frame(false, &[7; 3000]), super_frame(true, &[7; 3000]));
        let start = |frame: &[u8]| frame[..MAX_HEADERS_LEN].to_vec();
        // flags, gso_type, hdr_len, gso_size, csum_start, csum_offset.
        let header = host_header(&start(&v4), tso(false, (34, 16), 1400), 1514).unwrap();
        assert_eq!(header, [1, 1, 54, 0, 0x78, 0x05, 34, 0, 16, 0]);
        let header = host_header(&start(&v6), tso(true, (54, 16), 1400), 1514).unwrap();
        assert_eq!(header, [1, 4, 74, 0, 0x78, 0x05, 54, 0, 16, 0]);
        let refused = [
            // The checksum not at TCP's, or not where the TCP header starts.
            (start(&v4), tso(false, (34, 6), 1400), 1514, NotForHost::Malformed),
            (start(&v4), tso(false, (30, 20), 1400), 1514, NotForHost::Malformed),
            // IPv6 said of an IPv4 frame.
            (start(&v4), tso(true, (34, 16), 1400), 1514, NotForHost::Malformed),
            // Headers cut short.
            (v4[..50].to_vec(), tso(false, (34, 16), 1400), 1514, NotForHost::Malformed),
            // Segments longer than the interface takes.
            (start(&v4), tso(false, (34, 16), 1461), 1514, NotForHost::TooBig),
        ];
        for (i, (start, header, max, why)) in refused.into_iter().enumerate() {
            assert_eq!(host_header(&start, header, max), Err(why), "case {i}");
        }
        let mut tagged = v4[..12].to_vec();
        tagged.extend_from_slice(&[0x81, 0, 0, 7]);
        tagged.extend_from_slice(&v4[12..]);
        assert_eq!(host_header(&start(&tagged), tso(false, (38, 16), 1400), 1514), Err(NotForHost::Tagged));
        let plain = NetHeader { checksum: Some((34, 16)), segmentation: None };
        assert_eq!(host_header(&start(&v4), plain, 1514), Err(NotForHost::Malformed));
    }
}
