//! The thread that watches a vhost-user disk while the VM runs: the ring's error eventfd (the
//! daemon found the ring broken) and the connection (the daemon went away). Either way the
//! device shows DEVICE_NEEDS_RESET with a configuration-change interrupt and the host logs one
//! line; the guest's driver sees a device error or, polling, no completion (its own timeout).

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use sandbox::Filter;
use virtio::DeviceSignals;
use vmm_sys_util::eventfd::EventFd;

/// What the device and its watcher share.
pub struct Shared {
    /// The socket, for log lines.
    pub path: String,
    /// The running device's signals (between activation and reset).
    pub signals: Mutex<Option<DeviceSignals>>,
    /// Where the watcher notes that the daemon closed the connection.
    pub info: Arc<super::VhostUserInfo>,
}

impl Shared {
    /// Tell the driver the device failed (if it runs) and log `why` once; otherwise just log.
    fn fail(&self, why: &str) {
        let signals = self.signals.lock().unwrap_or_else(|p| p.into_inner());
        match signals.as_ref() {
            Some(signals) => signals.backend_failed(why),
            None => log::warn!("vhost-user disk {}: {why}", self.path),
        }
    }
}

/// The watcher thread; stopped and joined when dropped.
pub struct Watcher {
    stop: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    /// Watch `socket` (a duplicate of the connection) for a hang-up and `err` for ring errors,
    /// confined by `filter`.
    pub fn spawn(
        socket: OwnedFd,
        err: Arc<EventFd>,
        shared: Arc<Shared>,
        filter: Filter,
    ) -> std::io::Result<Watcher> {
        let stop = Arc::new(EventFd::new(libc::EFD_NONBLOCK)?);
        let stop_fd = stop.clone();
        let thread = std::thread::Builder::new().name("vhost-user-watch".into()).spawn(move || {
            if let Err(e) = filter.install() {
                log::error!("vhost-user disk {}: {e}", shared.path);
                return;
            }
            watch(&socket, &err, &stop_fd, &shared);
        })?;
        Ok(Watcher { stop, thread: Some(thread) })
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.stop.write(1);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn watch(socket: &OwnedFd, err: &EventFd, stop: &EventFd, shared: &Shared) {
    let mut fds = [
        libc::pollfd { fd: stop.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: err.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: socket.as_raw_fd(), events: libc::POLLRDHUP, revents: 0 },
    ];
    loop {
        // SAFETY: `fds` holds three valid pollfds (a negative fd is ignored by poll); poll
        // writes only their `revents`.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            log::error!(
                "vhost-user disk {}: cannot watch the daemon: {}",
                shared.path,
                std::io::Error::last_os_error()
            );
            return;
        }
        if fds[0].revents != 0 {
            return;
        }
        if fds[1].revents != 0 {
            // Drained; fails only if another read got there first.
            let _ = err.read();
            shared.fail("the vhost-user daemon reported an error on the ring (its error eventfd)");
        }
        if fds[2].revents != 0 {
            shared.info.daemon_gone.store(true, Ordering::Release);
            fds[2].fd = -1;
            shared.fail("the vhost-user daemon closed the connection (did it stop?)");
        }
    }
}
