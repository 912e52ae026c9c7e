//! Ceph RBD images through librbd, Ceph's own client.
//!
//! - [`RbdSpec`] names an image: `POOL/IMAGE`, the cluster's configuration file and the cephx
//!   user.
//! - [`client`] connects and opens it on a thread of its own, under a filter the owner gives.
//! - [`RbdDisk`] is a backend for one queue: it submits with `rbd_aio_*` and takes completions
//!   from an inbox librbd's callback fills, without a system call or a lock on the owner's side.

pub mod client;
mod disk;
mod ffi;
mod inbox;

use std::fmt;
use std::path::PathBuf;

use thiserror::Error;

pub use client::{set_up_client_threads, start_client_thread, ClientSetUp};
pub use disk::RbdDisk;

/// An RBD image and how to reach its cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdSpec {
    /// The pool that holds the image.
    pub pool: String,
    /// The image's name in the pool.
    pub image: String,
    /// The cluster's configuration file (monitors, keyring); librados' usual places
    /// ($CEPH_CONF, /etc/ceph/ceph.conf) when `None`.
    pub conf: Option<PathBuf>,
    /// The cephx user, without `client.`; `admin` when `None`.
    pub user: Option<String>,
    /// Open the image read-only; writes fail.
    pub read_only: bool,
}

impl RbdSpec {
    /// `POOL/IMAGE`: the image's pool and name, both non-empty and without `/`, `@` or `,`.
    pub fn parse_target(target: &str) -> Result<(String, String), String> {
        let valid = |part: &str| !part.is_empty() && !part.contains(['/', '@', ',']);
        match target.split_once('/') {
            Some((pool, image)) if valid(pool) && valid(image) => Ok((pool.into(), image.into())),
            _ => Err(format!("rbd={target}: give POOL/IMAGE (an image in a pool, e.g. rbd/vm1)")),
        }
    }

    /// The cephx user (`admin` unless named).
    pub fn user(&self) -> &str {
        self.user.as_deref().unwrap_or("admin")
    }
}

impl fmt::Display for RbdSpec {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "rbd:{}/{} as client.{}", self.pool, self.image, self.user())?;
        if let Some(conf) = &self.conf {
            write!(f, " (conf {})", conf.display())?;
        }
        Ok(())
    }
}

/// Why an RBD image could not be opened.
#[derive(Debug, Clone, Error)]
pub enum RbdError {
    #[error(
        "cannot load Ceph's client libraries (librbd.so.1, librados.so.2): {0} (install Debian's librbd1)"
    )]
    Library(String),
    #[error("cannot set up the RBD client thread: {0}")]
    SetUp(String),
    #[error("the RBD client thread is gone")]
    ClientThreadGone,
    #[error("the RBD {0} holds a NUL byte")]
    Nul(String),
    #[error("cannot read the Ceph configuration {}: {}", conf.display(), errno_text(*errno))]
    Conf { conf: PathBuf, errno: i32 },
    #[error("cannot set librbd's {option}: {}", errno_text(*errno))]
    Option { option: String, errno: i32 },
    #[error("cannot connect to the Ceph cluster for {spec}: {} (is the cluster up, and are its configuration, user and keyring right?)", errno_text(*errno))]
    Connect { spec: String, errno: i32 },
    #[error("cannot open pool {pool}: {} (does it exist, and may the user read it?)", errno_text(*errno))]
    Pool { pool: String, errno: i32 },
    #[error("cannot open {spec}: {} (does the image exist?)", errno_text(*errno))]
    Image { spec: String, errno: i32 },
    #[error("{spec} is {size} bytes: an image for a disk must be a non-zero multiple of 512 bytes")]
    Size { spec: String, size: u64 },
}

fn errno_text(errno: i32) -> String {
    std::io::Error::from_raw_os_error(errno).to_string()
}

#[cfg(test)]
mod tests;
