//! The vhost-user protocol as exitless speaks it, on both ends: the daemon's backend
//! (`vhost-user`) and the VMM's frontend (`vmm`'s `vhost_user_blk`) share it.
//!
//! Wire format only: no device model, no guest memory mapping, no I/O beyond the socket.
//!
//! - [`message`]: request codes, the header and the message bodies, with strict validation of
//!   what a frontend sends (`Message::parse` accepts the requests exitless's backend serves and
//!   refuses the others, known or not), and [`message::Wire`], the framing of messages and their
//!   file descriptors (SCM_RIGHTS) over the Unix socket, with time limits.
//! - [`features`]: the vhost-user feature bit and the protocol feature bits.
//! - [`error`]: why a message was refused or the socket failed.
//! - [`poll`]: waiting on a few descriptors at once, with a time limit.

#![deny(missing_docs)]
#![cfg_attr(not(test), warn(clippy::cast_possible_truncation, clippy::cast_sign_loss))]

pub mod error;
pub mod features;
pub mod message;
pub mod poll;

pub use error::Error;
