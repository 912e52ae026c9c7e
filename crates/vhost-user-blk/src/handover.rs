//! `--handover-socket PATH`: upgrading the daemon without a hang-up (see
//! `vhost_user::handover` for the exchange).
//!
//! A daemon started with it first connects to PATH. If a live daemon answers there, this one is
//! its successor: it asks for the disks it was started with ([`take_over`]), adopts their
//! listening sockets, frontends and sessions, and, once the predecessor commits, serves them
//! and listens on PATH (the predecessor's socket, handed over too) for its own successor.
//! Otherwise it opens its disks as usual and listens on PATH ([`HandoverSocket::bind`]).
//! A listening daemon answers one successor at a time from its control thread
//! ([`HandoverSocket::serve_successor`]): it refuses one whose disks differ, and serves on
//! whenever the hand-over fails before the commit point.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;
use thiserror::Error;
use unix_socket::{Access, ListenError};
use vhost_user::handover::{
    Adopted, DiskState, FromPredecessor, HandoverError, Outcome, ToPredecessor, ToSuccessor,
};

use crate::disks::{identity, DiskError, Disks, Listen};
use crate::spec::VhostDisk;

/// How long a successor has to say what it wants once connected.
const HELLO_LIMIT: Duration = Duration::from_secs(5);
/// Beyond the disks' reset timeouts (how long their rings may take to drain), how long the
/// predecessor may take to send the disks' state, and the successor to rebuild it.
const MARGIN: Duration = Duration::from_secs(20);

/// A test hook: a successor with this variable set exits (status 3) once it has taken every
/// disk's state, before it tells the predecessor it is ready: the predecessor must serve on.
pub const TEST_EXIT_BEFORE_READY: &str = "EXITLESS_TEST_HANDOVER_EXIT_BEFORE_READY";

/// Why a hand-over did not happen, on either side: logged, and told to the other daemon.
#[derive(Debug, Error)]
pub enum HandoverFailed {
    #[error("it runs as another user ({}); its disks are not taken", uid_text(*.0))]
    Stranger(Option<libc::uid_t>),
    #[error(transparent)]
    Channel(#[from] HandoverError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("the successor's description of its disks is not a JSON array: {0}")]
    Description(serde_json::Error),
    #[error("the successor has {theirs} disk(s), this daemon {ours}")]
    DiskCount { theirs: usize, ours: usize },
    #[error(
        "disk {index} differs: the successor has {theirs}, this daemon {ours}: start it with the same disks"
    )]
    DiskDiffers { index: usize, theirs: Value, ours: Value },
    #[error("disk {0} is a new RAM disk (ram=SIZE), whose contents live only in this daemon; serve a /dev/shm file (ram,path=FILE) to upgrade without losing them")]
    NewRamDisk(usize),
    #[error("a disk added through the control API cannot be handed over")]
    ApiDisk,
    #[error("disk {index}: {source}")]
    DiskState { index: usize, source: HandoverError },
    #[error("refused: {0}")]
    Refused(Box<HandoverFailed>),
    #[error("disk {0} came out of order")]
    OutOfOrder(u32),
    #[error(transparent)]
    Disk(#[from] DiskError),
    #[error("{handed} disk(s) were handed over, {expected} expected")]
    Missing { handed: usize, expected: usize },
    #[error("disk {index}: cannot take its session over: {why}")]
    Session { index: usize, why: String },
    #[error("the hand-over socket it sent is not bound to {}", .0.display())]
    NotBound(PathBuf),
}

/// A successor's failure to take the disks over from the daemon on `path`.
#[derive(Debug, Error)]
#[error("hand-over from the daemon on {}: {reason}", path.display())]
pub struct TakeOverError {
    path: PathBuf,
    reason: HandoverFailed,
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
        // Only this daemon's user may connect (and so be handed the disks): the file is made
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
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.listener.as_fd()
    }

    /// Answer the successor that is connecting: `true` when it has the disks now (this daemon
    /// then exits), `false` when this daemon serves on (the reason is logged).
    pub fn serve_successor(&mut self, disks: &Disks) -> bool {
        let stream = match self.listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) => {
                log::warn!("hand-over: cannot accept a successor: {e}");
                return false;
            }
        };
        // The disks' memory and sockets go to whoever connects: only to a process of this
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
        match self.hand_over(&stream, disks, self.attempts) {
            Ok(stopped) => {
                log::info!(
                    "handed every disk over to the successor{} (the rings stopped {:.1} ms before the commit); exiting",
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

    /// Hand the disks over; `Ok`: how long before the commit the rings were asked to stop.
    fn hand_over(
        &self,
        stream: &UnixStream,
        disks: &Disks,
        attempt: u64,
    ) -> Result<Duration, HandoverFailed> {
        let successor = ToSuccessor::new(stream);
        let hello = successor.hello(HELLO_LIMIT)?;
        let ours = disks.in_order();
        if let Err(why) = compare(&hello, &ours.iter().map(|d| d.identity()).collect::<Vec<_>>())
            .and_then(|()| eligible(ours.iter().map(|d| &d.spec)))
        {
            let _ = successor.refuse(&why.to_string());
            return Err(HandoverFailed::Refused(Box::new(why)));
        }
        let handles: Vec<_> = ours.iter().filter_map(|d| d.handover()).collect();
        if handles.len() != ours.len() {
            let why = HandoverFailed::ApiDisk;
            let _ = successor.refuse(&why.to_string());
            return Err(why);
        }
        // Every ring of every disk stops taking requests and drains, each on its own thread.
        let asked = Instant::now();
        handles.iter().for_each(|h| h.ask(attempt));
        let limit = MARGIN + ours.iter().map(|d| reset_timeout(&d.spec)).max().unwrap_or_default();
        let states: Vec<Result<DiskState, HandoverError>> =
            handles.iter().map(|h| h.state(attempt, limit)).collect();
        let sent = send_states(&successor, states).and_then(|()| {
            successor.done(self.listener.as_fd(), limit)?;
            // The commit point.
            Ok(successor.commit()?)
        });
        let outcome = if sent.is_ok() { Outcome::Commit } else { Outcome::Resume };
        handles.iter().for_each(|h| h.decide(attempt, outcome));
        sent.map(|()| asked.elapsed())
    }
}

/// Send every disk's state, or refuse with the first disk's reason for having none.
fn send_states(
    successor: &ToSuccessor,
    states: Vec<Result<DiskState, HandoverError>>,
) -> Result<(), HandoverFailed> {
    let mut sendable = Vec::with_capacity(states.len());
    for (index, state) in states.into_iter().enumerate() {
        match state {
            Ok(state) => sendable.push(state),
            Err(source) => {
                let why = HandoverFailed::DiskState { index, source };
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

fn reset_timeout(spec: &VhostDisk) -> Duration {
    spec.reset_timeout.unwrap_or(virtio::block::worker::RESET_WAIT)
}

/// Can these disks be handed over? A new RAM disk's contents live only in its daemon.
fn eligible<'a>(mut specs: impl Iterator<Item = &'a VhostDisk>) -> Result<(), HandoverFailed> {
    match specs.position(|s| matches!(s.disk, storage::DiskSpec::Ram { .. })) {
        Some(index) => Err(HandoverFailed::NewRamDisk(index)),
        None => Ok(()),
    }
}

/// Does the successor's description name the same disks, in the same order?
fn compare(hello: &[u8], ours: &[Value]) -> Result<(), HandoverFailed> {
    let theirs: Vec<Value> = serde_json::from_slice(hello).map_err(HandoverFailed::Description)?;
    if theirs.len() != ours.len() {
        return Err(HandoverFailed::DiskCount { theirs: theirs.len(), ours: ours.len() });
    }
    match theirs.iter().zip(ours).position(|(a, b)| a != b) {
        Some(index) => Err(HandoverFailed::DiskDiffers {
            index,
            theirs: theirs[index].clone(),
            ours: ours[index].clone(),
        }),
        None => Ok(()),
    }
}

/// Take the disks over from the daemon answering on `path` (connected on `stream`): adopt each
/// disk into `disks`, and return the hand-over socket once the predecessor has committed.
pub fn take_over(
    stream: &UnixStream,
    path: &Path,
    disks: &mut Disks,
    specs: &[(VhostDisk, PathBuf)],
) -> Result<HandoverSocket, TakeOverError> {
    take_over_from(stream, path, disks, specs)
        .map_err(|reason| TakeOverError { path: path.to_path_buf(), reason })
}

fn take_over_from(
    stream: &UnixStream,
    path: &Path,
    disks: &mut Disks,
    specs: &[(VhostDisk, PathBuf)],
) -> Result<HandoverSocket, HandoverFailed> {
    same_user(stream, own_user()).map_err(HandoverFailed::Stranger)?;
    stream.set_nonblocking(true)?;
    let predecessor = ToPredecessor::new(stream);
    let asked = Instant::now();
    let description: Vec<Value> = specs
        .iter()
        .enumerate()
        .map(|(index, (spec, socket))| {
            let queues = spec.queues.unwrap_or(disks.default_queues());
            let serial = spec.serial.clone().unwrap_or_else(|| format!("vhost-user-disk{index}"));
            identity(spec, socket, queues, &serial)
        })
        .collect();
    // A Vec of JSON values always serializes.
    let description = serde_json::to_vec(&description).unwrap_or_default();
    predecessor.hello(&description)?;
    let limit = MARGIN + specs.iter().map(|(s, _)| reset_timeout(s)).max().unwrap_or_default();
    // Tell the predecessor why, then fail.
    let abort = |why: HandoverFailed| {
        let _ = predecessor.abort(&why.to_string());
        why
    };
    let mut waiting = Vec::new();
    let handover_listener = loop {
        match predecessor.next(limit)? {
            FromPredecessor::Disk(index, state) => {
                let Some((spec, socket)) =
                    specs.get(waiting.len()).filter(|_| index as usize == waiting.len())
                else {
                    return Err(HandoverFailed::OutOfOrder(index));
                };
                let (replayed, replay_result) = mpsc::channel();
                let (commit_tx, commit) = mpsc::channel();
                let adopted =
                    Adopted { connection: state.connection, writeback: state.writeback, replayed, commit };
                let listen = Listen::Adopt { listener: state.listener, adopted };
                disks.add_on(spec.clone(), socket.clone(), listen).map_err(|e| abort(e.into()))?;
                waiting.push((replay_result, commit_tx));
            }
            FromPredecessor::Done(listener) => break listener,
        }
    };
    if waiting.len() != specs.len() {
        return Err(abort(HandoverFailed::Missing { handed: waiting.len(), expected: specs.len() }));
    }
    for (index, (replay_result, _)) in waiting.iter().enumerate() {
        let result = replay_result.recv_timeout(limit).unwrap_or_else(|_| Err("no answer".into()));
        if let Err(why) = result {
            return Err(abort(HandoverFailed::Session { index, why }));
        }
    }
    if std::env::var_os(TEST_EXIT_BEFORE_READY).is_some() {
        log::warn!("{TEST_EXIT_BEFORE_READY} is set: exiting before the hand-over's commit");
        std::process::exit(3);
    }
    predecessor.ready()?;
    predecessor.committed(limit)?;
    for (_, commit) in &waiting {
        let _ = commit.send(true);
    }
    log::info!(
        "took every disk over from the daemon on {} ({:.1} ms from the request to the commit)",
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
    use super::{compare, eligible};
    use crate::spec;
    use serde_json::json;

    #[test]
    fn a_successor_must_describe_the_same_disks_in_the_same_order() {
        let a = json!({"socket": "/a.sock", "disk": {"path": "a.img"}, "queues": 1, "serial": "s0"});
        let b = json!({"socket": "/b.sock", "disk": {"path": "b.img"}, "queues": 1, "serial": "s1"});
        let ours = [a.clone(), b.clone()];
        let hello = |disks: &[serde_json::Value]| serde_json::to_vec(disks).unwrap();
        assert!(compare(&hello(&ours), &ours).is_ok());
        let swapped = compare(&hello(&[b.clone(), a.clone()]), &ours).unwrap_err().to_string();
        assert!(swapped.starts_with("disk 0 differs"), "{swapped}");
        let fewer = compare(&hello(std::slice::from_ref(&a)), &ours).unwrap_err().to_string();
        assert_eq!(fewer, "the successor has 1 disk(s), this daemon 2");
        let mut more_queues = b.clone();
        more_queues["queues"] = json!(2);
        let differs = compare(&hello(&[a, more_queues]), &ours).unwrap_err().to_string();
        assert!(differs.starts_with("disk 1 differs"), "{differs}");
        assert!(compare(b"not json", &ours).unwrap_err().to_string().contains("not a JSON array"));
    }

    #[test]
    fn a_new_ram_disk_cannot_be_handed_over() {
        let file = spec::parse("socket=/a.sock,path=/tmp/a.img").unwrap();
        let ram = spec::parse("socket=/b.sock,ram=1M").unwrap();
        assert!(eligible([&file].into_iter()).is_ok());
        let refused = eligible([&file, &ram].into_iter()).unwrap_err().to_string();
        assert!(refused.starts_with("disk 1 is a new RAM disk (ram=SIZE)"), "{refused}");
    }
}
