//! A polled Ethernet switch between virtio-net rings, run on an IOCore (issue 37's data plane).
//!
//! Each [`Port`] is one NIC: its guest's receive and transmit rings, in that guest's memory. The
//! [`Switch`] is a single `QueueWorker`: on every pass it takes frames off each port's transmit
//! ring, learns the port of each sender's address ([`mac_table`]), and copies the frame straight
//! from the sender's chain into the receiver's (or, for a group or unknown address, into every
//! other port's): one copy, no buffer in between, no system call. Device models attach and
//! detach ports through [`SwitchControl`] while the switch runs.
//!
//! With several IOCores, each runs a switch of its own over some of the ports; frames between
//! them cross through a ring per pair of switches (see [`Switch`]).
//!
//! An uplink ([`Switch::with_uplink`]) is one more port: an AF_PACKET socket's mapped rings on a
//! host interface, for addresses not on a NIC. Each port holds to its [`PortPolicy`]: isolation
//! to the uplink, and rate limits on what it sends.
//!
//! Every descriptor is checked against its guest's memory before a byte moves ([`chain`]); a
//! malformed chain is returned unused and counted, a ring the driver broke stops its port only.
//!
//! Offloads ([`offload`]): a NIC may leave a frame's checksum to the switch and send TCP
//! super-frames of up to [`MAX_SUPER_FRAME_LEN`] bytes; a receiver whose driver takes them gets
//! them as they are, over several receive chains if its driver merges them, and any other (the
//! switches of other IOCores too) gets the checksum filled in or the segments cut by the switch
//! ([`segment`]); the uplink gets a super-frame whole, for the host's kernel to cut. Every other
//! frame is at most [`MAX_FRAME_LEN`] bytes.

#![deny(missing_docs)]

pub mod chain;
mod control;
mod counters;
mod delivery;
pub mod ethernet;
mod handoff;
mod host;
pub mod mac_table;
pub mod offload;
pub mod port;
mod rework;
pub mod segment;
mod switch;
mod uplink;
mod wake;

pub use control::{SwitchControl, SwitchError, MAX_SWITCHES};
pub use counters::{PortCounters, SharedPortCounters, SharedUplinkCounters, UplinkCounters};
pub use ethernet::MacAddr;
pub use offload::{NetHeader, Offloads, NET_HDR_LEN};
pub use port::{Port, PortParts, PortPolicy, QueuePair};
pub use switch::{
    Switch, DEFAULT_MTU, MAX_FRAME_LEN, MAX_JUMBO_FRAME_LEN, MAX_MTU, MAX_PORTS, MAX_SUPER_FRAME_LEN,
    TX_BATCH,
};

#[cfg(test)]
mod tests;
