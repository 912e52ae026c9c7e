//! Why a vhost-user message was refused or the socket failed. The backend closes the connection
//! on any of these (after a failure reply where the frontend asked for one).

use std::io;

use thiserror::Error;

use crate::message::{MAX_CONFIG_SIZE, MAX_FDS, MAX_PAYLOAD, MAX_REGIONS};

/// Why a message was refused or could not be sent or received.
#[derive(Debug, Error)]
#[allow(missing_docs)] // Each variant's message says what it is.
pub enum Error {
    // The socket.
    #[error("cannot read from the frontend: {0}")]
    Read(#[source] io::Error),
    #[error("cannot send to the frontend: {0}")]
    Write(#[source] io::Error),
    #[error("the frontend closed the connection in the middle of a message")]
    Truncated,
    #[error("the frontend sent part of a message, then nothing for {0} s")]
    Stalled(u64),
    #[error("the frontend did not read its replies for {0} s")]
    ReplyStalled(u64),
    #[error("the daemon is stopping")]
    Stopping,
    #[error("more than {MAX_FDS} file descriptors in one message")]
    TooManyFds,

    // The message.
    #[error("header flags {0:#x}: expected protocol version 1, no reply bit and no reserved bits")]
    BadFlags(u32),
    #[error("unknown request code {0} (is the peer a vhost-user frontend?)")]
    UnknownRequest(u32),
    #[error("{0} is not supported: its feature was not offered")]
    Unsupported(&'static str),
    #[error("payload of {0} bytes is longer than any request's ({MAX_PAYLOAD}, or the channel's own limit)")]
    TooLarge(u32),
    #[error("{request}: payload of {got} bytes, expected {expected}")]
    BadSize { request: &'static str, got: usize, expected: usize },
    #[error("{request}: {got} file descriptors, expected {expected}")]
    BadFdCount { request: &'static str, got: usize, expected: usize },
    #[error("{request}: {value:#x} has bits besides the vring index (0-7) and the no-fd flag (8)")]
    BadVringFile { request: &'static str, value: u64 },
    #[error("memory table with {0} regions: give 1 to {MAX_REGIONS}")]
    RegionCount(u32),
    #[error(
        "{request} of {size} bytes at offset {offset}: the configuration space is {MAX_CONFIG_SIZE} bytes"
    )]
    ConfigRange { request: &'static str, offset: u32, size: u32 },
}
