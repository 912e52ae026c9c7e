//! The command-line vocabulary the `exitless` binary and its benchmarks share: byte sizes,
//! `--disk` and `--net` specs, I/O modes (the VMM's and the vhost-user daemons'), `--seccomp`,
//! and how `exitless` reports an error and exits.

#![deny(missing_docs)]

pub mod disk;
mod io_mode;
pub mod net;
mod seccomp;
pub mod size;
mod vhost_io;

pub use io_mode::IoModeArg;
pub use seccomp::{SeccompArg, SeccompArgs};
pub use vhost_io::{VhostIoArgs, VhostIoMode};

/// Exit statuses of `exitless` itself (a guest's debug-exit value passes through unchanged).
pub mod status {
    /// The command line was wrong.
    pub const USAGE: i32 = 2;
    /// The guest shut down, triple-faulted, reset or crashed.
    pub const GUEST_STOPPED: i32 = 123;
    /// `--timeout` passed.
    pub const TIMEOUT: i32 = 124;
    /// exitless itself failed.
    pub const FAILED: i32 = 125;
}

/// Report a mistake on the command line on one line and return the usage status.
pub fn usage_error(message: impl std::fmt::Display) -> i32 {
    eprintln!("exitless: {message} (see `exitless --help`)");
    status::USAGE
}

/// Report an error on one line and return the failure status.
pub fn fail(message: impl std::fmt::Display) -> i32 {
    eprintln!("exitless: error: {message}");
    status::FAILED
}

/// A value that is not a positive number of seconds below 10^9.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a positive number of seconds")]
pub struct SecondsError(String);

/// A positive number of seconds (`--timeout`, `--idle-exit-s`), below 10^9.
pub fn parse_seconds(text: &str) -> Result<f64, SecondsError> {
    match text.parse::<f64>() {
        Ok(s) if s > 0.0 && s.is_finite() && s < 1e9 => Ok(s),
        _ => Err(SecondsError(text.into())),
    }
}
