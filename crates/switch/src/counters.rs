//! What the switch counts, per port and for the uplink. The switch adds to plain counters on its
//! own thread and, once per pass that did work, stores them in a shared copy of atomics (one
//! relaxed store each: no lock, no read-modify-write) that the daemon's control thread reads.

use std::sync::atomic::{AtomicU64, Ordering};

/// A set of counters: the plain struct the switch adds to, and its shared copy.
macro_rules! counters {
    (
        $(#[$meta:meta])* $name:ident, $(#[$shared_meta:meta])* $shared:ident {
            $($(#[$field_meta:meta])* $field:ident,)*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        pub struct $name {
            $($(#[$field_meta])* pub $field: u64,)*
        }

        impl $name {
            /// Each counter with its name.
            pub fn named(&self) -> impl Iterator<Item = (&'static str, u64)> {
                [$((stringify!($field), self.$field)),*].into_iter()
            }
        }

        $(#[$shared_meta])*
        #[derive(Debug, Default)]
        pub struct $shared {
            $($field: AtomicU64,)*
        }

        impl $shared {
            /// Store `counters` (the switch's thread is the only writer).
            pub(crate) fn publish(&self, counters: &$name) {
                $(self.$field.store(counters.$field, Ordering::Relaxed);)*
            }

            /// The counters as last published.
            pub fn read(&self) -> $name {
                $name { $($field: self.$field.load(Ordering::Relaxed),)* }
            }
        }
    };
}

counters! {
    /// What a port did, counted by the switch.
    PortCounters,
    /// A port's counters as the switch last published them, for other threads.
    SharedPortCounters {
        /// Frames taken from its transmit ring and switched.
        tx_frames,
        /// Transmit chains with a bad descriptor, direction or length: returned, not switched.
        tx_malformed,
        /// Frames it sent to its own address: dropped.
        tx_to_self,
        /// Frames to a group or unknown address that no other port (nor an uplink) was there
        /// to hear: dropped.
        tx_unheard,
        /// Frames between it and another NIC while either is isolated: dropped.
        tx_isolated,
        /// Frames it sent from an address not its own while isolated, or from another NIC's own
        /// address: dropped.
        tx_spoofed,
        /// Passes in which its frames waited for its rate limit.
        tx_rate_limited,
        /// Deliveries of its TCP super-frames cut into segments by the switch, for a receiver
        /// that does not take super-frames (or the uplink).
        tx_segmented,
        /// Deliveries of its frames whose checksum the switch filled in, for a receiver that does
        /// not take frames with the checksum left.
        tx_checksummed,
        /// Deliveries the switch could not make: the frame is not what its header's offload
        /// says (a super-frame that is not TCP) and the receiver does not take it as it is.
        tx_bad_offload,
        /// Frames for a port (or the uplink) on another IOCore's switch dropped: the ring to
        /// that switch was full.
        tx_handoff_full,
        /// Frames delivered into its receive ring.
        rx_frames,
        /// Receive chains filled: one per frame, more when its driver merges them.
        rx_buffers,
        /// Frames for it that found no receive buffer posted: dropped.
        rx_no_buffer,
        /// Frames for it longer than its MTU takes, or than the receive chains they would land
        /// in: dropped.
        rx_too_big,
        /// Receive chains with a bad descriptor, too short for a header, or whose memory could
        /// not be written: returned empty.
        rx_malformed,
        /// Used-buffer interrupts sent to its driver.
        interrupts,
    }
}

counters! {
    /// What the uplink did, counted by the switch.
    UplinkCounters,
    /// The uplink's counters as the switch last published them, for other threads.
    SharedUplinkCounters {
        /// Frames from the host switched to NICs.
        rx_frames,
        /// Of those, TCP super-frames (the host's TSO or GSO): passed on whole to NICs that
        /// take them, cut into segments for the others.
        rx_super_frames,
        /// Frames from the host longer than the switch takes (a frame longer than a jumbo
        /// frame, a super-frame longer than 64 KiB): dropped.
        rx_too_big,
        /// Frames from the host shorter than an Ethernet header, with a checksum to fill in
        /// outside them, or super-frames the switch does not cut (not TCP, ECN, or VLAN-tagged):
        /// dropped.
        rx_malformed,
        /// Frames from the host sent from a NIC's own address: dropped.
        rx_spoofed,
        /// Frames from NICs queued for the host.
        tx_frames,
        /// Of those, TCP super-frames (a NIC's TSO): passed to the host whole, for its stack
        /// or its NIC to cut into segments.
        tx_super_frames,
        /// Frames for the host that found its transmit ring full: dropped.
        tx_ring_full,
        /// Frames for the host longer than it takes (a jumbo frame from a NIC of a larger MTU, a
        /// super-frame whose segments would be; the uplink carries frames of up to 1518 bytes):
        /// dropped.
        tx_too_big,
        /// Times the kernel refused to send what was queued (it goes with the next pass's).
        tx_errors,
    }
}
