//! Why the daemon could not start or serve: each says what failed, for one line on standard
//! error.

use std::io;
use std::path::PathBuf;

use api_http::server::ServerError;
use iocore::IoCoreError;
use sandbox::SandboxError;
use thiserror::Error;
use unix_socket::ListenError;
use vhost_user::upgrade::TakeOverError;

use crate::api_dirs::DiskDirError;
use crate::disks::DiskError;

/// Why the daemon did not run, or stopped.
#[derive(Debug, Error)]
pub enum Error {
    /// The command line cannot be served: a usage error, as clap's are.
    #[error(transparent)]
    Usage(#[from] UsageError),
    /// The daemon could not start, or failed while serving.
    #[error(transparent)]
    Failed(#[from] DaemonError),
}

/// A command line whose disks and sockets do not match.
#[derive(Debug, Error)]
#[allow(missing_docs)] // Each variant's message says what it is.
pub enum UsageError {
    #[error("several --disk without socket=: give each its own socket=PATH")]
    SeveralUnnamed,
    #[error("a --disk without socket=PATH needs --socket PATH")]
    UnnamedWithoutDefault,
    #[error("--socket is given but no --disk is without its own socket=")]
    DefaultUnused,
    #[error("two disks on one socket {}: give each its own", .0.display())]
    SameSocket(PathBuf),
}

/// Why the daemon could not start, or stopped serving.
#[derive(Debug, Error)]
#[allow(missing_docs)] // Each variant's message says what it is.
pub enum DaemonError {
    #[error("cannot set up SIGINT/SIGTERM handling: {0}")]
    Signals(io::Error),
    #[error("cannot start the stop watchdog: {0}")]
    Watchdog(io::Error),
    #[error(transparent)]
    Seccomp(#[from] SandboxError),
    #[error(transparent)]
    IoCore(#[from] IoCoreError),
    #[error(transparent)]
    ApiDiskDir(#[from] DiskDirError),
    #[error(transparent)]
    Disk(#[from] DiskError),
    #[error("--handover-socket: {0}")]
    HandoverSocket(ListenError),
    #[error(transparent)]
    TakeOver(#[from] TakeOverError),
    #[error("--api-socket: {0}")]
    Api(#[from] ServerError),
}
