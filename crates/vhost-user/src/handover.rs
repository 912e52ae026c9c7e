//! Handing a daemon's disks to its successor without closing a frontend's connection.
//!
//! The old daemon (the predecessor) and the new one (the successor) talk over a Unix socket
//! with vhost-user's framing ([`Wire`]), using message codes of their own ([`code`]):
//!
//! 1. The successor sends HELLO with a description of the disks it was started with (the
//!    daemon's own format); the predecessor answers REFUSE (one line: why) when they differ.
//! 2. The predecessor stops taking requests on every ring of every disk and lets the rings
//!    finish what they hold (a ring's stop, bounded by the disk's reset timeout), then sends per
//!    disk a DISK message, carrying the listening socket and, when a frontend is connected, its
//!    connected socket (SCM_RIGHTS), followed by the vhost-user messages that rebuild the
//!    session: SET_PROTOCOL_FEATURES, SET_FEATURES, SET_MEM_TABLE, SET_LOG_BASE (a dirty log the
//!    frontend gave, so that its later LOG_ALL logs in the successor), SET_INFLIGHT_FD and per ring
//!    SET_VRING_NUM/ADDR/BASE (the next avail index after the drain)/CALL/ERR/ENABLE/KICK, with
//!    their descriptors. Then DONE, carrying its hand-over listening socket.
//! 3. The successor replays each disk's messages through its own [`Session::handle`], with the
//!    rings held ([`Session::hold`]), so everything it is handed goes through the checks a
//!    frontend's messages do, and answers READY, or ABORT with the reason.
//! 4. The predecessor answers READY with COMMIT: the commit point. Once COMMIT is sent the
//!    predecessor never touches the rings or sockets again and exits; the successor starts the
//!    rings ([`Session::release`]) and serves the adopted sockets. Before it (a refusal, an
//!    ABORT, the successor gone or silent), the predecessor starts its rings again where they
//!    stopped and serves on.
//!
//! The frontend is only ever handed over between two of its messages (the server reads whole
//! messages and waits for the hand-over request only between them), so what it has sent and the
//! predecessor has not read stays in the socket for the successor. Kicks stay in the kick
//! eventfds, and each ring is woken once when it starts again.
//!
//! [`Port`] (a disk's server thread) and [`Handle`] (the daemon's control thread) are the two
//! ends of a disk's hand-over inside the predecessor; [`Adopted`] is what a successor's server
//! thread is given to take a disk over.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use thiserror::Error;
use vhost_user_protocol::message::{
    code as vu, request_name, Header, Message, RawMessage, Wire, VERSION, VRING_NOFD,
};
use vmm_sys_util::eventfd::EventFd;

use crate::backend::Session;
use crate::device::Device;

/// The hand-over channel's own message codes, far from vhost-user's (1 to 40).
pub mod code {
    /// Successor → predecessor: the description of its disks (the daemon's format).
    pub const HELLO: u32 = 0x4858_0001;
    /// Predecessor → successor: the hand-over is refused; the payload says why (UTF-8).
    pub const REFUSE: u32 = 0x4858_0002;
    /// Predecessor → successor: one disk's sockets and the count of its session's messages.
    pub const DISK: u32 = 0x4858_0003;
    /// Predecessor → successor: every disk was sent; carries the hand-over listening socket.
    pub const DONE: u32 = 0x4858_0004;
    /// Successor → predecessor: every disk's state was taken.
    pub const READY: u32 = 0x4858_0005;
    /// Successor → predecessor: a disk's state was refused; the payload says why (UTF-8).
    pub const ABORT: u32 = 0x4858_0006;
    /// Predecessor → successor: the commit point is passed; the disks are the successor's.
    pub const COMMIT: u32 = 0x4858_0007;
}

/// The longest hand-over message (HELLO's description of the disks).
pub const MAX_PAYLOAD: usize = 64 << 10;
/// How long either side may pause inside a message.
pub const STALL: Duration = Duration::from_secs(5);
/// The most vhost-user messages one disk's session is rebuilt with (a few per ring).
const MAX_SESSION_MESSAGES: u32 = 16 + 8 * 256;
/// The requests a session is rebuilt with; anything else in a hand-over is refused.
const REPLAYED: [u32; 12] = [
    vu::SET_PROTOCOL_FEATURES,
    vu::SET_FEATURES,
    vu::SET_MEM_TABLE,
    vu::SET_LOG_BASE,
    vu::SET_INFLIGHT_FD,
    vu::SET_VRING_NUM,
    vu::SET_VRING_ADDR,
    vu::SET_VRING_BASE,
    vu::SET_VRING_CALL,
    vu::SET_VRING_ERR,
    vu::SET_VRING_ENABLE,
    vu::SET_VRING_KICK,
];

/// Why a hand-over did not happen.
#[derive(Debug, Error)]
#[allow(missing_docs)] // Each variant's message says what it is.
pub enum HandoverError {
    #[error("dirty logging is on (a live migration is under way): hand over once it has ended")]
    Logging,
    #[error("the disk still holds {0} request(s) quarantined at a reset, which the successor would resubmit: hand over once the disk has finished them")]
    Quarantined(usize),
    #[error("the rings could not be stopped: {0}")]
    Stop(#[source] crate::Error),
    #[error("cannot duplicate a descriptor to hand it over: {0}")]
    Dup(#[source] io::Error),
    #[error("cannot make the adopted frontend socket non-blocking: {0}")]
    Socket(#[source] io::Error),
    #[error("the hand-over channel failed: {0}")]
    Channel(#[from] vhost_user_protocol::Error),
    #[error("the other daemon closed the hand-over channel")]
    Closed,
    #[error("the other daemon sent nothing for {0} s")]
    Silent(u64),
    #[error("unexpected message {got:#x} on the hand-over channel (expected {expected})")]
    Unexpected { got: u32, expected: &'static str },
    #[error("malformed {what} message: {why}")]
    Malformed { what: &'static str, why: String },
    #[error("the other daemon refused: {0}")]
    Refused(String),
    #[error("the successor gave up: {0}")]
    Aborted(String),
    #[error("{request}: not a message a hand-over rebuilds a session with")]
    NotReplayed { request: String },
    #[error("{request}: {error}")]
    Replay { request: &'static str, error: crate::Error },
    #[error("the disk's server thread did not hand over its state within {0} s")]
    NoState(u64),
    #[error("the disk's server thread is gone")]
    ServerGone,
}

/// The connected frontend of a disk being handed over.
pub struct Connection {
    /// The frontend's connected socket.
    pub stream: OwnedFd,
    /// The vhost-user messages that rebuild its session, with their descriptors.
    pub messages: Vec<RawMessage>,
}

/// One disk's part of a hand-over.
pub struct DiskState {
    /// The disk's listening socket.
    pub listener: OwnedFd,
    /// The driver's cache mode (1 write back, 0 write through), for a disk with the switch.
    pub writeback: Option<u8>,
    /// The frontend's connection, if one is served.
    pub connection: Option<Connection>,
}

/// What the predecessor decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The successor has the disk: end serving it.
    Commit,
    /// The hand-over did not happen: start the rings again and serve on.
    Resume,
}

/// An eventfd's descriptor, borrowed for as long as the eventfd.
fn borrow(event: &EventFd) -> BorrowedFd<'_> {
    // SAFETY: the EventFd owns the open descriptor and outlives the borrow tied to it.
    unsafe { BorrowedFd::borrow_raw(event.as_raw_fd()) }
}

fn dup(fd: BorrowedFd) -> Result<OwnedFd, HandoverError> {
    fd.try_clone_to_owned().map_err(HandoverError::Dup)
}

/// A vhost-user message to replay: its code, payload and descriptors (duplicates).
fn message(request: u32, payload: &[u8], fds: Vec<OwnedFd>) -> RawMessage {
    // Payloads here are at most a memory table, far below u32::MAX.
    let size = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    (Header { request, flags: VERSION, size }, payload.to_vec(), fds)
}

fn u32_pair(a: u32, b: u32) -> [u8; 8] {
    let mut bytes = [0u8; 8];
    bytes[..4].copy_from_slice(&a.to_le_bytes());
    bytes[4..].copy_from_slice(&b.to_le_bytes());
    bytes
}

/// Stop `session`'s rings (each finishing what it holds) and express what the session is as
/// the vhost-user messages that rebuild it. Refused, with nothing stopped, while dirty logging
/// is on. The rings stay stopped: [`Session::release`] starts them again.
pub(crate) fn export(session: &mut Session) -> Result<Vec<RawMessage>, HandoverError> {
    if session.logging() {
        return Err(HandoverError::Logging);
    }
    session.stop_rings().map_err(HandoverError::Stop)?;
    // The successor would resubmit what the region marks while this process's disk may still
    // carry the originals out (see `Session::try_start`).
    let quarantined = session.quarantined();
    if quarantined > 0 {
        return Err(HandoverError::Quarantined(quarantined));
    }
    let mut out = Vec::new();
    if session.protocol_features != 0 {
        out.push(message(vu::SET_PROTOCOL_FEATURES, &session.protocol_features.to_le_bytes(), vec![]));
    }
    if let Some(features) = session.features {
        out.push(message(vu::SET_FEATURES, &features.to_le_bytes(), vec![]));
    }
    if let Some(memory) = &session.memory {
        let regions = memory.regions();
        let count = u32::try_from(regions.len()).unwrap_or(u32::MAX);
        let mut payload = u32_pair(count, 0).to_vec();
        regions.iter().for_each(|r| payload.extend_from_slice(&r.to_bytes()));
        let fds = memory.files().into_iter().map(dup).collect::<Result<Vec<_>, _>>()?;
        out.push(message(vu::SET_MEM_TABLE, &payload, fds));
    }
    // QEMU gives the log (SET_LOG_BASE) before it acks LOG_ALL: a hand-over in between must
    // carry the log, or the successor would take LOG_ALL with no log and mark nothing.
    if let Some(log) = session.dirty_log() {
        let (size, offset) = log.placement();
        let payload = [size.to_le_bytes(), offset.to_le_bytes()].concat();
        out.push(message(vu::SET_LOG_BASE, &payload, vec![dup(log.file())?]));
    }
    if let Some(region) = &session.inflight {
        out.push(message(vu::SET_INFLIGHT_FD, &region.info().to_bytes(), vec![dup(region.fd().as_fd())?]));
    }
    for (index, vring) in session.vrings.iter().enumerate() {
        // A device has at most a few dozen queues.
        let index = u32::try_from(index).unwrap_or(u32::MAX);
        if vring.size != 0 {
            out.push(message(vu::SET_VRING_NUM, &u32_pair(index, vring.size.into()), vec![]));
        }
        if let Some(addr) = vring.addr {
            out.push(message(vu::SET_VRING_ADDR, &addr.to_bytes(), vec![]));
        }
        out.push(message(vu::SET_VRING_BASE, &u32_pair(index, vring.base.into()), vec![]));
        for (request, slot) in [(vu::SET_VRING_CALL, &vring.call), (vu::SET_VRING_ERR, &vring.err)] {
            if let Some(event) = slot {
                out.push(message(request, &u64::from(index).to_le_bytes(), vec![dup(borrow(event))?]));
            }
        }
        if let Some(enabled) = vring.enabled {
            out.push(message(vu::SET_VRING_ENABLE, &u32_pair(index, enabled.into()), vec![]));
        }
        match &vring.kick {
            Some(Some(kick)) => out.push(message(
                vu::SET_VRING_KICK,
                &u64::from(index).to_le_bytes(),
                vec![dup(borrow(kick))?],
            )),
            Some(None) => {
                out.push(message(vu::SET_VRING_KICK, &(u64::from(index) | VRING_NOFD).to_le_bytes(), vec![]))
            }
            None => {}
        }
    }
    Ok(out)
}

/// Rebuild a session from a predecessor's messages, its rings held: each goes through the
/// checks a frontend's would (`Message::parse`, then `Session::handle`); only the requests
/// that set state are taken.
pub(crate) fn replay(session: &mut Session, messages: Vec<RawMessage>) -> Result<(), HandoverError> {
    session.hold();
    for (header, payload, fds) in messages {
        let name = request_name(header.request);
        let Some(request) = name.filter(|_| REPLAYED.contains(&header.request)) else {
            let request = name.map_or_else(|| format!("request code {}", header.request), str::to_owned);
            return Err(HandoverError::NotReplayed { request });
        };
        Message::parse(header, &payload, fds)
            .map_err(crate::Error::from)
            .and_then(|message| session.handle(message))
            .map_err(|error| HandoverError::Replay { request, error })?;
    }
    Ok(())
}

/// The disk's listening socket, its frontend's connected socket and session, as one disk's part
/// of a hand-over; the rings are stopped (see [`export`]).
pub(crate) fn export_disk(
    listener: BorrowedFd,
    writeback: Option<u8>,
    frontend: Option<(&UnixStream, &mut Session)>,
) -> Result<DiskState, HandoverError> {
    let listener = dup(listener)?;
    match frontend {
        None => Ok(DiskState { listener, writeback, connection: None }),
        Some((stream, session)) => {
            let messages = export(session)?;
            let stream = dup(stream.as_fd())?;
            Ok(DiskState { listener, writeback, connection: Some(Connection { stream, messages }) })
        }
    }
}

/// What a successor's server thread is given to take a disk over.
pub struct Adopted {
    /// The frontend's connection, if the predecessor served one.
    pub connection: Option<Connection>,
    /// The cache mode the predecessor's driver chose.
    pub writeback: Option<u8>,
    /// Where the thread says whether the session was rebuilt (`Err`: why not).
    pub replayed: Sender<Result<(), String>>,
    /// Where the thread hears whether the predecessor committed (`true`) or not.
    pub commit: Receiver<bool>,
}

impl Adopted {
    /// Apply the cache mode to `device` (the device's, not the session's).
    pub(crate) fn apply_writeback(&self, device: &mut dyn Device) -> Result<(), HandoverError> {
        match self.writeback {
            Some(value) => device
                .set_writeback(value)
                .map_err(|error| HandoverError::Replay { request: "the cache mode (SET_CONFIG)", error }),
            None => Ok(()),
        }
    }
}

/// A disk server's end of a hand-over in the predecessor: readable when the control thread asks
/// for the disk's state.
pub struct Port {
    request: Arc<EventFd>,
    attempt: Arc<AtomicU64>,
    exported: Sender<(u64, Result<DiskState, HandoverError>)>,
    outcome: Receiver<(u64, Outcome)>,
}

/// The control thread's end of one disk's hand-over.
pub struct Handle {
    request: Arc<EventFd>,
    attempt: Arc<AtomicU64>,
    exported: Receiver<(u64, Result<DiskState, HandoverError>)>,
    outcome: Sender<(u64, Outcome)>,
}

/// A disk's two ends of its hand-overs.
pub fn port() -> io::Result<(Handle, Port)> {
    let request = Arc::new(EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC)?);
    let attempt = Arc::new(AtomicU64::new(0));
    let (exported_tx, exported_rx) = mpsc::channel();
    let (outcome_tx, outcome_rx) = mpsc::channel();
    let handle = Handle {
        request: request.clone(),
        attempt: attempt.clone(),
        exported: exported_rx,
        outcome: outcome_tx,
    };
    Ok((handle, Port { request, attempt, exported: exported_tx, outcome: outcome_rx }))
}

impl Port {
    /// Readable when a hand-over is asked for.
    pub fn fd(&self) -> BorrowedFd<'_> {
        borrow(&self.request)
    }

    /// Take the request: the attempt it belongs to.
    pub(crate) fn take(&self) -> u64 {
        let _ = self.request.read();
        self.attempt.load(Ordering::Acquire)
    }

    /// Give the control thread the disk's state (or why there is none), then wait for its
    /// decision; a control thread that is gone means the hand-over did not happen.
    pub(crate) fn hand_over(&self, attempt: u64, state: Result<DiskState, HandoverError>) -> Outcome {
        if self.exported.send((attempt, state)).is_err() {
            return Outcome::Resume;
        }
        loop {
            match self.outcome.recv() {
                Ok((of, outcome)) if of == attempt => return outcome,
                // A decision on an earlier attempt this thread answered late.
                Ok(_) => continue,
                Err(_) => return Outcome::Resume,
            }
        }
    }
}

impl Handle {
    /// Ask the disk's server for its state, as part of hand-over `attempt`.
    pub fn ask(&self, attempt: u64) {
        self.attempt.store(attempt, Ordering::Release);
        let _ = self.request.write(1);
    }

    /// The disk's state for `attempt`, within `limit`. A server that answers later is told the
    /// decision all the same ([`Handle::decide`] queues it).
    pub fn state(&self, attempt: u64, limit: Duration) -> Result<DiskState, HandoverError> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.exported.recv_timeout(left) {
                Ok((of, state)) if of == attempt => return state,
                Ok(_) => continue,
                Err(RecvTimeoutError::Timeout) => return Err(HandoverError::NoState(limit.as_secs())),
                Err(RecvTimeoutError::Disconnected) => return Err(HandoverError::ServerGone),
            }
        }
    }

    /// Tell the disk's server what became of `attempt`.
    pub fn decide(&self, attempt: u64, outcome: Outcome) {
        let _ = self.outcome.send((attempt, outcome));
    }
}

/// Send a hand-over message.
fn send(wire: &Wire, request: u32, payload: &[u8], fds: &[RawFd]) -> Result<(), HandoverError> {
    let size = u32::try_from(payload.len())
        .map_err(|_| HandoverError::Malformed { what: "outgoing", why: "too long".into() })?;
    wire.send(Header { request, flags: VERSION, size }, payload, fds)?;
    Ok(())
}

/// Receive a message, within `limit` for it to begin.
fn recv(stream: &UnixStream, limit: Duration) -> Result<RawMessage, HandoverError> {
    let wire = Wire::new(stream, STALL).with_max_payload(MAX_PAYLOAD).with_idle_limit(limit);
    match wire.recv() {
        Ok(Some(message)) => Ok(message),
        Ok(None) => Err(HandoverError::Closed),
        Err(vhost_user_protocol::Error::Read(e)) if e.kind() == io::ErrorKind::TimedOut => {
            Err(HandoverError::Silent(limit.as_secs()))
        }
        Err(e) => Err(e.into()),
    }
}

fn text(payload: &[u8]) -> String {
    String::from_utf8_lossy(payload).into_owned()
}

/// The predecessor's end of a hand-over channel.
pub struct ToSuccessor<'a> {
    stream: &'a UnixStream,
}

impl<'a> ToSuccessor<'a> {
    /// Talk to the successor that connected on `stream`.
    pub fn new(stream: &'a UnixStream) -> ToSuccessor<'a> {
        ToSuccessor { stream }
    }

    fn wire(&self) -> Wire<'a> {
        Wire::new(self.stream, STALL).with_max_payload(MAX_PAYLOAD)
    }

    /// The successor's description of its disks.
    pub fn hello(&self, limit: Duration) -> Result<Vec<u8>, HandoverError> {
        match recv(self.stream, limit)? {
            (header, payload, _) if header.request == code::HELLO => Ok(payload),
            (header, ..) => Err(HandoverError::Unexpected { got: header.request, expected: "HELLO" }),
        }
    }

    /// Refuse the hand-over, saying why.
    pub fn refuse(&self, why: &str) -> Result<(), HandoverError> {
        let why = &why.as_bytes()[..why.len().min(MAX_PAYLOAD)];
        send(&self.wire(), code::REFUSE, why, &[])
    }

    /// Send disk `index`'s state.
    pub fn disk(&self, index: u32, state: &DiskState) -> Result<(), HandoverError> {
        let wire = self.wire();
        let messages = state.connection.as_ref().map_or(&[][..], |c| &c.messages[..]);
        let count = u32::try_from(messages.len()).unwrap_or(u32::MAX);
        let mut payload = u32_pair(index, count).to_vec();
        payload.push(state.connection.is_some().into());
        payload.push(state.writeback.unwrap_or(u8::MAX));
        let mut fds = vec![state.listener.as_raw_fd()];
        fds.extend(state.connection.as_ref().map(|c| c.stream.as_raw_fd()));
        send(&wire, code::DISK, &payload, &fds)?;
        for (header, payload, fds) in messages {
            let fds: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
            wire.send(*header, payload, &fds)?;
        }
        Ok(())
    }

    /// Every disk was sent: hand over the hand-over socket too, then wait for the successor's
    /// READY (within `limit`).
    pub fn done(&self, handover_listener: BorrowedFd, limit: Duration) -> Result<(), HandoverError> {
        send(&self.wire(), code::DONE, &[], &[handover_listener.as_raw_fd()])?;
        match recv(self.stream, limit)? {
            (header, ..) if header.request == code::READY => Ok(()),
            (header, payload, _) if header.request == code::ABORT => {
                Err(HandoverError::Aborted(text(&payload)))
            }
            (header, ..) => Err(HandoverError::Unexpected { got: header.request, expected: "READY" }),
        }
    }

    /// The commit point: once this returns `Ok` the disks are the successor's.
    pub fn commit(&self) -> Result<(), HandoverError> {
        send(&self.wire(), code::COMMIT, &[], &[])
    }
}

/// What the predecessor sent, as the successor reads it.
pub enum FromPredecessor {
    /// One disk's state; its index in the description.
    Disk(u32, DiskState),
    /// Every disk was sent; the hand-over listening socket.
    Done(OwnedFd),
}

/// The successor's end of a hand-over channel.
pub struct ToPredecessor<'a> {
    stream: &'a UnixStream,
}

impl<'a> ToPredecessor<'a> {
    /// Talk to the predecessor connected on `stream`.
    pub fn new(stream: &'a UnixStream) -> ToPredecessor<'a> {
        ToPredecessor { stream }
    }

    fn wire(&self) -> Wire<'a> {
        Wire::new(self.stream, STALL).with_max_payload(MAX_PAYLOAD)
    }

    /// Ask for the hand-over of the disks `description` describes.
    pub fn hello(&self, description: &[u8]) -> Result<(), HandoverError> {
        send(&self.wire(), code::HELLO, description, &[])
    }

    /// The next disk, or the end, within `limit` (the predecessor drains its rings first).
    pub fn next(&self, limit: Duration) -> Result<FromPredecessor, HandoverError> {
        let (header, payload, mut fds) = recv(self.stream, limit)?;
        let malformed = |why: &str| HandoverError::Malformed { what: "DISK", why: why.to_owned() };
        match header.request {
            code::REFUSE => Err(HandoverError::Refused(text(&payload))),
            code::DONE => match (fds.pop(), fds.is_empty()) {
                (Some(listener), true) => Ok(FromPredecessor::Done(listener)),
                _ => Err(HandoverError::Malformed { what: "DONE", why: "expected one descriptor".into() }),
            },
            code::DISK => {
                let [i0, i1, i2, i3, c0, c1, c2, c3, connected, writeback] = payload[..] else {
                    return Err(malformed("expected 10 bytes"));
                };
                let (index, count) =
                    (u32::from_le_bytes([i0, i1, i2, i3]), u32::from_le_bytes([c0, c1, c2, c3]));
                let writeback = (writeback != u8::MAX).then_some(writeback);
                let connected = match connected {
                    0 => false,
                    1 => true,
                    _ => return Err(malformed("the connection flag is neither 0 nor 1")),
                };
                if fds.len() != 1 + usize::from(connected) {
                    return Err(malformed("wrong descriptor count"));
                }
                if count > MAX_SESSION_MESSAGES || (!connected && count != 0) {
                    return Err(malformed("implausible message count"));
                }
                let stream = connected.then(|| fds.pop()).flatten();
                let listener = fds.pop().ok_or_else(|| malformed("no listening socket"))?;
                let mut messages = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    // Within a disk's messages, a pause is a stall.
                    let wire = Wire::new(self.stream, STALL).with_idle_limit(STALL);
                    messages.push(wire.recv()?.ok_or(HandoverError::Closed)?);
                }
                let connection = stream.map(|stream| Connection { stream, messages });
                Ok(FromPredecessor::Disk(index, DiskState { listener, writeback, connection }))
            }
            got => Err(HandoverError::Unexpected { got, expected: "DISK, DONE or REFUSE" }),
        }
    }

    /// Every disk's state was taken.
    pub fn ready(&self) -> Result<(), HandoverError> {
        send(&self.wire(), code::READY, &[], &[])
    }

    /// Give up, saying why.
    pub fn abort(&self, why: &str) -> Result<(), HandoverError> {
        let why = &why.as_bytes()[..why.len().min(MAX_PAYLOAD)];
        send(&self.wire(), code::ABORT, why, &[])
    }

    /// Wait for the commit (within `limit`).
    pub fn committed(&self, limit: Duration) -> Result<(), HandoverError> {
        match recv(self.stream, limit)? {
            (header, ..) if header.request == code::COMMIT => Ok(()),
            (header, ..) => Err(HandoverError::Unexpected { got: header.request, expected: "COMMIT" }),
        }
    }
}

/// What a successor reads from its predecessor, for fuzzing: every message on `stream` read as
/// [`ToPredecessor::next`] reads them (DISK messages with their sessions' vhost-user messages,
/// up to DONE), each disk's cache mode applied to `device` and its session rebuilt by replaying
/// its messages into a new session of `device` with the rings held, as a successor's server
/// thread does before the commit. Nothing is answered, no ring is started and nothing served:
/// each session is dropped once rebuilt. The first error ends it, as it ends a hand-over.
/// Returns the count of disks read; waits at most `limit` for each message to begin.
pub fn read_as_successor(
    stream: &UnixStream,
    device: &mut dyn Device,
    limit: Duration,
) -> Result<usize, HandoverError> {
    let channel = ToPredecessor::new(stream);
    let mut disks = 0;
    loop {
        match channel.next(limit)? {
            FromPredecessor::Done(_listener) => return Ok(disks),
            FromPredecessor::Disk(_index, DiskState { writeback, connection, .. }) => {
                disks += 1;
                if let Some(value) = writeback {
                    device.set_writeback(value).map_err(|error| HandoverError::Replay {
                        request: "the cache mode (SET_CONFIG)",
                        error,
                    })?;
                }
                if let Some(connection) = connection {
                    replay(&mut Session::new(device), connection.messages)?;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::Mutex;

    use virtio::block::{Block, BlockWorker};

    use crate::block::VhostUserBlk;
    use virtqueue::WorkerHost;

    use super::*;

    /// A host that counts the workers attached to it (a started ring) and serves none.
    #[derive(Default)]
    struct Counting(Mutex<usize>);

    impl WorkerHost<BlockWorker> for Counting {
        fn attach(&self, _id: u64, _worker: BlockWorker, _notify: Option<Arc<EventFd>>) {
            *self.0.lock().unwrap() += 1;
        }

        fn detach(&self, _id: u64) -> Option<BlockWorker> {
            None
        }
    }

    fn device(host: Arc<Counting>) -> VhostUserBlk {
        let disk = storage::NullDisk::new(1 << 20, false).unwrap();
        let block =
            Block::with_queues(vec![Box::new(disk)], "handover-unit").unwrap().with_writeback_switch();
        VhostUserBlk::new(block, host)
    }

    fn socket() -> OwnedFd {
        UnixStream::pair().unwrap().0.into()
    }

    #[test]
    fn a_successor_reads_its_predecessors_disks_and_starts_nothing() {
        let host = Arc::new(Counting::default());
        let mut device = device(host.clone());
        let (predecessor, successor) = UnixStream::pair().unwrap();
        let to_successor = ToSuccessor::new(&predecessor);
        // A disk without a frontend, one whose session is a ring's start-up, then DONE.
        let plain = DiskState { listener: socket(), writeback: Some(0), connection: None };
        to_successor.disk(0, &plain).unwrap();
        let features = device.features();
        let messages = vec![
            message(vu::SET_FEATURES, &features.to_le_bytes(), vec![]),
            message(vu::SET_VRING_NUM, &u32_pair(0, 8), vec![]),
            message(vu::SET_VRING_BASE, &u32_pair(0, 0), vec![]),
        ];
        let connected = DiskState {
            listener: socket(),
            writeback: None,
            connection: Some(Connection { stream: socket(), messages }),
        };
        to_successor.disk(1, &connected).unwrap();
        send(&to_successor.wire(), code::DONE, &[], &[socket().as_raw_fd()]).unwrap();
        assert_eq!(read_as_successor(&successor, &mut device, STALL).unwrap(), 2);
        assert_eq!(*host.0.lock().unwrap(), 0, "no ring started before a commit");

        // A session with a request a hand-over never replays is refused.
        let (predecessor, successor) = UnixStream::pair().unwrap();
        let to_successor = ToSuccessor::new(&predecessor);
        let messages = vec![message(vu::GET_FEATURES, &[], vec![])];
        let bad = DiskState {
            listener: socket(),
            writeback: None,
            connection: Some(Connection { stream: socket(), messages }),
        };
        to_successor.disk(0, &bad).unwrap();
        let error = read_as_successor(&successor, &mut device, STALL).unwrap_err();
        assert!(matches!(error, HandoverError::NotReplayed { .. }), "{error}");

        // A channel that ends before DONE, or mid-message.
        let (predecessor, successor) = UnixStream::pair().unwrap();
        ToSuccessor::new(&predecessor)
            .disk(0, &DiskState { listener: socket(), writeback: None, connection: None })
            .unwrap();
        (&predecessor).write_all(&code::DONE.to_le_bytes()).unwrap();
        drop(predecessor);
        assert!(read_as_successor(&successor, &mut device, STALL).is_err());
    }
}
