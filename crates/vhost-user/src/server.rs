//! The listening socket: one frontend at a time, each connection a [`Session`]. A connection
//! ends when the frontend closes it, or when it sends a message the backend refuses (logged on
//! one line, answered with a failure where the frontend asked for acknowledgements); either way
//! the session's rings stop, their backends go back to the device, and the next frontend is
//! accepted.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::backend::VhostUserBlk;
use crate::error::Error;
use crate::log;
use crate::message::{recv_raw, request_name, send_reply, Message, FLAG_NEED_REPLY};

/// How long a frontend may pause in the middle of a message.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(5);

/// How a connection ended.
#[derive(Debug)]
pub enum Ending {
    /// The frontend closed it.
    Closed,
    /// The stop descriptor became readable.
    Stopped,
    /// A message was refused (or the socket failed); the connection was closed. `request`
    /// names the message, when its header was read and its code is known.
    Refused { request: Option<&'static str>, error: Error },
}

pub struct Server {
    listener: UnixListener,
    path: PathBuf,
}

impl Server {
    /// Listen on `path`. A socket file left there by a server that is gone is replaced; any
    /// other file, or a socket a live server answers on, is an error.
    pub fn bind(path: impl AsRef<Path>) -> Result<Server, Error> {
        let path = path.as_ref();
        let shown = || path.display().to_string();
        match std::fs::symlink_metadata(path) {
            Ok(meta) if !meta.file_type().is_socket() => return Err(Error::NotASocket { path: shown() }),
            Ok(_) => {
                if UnixStream::connect(path).is_ok() {
                    return Err(Error::SocketInUse { path: shown() });
                }
                std::fs::remove_file(path).map_err(|source| Error::Listen { path: shown(), source })?;
            }
            Err(_) => {}
        }
        let listener = UnixListener::bind(path).map_err(|source| Error::Listen { path: shown(), source })?;
        Ok(Server { listener, path: path.to_path_buf() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serve frontends one after another until `stop` (if given) becomes readable. Each
    /// connection's end is logged on standard error.
    pub fn serve(&self, device: &mut VhostUserBlk, stop: Option<BorrowedFd>) -> Result<(), Error> {
        loop {
            if wait(self.listener.as_fd(), stop).map_err(|source| self.listen_error(source))? == Ready::Stop {
                return Ok(());
            }
            let stream = match self.listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log(format_args!("cannot accept a frontend: {e}"));
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            match peer_pid(&stream) {
                Some(pid) => log(format_args!("frontend connected (pid {pid})")),
                None => log(format_args!("frontend connected")),
            }
            match serve_connection(&stream, device, stop) {
                Ending::Closed => log(format_args!("frontend disconnected; waiting for the next one")),
                Ending::Refused { request, error } => log(format_args!(
                    "refused {}: {error}; connection closed, waiting for the next frontend",
                    request.unwrap_or("a message")
                )),
                Ending::Stopped => return Ok(()),
            }
        }
    }

    fn listen_error(&self, source: io::Error) -> Error {
        Error::Listen { path: self.path.display().to_string(), source }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The connected process's pid (SO_PEERCRED), for the log.
fn peer_pid(stream: &UnixStream) -> Option<i32> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills a ucred of `len` bytes at a valid pointer.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0 && cred.pid > 0).then_some(cred.pid)
}

#[derive(PartialEq, Eq)]
enum Ready {
    Fd,
    Stop,
}

/// Wait until `fd` is readable (or hung up), or `stop` is.
fn wait(fd: BorrowedFd, stop: Option<BorrowedFd>) -> io::Result<Ready> {
    let mut fds = [
        libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: stop.map_or(-1, |s| s.as_raw_fd()), events: libc::POLLIN, revents: 0 },
    ];
    loop {
        // SAFETY: two valid pollfds (a negative fd is ignored by poll).
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        if fds[1].revents != 0 {
            return Ok(Ready::Stop);
        }
        if fds[0].revents != 0 {
            return Ok(Ready::Fd);
        }
    }
}

/// Serve one frontend on `stream` until it closes, a message is refused, or `stop` fires.
pub fn serve_connection(stream: &UnixStream, device: &mut VhostUserBlk, stop: Option<BorrowedFd>) -> Ending {
    let mut session = device.session();
    loop {
        match wait(stream.as_fd(), stop) {
            Ok(Ready::Stop) => return Ending::Stopped,
            Ok(Ready::Fd) => {}
            Err(e) => return Ending::Refused { request: None, error: Error::Read(e) },
        }
        let (header, payload, fds) = match recv_raw(stream, STALL_TIMEOUT) {
            Ok(Some(parts)) => parts,
            Ok(None) => return Ending::Closed,
            Err(error) => return Ending::Refused { request: None, error },
        };
        let request = request_name(header.request);
        let wants_ack = header.flags & FLAG_NEED_REPLY != 0;
        let result = Message::parse(header, &payload, fds).and_then(|message| {
            let has_reply = message.request.has_reply();
            session.handle(message).map(|reply| (reply, has_reply))
        });
        let ack = wants_ack && session.reply_ack();
        match result {
            Ok((Some(reply), _)) => {
                if let Err(error) = send_reply(stream, header.request, &reply) {
                    return Ending::Refused { request, error };
                }
            }
            Ok((None, has_reply)) => {
                if ack && !has_reply {
                    if let Err(error) = send_reply(stream, header.request, &0u64.to_le_bytes()) {
                        return Ending::Refused { request, error };
                    }
                }
            }
            Err(error) => {
                // A failure acknowledgement first, so the frontend's own log says why.
                if ack && request.is_some() {
                    let _ = send_reply(stream, header.request, &1u64.to_le_bytes());
                }
                return Ending::Refused { request, error };
            }
        }
    }
}
