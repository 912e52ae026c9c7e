//! The checks every backend makes before touching data: a guest controls offsets and lengths,
//! so nothing here may overflow, index out of bounds or panic.

use crate::{IoError, Op, Segment, MAX_SEGMENTS};

/// Check `op` at byte `offset` over `segments` against a disk of `capacity` bytes, and return
/// the request's total length in bytes (0 for Flush, Discard and WriteZeroes, which move no
/// data: their range is checked here and they carry no segments).
pub(crate) fn validate(
    op: Op,
    offset: u64,
    segments: &[Segment],
    capacity: u64,
    read_only: bool,
) -> Result<u32, IoError> {
    if op.writes() && read_only {
        return Err(IoError::ReadOnly);
    }
    match op {
        Op::Flush => return Ok(0),
        Op::Discard { len } | Op::WriteZeroes { len, .. } => {
            return match offset.checked_add(len) {
                Some(end) if end <= capacity && segments.is_empty() => Ok(0),
                _ => Err(IoError::OutOfRange),
            };
        }
        Op::Read | Op::Write => {}
    }
    if segments.len() > MAX_SEGMENTS {
        return Err(IoError::OutOfRange);
    }
    // At most MAX_SEGMENTS lengths below 2^32 each: the sum cannot overflow a u64.
    let total: u64 = segments.iter().map(|segment| u64::from(segment.len())).sum();
    // Completions report the length as a u32.
    let total = u32::try_from(total).map_err(|_| IoError::OutOfRange)?;
    match offset.checked_add(u64::from(total)) {
        Some(end) if end <= capacity => Ok(total),
        _ => Err(IoError::OutOfRange),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segments(lens: &[u32]) -> Vec<Segment> {
        // SAFETY: validation only reads the lengths; nothing dereferences these.
        lens.iter().map(|&len| unsafe { Segment::new(std::ptr::null_mut(), len) }).collect()
    }

    #[test]
    fn accepts_requests_inside_the_disk() {
        assert_eq!(validate(Op::Read, 0, &segments(&[512, 1024]), 4096, false), Ok(1536));
        assert_eq!(validate(Op::Write, 3584, &segments(&[512]), 4096, false), Ok(512));
        assert_eq!(validate(Op::Read, 4096, &[], 4096, true), Ok(0));
        assert_eq!(validate(Op::Read, 0, &segments(&[0, 512, 0]), 4096, false), Ok(512));
    }

    #[test]
    fn rejects_hostile_requests() {
        let one = segments(&[512]);
        assert_eq!(validate(Op::Read, 4096, &one, 4096, false), Err(IoError::OutOfRange));
        assert_eq!(validate(Op::Read, 3585, &one, 4096, false), Err(IoError::OutOfRange));
        assert_eq!(validate(Op::Read, u64::MAX - 100, &one, u64::MAX, false), Err(IoError::OutOfRange));
        assert_eq!(validate(Op::Read, u64::MAX, &one, 4096, false), Err(IoError::OutOfRange));
        let huge = segments(&[u32::MAX, u32::MAX]);
        assert_eq!(validate(Op::Read, 0, &huge, u64::MAX, false), Err(IoError::OutOfRange));
        let many = segments(&[1; MAX_SEGMENTS + 1]);
        assert_eq!(validate(Op::Read, 0, &many, 1 << 20, false), Err(IoError::OutOfRange));
        assert_eq!(validate(Op::Write, 0, &one, 4096, true), Err(IoError::ReadOnly));
    }

    #[test]
    fn ranges_without_data_are_checked_against_the_disk() {
        let discard = |len| Op::Discard { len };
        let zeroes = |len| Op::WriteZeroes { len, unmap: true };
        assert_eq!(validate(discard(4096), 0, &[], 4096, false), Ok(0));
        assert_eq!(validate(zeroes(512), 3584, &[], 4096, false), Ok(0));
        assert_eq!(validate(discard(0), 4096, &[], 4096, false), Ok(0));
        assert_eq!(validate(discard(512), 3585, &[], 4096, false), Err(IoError::OutOfRange));
        assert_eq!(validate(zeroes(u64::MAX), 1, &[], u64::MAX, false), Err(IoError::OutOfRange));
        assert_eq!(validate(discard(512), 0, &segments(&[512]), 4096, false), Err(IoError::OutOfRange));
        assert_eq!(validate(discard(512), 0, &[], 4096, true), Err(IoError::ReadOnly));
        assert_eq!(validate(zeroes(512), 0, &[], 4096, true), Err(IoError::ReadOnly));
    }

    #[test]
    fn flush_needs_no_range() {
        assert_eq!(validate(Op::Flush, u64::MAX, &segments(&[u32::MAX; 200]), 512, true), Ok(0));
    }
}
