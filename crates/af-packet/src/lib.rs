//! An AF_PACKET socket on a host interface with its receive and transmit rings mapped into our
//! memory (PACKET_MMAP, TPACKET_V2): the uplink of the switch.
//!
//! - Receiving is a load of the next slot's status word: a frame the kernel put there is read in
//!   place and the slot handed back with one store. No system call.
//! - Transmitting writes frames into free slots of the transmit ring; one `send` per batch
//!   ([`PacketRing::flush`]) tells the kernel to put them on the wire.
//!
//! Every frame carries a virtio-net header (PACKET_VNET_HDR): a frame the host's stack sent with
//! its checksum left to offload says so ([`Received::offload`]), and
//! [`Received::finish_checksum`] fills it in; a segmentation-offload super-frame is told from an
//! MTU-sized one. The interface is put in promiscuous mode, so frames to every guest's address
//! arrive, and frames we transmit are not read back (PACKET_IGNORE_OUTGOING).

#![deny(missing_docs)]
#![cfg_attr(not(test), warn(clippy::cast_possible_truncation, clippy::cast_sign_loss))]

pub mod checksum;
mod mapping;

use std::ffi::CString;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

use thiserror::Error;
use vm_memory::{Bytes, VolatileSlice};

use mapping::Mapping;

/// Bytes of one slot of either ring: its `tpacket2_hdr`, the virtio-net header and a
/// segmentation-offload super-frame of up to 64 KiB with its Ethernet header and a VLAN tag.
const SLOT_SIZE: usize = 72 << 10;
/// Bytes of one ring block, which holds 7 slots: the kernel allocates blocks in powers of two
/// of pages, and slots never straddle blocks.
const BLOCK_SIZE: usize = 512 << 10;
const SLOTS_PER_BLOCK: usize = BLOCK_SIZE / SLOT_SIZE;
/// Blocks in each ring (18.5 MiB).
const BLOCKS: usize = 37;
const SLOTS: usize = BLOCKS * SLOTS_PER_BLOCK;
const _: () = assert!(SLOT_SIZE.is_multiple_of(16));
/// Slots in the receive ring: as many as the transmit ring has, so that a burst one uplink
/// sends another takes in whole.
pub const RX_SLOTS: usize = SLOTS;
/// Slots in the transmit ring.
pub const TX_SLOTS: usize = SLOTS;
/// Every protocol, as the kernel's `ETH_P_ALL`.
const ETH_P_ALL: u16 = 0x0003;
/// The virtio-net header before every frame (`struct virtio_net_hdr`, without `num_buffers`).
pub const VNET_HDR_LEN: usize = 10;
/// Where a transmitted frame's bytes start in its slot (the kernel's `TPACKET2_HDRLEN` less the
/// `sockaddr_ll` it counts in).
const TX_DATA: usize = libc::TPACKET2_HDRLEN - size_of::<libc::sockaddr_ll>();
/// The longest frame one transmit slot holds: a super-frame of up to 64 KiB fits.
pub const MAX_TX_FRAME: usize = SLOT_SIZE - TX_DATA - VNET_HDR_LEN;
/// `virtio_net_hdr.flags`: the checksum from `csum_start` on is not filled in.
const VNET_NEEDS_CSUM: u8 = 1;

/// Why the uplink could not be opened; nothing is left open.
#[derive(Debug, Error)]
pub enum PacketError {
    /// No interface has the name, or the name cannot be one.
    #[error("no network interface is called `{0}` (see `ip link`)")]
    NoInterface(String),
    /// A step of the set-up failed: the socket, an option, the mapping or the bind.
    #[error("cannot {step} the AF_PACKET socket on {interface}: {source}{}", hint(.source))]
    SetUp {
        /// The interface.
        interface: String,
        /// What was being done.
        step: &'static str,
        /// The system call's error.
        source: io::Error,
    },
}

fn hint(error: &io::Error) -> &'static str {
    match error.raw_os_error() {
        Some(libc::EPERM) => " (it takes root or CAP_NET_RAW)",
        _ => "",
    }
}

/// What the virtio-net header of a received frame says of its offloads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Offload {
    /// The checksum at `csum_start + csum_offset`, over the bytes from `csum_start` on, is left
    /// to be filled in ([`Received::finish_checksum`]).
    pub needs_checksum: bool,
    /// Where the checksummed bytes start.
    pub csum_start: u16,
    /// Where the checksum is, from `csum_start`.
    pub csum_offset: u16,
    /// A segmentation-offload super-frame (a TSO, UFO or GSO frame): longer than the MTU, to be
    /// cut into frames by whoever takes it.
    pub segmented: bool,
}

/// A frame in the receive ring, lent for as long as [`PacketRing::receive`]'s closure runs.
pub struct Received<'a> {
    /// The frame from its Ethernet header on (without a VLAN tag the interface took off).
    pub frame: VolatileSlice<'a>,
    /// The 802.1Q tag the interface took off (TPID and TCI, big-endian), to put back after the
    /// addresses.
    pub vlan_tag: Option<[u8; 4]>,
    /// The frame was longer than its slot; `frame` holds only its start.
    pub truncated: bool,
    /// The virtio-net header as the kernel wrote it (`struct virtio_net_hdr`): its offloads
    /// ([`Received::offload`]) and, for a super-frame, how to cut it.
    pub vnet_header: [u8; VNET_HDR_LEN],
}

impl Received<'_> {
    /// What its virtio-net header says of its offloads.
    pub fn offload(&self) -> Offload {
        let header = &self.vnet_header;
        Offload {
            needs_checksum: header[0] & VNET_NEEDS_CSUM != 0,
            segmented: header[1] != 0,
            csum_start: u16::from_le_bytes([header[6], header[7]]),
            csum_offset: u16::from_le_bytes([header[8], header[9]]),
        }
    }

    /// Fill in the checksum the sender left to offload, in the ring; `false` if the header's
    /// offsets do not lie in the frame.
    pub fn finish_checksum(&self) -> bool {
        let offload = self.offload();
        checksum::finish(&self.frame, offload.csum_start.into(), offload.csum_offset.into())
    }
}

/// What [`PacketRing::transmit`]'s closure did with the slot it was lent.
pub enum Fill {
    /// The frame is the slot's first bytes, this many: send it.
    Frame(usize),
    /// The same, with offloads left to the host (`struct virtio_net_hdr`): a checksum to fill
    /// in, a TCP super-frame for it (or its NIC) to cut into segments. A header the kernel
    /// refuses loses the frame, not the ring.
    Offloaded {
        /// The frame's bytes.
        len: usize,
        /// What is left to the host.
        vnet_header: [u8; VNET_HDR_LEN],
    },
    /// Nothing to send: the slot stays free.
    Nothing,
}

/// An AF_PACKET socket bound to one interface, with both rings mapped.
pub struct PacketRing {
    // The mapping goes before the socket (fields drop in order): the kernel frees the rings when
    // the socket closes.
    rings: Mapping,
    socket: OwnedFd,
    interface: String,
    /// The interface's MTU when the socket was opened.
    mtu: u32,
    rx_next: usize,
    tx_next: usize,
    tx_queued: bool,
}

// SAFETY: the rings are memory this value owns (its mapping), shared only with the kernel through
// the status words' protocol; nothing in it is tied to the thread that made it.
unsafe impl Send for PacketRing {}

/// The socket: readable (epoll) while a received frame waits in the receive ring.
impl AsRawFd for PacketRing {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.socket.as_raw_fd()
    }
}

impl PacketRing {
    /// Open an AF_PACKET socket on `interface`, map its rings, and put the interface in
    /// promiscuous mode for as long as the socket lives.
    pub fn open(interface: &str) -> Result<PacketRing, PacketError> {
        let name = CString::new(interface).map_err(|_| PacketError::NoInterface(interface.into()))?;
        // SAFETY: `name` is a NUL-terminated string; the call only reads it.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if index == 0 {
            return Err(PacketError::NoInterface(interface.into()));
        }
        let fail = |step| move |source| PacketError::SetUp { interface: interface.into(), step, source };
        let all_protocols = ETH_P_ALL.to_be();
        // Protocol 0: the socket receives nothing until it is bound to the interface (with
        // ETH_P_ALL). Opened with ETH_P_ALL, it would take every interface's frames into its
        // ring while it is set up, and the switch would hand them to the guests.
        // SAFETY: plain socket creation; the descriptor is owned at once below.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(fail("create")(io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just created and nothing else owns it.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        // The header options must come before the rings, which are laid out by them.
        set_option(&socket, libc::PACKET_VERSION, &(libc::tpacket_versions::TPACKET_V2 as i32))
            .map_err(fail("set TPACKET_V2 on"))?;
        set_option(&socket, libc::PACKET_VNET_HDR, &1i32).map_err(fail("set PACKET_VNET_HDR on"))?;
        set_option(&socket, libc::PACKET_IGNORE_OUTGOING, &1i32)
            .map_err(fail("set PACKET_IGNORE_OUTGOING on"))?;
        // Frames go through the interface's queueing discipline, as the host's own do: not
        // past it (PACKET_QDISC_BYPASS), where the kernel drops a super-frame the interface
        // cannot take whole instead of cutting it into segments.
        //
        // A frame the kernel refuses as it takes it from the ring (a virtio-net header it finds
        // wrong) is skipped, not sent. Without this the kernel stops at it, and every frame
        // queued after it waits (see `flush` for those it drops later).
        set_option(&socket, libc::PACKET_LOSS, &1i32).map_err(fail("set PACKET_LOSS on"))?;
        let ring = libc::tpacket_req {
            tp_block_size: small(BLOCK_SIZE),
            tp_block_nr: small(BLOCKS),
            tp_frame_size: small(SLOT_SIZE),
            tp_frame_nr: small(SLOTS),
        };
        let index = i32::try_from(index).map_err(|_| PacketError::NoInterface(interface.into()))?;
        set_option(&socket, libc::PACKET_RX_RING, &ring).map_err(fail("make the receive ring of"))?;
        set_option(&socket, libc::PACKET_TX_RING, &ring).map_err(fail("make the transmit ring of"))?;
        let rings = Mapping::of(&socket, 2 * BLOCKS * BLOCK_SIZE).map_err(fail("map the rings of"))?;
        let address = libc::sockaddr_ll {
            sll_family: small(libc::AF_PACKET),
            sll_protocol: all_protocols,
            sll_ifindex: index,
            sll_hatype: 0,
            sll_pkttype: 0,
            sll_halen: 0,
            sll_addr: [0; 8],
        };
        // SAFETY: `address` is a sockaddr_ll of the length given; bind only reads it.
        let bound = unsafe {
            libc::bind(
                socket.as_raw_fd(),
                (&address as *const libc::sockaddr_ll).cast(),
                small(size_of::<libc::sockaddr_ll>()),
            )
        };
        if bound < 0 {
            return Err(fail("bind")(io::Error::last_os_error()));
        }
        let promiscuous = libc::packet_mreq {
            mr_ifindex: index,
            mr_type: small(libc::PACKET_MR_PROMISC),
            mr_alen: 0,
            mr_address: [0; 8],
        };
        set_option(&socket, libc::PACKET_ADD_MEMBERSHIP, &promiscuous)
            .map_err(fail("make the interface promiscuous for"))?;
        let mtu = interface_mtu(&socket, &name).map_err(fail("read the MTU of the interface of"))?;
        Ok(PacketRing {
            rings,
            socket,
            interface: interface.into(),
            mtu,
            rx_next: 0,
            tx_next: 0,
            tx_queued: false,
        })
    }

    /// The interface's name.
    pub fn interface(&self) -> &str {
        &self.interface
    }

    /// The interface's MTU when the ring was opened: the kernel sends no frame longer than it
    /// (and its Ethernet header, and a VLAN tag), and the host sends none.
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// Slot `index` of the receive ring (`false`, below [`RX_SLOTS`]) or the transmit ring
    /// (`true`, below [`TX_SLOTS`]), which follows it in the mapping.
    fn slot(&self, tx: bool, index: usize) -> Slot<'_> {
        assert!(index < SLOTS, "slot {index} of a {SLOTS}-slot ring");
        let ring = if tx { BLOCKS * BLOCK_SIZE } else { 0 };
        let offset = ring + index / SLOTS_PER_BLOCK * BLOCK_SIZE + index % SLOTS_PER_BLOCK * SLOT_SIZE;
        Slot { start: self.rings.at(offset), size: SLOT_SIZE, _ring: std::marker::PhantomData }
    }

    /// Is a received frame waiting?
    pub fn has_received(&self) -> bool {
        self.slot(false, self.rx_next).status().load(Ordering::Acquire) & libc::TP_STATUS_USER != 0
    }

    /// Hand the next received frame, if there is one, to `take`, then give its slot back to the
    /// kernel; whether there was one.
    pub fn receive(&mut self, take: impl FnOnce(&Received<'_>)) -> bool {
        let slot = self.slot(false, self.rx_next);
        let status = slot.status().load(Ordering::Acquire);
        if status & libc::TP_STATUS_USER == 0 {
            return false;
        }
        // struct tpacket2_hdr: status, len, snaplen (u32), mac, net (u16), sec, nsec (u32),
        // vlan_tci, vlan_tpid (u16).
        let len = slot.read::<u32>(4) as usize;
        let captured = slot.read::<u32>(8) as usize;
        let mac = usize::from(slot.read::<u16>(12));
        let tci = slot.read::<u16>(24);
        let tpid = match status & libc::TP_STATUS_VLAN_TPID_VALID {
            0 => 0x8100,
            _ => slot.read::<u16>(26),
        };
        // The kernel lays the frame out inside the slot, its virtio-net header just before it;
        // checked all the same, so a bad value cannot send us out of the ring.
        if mac >= VNET_HDR_LEN + 32 && mac.saturating_add(captured) <= slot.size {
            let mut header = [0u8; VNET_HDR_LEN];
            for (i, byte) in header.iter_mut().enumerate() {
                *byte = slot.read(mac - VNET_HDR_LEN + i);
            }
            // SAFETY: `mac..mac + captured` lies in the slot (checked above), which is ours
            // (status USER) until the store below, after `take` returns; the slice's lifetime
            // ends with `take`.
            let frame = unsafe { VolatileSlice::new(slot.start.add(mac), captured) };
            let [t0, t1] = tpid.to_be_bytes();
            let [c0, c1] = tci.to_be_bytes();
            take(&Received {
                frame,
                vlan_tag: (status & libc::TP_STATUS_VLAN_VALID != 0).then_some([t0, t1, c0, c1]),
                truncated: captured < len,
                vnet_header: header,
            });
        }
        slot.status().store(libc::TP_STATUS_KERNEL, Ordering::Release);
        self.rx_next = (self.rx_next + 1) % RX_SLOTS;
        true
    }

    /// Lend the next free transmit slot's frame space ([`MAX_TX_FRAME`] bytes) to `fill`, and
    /// queue what it wrote; `false` when every slot is still waiting to be sent. Queued frames
    /// go out at the next [`PacketRing::flush`].
    pub fn transmit(&mut self, fill: impl FnOnce(&VolatileSlice<'_>) -> Fill) -> bool {
        let slot = self.slot(true, self.tx_next);
        let status = slot.status().load(Ordering::Acquire);
        // A frame the kernel refused (WRONG_FORMAT) leaves its slot to be reused.
        if status != libc::TP_STATUS_AVAILABLE && status != libc::TP_STATUS_WRONG_FORMAT {
            return false;
        }
        // SAFETY: the slot is free (the kernel is done with it) and in the mapping; the virtio-net
        // header and the frame space after its tpacket2_hdr end at the slot's end. The slice's
        // lifetime ends with `fill`.
        let (header, frame) = unsafe {
            (
                VolatileSlice::new(slot.start.add(TX_DATA), VNET_HDR_LEN),
                VolatileSlice::new(slot.start.add(TX_DATA + VNET_HDR_LEN), MAX_TX_FRAME),
            )
        };
        let (len, vnet_header) = match fill(&frame) {
            Fill::Nothing => return true,
            // No offload: a zero virtio-net header.
            Fill::Frame(len) => (len, [0; VNET_HDR_LEN]),
            Fill::Offloaded { len, vnet_header } => (len, vnet_header),
        };
        let len = len.min(MAX_TX_FRAME);
        header.write_slice(&vnet_header, 0).expect("the header fits its slot");
        slot.write::<u32>(4, small(VNET_HDR_LEN + len));
        slot.status().store(libc::TP_STATUS_SEND_REQUEST, Ordering::Release);
        self.tx_next = (self.tx_next + 1) % TX_SLOTS;
        self.tx_queued = true;
        true
    }

    /// Tell the kernel to send the frames queued since the last flush, without waiting.
    ///
    /// A frame the kernel drops on its way to the interface (a super-frame that fails its
    /// checks as it is cut into segments) fails the flush with its error, and would stay at
    /// the head of the ring, tried again at every flush, with every frame behind it waiting.
    /// It is lost instead: the frames after it go at the next flush.
    pub fn flush(&mut self) -> io::Result<()> {
        if !self.tx_queued {
            return Ok(());
        }
        // SAFETY: a zero-length send on our socket: it reads no buffer.
        let sent = unsafe { libc::send(self.socket.as_raw_fd(), std::ptr::null(), 0, libc::MSG_DONTWAIT) };
        if sent >= 0 {
            self.tx_queued = false;
            return Ok(());
        }
        let error = io::Error::last_os_error();
        if error.kind() == io::ErrorKind::WouldBlock {
            return Ok(());
        }
        self.drop_refused();
        Err(error)
    }

    /// Make the frame the kernel stopped at one it refuses as it takes it from the ring (a
    /// zero length), so that it skips it (PACKET_LOSS). The kernel sends queued slots in ring
    /// order, and runs only inside `flush`'s `send`: the oldest slot still waiting to be sent,
    /// found from the next one to fill on, is the one it stopped at.
    fn drop_refused(&mut self) {
        let waiting = (0..TX_SLOTS)
            .map(|i| self.slot(true, (self.tx_next + i) % TX_SLOTS))
            .find(|slot| slot.status().load(Ordering::Acquire) == libc::TP_STATUS_SEND_REQUEST);
        if let Some(slot) = waiting {
            slot.write::<u32>(4, 0);
        }
    }
}

/// A constant of the kernel's ABI, or a length within a slot, in the narrower type a kernel
/// structure holds it in (it always fits).
fn small<T: TryFrom<U>, U: Copy + std::fmt::Debug>(value: U) -> T {
    T::try_from(value).unwrap_or_else(|_| panic!("{value:?} does not fit its kernel field"))
}

/// One slot of a ring, borrowed from the [`PacketRing`] that maps it: its `tpacket2_hdr`
/// first, then the frame. Made only by `PacketRing::slot`, so `start` is a slot's start in the
/// live mapping (page-aligned rings, slots their ring's slot size apart) and `size` its length.
struct Slot<'a> {
    start: *mut u8,
    size: usize,
    _ring: std::marker::PhantomData<&'a PacketRing>,
}

impl Slot<'_> {
    /// The status word, shared with the kernel, which reads and writes it atomically too.
    fn status(&self) -> &AtomicU32 {
        // SAFETY: `start` is a slot's start in the mapping the borrowed ring holds (see the
        // type), so 4-aligned; `tp_status` is the header's first field.
        unsafe { AtomicU32::from_ptr(self.start.cast()) }
    }

    /// Does the slot hold an aligned `T` at byte `offset`?
    fn holds<T>(&self, offset: usize) -> bool {
        offset.is_multiple_of(std::mem::align_of::<T>()) && offset + size_of::<T>() <= self.size
    }

    /// The `T` at byte `offset` of the slot (a header field, or a byte of the frame).
    fn read<T: Copy>(&self, offset: usize) -> T {
        assert!(self.holds::<T>(offset), "a {}-byte read at {offset} of a slot", size_of::<T>());
        // SAFETY: in the slot and aligned (checked above; the slot is in the live mapping, see
        // the type). The kernel wrote it before it published the status word we loaded.
        unsafe { self.start.add(offset).cast::<T>().read_volatile() }
    }

    /// Write `value` at byte `offset` of the slot, which is ours (a free transmit slot, or one
    /// waiting to be sent, between two `send`s: the kernel reads it only inside one).
    fn write<T: Copy>(&self, offset: usize, value: T) {
        assert!(self.holds::<T>(offset), "a {}-byte write at {offset} of a slot", size_of::<T>());
        // SAFETY: in the slot and aligned (checked above); the kernel reads it only after the
        // status word says so.
        unsafe { self.start.add(offset).cast::<T>().write_volatile(value) }
    }
}

/// The MTU of interface `name` (SIOCGIFMTU, asked on `socket`).
fn interface_mtu(socket: &OwnedFd, name: &CString) -> io::Result<u32> {
    // SAFETY: an all-zero ifreq is a valid value of the plain C structure.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    let bytes = name.as_bytes_with_nul();
    if bytes.len() > request.ifr_name.len() {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    for (to, &from) in request.ifr_name.iter_mut().zip(bytes) {
        *to = from as libc::c_char;
    }
    // SAFETY: SIOCGIFMTU reads the name and writes the MTU into `request`, which outlives the call.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFMTU, &mut request) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFMTU filled in the union's `ifru_mtu`.
    let mtu = unsafe { request.ifr_ifru.ifru_mtu };
    u32::try_from(mtu).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// setsockopt(SOL_PACKET, `option`, `value`).
fn set_option<T>(socket: &OwnedFd, option: i32, value: &T) -> io::Result<()> {
    // SAFETY: `value` is a `T`, of the length given; setsockopt only reads it.
    let done = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_PACKET,
            option,
            (value as *const T).cast(),
            small(size_of::<T>()),
        )
    };
    match done {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}
