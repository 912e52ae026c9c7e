//! Who is at the other end of a Unix socket the VMM connected to or accepted (SO_PEERCRED),
//! checked before the VMM sends or reads a byte: a migration peer, a vhost-user daemon.

/// The uid of the process at the other end of `stream` (SO_PEERCRED: as it was when it
/// connected, or when it listened, for the side that connected).
pub(crate) fn peer_uid(stream: &std::os::unix::net::UnixStream) -> std::io::Result<u32> {
    unix_socket::peer_credentials(stream).map(|cred| cred.uid)
}

/// This process's effective uid: by default the only user, besides root, a peer may be.
pub(crate) fn own_uid() -> u32 {
    // SAFETY: geteuid has no arguments and cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether a peer running as `peer` is trusted by default by a VMM running as `own`: the same
/// user, or root.
pub(crate) fn trusted_peer(peer: u32, own: u32) -> bool {
    peer == own || peer == 0
}
