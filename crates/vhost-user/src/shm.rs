//! A shared mapping of memory a frontend hands over (the in-flight region, the dirty log),
//! unmapped when dropped.

use std::os::fd::{AsRawFd, OwnedFd};

/// `len` bytes of a file mapped shared, readable and writable.
pub(crate) struct SharedMapping {
    addr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned by this value until it drops; its users access it only
// atomically (others write it concurrently), so any thread may hold it.
unsafe impl Send for SharedMapping {}
// SAFETY: as above: nothing reachable through `&SharedMapping` is accessed non-atomically.
unsafe impl Sync for SharedMapping {}

impl SharedMapping {
    /// Map `len` bytes of `fd` from `offset`; the kernel checks the range.
    pub(crate) fn map(fd: &OwnedFd, len: usize, offset: libc::off_t) -> std::io::Result<SharedMapping> {
        // SAFETY: a new shared mapping of a descriptor we hold; the kernel checks the range.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(SharedMapping { addr: addr.cast(), len })
    }

    /// Where it starts.
    pub(crate) fn addr(&self) -> *mut u8 {
        self.addr
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for SharedMapping {
    fn drop(&mut self) {
        // SAFETY: `addr`/`len` are the mapping made in `map`; its owners hand out pointers into
        // it only to values that keep them (and so it) alive.
        unsafe { libc::munmap(self.addr.cast(), self.len) };
    }
}
