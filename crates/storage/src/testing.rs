//! Test support for crates that drive backends: a disk that does not answer.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

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
