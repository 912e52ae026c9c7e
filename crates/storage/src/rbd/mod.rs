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
    /// librbd or librados could not be loaded (the loader's message); every later open fails
    /// the same way.
    #[error(
        "cannot load Ceph's client libraries (librbd.so.1, librados.so.2): {0} (install Debian's librbd1)"
    )]
    Library(String),
    /// The client thread's set-up (`set_up_client_threads`: its CPUs, its seccomp filter)
    /// failed, with this reason; every later open fails the same way.
    #[error("cannot set up the RBD client thread: {0}")]
    SetUp(String),
    /// The RBD client thread could not be started or has ended.
    #[error("the RBD client thread is gone")]
    ClientThreadGone,
    /// A setting of the spec (named: pool, image, id, conf...) cannot be passed to C.
    #[error("the RBD {0} holds a NUL byte")]
    Nul(String),
    /// librados could not read the configuration file.
    #[error("cannot read the Ceph configuration {}: {}", conf.display(), errno_text(*errno))]
    Conf {
        /// The file given, or the default /etc/ceph/ceph.conf.
        conf: PathBuf,
        /// librados' errno.
        errno: i32,
    },
    /// librados refused a setting exitless forces.
    #[error("cannot set librbd's {option}: {}", errno_text(*errno))]
    Option {
        /// The setting's name.
        option: String,
        /// librados' errno.
        errno: i32,
    },
    /// The client could not be made, or could not reach the cluster or log in.
    #[error("cannot connect to the Ceph cluster for {spec}: {} (is the cluster up, and are its configuration, user and keyring right?)", errno_text(*errno))]
    Connect {
        /// The disk, as `rbd:POOL/IMAGE as client.USER`.
        spec: String,
        /// librados' errno.
        errno: i32,
    },
    /// The pool could not be opened.
    #[error("cannot open pool {pool}: {} (does it exist, and may the user read it?)", errno_text(*errno))]
    Pool {
        /// The pool's name.
        pool: String,
        /// librados' errno.
        errno: i32,
    },
    /// The image could not be opened or sized.
    #[error("cannot open {spec}: {} (does the image exist?)", errno_text(*errno))]
    Image {
        /// The disk, as `rbd:POOL/IMAGE as client.USER`.
        spec: String,
        /// librbd's errno.
        errno: i32,
    },
    /// The image's size is not a whole number of sectors (or is 0).
    #[error("{spec} is {size} bytes: an image for a disk must be a non-zero multiple of 512 bytes")]
    Size {
        /// The disk, as `rbd:POOL/IMAGE as client.USER`.
        spec: String,
        /// The image's size, in bytes.
        size: u64,
    },
}

fn errno_text(errno: i32) -> String {
    std::io::Error::from_raw_os_error(errno).to_string()
}

#[cfg(test)]
mod tests;
