//! The vhost-user wire format (front-end to back-end requests, as QEMU 7.2 sends them).
//!
//! A message is a 12-byte header {request u32, flags u32, size u32} (native endian, which on
//! the hosts vhost-user runs on is little endian), `size` payload bytes and, attached to it as
//! SCM_RIGHTS ancillary data, the file descriptors some requests carry. Everything here is
//! untrusted input: a payload must have exactly the size its request has, a request must carry
//! exactly the descriptors it needs, unknown request codes and requests for features this
//! backend does not offer are refused. Received descriptors are owned (`OwnedFd`) from the
//! moment they arrive, so a refused message leaks none; at most [`MAX_FDS`] come with one
//! message, and a message with more (or with a truncated control message) is refused, the
//! extra descriptors closed.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use crate::error::Error;
use crate::poll::first_ready;

/// The header's length on the wire: request code, flags and payload size, a u32 each.
pub const HEADER_LEN: usize = 12;
/// Protocol version in flags bits 0-1.
pub const VERSION: u32 = 1;
const VERSION_MASK: u32 = 3;
/// Set in replies.
pub const FLAG_REPLY: u32 = 1 << 2;
/// The frontend wants an acknowledgement (with VHOST_USER_PROTOCOL_F_REPLY_ACK).
pub const FLAG_NEED_REPLY: u32 = 1 << 3;
/// The most descriptors one message carries (QEMU's VHOST_MEMORY_BASELINE_NREGIONS).
pub const MAX_FDS: usize = 8;
/// The most memory regions in SET_MEM_TABLE (one descriptor each).
pub const MAX_REGIONS: usize = 8;
/// The largest configuration space GET_CONFIG may ask for (QEMU's VHOST_USER_MAX_CONFIG_SIZE).
pub const MAX_CONFIG_SIZE: u32 = 256;
/// The longest payload of any request: GET_CONFIG's or SET_CONFIG's 12-byte header and data.
pub const MAX_PAYLOAD: usize = 12 + MAX_CONFIG_SIZE as usize;
/// In SET_VRING_KICK/CALL/ERR: no descriptor comes with the message.
pub const VRING_NOFD: u64 = 1 << 8;
/// In SET_VRING_KICK/CALL/ERR: the bits that hold the vring index.
pub const VRING_INDEX_MASK: u64 = 0xff;
/// VHOST_VRING_F_LOG in SET_VRING_ADDR's flags.
pub const VRING_F_LOG: u32 = 1;
/// One memory region on the wire: guest_phys_addr, memory_size, userspace_addr, mmap_offset.
const REGION_LEN: usize = 32;

/// Request codes (vhost-user specification, "Front-end message types").
pub mod code {
    /// Get the virtio features the backend offers (a u64 reply), plus
    /// VHOST_USER_F_PROTOCOL_FEATURES.
    pub const GET_FEATURES: u32 = 1;
    /// Set the virtio features the frontend acked: a subset of GET_FEATURES' reply.
    pub const SET_FEATURES: u32 = 2;
    /// Sent when a connection is established: the sender owns the session. No payload.
    pub const SET_OWNER: u32 = 3;
    /// Obsolete ("no longer used" in the specification, which recommends that backends ignore it or
    /// disable every ring, not discard the connection's state); current QEMU never sends it.
    pub const RESET_OWNER: u32 = 4;
    /// Share the guest's memory: a region table and one descriptor per region.
    pub const SET_MEM_TABLE: u32 = 5;
    /// Share the dirty-page log for live migration (VHOST_F_LOG_ALL).
    pub const SET_LOG_BASE: u32 = 6;
    /// Give an eventfd through which the backend may tell the frontend it modified the dirty log.
    pub const SET_LOG_FD: u32 = 7;
    /// Set a ring's size (number of descriptors).
    pub const SET_VRING_NUM: u32 = 8;
    /// Set a ring's descriptor, used and available ring addresses, in the frontend's address space.
    pub const SET_VRING_ADDR: u32 = 9;
    /// Set the available index from which a ring resumes.
    pub const SET_VRING_BASE: u32 = 10;
    /// Stop a ring and get the available index where it stopped.
    pub const GET_VRING_BASE: u32 = 11;
    /// Give a ring's kick eventfd (the frontend signals new buffers); receiving it starts the ring.
    pub const SET_VRING_KICK: u32 = 12;
    /// Give a ring's call eventfd (the backend signals used buffers: the guest interrupt).
    pub const SET_VRING_CALL: u32 = 13;
    /// Give a ring's error eventfd (the backend signals that the ring failed).
    pub const SET_VRING_ERR: u32 = 14;
    /// Get the protocol features the backend offers (with VHOST_USER_F_PROTOCOL_FEATURES).
    pub const GET_PROTOCOL_FEATURES: u32 = 15;
    /// Set the protocol features the frontend uses: a subset of GET_PROTOCOL_FEATURES' reply.
    pub const SET_PROTOCOL_FEATURES: u32 = 16;
    /// Get the most queues the backend supports (with VHOST_USER_PROTOCOL_F_MQ).
    pub const GET_QUEUE_NUM: u32 = 17;
    /// Enable (1) or disable (0) a ring (with VHOST_USER_F_PROTOCOL_FEATURES).
    pub const SET_VRING_ENABLE: u32 = 18;
    /// Ask a net backend to announce the guest's MAC after migration (VHOST_USER_PROTOCOL_F_RARP).
    pub const SEND_RARP: u32 = 19;
    /// Tell a net backend the MTU the guest uses (VHOST_USER_PROTOCOL_F_MTU).
    pub const NET_SET_MTU: u32 = 20;
    /// Give a socket on which the backend sends requests of its own
    /// (VHOST_USER_PROTOCOL_F_BACKEND_REQ).
    pub const SET_BACKEND_REQ_FD: u32 = 21;
    /// Update or invalidate an IOTLB entry, for a guest behind a vIOMMU (VIRTIO_F_IOMMU_PLATFORM).
    pub const IOTLB_MSG: u32 = 22;
    /// Set a legacy ring's endianness (VHOST_USER_PROTOCOL_F_CROSS_ENDIAN).
    pub const SET_VRING_ENDIAN: u32 = 23;
    /// Read part of the device's configuration space (VHOST_USER_PROTOCOL_F_CONFIG).
    pub const GET_CONFIG: u32 = 24;
    /// Write part of the device's configuration space (VHOST_USER_PROTOCOL_F_CONFIG).
    pub const SET_CONFIG: u32 = 25;
    /// Create a virtio-crypto session (VHOST_USER_PROTOCOL_F_CRYPTO_SESSION).
    pub const CREATE_CRYPTO_SESSION: u32 = 26;
    /// Close a virtio-crypto session (VHOST_USER_PROTOCOL_F_CRYPTO_SESSION).
    pub const CLOSE_CRYPTO_SESSION: u32 = 27;
    /// Prepare for postcopy migration: the backend returns a userfaultfd
    /// (VHOST_USER_PROTOCOL_F_PAGEFAULT).
    pub const POSTCOPY_ADVISE: u32 = 28;
    /// Postcopy migration: the backend starts handling faults on the guest memory.
    pub const POSTCOPY_LISTEN: u32 = 29;
    /// Postcopy migration finished: the backend stops handling faults.
    pub const POSTCOPY_END: u32 = 30;
    /// Get shared memory where the backend tracks in-flight requests, to resubmit them after it
    /// reconnects (VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD).
    pub const GET_INFLIGHT_FD: u32 = 31;
    /// Give back the in-flight tracking memory to a reconnected backend
    /// (VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD).
    pub const SET_INFLIGHT_FD: u32 = 32;
    /// Give a vhost-user-gpu backend its socket to the frontend's display.
    pub const GPU_SET_SOCKET: u32 = 33;
    /// Disable every ring and return the device to its initial state; the frontend stays its
    /// owner (VHOST_USER_PROTOCOL_F_RESET_DEVICE).
    pub const RESET_DEVICE: u32 = 34;
    /// Kick a ring in-band, over the socket, instead of through an eventfd
    /// (VHOST_USER_PROTOCOL_F_INBAND_NOTIFICATIONS).
    pub const VRING_KICK: u32 = 35;
    /// Get how many memory regions the backend accepts through ADD_MEM_REG
    /// (VHOST_USER_PROTOCOL_F_CONFIGURE_MEM_SLOTS).
    pub const GET_MAX_MEM_SLOTS: u32 = 36;
    /// Add one memory region, with its descriptor (VHOST_USER_PROTOCOL_F_CONFIGURE_MEM_SLOTS).
    pub const ADD_MEM_REG: u32 = 37;
    /// Remove one memory region (VHOST_USER_PROTOCOL_F_CONFIGURE_MEM_SLOTS).
    pub const REM_MEM_REG: u32 = 38;
    /// Set the virtio device status byte (VHOST_USER_PROTOCOL_F_STATUS).
    pub const SET_STATUS: u32 = 39;
    /// Get the virtio device status byte (VHOST_USER_PROTOCOL_F_STATUS).
    pub const GET_STATUS: u32 = 40;
}

/// The request's name, for messages; `None` for a code the specification does not define.
pub fn request_name(request: u32) -> Option<&'static str> {
    const NAMES: [&str; 40] = [
        "GET_FEATURES",
        "SET_FEATURES",
        "SET_OWNER",
        "RESET_OWNER",
        "SET_MEM_TABLE",
        "SET_LOG_BASE",
        "SET_LOG_FD",
        "SET_VRING_NUM",
        "SET_VRING_ADDR",
        "SET_VRING_BASE",
        "GET_VRING_BASE",
        "SET_VRING_KICK",
        "SET_VRING_CALL",
        "SET_VRING_ERR",
        "GET_PROTOCOL_FEATURES",
        "SET_PROTOCOL_FEATURES",
        "GET_QUEUE_NUM",
        "SET_VRING_ENABLE",
        "SEND_RARP",
        "NET_SET_MTU",
        "SET_BACKEND_REQ_FD",
        "IOTLB_MSG",
        "SET_VRING_ENDIAN",
        "GET_CONFIG",
        "SET_CONFIG",
        "CREATE_CRYPTO_SESSION",
        "CLOSE_CRYPTO_SESSION",
        "POSTCOPY_ADVISE",
        "POSTCOPY_LISTEN",
        "POSTCOPY_END",
        "GET_INFLIGHT_FD",
        "SET_INFLIGHT_FD",
        "GPU_SET_SOCKET",
        "RESET_DEVICE",
        "VRING_KICK",
        "GET_MAX_MEM_SLOTS",
        "ADD_MEM_REG",
        "REM_MEM_REG",
        "SET_STATUS",
        "GET_STATUS",
    ];
    let index = usize::try_from(request).ok()?.checked_sub(1)?;
    NAMES.get(index).copied()
}

/// A message's header, the same for requests and replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The request code (one of [`code`]); a reply carries the code of the request it answers.
    pub request: u32,
    /// The protocol version in bits 0-1 ([`VERSION`]), [`FLAG_REPLY`] and [`FLAG_NEED_REPLY`];
    /// the other bits are reserved and must be zero.
    pub flags: u32,
    /// How many payload bytes follow the header.
    pub size: u32,
}

impl Header {
    /// The header as it goes on the wire.
    pub fn to_bytes(self) -> [u8; HEADER_LEN] {
        let mut bytes = [0u8; HEADER_LEN];
        bytes[0..4].copy_from_slice(&self.request.to_le_bytes());
        bytes[4..8].copy_from_slice(&self.flags.to_le_bytes());
        bytes[8..12].copy_from_slice(&self.size.to_le_bytes());
        bytes
    }

    /// Read a header off the wire; any 12 bytes make one, [`Message::parse`] checks it.
    pub fn from_bytes(bytes: &[u8; HEADER_LEN]) -> Header {
        Header { request: u32_at(bytes, 0), flags: u32_at(bytes, 4), size: u32_at(bytes, 8) }
    }
}

/// One region of the frontend's memory table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryRegion {
    /// Where the region starts in the guest's physical address space.
    pub guest_phys_addr: u64,
    /// The region's length in bytes.
    pub memory_size: u64,
    /// Where the frontend has it mapped: ring addresses are given in this address space.
    pub userspace_addr: u64,
    /// Where the region starts in the file its descriptor refers to.
    pub mmap_offset: u64,
}

impl MemoryRegion {
    /// The region as SET_MEM_TABLE carries it: its four fields as little-endian u64s, in order.
    pub fn to_bytes(self) -> [u8; REGION_LEN] {
        let mut bytes = [0u8; REGION_LEN];
        for (i, v) in [self.guest_phys_addr, self.memory_size, self.userspace_addr, self.mmap_offset]
            .into_iter()
            .enumerate()
        {
            bytes[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes());
        }
        bytes
    }
}

/// SET_VRING_ADDR's payload: the rings in the frontend's address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VringAddr {
    /// Which vring.
    pub index: u32,
    /// Bit 0 is [`VRING_F_LOG`] (log writes to the used ring at `log`); no other bit is defined.
    pub flags: u32,
    /// The descriptor table's address.
    pub desc: u64,
    /// The used ring's address.
    pub used: u64,
    /// The available ring's address.
    pub avail: u64,
    /// With [`VRING_F_LOG`]: the used ring's guest-physical address (unlike the three ring
    /// addresses above), so that writes to it can be marked in the dirty-page log.
    pub log: u64,
}

/// GET_INFLIGHT_FD's and SET_INFLIGHT_FD's payload (QEMU's `VhostUserInflight`: two u64s and
/// two u16s, padded to 24 bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InflightInfo {
    /// The region's length in bytes (0 in GET_INFLIGHT_FD's request).
    pub mmap_size: u64,
    /// Where the region starts in its file (0 in GET_INFLIGHT_FD's request).
    pub mmap_offset: u64,
    /// How many queues the region tracks.
    pub num_queues: u16,
    /// Each queue's size: the number of descriptor entries per queue in the region.
    pub queue_size: u16,
}

/// The length of [`InflightInfo`] on the wire.
pub const INFLIGHT_INFO_LEN: usize = 24;

impl InflightInfo {
    /// The payload as it goes on the wire: mmap_size, mmap_offset, num_queues, queue_size,
    /// then 4 bytes of padding.
    pub fn to_bytes(self) -> [u8; INFLIGHT_INFO_LEN] {
        let mut bytes = [0u8; INFLIGHT_INFO_LEN];
        bytes[0..8].copy_from_slice(&self.mmap_size.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.mmap_offset.to_le_bytes());
        bytes[16..18].copy_from_slice(&self.num_queues.to_le_bytes());
        bytes[18..20].copy_from_slice(&self.queue_size.to_le_bytes());
        bytes
    }

    fn from_payload(payload: &[u8]) -> InflightInfo {
        let u16_at = |at: usize| u16::from_le_bytes([payload[at], payload[at + 1]]);
        InflightInfo {
            mmap_size: u64_at(payload, 0),
            mmap_offset: u64_at(payload, 8),
            num_queues: u16_at(16),
            queue_size: u16_at(18),
        }
    }
}

impl VringAddr {
    /// The payload as it goes on the wire: index, flags, then desc, used, avail and log.
    pub fn to_bytes(self) -> [u8; 40] {
        let mut bytes = [0u8; 40];
        bytes[0..4].copy_from_slice(&self.index.to_le_bytes());
        bytes[4..8].copy_from_slice(&self.flags.to_le_bytes());
        for (i, v) in [self.desc, self.used, self.avail, self.log].into_iter().enumerate() {
            bytes[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        bytes
    }
}

/// A request, parsed and checked for shape (not yet for meaning: that is the backend's job).
#[derive(Debug)]
pub enum Request {
    /// GET_FEATURES: reply with the virtio features offered.
    GetFeatures,
    /// SET_FEATURES: the virtio features the frontend acked.
    SetFeatures(u64),
    /// NET_SET_MTU: the MTU a net device's guest was given (with
    /// VHOST_USER_PROTOCOL_F_NET_MTU).
    NetSetMtu(u64),
    /// SEND_RARP: announce the guest's address, the payload's first 6 bytes, after a live
    /// migration (with VHOST_USER_PROTOCOL_F_RARP).
    SendRarp([u8; 6]),
    /// SET_OWNER: the frontend takes the backend for this connection.
    SetOwner,
    /// RESET_OWNER: deprecated; see [`code::RESET_OWNER`].
    ResetOwner,
    /// SET_LOG_BASE: the dirty log for a live migration, with the descriptor of the memory file
    /// it lies in (VHOST_USER_PROTOCOL_F_LOG_SHMFD).
    SetLogBase {
        /// How many bytes of the file the log takes.
        mmap_size: u64,
        /// Where in the file it starts.
        mmap_offset: u64,
        /// The log's memory file.
        fd: OwnedFd,
    },
    /// SET_LOG_FD: an eventfd the backend may signal after it wrote the log.
    SetLogFd(OwnedFd),
    /// SET_MEM_TABLE: the guest's memory, each region with the descriptor of the file it lies
    /// in (1 to [`MAX_REGIONS`] of them).
    SetMemTable(Vec<(MemoryRegion, OwnedFd)>),
    /// SET_VRING_NUM: a ring's size.
    SetVringNum {
        /// Which vring.
        index: u32,
        /// Its number of descriptors.
        num: u32,
    },
    /// SET_VRING_ADDR: where a ring's parts lie.
    SetVringAddr(VringAddr),
    /// SET_VRING_BASE: where a ring resumes.
    SetVringBase {
        /// Which vring.
        index: u32,
        /// The next available ring index to serve (for split rings; packed rings put a wrap
        /// counter in bit 15, which this backend does not offer).
        num: u32,
    },
    /// GET_VRING_BASE: stop a ring and reply with its state (index and next available index).
    GetVringBase {
        /// Which vring.
        index: u32,
    },
    /// SET_VRING_KICK: the eventfd the frontend signals when it made buffers available.
    /// `fd: None` with VRING_NOFD (the frontend will not notify through a descriptor).
    SetVringKick {
        /// Which vring (bits 0-7 of the payload).
        index: u64,
        /// The kick eventfd; `None`: the ring must be polled.
        fd: Option<OwnedFd>,
    },
    /// SET_VRING_CALL: the eventfd the backend signals when it used buffers.
    SetVringCall {
        /// Which vring (bits 0-7 of the payload).
        index: u64,
        /// The call eventfd, or `None` for VRING_NOFD: the frontend polls the used ring instead.
        fd: Option<OwnedFd>,
    },
    /// SET_VRING_ERR: the eventfd the backend signals when the ring fails.
    SetVringErr {
        /// Which vring (bits 0-7 of the payload).
        index: u64,
        /// The error eventfd, or `None` for VRING_NOFD: errors go unreported.
        fd: Option<OwnedFd>,
    },
    /// GET_PROTOCOL_FEATURES: reply with the protocol features offered.
    GetProtocolFeatures,
    /// SET_PROTOCOL_FEATURES: the protocol features the frontend uses.
    SetProtocolFeatures(u64),
    /// GET_QUEUE_NUM: reply with the number of queues.
    GetQueueNum,
    /// SET_VRING_ENABLE: enable or disable a ring.
    SetVringEnable {
        /// Which vring.
        index: u32,
        /// 1 to enable it, 0 to disable it (anything else is refused by the backend).
        num: u32,
    },
    /// GET_CONFIG: reply with part of the device's configuration space.
    GetConfig {
        /// The first byte to read in the configuration space.
        offset: u32,
        /// How many bytes to read (at most [`MAX_CONFIG_SIZE`]).
        size: u32,
        /// What the access is for (0: writable fields, 1: live migration); it matters to
        /// SET_CONFIG, and is only echoed in GET_CONFIG's reply.
        flags: u32,
    },
    /// SET_CONFIG: write part of the device's configuration space (checked by the backend:
    /// for a block device, only the `writeback` byte).
    SetConfig {
        /// The first byte to write in the configuration space.
        offset: u32,
        /// What the access is for: 0 (VHOST_SET_CONFIG_TYPE_FRONTEND, "MASTER" in QEMU 7.2)
        /// for a driver's write, 1 for live migration.
        flags: u32,
        /// The bytes to write (at most [`MAX_CONFIG_SIZE`]).
        data: Vec<u8>,
    },
    /// GET_INFLIGHT_FD: allocate the shared memory that tracks in-flight requests for
    /// `num_queues` queues of `queue_size` and reply with it (VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD).
    GetInflightFd(InflightInfo),
    /// SET_INFLIGHT_FD: the in-flight tracking memory, handed back (also to a new backend
    /// after a reconnection), with the descriptor of the file it lies in.
    SetInflightFd(InflightInfo, OwnedFd),
}

/// Does request `code` have a reply of its own? REPLY_ACK's acknowledgement is only for those
/// that do not: a frontend reads what follows one of these as the request's own reply.
pub fn has_own_reply(code: u32) -> bool {
    matches!(
        code,
        code::GET_FEATURES
            | code::GET_VRING_BASE
            | code::GET_PROTOCOL_FEATURES
            | code::GET_QUEUE_NUM
            | code::GET_CONFIG
            | code::GET_INFLIGHT_FD
            | code::SET_LOG_BASE
    )
}

/// A request with the header it came in.
#[derive(Debug)]
pub struct Message {
    /// The header, as received.
    pub header: Header,
    /// The parsed payload and descriptors.
    pub request: Request,
}

impl Message {
    /// Check a received message's shape and parse it.
    pub fn parse(header: Header, payload: &[u8], mut fds: Vec<OwnedFd>) -> Result<Message, Error> {
        if header.flags & VERSION_MASK != VERSION || header.flags & !(VERSION_MASK | FLAG_NEED_REPLY) != 0 {
            return Err(Error::BadFlags(header.flags));
        }
        let name = request_name(header.request).ok_or(Error::UnknownRequest(header.request))?;
        if payload.len() != header.size as usize {
            return Err(Error::BadSize { request: name, got: payload.len(), expected: header.size as usize });
        }
        let size = |expected: usize| {
            if payload.len() == expected {
                Ok(())
            } else {
                Err(Error::BadSize { request: name, got: payload.len(), expected })
            }
        };
        let fd_count = |fds: &Vec<OwnedFd>, expected: usize| {
            if fds.len() == expected {
                Ok(())
            } else {
                Err(Error::BadFdCount { request: name, got: fds.len(), expected })
            }
        };
        use code::*;
        // Requests with a fixed payload and no descriptors.
        let fixed = match header.request {
            GET_FEATURES | SET_OWNER | RESET_OWNER | GET_PROTOCOL_FEATURES | GET_QUEUE_NUM => Some(0),
            SET_FEATURES | SET_PROTOCOL_FEATURES | NET_SET_MTU | SEND_RARP => Some(8),
            SET_VRING_NUM | SET_VRING_BASE | GET_VRING_BASE | SET_VRING_ENABLE => Some(8),
            SET_VRING_ADDR => Some(40),
            GET_INFLIGHT_FD => Some(INFLIGHT_INFO_LEN),
            _ => None,
        };
        if let Some(expected) = fixed {
            size(expected)?;
            fd_count(&fds, 0)?;
        }
        let state = || (u32_at(payload, 0), u32_at(payload, 4));
        let request = match header.request {
            GET_FEATURES => Request::GetFeatures,
            SET_FEATURES => Request::SetFeatures(u64_at(payload, 0)),
            SET_OWNER => Request::SetOwner,
            RESET_OWNER => Request::ResetOwner,
            GET_PROTOCOL_FEATURES => Request::GetProtocolFeatures,
            SET_PROTOCOL_FEATURES => Request::SetProtocolFeatures(u64_at(payload, 0)),
            GET_QUEUE_NUM => Request::GetQueueNum,
            NET_SET_MTU => Request::NetSetMtu(u64_at(payload, 0)),
            SEND_RARP => {
                let mut mac = [0u8; 6];
                mac.copy_from_slice(&payload[..6]);
                Request::SendRarp(mac)
            }
            SET_VRING_NUM => {
                let (index, num) = state();
                Request::SetVringNum { index, num }
            }
            SET_VRING_BASE => {
                let (index, num) = state();
                Request::SetVringBase { index, num }
            }
            GET_VRING_BASE => Request::GetVringBase { index: state().0 },
            SET_VRING_ENABLE => {
                let (index, num) = state();
                Request::SetVringEnable { index, num }
            }
            SET_VRING_ADDR => Request::SetVringAddr(VringAddr {
                index: u32_at(payload, 0),
                flags: u32_at(payload, 4),
                desc: u64_at(payload, 8),
                used: u64_at(payload, 16),
                avail: u64_at(payload, 24),
                log: u64_at(payload, 32),
            }),
            SET_VRING_KICK | SET_VRING_CALL | SET_VRING_ERR => {
                size(8)?;
                let value = u64_at(payload, 0);
                if value & !(VRING_INDEX_MASK | VRING_NOFD) != 0 {
                    return Err(Error::BadVringFile { request: name, value });
                }
                let with_fd = value & VRING_NOFD == 0;
                fd_count(&fds, with_fd as usize)?;
                let index = value & VRING_INDEX_MASK;
                let fd = fds.pop();
                match header.request {
                    SET_VRING_KICK => Request::SetVringKick { index, fd },
                    SET_VRING_CALL => Request::SetVringCall { index, fd },
                    _ => Request::SetVringErr { index, fd },
                }
            }
            SET_MEM_TABLE => {
                if payload.len() < 8 {
                    return Err(Error::BadSize { request: name, got: payload.len(), expected: 8 });
                }
                // {nregions u32, padding u32, regions[nregions]}
                let count = u32_at(payload, 0);
                if count == 0 || count as usize > MAX_REGIONS {
                    return Err(Error::RegionCount(count));
                }
                let count = count as usize;
                size(8 + REGION_LEN * count)?;
                fd_count(&fds, count)?;
                let regions = (0..count).map(|i| {
                    let at = 8 + REGION_LEN * i;
                    MemoryRegion {
                        guest_phys_addr: u64_at(payload, at),
                        memory_size: u64_at(payload, at + 8),
                        userspace_addr: u64_at(payload, at + 16),
                        mmap_offset: u64_at(payload, at + 24),
                    }
                });
                Request::SetMemTable(regions.zip(fds).collect())
            }
            GET_CONFIG | SET_CONFIG => {
                // {offset u32, size u32, flags u32, data[size]}: GET_CONFIG's frontend sends
                // the data area too (zeros), so both payloads are exactly 12 + size.
                if payload.len() < 12 {
                    return Err(Error::BadSize { request: name, got: payload.len(), expected: 12 });
                }
                fd_count(&fds, 0)?;
                let (offset, config_size, flags) =
                    (u32_at(payload, 0), u32_at(payload, 4), u32_at(payload, 8));
                if config_size > MAX_CONFIG_SIZE {
                    return Err(Error::ConfigRange { request: name, offset, size: config_size });
                }
                size(12 + config_size as usize)?;
                if header.request == GET_CONFIG {
                    Request::GetConfig { offset, size: config_size, flags }
                } else {
                    Request::SetConfig { offset, flags, data: payload[12..].to_vec() }
                }
            }
            GET_INFLIGHT_FD => Request::GetInflightFd(InflightInfo::from_payload(payload)),
            SET_LOG_BASE => {
                // {mmap_size u64, mmap_offset u64}, and the log's descriptor.
                size(16)?;
                fd_count(&fds, 1)?;
                let fd = fds.pop().ok_or(Error::BadFdCount { request: name, got: 0, expected: 1 })?;
                Request::SetLogBase { mmap_size: u64_at(payload, 0), mmap_offset: u64_at(payload, 8), fd }
            }
            SET_LOG_FD => {
                size(0)?;
                fd_count(&fds, 1)?;
                let fd = fds.pop().ok_or(Error::BadFdCount { request: name, got: 0, expected: 1 })?;
                Request::SetLogFd(fd)
            }
            SET_INFLIGHT_FD => {
                size(INFLIGHT_INFO_LEN)?;
                fd_count(&fds, 1)?;
                let info = InflightInfo::from_payload(payload);
                let fd = fds.pop().ok_or(Error::BadFdCount { request: name, got: 0, expected: 1 })?;
                Request::SetInflightFd(info, fd)
            }
            // Known requests for features this backend does not offer (IOTLB,
            // backend requests, cross-endian, crypto, postcopy, GPU,
            // reset, in-band kicks, memory slots, status).
            _ => return Err(Error::Unsupported(name)),
        };
        Ok(Message { header, request })
    }
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

/// A received message before parsing: header, payload, descriptors.
pub type RawMessage = (Header, Vec<u8>, Vec<OwnedFd>);

/// One end of a vhost-user connection: messages with their descriptors (SCM_RIGHTS, through
/// vmm-sys-util's `ScmSocket`), where the peer may pause inside a message for at most `stall`
/// and, if a stop descriptor is given, every wait also ends when it becomes readable. Works on
/// blocking and non-blocking sockets alike.
pub struct Wire<'a> {
    stream: &'a UnixStream,
    stall: Duration,
    stop: Option<BorrowedFd<'a>>,
    /// How long `recv` waits for a message to begin; `None`: no limit.
    idle: Option<Duration>,
    /// The longest payload `recv` takes.
    max_payload: usize,
}

impl<'a> Wire<'a> {
    /// Talk on `stream`, allowing the peer `stall` per pause inside a message, with no stop
    /// descriptor and no limit on the wait for a message to begin.
    pub fn new(stream: &'a UnixStream, stall: Duration) -> Wire<'a> {
        Wire { stream, stall, stop: None, idle: None, max_payload: MAX_PAYLOAD }
    }

    /// Give up any wait, with [`Error::Stopping`], once `stop` is readable.
    pub fn with_stop(self, stop: Option<BorrowedFd<'a>>) -> Wire<'a> {
        Wire { stop, ..self }
    }

    /// Give up waiting for a message to begin after `idle` (a read error, "timed out").
    pub fn with_idle_limit(self, idle: Duration) -> Wire<'a> {
        Wire { idle: Some(idle), ..self }
    }

    /// Take payloads of up to `max` bytes instead of [`MAX_PAYLOAD`] (for a channel that
    /// carries messages of its own besides vhost-user's, such as a daemon's hand-over).
    pub fn with_max_payload(self, max: usize) -> Wire<'a> {
        Wire { max_payload: max, ..self }
    }

    /// Receive one message's parts: header, payload and descriptors. `Ok(None)` when the peer
    /// closed the connection between messages.
    pub fn recv(&self) -> Result<Option<RawMessage>, Error> {
        let mut fds = Vec::new();
        let mut header = [0u8; HEADER_LEN];
        let first = loop {
            if !self.wait(libc::POLLIN, self.idle)? {
                return Err(Error::Read(std::io::ErrorKind::TimedOut.into()));
            }
            match self.recv_some(&mut header, &mut fds)? {
                Some(0) => return Ok(None),
                Some(n) => break n,
                None => continue,
            }
        };
        self.recv_exact(&mut header, first, &mut fds)?;
        let header = Header::from_bytes(&header);
        if header.size as usize > self.max_payload {
            return Err(Error::TooLarge(header.size));
        }
        let mut payload = vec![0u8; header.size as usize];
        self.recv_exact(&mut payload, 0, &mut fds)?;
        Ok(Some((header, payload, fds)))
    }

    /// Send a message: header, payload and (attached to its first byte) descriptors.
    pub fn send(&self, header: Header, payload: &[u8], fds: &[RawFd]) -> Result<(), Error> {
        if fds.len() > MAX_FDS {
            return Err(Error::TooManyFds);
        }
        let mut bytes = Vec::with_capacity(HEADER_LEN + payload.len());
        bytes.extend_from_slice(&header.to_bytes());
        bytes.extend_from_slice(payload);
        let mut sent = 0;
        while sent < bytes.len() {
            let fds = if sent == 0 { fds } else { &[] };
            match self.stream.send_with_fds(&[&bytes[sent..]], fds) {
                Ok(n) => sent += n,
                Err(e) if e.errno() == libc::EINTR => {}
                Err(e) if e.errno() == libc::EAGAIN => {
                    if !self.wait(libc::POLLOUT, Some(self.stall))? {
                        return Err(Error::ReplyStalled(self.stall.as_secs()));
                    }
                }
                Err(e) => return Err(Error::Write(e.into())),
            }
        }
        Ok(())
    }

    /// Reply to `request` with `payload`.
    pub fn reply(&self, request: u32, payload: &[u8]) -> Result<(), Error> {
        self.reply_with_fds(request, payload, &[])
    }

    /// Reply to `request` with `payload` and descriptors (GET_INFLIGHT_FD's region).
    pub fn reply_with_fds(&self, request: u32, payload: &[u8], fds: &[RawFd]) -> Result<(), Error> {
        // Replies are a few bytes or the configuration space, far below u32::MAX.
        let size = u32::try_from(payload.len())
            .map_err(|_| Error::Write(std::io::ErrorKind::InvalidInput.into()))?;
        let header = Header { request, flags: VERSION | FLAG_REPLY, size };
        self.send(header, payload, fds)
    }

    /// Wait for `events` on the socket (a hang-up counts); `false` when `limit` passed first.
    fn wait(&self, events: i16, limit: Option<Duration>) -> Result<bool, Error> {
        let socket = (self.stream.as_fd(), events);
        let ready = match self.stop {
            // The stop descriptor first: a peer that keeps the socket busy cannot delay it.
            Some(stop) => first_ready(&[(stop, libc::POLLIN), socket], limit).map(|r| r.map(|i| i == 1)),
            None => first_ready(&[socket], limit).map(|r| r.map(|_| true)),
        };
        match ready {
            Ok(Some(true)) => Ok(true),
            Ok(Some(false)) => Err(Error::Stopping),
            Ok(None) => Ok(false),
            Err(e) if events == libc::POLLOUT => Err(Error::Write(e)),
            Err(e) => Err(Error::Read(e)),
        }
    }

    /// One `recvmsg` into `buf`, adding received descriptors to `fds` (at most MAX_FDS in a
    /// message: more, or a truncated control message, is an error, and the descriptors that
    /// came with it are closed). `Some(0)` at end of file, `None` if nothing was there yet.
    fn recv_some(&self, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> Result<Option<usize>, Error> {
        let mut raw = [-1 as RawFd; MAX_FDS];
        let room = MAX_FDS - fds.len();
        let mut iov = [libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() }];
        loop {
            // SAFETY: the iovec points at `buf`, writable for its whole length and borrowed for
            // the call; any bytes may be written there.
            let received = unsafe { self.stream.recv_with_fds(&mut iov, &mut raw[..room]) };
            match received {
                Ok((n, count)) => {
                    for &fd in &raw[..count] {
                        // SAFETY: `recv_with_fds` hands over `count` descriptors that are now
                        // this process's and nobody else's.
                        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                        // SAFETY: F_SETFD on a descriptor we own. The daemon runs nothing, but
                        // nothing of a frontend's should survive an exec either.
                        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
                        fds.push(fd);
                    }
                    return Ok(Some(n));
                }
                Err(e) if e.errno() == libc::EINTR => {}
                Err(e) if e.errno() == libc::EAGAIN => return Ok(None),
                // ScmSocket's answer to a truncated control message (it closed what came).
                Err(e) if e.errno() == libc::ENOBUFS => return Err(Error::TooManyFds),
                Err(e) => return Err(Error::Read(e.into())),
            }
        }
    }

    /// Fill `buf` completely; the first `filled` bytes are there already. Once a message has
    /// begun, the rest must come within `stall` each time.
    fn recv_exact(&self, buf: &mut [u8], mut filled: usize, fds: &mut Vec<OwnedFd>) -> Result<(), Error> {
        while filled < buf.len() {
            if !self.wait(libc::POLLIN, Some(self.stall))? {
                return Err(Error::Stalled(self.stall.as_secs()));
            }
            match self.recv_some(&mut buf[filled..], fds)? {
                Some(0) => return Err(Error::Truncated),
                Some(n) => filled += n,
                None => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(request: u32, flags: u32, payload: &[u8], fds: usize) -> Result<Message, Error> {
        let fds = (0..fds)
            .map(|_| {
                let event = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
                // SAFETY: `into_raw_fd` hands over the open descriptor the EventFd owned.
                unsafe { OwnedFd::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(event)) }
            })
            .collect::<Vec<_>>();
        Message::parse(Header { request, flags, size: payload.len() as u32 }, payload, fds)
    }

    #[test]
    fn sizes_flags_codes_and_descriptor_counts_are_checked() {
        use code::*;
        assert!(matches!(parse(GET_FEATURES, 1, &[], 0), Ok(Message { request: Request::GetFeatures, .. })));
        assert!(parse(GET_FEATURES, 1 | FLAG_NEED_REPLY, &[], 0).is_ok());
        assert!(matches!(parse(GET_FEATURES, 1, &[0; 8], 0), Err(Error::BadSize { .. })));
        assert!(matches!(parse(GET_FEATURES, 1, &[], 1), Err(Error::BadFdCount { .. })));
        assert!(matches!(parse(GET_FEATURES, 2, &[], 0), Err(Error::BadFlags(2))));
        assert!(matches!(parse(GET_FEATURES, 1 | FLAG_REPLY, &[], 0), Err(Error::BadFlags(_))));
        assert!(matches!(parse(GET_FEATURES, 1 | 1 << 9, &[], 0), Err(Error::BadFlags(_))));
        assert!(matches!(parse(SET_FEATURES, 1, &[0; 4], 0), Err(Error::BadSize { .. })));
        assert!(matches!(parse(SET_VRING_ADDR, 1, &[0; 32], 0), Err(Error::BadSize { .. })));
        assert!(matches!(parse(0, 1, &[], 0), Err(Error::UnknownRequest(0))));
        assert!(matches!(parse(41, 1, &[], 0), Err(Error::UnknownRequest(41))));
        assert!(matches!(parse(u32::MAX, 1, &[], 0), Err(Error::UnknownRequest(_))));
        assert!(matches!(
            parse(SET_LOG_BASE, 1, &[0; 16], 1),
            Ok(Message { request: Request::SetLogBase { .. }, .. })
        ));
        assert!(matches!(parse(SET_LOG_BASE, 1, &[0; 16], 0), Err(Error::BadFdCount { .. })));
        assert!(matches!(parse(SET_LOG_BASE, 1, &[0; 8], 1), Err(Error::BadSize { .. })));
        assert!(matches!(parse(SET_LOG_FD, 1, &[], 1), Ok(Message { request: Request::SetLogFd(_), .. })));
        assert!(matches!(parse(SET_LOG_FD, 1, &[], 2), Err(Error::BadFdCount { .. })));
        assert!(matches!(parse(SET_LOG_FD, 1, &[0; 8], 1), Err(Error::BadSize { .. })));
        assert!(matches!(parse(IOTLB_MSG, 1, &[], 0), Err(Error::Unsupported("IOTLB_MSG"))));
        // Kick with and without a descriptor.
        let kick = |value: u64, fds| parse(SET_VRING_KICK, 1, &value.to_le_bytes(), fds);
        assert!(matches!(
            kick(0, 1),
            Ok(Message { request: Request::SetVringKick { index: 0, fd: Some(_) }, .. })
        ));
        assert!(matches!(
            kick(VRING_NOFD | 1, 0),
            Ok(Message { request: Request::SetVringKick { fd: None, .. }, .. })
        ));
        assert!(matches!(kick(0, 0), Err(Error::BadFdCount { .. })));
        assert!(matches!(kick(VRING_NOFD, 1), Err(Error::BadFdCount { .. })));
        assert!(matches!(kick(1 << 20, 1), Err(Error::BadVringFile { .. })));
        // Memory tables.
        let region =
            MemoryRegion { guest_phys_addr: 0, memory_size: 4096, userspace_addr: 0, mmap_offset: 0 };
        let table = |n: u32, regions: usize| {
            let mut payload = vec![];
            payload.extend_from_slice(&n.to_le_bytes());
            payload.extend_from_slice(&[0; 4]);
            for _ in 0..regions {
                payload.extend_from_slice(&region.to_bytes());
            }
            payload
        };
        assert!(parse(SET_MEM_TABLE, 1, &table(1, 1), 1).is_ok());
        assert!(matches!(parse(SET_MEM_TABLE, 1, &table(1, 1), 0), Err(Error::BadFdCount { .. })));
        assert!(matches!(parse(SET_MEM_TABLE, 1, &table(2, 1), 2), Err(Error::BadSize { .. })));
        assert!(matches!(parse(SET_MEM_TABLE, 1, &table(0, 0), 0), Err(Error::RegionCount(0))));
        assert!(matches!(parse(SET_MEM_TABLE, 1, &table(9, 9), 8), Err(Error::RegionCount(9))));
        assert!(matches!(parse(SET_MEM_TABLE, 1, &[1, 0, 0], 0), Err(Error::BadSize { .. })));
        // Config reads.
        let config = |offset: u32, size: u32, data: usize| {
            let mut payload = vec![];
            for v in [offset, size, 0] {
                payload.extend_from_slice(&v.to_le_bytes());
            }
            payload.resize(12 + data, 0);
            parse(GET_CONFIG, 1, &payload, 0)
        };
        assert!(config(0, 60, 60).is_ok());
        assert!(matches!(config(0, 60, 59), Err(Error::BadSize { .. })));
        assert!(matches!(config(0, 257, 257), Err(Error::ConfigRange { .. })));
        // Config writes: the same shape, the data kept for the backend to check.
        let write = |size: u32, data: &[u8]| {
            let mut payload = vec![];
            for v in [32, size, 0] {
                payload.extend_from_slice(&v.to_le_bytes());
            }
            payload.extend_from_slice(data);
            parse(SET_CONFIG, 1, &payload, 0)
        };
        assert!(matches!(
            write(1, &[0]),
            Ok(Message { request: Request::SetConfig { offset: 32, flags: 0, ref data }, .. }) if data == &[0]
        ));
        assert!(matches!(write(1, &[]), Err(Error::BadSize { .. })));
        assert!(matches!(write(1, &[0, 0]), Err(Error::BadSize { .. })));
        assert!(matches!(write(300, &[0; 300]), Err(Error::ConfigRange { .. })));
        assert!(matches!(parse(SET_CONFIG, 1, &[0; 8], 0), Err(Error::BadSize { .. })));
    }

    #[test]
    fn more_descriptors_than_a_message_may_carry_are_refused_and_closed() {
        let (frontend, backend) = UnixStream::pair().unwrap();
        let mut ends = [0 as RawFd; 2];
        // SAFETY: pipe2 fills two descriptors, which we then own.
        let (read_end, write_end) = unsafe {
            assert_eq!(libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC), 0);
            (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1]))
        };
        let header = Header { request: code::SET_VRING_CALL, flags: VERSION, size: 8 }.to_bytes();
        let message = [&header[..], &[0u8; 8][..]].concat();
        // 12 copies of the pipe's read end, in one message.
        frontend.send_with_fds(&[&message[..]], &[read_end.as_raw_fd(); MAX_FDS + 4]).unwrap();
        let received = Wire::new(&backend, Duration::from_secs(1)).recv();
        assert!(matches!(received, Err(Error::TooManyFds)), "{received:?}");
        // Every copy that reached us was closed: with ours gone, the pipe has no reader left.
        drop(read_end);
        // SAFETY: writes one byte from a live buffer to a descriptor we own.
        let written = unsafe { libc::write(write_end.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
        assert_eq!(written, -1);
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EPIPE));
    }

    #[test]
    fn every_defined_code_has_a_name() {
        for request in 1..=40 {
            assert!(request_name(request).is_some());
        }
        assert_eq!(request_name(code::GET_STATUS), Some("GET_STATUS"));
        assert_eq!(request_name(0), None);
        assert_eq!(request_name(41), None);
    }
}
