//! `--handover-socket PATH`: a daemon upgraded without a hang-up, whatever its devices are
//! (disks, NICs). The exchange between the two daemons is [`crate::handover`]'s; this module is
//! each daemon's side of it.
//!
//! A daemon started with it first connects to PATH ([`connect`]). If a live daemon answers
//! there, this one is its successor: it asks for the devices it was started with
//! ([`take_over`]), adopts their listening sockets, frontends and sessions, and, once the
//! predecessor commits, serves them and listens on PATH (the predecessor's socket, handed over
//! too) for its own successor. Otherwise it serves its devices as usual and listens on PATH
//! ([`HandoverSocket::bind`]). A listening daemon answers one successor at a time from its
//! control thread ([`HandoverSocket::serve_successor`]): it refuses one whose devices differ,
//! and serves on whenever the hand-over fails before the commit point.
//!
//! What a daemon's devices are is its own: it describes them ([`Devices`]), gives the control
//! thread's end of each one's hand-over ([`Handing`]) and serves a device handed to it
//! ([`Taking`]).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant};

use serde_json::Value;
use thiserror::Error;
use unix_socket::{Access, ListenError};

use crate::handover::{
    Adopted, DiskState, FromPredecessor, Handle, HandoverError, Outcome, ToPredecessor, ToSuccessor,
};

/// How long a successor has to say what it wants once connected.
const HELLO_LIMIT: Duration = Duration::from_secs(5);
/// Beyond the devices' drain limit, how long the predecessor may take to send their state, and
/// the successor to rebuild it.
const MARGIN: Duration = Duration::from_secs(20);

/// A test hook: a successor with this variable set exits (status 3) once it has taken every
/// device's state, before it tells the predecessor it is ready: the predecessor must serve on.
pub const TEST_EXIT_BEFORE_READY: &str = "EXITLESS_TEST_HANDOVER_EXIT_BEFORE_READY";

/// A daemon's devices as a hand-over compares them, in the order its command line gave them.
pub trait Devices {
    /// What one device is called in messages ("disk", "NIC").
    const NOUN: &'static str;

    /// Each device's identity: what must be the same on both sides (its socket, and what its
    /// guest sees of it).
    fn identities(&self) -> Vec<Value>;

    /// How long the slowest device's rings may take to finish what they hold when stopped.
    fn drain_limit(&self) -> Duration;
}

/// The devices a predecessor serves.
pub trait Handing: Devices {
    /// The control thread's end of each device's hand-over, in order; `Err`: why these devices
    /// cannot be handed over.
    fn handles(&self) -> Result<Vec<&Handle>, String>;
}

/// The devices a successor was started with, to be taken over.
pub trait Taking: Devices {
    /// Serve device `index` on `listener`, the predecessor's socket, taking over the frontend
    /// and session `adopted` holds.
    fn adopt(&mut self, index: usize, listener: OwnedFd, adopted: Adopted) -> Result<(), String>;
}

/// Why a hand-over did not happen, on either side: logged, and told to the other daemon.
#[derive(Debug, Error)]
#[allow(missing_docs)] // Each variant's message says what it is.
pub enum HandoverFailed {
    #[error("it runs as another user ({}); nothing is handed to it", uid_text(*.0))]
    Stranger(Option<libc::uid_t>),
    #[error(transparent)]
    Channel(#[from] HandoverError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("the successor's description of its {noun}s is not a JSON array: {source}")]
    Description { noun: &'static str, source: serde_json::Error },
    #[error("the successor has {theirs} {noun}(s), this daemon {ours}")]
    Count { noun: &'static str, theirs: usize, ours: usize },
    #[error("{noun} {index} differs: the successor has {theirs}, this daemon {ours}: start it with the same {noun}s")]
    Differs { noun: &'static str, index: usize, theirs: Value, ours: Value },
    #[error("{0}")]
    Ineligible(String),
    #[error("{noun} {index}: {source}")]
    State { noun: &'static str, index: usize, source: HandoverError },
    #[error("refused: {0}")]
    Refused(Box<HandoverFailed>),
    #[error("{noun} {index} came out of order")]
    OutOfOrder { noun: &'static str, index: u32 },
    #[error("{noun} {index}: {why}")]
    Adopt { noun: &'static str, index: usize, why: String },
    #[error("{handed} {noun}(s) were handed over, {expected} expected")]
    Missing { noun: &'static str, handed: usize, expected: usize },
    #[error("{noun} {index}: cannot take its session over: {why}")]
    Session { noun: &'static str, index: usize, why: String },
    #[error("the hand-over socket it sent is not bound to {}", .0.display())]
    NotBound(PathBuf),
    #[error("cannot confine the hand-over's thread: {0}")]
    Confine(String),
    #[error("cannot start the hand-over's thread: {0}")]
    Thread(std::io::Error),
    #[error("the hand-over's thread panicked")]
    Panicked,
}

/// A successor's failure to take the devices over from the daemon on `path`.
#[derive(Debug, Error)]
#[error("hand-over from the daemon on {}: {reason}", path.display())]
pub struct TakeOverError {
    path: PathBuf,
    reason: Box<HandoverFailed>,
}

/// The socket a daemon listens on for its successor.
pub struct HandoverSocket {
    listener: UnixListener,
    path: PathBuf,
    /// Remove the socket file when dropped (not once a successor has it).
    remove_on_drop: bool,
    /// Hand-overs asked for so far (so late answers of an earlier one are told apart).
    attempts: u64,
    /// This daemon's effective user, the only one a successor may run as (read at set-up,
    /// before the thread's seccomp filter).
    own_user: libc::uid_t,
    /// The socket file's access, to remove it only if it is still ours.
    access: Access,
}

/// Connect to `path` if a live daemon listens there.
pub fn connect(path: &Path) -> Option<UnixStream> {
    UnixStream::connect(path).ok()
}

impl HandoverSocket {
    /// Listen on `path` (a stale socket file there is replaced).
    pub fn bind(path: &Path) -> Result<HandoverSocket, ListenError> {
        // Only this daemon's user may connect (and so be handed the devices): the file is made
        // 0600 from the start, and `serve_successor` checks the successor's user.
        let listener = unix_socket::listen(path, &Access::owner_only())?;
        Ok(HandoverSocket::listening(listener, path))
    }

    /// A socket listening at `path`, which this daemon now owns (and removes when dropped).
    fn listening(listener: UnixListener, path: &Path) -> HandoverSocket {
        HandoverSocket {
            listener,
            path: path.to_owned(),
            remove_on_drop: true,
            attempts: 0,
            own_user: own_user(),
            access: Access::owner_only(),
        }
    }

    /// The listening descriptor, for the control thread's wait.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }

    /// Answer the successor that is connecting: `true` when it has the devices now (this daemon
    /// then exits), `false` when this daemon serves on (the reason is logged).
    pub fn serve_successor<D: Handing>(&mut self, devices: &D) -> bool {
        let stream = match self.listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) => {
                log::warn!("hand-over: cannot accept a successor: {e}");
                return false;
            }
        };
        // The guests' memory and sockets go to whoever connects: only to a process of this
        // daemon's own user (the socket file is the user's alone too).
        if let Err(uid) = same_user(&stream, self.own_user) {
            log::warn!(
                "hand-over: refused a successor of another user ({}, this daemon's uid {}); serving on",
                uid_text(uid),
                self.own_user
            );
            return false;
        }
        if let Err(e) = stream.set_nonblocking(true) {
            log::warn!("hand-over: {e}; serving on");
            return false;
        }
        self.attempts += 1;
        match self.hand_over(&stream, devices, self.attempts) {
            Ok(stopped) => {
                log::info!(
                    "handed every {} over to the successor{} (the rings stopped {:.1} ms before the commit); exiting",
                    D::NOUN,
                    unix_socket::pid_note(&stream),
                    stopped.as_secs_f64() * 1e3
                );
                self.remove_on_drop = false;
                true
            }
            Err(why) => {
                log::warn!(
                    "hand-over to the successor{} did not happen: {why}; serving on",
                    unix_socket::pid_note(&stream)
                );
                false
            }
        }
    }

    /// Hand the devices over; `Ok`: how long before the commit the rings were asked to stop.
    fn hand_over<D: Handing>(
        &self,
        stream: &UnixStream,
        devices: &D,
        attempt: u64,
    ) -> Result<Duration, HandoverFailed> {
        let successor = ToSuccessor::new(stream);
        let hello = successor.hello(HELLO_LIMIT)?;
        let handles = compare::<D>(&hello, &devices.identities())
            .and_then(|()| devices.handles().map_err(HandoverFailed::Ineligible));
        let handles = match handles {
            Ok(handles) => handles,
            Err(why) => {
                let _ = successor.refuse(&why.to_string());
                return Err(HandoverFailed::Refused(Box::new(why)));
            }
        };
        // Every ring of every device stops taking requests and drains, each on its own thread.
        let asked = Instant::now();
        handles.iter().for_each(|h| h.ask(attempt));
        let limit = MARGIN + devices.drain_limit();
        let states: Vec<Result<DiskState, HandoverError>> =
            handles.iter().map(|h| h.state(attempt, limit)).collect();
        let sent = send_states::<D>(&successor, states).and_then(|()| {
            successor.done(self.listener.as_fd(), limit)?;
            // The commit point.
            Ok(successor.commit()?)
        });
        let outcome = if sent.is_ok() { Outcome::Commit } else { Outcome::Resume };
        handles.iter().for_each(|h| h.decide(attempt, outcome));
        sent.map(|()| asked.elapsed())
    }
}

/// Send every device's state, or refuse with the first device's reason for having none.
fn send_states<D: Devices>(
    successor: &ToSuccessor,
    states: Vec<Result<DiskState, HandoverError>>,
) -> Result<(), HandoverFailed> {
    let mut sendable = Vec::with_capacity(states.len());
    for (index, state) in states.into_iter().enumerate() {
        match state {
            Ok(state) => sendable.push(state),
            Err(source) => {
                let why = HandoverFailed::State { noun: D::NOUN, index, source };
                let _ = successor.refuse(&why.to_string());
                return Err(why);
            }
        }
    }
    for (index, state) in sendable.iter().enumerate() {
        successor.disk(u32::try_from(index).unwrap_or(u32::MAX), state)?;
    }
    Ok(())
}

impl Drop for HandoverSocket {
    fn drop(&mut self) {
        if self.remove_on_drop {
            unix_socket::remove_socket(&self.path, &self.access);
        }
    }
}

/// Does the successor's description name the same devices, in the same order?
fn compare<D: Devices>(hello: &[u8], ours: &[Value]) -> Result<(), HandoverFailed> {
    let noun = D::NOUN;
    let theirs: Vec<Value> =
        serde_json::from_slice(hello).map_err(|source| HandoverFailed::Description { noun, source })?;
    if theirs.len() != ours.len() {
        return Err(HandoverFailed::Count { noun, theirs: theirs.len(), ours: ours.len() });
    }
    match theirs.iter().zip(ours).position(|(a, b)| a != b) {
        Some(index) => Err(HandoverFailed::Differs {
            noun,
            index,
            theirs: theirs[index].clone(),
            ours: ours[index].clone(),
        }),
        None => Ok(()),
    }
}

/// Take the devices over from the daemon answering on `path` (connected on `stream`), on a
/// thread of its own that `confine` confines first (the predecessor's messages are bytes from
/// another process), and return the hand-over socket once the predecessor has committed.
pub fn take_over<D: Taking + Send>(
    stream: &UnixStream,
    path: &Path,
    devices: &mut D,
    confine: impl FnOnce() -> Result<(), String> + Send,
) -> Result<HandoverSocket, TakeOverError> {
    let taken = std::thread::scope(|scope| {
        let taker = std::thread::Builder::new().name("handover".into()).spawn_scoped(scope, || {
            confine().map_err(HandoverFailed::Confine)?;
            take_over_from(stream, path, devices)
        });
        match taker {
            Ok(taker) => taker.join().unwrap_or(Err(HandoverFailed::Panicked)),
            Err(e) => Err(HandoverFailed::Thread(e)),
        }
    });
    taken.map_err(|reason| TakeOverError { path: path.to_path_buf(), reason: Box::new(reason) })
}

/// One device handed over, waiting for its server thread's replay and the commit.
struct Waiting {
    replayed: Receiver<Result<(), String>>,
    commit: Sender<bool>,
}

fn take_over_from<D: Taking>(
    stream: &UnixStream,
    path: &Path,
    devices: &mut D,
) -> Result<HandoverSocket, HandoverFailed> {
    let noun = D::NOUN;
    same_user(stream, own_user()).map_err(HandoverFailed::Stranger)?;
    stream.set_nonblocking(true)?;
    let predecessor = ToPredecessor::new(stream);
    let asked = Instant::now();
    let ours = devices.identities();
    // A Vec of JSON values always serializes.
    predecessor.hello(&serde_json::to_vec(&ours).unwrap_or_default())?;
    let limit = MARGIN + devices.drain_limit();
    // Tell the predecessor why, then fail.
    let abort = |why: HandoverFailed| {
        let _ = predecessor.abort(&why.to_string());
        why
    };
    let mut waiting: Vec<Waiting> = Vec::new();
    let handover_listener = loop {
        match predecessor.next(limit)? {
            FromPredecessor::Disk(index, state) => {
                let next = waiting.len();
                if index as usize != next || next >= ours.len() {
                    return Err(HandoverFailed::OutOfOrder { noun, index });
                }
                let (replayed_tx, replayed) = mpsc::channel();
                let (commit, commit_rx) = mpsc::channel();
                let adopted = Adopted {
                    connection: state.connection,
                    writeback: state.writeback,
                    replayed: replayed_tx,
                    commit: commit_rx,
                };
                devices
                    .adopt(next, state.listener, adopted)
                    .map_err(|why| abort(HandoverFailed::Adopt { noun, index: next, why }))?;
                waiting.push(Waiting { replayed, commit });
            }
            FromPredecessor::Done(listener) => break listener,
        }
    };
    if waiting.len() != ours.len() {
        return Err(abort(HandoverFailed::Missing { noun, handed: waiting.len(), expected: ours.len() }));
    }
    for (index, device) in waiting.iter().enumerate() {
        let result = device.replayed.recv_timeout(limit).unwrap_or_else(|_| Err("no answer".into()));
        if let Err(why) = result {
            return Err(abort(HandoverFailed::Session { noun, index, why }));
        }
    }
    if std::env::var_os(TEST_EXIT_BEFORE_READY).is_some() {
        log::warn!("{TEST_EXIT_BEFORE_READY} is set: exiting before the hand-over's commit");
        std::process::exit(3);
    }
    predecessor.ready()?;
    predecessor.committed(limit)?;
    for device in &waiting {
        let _ = device.commit.send(true);
    }
    log::info!(
        "took every {noun} over from the daemon on {} ({:.1} ms from the request to the commit)",
        path.display(),
        asked.elapsed().as_secs_f64() * 1e3
    );
    adopt(handover_listener, path)
}

/// The hand-over socket the predecessor listened on, as this daemon's.
fn adopt(listener: OwnedFd, path: &Path) -> Result<HandoverSocket, HandoverFailed> {
    let listener = UnixListener::from(listener);
    let bound = listener.local_addr()?;
    if bound.as_pathname() != Some(path) {
        return Err(HandoverFailed::NotBound(path.to_path_buf()));
    }
    listener.set_nonblocking(false)?;
    Ok(HandoverSocket::listening(listener, path))
}

/// Does the process at the other end of `stream` run as `user`? `Err`: its user, if known.
fn same_user(stream: &UnixStream, user: libc::uid_t) -> Result<(), Option<libc::uid_t>> {
    match unix_socket::peer_credentials(stream) {
        Ok(cred) if cred.uid == user => Ok(()),
        cred => Err(cred.ok().map(|c| c.uid)),
    }
}

fn uid_text(uid: Option<libc::uid_t>) -> String {
    uid.map_or_else(|| "uid unknown".into(), |uid| format!("uid {uid}"))
}

/// This process's effective user.
fn own_user() -> libc::uid_t {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::{compare, Devices};
    use serde_json::{json, Value};
    use std::time::Duration;

    struct Disks;

    impl Devices for Disks {
        const NOUN: &'static str = "disk";
        fn identities(&self) -> Vec<Value> {
            Vec::new()
        }
        fn drain_limit(&self) -> Duration {
            Duration::ZERO
        }
    }

    #[test]
    fn a_successor_must_describe_the_same_devices_in_the_same_order() {
        let a = json!({"socket": "/a.sock", "disk": {"path": "a.img"}, "queues": 1, "serial": "s0"});
        let b = json!({"socket": "/b.sock", "disk": {"path": "b.img"}, "queues": 1, "serial": "s1"});
        let ours = [a.clone(), b.clone()];
        let hello = |disks: &[Value]| serde_json::to_vec(disks).unwrap();
        assert!(compare::<Disks>(&hello(&ours), &ours).is_ok());
        let swapped = compare::<Disks>(&hello(&[b.clone(), a.clone()]), &ours).unwrap_err().to_string();
        assert!(swapped.starts_with("disk 0 differs"), "{swapped}");
        let fewer = compare::<Disks>(&hello(std::slice::from_ref(&a)), &ours).unwrap_err().to_string();
        assert_eq!(fewer, "the successor has 1 disk(s), this daemon 2");
        let mut more_queues = b.clone();
        more_queues["queues"] = json!(2);
        let differs = compare::<Disks>(&hello(&[a, more_queues]), &ours).unwrap_err().to_string();
        assert!(differs.starts_with("disk 1 differs"), "{differs}");
        let garbage = compare::<Disks>(b"not json", &ours).unwrap_err().to_string();
        assert!(garbage.contains("not a JSON array"), "{garbage}");
    }
}
