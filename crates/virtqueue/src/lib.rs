//! The queue layer of exitless: split virtqueues over untrusted guest memory (`queue`), the
//! in-flight region a vhost-user backend shares with its frontend (`inflight`), the dirty log of
//! a live migration (`dirty`), and the traits that let a thread serve a device's queues without
//! knowing the device (`QueueWorker`, `WorkerHost`).

#![deny(missing_docs)]
#![cfg_attr(not(test), warn(clippy::cast_possible_truncation, clippy::cast_sign_loss))]

pub mod dirty;
pub mod inflight;
pub mod queue;
mod worker;

pub use worker::{QueueWorker, WorkerHost};
