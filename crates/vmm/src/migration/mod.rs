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
mod transport;
mod url;
pub mod wire;

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

pub use receive::{receive, Received};
pub(crate) use send::Sender;
pub use transport::{MigrationTls, CA_FILE, CERT_FILE, HANDSHAKE_TIMEOUT, KEY_FILE};
pub use url::{MigrationUrl, URL_FORMS};
pub use virtqueue::dirty::DirtyBitmap;

use crate::snapshot::SnapshotError;

/// Why a live migration failed; the source goes on running.
#[derive(Debug, Error)]
#[allow(missing_docs)] // Each variant's message says what it is.
pub enum MigrationError {
    #[error("the migration URL {0:?} is none of {forms}", forms = url::URL_FORMS)]
    Url(String),
    #[error("cannot {what} {path}: {source}")]
    Socket { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("cannot {what} {addr}: {source}")]
    Tcp { what: &'static str, addr: std::net::SocketAddr, source: std::io::Error },
    #[error(
        "{url} is a TCP migration, which is mutual TLS: start this exitless with --migration-tls-dir \
         DIR (ca.pem, cert.pem, key.pem); to send or take the VM unencrypted and unauthenticated, \
         name it tcp+plain: instead"
    )]
    NeedsTls { url: String },
    #[error("cannot use {path} for migration TLS: {reason}")]
    TlsFiles { path: PathBuf, reason: String },
    #[error("TLS with {peer} refused; nothing of the VM was sent: {reason}")]
    Tls { peer: std::net::SocketAddr, reason: String },
    #[error(
        "refused to migrate to {path}: the process listening there runs as uid {peer}, not as this \
         process's uid {own} or root (did another user bind that path first?); nothing was sent"
    )]
    UntrustedPeer { path: PathBuf, peer: u32, own: u32 },
    #[error(
        "cannot listen on {path}: it exists (a stale socket or another user's file); remove it or \
         name another path"
    )]
    PathTaken { path: PathBuf },
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
    /// Of the downtime, sending the last dirty pages and the state (from the state handed to
    /// the sending thread to the last byte written to the connection).
    pub final_send_ms: f64,
    /// Of the downtime, waiting for the destination to take the state and say it resumed the
    /// guest (after the last byte was written).
    pub destination_ms: f64,
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

/// Listen on `path` with a socket file of mode 0600 from the first moment it is reachable:
/// bound in a new 0700 directory beside `path` (whatever the umask, no other user can reach it
/// there), made 0600, then renamed into place without replacing anything already at `path`.
pub(crate) fn listen_private(
    path: &std::path::Path,
) -> Result<std::os::unix::net::UnixListener, MigrationError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let socket = |what| {
        let path = path.to_path_buf();
        move |source| MigrationError::Socket { what, path, source }
    };
    let parent = path.parent().unwrap_or(std::path::Path::new("/"));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let private = parent.join(format!(".{name}.{}.binding", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .map_err(socket("make a private directory beside"))?;
    let inner = private.join("socket");
    let bound =
        std::os::unix::net::UnixListener::bind(&inner).map_err(socket("listen on")).and_then(|listener| {
            std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o600))
                .map_err(socket("set mode 0600 on"))?;
            rename_no_replace(&inner, path).map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => MigrationError::PathTaken { path: path.to_path_buf() },
                _ => socket("move the socket to")(e),
            })?;
            Ok(listener)
        });
    let _ = std::fs::remove_file(&inner);
    let _ = std::fs::remove_dir(&private);
    bound
}

/// rename(2) that fails with EEXIST rather than replace what is at `to`.
fn rename_no_replace(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &std::path::Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
    };
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: both paths are NUL-terminated strings that live across the call.
    let done = unsafe {
        libc::renameat2(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::RENAME_NOREPLACE)
    };
    if done != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// How long either side waits for the other to send or take a message before giving up.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(30);
