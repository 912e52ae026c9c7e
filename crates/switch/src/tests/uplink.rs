//! The uplink on a real veth pair: the "host" is an AF_PACKET socket on the far end, which sends
//! frames with the virtio-net header a host's stack would (offloads included).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use af_packet::PacketRing;
use test_infra::net::{ip, Veth};

use super::*;

const HOST: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x99]);

/// A raw AF_PACKET socket on one interface, each frame with a virtio-net header.
struct Host(OwnedFd);

impl Host {
    fn on(interface: &str) -> Host {
        let name = std::ffi::CString::new(interface).unwrap();
        // SAFETY: plain calls on a socket made here; the structures are what they are given as.
        unsafe {
            // Protocol 0 until it is bound: the frames of this interface only.
            let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0);
            assert!(fd >= 0);
            let fd = OwnedFd::from_raw_fd(fd);
            let on = 1i32;
            let set = libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_VNET_HDR,
                (&on as *const i32).cast(),
                4,
            );
            assert_eq!(set, 0);
            let mut address: libc::sockaddr_ll = std::mem::zeroed();
            address.sll_family = libc::AF_PACKET as u16;
            address.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
            address.sll_ifindex = libc::if_nametoindex(name.as_ptr()) as i32;
            let len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
            assert_eq!(libc::bind(fd.as_raw_fd(), (&address as *const libc::sockaddr_ll).cast(), len), 0);
            Host(fd)
        }
    }

    fn send(&self, vnet: [u8; af_packet::VNET_HDR_LEN], frame: &[u8]) {
        let bytes = [&vnet[..], frame].concat();
        // SAFETY: sends `bytes`, which outlives the call.
        let sent = unsafe { libc::send(self.0.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), 0) };
        assert_eq!(sent, bytes.len() as isize, "{}", std::io::Error::last_os_error());
    }

    /// The next frame within 5 s (a limit that only ends a test that would hang).
    fn receive(&self) -> Option<Vec<u8>> {
        self.receive_with_header().map(|(_, frame)| frame)
    }

    /// The same, with its virtio-net header.
    fn receive_with_header(&self) -> Option<([u8; af_packet::VNET_HDR_LEN], Vec<u8>)> {
        let mut pollfd = libc::pollfd { fd: self.0.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd; a buffer of the length given.
        unsafe {
            if libc::poll(&mut pollfd, 1, 5000) != 1 {
                return None;
            }
            let mut buffer = vec![0u8; 70_000];
            let n = libc::recv(self.0.as_raw_fd(), buffer.as_mut_ptr().cast(), buffer.len(), 0);
            buffer.truncate(usize::try_from(n).ok()?);
            let frame = buffer.split_off(af_packet::VNET_HDR_LEN);
            Some((buffer.try_into().ok()?, frame))
        }
    }
}

/// Poll the switch until guest `g` received something (or 5 s pass): its frames.
fn poll_until_received(rig: &mut Rig, g: usize) -> Vec<Vec<u8>> {
    let give_up = Instant::now() + Duration::from_secs(5);
    loop {
        rig.poll();
        let got = rig.guests[g].received(&[2048]);
        if !got.is_empty() || Instant::now() > give_up {
            return got;
        }
    }
}

fn uplinked(policies: &[PortPolicy]) -> (Veth, Host, Rig) {
    let veth = Veth::create();
    // Room for frames longer than the switch takes.
    for end in [&veth.ours, &veth.peer] {
        ip(&["link", "set", end, "mtu", "9000"]);
    }
    let rig = rig_with(policies, Some(PacketRing::open(&veth.ours).unwrap()));
    let host = Host::on(&veth.peer);
    (veth, host, rig)
}

#[test]
fn frames_go_between_nics_and_the_host_through_the_uplink() {
    let (_veth, host, rig) = uplinked(&[PortPolicy::default(), PortPolicy::default()]);
    nics_and_the_host_exchange_frames(&host, rig, 0);
}

/// With two IOCores, the uplink is switch 0's: a NIC on switch 1 hears the host and reaches
/// it through the ring between the two.
#[test]
fn a_nic_on_another_iocore_reaches_the_host_through_the_uplink() {
    let veth = Veth::create();
    let ports = [PortPolicy::default(); 2].map(|policy| (policy, Offloads::default()));
    let rig = rig_on(2, ports.into_iter(), Some(PacketRing::open(&veth.ours).unwrap()));
    assert_eq!(rig.control.home_of(rig.guests[1].port), Some(1));
    nics_and_the_host_exchange_frames(&Host::on(&veth.peer), rig, 1);
}

/// The host's broadcast reaches both NICs; then guest `sender`'s frame to the host goes there
/// only (its address was learnt on the uplink), and its frame to an address seen nowhere to
/// the host and the other NIC.
fn nics_and_the_host_exchange_frames(host: &Host, mut rig: Rig, sender: usize) {
    let other = 1 - sender;
    for g in &mut rig.guests {
        g.post_rx(0, &[2048]);
        g.post_rx(1, &[2048]);
    }
    let a = rig.guests[sender].mac;
    let hello = frame(MacAddr::BROADCAST, HOST, 60, 1);
    host.send([0; 10], &hello);
    assert_eq!(poll_until_received(&mut rig, sender), vec![hello.clone()]);
    assert_eq!(rig.guests[other].received(&[2048]), vec![hello]);
    let answer = frame(HOST, a, 1514, 2);
    rig.guests[sender].transmit(0, &answer, &[14, 100]);
    rig.poll();
    assert_eq!(host.receive(), Some(answer));
    assert_eq!(rig.guests[other].received(&[2048]).len(), 0);
    let unknown = frame(MacAddr([0x02, 0, 0, 0, 0, 0x42]), a, 60, 3);
    rig.guests[sender].transmit(1, &unknown, &[]);
    rig.poll();
    assert_eq!(host.receive(), Some(unknown.clone()));
    assert_eq!(rig.guests[other].received(&[2048]), vec![unknown]);
    let uplink = rig.switch.uplink_counters().unwrap();
    assert_eq!((uplink.rx_frames, uplink.tx_frames), (1, 2));
}

/// The uplink takes frames as long as its interface's MTU (9000 here): a NIC of a jumbo MTU
/// and the host send each other jumbo frames; a frame longer than the interface takes is
/// dropped and counted on the uplink, and the host's jumbo frame for a NIC of the standard MTU
/// on that NIC, as a Linux bridge drops it.
#[test]
fn jumbo_frames_go_to_and_from_the_host_as_far_as_the_interface_takes_them() {
    const PAGES: [u32; 3] = [4096, 4096, 4096];
    let jumbo = PortPolicy { mtu: Some(MAX_MTU), ..PortPolicy::default() };
    let (_veth, host, mut rig) = uplinked(&[jumbo, PortPolicy::default()]);
    for g in &mut rig.guests {
        g.post_rx(0, &PAGES);
        g.post_rx(3, &PAGES);
    }
    host.send([0; 10], &frame(MacAddr::BROADCAST, HOST, 60, 1));
    assert_eq!(poll_until_received(&mut rig, 0).len(), 1);
    assert_eq!(rig.guests[1].received(&PAGES).len(), 1);
    let (a, b) = (rig.guests[0].mac, rig.guests[1].mac);
    // The longest untagged frame of a 9000-byte MTU, then one byte more.
    let longest = frame(HOST, a, 9014, 2);
    rig.guests[0].transmit(0, &longest, &[4000, 8000]);
    rig.guests[0].transmit(3, &frame(HOST, a, 9015, 3), &[4000, 8000]);
    rig.poll();
    assert_eq!(host.receive(), Some(longest));
    let uplink = rig.switch.uplink_counters().unwrap();
    assert_eq!((uplink.tx_too_big, uplink.tx_frames), (1, 1));
    // The host's jumbo frames: to the jumbo NIC, and to the other, over its MTU.
    let to_a = frame(a, HOST, 9014, 4);
    host.send([0; 10], &to_a);
    host.send([0; 10], &frame(b, HOST, 9014, 5));
    let give_up = Instant::now() + Duration::from_secs(5);
    let mut got = Vec::new();
    while got.is_empty() && Instant::now() < give_up {
        rig.poll();
        got = rig.guests[0].received(&PAGES);
    }
    assert_eq!(got, vec![to_a]);
    while rig.counters(1).rx_too_big == 0 && Instant::now() < give_up {
        rig.poll();
    }
    assert_eq!(rig.counters(1).rx_too_big, 1);
    assert_eq!(rig.guests[1].received(&PAGES).len(), 0);
}

/// A UDP/IPv4 frame from HOST to `to` with `payload`, its UDP checksum holding only the
/// pseudo-header's sum (as a sender that leaves the checksum to offload sends it) or whole.
fn udp_frame(to: MacAddr, payload: &[u8], whole: bool) -> Vec<u8> {
    let udp_len = 8 + payload.len();
    let mut f = frame(to, HOST, 14, 0);
    let (src, dst) = ([10, 0, 0, 1], [10, 0, 0, 2]);
    f.extend_from_slice(&[0x45, 0, 0, 0, 0, 0, 0, 0, 64, 17, 0, 0]);
    f[16..18].copy_from_slice(&((20 + udp_len) as u16).to_be_bytes());
    f.extend_from_slice(&src);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&[0x30, 0x39, 0x00, 0x07]);
    f.extend_from_slice(&(udp_len as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    let sum16 = |bytes: &[u8]| -> u32 {
        bytes.chunks(2).map(|p| u32::from(u16::from_be_bytes([p[0], *p.get(1).unwrap_or(&0)]))).sum()
    };
    let fold = |mut s: u32| {
        while s >> 16 != 0 {
            s = (s & 0xffff) + (s >> 16);
        }
        s as u16
    };
    let pseudo = fold(sum16(&src) + sum16(&dst) + 17 + udp_len as u32);
    let checksum = match whole {
        false => pseudo,
        true => !fold(u32::from(pseudo) + sum16(&f[34..])),
    };
    f[40..42].copy_from_slice(&checksum.to_be_bytes());
    f
}

#[test]
fn the_hosts_checksum_offload_is_finished_its_vlan_tags_kept_and_its_long_frames_refused() {
    let (_veth, host, mut rig) = uplinked(&[PortPolicy::default()]);
    for head in 0..4 {
        rig.guests[0].post_rx(head, &[2048]);
    }
    let a = rig.guests[0].mac;
    // NEEDS_CSUM, the checksum at 34 + 6 over the UDP header and payload.
    let payload: Vec<u8> = (0..333u32).map(|i| (i * 7) as u8).collect();
    let mut vnet = [0u8; 10];
    vnet[0] = 1;
    vnet[6..8].copy_from_slice(&34u16.to_le_bytes());
    vnet[8..10].copy_from_slice(&6u16.to_le_bytes());
    host.send(vnet, &udp_frame(a, &payload, false));
    assert_eq!(poll_until_received(&mut rig, 0), vec![udp_frame(a, &payload, true)]);
    // An 802.1Q-tagged frame arrives tagged, whether or not the interface took the tag off.
    let mut tagged = frame(a, HOST, 64, 9);
    tagged.splice(12..12, [0x81, 0x00, 0x00, 0x2a]);
    host.send([0; 10], &tagged);
    assert_eq!(poll_until_received(&mut rig, 0), vec![tagged]);
    // Longer than the NIC's MTU: dropped and counted on it; the next frame goes on.
    host.send([0; 10], &frame(a, HOST, 2000, 1));
    let next = frame(a, HOST, 60, 2);
    host.send([0; 10], &next);
    assert_eq!(poll_until_received(&mut rig, 0), vec![next]);
    assert_eq!(rig.counters(0).rx_too_big, 1);
}

#[test]
fn the_host_cannot_send_from_a_nics_address() {
    let own = PortPolicy { mac: Some(guest_mac(0)), ..PortPolicy::default() };
    let (_veth, host, mut rig) = uplinked(&[own, PortPolicy::default()]);
    for g in &mut rig.guests {
        g.post_rx(0, &[2048]);
        g.post_rx(1, &[2048]);
    }
    let (a, b) = (rig.guests[0].mac, rig.guests[1].mac);
    // B makes itself known (A and the host hear it).
    rig.guests[1].transmit(0, &frame(MacAddr::BROADCAST, b, 60, 0), &[]);
    rig.poll();
    assert!(host.receive().is_some(), "the broadcast reached the host");
    assert_eq!(rig.guests[0].received(&[2048]).len(), 1);
    host.send([0; 10], &frame(b, a, 60, 1));
    let next = frame(b, HOST, 60, 2);
    host.send([0; 10], &next);
    assert_eq!(poll_until_received(&mut rig, 1), vec![next], "only the frame from the host's own address");
    assert_eq!(rig.switch.uplink_counters().unwrap().rx_spoofed, 1);
    // A's frames still go to A.
    let to_a = frame(a, b, 60, 3);
    rig.guests[1].transmit(1, &to_a, &[]);
    rig.poll();
    assert_eq!(rig.guests[0].received(&[2048]), vec![to_a]);
}

#[test]
fn an_isolated_nic_talks_to_the_host_only() {
    let isolated = PortPolicy { isolated_to: Some(guest_mac(0)), ..PortPolicy::default() };
    let (_veth, host, mut rig) = uplinked(&[isolated, PortPolicy::default()]);
    for g in &mut rig.guests {
        g.post_rx(0, &[2048]);
    }
    let a = rig.guests[0].mac;
    let hello = frame(MacAddr::BROADCAST, a, 60, 1);
    rig.guests[0].transmit(0, &hello, &[]);
    rig.poll();
    assert_eq!(host.receive(), Some(hello));
    assert_eq!(rig.guests[1].received(&[2048]).len(), 0);
    let answer = frame(a, HOST, 60, 2);
    host.send([0; 10], &answer);
    assert_eq!(poll_until_received(&mut rig, 0), vec![answer]);
}

/// The host's TCP super-frames (its stack's TSO or GSO, longer than any frame on the wire)
/// reach a NIC whose driver takes super-frames whole, with their header, and one whose driver
/// does not cut into segments that verify. One the switch cannot cut (ECN) is dropped and
/// counted, and the next frame goes on.
#[test]
fn the_hosts_super_frames_arrive_whole_or_cut_into_segments() {
    hosts_super_frames(1);
}

/// The same with two IOCores: the NIC that takes no super-frame is on the other one, and gets
/// the segments through the ring between the two switches.
#[test]
fn the_hosts_super_frames_cross_to_another_iocore_as_segments() {
    hosts_super_frames(2);
}

fn hosts_super_frames(switches: usize) {
    use super::offload::{assert_cut, assert_whole, TSO4};
    use crate::offload::OFFERED;
    use crate::segment::tests::super_frame;

    let veth = Veth::create();
    let ports = [Offloads::from_features(OFFERED), Offloads::default()].map(|o| (PortPolicy::default(), o));
    let mut rig = rig_on(switches, ports.into_iter(), Some(PacketRing::open(&veth.ours).unwrap()));
    assert_eq!(rig.control.home_of(rig.guests[1].port), Some(switches - 1));
    let host = Host::on(&veth.peer);
    for head in 0..SIZE {
        rig.guests[0].post_rx(head, &[4096]);
        rig.guests[1].post_rx(head, &[2048]);
    }
    // 14,000 bytes of TCP payload in segments of 1,400 (a 14,054-byte frame, beyond a jumbo
    // frame), to everyone.
    let payload: Vec<u8> = (0..14_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut frame = super_frame(false, &payload);
    frame[..6].copy_from_slice(&MacAddr::BROADCAST.0);
    frame[6..12].copy_from_slice(&HOST.0);
    let vnet = |gso_type: u8| {
        let mut vnet = [0u8; af_packet::VNET_HDR_LEN];
        vnet.copy_from_slice(&TSO4.to_bytes(0)[..af_packet::VNET_HDR_LEN]);
        vnet[1] = gso_type;
        vnet[2..4].copy_from_slice(&54u16.to_le_bytes()); // hdr_len
        vnet
    };
    host.send(vnet(1), &frame);
    let give_up = Instant::now() + Duration::from_secs(5);
    while rig.guests[1].used_index(true) < 10 && Instant::now() < give_up {
        rig.poll();
    }

    let chains = rig.guests[0].used_chains(&[4096]);
    assert_eq!(chains.len(), 4, "the super-frame over merged chains");
    assert_whole(&chains, TSO4, &frame);
    let segments = rig.guests[1].received(&[2048]);
    assert_eq!(segments.len(), 10);
    assert_cut(&segments, &payload);

    // TCP with ECN (CWR) in a super-frame: not one the switch cuts.
    host.send(vnet(0x81), &frame);
    let next = super::frame(MacAddr::BROADCAST, HOST, 60, 3);
    host.send([0; 10], &next);
    assert_eq!(poll_until_received(&mut rig, 1), vec![next]);
    let uplink = rig.switch.uplink_counters().unwrap();
    let counted = (uplink.rx_frames, uplink.rx_super_frames, uplink.rx_malformed, uplink.rx_too_big);
    assert_eq!(counted, (2, 1, 1, 0), "{uplink:?}");
}

/// A NIC's TCP super-frames go to the host whole, with the virtio-net header that tells its
/// kernel how to cut them (no copy into segments, no checksum computed). One whose segments
/// the host's interface would not take is dropped as too long; one that is not TCP, or whose
/// checksum is not TCP's, as a bad offload; a VLAN-tagged one is cut by the switch. The
/// uplink goes on.
#[test]
fn a_nics_super_frames_reach_the_host_whole() {
    use super::offload::TSO4;
    use crate::offload::Segmentation;
    use crate::segment::tests::super_frame;

    let (_veth, host, mut rig) = uplinked(&[PortPolicy::default()]);
    let payload: Vec<u8> = (0..30_000u32).map(|i| (i * 11 % 251) as u8).collect();
    let addressed = |mut frame: Vec<u8>| {
        frame[..6].copy_from_slice(&HOST.0);
        frame[6..12].copy_from_slice(&guest_mac(0).0);
        frame
    };
    let frame = addressed(super_frame(false, &payload));
    rig.guests[0].transmit_with(0, TSO4, &frame, &[NET_HDR_LEN, 3000]);
    rig.poll();
    let (header, got) = host.receive_with_header().expect("the super-frame reached the host");
    assert!(got == frame, "the super-frame changed on the way ({} bytes of {})", got.len(), frame.len());
    // TCP/IPv4 segments of 1,400 bytes, the checksum at TCP's.
    assert_eq!((header[1], u16::from_le_bytes([header[4], header[5]])), (1, 1400), "{header:?}");
    assert_eq!(
        (u16::from_le_bytes([header[6], header[7]]), u16::from_le_bytes([header[8], header[9]])),
        (34, 16)
    );

    // Segments of 9,000 bytes: longer than the interface's MTU (9,000) takes.
    let jumbo_segments = NetHeader { segmentation: Some(Segmentation::Tcp4 { mss: 9000 }), ..TSO4 };
    rig.guests[0].transmit_with(1, jumbo_segments, &frame, &[]);
    // Its checksum left at UDP's place in the TCP header.
    rig.guests[0].transmit_with(2, NetHeader { checksum: Some((34, 6)), ..TSO4 }, &frame, &[]);
    // Not TCP.
    let mut udp = frame.clone();
    udp[23] = 17;
    rig.guests[0].transmit_with(3, TSO4, &udp, &[]);
    // VLAN-tagged: cut by the switch into 22 segments of up to 1,400 bytes.
    let mut tagged = frame[..12].to_vec();
    tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x07]);
    tagged.extend_from_slice(&frame[12..]);
    let tagged_header = NetHeader { checksum: Some((38, 16)), ..TSO4 };
    rig.guests[0].transmit_with(4, tagged_header, &tagged, &[]);
    let after = super::frame(HOST, guest_mac(0), 100, 9);
    rig.guests[0].transmit(5, &after, &[]);
    rig.poll();
    // The host's interface takes the tag off as it receives them.
    let mut lengths = Vec::new();
    loop {
        let frame = host.receive().expect("the segments and the frame after them reached the host");
        if frame == after {
            break;
        }
        lengths.push(frame.len());
    }
    let mut expected = vec![54 + 1400; 21];
    expected.push(54 + 600);
    assert_eq!(lengths, expected, "the tagged super-frame's segments, and nothing else");
    let uplink = rig.switch.uplink_counters().unwrap();
    assert_eq!((uplink.tx_frames, uplink.tx_super_frames, uplink.tx_too_big), (24, 1, 1), "{uplink:?}");
    let sender = rig.counters(0);
    assert_eq!((sender.tx_frames, sender.tx_bad_offload, sender.tx_segmented), (6, 2, 1), "{sender:?}");
}
