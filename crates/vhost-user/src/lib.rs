//! vhost-user for exitless: the virtio-blk device model and the IOCore served to guests of
//! other VMMs (QEMU, Cloud Hypervisor, ...) over the vhost-user protocol.
//!
//! The frontend (the other VMM) shares its guest's memory as file descriptors, tells us where
//! each virtqueue lies and hands us a kick and a call eventfd per queue; from then on requests
//! flow guest ring → IOCore → storage backend → IOCore → guest ring exactly as for exitless's
//! own virtio-mmio device, through the same `BlockWorker`. Only set-up goes over the socket.
//!
//! The wire format (messages, their checks, framing) is the `vhost-user-protocol` crate's, which
//! the VMM's frontend shares.
//!
//! - [`memory`]: the memory table, mapped as one `GuestMemoryMmap`.
//! - [`fault`]: a frontend that shrinks its shared memory costs it its connection, not the
//!   daemon its life (SIGBUS handling).
//! - [`inflight`]: the shared region in which rings mark the requests they hold, so that a
//!   restarted daemon resubmits them (VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD).
//! - [`log`]: the dirty log a live migration shares (VHOST_F_LOG_ALL), in which rings mark
//!   every guest page they write while logging is on.
//! - [`device`]: what a session serves, a virtio device model across connections; [`block`]:
//!   the block device; [`net`]: a NIC, one port of a switch.
//! - [`backend`]: the per-connection state machine.
//! - [`handover`]: an upgrade without a hang-up: a daemon hands its sockets, connected
//!   frontends and sessions to its successor, which rebuilds each session by replaying it;
//!   [`upgrade`]: each daemon's side of it (`--handover-socket`), whatever its devices are.
//! - [`server`]: one disk's listening socket, one frontend at a time (others are refused), each
//!   with a set-up time limit. A daemon serving many disks runs a server per disk on a thread of
//!   its own; their rings share the IOCores (`WorkerHost`), which take at most
//!   [`block::FAIR_BATCH`] requests per ring per pass and hold each disk to its token buckets.

#![deny(missing_docs)]
#![cfg_attr(not(test), warn(clippy::cast_possible_truncation, clippy::cast_sign_loss))]

pub mod backend;
pub mod block;
pub mod device;
pub mod error;
pub mod fault;
pub mod handover;
pub mod inflight;
pub mod log;
pub mod memory;
pub mod net;
pub mod server;
mod shm;
pub mod upgrade;

pub use backend::Session;
pub use block::VhostUserBlk;
pub use device::{Device, Ring};
pub use error::Error;
pub use net::VhostUserNet;
pub use server::{Ending, Server};
