//! Live migration between two exitless processes: pre-copy of guest memory while the guest runs
//! (KVM's dirty log for what the vCPUs write, the VMM's own [`DirtyBitmap`] for what the
//! devices' workers write through the host mapping, which KVM does not see), then a short
//! stop-and-copy: the VM paused (devices drained, vCPUs parked), the last dirty pages and the
//! state a snapshot holds sent, and the destination resumes the guest.
//!
//! The source's sending runs on a thread of its own ([`Sender`], `ThreadKind::Migration`),
//! started before the VMM's main thread confines itself; the main thread switches the devices'
//! logging, pauses the VM and reads its state. The destination receives on its main thread
//! before the VM runs ([`receive`]). The stream is untrusted input there ([`wire`]).

mod control;
mod receive;
mod send;
pub mod wire;

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

pub use receive::{receive, Received};
pub(crate) use send::Sender;
pub use virtio::dirty::DirtyBitmap;

use crate::snapshot::SnapshotError;

/// Why a live migration failed; the source goes on running.
#[derive(Debug, Error)]
pub enum MigrationError {
    #[error("the migration URL {0:?} is not unix:/PATH (the only kind exitless takes)")]
    Url(String),
    #[error("cannot {what} {path}: {source}")]
    Socket { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("the connection broke while {what}: {source}")]
    Io { what: &'static str, source: std::io::Error },
    #[error("bad migration stream: {0}")]
    Stream(String),
    #[error("the destination refused: {0}")]
    Refused(String),
    #[error("KVM refused to {what}: {source}")]
    Kvm { what: &'static str, source: kvm_ioctls::Error },
    #[error("{0}")]
    Snapshot(#[from] SnapshotError),
    #[error("cannot migrate this VM: {0}")]
    Unsupported(String),
    #[error("the migration thread is gone (its filter could not be installed, or it panicked)")]
    ThreadGone,
    #[error("the VM ended during the migration")]
    VmEnded,
}

/// How a live migration went, as the source saw it.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct MigrationReport {
    /// From the request to the destination's word that it resumed the guest.
    pub total_ms: f64,
    /// From the source's pause to the destination's word that it resumed the guest.
    pub downtime_ms: f64,
    /// Of the downtime, the pause: the devices drained (the requests in flight finish), the
    /// vCPUs parked.
    pub pause_ms: f64,
    /// Pre-copy rounds while the guest ran (the first, of all memory, included).
    pub rounds: usize,
    /// Pages sent in each pre-copy round, then in the stop-and-copy.
    pub pages_per_round: Vec<u64>,
    /// Pages sent in the stop-and-copy.
    pub final_pages: u64,
    /// Pages the devices' workers marked dirty (KVM's log does not see their writes).
    pub device_dirty_pages: u64,
    /// Pages KVM's dirty log reported.
    pub kvm_dirty_pages: u64,
    /// Guest memory and state bytes sent.
    pub bytes: u64,
    /// The size of the state sent after the pause.
    pub state_bytes: u64,
}

/// The socket of a `unix:/PATH` URL (Cloud Hypervisor's `destination_url` and `receiver_url`).
pub fn socket_from_url(url: &str) -> Result<PathBuf, MigrationError> {
    match url.strip_prefix("unix:") {
        Some(path) if path.starts_with('/') && !path.contains('\0') => Ok(PathBuf::from(path)),
        _ => Err(MigrationError::Url(url.to_string())),
    }
}

/// How long either side waits for the other to send or take a message before giving up.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(30);
