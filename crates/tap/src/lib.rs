//! A Linux tap interface as a network backend: Ethernet frames in and out through a
//! non-blocking file descriptor ([`AsRawFd`]), one frame per read or write.
//!
//! The tap is opened (or created, if no interface has the name) through /dev/net/tun, in the
//! caller's network namespace or in a named one (`ip netns add NAME` makes
//! /run/netns/NAME). The frames carry no packet-information prefix and no virtio-net header.

#![deny(missing_docs)]

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use thiserror::Error;

const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
/// _IOW('T', 202, int)
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
/// The longest interface name Linux accepts (IFNAMSIZ less the NUL).
pub const MAX_NAME_LEN: usize = 15;

/// Why [`Tap::open`] failed; nothing is left open.
#[derive(Debug, Error)]
pub enum TapError {
    /// The name (given) is empty, too long, or has a character exitless refuses in one; checked
    /// before any system call.
    #[error("tap name `{0}` must be 1 to {MAX_NAME_LEN} characters without '/', whitespace or NUL")]
    BadName(String),
    /// /dev/net/tun could not be opened.
    #[error("cannot open /dev/net/tun: {0} (is the tun module loaded, and are we root or CAP_NET_ADMIN?)")]
    OpenTun(#[source] io::Error),
    /// TUNSETIFF refused the name: taken by another kind of interface, or a tap we may not use.
    #[error("cannot attach to tap {name}: {source} (is `{name}` a tap owned by someone else, or a non-tap interface?)")]
    Attach {
        /// The tap's name.
        name: String,
        /// TUNSETIFF's error.
        source: io::Error,
    },
    /// The tap is attached but could not be brought up (SIOCGIFFLAGS, SIOCSIFFLAGS).
    #[error("cannot bring tap {name} up: {source}")]
    Up {
        /// The tap's name.
        name: String,
        /// The socket or ioctl error.
        source: io::Error,
    },
    /// The network namespace's file (/run/netns/NAME) could not be opened or entered.
    #[error("cannot enter network namespace {name}: {source} (create it first: `ip netns add {name}`)")]
    Netns {
        /// The namespace's name.
        name: String,
        /// The open or setns error.
        source: io::Error,
    },
    /// The thread that enters the namespace (given) panicked.
    #[error("the thread that opens the tap in namespace {0} failed")]
    Thread(String),
}

/// An open tap interface.
#[derive(Debug)]
pub struct Tap {
    fd: OwnedFd,
    name: String,
}

impl Tap {
    /// Open tap `name` (creating it if it does not exist) in namespace `netns`, or in ours, and
    /// bring it up.
    pub fn open(name: &str, netns: Option<&str>) -> Result<Tap, TapError> {
        if name.is_empty()
            || name.len() > MAX_NAME_LEN
            || name.contains(['/', '\0'])
            || name.contains(char::is_whitespace)
        {
            return Err(TapError::BadName(name.to_string()));
        }
        let Some(netns) = netns else { return open_here(name) };
        // setns changes the calling thread's namespace: do it on a thread of its own. The file
        // descriptor keeps working from any namespace afterwards.
        let (name, netns) = (name.to_string(), netns.to_string());
        let thread_netns = netns.clone();
        std::thread::spawn(move || {
            enter_netns(&thread_netns)?;
            open_here(&name)
        })
        .join()
        .map_err(|_| TapError::Thread(netns))?
    }

    /// The interface's name, as given to [`Tap::open`].
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

fn open_here(name: &str) -> Result<Tap, TapError> {
    let path = c"/dev/net/tun";
    // SAFETY: a NUL-terminated path; the result is checked.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(TapError::OpenTun(io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut request = ifreq(name);
    // ifr_flags is the union member TUNSETIFF reads.
    request.ifr_ifru.ifru_flags = IFF_TAP | IFF_NO_PI;
    // SAFETY: TUNSETIFF reads and writes a struct ifreq, which `request` is.
    if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF as _, &mut request) } < 0 {
        return Err(TapError::Attach { name: name.into(), source: io::Error::last_os_error() });
    }
    bring_up(name).map_err(|source| TapError::Up { name: name.into(), source })?;
    Ok(Tap { fd, name: name.to_string() })
}

fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain data; all zeroes is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request.ifr_name.iter_mut().zip(name.bytes()) {
        *slot = byte as libc::c_char;
    }
    request
}

fn bring_up(name: &str) -> io::Result<()> {
    // SAFETY: plain socket creation; checked.
    let socket = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if socket < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just created and owned by nothing else.
    let socket = unsafe { OwnedFd::from_raw_fd(socket) };
    let mut request = ifreq(name);
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write a struct ifreq; the flags member is the
    // union member they use.
    unsafe {
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut request) < 0 {
            return Err(io::Error::last_os_error());
        }
        request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS as _, &request) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn enter_netns(name: &str) -> Result<(), TapError> {
    let netns_error = |source| TapError::Netns { name: name.to_string(), source };
    if name.is_empty() || name.contains(['/', '\0']) {
        return Err(netns_error(io::Error::from_raw_os_error(libc::EINVAL)));
    }
    let file = File::open(format!("/run/netns/{name}")).map_err(netns_error)?;
    // SAFETY: setns on an open namespace file; affects only this thread.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } < 0 {
        return Err(netns_error(io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
