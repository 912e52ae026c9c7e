//! How the daemon stops: SIGINT and SIGTERM through a signalfd every thread can poll, and a
//! watchdog that ends the process if an orderly stop takes too long; and the eventfd that wakes
//! the control thread for the API.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

use sandbox::Filter;

/// How long stopping may take before the daemon exits without finishing: every write a
/// frontend saw completed is in the disk already (RAM disk pages are in /dev/shm, file writes
/// in the page cache or, after FLUSH, on the disk), so an orderly stop only tidies up.
const STOP_GRACE: Duration = Duration::from_millis(1500);

/// Exit (status 0) STOP_GRACE after SIGINT/SIGTERM arrives, if the orderly stop has not ended
/// the process by then: a watchdog thread that polls the same signalfd (the signal stays
/// pending on it, so the server sees it too).
pub fn exit_after_stop_grace(stop: &OwnedFd, filter: Filter) -> std::io::Result<()> {
    let stop = stop.try_clone()?;
    std::thread::Builder::new().name("stop-watchdog".into()).spawn(move || {
        if let Err(e) = filter.install() {
            log::error!("{e}; stopping");
            std::process::exit(1);
        }
        let mut pollfd = libc::pollfd { fd: stop.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd; waits without limit (EINTR cannot happen: the signals this
        // process handles are blocked and come through the signalfd).
        while unsafe { libc::poll(&mut pollfd, 1, -1) } <= 0 {}
        std::thread::sleep(STOP_GRACE);
        log::warn!("stopping took more than {} ms; exiting without waiting further", STOP_GRACE.as_millis());
        std::process::exit(0);
    })?;
    Ok(())
}

/// Block SIGINT and SIGTERM and return a signalfd that becomes readable when one arrives.
pub fn stop_signals() -> std::io::Result<OwnedFd> {
    // SAFETY: sigset_t is plain data initialised by sigemptyset before use; pthread_sigmask and
    // signalfd read it; the returned descriptor is checked and then owned.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// What woke a control thread ([`wait_for_control`]).
pub enum Woken {
    /// SIGINT or SIGTERM.
    Stop,
    /// The descriptor at this index of those given became readable.
    Ready(usize),
    /// The time limit passed.
    Timeout,
}

/// Wait for the stop signal (`stop`, the signalfd), one of `others` (those given) to become
/// readable, or `limit`.
pub fn wait_for_control(stop: &OwnedFd, others: &[Option<BorrowedFd>], limit: Option<Duration>) -> Woken {
    const MAX: usize = 4;
    let ms = limit.map_or(-1, |l| i32::try_from(l.as_millis() + 1).unwrap_or(i32::MAX));
    let mut fds = [libc::pollfd { fd: -1, events: libc::POLLIN, revents: 0 }; MAX + 1];
    fds[0].fd = stop.as_raw_fd();
    for (slot, fd) in fds[1..].iter_mut().zip(others.iter().take(MAX)) {
        // A negative descriptor is ignored by poll.
        slot.fd = fd.map_or(-1, |fd| fd.as_raw_fd());
    }
    let count = others.len().min(MAX) + 1;
    // SAFETY: `count` valid pollfds; poll writes only their `revents`.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), count as libc::nfds_t, ms) };
    // An error (EINTR cannot happen: the handled signals come through the signalfd) counts as
    // the stop, so the daemon never spins on it.
    if n < 0 || fds[0].revents != 0 {
        return Woken::Stop;
    }
    match fds[1..count].iter().position(|fd| fd.revents != 0) {
        Some(index) => Woken::Ready(index),
        None => Woken::Timeout,
    }
}
