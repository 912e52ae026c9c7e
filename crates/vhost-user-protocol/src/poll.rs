//! Waiting on a few descriptors at once (the socket, the listener, the stop signal, a memory
//! fault, a hand-over request), with a time limit.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

/// The most descriptors one wait watches.
const MAX_FDS: usize = 5;

/// Wait until one of `fds` (descriptor, poll events) is ready, or until `timeout` has passed
/// (`None`: no limit). Returns the index of the first ready descriptor, in the order given (so
/// callers list what matters most first), or `None` on timeout. A descriptor that hung up or
/// failed counts as ready.
pub fn first_ready(fds: &[(BorrowedFd, i16)], timeout: Option<Duration>) -> io::Result<Option<usize>> {
    assert!(fds.len() <= MAX_FDS, "first_ready watches at most {MAX_FDS} descriptors");
    let mut pollfds = [libc::pollfd { fd: -1, events: 0, revents: 0 }; MAX_FDS];
    for (pollfd, (fd, events)) in pollfds.iter_mut().zip(fds) {
        pollfd.fd = fd.as_raw_fd();
        pollfd.events = *events;
    }
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let ms = match deadline {
            None => -1,
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                // Round up: a wait of 0 ms for 0.5 ms left would spin.
                i32::try_from(left.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
            }
        };
        // SAFETY: `pollfds` holds MAX_FDS valid pollfds (unused ones have fd -1, which poll
        // ignores); poll writes only their `revents`.
        let n = unsafe { libc::poll(pollfds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        if n == 0 {
            return Ok(None);
        }
        return Ok(pollfds[..fds.len()].iter().position(|p| p.revents != 0));
    }
}
