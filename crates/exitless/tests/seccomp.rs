//! The per-thread seccomp filters in the real processes: `exitless run` and `exitless
//! vhost-user-blk` confine every thread they run by default, each under its own kind's filter
//! (the kernel shows the filter mode in /proc/PID/task/TID/status and the program to a tracer),
//! and still do their work; `--seccomp off` confines nothing; and one call outside its
//! allowlist from any kind of thread (`EXITLESS_SECCOMP_SELF_TEST`) kills the process.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use storage::testing::ceph::TestCluster;
use test_infra::daemon::Daemon;
use test_infra::{line_with, stderr};

/// /proc's `Seccomp:` value for a thread confined by a filter.
const SECCOMP_MODE_FILTER: &str = "2";
const DEADLINE: Duration = Duration::from_secs(60);

/// Thread name -> `Seccomp:` value, for every thread of `pid` (names repeat: the last wins).
fn seccomp_by_thread(pid: u32) -> HashMap<String, String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return HashMap::new() };
    tasks
        .flatten()
        .filter_map(|task| {
            let status = std::fs::read_to_string(task.path().join("status")).ok()?;
            let field =
                |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim().to_string());
            Some((field("Name:")?, field("Seccomp:")?))
        })
        .collect()
}

/// PTRACE_SECCOMP_GET_FILTER (linux/ptrace.h), which the libc crate does not name.
const PTRACE_SECCOMP_GET_FILTER: libc::c_uint = 0x420c;
/// PF_IO_WORKER and PF_USER_WORKER (linux/sched.h), in /proc/PID/task/TID/stat's flags: a kernel
/// thread in the process (an io_uring worker, KVM's `kvm-nx-lpage-recovery`) that never returns
/// to user space, so runs none of exitless's code.
const PF_KERNEL_WORKER: u64 = 0x10 | 0x4000;

/// A seccomp filter's BPF program, as `(code, jt, jf, k)` instructions.
type Program = Vec<(u16, u8, u8, u32)>;

/// One thread of a process, as /proc shows it.
#[derive(Debug)]
struct Task {
    tid: i32,
    name: String,
    /// The `Seccomp:` value of its status.
    seccomp: String,
    /// A kernel thread (`PF_KERNEL_WORKER`).
    kernel_worker: bool,
}

/// Every thread of `pid`, by TID (not by name: names repeat, and a new thread may have any).
fn tasks(pid: u32) -> Vec<Task> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the process's /proc/PID/task");
    tasks
        .flatten()
        .filter_map(|task| {
            let tid = task.file_name().to_str()?.parse().ok()?;
            // A thread that ended since the directory was read has no files left: skipped.
            let status = std::fs::read_to_string(task.path().join("status")).ok()?;
            let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
            let field =
                |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim().to_string());
            // "TID (comm) STATE PPID PGRP SESSION TTY TPGID FLAGS ...": the comm may hold
            // spaces; the fields after its last ')' are STATE onwards.
            let flags: u64 = stat.rsplit_once(')')?.1.split_whitespace().nth(6)?.parse().ok()?;
            Some(Task {
                tid,
                name: field("Name:")?,
                seccomp: field("Seccomp:")?,
                kernel_worker: flags & PF_KERNEL_WORKER != 0,
            })
        })
        .collect()
}

/// The programs of the filters thread `tid` runs under, oldest first (the newest, installed by
/// the thread itself, is the one its kind names; the older ones it inherited), read by ptrace:
/// the thread is seized, stopped for a moment and let go (a system call it sleeps in is
/// restarted, as after SIGSTOP).
fn filters(tid: i32) -> Result<Vec<Program>, String> {
    let fail = |what: &str| format!("{what} of thread {tid}: {}", std::io::Error::last_os_error());
    // SAFETY: ptrace requests on a thread of our own child, with no pointers.
    if unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid, 0usize, 0usize) } != 0 {
        return Err(fail("PTRACE_SEIZE"));
    }
    // SAFETY: as above.
    if unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0usize, 0usize) } != 0 {
        return Err(fail("PTRACE_INTERRUPT"));
    }
    let mut status = 0;
    // SAFETY: waits for our tracee; `status` is a valid out-pointer.
    if unsafe { libc::waitpid(tid, &mut status, libc::__WALL) } != tid || !libc::WIFSTOPPED(status) {
        return Err(format!("thread {tid} did not stop for its tracer (wait status {status:#x})"));
    }
    // A signal that arrived first stopped it instead of the interrupt: delivered on detach.
    let signal = if status >> 16 == 0 { libc::WSTOPSIG(status) } else { 0 };
    // The kernel numbers a thread's filters from its oldest (0); past the newest: ENOENT.
    let mut programs = Vec::new();
    let read_error = loop {
        let index = programs.len();
        // SAFETY: with a null buffer, PTRACE_SECCOMP_GET_FILTER only counts the instructions.
        let count =
            unsafe { libc::ptrace(PTRACE_SECCOMP_GET_FILTER, tid, index, std::ptr::null_mut::<u8>()) };
        if count < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT) {
            break None;
        }
        let Ok(len) = usize::try_from(count) else { break Some(fail("PTRACE_SECCOMP_GET_FILTER")) };
        let mut program = vec![libc::sock_filter { code: 0, jt: 0, jf: 0, k: 0 }; len];
        // SAFETY: the buffer holds the `count` instructions the kernel said this filter has.
        if unsafe { libc::ptrace(PTRACE_SECCOMP_GET_FILTER, tid, index, program.as_mut_ptr()) } != count {
            break Some(fail("PTRACE_SECCOMP_GET_FILTER"));
        }
        programs.push(program.iter().map(|i| (i.code, i.jt, i.jf, i.k)).collect());
    };
    // SAFETY: lets our stopped tracee go, with the signal it stopped for (if any).
    if unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0usize, signal as usize) } != 0 {
        return Err(fail("PTRACE_DETACH"));
    }
    match read_error {
        Some(error) => Err(error),
        None => Ok(programs),
    }
}

/// Assert that every thread of `pid` (found by TID) runs under a filter (`Seccomp: 2`), and that
/// the filter it installed last is the one of the kind `kind_of(is_main_thread, name)` gives it,
/// compiled here as the process compiled it (kill mode). A thread `kind_of` does not know fails
/// too: each new thread must be given its kind here. Kernel threads of the process (io_uring's
/// workers, KVM's), which run none of exitless's code, are left out. Returns `TID name: kind`
/// for each thread checked.
fn assert_every_thread_confined(
    pid: u32,
    kind_of: impl Fn(bool, &str) -> Option<sandbox::ThreadKind>,
) -> Vec<String> {
    let programs: Vec<_> = sandbox::ThreadKind::ALL
        .iter()
        .map(|&kind| (kind, sandbox::Filter::new(kind, sandbox::SeccompMode::Kill).unwrap().instructions()))
        .collect();
    let tasks = tasks(pid);
    let mut checked = Vec::new();
    for task in tasks.iter().filter(|task| !task.kernel_worker) {
        let Task { tid, name, .. } = task;
        assert_eq!(
            task.seccomp, SECCOMP_MODE_FILTER,
            "thread {tid} ({name}) runs under no filter: {tasks:?}"
        );
        let kind = kind_of(*tid == pid as i32, name).unwrap_or_else(|| {
            panic!("thread {tid} ({name}) is of no known kind: give it one here: {tasks:?}")
        });
        // Each filter the thread runs under, by the kind whose program it is.
        let under: Vec<String> = filters(*tid)
            .unwrap_or_else(|e| panic!("{e}"))
            .iter()
            .map(|filter| {
                programs.iter().find(|(_, p)| p == filter).map_or("no kind's".into(), |(k, _)| k.to_string())
            })
            .collect();
        assert_eq!(
            under.last().map(String::as_str),
            Some(kind.to_string().as_str()),
            "thread {tid} ({name}): the filter it installed last is not the {kind} filter (its filters, oldest first: {under:?})"
        );
        checked.push(format!("{tid} {name}: {kind}"));
    }
    checked
}

/// Wait until every thread named in `names` shows up confined, or `child` ends, or the deadline.
fn wait_until_confined(child: &mut Child, names: &[&str]) -> HashMap<String, String> {
    let start = Instant::now();
    loop {
        let threads = seccomp_by_thread(child.id());
        let all = names.iter().all(|n| threads.get(*n).is_some_and(|v| v == SECCOMP_MODE_FILTER));
        if all || start.elapsed() > DEADLINE || child.try_wait().ok().flatten().is_some() {
            return threads;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn run_confines_its_vcpu_and_iocore_threads_and_the_probe_still_does_its_io() {
    let _shared = test_infra::alongside_others();
    // The probe idles after its requests, so the threads are there to look at (for much longer
    // than looking takes).
    let cmdline = "probe.workload=blk probe.rw=randread probe.qd=4 probe.ops=2000 probe.idle_ms=10000";
    let mut child = Command::new(env!("CARGO_BIN_EXE_exitless"))
        .args(["run", "--probe", "--disk", "ram=16M", "--io-mode", "adaptive", "--timeout", "120"])
        .args(["--cmdline", cmdline])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start exitless run");
    // The main thread (named after the program) too, once the vCPUs run.
    let threads = wait_until_confined(&mut child, &["vcpu0", "iocore", "exitless"]);
    for name in ["vcpu0", "iocore", "exitless"] {
        assert_eq!(threads.get(name).map(String::as_str), Some(SECCOMP_MODE_FILTER), "{name}: {threads:?}");
    }
    use sandbox::ThreadKind;
    let checked = assert_every_thread_confined(child.id(), |main, name| match name {
        _ if main => Some(ThreadKind::VmmMain),
        "iocore" => Some(ThreadKind::IoCore),
        name if name.strip_prefix("vcpu").is_some_and(|n| n.parse::<u32>().is_ok()) => Some(ThreadKind::Vcpu),
        _ => None,
    });
    eprintln!("threads checked: {checked:?}");
    let out = child.wait_with_output().expect("exitless run ends");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let line = line_with(&out, "probe", "blk");
    assert_eq!(line["errors"], 0, "{line}");
    assert_eq!(line["post_idle_errors"], 0, "{line}");
}

/// A migration's destination waits for its source on a thread already confined by its filter,
/// which reads and parses every byte of the stream; the main thread used to accept and parse it
/// unconfined.
#[test]
fn a_migration_destination_reads_its_stream_on_a_confined_thread() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("destination.mig");
    let url = format!("unix:{}", socket.display());
    let mut child = Command::new(env!("CARGO_BIN_EXE_exitless"))
        .args(["run", "--receive-migration", &url, "--timeout", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start exitless run");
    let threads = wait_until_confined(&mut child, &["state-reader"]);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        threads.get("state-reader").map(String::as_str),
        Some(SECCOMP_MODE_FILTER),
        "no confined reader waits for the source: {threads:?}"
    );
}

/// Over TCP with mutual TLS, the destination's handshakes run on that confined reader too:
/// strangers (one without a certificate, one that speaks no TLS) are refused under its filter,
/// which kills the process on a call it lacks, and the reader waits on, confined. The
/// destination runs on a simulated host of its own (a network namespace).
#[test]
fn a_tls_migration_destination_shakes_hands_on_its_confined_reader() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let hosts = exitless_bench::hosts::HostPair::new().unwrap_or_else(|e| panic!("{e}"));
    let ip = exitless_bench::hosts::DESTINATION_IP;
    let certs = dir.path().join("certs");
    exitless_bench::hosts::make_certificates(&certs, &[&ip.to_string()]).unwrap_or_else(|e| panic!("{e}"));
    let tls = certs.join(ip.to_string());
    let log = dir.path().join("destination.err");
    let url = format!("tcp:{ip}:7070");
    let mut child = hosts
        .on_destination(env!("CARGO_BIN_EXE_exitless"))
        .args(["run", "--receive-migration", &url, "--migration-tls-dir", tls.to_str().unwrap()])
        .args(["--timeout", "60"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start exitless run");
    let threads = wait_until_confined(&mut child, &["state-reader"]);
    assert_eq!(threads.get("state-reader").map(String::as_str), Some(SECCOMP_MODE_FILTER), "{threads:?}");
    let stranger = |args: &[&str]| {
        hosts
            .on_destination("timeout")
            .args(["30", "openssl", "s_client", "-connect", &format!("{ip}:7070")])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("the openssl command")
    };
    stranger(&["-CAfile", tls.join("ca.pem").to_str().unwrap()]);
    let plain = exitless_bench::hosts::thread_in(&hosts.destination, move || {
        let mut conn = std::net::TcpStream::connect((ip, 7070)).unwrap();
        let _ = conn.write_all(b"EXLMIGR1");
        let _ = conn.shutdown(std::net::Shutdown::Write);
        let _ = conn.read_to_end(&mut Vec::new());
    });
    plain.join().unwrap();
    let started = Instant::now();
    let refused = loop {
        let err = std::fs::read_to_string(&log).unwrap_or_default();
        if err.matches("refused a migration connection").count() >= 2 || started.elapsed() > DEADLINE {
            break err;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let alive = child.try_wait().unwrap().is_none();
    let threads = seccomp_by_thread(child.id());
    let _ = child.kill();
    let _ = child.wait();
    assert!(alive, "the destination died (SIGSYS: a call its reader's filter lacks?): {refused}");
    assert!(
        refused.contains("presented no certificate") && refused.contains("does not speak TLS"),
        "{refused}"
    );
    assert_eq!(threads.get("state-reader").map(String::as_str), Some(SECCOMP_MODE_FILTER), "{threads:?}");
}

/// `exitless vhost-user-blk` on a socket in `dir`, with `seccomp`, listening.
fn daemon_with_seccomp(dir: &Path, seccomp: &str) -> (Daemon, PathBuf) {
    let daemon = Daemon::serving(dir, "ram=16M", "eventfd").args(&["--seccomp", seccomp], &[]).start_in(dir);
    let socket = daemon.socket().to_owned();
    (daemon, socket)
}

/// Connect as a frontend and ask for the features (VHOST_USER_GET_FEATURES): once the answer
/// is in, the daemon's connection thread is serving, past the point where it confines itself.
fn get_features(socket: &Path) -> u64 {
    let start = Instant::now();
    let mut stream = loop {
        match UnixStream::connect(socket) {
            Ok(stream) => break stream,
            Err(e) if start.elapsed() > DEADLINE => panic!("cannot connect to {}: {e}", socket.display()),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    const GET_FEATURES: u32 = 1;
    const VERSION_1: u32 = 1;
    let header: Vec<u8> = [GET_FEATURES, VERSION_1, 0].iter().flat_map(|w| w.to_le_bytes()).collect();
    stream.write_all(&header).expect("send GET_FEATURES");
    let mut reply = [0u8; 20];
    stream.read_exact(&mut reply).expect("the reply");
    u64::from_le_bytes(reply[12..].try_into().unwrap())
}

/// SIGTERM, then the exit status and the log.
fn stop(daemon: Daemon) -> (Option<i32>, String) {
    let (status, log) = daemon.stop_status();
    (status.code(), log)
}

#[test]
fn vhost_user_daemon_confines_its_connection_and_iocore_threads_and_still_serves() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let (mut daemon, socket) = daemon_with_seccomp(dir.path(), "kill");
    assert_ne!(get_features(&socket), 0, "a frontend's GET_FEATURES is answered");
    let threads = wait_until_confined(daemon.child(), &["exitless", "iocore"]);
    let (status, log) = stop(daemon);
    assert_eq!(status, Some(0), "SIGTERM ends the confined daemon cleanly: {log}");
    for name in ["exitless", "iocore"] {
        assert_eq!(threads.get(name).map(String::as_str), Some(SECCOMP_MODE_FILTER), "{name}: {threads:?}");
    }
    assert!(!socket.exists(), "the confined daemon removed its socket on the way out");
}

#[test]
fn a_daemon_with_a_control_api_confines_every_thread_and_adds_disks_under_its_filters() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let api = dir.path().join("api.sock");
    let mut daemon = Daemon::builder()
        .io_mode("eventfd")
        .args(&["--seccomp".as_ref(), "kill".as_ref(), "--api-socket".as_ref(), api.as_os_str()], &[&api])
        // The file disk is looked up beneath this directory (openat2) under the filter.
        .args(&["--api-disk-dir".as_ref(), dir.path().as_os_str()], &[])
        .start(&dir.path().join("daemon.log"));
    let threads = wait_until_confined(daemon.child(), &["exitless", "iocore", "api"]);
    for name in ["exitless", "iocore", "api"] {
        assert_eq!(threads.get(name).map(String::as_str), Some(SECCOMP_MODE_FILTER), "{name}: {threads:?}");
    }
    // A file disk and a RAM disk, each added and served under the filters.
    let image = dir.path().join("disk.img");
    std::fs::write(&image, vec![0u8; 1 << 20]).unwrap();
    let disks = [
        ("file", format!(r#""path": "{}", "direct": true"#, image.display())),
        ("ram", r#""ram": "1M""#.into()),
    ];
    for (name, disk) in &disks {
        let socket = dir.path().join(format!("{name}.sock"));
        let body = format!(r#"{{"socket": "{}", {disk}}}"#, socket.display());
        let put = format!("PUT /disks/{name} HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        let answer = http(&api, &put);
        assert!(answer.starts_with("HTTP/1.1 201 "), "{answer}\n{}", daemon.log());
        assert_ne!(get_features(&socket), 0, "the added disk is served");
    }
    // Every thread the daemon now runs (its disks' connection threads too), by TID, under the
    // filter of its kind.
    use sandbox::ThreadKind;
    let checked = assert_every_thread_confined(daemon.pid(), |main, name| match name {
        _ if main => Some(ThreadKind::DaemonControl),
        "iocore" => Some(ThreadKind::VhostUserIoCore),
        "api" => Some(ThreadKind::ApiServer),
        "stop-watchdog" => Some(ThreadKind::StopWatchdog),
        // Started before the control thread confines itself, for disks the API adds on RBD.
        "rbd-client" => Some(ThreadKind::RbdClient),
        name if name.strip_prefix("vhost-user-").is_some_and(|n| n.parse::<u32>().is_ok()) => {
            Some(ThreadKind::VhostUserConnection)
        }
        _ => None,
    });
    eprintln!("threads checked: {checked:?}");
    assert_eq!(
        checked.iter().filter(|thread| thread.ends_with(": vhost-user connection")).count(),
        disks.len(),
        "a connection thread per disk: {checked:?}"
    );
    // Their frontends gone (the connections closed above), the disks can go too.
    for (name, _) in &disks {
        let deadline = Instant::now() + DEADLINE;
        while !http(&api, &format!("DELETE /disks/{name} HTTP/1.1\r\n\r\n")).starts_with("HTTP/1.1 204 ") {
            assert!(Instant::now() < deadline, "disk {name} never removed: {}", daemon.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let metrics = http(&api, "GET /metrics HTTP/1.1\r\n\r\n");
    assert!(metrics.contains("exitless_iocore_busy_seconds_total"), "{metrics}");
    daemon.assert_alive();
    let (status, log) = stop(daemon);
    assert_eq!(status, Some(0), "{log}");
    assert!(!api.exists(), "the API's socket is removed on the way out");
}

#[test]
fn the_net_daemon_confines_every_thread_and_still_serves() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let sockets = [dir.path().join("a.sock"), dir.path().join("b.sock")];
    let api = dir.path().join("api.sock");
    // Two IOCores, each with a switch of its own.
    let line =
        ["vhost-user-net", "--seccomp", "kill", "--iocores", "2", "--api-socket", api.to_str().unwrap()];
    let mut command = exitless(&line);
    for (i, socket) in sockets.iter().enumerate() {
        command.args(["--nic", &format!("socket={},mac=52:54:00:00:00:0{}", socket.display(), i + 1)]);
    }
    let mut child = command.stderr(Stdio::piped()).spawn().unwrap();
    for socket in &sockets {
        assert_ne!(get_features(socket), 0, "{}: a frontend's GET_FEATURES is answered", socket.display());
    }
    wait_until_confined(&mut child, &["exitless", "iocore", "nic-0", "nic-1", "api"]);
    // A NIC added through the API is served too, from a thread the control thread starts.
    let c = dir.path().join("c.sock");
    let body = format!(r#"{{"socket": "{}", "mac": "52:54:00:00:00:03"}}"#, c.display());
    let put = format!("PUT /nics/c HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    let answer = http(&api, &put);
    assert!(answer.starts_with("HTTP/1.1 201 "), "{answer}");
    assert_ne!(get_features(&c), 0, "the added NIC is served");
    let metrics = http(&api, "GET /metrics HTTP/1.1\r\n\r\n");
    assert!(metrics.contains("exitless_nic_tx_frames_total"), "{metrics}");
    use sandbox::ThreadKind;
    let checked = assert_every_thread_confined(child.id(), |main, name| match name {
        _ if main => Some(ThreadKind::DaemonControl),
        "iocore" => Some(ThreadKind::SwitchIoCore),
        "api" => Some(ThreadKind::ApiServer),
        "stop-watchdog" => Some(ThreadKind::StopWatchdog),
        name if name.strip_prefix("nic-").is_some_and(|n| n.parse::<u32>().is_ok()) => {
            Some(ThreadKind::VhostUserConnection)
        }
        _ => None,
    });
    eprintln!("threads checked: {checked:?}");
    assert_eq!(checked.iter().filter(|t| t.contains(" nic-")).count(), 3, "a thread per NIC: {checked:?}");
    assert_eq!(checked.iter().filter(|t| t.contains(" iocore:")).count(), 2, "an IOCore each: {checked:?}");
    // SAFETY: kill(2) on our own child, which has not been waited for yet.
    unsafe { libc::kill(libc::pid_t::try_from(child.id()).unwrap(), libc::SIGTERM) };
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "SIGTERM ends it cleanly: {}", stderr(&output));
    for socket in &sockets {
        assert!(!socket.exists(), "{} is removed on the way out", socket.display());
    }
}

/// The names librados and librbd give the threads they start (Ceph 16), all under the RBD client
/// filter.
const LIBRBD_THREADS: &[&str] = &[
    "rbd-client",
    "log",
    "service",
    "admin_socket",
    "msgr-worker-0",
    "msgr-worker-1",
    "msgr-worker-2",
    "ms_dispatch",
    "ms_local",
    "safe_timer",
    "fn_anonymous",
    "io_context_pool",
    "taskfin_librbd",
    "ceph_timer",
    "signal_handler",
];

#[test]
fn a_daemon_serving_an_rbd_disk_runs_librbds_threads_under_their_own_filter() {
    // A guest that polls and librbd's threads take both CPUs: alone, as every RBD test with a guest.
    let _one = test_infra::one_at_a_time();
    let cluster = TestCluster::get();
    cluster.image("confined", 4 << 20);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("rbd.sock");
    let disk = format!("rbd=rbd/confined,conf={},queues=2", cluster.conf().display());
    let mut daemon = Daemon::builder()
        .io_mode("adaptive")
        .args(&["--seccomp", "kill"], &[])
        .disk_on(&socket, &disk)
        .start(&dir.path().join("daemon.log"));
    // Served: the probe's verify through the daemon, librbd's threads working under the filter.
    let vhost_user = format!("vhost-user={}", socket.display());
    let cmdline = "probe.workload=blk probe.rw=verify probe.ops=100 probe.qd=8";
    let out = exitless(&["run", "--probe", "--disk", &vhost_user, "--cmdline", cmdline, "--timeout", "60"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    use sandbox::ThreadKind;
    let checked = assert_every_thread_confined(daemon.pid(), |main, name| match name {
        // Without a control API, the main thread serves the one disk's socket.
        _ if main => Some(ThreadKind::VhostUserConnection),
        "iocore" => Some(ThreadKind::VhostUserIoCore),
        "stop-watchdog" => Some(ThreadKind::StopWatchdog),
        name if name.strip_prefix("vhost-user-").is_some_and(|n| n.parse::<u32>().is_ok()) => {
            Some(ThreadKind::VhostUserConnection)
        }
        name if LIBRBD_THREADS.contains(&name) => Some(ThreadKind::RbdClient),
        _ => None,
    });
    eprintln!("threads checked: {checked:?}");
    let librbd = checked.iter().filter(|thread| thread.ends_with(": RBD client")).count();
    assert!(librbd > 5, "the RBD client thread and librbd's own: {checked:?}");
    daemon.assert_alive();
    let (status, log) = stop(daemon);
    assert_eq!(status, Some(0), "{log}");
}

/// One raw HTTP exchange on the control API's socket: the whole answer.
fn http(api: &Path, request: &str) -> String {
    let mut stream = UnixStream::connect(api).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

#[test]
fn seccomp_off_confines_no_thread() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let (daemon, socket) = daemon_with_seccomp(dir.path(), "off");
    get_features(&socket);
    let threads = seccomp_by_thread(daemon.pid());
    let (status, log) = stop(daemon);
    assert_eq!(status, Some(0), "{log}");
    assert!(threads.contains_key("iocore"), "{threads:?}");
    assert!(threads.values().all(|v| v == "0"), "{threads:?}");
}

/// `exitless ARGS`, to run with a self-test.
fn exitless(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_exitless"));
    command.args(args);
    command
}

/// `command` with `EXITLESS_SECCOMP_SELF_TEST=kind`, until it ends (or is killed at the
/// deadline, failing the test): its exit status.
fn with_self_test(kind: &str, mut command: Command) -> std::process::ExitStatus {
    let mut child = command
        .env(sandbox::SELF_TEST_ENV, kind)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start exitless");
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{command:?} with the {kind} self-test did not end");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn one_forbidden_call_from_any_kind_of_thread_kills_the_process() {
    let _shared = test_infra::alongside_others();
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("vhost.sock");
    let daemon = Daemon::builder().disk("ram=16M").io_mode("sidecore").socket(&socket);
    let probe = ["run", "--probe", "--disk", "ram=16M", "--io-mode", "exitless", "--timeout", "30"];
    // The test device's ping-pong responder starts when the guest asks for it.
    let pingpong =
        ["run", "--probe", "--timeout", "30", "--cmdline", "probe.workload=exitcost probe.ops=pingpong"];
    for kind in sandbox::ThreadKind::ALL {
        let name = kind.name();
        let status = match kind {
            sandbox::ThreadKind::Vcpu | sandbox::ThreadKind::IoCore | sandbox::ThreadKind::VmmMain => {
                with_self_test(name, exitless(&probe))
            }
            sandbox::ThreadKind::PingPong => with_self_test(name, exitless(&pingpong)),
            // A pinned polling IOCore is watched while it is in the idle class.
            sandbox::ThreadKind::IoCoreWatch => {
                with_self_test(name, exitless(&[&probe[..], &["--iocore-cpu", "0"]].concat()))
            }
            sandbox::ThreadKind::SwitchIoCore => {
                let nic = format!("socket={},mac=52:54:00:00:00:01", dir.path().join("nic.sock").display());
                with_self_test(name, exitless(&["vhost-user-net", "--seccomp", "kill", "--nic", &nic]))
            }
            sandbox::ThreadKind::VhostUserIoCore
            | sandbox::ThreadKind::VhostUserConnection
            | sandbox::ThreadKind::StopWatchdog => with_self_test(name, daemon.command()),
            sandbox::ThreadKind::ApiServer | sandbox::ThreadKind::DaemonControl => {
                let api = dir.path().join("api.sock");
                let mut command = daemon.command();
                command.arg("--api-socket").arg(&api);
                let status = with_self_test(name, command);
                let _ = std::fs::remove_file(&api);
                status
            }
            sandbox::ThreadKind::VmmApi => {
                let api = dir.path().join("vm-api.sock");
                let api = api.to_str().unwrap();
                let status = with_self_test(name, exitless(&[&probe[..], &["--api-socket", api]].concat()));
                let _ = std::fs::remove_file(api);
                status
            }
            sandbox::ThreadKind::Migration => {
                // The live-migration sender starts with a VM that has a control API and can be
                // migrated (no disk here), idle until asked to migrate.
                let api = dir.path().join("vm-api-migration.sock");
                let api = api.to_str().unwrap();
                let args = ["run", "--probe", "--timeout", "30", "--api-socket", api];
                let status = with_self_test(name, exitless(&args));
                let _ = std::fs::remove_file(api);
                status
            }
            sandbox::ThreadKind::StateReader => {
                // A destination's stream reader confines itself before it accepts its source.
                let socket = dir.path().join("self-test.mig");
                let url = format!("unix:{}", socket.display());
                let status =
                    with_self_test(name, exitless(&["run", "--receive-migration", &url, "--timeout", "30"]));
                let _ = std::fs::remove_file(&socket);
                status
            }
            sandbox::ThreadKind::RbdClient => {
                // The RBD client thread installs its filter before it connects.
                let cluster = TestCluster::get();
                cluster.image("self-test", 1 << 20);
                let disk = format!("rbd=rbd/self-test,conf={}", cluster.conf().display());
                with_self_test(name, exitless(&["run", "--probe", "--disk", &disk, "--timeout", "30"]))
            }
            sandbox::ThreadKind::VhostUserWatch => {
                // A healthy daemon, and the self-test in the frontend VMM's watcher.
                let (daemon, socket) = daemon_with_seccomp(dir.path(), "kill");
                get_features(&socket); // Listening, and served.
                let vhost_user = format!("vhost-user={}", socket.display());
                let status = with_self_test(
                    name,
                    exitless(&["run", "--probe", "--disk", &vhost_user, "--timeout", "30"]),
                );
                let _ = stop(daemon);
                status
            }
        };
        assert_eq!(status.signal(), Some(libc::SIGSYS), "the {kind} thread's forbidden call: {status:?}");
        let _ = std::fs::remove_file(&socket);
    }
}

/// The state letter of every thread of `pid` (R, S, T, ...), from /proc/PID/task/TID/stat.
fn thread_states(pid: u32) -> Vec<char> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .flatten()
        .filter_map(|task| {
            let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
            // "TID (comm) STATE ...": the comm may hold spaces, the state follows its last ')'.
            stat.rsplit_once(')')?.1.trim_start().chars().next()
        })
        .collect()
}

/// Wait until every thread of `child` is in `state`, or it ends, or the deadline passes.
fn wait_for_threads(child: &mut Child, state: char) {
    let start = Instant::now();
    while !thread_states(child.id()).iter().all(|&s| s == state) {
        if start.elapsed() > DEADLINE || child.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A stopped and continued process (job control, a debugger, a freezer) resumes each sleep it
/// was in with restart_syscall, which the filters once lacked: the daemon died of SIGSYS.
#[test]
fn a_confined_daemon_survives_sigstop_and_sigcont() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let (mut daemon, socket) = daemon_with_seccomp(dir.path(), "kill");
    let child = daemon.child();
    get_features(&socket);
    wait_until_confined(child, &["exitless", "iocore"]);
    // Every thread asleep in its poll, epoll_wait or futex, to be interrupted there.
    wait_for_threads(child, 'S');
    // SAFETY: kill(2) on our own child's pid, not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) };
    wait_for_threads(child, 'T');
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGCONT) };
    wait_for_threads(child, 'S');
    let (status, log) = stop(daemon);
    assert_eq!(status, Some(0), "the daemon did not survive SIGSTOP and SIGCONT: {log}");
}
