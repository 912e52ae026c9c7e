//! A transport's state in a snapshot: the registers the driver programmed, each queue's set-up
//! and where the device is in its ring, and the device's configuration space. Taken while the
//! transport is paused (its worker drained, so no request is held), and checked on restore as
//! untrusted input.

use serde::{Deserialize, Serialize};
use thiserror::Error;
use virtqueue::queue::QueueError;

/// Bytes of configuration space saved (virtio-blk's is 60, virtio-net's 10).
pub const CONFIG_SAVED: usize = 64;

/// One queue of a transport in a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueState {
    /// Number of descriptors the driver chose.
    pub size: u16,
    /// The driver set QueueReady.
    pub ready: bool,
    /// Guest address of the descriptor table.
    pub desc: u64,
    /// Guest address of the avail ring.
    pub avail: u64,
    /// Guest address of the used ring.
    pub used: u64,
    /// The avail index of the next request the device takes. With the worker drained every
    /// request taken was returned, so this is also the used ring's index in guest memory.
    pub next_avail: u16,
}

/// A virtio-mmio transport in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransportState {
    /// The device's virtio ID (2 block, 1 network): checked against the device restored into.
    pub device_id: u32,
    /// The Status register (without DEVICE_NEEDS_RESET, which `needs_reset` holds).
    pub status: u32,
    /// DEVICE_NEEDS_RESET was set (the driver broke a queue and has not reset the device yet).
    pub needs_reset: bool,
    /// DeviceFeaturesSel.
    pub device_features_sel: u32,
    /// DriverFeaturesSel.
    pub driver_features_sel: u32,
    /// The features the driver accepted.
    pub driver_features: u64,
    /// QueueSel.
    pub queue_sel: u32,
    /// InterruptStatus: interrupts raised and not yet acknowledged.
    pub interrupt_status: u32,
    /// Each queue, in order.
    pub queues: Vec<QueueState>,
    /// The first `CONFIG_SAVED` bytes of configuration space, in hexadecimal.
    pub config: String,
}

/// Why a transport could not be paused, saved or restored.
#[allow(missing_docs)] // The messages say what each is.
#[derive(Debug, Error)]
pub enum StateError {
    #[error("the device still has {0} requests in flight after {1:?}: its backend does not complete them")]
    DrainTimeout(usize, std::time::Duration),
    #[error("the transport is not paused: its worker may still take requests")]
    NotPaused,
    #[error("the I/O thread did not give the device's worker back")]
    WorkerLost,
    #[error("the snapshot is of device type {saved}, this device is type {here}")]
    DeviceType { saved: u32, here: u32 },
    #[error("the snapshot has {saved} queues, the device has {here}")]
    QueueCount { saved: usize, here: usize },
    #[error("queue {queue}: size {size} is larger than the device's {max}")]
    QueueSize { queue: usize, size: u16, max: u16 },
    #[error("queue {0} was not made ready, yet the snapshot says the device took requests from it")]
    QueueNotReady(usize),
    #[error("queue {queue}: {source}")]
    Queue { queue: usize, source: QueueError },
    #[error("queue {queue}: the snapshot says the device took {saved} requests but the used ring in guest memory says {in_memory}")]
    UsedIndex { queue: usize, saved: u16, in_memory: u16 },
    #[error("configuration space: {0}")]
    Config(String),
    #[error("configuration space byte {offset} is {here:#x} here but {saved:#x} in the snapshot (did the disk change size or features?)")]
    ConfigDiffers { offset: usize, saved: u8, here: u8 },
    #[error("the driver's features {features:#x} include some the device does not offer ({offered:#x})")]
    Features { features: u64, offered: u64 },
    #[error("the device refused to start from the snapshot")]
    Activate,
    #[error("its data path cannot log the guest pages it writes (a live migration needs that)")]
    NoDirtyLog,
}

/// Lower-case hexadecimal of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        text.push(DIGITS[(b >> 4) as usize] as char);
        text.push(DIGITS[(b & 15) as usize] as char);
    }
    text
}

/// The bytes of hexadecimal `text`.
pub fn unhex(text: &str) -> Result<Vec<u8>, String> {
    if !text.len().is_multiple_of(2) {
        return Err("an odd number of hex digits".into());
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        b'A'..=b'F' => Ok(c - b'A' + 10),
        _ => Err(format!("{:?} is not a hex digit", c as char)),
    };
    text.as_bytes().chunks_exact(2).map(|pair| Ok(digit(pair[0])? << 4 | digit(pair[1])?)).collect()
}
