//! Filling in a checksum the sender left to offload: the Internet checksum (RFC 1071) over the
//! bytes from `csum_start` to the frame's end, stored at `csum_start + csum_offset`, where the
//! sender put the pseudo-header's sum.

use vm_memory::{Bytes, VolatileSlice};

/// The longest frame [`finish`] checksums: a ring slot's worth (it is read onto the stack).
const MAX_LEN: usize = 2048;

/// Fill in the checksum of `frame`, shared memory (a ring slot of at most 2 KiB); `false` if
/// the offsets do not lie in the frame or it is longer.
pub fn finish(frame: &VolatileSlice<'_>, start: usize, offset: usize) -> bool {
    let len = frame.len();
    if len > MAX_LEN || !fits(len, start, offset) {
        return false;
    }
    let mut bytes = [0u8; MAX_LEN];
    let bytes = &mut bytes[..len - start];
    if frame.read_slice(bytes, start).is_err() {
        return false;
    }
    frame.write_slice(&checksum(bytes).to_be_bytes(), start + offset).is_ok()
}

/// [`finish`] for a frame in this process's own memory, of any length.
pub fn finish_bytes(frame: &mut [u8], start: usize, offset: usize) -> bool {
    if !fits(frame.len(), start, offset) {
        return false;
    }
    let at = start + offset;
    let sum = checksum(&frame[start..]);
    frame[at..at + 2].copy_from_slice(&sum.to_be_bytes());
    true
}

/// Do a checksum from `start` and its field at `start + offset` lie in `len` bytes?
fn fits(len: usize, start: usize, offset: usize) -> bool {
    start < len && start.saturating_add(offset).saturating_add(2) <= len
}

/// The checksum of `bytes`, the field's bytes holding the pseudo-header's sum.
fn checksum(bytes: &[u8]) -> u16 {
    // A computed 0 goes out as 0xffff, its other form: 0 in a UDP header means "none".
    match !ones_complement_sum(bytes) {
        0 => 0xffff,
        sum => sum,
    }
}

/// The ones'-complement sum of `bytes` as big-endian 16-bit words (an odd last byte padded
/// with a zero). Sums of pieces add up (with [`fold`]) to the sum of the whole when every
/// piece but the last has an even length.
pub fn ones_complement_sum(bytes: &[u8]) -> u16 {
    let sum: u64 = bytes
        .chunks(2)
        .map(|pair| u64::from(u16::from_be_bytes([pair[0], pair.get(1).copied().unwrap_or(0)])))
        .sum();
    fold(sum)
}

/// `sum` folded to 16 bits, carries added back in.
pub fn fold(mut sum: u64) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    u16::try_from(sum).unwrap_or(u16::MAX) // Folded: it fits.
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sum_is_rfc_1071s() {
        // RFC 1071's example.
        assert_eq!(ones_complement_sum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]), 0xddf2);
        assert_eq!(ones_complement_sum(&[0x12]), 0x1200);
    }

    #[test]
    fn a_finished_checksum_verifies_and_bad_offsets_are_refused() {
        let mut frame = [0u8; 64];
        for (i, byte) in frame.iter_mut().enumerate() {
            *byte = (i as u8).wrapping_mul(37);
        }
        // The pseudo-header's sum, where the sender leaves it for the offload.
        let pseudo_header = 0x1234u16;
        frame[40..42].copy_from_slice(&pseudo_header.to_be_bytes());
        // SAFETY: `frame` outlives the slice.
        let slice = unsafe { VolatileSlice::new(frame.as_mut_ptr(), frame.len()) };
        assert!(finish(&slice, 34, 6));
        // A receiver sums the bytes, checksum included, and the pseudo-header: all ones.
        let mut covered = [0u8; 30];
        slice.read_slice(&mut covered, 34).unwrap();
        assert_eq!(fold(u64::from(ones_complement_sum(&covered)) + u64::from(pseudo_header)), 0xffff);
        assert!(!finish(&slice, 64, 0));
        assert!(!finish(&slice, 34, 29));
        // The same in a jumbo frame of the process's own memory, beyond a ring slot.
        let mut jumbo = vec![0u8; 9014];
        jumbo[..64].copy_from_slice(&frame);
        jumbo[40..42].copy_from_slice(&pseudo_header.to_be_bytes());
        assert!(finish_bytes(&mut jumbo, 34, 6));
        assert_eq!(fold(u64::from(ones_complement_sum(&jumbo[34..])) + u64::from(pseudo_header)), 0xffff);
        assert!(!finish_bytes(&mut jumbo, 34, 9014 - 34 - 1));
    }
}
