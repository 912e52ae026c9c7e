//! A disk handed from one server to another (`vhost_user::handover`) under a test frontend that
//! stays connected: the frontend's ring, memory and writes carry over, so does half a message
//! it sent while the disk changed hands, a hand-over that is not
//! committed leaves the first server serving, and a successor refuses state that is not a
//! session's. Real sockets, IOCore threads and RAM disks; no VM.

use std::io::Write;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use iocore::{IoCore, Policy};
use storage::{Backend, RamDisk};
use test_infra::frontend::*;
use vhost_user::handover::{
    port, Adopted, DiskState, FromPredecessor, Handle, Outcome, ToPredecessor, ToSuccessor,
};
use vhost_user::{Server, VhostUserBlk};
use vhost_user_protocol::message::{code, Header, VERSION};
use virtio::block::Block;
use vmm_sys_util::eventfd::EventFd;

const FEATURES: u64 = F_VERSION_1 | F_EVENT_IDX | F_PROTOCOL_FEATURES | F_BLK_FLUSH;
const LIMIT: Duration = Duration::from_secs(10);

/// A device on a RAM disk served by a `Server` in its own thread, with a hand-over port.
struct Serving {
    stop: EventFd,
    handle: Handle,
    thread: Option<JoinHandle<()>>,
}

fn device(disk: &Path) -> VhostUserBlk {
    let backend: Box<dyn Backend> = Box::new(RamDisk::open(disk, false).unwrap());
    let block = Block::with_queues(vec![backend], "handover-test").unwrap().with_writeback_switch();
    VhostUserBlk::new(block, Arc::new(IoCore::spawn(Policy::Notified, None).unwrap()))
}

impl Serving {
    fn start(disk: &Path, server: Server, adopted: Option<Adopted>) -> Serving {
        let mut device = device(disk);
        let (handle, port) = port().unwrap();
        let stop = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let stop_fd = stop.try_clone().unwrap();
        let thread = std::thread::spawn(move || {
            // SAFETY: `stop_fd` lives in this closure until `serve_with` returns.
            let stop = unsafe { BorrowedFd::borrow_raw(stop_fd.as_raw_fd()) };
            server.serve_with(&mut device, Some(stop), Some(&port), adopted).unwrap();
        });
        Serving { stop, handle, thread: Some(thread) }
    }

    /// Has its thread ended (the disk handed over, or not taken over)?
    fn ended(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.stop.write(1);
        if let Some(thread) = self.thread.take() {
            let result = thread.join();
            if !std::thread::panicking() {
                result.expect("the server thread panicked");
            }
        }
    }
}

struct Rig {
    _dir: tempfile::TempDir,
    disk: PathBuf,
    socket: PathBuf,
}

impl Rig {
    fn new() -> Rig {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let disk = dir.path().join("disk");
        drop(RamDisk::create(&disk, MIB).unwrap());
        let socket = dir.path().join("sock");
        Rig { _dir: dir, disk, socket }
    }
}

/// Ask `old` for its disk's state and pass it over a socket pair, as two daemons would: the
/// successor's view of it.
fn pass_state(old: &Serving, attempt: u64) -> DiskState {
    old.handle.ask(attempt);
    let state = old.handle.state(attempt, LIMIT).unwrap();
    let (a, b) = UnixStream::pair().unwrap();
    ToSuccessor::new(&a).disk(0, &state).unwrap();
    match ToPredecessor::new(&b).next(LIMIT).unwrap() {
        FromPredecessor::Disk(0, state) => state,
        _ => panic!("expected disk 0"),
    }
}

/// A successor's server for `state`: its replay result and the commit sender.
fn adopt(rig: &Rig, state: DiskState) -> (Serving, Receiver<Result<(), String>>, Sender<bool>) {
    let (replayed, replay_result) = mpsc::channel();
    let (commit, committed) = mpsc::channel();
    let adopted =
        Adopted { connection: state.connection, writeback: state.writeback, replayed, commit: committed };
    let server = Server::adopt(state.listener, &rig.socket, unix_socket::Access::owner_only()).unwrap();
    (Serving::start(&rig.disk, server, Some(adopted)), replay_result, commit)
}

/// A successor adopts `state` (attempt 1) and `old` commits: returns once `old` has ended.
fn take_over(rig: &Rig, old: Serving, state: DiskState) -> Serving {
    let (new, replay_result, commit) = adopt(rig, state);
    assert_eq!(replay_result.recv_timeout(LIMIT).unwrap(), Ok(()));
    old.handle.decide(1, Outcome::Commit);
    commit.send(true).unwrap();
    while !old.ended() {
        std::thread::sleep(Duration::from_millis(5));
    }
    new
}

#[test]
fn a_connected_frontend_is_handed_over_and_served_on_without_reconnecting() {
    let rig = Rig::new();
    let old = Serving::start(&rig.disk, Server::bind(&rig.socket).unwrap(), None);
    let mut frontend = Frontend::connect(&rig.socket);
    frontend.negotiate(FEATURES);
    frontend.set_writeback(0);
    frontend.set_mem_table();
    frontend.start_vring(0, 0);
    frontend.write_and_read_back(8, 1);

    let state = pass_state(&old, 1);
    assert!(state.connection.as_ref().is_some_and(|c| !c.messages.is_empty()));
    // The old server has stopped reading: the first half of a GET_FEATURES it never sees waits
    // in the socket for the new one.
    let get_features = Header { request: 1, flags: VERSION, size: 0 }.to_bytes();
    (&frontend.stream).write_all(&get_features[..7]).unwrap();
    assert_eq!(state.writeback, Some(0), "the driver's write-through mode goes along");
    let new = take_over(&rig, old, state);
    // The old server ended, and left the socket file to the new one.
    assert!(rig.socket.exists());

    // The rest of that message, and the new server answers it.
    (&frontend.stream).write_all(&get_features[7..]).unwrap();
    let features = u64::from_le_bytes(frontend.reply(1).try_into().unwrap());
    assert_ne!(features & F_PROTOCOL_FEATURES, 0, "{features:#x}");
    // The same connection, the same ring (its next avail index carried over), a new server.
    frontend.write_and_read_back(16, 2);
    assert_eq!(frontend.config(32, 1), [0], "write through, as the driver left it");
    // A new frontend is refused while this one is served: the adopted listener is the disk's.
    let mut another = Frontend::connect(&rig.socket);
    assert_eq!(another.expect_closed(), None);
    frontend.write_and_read_back(24, 3);
    drop(new);
    assert!(!rig.socket.exists(), "the new server removes the socket file it now owns");
}

/// Bytes of dirty log for the test's guest memory (up to 1 GiB + 1 MiB, a bit per 4 KiB).
const LOG_LEN: usize = ((REGION_B_GPA + MIB) / 4096 / 8) as usize;

/// QEMU gives its dirty log (SET_LOG_BASE) and only then acks LOG_ALL (SET_FEATURES): a disk
/// handed over between the two carries the log, so the successor marks the pages its ring
/// writes once LOG_ALL comes. Regression: the log stayed with the predecessor, the successor
/// took LOG_ALL with no log, and a read marked nothing (a live migration would copy stale
/// pages).
#[test]
fn a_dirty_log_given_before_a_handover_is_marked_by_the_successor() {
    let rig = Rig::new();
    std::fs::write(&rig.disk, pattern(5).repeat(256)).unwrap();
    let old = Serving::start(&rig.disk, Server::bind(&rig.socket).unwrap(), None);
    let mut frontend = Frontend::connect(&rig.socket);
    frontend.negotiate_protocol(FEATURES, P_MQ | P_REPLY_ACK | P_CONFIG | P_LOG_SHMFD);
    frontend.set_mem_table();
    frontend.start_vring(0, 0);
    let log = DirtyLogFile::new(LOG_LEN, true);
    frontend.send(code::SET_LOG_BASE, &log_base_payload(LOG_LEN as u64, 0), &[log.file.as_raw_fd()]);
    assert_eq!(frontend.reply(code::SET_LOG_BASE), 0u64.to_le_bytes(), "SET_LOG_BASE's reply");

    let state = pass_state(&old, 1);
    let new = take_over(&rig, old, state);

    // The migration goes on with the successor: LOG_ALL, and the used ring logged.
    frontend.set(code::SET_FEATURES, &(FEATURES | F_LOG_ALL).to_le_bytes(), &[]);
    let (_, _, used) = frontend.ring(0);
    frontend.set_vring_addr(0, 1, used);
    log.clear();
    frontend.mem.write(DATA, &[0u8; 4096]);
    assert_eq!(frontend.blk(0, T_IN, 8, 4096), 0);
    assert_eq!(frontend.mem.read(DATA, 4096), pattern(5), "the read's data");
    let page = |gpa: u64| gpa / 4096;
    assert_eq!(
        log.dirty_pages(),
        vec![page(DATA), page(STATUS), page(used)],
        "the successor marks the read's data, status and used ring pages"
    );
    drop(new);
}

#[test]
fn a_handover_that_is_not_committed_leaves_the_old_server_serving() {
    let rig = Rig::new();
    let old = Serving::start(&rig.disk, Server::bind(&rig.socket).unwrap(), None);
    let mut frontend = Frontend::ready(&rig.socket, FEATURES, 0);
    frontend.write_and_read_back(8, 1);
    for attempt in 1..=2 {
        // The successor rebuilt the session but the predecessor did not commit (it died, say).
        let (new, replay_result, commit) = adopt(&rig, pass_state(&old, attempt));
        assert_eq!(replay_result.recv_timeout(LIMIT).unwrap(), Ok(()));
        drop(commit);
        while !new.ended() {
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(new);
        assert!(rig.socket.exists(), "a successor that did not take over leaves the socket file");
        old.handle.decide(attempt, Outcome::Resume);
        frontend.write_and_read_back(8 * (attempt + 1), 1 + attempt as u8);
    }
    assert!(!old.ended());
}

#[test]
fn a_successor_refuses_what_does_not_rebuild_a_session() {
    let rig = Rig::new();
    let old = Serving::start(&rig.disk, Server::bind(&rig.socket).unwrap(), None);
    let mut frontend = Frontend::ready(&rig.socket, FEATURES, 0);
    let mut state = pass_state(&old, 1);
    // A request that reads or stops state, slipped in among the session's.
    let connection = state.connection.as_mut().unwrap();
    let get_vring_base = Header { request: 11, flags: VERSION, size: 8 };
    connection.messages.insert(0, (get_vring_base, vec![0; 8], vec![]));
    let (new, replay_result, _commit) = adopt(&rig, state);
    let refused = replay_result.recv_timeout(LIMIT).unwrap().unwrap_err();
    assert!(refused.contains("GET_VRING_BASE: not a message a hand-over rebuilds"), "{refused}");
    while !new.ended() {
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(new);
    old.handle.decide(1, Outcome::Resume);
    frontend.write_and_read_back(8, 5);

    // A ring base that is not a 16-bit index: the same check a frontend's message gets.
    let mut state = pass_state(&old, 2);
    let connection = state.connection.as_mut().unwrap();
    let base = connection.messages.iter_mut().find(|(h, ..)| h.request == 10).unwrap();
    base.1[4..8].copy_from_slice(&0x1_0000u32.to_le_bytes());
    let (new, replay_result, _commit) = adopt(&rig, state);
    let refused = replay_result.recv_timeout(LIMIT).unwrap().unwrap_err();
    assert!(refused.contains("SET_VRING_BASE") && refused.contains("16-bit"), "{refused}");
    drop(new);
    old.handle.decide(2, Outcome::Resume);
    frontend.write_and_read_back(16, 6);
}
