//! A RAM disk: a file in /dev/shm mapped into the VMM, so host tools (fio) can read the very
//! same bytes. Requests are memory copies: no system call, allocation or lock per request.
//!
//! /dev/shm is memory, so nothing here is durable across a host reboot and Flush has nothing to
//! do. The file must not be shrunk while the disk is open: touching a page past the new end of a
//! shared mapping raises SIGBUS.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::ptr::NonNull;

use vm_memory::VolatileSlice;

use crate::at_once::{AtOnce, Medium};
use crate::zeros;
use crate::{BackendError, Op, Segment, SECTOR_SIZE};

/// A disk held in a shared-memory file mapped into the process: requests are memory copies,
/// completed at once and handed over by the next `poll`.
pub type RamDisk = AtOnce<RamMapping>;

/// A RAM disk's bytes: the shared mapping of its file, owned (and unmapped on drop).
pub struct RamMapping {
    base: NonNull<u8>,
    /// The mapping's length: `capacity` bytes.
    length: usize,
    capacity: u64,
    read_only: bool,
    /// Kept open for the life of the mapping (and so the file's identity is clear in /proc).
    file: File,
}

// SAFETY: the mapping is owned by the RamMapping and moves with it; it is used by one thread at
// a time (`&mut self` for every access to the mapping).
unsafe impl Send for RamMapping {}

impl RamDisk {
    /// Create `path` with `size` bytes, a non-zero multiple of 512, and map it; a regular file
    /// of this user's already there is truncated to that size (a test's temporary file). The
    /// path is not followed if it is a symbolic link, a new file is mode 0600, and anything but
    /// a regular file of this user's (a FIFO, a device, another user's file) is refused
    /// untouched. A disk no other process needs by path is better made with
    /// [`RamDisk::anonymous_queues`].
    pub fn create(path: impl AsRef<Path>, size: u64) -> Result<RamDisk, BackendError> {
        let path = path.as_ref();
        if size == 0 || !size.is_multiple_of(SECTOR_SIZE) {
            return Err(BackendError::BadSize { size });
        }
        let open_error = |source| BackendError::Open { path: path.display().to_string(), source };
        // O_NONBLOCK: a FIFO planted at the path is opened without waiting, then refused.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .map_err(open_error)?;
        let meta = file.metadata().map_err(open_error)?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let own = unsafe { libc::geteuid() };
        if !meta.file_type().is_file() || meta.uid() != own {
            return Err(open_error(std::io::Error::from_raw_os_error(libc::EPERM)));
        }
        file.set_len(0).and_then(|()| file.set_len(size)).map_err(open_error)?;
        RamMapping::map(path, file, size, false).map(AtOnce::over)
    }

    /// A new RAM disk of `size` bytes, a non-zero multiple of 512, mapped `count` times (at
    /// least once: a backend per queue). Its memory is a memfd: no path on the host leads to
    /// it, no other user can open it, and it is gone with its last mapping.
    pub fn anonymous_queues(size: u64, count: usize) -> Result<Vec<RamDisk>, BackendError> {
        const SHOWN: &str = "a new RAM disk (memfd)";
        if size == 0 || !size.is_multiple_of(SECTOR_SIZE) {
            return Err(BackendError::BadSize { size });
        }
        let open_error = |source| BackendError::Open { path: SHOWN.into(), source };
        // SAFETY: memfd_create reads the NUL-terminated name only; the descriptor it returns is
        // checked, then owned.
        let fd = unsafe { libc::memfd_create(c"exitless-ram".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(open_error(std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a new descriptor nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(size).map_err(open_error)?;
        (0..count.max(1))
            .map(|_| {
                let file = file.try_clone().map_err(open_error)?;
                RamMapping::map(Path::new(SHOWN), file, size, false).map(AtOnce::over)
            })
            .collect()
    }

    /// Map an existing RAM disk file; its size is rounded down to whole sectors.
    pub fn open(path: impl AsRef<Path>, read_only: bool) -> Result<RamDisk, BackendError> {
        let path = path.as_ref();
        let open_error = |source| BackendError::Open { path: path.display().to_string(), source };
        let file = OpenOptions::new().read(true).write(!read_only).open(path).map_err(open_error)?;
        let size = file.metadata().map_err(open_error)?.len() / SECTOR_SIZE * SECTOR_SIZE;
        if size == 0 {
            return Err(BackendError::TooSmall { path: path.display().to_string() });
        }
        RamMapping::map(path, file, size, read_only).map(AtOnce::over)
    }
}

impl RamMapping {
    fn map(path: &Path, file: File, size: u64, read_only: bool) -> Result<RamMapping, BackendError> {
        let map_error = |source| BackendError::Map { path: path.display().to_string(), source };
        let length =
            usize::try_from(size).map_err(|_| map_error(std::io::Error::from_raw_os_error(libc::ENOMEM)))?;
        let prot = if read_only { libc::PROT_READ } else { libc::PROT_READ | libc::PROT_WRITE };
        // SAFETY: a fresh shared mapping of `length` bytes of a file we hold open, at an address
        // the kernel chooses (so it replaces nothing); the result is checked before use and
        // unmapped once, in Drop.
        let base =
            unsafe { libc::mmap(std::ptr::null_mut(), length, prot, libc::MAP_SHARED, file.as_raw_fd(), 0) };
        if base == libc::MAP_FAILED {
            return Err(map_error(std::io::Error::last_os_error()));
        }
        let base = NonNull::new(base.cast()).ok_or_else(|| map_error(std::io::ErrorKind::Other.into()))?;
        let mapping = RamMapping { base, length, capacity: size, read_only, file };
        mapping.populate_allocated();
        Ok(mapping)
    }

    /// Map every page the file already holds now, so that no request pays a first-touch page
    /// fault: a write into a fresh shared mapping faults once per 4 KiB page, which costs more
    /// than the copy. Holes stay holes (populating them would allocate the whole disk at once);
    /// a request's first write there allocates the page, as it would on any sparse file.
    /// Best effort: where the kernel refuses, pages fault in as requests touch them. Only on a
    /// file system kept in memory: elsewhere a write fault is how the kernel learns a page is
    /// dirty, and populating for writing would dirty, and so write back, the whole file.
    fn populate_allocated(&self) {
        if !crate::file::on_memory_file_system(&self.file).unwrap_or(false) {
            return;
        }
        let advice = if self.read_only { libc::MADV_POPULATE_READ } else { libc::MADV_POPULATE_WRITE };
        let fd = self.file.as_raw_fd();
        let Ok(end) = libc::off_t::try_from(self.length) else { return };
        let mut at: libc::off_t = 0;
        while at < end {
            // SAFETY: lseek on a descriptor this mapping owns; it moves the file offset only,
            // which nothing here uses (requests go through the mapping).
            let (data, hole) = unsafe {
                let data = libc::lseek(fd, at, libc::SEEK_DATA);
                (data, if data < 0 { data } else { libc::lseek(fd, data, libc::SEEK_HOLE) })
            };
            let (Ok(start), Ok(stop)) = (usize::try_from(data), usize::try_from(hole.min(end))) else {
                return;
            };
            // madvise wants a page-aligned start; the kernel rounds the length up, and the
            // mapping covers whole pages.
            let start = start - start % page_size();
            if stop > start {
                // SAFETY: `start..stop` lies inside the mapping this RamMapping owns (`stop` is at
                // most its length); populating only maps pages, it changes no byte.
                unsafe { libc::madvise(self.base.as_ptr().add(start).cast(), stop - start, advice) };
            }
            at = hole;
        }
    }

    /// Zero `len` bytes at `offset`. Both Discard and WriteZeroes do this: memory has nothing
    /// to deallocate without a system call.
    ///
    /// # Safety
    /// `offset + len <= capacity`.
    unsafe fn zero(&mut self, offset: u64, len: u64) {
        // Inside the mapping (the contract), so both fit in usize.
        let (Ok(at), Ok(len)) = (usize::try_from(offset), usize::try_from(len)) else { return };
        // SAFETY: `at + len <= capacity` (the contract): inside the mapping this RamMapping
        // owns; a volatile slice, since host tools may map the file too.
        let disk = unsafe { VolatileSlice::new(self.base.as_ptr().add(at), len) };
        zeros::fill(&disk);
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system; it touches no memory of ours.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

impl Medium for RamMapping {
    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    unsafe fn transfer(&mut self, op: Op, offset: u64, segments: &[Segment], total: u32) -> u32 {
        if let Some(len) = op.range_len() {
            // SAFETY: the range passed `validate` against this disk (the contract).
            unsafe { self.zero(offset, len) };
            return 0;
        }
        // `offset + total <= capacity` (this method's contract), which fits in usize (the
        // mapping exists).
        let (Op::Read | Op::Write, Ok(mut at)) = (op, usize::try_from(offset)) else { return 0 };
        for segment in segments.iter().filter(|segment| !segment.is_empty()) {
            let len = segment.len() as usize;
            // SAFETY: `at + len <= offset + total <= capacity` (this method's contract), so the
            // disk side lies inside the mapping this RamMapping owns; the segment's bytes are
            // valid while the call runs (the contract too). Both are volatile slices, and no
            // reference is made to either: the guest may touch its buffer concurrently, or name
            // it in another request (it then reads or stores bytes of its own making), and host
            // tools may map the file.
            let (disk, guest) = unsafe {
                (VolatileSlice::new(self.base.as_ptr().add(at), len), VolatileSlice::new(segment.addr(), len))
            };
            if op == Op::Read {
                disk.copy_to_volatile_slice(guest);
            } else {
                guest.copy_to_volatile_slice(disk);
            }
            at += len;
        }
        total
    }
}

impl Drop for RamMapping {
    fn drop(&mut self) {
        // SAFETY: `base` is the mapping of `length` bytes made in `map`, unmapped once here;
        // no reference into it outlives the RamMapping.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.length) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Backend, Completion, IoError, MAX_SEGMENTS};

    fn segment(buf: &mut [u8]) -> Segment {
        // SAFETY: every test keeps `buf` alive and untouched until the request completes.
        unsafe { Segment::new(buf.as_mut_ptr(), buf.len() as u32) }
    }

    fn completions(disk: &mut RamDisk) -> Vec<Completion> {
        let mut all = Vec::new();
        disk.poll(&mut |c| all.push(c));
        all
    }

    /// A unique path in /dev/shm, removed when the guard drops.
    fn shm_path() -> tempfile::TempPath {
        tempfile::Builder::new().prefix("exitless-ram-test").tempfile_in("/dev/shm").unwrap().into_temp_path()
    }

    #[test]
    fn writes_reach_the_file_and_read_back_across_segments() {
        let path = shm_path();
        let mut disk = RamDisk::create(&path, 64 << 10).unwrap();
        assert_eq!((disk.capacity(), disk.read_only()), (64 << 10, false));
        let (mut a, mut b, mut c) = ([1u8; 512], [2u8; 1024], [3u8; 4096]);
        let written = [segment(&mut a), segment(&mut b), segment(&mut c)];
        assert!(disk.submit(7, Op::Write, 4096, &written));
        assert_eq!(completions(&mut disk), vec![Completion { tag: 7, result: Ok(5632) }]);

        let file = std::fs::read(&path).unwrap();
        assert!(file[..4096].iter().all(|&x| x == 0));
        assert!(file[4096..4608].iter().all(|&x| x == 1));
        assert!(file[4608..5632].iter().all(|&x| x == 2));
        assert!(file[5632..9728].iter().all(|&x| x == 3));
        assert!(file[9728..].iter().all(|&x| x == 0));

        // Read back with a different split, including an empty segment with no buffer.
        let (mut x, mut y) = ([0u8; 1000], [0u8; 4632]);
        let empty = Segment::EMPTY;
        assert!(disk.submit(8, Op::Read, 4096, &[segment(&mut x), empty, segment(&mut y)]));
        assert_eq!(completions(&mut disk), vec![Completion { tag: 8, result: Ok(5632) }]);
        let mut back = x.to_vec();
        back.extend_from_slice(&y);
        assert_eq!(&back[..], &file[4096..9728]);
    }

    /// Minor page faults this thread has taken so far.
    fn minor_faults() -> i64 {
        // SAFETY: getrusage fills the zeroed struct we own.
        unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            assert_eq!(libc::getrusage(libc::RUSAGE_THREAD, &mut usage), 0);
            usage.ru_minflt
        }
    }

    #[test]
    fn the_files_pages_are_mapped_at_open_and_its_holes_left_alone() {
        const PAGES: usize = 256;
        let path = shm_path();
        std::fs::write(&path, vec![0x11u8; PAGES * 4096]).unwrap();
        let mut disk = RamDisk::open(&path, false).unwrap();
        let mut page = [0x22u8; 4096];
        let mut done = Vec::with_capacity(1);
        let before = minor_faults();
        for n in 0..PAGES {
            assert!(disk.submit(0, Op::Write, (n * 4096) as u64, &[segment(&mut page)]));
            disk.poll(&mut |c| done.push(c));
            done.clear();
        }
        // Without populating, every page written faults once (256); a few faults of the
        // thread's own may remain.
        let faults = minor_faults() - before;
        assert!(faults < 16, "{faults} page faults writing {PAGES} pages of a mapped disk");
        assert!(std::fs::read(&path).unwrap().iter().all(|&x| x == 0x22));

        // A new disk is all holes: opening it allocates nothing.
        let sparse = shm_path();
        let _disk = RamDisk::create(&sparse, 64 << 20).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(&sparse).unwrap().blocks(), 0);
    }

    #[test]
    fn a_reopened_disk_sees_the_same_bytes() {
        let path = shm_path();
        let mut disk = RamDisk::create(&path, 8192).unwrap();
        let mut data = [0x5au8; 512];
        assert!(disk.submit(1, Op::Write, 7680, &[segment(&mut data)]));
        assert_eq!(completions(&mut disk)[0].result, Ok(512));
        let mut again = RamDisk::open(&path, true).unwrap();
        let mut back = [0u8; 512];
        assert!(again.submit(2, Op::Read, 7680, &[segment(&mut back)]));
        assert_eq!(completions(&mut again)[0].result, Ok(512));
        assert_eq!(back, data);
    }

    #[test]
    fn out_of_range_requests_fail_without_touching_memory() {
        let path = shm_path();
        let mut disk = RamDisk::create(&path, 4096).unwrap();
        let mut buf = [0u8; 512];
        for offset in [4096, 3800, u64::MAX - 10, u64::MAX] {
            assert!(disk.submit(1, Op::Read, offset, &[segment(&mut buf)]));
            assert_eq!(completions(&mut disk)[0].result, Err(IoError::OutOfRange), "offset {offset}");
        }
        // A length the guest claims but that has no memory behind it is never copied.
        // SAFETY: never dereferenced: the range check refuses it first (what this checks).
        let lie = unsafe { Segment::new(std::ptr::null_mut(), u32::MAX) };
        assert!(disk.submit(2, Op::Write, 0, &[lie, lie]));
        assert_eq!(completions(&mut disk)[0].result, Err(IoError::OutOfRange));
        let many = vec![segment(&mut buf[..1]); MAX_SEGMENTS + 1];
        assert!(disk.submit(3, Op::Read, 0, &many));
        assert_eq!(completions(&mut disk)[0].result, Err(IoError::OutOfRange));
    }

    #[test]
    fn read_only_disk_rejects_writes_but_flushes() {
        let path = shm_path();
        drop(RamDisk::create(&path, 4096).unwrap());
        let mut disk = RamDisk::open(&path, true).unwrap();
        assert!(disk.read_only());
        let mut buf = [9u8; 512];
        assert!(disk.submit(1, Op::Write, 0, &[segment(&mut buf)]));
        assert!(disk.submit(2, Op::Flush, 0, &[]));
        let expected =
            vec![Completion { tag: 1, result: Err(IoError::ReadOnly) }, Completion { tag: 2, result: Ok(0) }];
        assert_eq!(completions(&mut disk), expected);
        assert!(std::fs::read(&path).unwrap().iter().all(|&x| x == 0));
    }

    #[test]
    fn discard_and_write_zeroes_zero_their_range_only() {
        let path = shm_path();
        let mut disk = RamDisk::create(&path, 64 << 10).unwrap();
        assert!(disk.capabilities().discard && disk.capabilities().write_zeroes);
        let mut data = vec![0xa5u8; 64 << 10];
        assert!(disk.submit(1, Op::Write, 0, &[segment(&mut data)]));
        assert!(disk.submit(2, Op::WriteZeroes { len: 8192, unmap: false }, 4096, &[]));
        assert!(disk.submit(3, Op::Discard { len: 512 }, 20480, &[]));
        assert!(disk.submit(4, Op::Discard { len: 1024 }, (64 << 10) - 512, &[]));
        let results: Vec<_> = completions(&mut disk).iter().map(|c| c.result).collect();
        assert_eq!(results, [Ok(65536), Ok(0), Ok(0), Err(IoError::OutOfRange)]);
        let file = std::fs::read(&path).unwrap();
        let zero = |range: std::ops::Range<usize>| file[range].iter().all(|&x| x == 0);
        let kept = |range: std::ops::Range<usize>| file[range].iter().all(|&x| x == 0xa5);
        assert!(kept(0..4096) && zero(4096..12288) && kept(12288..20480));
        assert!(zero(20480..20992) && kept(20992..65536));
        drop(disk);
        let mut read_only = RamDisk::open(&path, true).unwrap();
        assert!(!read_only.capabilities().discard && !read_only.capabilities().write_zeroes);
        assert!(read_only.submit(5, Op::Discard { len: 512 }, 0, &[]));
        assert_eq!(completions(&mut read_only)[0].result, Err(IoError::ReadOnly));
    }

    #[test]
    fn submit_refuses_when_completions_are_not_polled() {
        let path = shm_path();
        let mut disk = RamDisk::create(&path, 4096).unwrap();
        for tag in 0..disk.max_in_flight() as u32 {
            assert!(disk.submit(tag, Op::Flush, 0, &[]));
        }
        assert!(!disk.submit(999, Op::Flush, 0, &[]), "full until polled");
        let tags: Vec<u32> = completions(&mut disk).iter().map(|c| c.tag).collect();
        assert_eq!(tags, (0..disk.max_in_flight() as u32).collect::<Vec<_>>());
        assert!(disk.submit(1000, Op::Flush, 0, &[]));
    }

    #[test]
    fn create_follows_no_symlink_and_takes_no_other_users_file() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"someone's data").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(matches!(RamDisk::create(&link, 4096), Err(BackendError::Open { .. })));
        assert_eq!(std::fs::read(&target).unwrap(), b"someone's data", "the link's target is untouched");
        let fifo = dir.path().join("fifo");
        let name = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo reads the NUL-terminated path only.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        assert!(matches!(RamDisk::create(&fifo, 4096), Err(BackendError::Open { .. })));
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&target, Some(65534), Some(65534)).unwrap();
            assert!(matches!(RamDisk::create(&target, 4096), Err(BackendError::Open { .. })));
            assert_eq!(
                std::fs::read(&target).unwrap(),
                b"someone's data",
                "another user's file is untouched"
            );
        }
        // A new file is its owner's alone.
        let new = dir.path().join("new");
        drop(RamDisk::create(&new, 4096).unwrap());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&new).unwrap().permissions().mode() & 0o7777, 0o600);
    }

    #[test]
    fn an_anonymous_disk_is_one_disk_across_its_mappings_and_no_file() {
        let mut disks = RamDisk::anonymous_queues(64 << 10, 2).unwrap();
        let mut data = [0x3cu8; 512];
        assert!(disks[0].submit(1, Op::Write, 8192, &[segment(&mut data)]));
        assert_eq!(completions(&mut disks[0])[0].result, Ok(512));
        let mut back = [0u8; 512];
        assert!(disks[1].submit(2, Op::Read, 8192, &[segment(&mut back)]));
        assert_eq!(completions(&mut disks[1])[0].result, Ok(512));
        assert_eq!(back, data);
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        assert!(maps.contains("/memfd:exitless-ram"), "{maps}");
    }

    #[test]
    fn bad_sizes_and_missing_files_are_clear_errors() {
        let path = shm_path();
        assert!(matches!(RamDisk::create(&path, 1000), Err(BackendError::BadSize { size: 1000 })));
        assert!(matches!(RamDisk::create(&path, 0), Err(BackendError::BadSize { size: 0 })));
        std::fs::write(&path, [0u8; 100]).unwrap();
        assert!(matches!(RamDisk::open(&path, false), Err(BackendError::TooSmall { .. })));
        let missing = RamDisk::open("/dev/shm/exitless-no-such-disk", false);
        assert!(matches!(missing, Err(BackendError::Open { .. })));
        // A size that is not whole sectors is rounded down.
        std::fs::write(&path, [0u8; 1500]).unwrap();
        assert_eq!(RamDisk::open(&path, false).unwrap().capacity(), 1024);
    }
}
