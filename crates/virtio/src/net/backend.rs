//! Where a virtio-net device's frames go: a non-blocking file descriptor that moves one
//! Ethernet frame per read or write (a tap; in tests, a datagram socket).

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;

/// A virtio-net device's link to the host: the default methods `readv` and `writev` the file
/// descriptor, which must be non-blocking and carry one frame per call, as a tap and a datagram
/// socket do. The worker owns it while the device runs.
pub trait NetBackend: Send + AsRawFd {
    /// Read one waiting frame, scattered over `parts`; `Ok(None)` if none is waiting. A frame
    /// longer than `parts` is cut short: the count says how much of `parts` it filled.
    fn read_frame(&mut self, parts: &mut [libc::iovec]) -> io::Result<Option<usize>> {
        let count =
            libc::c_int::try_from(parts.len()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: the caller's iovecs describe writable memory it owns for the call's duration.
        let n = unsafe { libc::readv(self.as_raw_fd(), parts.as_ptr(), count) };
        if let Ok(n) = usize::try_from(n) {
            return Ok(Some(n));
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::EAGAIN) => Ok(None),
            _ => Err(error),
        }
    }

    /// Send one frame gathered from `parts`.
    fn write_frame(&mut self, parts: &[libc::iovec]) -> io::Result<usize> {
        let count =
            libc::c_int::try_from(parts.len()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: the caller's iovecs describe readable memory it owns for the call's duration.
        let n = unsafe { libc::writev(self.as_raw_fd(), parts.as_ptr(), count) };
        usize::try_from(n).map_err(|_| io::Error::last_os_error())
    }
}

impl NetBackend for tap::Tap {}

/// A datagram socket carries one frame per datagram, like a tap (set it non-blocking).
impl NetBackend for UnixDatagram {}
