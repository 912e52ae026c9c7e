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
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use unix_socket::{check_peer, listen, pid_note, remove_socket, Access};
use vhost_user_protocol::message::{has_own_reply, request_name, Message, Wire, FLAG_NEED_REPLY};
use vhost_user_protocol::poll::first_ready;
use vhost_user_protocol::Error as ProtocolError;

use crate::backend::Session;
use crate::device::Device;
use crate::error::Error;
use crate::handover::{self, Adopted, DiskState, HandoverError, Outcome, Port};

/// How long a frontend may pause in the middle of a message, or leave its replies unread.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a new frontend has to negotiate its features. QEMU does it as it connects; the
/// margin is for a QEMU still starting on a loaded host.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the server reaps requests quarantined at a reset (a disk that did not answer) while
/// there are some: their memory is freed, and the operator's figures drop, soon after the disk
/// answers at last, not at the next connection.
const QUARANTINE_REAP: Duration = Duration::from_millis(100);

/// How a connection ended.
#[derive(Debug)]
pub enum Ending {
    /// The frontend closed it.
    Closed,
    /// The stop descriptor became readable.
    Stopped,
    /// The disk was handed over to a successor, which serves the connection on.
    HandedOver,
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

/// How a device's server starts: on a socket of its own, or on one a predecessor handed over,
/// with the session to take over (see [`crate::upgrade`]).
pub enum Listen {
    /// Bind the device's socket (a stale socket file there is replaced).
    Bind,
    /// Serve on `listener`, the predecessor's socket, taking over what `adopted` holds.
    Adopt {
        /// The predecessor's listening socket.
        listener: OwnedFd,
        /// Its frontend and session, for [`Server::serve_with`].
        adopted: Adopted,
    },
}

/// One disk's vhost-user socket, listening; the socket file is removed when it is dropped.
pub struct Server {
    listener: UnixListener,
    path: PathBuf,
    /// Is a frontend being served? Shared with whoever asks ([`Server::frontend_connected`]).
    frontend: Arc<AtomicBool>,
    /// Remove the socket file when dropped: not once the socket is handed over, nor while an
    /// adopted one may still be the predecessor's.
    remove_on_drop: AtomicBool,
    /// Who may connect: checked on every accepted connection before anything is read.
    access: Access,
}

impl Server {
    /// Listen on `path`. A socket file of this user's left there by a server that is gone is
    /// replaced; any other file, another user's socket, or a socket a live server answers on,
    /// is an error ([`listen`]).
    ///
    /// The socket is its owner's alone (mode 0600) and serves only this user's and root's
    /// processes; see [`Server::bind_with`].
    pub fn bind(path: impl AsRef<Path>) -> Result<Server, Error> {
        Server::bind_with(path, Access::owner_only())
    }

    /// [`Server::bind`], the socket file given `access`'s mode and owner, and a connecting
    /// process served only when `access` admits it ([`Access::admits`]).
    pub fn bind_with(path: impl AsRef<Path>, access: Access) -> Result<Server, Error> {
        let path = path.as_ref();
        let listener = listen(path, &access)?;
        Ok(Server {
            listener,
            path: path.to_path_buf(),
            frontend: Arc::new(AtomicBool::new(false)),
            remove_on_drop: AtomicBool::new(true),
            access,
        })
    }

    /// Serve on the listening socket a predecessor handed over, which must be a listening Unix
    /// socket bound to `path`, admitting the processes `access` admits. Its socket file is left
    /// alone until the predecessor commits.
    pub fn adopt(listener: OwnedFd, path: impl AsRef<Path>, access: Access) -> Result<Server, Error> {
        let path = path.as_ref();
        let shown = || path.display().to_string();
        let listener = UnixListener::from(listener);
        let bound = listener.local_addr().map_err(|source| Error::Listen { path: shown(), source })?;
        if bound.as_pathname() != Some(path) || !accepts_connections(listener.as_fd()) {
            let found =
                bound.as_pathname().map_or_else(|| "an unnamed socket".into(), |p| p.display().to_string());
            return Err(Error::NotTheSocket { path: shown(), found });
        }
        Ok(Server {
            listener,
            path: path.to_path_buf(),
            frontend: Arc::new(AtomicBool::new(false)),
            remove_on_drop: AtomicBool::new(false),
            access,
        })
    }

    /// Listen on `path` as `listen` says ([`Server::bind_with`] or [`Server::adopt`]); with
    /// what there is to take over, for [`Server::serve_with`].
    pub fn open(path: &Path, access: Access, listen: Listen) -> Result<(Server, Option<Adopted>), Error> {
        match listen {
            Listen::Bind => Ok((Server::bind_with(path, access)?, None)),
            Listen::Adopt { listener, adopted } => {
                Ok((Server::adopt(listener, path, access)?, Some(adopted)))
            }
        }
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
    pub fn serve(&self, device: &mut dyn Device, stop: Option<BorrowedFd>) -> Result<(), Error> {
        self.serve_with(device, stop, None, None)
    }

    /// [`Server::serve`], also handing the disk over to a successor when `port` asks (and
    /// returning once the successor has it), and first, with `adopted`, taking over the session
    /// and frontend a predecessor handed over (see [`crate::handover`]).
    pub fn serve_with(
        &self,
        device: &mut dyn Device,
        stop: Option<BorrowedFd>,
        port: Option<&Port>,
        adopted: Option<Adopted>,
    ) -> Result<(), Error> {
        if let Some(adopted) = adopted {
            if self.take_over(device, stop, port, adopted) {
                return Ok(());
            }
        }
        loop {
            let reap = (device.reap_quarantined() > 0).then_some(QUARANTINE_REAP);
            let ready = wait(self.listener.as_fd(), stop, port.map(Port::fd), reap)
                .map_err(|source| self.listen_error(source))?;
            match (ready, port) {
                (Ready::Stop, _) => return Ok(()),
                (Ready::TimedOut, _) => continue,
                (Ready::Handover, Some(port)) => {
                    let attempt = port.take();
                    let state = handover::export_disk(self.listener.as_fd(), device.writeback(), None);
                    if self.hand_over(port, attempt, state) == Outcome::Commit {
                        return Ok(());
                    }
                    continue;
                }
                _ => {}
            }
            let stream = match self.listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => {
                    log::error!("cannot accept a frontend: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            // Another user's process is turned away before a byte of it is read.
            if let Err(refused) = check_peer(&stream, &self.access) {
                log::warn!("{}: {refused}; connection closed", self.path.display());
                continue;
            }
            log::info!("{}: frontend connected{}", self.path.display(), pid_note(&stream));
            // Replies must never block the server: a frontend that does not read them is
            // waited for (with the stop descriptor) for at most STALL_TIMEOUT.
            if let Err(e) = stream.set_nonblocking(true) {
                log::error!("cannot make the frontend's socket non-blocking: {e}; connection closed");
                continue;
            }
            self.frontend.store(true, Ordering::Release);
            let mut session = Session::new(device);
            let ending = self.serve_connection(&stream, &mut session, stop, port, Instant::now());
            // The rings stop (and give their backends back) before the end is logged.
            drop(session);
            self.frontend.store(false, Ordering::Release);
            if self.ended(ending) {
                return Ok(());
            }
        }
    }

    /// Log how a connection ended; `true` when serving ends with it (stopped, or handed over).
    fn ended(&self, ending: Ending) -> bool {
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
            Ending::Stopped | Ending::HandedOver => return true,
        }
        false
    }

    /// Give the control thread this disk's state for hand-over `attempt` and do what it decides:
    /// on a commit the successor owns the socket file; otherwise the caller serves on.
    fn hand_over(&self, port: &Port, attempt: u64, state: Result<DiskState, HandoverError>) -> Outcome {
        let outcome = port.hand_over(attempt, state);
        if outcome == Outcome::Commit {
            self.remove_on_drop.store(false, Ordering::Release);
            log::info!("{}: handed over to the successor", self.path.display());
        }
        outcome
    }

    /// Take over a predecessor's disk: rebuild its session (rings held), report, and on the
    /// predecessor's commit start the rings and serve its frontend's connection. `true` when
    /// serving ends (stopped, handed over again, or the predecessor kept the disk).
    fn take_over(
        &self,
        device: &mut dyn Device,
        stop: Option<BorrowedFd>,
        port: Option<&Port>,
        adopted: Adopted,
    ) -> bool {
        if let Err(e) = adopted.apply_writeback(device) {
            let _ = adopted.replayed.send(Err(e.to_string()));
            return true;
        }
        let Adopted { connection, replayed, commit, .. } = adopted;
        let Some(connection) = connection else {
            let _ = replayed.send(Ok(()));
            return !self.committed(&commit);
        };
        let stream = UnixStream::from(connection.stream);
        let mut session = Session::new(device);
        let rebuilt = stream
            .set_nonblocking(true)
            .map_err(HandoverError::Socket)
            .and_then(|()| handover::replay(&mut session, connection.messages));
        let refused = rebuilt.is_err();
        let _ = replayed.send(rebuilt.map_err(|e| e.to_string()));
        // Refused or not committed: nothing was started, and the predecessor keeps the disk.
        if refused || !self.committed(&commit) {
            return true;
        }
        self.frontend.store(true, Ordering::Release);
        let ending = match session.release() {
            Ok(()) => {
                log::info!(
                    "{}: took over the frontend's connection{}",
                    self.path.display(),
                    pid_note(&stream)
                );
                self.serve_connection(&stream, &mut session, stop, port, Instant::now())
            }
            Err(error) => Ending::Refused { request: None, error },
        };
        drop(session);
        self.frontend.store(false, Ordering::Release);
        self.ended(ending)
    }

    /// Wait for the predecessor's decision; on a commit the socket file is this server's.
    fn committed(&self, commit: &std::sync::mpsc::Receiver<bool>) -> bool {
        let committed = commit.recv().unwrap_or(false);
        if committed {
            self.remove_on_drop.store(true, Ordering::Release);
        }
        committed
    }

    fn listen_error(&self, source: io::Error) -> Error {
        Error::Listen { path: self.path.display().to_string(), source }
    }

    /// Serve one frontend on `stream` until it closes, a message is refused, it breaks a time
    /// limit, its memory shrinks, `stop` fires or the disk is handed over.
    fn serve_connection(
        &self,
        stream: &UnixStream,
        session: &mut Session,
        stop: Option<BorrowedFd>,
        port: Option<&Port>,
        connected: Instant,
    ) -> Ending {
        let wire = Wire::new(stream, STALL_TIMEOUT).with_stop(stop);
        loop {
            let setup_left = (!session.set_up()).then(|| SETUP_TIMEOUT.saturating_sub(connected.elapsed()));
            let reap = (session.device.reap_quarantined() > 0).then_some(QUARANTINE_REAP);
            if let Err(error) = session.start_awaiting() {
                return Ending::Refused { request: None, error };
            }
            let limit = match (setup_left, reap) {
                (Some(left), Some(reap)) => Some(left.min(reap)),
                (left, reap) => left.or(reap),
            };
            let watched = Watched {
                stop,
                fault: session.memory_fault(),
                handover: port.map(Port::fd),
                listener: self.listener.as_fd(),
            };
            match wait_connection(stream, watched, limit) {
                Ok(Some(Event::Stop)) => return Ending::Stopped,
                Ok(Some(Event::MemoryFault)) => {
                    return Ending::Refused { request: None, error: session.memory_shrank() };
                }
                // Between two messages: whatever the frontend sent since stays in the socket.
                Ok(Some(Event::Handover)) => {
                    let Some(port) = port else { continue };
                    let attempt = port.take();
                    let writeback = session.device.writeback();
                    let state = handover::export_disk(
                        self.listener.as_fd(),
                        writeback,
                        Some((stream, &mut *session)),
                    );
                    if self.hand_over(port, attempt, state) == Outcome::Commit {
                        session.set_handed_over();
                        return Ending::HandedOver;
                    }
                    // Not handed over: the rings start again where they stopped.
                    if let Err(error) = session.release() {
                        return Ending::Refused { request: None, error };
                    }
                    log::info!("{}: the hand-over did not happen; serving on", self.path.display());
                }
                Ok(Some(Event::Message)) => {
                    if let Some(ending) = serve_message(&wire, session) {
                        return ending;
                    }
                }
                Ok(Some(Event::Another)) => self.refuse_another(),
                // Time to reap the quarantine again.
                Ok(None) if session.set_up() || connected.elapsed() < SETUP_TIMEOUT => {}
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

impl Drop for Server {
    fn drop(&mut self) {
        if self.remove_on_drop.load(Ordering::Acquire) {
            remove_socket(&self.path, &self.access);
        }
    }
}

/// Is `fd` a listening socket (SO_ACCEPTCONN)?
fn accepts_connections(fd: BorrowedFd) -> bool {
    let mut value: libc::c_int = 0;
    let Ok(mut len) = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>()) else { return false };
    // SAFETY: SO_ACCEPTCONN fills an int of `len` bytes at a valid pointer.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    rc == 0 && value == 1
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Ready {
    Fd,
    Stop,
    Handover,
    TimedOut,
}

/// Wait until `fd` is readable (or hung up), or `stop` or `handover` is, for at most `limit`.
fn wait(
    fd: BorrowedFd,
    stop: Option<BorrowedFd>,
    handover: Option<BorrowedFd>,
    limit: Option<Duration>,
) -> io::Result<Ready> {
    let watched: Vec<(BorrowedFd, Ready)> =
        [(stop, Ready::Stop), (handover, Ready::Handover), (Some(fd), Ready::Fd)]
            .into_iter()
            .filter_map(|(fd, ready)| Some((fd?, ready)))
            .collect();
    let fds: Vec<(BorrowedFd, i16)> = watched.iter().map(|&(fd, _)| (fd, libc::POLLIN)).collect();
    Ok(first_ready(&fds, limit)?.map_or(Ready::TimedOut, |index| watched[index].1))
}

/// What woke a connection's wait.
#[derive(Clone, Copy)]
enum Event {
    Stop,
    MemoryFault,
    /// The daemon asks for the disk's hand-over to a successor.
    Handover,
    /// A message (or the end of the connection) on the frontend's socket.
    Message,
    /// Another frontend is connecting.
    Another,
}

/// The descriptors a connection's wait watches besides the frontend's socket.
struct Watched<'a> {
    stop: Option<BorrowedFd<'a>>,
    fault: Option<BorrowedFd<'a>>,
    handover: Option<BorrowedFd<'a>>,
    listener: BorrowedFd<'a>,
}

/// Wait for what matters to a connection, most important first; `None` when `limit` passed.
fn wait_connection(
    stream: &UnixStream,
    watched: Watched,
    limit: Option<Duration>,
) -> io::Result<Option<Event>> {
    let watched = [
        (watched.stop, Event::Stop),
        (watched.fault, Event::MemoryFault),
        (watched.handover, Event::Handover),
    ]
    .into_iter()
    .filter_map(|(fd, event)| Some((fd?, event)))
    .chain([(stream.as_fd(), Event::Message), (watched.listener, Event::Another)]);
    let mut fds = Vec::with_capacity(5);
    let mut events = Vec::with_capacity(5);
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
