//! Frames from one switch to another, when a daemon runs a switch on each of several IOCores
//! (`--iocores N`) and a frame is for a port, or the uplink, that another one serves: a ring of
//! bytes with one writer and one reader, each record a frame and where it goes. The sending
//! switch copies the frame in and the receiving one copies it out into its guest's receive
//! ring: two copies instead of one, no lock, and no system call but the wake-up of a receiving
//! switch that sleeps (see `SwitchControl::wake`).

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Bytes in one ring: 28 jumbo frames, or 340 standard ones.
pub(crate) const RING_BYTES: usize = 256 << 10;
/// A record's header: its frame's length, its flow, where it goes, where it came from, flags.
const HEADER: usize = 12;
/// Records start on 4-byte boundaries, so a header's length word always fits before the end.
const ALIGN: usize = 4;
/// The length word of a record that is not there: the next one starts at the ring's start.
const WRAP: u32 = u32::MAX;
/// A frame for every port of the receiving switch (a group or unknown address).
pub(crate) const FLOOD: usize = 0xff;

/// Where a handed-off frame goes and what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record {
    /// A port, the uplink (`switch::UPLINK`) or every port ([`FLOOD`]).
    pub(crate) to: usize,
    /// The port it came from (or the uplink).
    pub(crate) from: usize,
    /// The sender is isolated to the uplink: a flood reaches no port.
    pub(crate) isolated: bool,
    /// Its flow (`ethernet::flow_of`), for the receive queue it goes to.
    pub(crate) flow: u32,
}

impl Record {
    fn encode(self, len: usize) -> [u8; HEADER] {
        let mut header = [0u8; HEADER];
        // A frame is at most a jumbo frame: under 4 GiB.
        header[..4].copy_from_slice(&u32::try_from(len).unwrap_or(WRAP - 1).to_le_bytes());
        header[4..8].copy_from_slice(&self.flow.to_le_bytes());
        (header[8], header[9]) = (self.to as u8, self.from as u8);
        header[10] = u8::from(self.isolated);
        header
    }

    fn decode(header: &[u8; HEADER]) -> (Record, usize) {
        let word =
            |at: usize| u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]]);
        let record =
            Record { to: header[8].into(), from: header[9].into(), isolated: header[10] != 0, flow: word(4) };
        (record, word(0) as usize)
    }
}

/// The ring's memory and its two positions: bytes written (`tail`) and read (`head`) since it
/// was made; `tail - head` bytes hold records.
struct Ring {
    bytes: NonNull<u8>,
    head: AtomicUsize,
    tail: AtomicUsize,
}

// SAFETY: the ring's bytes are reached only through its one `Sender` and its one `Receiver`
// (neither is Clone, and both take `&mut self`). The sender writes only bytes outside
// `head..tail`, and publishes them by storing `tail` (Release) after writing; the receiver reads
// only bytes inside `head..tail` as it loaded `tail` (Acquire), and gives them back by storing
// `head` (Release) after reading, which the sender loads (Acquire) before it writes there again.
// So no byte is written while it is read, and each thread sees the other's writes in order.
unsafe impl Send for Ring {}
// SAFETY: see `Send`: shared between exactly one sender and one receiver, as above.
unsafe impl Sync for Ring {}

impl Ring {
    fn new() -> Ring {
        let bytes: Box<[u8]> = vec![0u8; RING_BYTES].into_boxed_slice();
        // Owned by the ring from here on, freed in `Drop`.
        let bytes = NonNull::from(Box::leak(bytes)).cast::<u8>();
        Ring { bytes, head: AtomicUsize::new(0), tail: AtomicUsize::new(0) }
    }

    /// The bytes `at..at + len` of the ring (`at + len` at most `RING_BYTES`).
    ///
    /// # Safety
    /// The caller is the ring's sender writing outside `head..tail`, or its receiver reading
    /// inside it, and holds no other slice over these bytes.
    #[allow(clippy::mut_from_ref)] // The ring's protocol, not `&self`, makes it exclusive.
    unsafe fn slice(&self, at: usize, len: usize) -> &mut [u8] {
        debug_assert!(at + len <= RING_BYTES);
        // SAFETY: `bytes` holds RING_BYTES bytes for the ring's lifetime and `at + len` is within
        // them; the caller guarantees no other thread or slice reaches these bytes meanwhile.
        unsafe { std::slice::from_raw_parts_mut(self.bytes.as_ptr().add(at), len) }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: `bytes` came from `Box::leak` of a RING_BYTES-byte boxed slice in `new`, and
        // nothing uses it after the ring is dropped.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.bytes.as_ptr(), RING_BYTES)) });
    }
}

/// The writing end of a ring: the switch that hands frames off.
pub(crate) struct Sender(Arc<Ring>);

/// The reading end of a ring: the switch the frames are for.
pub(crate) struct Receiver(Arc<Ring>);

/// A ring from one switch to another.
pub(crate) fn ring() -> (Sender, Receiver) {
    let ring = Arc::new(Ring::new());
    (Sender(ring.clone()), Receiver(ring))
}

fn padded(len: usize) -> usize {
    (HEADER + len).div_ceil(ALIGN) * ALIGN
}

impl Sender {
    /// Queue a frame of `len` bytes for `record`, written into the ring by `fill`; `false` if
    /// the ring has no room for it (the receiver is behind) or `fill` could not write it.
    pub(crate) fn push(&mut self, record: Record, len: usize, fill: impl FnOnce(&mut [u8]) -> bool) -> bool {
        let ring = &*self.0;
        let size = padded(len);
        let tail = ring.tail.load(Ordering::Relaxed);
        let head = ring.head.load(Ordering::Acquire);
        let at = tail % RING_BYTES;
        // A record does not wrap: when it does not fit before the end, it starts at the start.
        let skip = if RING_BYTES - at < size { RING_BYTES - at } else { 0 };
        if size > RING_BYTES || tail + skip + size - head > RING_BYTES {
            return false;
        }
        // SAFETY: the sender owns the bytes outside `head..tail`; `tail + skip + size - head`
        // is at most RING_BYTES, so these are outside it, and the record fits before the end.
        let written = unsafe {
            let start = (tail + skip) % RING_BYTES;
            let (header, frame) = ring.slice(start, HEADER + len).split_at_mut(HEADER);
            header.copy_from_slice(&record.encode(len));
            fill(frame)
        };
        if !written {
            return false;
        }
        if skip > 0 {
            // SAFETY: as above; records are 4-aligned, so at least 4 bytes are left at the end.
            unsafe { ring.slice(at, 4) }.copy_from_slice(&WRAP.to_le_bytes());
        }
        ring.tail.store(tail + skip + size, Ordering::Release);
        true
    }
}

impl Receiver {
    /// Hand the next frame to `take`; `false` when there is none.
    pub(crate) fn pop(&mut self, take: impl FnOnce(Record, &[u8])) -> bool {
        let ring = &*self.0;
        let mut head = ring.head.load(Ordering::Relaxed);
        let tail = ring.tail.load(Ordering::Acquire);
        if head == tail {
            return false;
        }
        let mut at = head % RING_BYTES;
        let mut word = [0u8; 4];
        // SAFETY: the receiver owns the bytes inside `head..tail`, where a record starts.
        word.copy_from_slice(unsafe { ring.slice(at, 4) });
        if u32::from_le_bytes(word) == WRAP {
            (head, at) = (head + RING_BYTES - at, 0);
        }
        let mut header = [0u8; HEADER];
        // SAFETY: as above: the sender published this record whole before it stored `tail`.
        header.copy_from_slice(unsafe { ring.slice(at, HEADER) });
        let (record, len) = Record::decode(&header);
        // SAFETY: as above.
        take(record, unsafe { ring.slice(at + HEADER, len) });
        ring.head.store(head + padded(len), Ordering::Release);
        true
    }

    /// Are frames waiting?
    pub(crate) fn has_frames(&self) -> bool {
        self.0.head.load(Ordering::Relaxed) != self.0.tail.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(to: usize) -> Record {
        Record { to, from: 3, isolated: to.is_multiple_of(2), flow: 0xdead_beef }
    }

    #[test]
    fn frames_come_out_as_they_went_in_across_the_ring_s_end_and_a_full_ring_refuses_more() {
        let (mut tx, mut rx) = ring();
        let mut sent = 0usize;
        let mut received = 0usize;
        // Lengths that do not divide the ring: records wrap at every place in turn.
        for round in 0..5_000usize {
            let len = 60 + round % 1500;
            let frame: Vec<u8> = (0..len).map(|i| (i + round) as u8).collect();
            while !tx.push(record(round % 64), len, |into| {
                into.copy_from_slice(&frame);
                true
            }) {
                // Full: the reader catches up.
                assert!(rx.pop(|r, got| {
                    assert_eq!(r, record(received % 64));
                    let expect: Vec<u8> = (0..got.len()).map(|i| (i + received) as u8).collect();
                    assert_eq!((got.len(), got), (60 + received % 1500, &expect[..]));
                    received += 1;
                }));
            }
            sent += 1;
        }
        while rx.pop(|_, _| received += 1) {}
        assert_eq!((sent, received), (5_000, 5_000));
        assert!(!rx.has_frames());
    }

    #[test]
    fn a_frame_that_could_not_be_written_is_not_published() {
        let (mut tx, mut rx) = ring();
        assert!(!tx.push(record(1), 100, |_| false));
        assert!(!rx.has_frames());
        assert!(!tx.push(record(1), RING_BYTES, |_| true), "larger than the ring");
        assert!(tx.push(record(1), 0, |_| true));
        assert!(rx.pop(|r, got| assert_eq!((r, got.len()), (record(1), 0))));
    }
}
