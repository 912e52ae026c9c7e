//! Why a vhost-user message or connection was refused. Every one of these closes the connection
//! it happened on (after a failure reply where the frontend asked for one); the server goes on
//! accepting new frontends.

use std::io;

use thiserror::Error;
use vhost_user_protocol::message::MAX_CONFIG_SIZE;
use virtio::block::device::CONFIG_WRITEBACK;
use virtio::ActivateError;
use virtqueue::queue::QueueError;

/// Why a message was refused or a connection (or the server) failed.
#[derive(Debug, Error)]
#[allow(missing_docs)] // Each variant's message says what it is.
pub enum Error {
    // The wire: the socket, and messages that are malformed or ask for what was not offered.
    #[error(transparent)]
    Protocol(#[from] vhost_user_protocol::Error),

    // The memory table.
    #[error("memory region {0} has size 0")]
    EmptyRegion(usize),
    #[error("memory region {0} wraps around the end of an address space or its file offset")]
    RegionOverflow(usize),
    #[error("memory regions {0} and {1} overlap (in guest-physical or frontend address space)")]
    RegionsOverlap(usize, usize),
    #[error("memory region {0}: mmap offset {1:#x} is not a multiple of the page size")]
    UnalignedOffset(usize, u64),
    #[error("memory region {index}: {why}")]
    BadRegionFd { index: usize, why: String },
    #[error("memory region {index}: cannot map it: {why}")]
    Map { index: usize, why: String },
    #[error("more than {0} memory regions mapped at once in this process")]
    TooManyMappedRegions(usize),

    // The in-flight tracking region.
    #[error("in-flight region for {num_queues} queues: this device has 1 to {max}")]
    BadInflightQueues { num_queues: u16, max: usize },
    #[error("in-flight region with queue size {queue_size}: give 1 to {max}")]
    BadInflightQueueSize { queue_size: u16, max: u16 },
    #[error("in-flight region: {0}")]
    BadInflightRegion(String),
    #[error("in-flight region: {what} failed: {source}")]
    Inflight { what: &'static str, source: io::Error },
    #[error("{0} before VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD was negotiated")]
    InflightNotNegotiated(&'static str),

    // The dirty log (live migration).
    #[error("dirty log (SET_LOG_BASE): {0}")]
    BadLog(String),
    #[error("dirty log: {what} failed: {source}")]
    Log { what: &'static str, source: io::Error },
    #[error("{0} before VHOST_USER_PROTOCOL_F_LOG_SHMFD was negotiated")]
    LogNotNegotiated(&'static str),
    #[error(
        "the dirty log covers guest-physical addresses below {covers:#x}, but guest memory reaches {needed:#x}"
    )]
    LogTooSmall { covers: u64, needed: u64 },
    #[error("SET_LOG_FD: the descriptor is not an eventfd (it is {found})")]
    LogFdNotEventFd { found: String },

    // Rings.
    #[error("vring index {index}: this device has {queues} queues")]
    BadVringIndex { index: u64, queues: usize },
    #[error("vring {index}: size {size} is not a power of two in 1..={max}")]
    BadRingSize { index: usize, size: u32, max: u16 },
    #[error("vring {index}: base {base} is not a 16-bit ring index (split rings only)")]
    BadRingBase { index: usize, base: u32 },
    #[error("vring {0}: cannot change a running ring; stop it with GET_VRING_BASE first")]
    RingRunning(usize),
    #[error("vring {index}: SET_VRING_ENABLE with {value}: expected 0 or 1")]
    BadEnable { index: usize, value: u32 },
    #[error("vring {index}: the {what} ring at frontend address {addr:#x} is not inside one memory region")]
    Unmapped { index: usize, what: &'static str, addr: u64 },
    #[error("vring {index}: {source}")]
    BadQueue { index: usize, source: QueueError },
    #[error("vring {index}: flags {flags:#x} has bits besides VHOST_VRING_F_LOG (0)")]
    BadVringFlags { index: usize, flags: u32 },
    #[error("vring {index}: cannot start it: {source}")]
    Start { index: usize, source: ActivateError },
    #[error("vring {0}: the IOCore did not hand its worker back; the queue's backend is lost")]
    Detach(usize),
    #[error("the NIC's port: {0}")]
    Switch(#[source] switch::SwitchError),
    #[error("cannot create an eventfd or duplicate the frontend's: {0}")]
    EventFd(#[source] io::Error),
    #[error("vring {index}: the {what} descriptor is not an eventfd (it is {found})")]
    NotAnEventFd { index: usize, what: &'static str, found: String },
    #[error(
        "the frontend shrank a memory file it shared (an access raised SIGBUS): the region now reads as zeros and the rings were told through their error eventfds"
    )]
    MemoryShrank,
    #[error("the frontend did not finish setting up (negotiate features) within {0} s of connecting")]
    SetupTimeout(u64),

    // Negotiation.
    #[error("features {requested:#x} include bits not offered ({offered:#x})")]
    FeaturesNotOffered { requested: u64, offered: u64 },
    #[error("protocol features {requested:#x} include bits not offered ({offered:#x})")]
    ProtocolFeaturesNotOffered { requested: u64, offered: u64 },
    #[error(
        "GET_CONFIG of {size} bytes at offset {offset}: the configuration space is {MAX_CONFIG_SIZE} bytes"
    )]
    ConfigRange { offset: u32, size: u32 },

    // Configuration writes (SET_CONFIG).
    #[error("SET_CONFIG before VHOST_USER_PROTOCOL_F_CONFIG was negotiated")]
    ConfigNotNegotiated,
    #[error("SET_CONFIG: this disk does not offer VIRTIO_BLK_F_CONFIG_WCE (it is read-only): nothing in its configuration space is writable")]
    NoWritebackSwitch,
    #[error("SET_CONFIG of {size} bytes at offset {offset}: only the 1-byte writeback field at offset {CONFIG_WRITEBACK} is writable")]
    ConfigNotWritable { offset: u32, size: usize },
    #[error("SET_CONFIG with flags {0}: only 0, a driver's write, is taken (not live migration's 1)")]
    ConfigWriteFlags(u32),
    #[error("SET_CONFIG of writeback {0}: expected 0 (write through) or 1 (write back)")]
    BadWriteback(u8),

    // A NIC's MTU (NET_SET_MTU).
    #[error("NET_SET_MTU before VHOST_USER_PROTOCOL_F_NET_MTU was negotiated")]
    MtuNotNegotiated,
    #[error("NET_SET_MTU of {asked}: this NIC takes frames of an MTU of {mtu} at most (its mtu=); give the guest at most that")]
    MtuTooLarge { asked: u64, mtu: u16 },
    #[error("SEND_RARP before VHOST_USER_PROTOCOL_F_RARP was negotiated")]
    RarpNotNegotiated,

    // The server.
    #[error(transparent)]
    Socket(#[from] unix_socket::ListenError),
    #[error("cannot listen on {path}: {source}")]
    Listen { path: String, source: io::Error },
    #[error("the socket handed over for {path} is not listening there (it is {found})")]
    NotTheSocket { path: String, found: String },
}
