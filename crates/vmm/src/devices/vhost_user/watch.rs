//! The thread that watches a vhost-user device while the VM runs: the rings' error eventfd (the
//! daemon found a ring broken) and the connection (the daemon went away).
//!
//! When the daemon goes away, the watcher connects to whichever daemon listens on the socket
//! next, for up to the device's `reconnect` time (every 10 ms), and sets it up as the old one
//! was ([`super::link`]); the guest's requests wait meanwhile, and those the old daemon had not
//! answered are served by the new one. A ring error, or no daemon in time, shows the device as
//! DEVICE_NEEDS_RESET with a configuration-change interrupt, and the host logs one line; the
//! guest's driver sees a device error or, polling, no completion (its own timeout).

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
    /// The connection, which the watcher replaces when the daemon restarts.
    pub link: Arc<super::link::Link>,
    /// What the first daemon offered: a new one must offer the same.
    pub offer: super::link::Offer,
    /// How long to wait for a new daemon (`VhostUserDisk::reconnect`, `VhostUserNic::reconnect`).
    pub reconnect: Duration,
}

impl Shared {
    /// Tell the driver the device failed (if it runs) and log `why` once; otherwise just log.
    fn fail(&self, why: &str) {
        let signals = self.signals.lock().unwrap_or_else(|p| p.into_inner());
        match signals.as_ref() {
            Some(signals) => signals.backend_failed(why),
            None => log::warn!("vhost-user {} {}: {why}", self.link.what(), self.path),
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
                log::error!("vhost-user {} {}: {e}", shared.link.what(), shared.path);
                return;
            }
            watch(socket, &err, &stop_fd, &shared);
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

/// How often the watcher tries to connect to a new daemon.
const RECONNECT_INTERVAL: Duration = Duration::from_millis(10);

fn watch(mut socket: OwnedFd, err: &EventFd, stop: &EventFd, shared: &Shared) {
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
                "vhost-user {} {}: cannot watch the daemon: {}",
                shared.link.what(),
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
            match reconnect(stop, shared) {
                Some(next) => {
                    socket = next;
                    fds[2].fd = socket.as_raw_fd();
                    shared.info.daemon_gone.store(false, Ordering::Release);
                    shared.info.reconnections.fetch_add(1, Ordering::Relaxed);
                }
                None => fds[2].fd = -1,
            }
        }
    }
}

/// Connect to the next daemon on the socket within `shared.reconnect`, or fail the device.
/// Returns the new connection to watch; `None` also when told to stop.
fn reconnect(stop: &EventFd, shared: &Shared) -> Option<OwnedFd> {
    let limit = shared.reconnect;
    if limit.is_zero() {
        shared.fail("the vhost-user daemon closed the connection (did it stop?)");
        return None;
    }
    log::warn!(
        "vhost-user {} {}: the vhost-user daemon closed the connection; waiting up to {} s for the next one",
        shared.link.what(),
        shared.path,
        limit.as_secs_f64()
    );
    let started = Instant::now();
    loop {
        let why = match shared.link.reconnect(&shared.offer) {
            Ok((stream, resumed)) => {
                let ring =
                    resumed.map_or(String::new(), |base| format!(", its ring resumed at used index {base}"));
                log::warn!(
                    "vhost-user {} {}: reconnected to a daemon after {} ms{ring}",
                    shared.link.what(),
                    shared.path,
                    started.elapsed().as_millis()
                );
                return Some(stream.into());
            }
            Err(e) => e,
        };
        if started.elapsed() >= limit {
            shared.fail(&format!(
                "the vhost-user daemon closed the connection and none took over within {} s ({why})",
                limit.as_secs_f64()
            ));
            return None;
        }
        let mut wait = [libc::pollfd { fd: stop.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        let ms = RECONNECT_INTERVAL.as_millis() as libc::c_int;
        // SAFETY: one valid pollfd; poll writes only its `revents`.
        if unsafe { libc::poll(wait.as_mut_ptr(), 1, ms) } > 0 {
            return None;
        }
    }
}
