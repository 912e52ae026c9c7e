//! Just enough Ethernet II, ARP (RFC 826, Ethernet and IPv4 only), IPv4 (RFC 791: 20-byte
//! headers sent, options accepted, no fragments) and UDP (RFC 768) for the network workloads.
//! Frames are built into and parsed from byte slices; nothing is allocated.

use core::fmt;

pub type Mac = [u8; 6];
pub type Ip = [u8; 4];

pub const BROADCAST: Mac = [0xff; 6];
pub const ETH_LEN: usize = 14;
pub const ARP_LEN: usize = 28;
pub const IP_LEN: usize = 20;
pub const UDP_LEN: usize = 8;
pub const ETHERTYPE_IPV4: u16 = 0x0800;
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// IEEE 802 "local experimental" EtherType, for frames no stack should act on.
pub const ETHERTYPE_EXPERIMENTAL: u16 = 0x88b5;
pub const ARP_REQUEST: u16 = 1;
pub const ARP_REPLY: u16 = 2;
/// The largest UDP payload in one unfragmented 1514-byte Ethernet frame.
pub const MAX_UDP_PAYLOAD: usize = 1514 - ETH_LEN - IP_LEN - UDP_LEN;

const IPPROTO_UDP: u8 = 17;
const ARP_HTYPE_ETHERNET: u16 = 1;
/// IPv4 "don't fragment" flag, and the "more fragments" flag and offset mask.
const IP_DF: u16 = 0x4000;
const IP_MF_OFFSET: u16 = 0x3fff;
const TTL: u8 = 64;

fn get16(bytes: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([bytes[at], bytes[at + 1]])
}

fn put16(bytes: &mut [u8], at: usize, value: u16) {
    bytes[at..at + 2].copy_from_slice(&value.to_be_bytes());
}

fn mac_at(bytes: &[u8], at: usize) -> Mac {
    let mut mac = [0; 6];
    mac.copy_from_slice(&bytes[at..at + 6]);
    mac
}

fn ip_at(bytes: &[u8], at: usize) -> Ip {
    let mut ip = [0; 4];
    ip.copy_from_slice(&bytes[at..at + 4]);
    ip
}

/// The ones'-complement sum of `data` as big-endian 16-bit words (a last odd byte padded
/// with zero), added to `sum`. Only the last part of a checksummed run may have odd length.
fn sum16(mut sum: u64, data: &[u8]) -> u64 {
    let mut words = data.chunks_exact(2);
    for word in &mut words {
        sum += u16::from_be_bytes([word[0], word[1]]) as u64;
    }
    if let [last] = words.remainder() {
        sum += (*last as u64) << 8;
    }
    sum
}

/// Fold a ones'-complement sum and complement it: the Internet checksum (RFC 1071).
fn fold(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The Internet checksum of `data` (0 when `data` already holds a correct checksum).
pub fn checksum(data: &[u8]) -> u16 {
    fold(sum16(0, data))
}

/// The UDP checksum over the IPv4 pseudo-header and `segment` (UDP header and payload).
fn udp_checksum(src: Ip, dst: Ip, segment: &[u8]) -> u16 {
    let mut pseudo = [0u8; 12];
    pseudo[0..4].copy_from_slice(&src);
    pseudo[4..8].copy_from_slice(&dst);
    pseudo[9] = IPPROTO_UDP;
    put16(&mut pseudo, 10, segment.len() as u16);
    fold(sum16(sum16(0, &pseudo), segment))
}

/// Write an Ethernet header; returns its length.
pub fn ethernet(buf: &mut [u8], dst: Mac, src: Mac, ethertype: u16) -> usize {
    buf[0..6].copy_from_slice(&dst);
    buf[6..12].copy_from_slice(&src);
    put16(buf, 12, ethertype);
    ETH_LEN
}

/// An ARP packet (Ethernet/IPv4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arp {
    pub op: u16,
    pub sender_mac: Mac,
    pub sender_ip: Ip,
    pub target_mac: Mac,
    pub target_ip: Ip,
}

/// Write an Ethernet frame to `eth_dst` carrying `arp`; returns the frame's length.
pub fn write_arp(buf: &mut [u8], eth_dst: Mac, arp: &Arp) -> usize {
    let n = ethernet(buf, eth_dst, arp.sender_mac, ETHERTYPE_ARP);
    let p = &mut buf[n..n + ARP_LEN];
    put16(p, 0, ARP_HTYPE_ETHERNET);
    put16(p, 2, ETHERTYPE_IPV4);
    p[4] = 6;
    p[5] = 4;
    put16(p, 6, arp.op);
    p[8..14].copy_from_slice(&arp.sender_mac);
    p[14..18].copy_from_slice(&arp.sender_ip);
    p[18..24].copy_from_slice(&arp.target_mac);
    p[24..28].copy_from_slice(&arp.target_ip);
    n + ARP_LEN
}

/// Addresses and ports of a UDP datagram.
#[derive(Clone, Copy, Debug)]
pub struct UdpAddrs {
    pub src_mac: Mac,
    pub dst_mac: Mac,
    pub src_ip: Ip,
    pub dst_ip: Ip,
    pub sport: u16,
    pub dport: u16,
}

/// Write an Ethernet/IPv4/UDP frame whose `payload_len`-byte payload `fill` writes, with
/// IPv4 identification `ident` (DF set, TTL 64) and both checksums; returns the frame's
/// length. `payload_len` must be at most [`MAX_UDP_PAYLOAD`] and `buf` large enough.
pub fn write_udp(
    buf: &mut [u8],
    addrs: &UdpAddrs,
    ident: u16,
    payload_len: usize,
    fill: impl FnOnce(&mut [u8]),
) -> usize {
    debug_assert!(payload_len <= MAX_UDP_PAYLOAD);
    let n = ethernet(buf, addrs.dst_mac, addrs.src_mac, ETHERTYPE_IPV4);
    let udp_len = UDP_LEN + payload_len;
    let total = n + IP_LEN + udp_len;
    let ip = &mut buf[n..n + IP_LEN];
    ip[0] = 0x45; // version 4, 5 words of header
    ip[1] = 0;
    put16(ip, 2, (IP_LEN + udp_len) as u16);
    put16(ip, 4, ident);
    put16(ip, 6, IP_DF);
    ip[8] = TTL;
    ip[9] = IPPROTO_UDP;
    put16(ip, 10, 0);
    ip[12..16].copy_from_slice(&addrs.src_ip);
    ip[16..20].copy_from_slice(&addrs.dst_ip);
    let sum = checksum(ip);
    put16(ip, 10, sum);
    let segment = &mut buf[n + IP_LEN..total];
    put16(segment, 0, addrs.sport);
    put16(segment, 2, addrs.dport);
    put16(segment, 4, udp_len as u16);
    put16(segment, 6, 0);
    fill(&mut segment[UDP_LEN..]);
    // A computed 0 goes out as all ones: 0 means "no checksum" (RFC 768).
    let sum = match udp_checksum(addrs.src_ip, addrs.dst_ip, segment) {
        0 => 0xffff,
        sum => sum,
    };
    put16(segment, 6, sum);
    total
}

/// A UDP datagram addressed to us.
#[derive(Clone, Copy, Debug)]
pub struct Udp<'a> {
    pub src_ip: Ip,
    pub sport: u16,
    pub dport: u16,
    pub payload: &'a [u8],
}

/// What a received frame is, when it is for us.
#[derive(Clone, Copy, Debug)]
pub enum Packet<'a> {
    Arp(Arp),
    Udp(Udp<'a>),
}

/// Why a received frame was ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ignored {
    /// Another MAC or IP address, or an ARP request for another address.
    NotForUs,
    /// An EtherType, ARP hardware/protocol or IP protocol the probe does not speak.
    Unsupported,
    /// Too short for its headers, or lengths that do not add up.
    Malformed,
    BadChecksum,
    /// A piece of a fragmented IPv4 datagram.
    Fragment,
}

/// Parse `frame` for the station with `mac` and `ip`: ARP packets sent to it or broadcast,
/// and UDP datagrams sent to it with valid IPv4 header and UDP checksums (a UDP checksum of 0
/// means none). Ethernet padding after the IPv4 datagram is ignored.
pub fn parse<'a>(frame: &'a [u8], mac: &Mac, ip: &Ip) -> Result<Packet<'a>, Ignored> {
    if frame.len() < ETH_LEN {
        return Err(Ignored::Malformed);
    }
    let dst = mac_at(frame, 0);
    let body = &frame[ETH_LEN..];
    match get16(frame, 12) {
        ETHERTYPE_ARP => {
            if dst != *mac && dst != BROADCAST {
                return Err(Ignored::NotForUs);
            }
            parse_arp(body, ip)
        }
        ETHERTYPE_IPV4 => {
            if dst != *mac {
                return Err(Ignored::NotForUs);
            }
            parse_ipv4(body, ip)
        }
        _ => Err(Ignored::Unsupported),
    }
}

fn parse_arp(p: &[u8], ip: &Ip) -> Result<Packet<'static>, Ignored> {
    if p.len() < ARP_LEN {
        return Err(Ignored::Malformed);
    }
    if get16(p, 0) != ARP_HTYPE_ETHERNET || get16(p, 2) != ETHERTYPE_IPV4 || p[4] != 6 || p[5] != 4 {
        return Err(Ignored::Unsupported);
    }
    let arp = Arp {
        op: get16(p, 6),
        sender_mac: mac_at(p, 8),
        sender_ip: ip_at(p, 14),
        target_mac: mac_at(p, 18),
        target_ip: ip_at(p, 24),
    };
    if !matches!(arp.op, ARP_REQUEST | ARP_REPLY) {
        return Err(Ignored::Unsupported);
    }
    if arp.target_ip != *ip {
        return Err(Ignored::NotForUs);
    }
    Ok(Packet::Arp(arp))
}

fn parse_ipv4<'a>(p: &'a [u8], ip: &Ip) -> Result<Packet<'a>, Ignored> {
    if p.len() < IP_LEN || p[0] >> 4 != 4 {
        return Err(Ignored::Malformed);
    }
    let header_len = (p[0] & 0xf) as usize * 4;
    let total = get16(p, 2) as usize;
    if header_len < IP_LEN || total < header_len || total > p.len() {
        return Err(Ignored::Malformed);
    }
    if checksum(&p[..header_len]) != 0 {
        return Err(Ignored::BadChecksum);
    }
    if get16(p, 6) & IP_MF_OFFSET != 0 {
        return Err(Ignored::Fragment);
    }
    if ip_at(p, 16) != *ip {
        return Err(Ignored::NotForUs);
    }
    if p[9] != IPPROTO_UDP {
        return Err(Ignored::Unsupported);
    }
    let src_ip = ip_at(p, 12);
    let segment = &p[header_len..total];
    if segment.len() < UDP_LEN {
        return Err(Ignored::Malformed);
    }
    let udp_len = get16(segment, 4) as usize;
    if udp_len < UDP_LEN || udp_len > segment.len() {
        return Err(Ignored::Malformed);
    }
    let segment = &segment[..udp_len];
    if get16(segment, 6) != 0 && udp_checksum(src_ip, *ip, segment) != 0 {
        return Err(Ignored::BadChecksum);
    }
    Ok(Packet::Udp(Udp {
        src_ip,
        sport: get16(segment, 0),
        dport: get16(segment, 2),
        payload: &segment[UDP_LEN..],
    }))
}

/// `a.b.c.d`, or `None`.
pub fn parse_ip(text: &str) -> Option<Ip> {
    let mut ip = [0u8; 4];
    let mut parts = text.split('.');
    for byte in &mut ip {
        *byte = parts.next()?.parse().ok()?;
    }
    parts.next().is_none().then_some(ip)
}

/// A MAC address written as a JSON string: `"52:54:00:12:34:56"`.
pub struct MacText(pub Mac);

impl fmt::Display for MacText {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let m = self.0;
        write!(f, "\"{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}\"", m[0], m[1], m[2], m[3], m[4], m[5])
    }
}

/// An IPv4 address written as a JSON string: `"10.0.0.2"`.
pub struct IpText(pub Ip);

impl fmt::Display for IpText {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let a = self.0;
        write!(f, "\"{}.{}.{}.{}\"", a[0], a[1], a[2], a[3])
    }
}
