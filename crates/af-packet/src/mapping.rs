//! The rings' shared mapping, unmapped when dropped.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;

/// `len` bytes of a socket's rings mapped shared into our memory.
pub(crate) struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

impl Mapping {
    /// Map the first `len` bytes of `socket`'s rings.
    pub(crate) fn of(socket: &OwnedFd, len: usize) -> io::Result<Mapping> {
        // SAFETY: a new shared mapping of the socket's rings at an address the kernel picks; it
        // aliases no Rust object.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                socket.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(base.cast()).ok_or_else(|| io::Error::from(io::ErrorKind::InvalidData))?;
        Ok(Mapping { base, len })
    }

    /// The address `offset` bytes in.
    pub(crate) fn at(&self, offset: usize) -> *mut u8 {
        assert!(offset < self.len, "offset {offset} is past the {}-byte ring mapping", self.len);
        // SAFETY: in bounds, checked above.
        unsafe { self.base.as_ptr().add(offset) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `of`, unmapped once; the slices lent from it do not outlive
        // the ring that owns this.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}
