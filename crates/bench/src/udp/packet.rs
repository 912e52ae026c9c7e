//! `exitless udp-rr --packet IFACE`: the request-response client without the socket layer or
//! the kernel's UDP and IP stack, as the guest's ring-3 stack is. It writes whole Ethernet
//! frames to an AF_PACKET socket and busy polls a memory-mapped receive ring (TPACKET_V2) for
//! the echoes, so waiting for an answer makes no system call; sending one makes one (`send`),
//! as a guest's notification is one exit where the device does not poll.
//!
//! The client uses an address of its own (`--from`, `--from-mac`) that its namespace's kernel
//! does not own: the echo, sent to that MAC, is another host's frame there, which the IP stack
//! drops at once (no UDP lookup, no ICMP port-unreachable). The responder's side needs a
//! neighbour entry for it (the bench adds one).

use std::io;
use std::net::SocketAddrV4;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

use thiserror::Error;

use super::Transport;

/// Ethernet (14), IPv4 without options (20) and UDP (8) headers.
const HEADERS: usize = 42;
/// Largest UDP payload in one standard Ethernet frame.
pub const MAX_PAYLOAD: usize = 1472;
const ETH_P_IP: u16 = 0x0800;
const IPPROTO_UDP: u8 = 17;
/// One frame slot of the receive ring: a standard frame and the ring's own header fit.
const FRAME_SIZE: usize = 2048;
/// One page per block, two slots each.
const BLOCK_SIZE: usize = 4096;
const BLOCKS: usize = 64;

/// Why the AF_PACKET client could not start.
#[derive(Debug, Error)]
pub enum PacketError {
    #[error("no network interface `{0}` in this namespace")]
    NoInterface(String),
    #[error("cannot open an AF_PACKET socket (needs CAP_NET_RAW): {0}")]
    Socket(io::Error),
    #[error("cannot set up the AF_PACKET socket's {what}: {source}")]
    Setup { what: &'static str, source: io::Error },
    #[error("--packet sends one Ethernet frame per request: --size must be at most {MAX_PAYLOAD}")]
    TooLarge,
}

/// Where the client's frames go and come from.
pub struct Addresses {
    pub interface: String,
    pub from: SocketAddrV4,
    pub from_mac: [u8; 6],
    pub to: SocketAddrV4,
    pub to_mac: [u8; 6],
}

/// An AF_PACKET socket bound to one interface, with its receive ring mapped.
pub struct PacketClient {
    fd: OwnedFd,
    ring: *mut u8,
    /// The slot to look at next.
    next: usize,
    /// The request frame: headers filled once, payload and lengths per request.
    frame: Vec<u8>,
    from: SocketAddrV4,
    to: SocketAddrV4,
    /// Frames the ring held that were not an answer to us.
    pub ignored: u64,
}

impl PacketClient {
    /// Opens the socket on `addresses.interface`, maps its receive ring and binds it, for
    /// requests of `size` payload bytes.
    pub fn open(addresses: &Addresses, size: usize) -> Result<PacketClient, PacketError> {
        if size > MAX_PAYLOAD {
            return Err(PacketError::TooLarge);
        }
        let name = std::ffi::CString::new(addresses.interface.as_str())
            .map_err(|_| PacketError::NoInterface(addresses.interface.clone()))?;
        // SAFETY: `name` is a NUL-terminated string that outlives the call.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if index == 0 {
            return Err(PacketError::NoInterface(addresses.interface.clone()));
        }
        // SAFETY: plain system call; the returned descriptor is owned below.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(ETH_P_IP.to_be())) };
        if raw < 0 {
            return Err(PacketError::Socket(io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a descriptor we just opened and nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let setup = |what| move |source| PacketError::Setup { what, source };
        set_option(&fd, libc::PACKET_VERSION, libc::tpacket_versions::TPACKET_V2 as i32)
            .map_err(setup("TPACKET_V2 version"))?;
        // Our own requests are not answers: keep them out of the ring.
        set_option(&fd, libc::PACKET_IGNORE_OUTGOING, 1).map_err(setup("PACKET_IGNORE_OUTGOING"))?;
        let request = libc::tpacket_req {
            tp_block_size: BLOCK_SIZE as u32,
            tp_block_nr: BLOCKS as u32,
            tp_frame_size: FRAME_SIZE as u32,
            tp_frame_nr: (BLOCKS * BLOCK_SIZE / FRAME_SIZE) as u32,
        };
        set_option(&fd, libc::PACKET_RX_RING, request).map_err(setup("receive ring"))?;
        // SAFETY: maps the ring the kernel just made for `fd`, at a place of the kernel's
        // choosing; the mapping is unmapped on drop and used only within its length.
        let ring = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                BLOCKS * BLOCK_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ring == libc::MAP_FAILED {
            return Err(PacketError::Setup { what: "ring mapping", source: io::Error::last_os_error() });
        }
        let client = PacketClient {
            fd,
            ring: ring.cast(),
            next: 0,
            frame: request_headers(addresses, size),
            from: addresses.from,
            to: addresses.to,
            ignored: 0,
        };
        // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
        let mut at: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        at.sll_family = libc::AF_PACKET as u16;
        at.sll_protocol = ETH_P_IP.to_be();
        at.sll_ifindex = index as i32;
        // SAFETY: `at` is a valid sockaddr_ll of the length passed.
        let bound = unsafe {
            libc::bind(
                client.fd.as_raw_fd(),
                (&at as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if bound != 0 {
            return Err(PacketError::Setup { what: "interface binding", source: io::Error::last_os_error() });
        }
        Ok(client)
    }

    /// The slot `i`'s header, as the kernel shares it.
    fn slot(&self, i: usize) -> *mut u8 {
        // SAFETY: `i` < the ring's slot count, so the slot lies inside the mapping.
        unsafe { self.ring.add(i * FRAME_SIZE) }
    }

    /// The answer's payload if `frame` is a UDP datagram from the responder to us.
    fn answer<'a>(&self, frame: &'a [u8]) -> Option<&'a [u8]> {
        let ip = frame.get(14..).filter(|_| frame[12..14] == ETH_P_IP.to_be_bytes())?;
        let ihl = usize::from(ip.first()? & 0xf) * 4;
        if ip.len() < ihl + 8 || ihl < 20 || ip[9] != IPPROTO_UDP {
            return None;
        }
        if ip[12..16] != self.to.ip().octets() || ip[16..20] != self.from.ip().octets() {
            return None;
        }
        let udp = &ip[ihl..];
        let port = |at: usize| u16::from_be_bytes([udp[at], udp[at + 1]]);
        if port(0) != self.to.port() || port(2) != self.from.port() {
            return None;
        }
        udp.get(8..usize::from(port(4)))
    }
}

impl Transport for PacketClient {
    fn send(&mut self, payload: &[u8]) -> io::Result<()> {
        self.frame.truncate(HEADERS);
        self.frame.extend_from_slice(payload); // within the capacity reserved at open
        let ip_len = (self.frame.len() - 14) as u16;
        self.frame[16..18].copy_from_slice(&ip_len.to_be_bytes());
        self.frame[24..26].copy_from_slice(&[0, 0]);
        let checksum = ip_checksum(&self.frame[14..34]);
        self.frame[24..26].copy_from_slice(&checksum.to_be_bytes());
        self.frame[38..40].copy_from_slice(&(ip_len - 20).to_be_bytes());
        // SAFETY: sends `frame`'s initialised bytes on our bound socket.
        let sent =
            unsafe { libc::send(self.fd.as_raw_fd(), self.frame.as_ptr().cast(), self.frame.len(), 0) };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn recv(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let slots = BLOCKS * BLOCK_SIZE / FRAME_SIZE;
        loop {
            let slot = self.slot(self.next);
            // SAFETY: the slot starts with a tpacket2_hdr, 16-byte aligned (ring and slot size
            // are), whose tp_status the kernel and we hand back and forth: accessed atomically.
            let status = unsafe { AtomicU32::from_ptr(slot.cast::<u32>()) };
            if status.load(Ordering::Acquire) & libc::TP_STATUS_USER == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            // SAFETY: the slot is ours until we give it back (TP_STATUS_USER above); the kernel
            // wrote its header and `tp_snaplen` bytes at `tp_mac`, inside the slot.
            let frame = unsafe {
                let header = std::ptr::read(slot.cast::<libc::tpacket2_hdr>());
                let (at, len) = (usize::from(header.tp_mac), header.tp_snaplen as usize);
                std::slice::from_raw_parts(slot.add(at), len.min(FRAME_SIZE.saturating_sub(at)))
            };
            let copied = self.answer(frame).map(|payload| {
                let n = payload.len().min(buffer.len());
                buffer[..n].copy_from_slice(&payload[..n]);
                n
            });
            status.store(libc::TP_STATUS_KERNEL, Ordering::Release);
            self.next = (self.next + 1) % slots;
            match copied {
                Some(n) => return Ok(n),
                None => self.ignored += 1,
            }
        }
    }
}

impl Drop for PacketClient {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the ring mapped in `open`; nothing refers to it after this.
        unsafe { libc::munmap(self.ring.cast(), BLOCKS * BLOCK_SIZE) };
    }
}

fn set_option<T>(fd: &OwnedFd, name: i32, value: T) -> io::Result<()> {
    // SAFETY: `value` is a live T whose size is passed; the kernel only reads it.
    let done = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            name,
            (&value as *const T).cast(),
            std::mem::size_of::<T>() as u32,
        )
    };
    if done != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The request frame's headers (lengths and the IP checksum filled per request), with room for
/// a `size`-byte payload.
fn request_headers(a: &Addresses, size: usize) -> Vec<u8> {
    let mut frame = Vec::with_capacity(HEADERS + size);
    frame.extend_from_slice(&a.to_mac);
    frame.extend_from_slice(&a.from_mac);
    frame.extend_from_slice(&ETH_P_IP.to_be_bytes());
    // IPv4: version 4, 20-byte header, length (later), id 0, don't fragment, TTL 64, UDP,
    // checksum (later), source, destination.
    frame.extend_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, IPPROTO_UDP, 0, 0]);
    frame.extend_from_slice(&a.from.ip().octets());
    frame.extend_from_slice(&a.to.ip().octets());
    // UDP: ports, length (later), checksum 0 (none: allowed over IPv4).
    frame.extend_from_slice(&a.from.port().to_be_bytes());
    frame.extend_from_slice(&a.to.port().to_be_bytes());
    frame.extend_from_slice(&[0, 0, 0, 0]);
    frame
}

/// The Internet checksum of an IPv4 header.
fn ip_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ip_checksum_of_a_known_header() {
        // The example header from RFC 1071's errata-free walkthroughs (Wikipedia's IPv4 page).
        let header = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8, 0x00, 0x01,
            0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(ip_checksum(&header), 0xb861);
    }
}
