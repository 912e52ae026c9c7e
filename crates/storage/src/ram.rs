//! A RAM disk: a file in /dev/shm mapped into the VMM, so host tools (fio) can read the very
//! same bytes. Requests are memory copies: no system call, allocation or lock per request.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::{Backend, BackendError, Completion, IoError, Op, Segment, MAX_SEGMENTS, SECTOR_SIZE};

/// Requests in flight at once (completions waiting for `poll`).
const MAX_IN_FLIGHT: usize = 256;

pub struct RamDisk {
    base: *mut u8,
    capacity: u64,
    read_only: bool,
    _file: File,
    /// Finished requests waiting for `poll`: a fixed ring, allocated once.
    done: Box<[Completion; MAX_IN_FLIGHT]>,
    done_head: usize,
    done_len: usize,
}

// SAFETY: the mapping is owned by the RamDisk and moves with it; it is used by one thread at a time.
unsafe impl Send for RamDisk {}

impl RamDisk {
    /// Create (or truncate) `path` with `size` bytes and map it.
    pub fn create(path: &Path, size: u64) -> Result<RamDisk, BackendError> {
        if size == 0 || !size.is_multiple_of(SECTOR_SIZE) {
            return Err(BackendError::Other(format!(
                "RAM disk size {size} is not a non-zero multiple of 512"
            )));
        }
        let open_error = |source| BackendError::Open { path: path.display().to_string(), source };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(open_error)?;
        file.set_len(size).map_err(open_error)?;
        Self::map(file, size, false)
    }

    /// Map an existing RAM disk file.
    pub fn open(path: &Path, read_only: bool) -> Result<RamDisk, BackendError> {
        let open_error = |source| BackendError::Open { path: path.display().to_string(), source };
        let file = OpenOptions::new().read(true).write(!read_only).open(path).map_err(open_error)?;
        let size = file.metadata().map_err(open_error)?.len() / SECTOR_SIZE * SECTOR_SIZE;
        if size == 0 {
            return Err(BackendError::Other(format!("{} is smaller than one sector", path.display())));
        }
        Self::map(file, size, read_only)
    }

    fn map(file: File, size: u64, read_only: bool) -> Result<RamDisk, BackendError> {
        let prot = if read_only { libc::PROT_READ } else { libc::PROT_READ | libc::PROT_WRITE };
        // SAFETY: a fresh shared mapping of `size` bytes of a file we hold open; the result is
        // checked before use and unmapped in Drop.
        let base = unsafe {
            libc::mmap(std::ptr::null_mut(), size as usize, prot, libc::MAP_SHARED, file.as_raw_fd(), 0)
        };
        if base == libc::MAP_FAILED {
            return Err(BackendError::Other(format!(
                "cannot map the RAM disk: {}",
                std::io::Error::last_os_error()
            )));
        }
        let idle = Completion { tag: 0, result: Ok(0) };
        Ok(RamDisk {
            base: base.cast(),
            capacity: size,
            read_only,
            _file: file,
            done: Box::new([idle; MAX_IN_FLIGHT]),
            done_head: 0,
            done_len: 0,
        })
    }

    fn transfer(&mut self, op: Op, offset: u64, segments: &[Segment]) -> Result<u32, IoError> {
        if op == Op::Flush {
            // /dev/shm is memory: nothing is more durable than it already is.
            return Ok(0);
        }
        if op == Op::Write && self.read_only {
            return Err(IoError::ReadOnly);
        }
        if segments.len() > MAX_SEGMENTS {
            return Err(IoError::OutOfRange);
        }
        let total: u64 = segments.iter().map(|s| s.len as u64).sum();
        match offset.checked_add(total) {
            Some(end) if end <= self.capacity && total <= u32::MAX as u64 => {}
            _ => return Err(IoError::OutOfRange),
        }
        let mut at = offset as usize;
        for segment in segments {
            // SAFETY: `at + len <= capacity` was checked above, so the disk side is inside the
            // mapping; the segment is a bounds-checked range of guest RAM (the caller's contract).
            unsafe {
                let disk = self.base.add(at);
                match op {
                    Op::Read => std::ptr::copy_nonoverlapping(disk, segment.addr, segment.len as usize),
                    _ => std::ptr::copy_nonoverlapping(segment.addr, disk, segment.len as usize),
                }
            }
            at += segment.len as usize;
        }
        Ok(total as u32)
    }
}

impl Backend for RamDisk {
    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn max_in_flight(&self) -> usize {
        MAX_IN_FLIGHT
    }

    fn submit(&mut self, tag: u32, op: Op, offset: u64, segments: &[Segment]) -> bool {
        if self.done_len == MAX_IN_FLIGHT {
            return false;
        }
        let result = self.transfer(op, offset, segments);
        self.done[(self.done_head + self.done_len) % MAX_IN_FLIGHT] = Completion { tag, result };
        self.done_len += 1;
        true
    }

    fn poll(&mut self, done: &mut dyn FnMut(Completion)) -> usize {
        let n = self.done_len;
        for _ in 0..n {
            done(self.done[self.done_head]);
            self.done_head = (self.done_head + 1) % MAX_IN_FLIGHT;
        }
        self.done_len = 0;
        n
    }
}

impl Drop for RamDisk {
    fn drop(&mut self) {
        // SAFETY: `base` is the mapping of `capacity` bytes made in `map`, unmapped once here.
        unsafe { libc::munmap(self.base.cast(), self.capacity as usize) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(buf: &mut [u8]) -> Segment {
        Segment { addr: buf.as_mut_ptr(), len: buf.len() as u32 }
    }

    fn completions(disk: &mut RamDisk) -> Vec<Completion> {
        let mut all = Vec::new();
        disk.poll(&mut |c| all.push(c));
        all
    }

    #[test]
    fn writes_reach_the_file_and_read_back() {
        let path = tempfile::Builder::new().tempfile_in("/dev/shm").unwrap().into_temp_path();
        let mut disk = RamDisk::create(&path, 64 << 10).unwrap();
        let (mut a, mut b) = ([1u8; 512], [2u8; 1024]);
        assert!(disk.submit(7, Op::Write, 4096, &[segment(&mut a), segment(&mut b)]));
        assert_eq!(completions(&mut disk), vec![Completion { tag: 7, result: Ok(1536) }]);
        let file = std::fs::read(&path).unwrap();
        assert!(file[4096..4608].iter().all(|&x| x == 1) && file[4608..5632].iter().all(|&x| x == 2));
        let mut back = [0u8; 1536];
        assert!(disk.submit(8, Op::Read, 4096, &[segment(&mut back)]));
        assert_eq!(completions(&mut disk)[0].result, Ok(1536));
        assert_eq!(&back[..512], &a[..]);
    }

    #[test]
    fn out_of_range_read_only_and_full() {
        let path = tempfile::Builder::new().tempfile_in("/dev/shm").unwrap().into_temp_path();
        let mut disk = RamDisk::create(&path, 4096).unwrap();
        let mut buf = [0u8; 512];
        for offset in [4096, 3800, u64::MAX - 10] {
            assert!(disk.submit(1, Op::Read, offset, &[segment(&mut buf)]));
            assert_eq!(completions(&mut disk)[0].result, Err(IoError::OutOfRange), "offset {offset}");
        }
        for tag in 0..MAX_IN_FLIGHT as u32 {
            assert!(disk.submit(tag, Op::Flush, 0, &[]));
        }
        assert!(!disk.submit(999, Op::Flush, 0, &[]), "full until polled");
        assert_eq!(completions(&mut disk).len(), MAX_IN_FLIGHT);
        let mut ro = RamDisk::open(&path, true).unwrap();
        assert!(ro.submit(1, Op::Write, 0, &[segment(&mut buf)]));
        assert_eq!(completions(&mut ro)[0].result, Err(IoError::ReadOnly));
        assert!(RamDisk::create(&path, 1000).is_err());
    }
}
