//! Test support for crates that drive backends: a disk that does not answer, how many of a
//! file's pages the host's page cache holds dirty, a Ceph cluster, and a program started in a
//! network namespace.

pub mod ceph;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `program`, in network namespace `netns` if one is named (`ip netns exec NS PROGRAM`, which
/// becomes the program: the child's PID is the program's).
pub fn command_in(netns: Option<&str>, program: impl AsRef<std::ffi::OsStr>) -> std::process::Command {
    match netns {
        None => std::process::Command::new(program),
        Some(ns) => {
            let mut ip = std::process::Command::new("ip");
            ip.args(["netns", "exec", ns]).arg(program);
            ip
        }
    }
}

/// A range of the caller's memory whose first touch stalls until [`Stall::release`] (or drop):
/// registered with userfaultfd, whose faults nobody answers. A request whose buffer is there is
/// one the disk does not finish (io_uring's worker waits in the fault, and cannot be
/// interrupted), as on a disk that stopped answering.
pub struct Stall {
    uffd: Option<OwnedFd>,
}

impl Stall {
    /// Stall `len` bytes at `addr`, page-aligned, of a private anonymous or shared memory
    /// mapping not yet touched there. Panics with the reason if the kernel refuses (a test
    /// helper).
    ///
    /// # Safety
    ///
    /// The range must be mapped, and stay mapped while the `Stall` lives.
    pub unsafe fn new(addr: *mut u8, len: usize) -> Stall {
        #[repr(C)]
        struct UffdioApi {
            api: u64,
            features: u64,
            ioctls: u64,
        }
        #[repr(C)]
        struct UffdioRegister {
            start: u64,
            len: u64,
            mode: u64,
            ioctls: u64,
        }
        // linux/userfaultfd.h
        const UFFD_API: u64 = 0xaa;
        const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
        const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
        const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
        // SAFETY: a plain system call; the result is a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
        let fd = i32::try_from(fd).ok().filter(|&fd| fd >= 0);
        let fd = fd.unwrap_or_else(|| panic!("userfaultfd: {}", std::io::Error::last_os_error()));
        // SAFETY: a descriptor just created and owned by nobody else.
        let uffd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut api = UffdioApi { api: UFFD_API, features: 0, ioctls: 0 };
        // SAFETY: UFFDIO_API reads and writes a uffdio_api, which `api` is.
        let rc = unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_API, &mut api) };
        assert_eq!(rc, 0, "UFFDIO_API: {}", std::io::Error::last_os_error());
        let mut register = UffdioRegister {
            start: addr as u64,
            len: len as u64,
            mode: UFFDIO_REGISTER_MODE_MISSING,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER reads and writes a uffdio_register; the range is the caller's
        // mapping (see the contract).
        let rc = unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_REGISTER, &mut register) };
        assert_eq!(rc, 0, "UFFDIO_REGISTER: {}", std::io::Error::last_os_error());
        Stall { uffd: Some(uffd) }
    }

    /// Let stalled accesses go on (closing the userfaultfd unregisters the range).
    pub fn release(&mut self) {
        self.uffd = None;
    }
}

/// Dirty and under-writeback pages of the bytes `range` of the file at `path` in the host's page
/// cache (`0..0`: all of it), by the cachestat system call (Linux 6.5 and later). Panics with
/// the reason if the file cannot be opened or the kernel lacks the call (a test helper).
pub fn dirty_pages(path: &std::path::Path, range: std::ops::Range<u64>) -> u64 {
    #[repr(C)]
    struct Range {
        offset: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Cachestat {
        cache: u64,
        dirty: u64,
        writeback: u64,
        evicted: u64,
        recently_evicted: u64,
    }
    const SYS_CACHESTAT: libc::c_long = 451;
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // A length of 0 reaches the end of the file.
    let range = Range { offset: range.start, len: range.end.saturating_sub(range.start) };
    let mut stat = Cachestat::default();
    // SAFETY: cachestat reads `range` and writes `stat`, both live for the call; the fd is open.
    let rc = unsafe { libc::syscall(SYS_CACHESTAT, file.as_raw_fd(), &range, &mut stat, 0) };
    assert_eq!(rc, 0, "cachestat (Linux 6.5 or later): {}", std::io::Error::last_os_error());
    stat.dirty + stat.writeback
}

/// A FileDisk (1 MiB, 8 requests deep) whose reads wait until someone writes to the returned
/// pipe: a disk that holds a read until told to, whose held reads `Backend::cancel_all` ends
/// (with ECANCELED: io_uring parks a read of a pipe on its poll queue, where a cancel finds it).
/// Panics with the reason if the kernel refuses (a test helper).
pub fn disk_on_a_pipe() -> (crate::FileDisk, std::fs::File) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors, which the Files below then own.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0, "pipe2");
    // SAFETY: both are open descriptors nobody else owns.
    let (read_end, write_end) =
        unsafe { (std::fs::File::from_raw_fd(fds[0]), std::fs::File::from_raw_fd(fds[1])) };
    (crate::FileDisk::on_pipe(read_end).expect("an io_uring for the pipe disk"), write_end)
}
