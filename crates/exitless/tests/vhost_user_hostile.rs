//! `exitless vhost-user-blk` against hostile frontends: a small frontend of our own (the one the
//! vhost-user crate's tests use) talks to the real daemon process over its Unix socket, with
//! descriptors of its choosing (pipes, hung-up sockets, saturated eventfds, a memfd it shrinks)
//! and rings it breaks on purpose. After each attack the daemon must still be alive, must not
//! burn a core, must serve the next, well-behaved frontend (a 4 KiB write read back through the
//! ring) and must stop within two seconds of SIGTERM. Every attack that reaches a ring runs
//! against each backend kind (`test_infra::disks`): a RAM disk finishes a request inside `submit`,
//! an io_uring disk only once the kernel has it, which is where a reset used to wait for ever.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use test_infra::daemon::Daemon;
use test_infra::disks::{DiskKind, TestDisk, DISK_KINDS};
use test_infra::frontend::*;
use test_infra::process_cpu_time;
use vhost_user_protocol::message::{code, Header, VERSION};
use vmm_sys_util::eventfd::EventFd;

const FEATURES: u64 = F_VERSION_1 | F_EVENT_IDX | F_PROTOCOL_FEATURES | F_BLK_FLUSH;
/// SIGTERM ends the daemon within this, whatever the frontend does.
const STOP_LIMIT: Duration = Duration::from_secs(2);
/// While a hostile frontend sits connected, the daemon may use at most CPU_LIMIT of CPU time in
/// CPU_WINDOW (a spinning thread would use all of it).
const CPU_WINDOW: Duration = Duration::from_secs(2);
const CPU_LIMIT: Duration = Duration::from_millis(300);

const DISK_BYTES: u64 = 4 << 20;
/// The disk for the attacks that reach no ring.
const RAM_DISK: &str = "ram=4M";

/// A new disk of `kind` served by the daemon in `io_mode` on DIR/vhost.sock of a new directory,
/// its log in DIR/daemon.log: the directory, the disk and the daemon, to be dropped in the
/// reverse order.
fn serve(kind: DiskKind, io_mode: &str) -> (tempfile::TempDir, TestDisk, Daemon) {
    let dir = tempfile::tempdir().unwrap();
    let disk = kind.make(DISK_BYTES);
    let daemon = Daemon::serving(dir.path(), &disk.spec, io_mode).start_in(dir.path());
    (dir, disk, daemon)
}

/// The daemon's CPU time over CPU_WINDOW must stay under CPU_LIMIT.
fn assert_not_spinning(daemon: &mut Daemon, what: &str) {
    // Zero for a process that has gone: `assert_alive` tells that apart.
    let before = process_cpu_time(daemon.pid());
    std::thread::sleep(CPU_WINDOW);
    let used = process_cpu_time(daemon.pid()).saturating_sub(before);
    daemon.assert_alive();
    assert!(used < CPU_LIMIT, "{what}: the daemon used {used:?} of CPU in {CPU_WINDOW:?}: {}", daemon.log());
}

/// A well-behaved frontend connects and is served: the daemon survived what came before.
fn next_frontend_is_served(daemon: &mut Daemon, seed: u8) {
    daemon.assert_alive();
    let mut frontend = Frontend::ready(daemon.socket(), FEATURES, 0);
    frontend.write_and_read_back(8 * seed as u64, seed);
}

/// Does the daemon close `stream` within `limit` (replies before the end are skipped)?
fn closed_within(stream: &UnixStream, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let mut buf = [0u8; 256];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        stream.set_read_timeout(Some(left)).unwrap();
        match (&*stream).read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return true,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return false,
            Err(e) => panic!("reading from the daemon: {e}"),
        }
    }
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 fills two descriptors, which we then own.
    unsafe {
        assert_eq!(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC), 0);
        (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
    }
}

/// A blocking eventfd whose counter is at its maximum: a write of 1 to it would block.
fn saturated_eventfd() -> EventFd {
    let event = EventFd::new(0).unwrap();
    event.write(u64::MAX - 1).unwrap();
    event
}

#[test]
fn call_err_and_kick_descriptors_that_are_not_eventfds_are_refused() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::serving(dir.path(), RAM_DISK, "eventfd").start_in(dir.path());
    let (pipe_read, pipe_write) = pipe();
    let (hung_up, peer) = UnixStream::pair().unwrap();
    drop(peer);
    let mut last = None;
    for (request, name) in
        [(code::SET_VRING_CALL, "call"), (code::SET_VRING_ERR, "err"), (code::SET_VRING_KICK, "kick")]
    {
        for (fd, kind) in
            [(pipe_write.as_raw_fd(), "a pipe nobody reads"), (hung_up.as_raw_fd(), "a hung-up socket")]
        {
            let mut frontend = Frontend::connect(daemon.socket());
            frontend.negotiate(FEATURES);
            frontend.set_mem_table();
            frontend.set(code::SET_VRING_NUM, &state(0, QUEUE_SIZE as u32), &[]);
            frontend.send(request, &0u64.to_le_bytes(), &[fd]);
            let ack = frontend.expect_closed();
            assert!(
                ack.is_some_and(|a| a != 0),
                "{kind} as {name} fd: a failure acknowledgement, got {ack:?}"
            );
            last = Some(frontend);
        }
    }
    // The last one has not hung up its side; nothing keeps the daemon busy meanwhile.
    assert_not_spinning(&mut daemon, "after refusing non-eventfds");
    drop((last, pipe_read));
    next_frontend_is_served(&mut daemon, 1);
    let log = daemon.stop_within(STOP_LIMIT);
    assert_eq!(log.matches("is not an eventfd").count(), 6, "each refusal logged with its reason: {log}");
}

#[test]
fn call_and_err_eventfds_that_cannot_take_another_count_do_not_block_the_daemon() {
    let _shared = test_infra::alongside_others();
    for kind in DISK_KINDS {
        let (_dir, _disk, mut daemon) = serve(kind, "eventfd");
        let mut frontend = Frontend::ready(daemon.socket(), FEATURES, 0);
        // Blocking eventfds at their maximum: the daemon's next write of 1 to either would block.
        let (call, err) = (saturated_eventfd(), saturated_eventfd());
        frontend.set(code::SET_VRING_CALL, &0u64.to_le_bytes(), &[call.as_raw_fd()]);
        frontend.set(code::SET_VRING_ERR, &0u64.to_le_bytes(), &[err.as_raw_fd()]);
        for seed in 1..=3 {
            frontend.write_and_read_back(0, seed);
        }
        // A broken ring makes the worker signal the error eventfd: an avail entry naming
        // descriptor 200 of a 16-entry queue.
        frontend.publish(0, &[200]);
        std::thread::sleep(Duration::from_millis(200));
        assert_not_spinning(&mut daemon, &format!("{}: after signalling saturated eventfds", kind.name()));
        drop(frontend);
        next_frontend_is_served(&mut daemon, 2);
        let log = daemon.stop_within(STOP_LIMIT);
        assert!(
            !log.contains("backend is lost") && !log.contains("backend is gone"),
            "{}: {log}",
            kind.name()
        );
    }
}

#[test]
fn shrinking_the_shared_memory_under_the_daemon_does_not_kill_it() {
    let _shared = test_infra::alongside_others();
    for kind in DISK_KINDS {
        for io_mode in ["eventfd", "sidecore"] {
            let what = format!("{} {io_mode}", kind.name());
            let (_dir, _disk, mut daemon) = serve(kind, io_mode);
            let mut frontend = Frontend::ready(daemon.socket(), FEATURES, 0);
            frontend.write_and_read_back(0, 1);
            // The rings live 1 MiB into the memfd: after this, touching them raises SIGBUS.
            // SAFETY: ftruncate on our own memfd; this process no longer touches the pages past
            // the first (the frontend only kicks from here on).
            assert_eq!(unsafe { libc::ftruncate(frontend.mem.file.as_raw_fd(), 4096) }, 0);
            frontend.vrings[0].kick.write(1).unwrap();
            assert!(
                closed_within(&frontend.stream, Duration::from_secs(5)),
                "{what}: the daemon drops a frontend whose memory shrank: {}",
                daemon.log()
            );
            assert!(readable(frontend.vrings[0].err.as_raw_fd(), Duration::ZERO), "{what}: error eventfd");
            daemon.assert_alive();
            drop(frontend);
            next_frontend_is_served(&mut daemon, 2);
            let log = daemon.stop_within(STOP_LIMIT);
            assert!(log.contains("shrank"), "{what}: the reason is logged: {log}");
        }
    }
}

/// A head offered twice in one pass, its first copy a write the backend has taken: the device
/// reports NEEDS_RESET through the error eventfd, and the reset that follows the frontend's
/// leaving finishes the write. Regression: on an io_uring disk the pass ended at the duplicate
/// before handing the write to the kernel, so it never finished and the reset waited for it
/// for ever ("a reset is waiting for 1 request(s) the disk still holds"): the next frontend's
/// GET_FEATURES went unanswered. The RAM disk, which finishes a request inside `submit`, never
/// showed it.
#[test]
fn a_duplicate_head_is_reported_costs_no_core_and_the_next_frontend_is_served_at_once() {
    let _shared = test_infra::alongside_others();
    for kind in DISK_KINDS {
        for io_mode in ["eventfd", "adaptive"] {
            let what = format!("{} {io_mode}", kind.name());
            let (_dir, _disk, mut daemon) = serve(kind, io_mode);
            let mut frontend = Frontend::ready(daemon.socket(), FEATURES, 0);
            frontend.mem.write(DATA, &pattern(1));
            let chain = frontend.blk_chain(T_OUT, 0, 4096);
            frontend.write_chain(0, &chain);
            frontend.publish(0, &[0, 0]);
            assert!(
                readable(frontend.vrings[0].err.as_raw_fd(), Duration::from_secs(5)),
                "{what}: the error eventfd fires for a head made available twice: {}",
                daemon.log()
            );
            assert_not_spinning(&mut daemon, &what);
            drop(frontend);
            let started = Instant::now();
            let mut next = Frontend::ready(daemon.socket(), FEATURES, 0);
            // Not a speed test: 4 s tells "at once" from the 5 s wait for requests that never end.
            let took = started.elapsed();
            assert!(
                took < Duration::from_secs(4),
                "{what}: the next frontend waited {took:?}: {}",
                daemon.log()
            );
            // The first copy of the write was served before the reset: it is on the disk.
            next.mem.write(DATA, &[0; 4096]);
            assert_eq!(next.blk(0, T_IN, 0, 4096), 0, "{what}: read status");
            assert_eq!(next.mem.read(DATA, 4096), pattern(1), "{what}: the write before the duplicate");
            next.write_and_read_back(16, 2);
            drop(next);
            let log = daemon.stop_within(STOP_LIMIT);
            assert!(!log.contains("a reset is waiting"), "{what}: {log}");
            assert!(log.contains("was made available again while the device still held it"), "{what}: {log}");
        }
    }
}

/// A daemon paused and resumed (SIGSTOP, SIGCONT: a debugger, a cgroup freeze, a noisy
/// neighbour's job control) while its threads wait with a timeout, with and without a frontend
/// and requests in flight. Regression: the kernel resumes such a wait with restart_syscall,
/// which no seccomp filter allowed, so the first thread to resume killed the daemon (SIGSYS).
#[test]
fn a_daemon_stopped_and_continued_keeps_serving() {
    let _shared = test_infra::alongside_others();
    for kind in DISK_KINDS {
        let (_dir, _disk, mut daemon) = serve(kind, "adaptive");
        let pause = |daemon: &Daemon| {
            for signal in [libc::SIGSTOP, libc::SIGCONT] {
                // SAFETY: kill(2) on our own child's pid.
                assert_eq!(unsafe { libc::kill(daemon.pid() as i32, signal) }, 0);
                std::thread::sleep(Duration::from_millis(300));
            }
        };
        pause(&daemon);
        daemon.assert_alive();
        let mut frontend = Frontend::ready(daemon.socket(), FEATURES, 0);
        frontend.write_and_read_back(0, 1);
        pause(&daemon);
        frontend.write_and_read_back(8, 2);
        drop(frontend);
        next_frontend_is_served(&mut daemon, 3);
        daemon.stop_within(STOP_LIMIT);
    }
}

#[test]
fn an_idle_frontend_does_not_hold_the_disk() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::serving(dir.path(), RAM_DISK, "eventfd").start_in(dir.path());
    // A connects and says nothing.
    let idle = UnixStream::connect(daemon.socket()).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    // B is refused at once, with a reason in the log.
    let second = UnixStream::connect(daemon.socket()).unwrap();
    assert!(closed_within(&second, Duration::from_secs(2)), "a second frontend is refused at once");
    assert!(daemon.log().contains("another frontend is connected to this disk"), "{}", daemon.log());
    // A is dropped once the set-up time (10 s) is over.
    assert!(closed_within(&idle, Duration::from_secs(13)), "an idle frontend is dropped: {}", daemon.log());
    next_frontend_is_served(&mut daemon, 1);
    let log = daemon.stop_within(STOP_LIMIT);
    assert!(log.contains("did not finish setting up"), "{log}");
}

#[test]
fn sigterm_ends_the_daemon_whatever_the_frontend_does() {
    let _shared = test_infra::alongside_others();
    type Attack = fn(&Daemon) -> Vec<Box<dyn std::any::Any>>;
    let attacks: [(&str, Attack); 4] = [
        ("a frontend stalled inside a message", |daemon| {
            let stream = UnixStream::connect(daemon.socket()).unwrap();
            (&stream)
                .write_all(&Header { request: code::GET_FEATURES, flags: VERSION, size: 0 }.to_bytes()[..6])
                .unwrap();
            vec![Box::new(stream)]
        }),
        ("a frontend that never reads its replies", |daemon| {
            let stream = UnixStream::connect(daemon.socket()).unwrap();
            stream.set_nonblocking(true).unwrap();
            let request = Header { request: code::GET_FEATURES, flags: VERSION, size: 0 }.to_bytes();
            let deadline = Instant::now() + Duration::from_secs(10);
            // Until both socket buffers are full: the daemon is then stuck sending a reply.
            let mut full_since: Option<Instant> = None;
            while Instant::now() < deadline {
                match (&stream).write(&request) {
                    Ok(_) => full_since = None,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        if full_since.get_or_insert_with(Instant::now).elapsed() > Duration::from_millis(300)
                        {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) => panic!("the daemon closed the connection early: {e}"),
                }
            }
            vec![Box::new(stream)]
        }),
        ("an idle frontend with a running ring", |daemon| {
            let mut frontend = Frontend::ready(daemon.socket(), FEATURES, 0);
            frontend.write_and_read_back(0, 1);
            vec![Box::new(frontend)]
        }),
        ("a frontend whose call eventfd is saturated", |daemon| {
            let mut frontend = Frontend::ready(daemon.socket(), FEATURES, 0);
            let call = saturated_eventfd();
            frontend.set(code::SET_VRING_CALL, &0u64.to_le_bytes(), &[call.as_raw_fd()]);
            frontend.write_and_read_back(0, 1);
            vec![Box::new(frontend), Box::new(call)]
        }),
    ];
    for kind in DISK_KINDS {
        for (what, attack) in attacks {
            let (_dir, _disk, daemon) = serve(kind, "eventfd");
            let held = attack(&daemon);
            std::thread::sleep(Duration::from_millis(200));
            let log = daemon.stop_within(STOP_LIMIT);
            assert!(
                log.contains("stopping") && !log.contains("exiting without waiting"),
                "{} {what}: an orderly stop, not the watchdog's: {log}",
                kind.name()
            );
            drop(held);
        }
    }
}

/// VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD.
const P_INFLIGHT: u64 = 1 << 12;

/// A frontend with in-flight tracking (GET_INFLIGHT_FD's region, as QEMU takes it) and vring 0
/// running.
fn ready_with_inflight(daemon: &Daemon) -> Frontend {
    use vhost_user_protocol::message::{InflightInfo, Wire, FLAG_REPLY};
    let mut frontend = Frontend::connect(daemon.socket());
    frontend.negotiate_protocol(FEATURES, P_MQ | P_REPLY_ACK | P_CONFIG | P_INFLIGHT);
    let request = InflightInfo { mmap_size: 0, mmap_offset: 0, num_queues: 1, queue_size: QUEUE_SIZE };
    frontend.send_flags(code::GET_INFLIGHT_FD, VERSION, &request.to_bytes(), &[]);
    let (header, _, fds) = Wire::new(&frontend.stream, TIMEOUT)
        .with_idle_limit(TIMEOUT)
        .recv()
        .unwrap()
        .expect("GET_INFLIGHT_FD's reply");
    assert_eq!((header.request, header.flags, fds.len()), (code::GET_INFLIGHT_FD, VERSION | FLAG_REPLY, 1));
    frontend.set_mem_table();
    frontend.start_vring(0, 0);
    frontend
}

/// A read of HELD_SECTOR into DATA on vring 0, which `held` holds (and only it: later requests
/// pass); returns once the FUSE server has it.
fn submit_a_held_read(frontend: &mut Frontend, held: &test_infra::held_disk::HeldDisk, daemon: &Daemon) {
    held.hold_one();
    frontend.mem.write(DATA, &[0; 4096]);
    let chain = frontend.blk_chain(T_IN, HELD_SECTOR, 4096);
    frontend.submit(0, &chain);
    let deadline = Instant::now() + Duration::from_secs(30);
    while held.held().is_none() {
        assert!(Instant::now() < deadline, "the read never reached the FUSE server: {}", daemon.log());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Has the daemon answered a request on vring 0 that the frontend has not yet seen?
fn answered(frontend: &Frontend) -> bool {
    let (_, _, used) = frontend.ring(0);
    frontend.mem.u16(used + 2).load(std::sync::atomic::Ordering::Acquire) != frontend.vrings[0].used_seen
}

/// A read the disk holds past the reset timeout is quarantined when the frontend stops the
/// ring; the frontend starts the ring again on the same in-flight region, which marks the read.
/// The daemon must not resubmit it while the disk may still carry out the original: the driver
/// would be answered, reuse the buffer, and the late original would then overwrite it (for a
/// write: land over a newer write of the block). The ring waits until the disk finishes the
/// quarantined request, then resubmits. Regression: the read was resubmitted at once (the
/// copy passes the FUSE hold), answered, and the late original overwrote the buffer the driver
/// had been given back. (The test holds a read: FUSE serialises direct writes to a file, so a
/// resubmitted write would wait behind the held one there.)
#[test]
fn a_quarantined_request_is_not_resubmitted_until_the_disk_finishes_it() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("backing.img");
    std::fs::write(&file, pattern(9).repeat((DISK_BYTES / 4096) as usize)).unwrap();
    let held = test_infra::held_disk::HeldDisk::start(dir.path(), &file, HELD_SECTOR * 512);
    let (daemon, api) = start_daemon_on_held(dir.path(), &held);
    let mut frontend = ready_with_inflight(&daemon);
    submit_a_held_read(&mut frontend, &held, &daemon);

    // The ring restarts (as on a new memory table or a frontend's stop and start): the stop
    // gives up on the held read after 1 s and quarantines it.
    assert_eq!(frontend.stop_vring(0), 1);
    assert_eq!(reset_figures(&api), [1, 0, 1], "one request quarantined: {}", daemon.log());
    frontend.start_vring(0, 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    let waiting = "waits to start until the disk finishes the 1 request(s) quarantined";
    while !answered(&frontend) && !daemon.log().contains(waiting) {
        assert!(Instant::now() < deadline, "neither answered nor waiting: {}", daemon.log());
        std::thread::sleep(Duration::from_millis(10));
    }
    let answered_while_held = answered(&frontend);
    let reused = pattern(77);
    if answered_while_held {
        // The driver has its answer: it reuses the buffer.
        frontend.mem.write(DATA, &reused);
    }
    held.release(false);
    if !answered_while_held {
        let (head, written) = frontend.wait_used(0);
        assert_eq!((head, written), (0, 4097), "the resubmitted read's answer");
        assert_eq!(frontend.mem.read(STATUS, 1), [0]);
        assert_eq!(frontend.mem.read(DATA, 4096), pattern(9), "the resubmitted read's data");
        frontend.mem.write(DATA, &reused);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while reset_figures(&api) != [1, 0, 0] {
        assert!(Instant::now() < deadline, "the quarantine was never released: {}", daemon.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        frontend.mem.read(DATA, 4096) == reused,
        "the late original read overwrote the buffer the driver had been given back (answered while the disk held the original: {answered_while_held}): {}",
        daemon.log()
    );
    assert!(daemon.log().contains("vring 0 starts: the disk finished the requests quarantined"));
    // And the ring serves on.
    frontend.write_and_read_back(0, 4);
    drop(frontend);
    daemon.stop_within(STOP_LIMIT);
}

/// A hand-over whose rings' stop gives up on a held read (quarantined) is refused: the
/// successor would resubmit the read while this daemon's disk may still carry out the original.
/// The successor exits saying why, and the daemon serves on: its ring waits for the disk, then
/// resubmits the read and answers it.
#[test]
fn a_handover_is_refused_while_the_disk_holds_a_quarantined_request() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("backing.img");
    std::fs::write(&file, pattern(9).repeat((DISK_BYTES / 4096) as usize)).unwrap();
    let held = test_infra::held_disk::HeldDisk::start(dir.path(), &file, HELD_SECTOR * 512);
    let socket = dir.path().join("vhost.sock");
    let handover = dir.path().join("handover.sock");
    let args = held_daemon_args(dir.path(), &held, "--handover-socket", &handover);
    let daemon = Daemon::start(&args, &[&socket, &handover], &dir.path().join("daemon.log"));
    let mut frontend = ready_with_inflight(&daemon);
    submit_a_held_read(&mut frontend, &held, &daemon);

    let mut successor = Daemon::start(&args, &[], &dir.path().join("successor.log"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = successor.child().try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the successor did not exit: {}", successor.log());
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(!status.success(), "the successor took the disk over: {}", successor.log());
    assert!(
        successor.log().contains("quarantined at a reset, which the successor would resubmit"),
        "the successor says why: {}",
        successor.log()
    );
    assert!(!answered(&frontend), "the read was answered while the disk held it: {}", daemon.log());
    held.release(false);
    let (head, written) = frontend.wait_used(0);
    assert_eq!((head, written), (0, 4097), "the resubmitted read's answer: {}", daemon.log());
    assert_eq!(frontend.mem.read(DATA, 4096), pattern(9), "the read's data");
    frontend.write_and_read_back(0, 4);
    drop(frontend);
    daemon.stop_within(STOP_LIMIT);
}

/// The sector `a_disk_that_never_answers_*` holds (2 MiB into the 4 MiB disk): away from sector
/// 0, which the next frontend writes and reads.
const HELD_SECTOR: u64 = 4096;

/// A frontend leaves while the disk holds one of its requests for ever (a FUSE file whose
/// server does not answer: `held_disk.c`): the reset at its disconnection waits for the disk's
/// requests only up to the disk's `reset-timeout` (1 s here), then cancels what the disk holds
/// and, since a FUSE request already sent to its server cannot be cancelled, quarantines it
/// with the old session's memory. The next frontend is served at once (its GET_FEATURES is
/// answered, its I/O elsewhere on the disk done), the operator reads why in the log, and the
/// late completion, when the FUSE server at last answers, is reaped without harm. Regression:
/// the daemon waited for the held request as long as the disk held it.
/// The daemon serving `held`'s file as disk "held" with `reset-timeout=1`, and its control API.
fn start_daemon_on_held(dir: &Path, held: &test_infra::held_disk::HeldDisk) -> (Daemon, std::path::PathBuf) {
    let api = dir.join("api.sock");
    let args = held_daemon_args(dir, held, "--api-socket", &api);
    (Daemon::start(&args, &[&dir.join("vhost.sock"), &api], &dir.join("daemon.log")), api)
}

/// The arguments of a daemon serving `held`'s file as disk "held" with `reset-timeout=1` on
/// DIR/vhost.sock, and `flag` (a second socket) at `path`.
fn held_daemon_args(
    dir: &Path,
    held: &test_infra::held_disk::HeldDisk,
    flag: &str,
    path: &Path,
) -> Vec<String> {
    let spec = format!("path={},reset-timeout=1,name=held", held.disk().display());
    let socket = dir.join("vhost.sock");
    [
        "--disk",
        &spec,
        "--io-mode",
        "eventfd",
        "--socket",
        socket.to_str().unwrap(),
        flag,
        path.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec()
}

/// Disk "held"'s reset_timeouts, reset_cancelled and quarantined, as GET /disks/held shows them.
fn reset_figures(api: &Path) -> [u64; 3] {
    let (status, body) = test_infra::api::http(api, "GET", "/disks/held", None);
    assert_eq!(status, 200, "{body}");
    let disk: serde_json::Value = serde_json::from_str(&body).unwrap();
    let f = &disk["figures"];
    [&f["reset_timeouts"], &f["reset_cancelled"], &f["quarantined"]].map(|v| v.as_u64().unwrap())
}

/// A frontend with vring 0 running and a read of HELD_SECTOR in it, which `held` holds.
fn frontend_with_a_held_read(daemon: &Daemon, held: &test_infra::held_disk::HeldDisk) -> Frontend {
    held.hold();
    let mut frontend = Frontend::ready(daemon.socket(), FEATURES, 0);
    let chain = frontend.blk_chain(T_IN, HELD_SECTOR, 4096);
    frontend.write_chain(0, &chain);
    frontend.publish(0, &[0]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while held.held().is_none() {
        assert!(Instant::now() < deadline, "the read never reached the FUSE server: {}", daemon.log());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(held.held().as_deref(), Some(format!("read {} 4096", HELD_SECTOR * 512).as_str()));
    frontend
}

#[test]
fn a_disk_that_never_answers_does_not_wedge_its_next_frontend() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let file = test_infra::disk_file(dir.path(), "backing.img", DISK_BYTES);
    let held = test_infra::held_disk::HeldDisk::start(dir.path(), &file, HELD_SECTOR * 512);
    let (mut daemon, api) = start_daemon_on_held(dir.path(), &held);
    let figures = || reset_figures(&api);
    assert_eq!(figures(), [0, 0, 0]);
    let first = frontend_with_a_held_read(&daemon, &held);
    drop(first);

    // The bound is 1 s, then the cancels get at most as long again; the log line below tells
    // which bound was used, the elapsed time only guards against a hang.
    let started = Instant::now();
    let mut next = Frontend::ready(daemon.socket(), FEATURES, 0);
    next.write_and_read_back(0, 7);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(30), "the next frontend waited {took:?}: {}", daemon.log());
    let log = daemon.log();
    assert!(
        log.contains("disk 0")
            && log.contains("1 request(s) still held after 1 s at reset; cancelled 0, quarantined 1"),
        "the log says what happened: {log}"
    );
    // The operator sees it: one reset timed out, nothing it cancelled ended (a FUSE request its
    // server took waits out an interrupt), one request quarantined.
    assert_eq!(figures(), [1, 0, 1]);
    let (status, metrics) = test_infra::api::http(&api, "GET", "/metrics", None);
    assert_eq!(status, 200);
    for line in [
        "exitless_disk_reset_timeouts_total{disk=\"held\"} 1",
        "exitless_disk_quarantined_requests{disk=\"held\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    drop(next);

    // The FUSE server answers at last: the late completion lands in the quarantined memory and
    // is reaped with no frontend connecting (it used to wait for the next connection); the
    // daemon goes on serving.
    held.release(false);
    let deadline = Instant::now() + Duration::from_secs(30);
    while figures() != [1, 0, 0] && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(figures(), [1, 0, 0], "the quarantine is released");
    next_frontend_is_served(&mut daemon, 3);
    let log = daemon.stop_within(STOP_LIMIT);
    assert!(log.contains("released"), "the quarantine's release is logged: {log}");
}
