//! A null disk: reads return zeros, writes, flushes, discards and write-zeroes are accepted and
//! dropped. It holds no data, so it measures the I/O path alone (the peer of QEMU's `null-co`
//! with `read-zeroes=on`). Every request is checked as on any other disk (range, read-only,
//! segments) and completes at once: no system call, allocation or lock per request.

use vm_memory::VolatileSlice;

use crate::at_once::{AtOnce, Medium};
use crate::zeros;
use crate::{BackendError, Op, Segment, SECTOR_SIZE};

/// A disk of `capacity` bytes that reads as zeros and forgets what is written to it.
pub type NullDisk = AtOnce<NullMedium>;

/// What a null disk holds: its size, and nothing else.
pub struct NullMedium {
    capacity: u64,
    read_only: bool,
}

impl NullDisk {
    /// A null disk of `size` bytes, a non-zero multiple of 512.
    pub fn new(size: u64, read_only: bool) -> Result<NullDisk, BackendError> {
        if size == 0 || !size.is_multiple_of(SECTOR_SIZE) {
            return Err(BackendError::BadSize { size });
        }
        Ok(AtOnce::over(NullMedium { capacity: size, read_only }))
    }
}

impl Medium for NullMedium {
    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    unsafe fn transfer(&mut self, op: Op, _offset: u64, segments: &[Segment], total: u32) -> u32 {
        if op == Op::Read {
            for segment in segments.iter().filter(|segment| !segment.is_empty()) {
                // SAFETY: the segment's bytes are valid while the request runs (this method's
                // contract); a volatile slice, with no reference made, since the guest may
                // touch its buffer concurrently.
                let guest = unsafe { VolatileSlice::new(segment.addr(), segment.len() as usize) };
                zeros::fill(&guest);
            }
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Backend, IoError, MAX_SEGMENTS};

    fn segment(buf: &mut [u8]) -> Segment {
        // SAFETY: every test keeps `buf` alive and untouched until the request completes.
        unsafe { Segment::new(buf.as_mut_ptr(), buf.len() as u32) }
    }

    fn results(disk: &mut NullDisk) -> Vec<Result<u32, IoError>> {
        let mut all = Vec::new();
        disk.poll(&mut |c| all.push(c.result));
        all
    }

    #[test]
    fn reads_give_zeros_into_buffers_that_held_data() {
        let mut disk = NullDisk::new(1 << 20, false).unwrap();
        assert_eq!((disk.capacity(), disk.read_only()), (1 << 20, false));
        let (mut a, mut b) = ([0xa5u8; 512], vec![0x5au8; 3 * 4096 + 512]);
        let empty = Segment::EMPTY;
        assert!(disk.submit(1, Op::Read, 4096, &[segment(&mut a), empty, segment(&mut b)]));
        assert_eq!(results(&mut disk), [Ok(13312)]);
        assert!(a.iter().chain(&b).all(|&x| x == 0));
    }

    #[test]
    fn writes_are_accepted_and_change_no_later_read() {
        let mut disk = NullDisk::new(64 << 10, false).unwrap();
        assert!(disk.capabilities().discard && disk.capabilities().write_zeroes);
        let (mut x, mut y) = ([1u8; 1024], [2u8; 4096]);
        assert!(disk.submit(1, Op::Write, 0, &[segment(&mut x), segment(&mut y)]));
        assert!(disk.submit(2, Op::Flush, 0, &[]));
        assert!(disk.submit(3, Op::Discard { len: 4096 }, 8192, &[]));
        assert!(disk.submit(4, Op::WriteZeroes { len: 512, unmap: true }, 0, &[]));
        assert_eq!(results(&mut disk), [Ok(5120), Ok(0), Ok(0), Ok(0)]);
        assert_eq!((x, y), ([1u8; 1024], [2u8; 4096]), "a write leaves the guest's buffer alone");
        let mut back = [7u8; 5120];
        assert!(disk.submit(5, Op::Read, 0, &[segment(&mut back)]));
        assert_eq!(results(&mut disk), [Ok(5120)]);
        assert!(back.iter().all(|&x| x == 0));
    }

    #[test]
    fn out_of_range_requests_fail_without_touching_memory() {
        let mut disk = NullDisk::new(4096, false).unwrap();
        let mut buf = [3u8; 512];
        for offset in [4096, 3800, u64::MAX - 10, u64::MAX] {
            assert!(disk.submit(1, Op::Read, offset, &[segment(&mut buf)]));
            assert_eq!(results(&mut disk), [Err(IoError::OutOfRange)], "offset {offset}");
        }
        assert_eq!(buf, [3u8; 512], "a refused read writes nothing");
        // A length the guest claims but that has no memory behind it is never touched.
        // SAFETY: never dereferenced: the range check refuses it first (what this checks).
        let lie = unsafe { Segment::new(std::ptr::null_mut(), u32::MAX) };
        assert!(disk.submit(2, Op::Read, 0, &[lie, lie]));
        let many = vec![segment(&mut buf[..1]); MAX_SEGMENTS + 1];
        assert!(disk.submit(3, Op::Read, 0, &many));
        assert!(disk.submit(4, Op::Discard { len: 1024 }, 3584, &[]));
        assert_eq!(results(&mut disk), [Err(IoError::OutOfRange); 3]);
    }

    #[test]
    fn read_only_disk_rejects_writes_but_reads_and_flushes() {
        let mut disk = NullDisk::new(4096, true).unwrap();
        assert!(disk.read_only());
        assert!(!disk.capabilities().discard && !disk.capabilities().write_zeroes);
        let mut buf = [9u8; 512];
        assert!(disk.submit(1, Op::Write, 0, &[segment(&mut buf)]));
        assert!(disk.submit(2, Op::Discard { len: 512 }, 0, &[]));
        assert!(disk.submit(3, Op::WriteZeroes { len: 512, unmap: false }, 0, &[]));
        assert!(disk.submit(4, Op::Flush, 0, &[]));
        assert!(disk.submit(5, Op::Read, 512, &[segment(&mut buf)]));
        let read_only = Err(IoError::ReadOnly);
        assert_eq!(results(&mut disk), [read_only, read_only, read_only, Ok(0), Ok(512)]);
        assert_eq!(buf, [0u8; 512]);
    }

    #[test]
    fn submit_refuses_when_completions_are_not_polled() {
        let mut disk = NullDisk::new(4096, false).unwrap();
        for tag in 0..disk.max_in_flight() as u32 {
            assert!(disk.submit(tag, Op::Flush, 0, &[]));
        }
        assert!(!disk.submit(999, Op::Flush, 0, &[]), "full until polled");
        assert_eq!(disk.poll(&mut |_| {}), disk.max_in_flight());
        assert!(disk.submit(1000, Op::Flush, 0, &[]));
    }

    #[test]
    fn bad_sizes_are_refused() {
        assert!(matches!(NullDisk::new(0, false), Err(BackendError::BadSize { size: 0 })));
        assert!(matches!(NullDisk::new(1000, true), Err(BackendError::BadSize { size: 1000 })));
    }
}
