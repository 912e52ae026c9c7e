//! The socket files a server leaves on the host: made its owner's alone whatever the umask, and
//! a path is only ever replaced when it holds a stale socket of this user's. Run as root (the
//! test hands a socket to another user with chown).
//!
//! One test in this binary: it sets the process's umask, which every thread shares.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::Path;

use unix_socket::{listen, Access, ListenError};
use vhost_user::error::Error;
use vhost_user::Server;

/// The user `nobody`, who owns the socket another user left.
const NOBODY: u32 = 65534;

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

#[test]
fn sockets_are_owner_only_and_only_our_stale_sockets_are_replaced() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test chowns a socket to another user: run it as root");
    let dir = tempfile::tempdir().unwrap();
    for umask in [0o022, 0o000] {
        // SAFETY: umask only sets the process's file mode mask.
        unsafe { libc::umask(umask) };
        let socket = dir.path().join(format!("disk-{umask:o}.sock"));
        let server = Server::bind(&socket).unwrap();
        assert_eq!(mode(&socket), 0o600, "a vhost-user socket made with umask {umask:03o}");
        drop(server);
        let api = dir.path().join(format!("api-{umask:o}.sock"));
        let _listener = listen(&api, &Access::owner_only()).unwrap();
        assert_eq!(mode(&api), 0o600, "a listening socket made with umask {umask:03o}");
    }
    // SAFETY: as above.
    unsafe { libc::umask(0o022) };

    // A mode the operator names is given exactly, umask or not.
    let shared = dir.path().join("shared.sock");
    let _listener = listen(&shared, &Access::new(0o660, None, None)).unwrap();
    assert_eq!(mode(&shared), 0o660);

    // A stale socket of another user's is not ours to remove.
    let foreign = dir.path().join("foreign.sock");
    drop(UnixListener::bind(&foreign).unwrap());
    std::os::unix::fs::chown(&foreign, Some(NOBODY), Some(NOBODY)).unwrap();
    let error = Server::bind(&foreign).err().expect("another user's socket is refused");
    assert!(matches!(error, Error::Socket(ListenError::ForeignSocket { uid: NOBODY, .. })), "{error}");
    assert!(error.to_string().contains("uid 65534"), "{error}");
    assert_eq!(std::fs::symlink_metadata(&foreign).unwrap().uid(), NOBODY, "left where it was");

    // Nor a symlink (even to a stale socket of ours), a directory or a regular file.
    let stale = dir.path().join("stale.sock");
    drop(UnixListener::bind(&stale).unwrap());
    let link = dir.path().join("link.sock");
    std::os::unix::fs::symlink(&stale, &link).unwrap();
    let directory = dir.path().join("directory");
    std::fs::create_dir(&directory).unwrap();
    std::fs::set_permissions(&directory, std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, b"not a socket").unwrap();
    for (path, found) in [(&link, "a symbolic link"), (&directory, "a directory"), (&file, "a regular file")]
    {
        let error = Server::bind(path).err().unwrap_or_else(|| panic!("{} replaced", path.display()));
        assert!(matches!(error, Error::Socket(ListenError::NotASocket { .. })), "{error}");
        assert!(error.to_string().contains(found), "{error}");
        assert!(std::fs::symlink_metadata(path).is_ok(), "{} left where it was", path.display());
    }
    assert_eq!(std::fs::read(&file).unwrap(), b"not a socket");

    // A stale socket of ours is replaced, and the new one is owner-only too.
    let server = Server::bind(&stale).expect("a stale socket of ours is replaced");
    assert_eq!(mode(&stale), 0o600);
    drop(server);
    assert!(!stale.exists(), "the server removes its socket");
}
