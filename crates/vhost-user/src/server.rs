//! The listening socket of one disk: one frontend at a time, each connection a [`Session`]. A
//! daemon serving several disks runs one `Server` per disk, each on its own thread, so a
//! frontend that stalls, misbehaves or goes away holds up only its own disk's set-up; their
//! rings share the IOCores. A connection
//! ends when the frontend closes it, when it sends a message the backend refuses (logged on one
//! line, answered with a failure where the frontend asked for acknowledgements), when it has not
//! negotiated its features within [`SETUP_TIMEOUT`], stalls inside a message or leaves its
//! replies unread for [`STALL_TIMEOUT`], or when its memory shrinks under us; either way the
//! session's rings stop, their backends go back to the device, and the next frontend is
//! accepted. A frontend that connects while another is being served is refused at once (its
//! connection closed, the reason logged), so nobody waits behind an idle frontend. Every wait
//! also watches the stop descriptor, so stopping never waits for a frontend.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vhost_user_protocol::message::{has_own_reply, request_name, Message, Wire, FLAG_NEED_REPLY};
use vhost_user_protocol::poll::first_ready;
use vhost_user_protocol::Error as ProtocolError;

use crate::backend::{Session, VhostUserBlk};
use crate::error::Error;

/// How long a frontend may pause in the middle of a message, or leave its replies unread.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a new frontend has to negotiate its features. QEMU does it as it connects; the
/// margin is for a QEMU still starting on a loaded host.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(10);

/// How a connection ended.
#[derive(Debug)]
pub enum Ending {
    /// The frontend closed it.
    Closed,
    /// The stop descriptor became readable.
    Stopped,
    /// A message was refused, the socket failed, the frontend broke a time limit or its memory
    /// shrank; the connection was closed. `request` names the message, when its header was
    /// read and its code is known.
    Refused {
        /// The refused message's request name; `None` when no known request was read.
        request: Option<&'static str>,
        /// Why the connection ended.
        error: Error,
    },
}

/// One disk's vhost-user socket, listening; the socket file is removed when it is dropped.
pub struct Server {
    listener: UnixListener,
    path: PathBuf,
    /// Is a frontend being served? Shared with whoever asks ([`Server::frontend_connected`]).
    frontend: Arc<AtomicBool>,
}

impl Server {
    /// Listen on `path`. A socket file left there by a server that is gone is replaced; any
    /// other file, or a socket a live server answers on, is an error.
    pub fn bind(path: impl AsRef<Path>) -> Result<Server, Error> {
        let path = path.as_ref();
        let listener = listen(path)?;
        Ok(Server { listener, path: path.to_path_buf(), frontend: Arc::new(AtomicBool::new(false)) })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A flag that is set while a frontend is served, for other threads to read.
    pub fn frontend_connected(&self) -> Arc<AtomicBool> {
        self.frontend.clone()
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
                    log::error!("cannot accept a frontend: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            log::info!("{}: frontend connected{}", self.path.display(), pid_note(&stream));
            // Replies must never block the server: a frontend that does not read them is
            // waited for (with the stop descriptor) for at most STALL_TIMEOUT.
            if let Err(e) = stream.set_nonblocking(true) {
                log::error!("cannot make the frontend's socket non-blocking: {e}; connection closed");
                continue;
            }
            self.frontend.store(true, Ordering::Release);
            let ending = self.serve_connection(&stream, device, stop);
            self.frontend.store(false, Ordering::Release);
            match ending {
                Ending::Closed => {
                    log::info!("{}: frontend disconnected; waiting for the next one", self.path.display())
                }
                Ending::Refused { request: Some(request), error } => log::warn!(
                    "{}: refused {request}: {error}; connection closed, waiting for the next frontend",
                    self.path.display()
                ),
                Ending::Refused { request: None, error } => log::warn!(
                    "{}: {error}; connection closed, waiting for the next frontend",
                    self.path.display()
                ),
                Ending::Stopped => return Ok(()),
            }
        }
    }

    fn listen_error(&self, source: io::Error) -> Error {
        Error::Listen { path: self.path.display().to_string(), source }
    }

    /// Serve one frontend on `stream` until it closes, a message is refused, it breaks a time
    /// limit, its memory shrinks, or `stop` fires.
    fn serve_connection(
        &self,
        stream: &UnixStream,
        device: &mut VhostUserBlk,
        stop: Option<BorrowedFd>,
    ) -> Ending {
        let connected = Instant::now();
        let wire = Wire::new(stream, STALL_TIMEOUT).with_stop(stop);
        let mut session = device.session();
        loop {
            let setup_left = (!session.set_up()).then(|| SETUP_TIMEOUT.saturating_sub(connected.elapsed()));
            match wait_connection(stream, self.listener.as_fd(), stop, session.memory_fault(), setup_left) {
                Ok(Some(Event::Stop)) => return Ending::Stopped,
                Ok(Some(Event::MemoryFault)) => {
                    return Ending::Refused { request: None, error: session.memory_shrank() };
                }
                Ok(Some(Event::Message)) => {
                    if let Some(ending) = serve_message(&wire, &mut session) {
                        return ending;
                    }
                }
                Ok(Some(Event::Another)) => self.refuse_another(),
                Ok(None) => {
                    let error = Error::SetupTimeout(SETUP_TIMEOUT.as_secs());
                    return Ending::Refused { request: None, error };
                }
                Err(e) => return Ending::Refused { request: None, error: ProtocolError::Read(e).into() },
            }
        }
    }

    /// Accept a frontend that connected while another is served, and close its connection.
    fn refuse_another(&self) {
        match self.listener.accept() {
            Ok((stream, _)) => log::warn!(
                "{}: refused a frontend{}: another frontend is connected to this disk",
                self.path.display(),
                pid_note(&stream)
            ),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                log::error!("cannot accept a frontend: {e}");
                // Out of descriptors, say: the listener stays readable; do not spin on it.
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Listen on the Unix socket `path`. A socket file left there by a server that is gone is
/// replaced; any other file, or a socket a live server answers on, is an error.
pub fn listen(path: &Path) -> Result<UnixListener, Error> {
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
    UnixListener::bind(path).map_err(|source| Error::Listen { path: shown(), source })
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// " (pid N)" for the connected process (SO_PEERCRED), or nothing, for the log.
fn pid_note(stream: &UnixStream) -> String {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let Ok(mut len) = libc::socklen_t::try_from(std::mem::size_of::<libc::ucred>()) else {
        return String::new();
    };
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
    if rc == 0 && cred.pid > 0 {
        format!(" (pid {})", cred.pid)
    } else {
        String::new()
    }
}

#[derive(PartialEq, Eq)]
enum Ready {
    Fd,
    Stop,
}

/// Wait until `fd` is readable (or hung up), or `stop` is.
fn wait(fd: BorrowedFd, stop: Option<BorrowedFd>) -> io::Result<Ready> {
    let fd = (fd, libc::POLLIN);
    match stop {
        Some(stop) => match first_ready(&[(stop, libc::POLLIN), fd], None)? {
            Some(0) => Ok(Ready::Stop),
            _ => Ok(Ready::Fd),
        },
        None => first_ready(&[fd], None).map(|_| Ready::Fd),
    }
}

/// What woke a connection's wait.
#[derive(Clone, Copy)]
enum Event {
    Stop,
    MemoryFault,
    /// A message (or the end of the connection) on the frontend's socket.
    Message,
    /// Another frontend is connecting.
    Another,
}

/// Wait for what matters to a connection, most important first; `None` when `limit` passed.
fn wait_connection(
    stream: &UnixStream,
    listener: BorrowedFd,
    stop: Option<BorrowedFd>,
    fault: Option<BorrowedFd>,
    limit: Option<Duration>,
) -> io::Result<Option<Event>> {
    let watched = [(stop, Event::Stop), (fault, Event::MemoryFault)]
        .into_iter()
        .filter_map(|(fd, event)| Some((fd?, event)))
        .chain([(stream.as_fd(), Event::Message), (listener, Event::Another)]);
    let mut fds = Vec::with_capacity(4);
    let mut events = Vec::with_capacity(4);
    for (fd, event) in watched {
        fds.push((fd, libc::POLLIN));
        events.push(event);
    }
    Ok(first_ready(&fds, limit)?.map(|index| events[index]))
}

/// Receive one message on `wire`, handle it and reply; `Some` when the connection ends.
fn serve_message(wire: &Wire, session: &mut Session) -> Option<Ending> {
    let (header, payload, fds) = match wire.recv() {
        Ok(Some(parts)) => parts,
        Ok(None) => return Some(Ending::Closed),
        Err(ProtocolError::Stopping) => return Some(Ending::Stopped),
        Err(error) => return Some(Ending::Refused { request: None, error: error.into() }),
    };
    let request = request_name(header.request);
    // REPLY_ACK, negotiated and asked for, on a known request without a reply of its own.
    let ack = header.flags & FLAG_NEED_REPLY != 0
        && session.reply_ack()
        && request.is_some()
        && !has_own_reply(header.request);
    let result = Message::parse(header, &payload, fds)
        .map_err(Error::from)
        .and_then(|message| session.handle(message));
    let sent = match result {
        Ok(Some(reply)) => match session.take_reply_fd() {
            Some(fd) => wire.reply_with_fds(header.request, &reply, &[fd]),
            None => wire.reply(header.request, &reply),
        },
        Ok(None) if ack => wire.reply(header.request, &0u64.to_le_bytes()),
        Ok(None) => Ok(()),
        Err(error) => {
            // A failure acknowledgement first, so the frontend's own log says why.
            if ack {
                let _ = wire.reply(header.request, &1u64.to_le_bytes());
            }
            return Some(Ending::Refused { request, error });
        }
    };
    match sent {
        Ok(()) => None,
        Err(ProtocolError::Stopping) => Some(Ending::Stopped),
        Err(error) => Some(Ending::Refused { request, error: error.into() }),
    }
}
