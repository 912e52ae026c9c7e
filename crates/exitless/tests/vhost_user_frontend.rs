//! `exitless run --disk vhost-user=SOCKET`: the exitless VMM as the frontend of a real
//! `exitless vhost-user-blk` daemon, with the probe guest on real KVM. Behaviour, not timing:
//! verify passes and the host file holds the pattern, two VMs share one daemon's IOCore, a
//! missing socket or a daemon killed mid-run ends the VM with an error (never a hang), and
//! polled I/O through the daemon makes no exit per request (KVM's counts).

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use test_infra::daemon::Daemon;
use test_infra::one_at_a_time;
use test_infra::{disk_file, exitless_within, json_lines, line_with, stderr, stdout, verify_cmdline};

/// Far beyond what a run takes; a run that takes longer is stuck, and fails the test.
const RUN_LIMIT: Duration = Duration::from_secs(120);
const DISK_BYTES: u64 = 8 << 20;

/// `--disk socket=SOCK,path=FILE,direct` for the daemon.
fn daemon_disk(socket: &Path, file: &Path) -> String {
    format!("socket={},path={},direct", socket.display(), file.display())
}

fn run_args(socket: &Path, guest_mode: &str, cmdline: &str) -> Vec<String> {
    [
        "run",
        "--probe",
        "--disk",
        &format!("vhost-user={}", socket.display()),
        "--io-mode",
        guest_mode,
        "--cmdline",
        cmdline,
        "--timeout",
        "60",
        "--stats",
        "--json",
    ]
    .map(String::from)
    .to_vec()
}

fn run_vm(socket: &Path, guest_mode: &str, cmdline: &str) -> Output {
    let args = run_args(socket, guest_mode, cmdline);
    exitless_within(RUN_LIMIT, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// The verify most of these runs do: 300 blocks at depth 8 with `seed`.
fn verify(seed: u64) -> String {
    verify_cmdline(300, 8, seed)
}

/// The guest's verify result passed, and the VMM's report names the vhost-user disk.
fn assert_verified(out: &Output, what: &str) {
    assert_eq!(out.status.code(), Some(0), "{what}: {}\n{}", stdout(out), stderr(out));
    let result = line_with(out, "probe", "blk");
    assert_eq!(result["mismatches"], 0, "{what}: {result}");
    assert_eq!(result["errors"], 0, "{what}: {result}");
    assert_eq!(result["flush"], true, "{what}: FLUSH offered by the daemon and answered");
    let stats = json_lines(out).into_iter().find(|l| l["exitless"] == "run").expect("stats line");
    let device = &stats["devices"][0];
    assert_eq!(device["device"], "vhost-user-blk", "{what}: {stats}");
    assert_eq!(device["needs_reset"], 0, "{what}: {device}");
    assert!(device["activations"].as_u64().unwrap() >= 1, "{what}: {device}");
    // The daemon counts the requests; the VMM says it does not know them.
    assert!(device["completed"].is_null(), "{what}: {device}");
}

#[test]
fn verify_through_the_daemon_in_its_sidecore_and_eventfd_modes_polled_and_interrupted() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let mut seed = 200;
    for daemon_mode in ["sidecore", "eventfd"] {
        let socket = dir.path().join(format!("{daemon_mode}.sock"));
        let file = disk_file(dir.path(), &format!("{daemon_mode}.img"), DISK_BYTES);
        let args = [
            "--disk".to_string(),
            daemon_disk(&socket, &file),
            "--io-mode".to_string(),
            daemon_mode.to_string(),
        ];
        let daemon = Daemon::start(&args, &[&socket], &dir.path().join("daemon.log"));
        // exitless: the guest polls the used ring; eventfd: it takes interrupts (the daemon's
        // call eventfd is the device's irqfd).
        for (guest_mode, completion) in [("exitless", "poll"), ("eventfd", "interrupt")] {
            seed += 1;
            let what = format!("daemon {daemon_mode}, guest {guest_mode}");
            let out = run_vm(&socket, guest_mode, &verify(seed));
            assert_verified(&out, &format!("{what}; daemon: {}", daemon.log()));
            assert_eq!(line_with(&out, "probe", "blk")["completion"], completion, "{what}");
            test_infra::assert_holds_only_pattern(&file, seed, 300);
        }
    }
}

#[test]
fn two_vms_share_one_daemon_and_its_one_iocore() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let disks: Vec<(PathBuf, PathBuf)> = (0..2)
        .map(|i| {
            (dir.path().join(format!("vm{i}.sock")), disk_file(dir.path(), &format!("vm{i}.img"), DISK_BYTES))
        })
        .collect();
    let mut args = Vec::new();
    for (socket, file) in &disks {
        args.extend(["--disk".to_string(), daemon_disk(socket, file)]);
    }
    args.extend(["--iocores", "1", "--io-mode", "adaptive"].map(String::from));
    let sockets: Vec<&Path> = disks.iter().map(|(s, _)| s.as_path()).collect();
    let daemon = Daemon::start(&args, &sockets, &dir.path().join("daemon.log"));
    let runs: Vec<_> = disks
        .iter()
        .enumerate()
        .map(|(i, (socket, _))| {
            let args = run_args(socket, "exitless", &verify(300 + i as u64));
            std::thread::spawn(move || {
                exitless_within(RUN_LIMIT, &args.iter().map(String::as_str).collect::<Vec<_>>())
            })
        })
        .collect();
    for (i, run) in runs.into_iter().enumerate() {
        let out = run.join().unwrap();
        assert_verified(&out, &format!("VM {i}; daemon: {}", daemon.log()));
        test_infra::assert_holds_only_pattern(&disks[i].1, 300 + i as u64, 300);
    }
    // Both were connected at once: one daemon, two frontends.
    assert_eq!(daemon.log().matches("frontend connected").count(), 2, "{}", daemon.log());
}

#[test]
fn a_missing_socket_a_refused_frontend_and_a_killed_daemon_end_the_vm_with_an_error() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();

    // Nothing there: one line, at once.
    let missing = dir.path().join("missing.sock");
    let started = Instant::now();
    let out = run_vm(&missing, "exitless", &verify(1));
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no vhost-user socket at") && err.contains("missing.sock"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());

    // A VM polling its disk; the daemon refuses a second frontend for that disk, then dies.
    let socket = dir.path().join("d.sock");
    let file = disk_file(dir.path(), "d.img", DISK_BYTES);
    let daemon_args = ["--disk".to_string(), daemon_disk(&socket, &file)];
    let mut daemon = Daemon::start(&daemon_args, &[&socket], &dir.path().join("daemon.log"));
    let cmdline = "probe.workload=blk probe.rw=randread probe.duration_ms=60000 probe.timeout_ms=1000";
    let args = run_args(&socket, "exitless", cmdline);
    let vm = std::thread::spawn(move || {
        exitless_within(RUN_LIMIT, &args.iter().map(String::as_str).collect::<Vec<_>>())
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while !daemon.log().contains("stopped at") && !daemon.log().contains("frontend connected") {
        assert!(Instant::now() < deadline, "the VM did not connect: {}", daemon.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    let second = run_vm(&socket, "exitless", &verify(2));
    assert_eq!(second.status.code(), Some(125), "{}", stderr(&second));
    let err = stderr(&second);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("closed the connection"), "{err}");

    daemon.child().kill().unwrap();
    daemon.child().wait().unwrap();
    let killed = Instant::now();
    let out = vm.join().unwrap();
    // The guest saw the device fail (NEEDS_RESET, or no completion within its own timeout) and
    // exited with its error status, long before the 60 s of its workload or --timeout.
    assert!(killed.elapsed() < Duration::from_secs(30), "the VM took {:?} to end", killed.elapsed());
    assert_eq!(out.status.code(), Some(1), "{}\n{}", stdout(&out), stderr(&out));
    let result = line_with(&out, "probe", "blk");
    assert!(result["error"].is_string(), "{result}");
    let err = stderr(&out);
    assert!(err.contains("the vhost-user daemon closed the connection"), "{err}");
    let stats = json_lines(&out).into_iter().find(|l| l["exitless"] == "run").expect("stats line");
    assert_eq!(stats["devices"][0]["daemon_gone"], true, "{stats}");
}

/// Wait until the daemon logs that a frontend connected.
fn wait_for_frontend(daemon: &Daemon) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !daemon.log().contains("frontend connected") {
        assert!(Instant::now() < deadline, "no frontend connected: {}", daemon.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How many times `a_vm_keeps_its_disk_across_daemon_restarts...` restarts the daemon:
/// `EXITLESS_FRONTEND_RESTARTS` (default 3; `scripts/reliability.sh long` asks for 20).
fn restarts() -> usize {
    std::env::var("EXITLESS_FRONTEND_RESTARTS").map_or(3, |v| v.parse().expect("a number of restarts"))
}

/// The daemon killed (SIGKILL, two rounds in three) or stopped (SIGTERM, every third round)
/// under a VM in the middle of its verify run, each time a new daemon started on the same socket
/// and disk: the VM connects to each, the in-flight region carries over, and verify passes
/// with every block as written.
#[test]
fn a_vm_keeps_its_disk_across_daemon_restarts_by_kill_9_and_sigterm() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("d.sock");
    let file = test_infra::disk_file(dir.path(), "d.img", 128 << 20);
    // At 1000 requests per second (each new daemon starts with a second's burst), a round of
    // 300 ms, a restart and the burst take about 1400 requests: the verify run (writes, then
    // reads) is sized at twice that per round, so that every restart lands in the middle of it.
    let rounds = restarts();
    let blocks = 1536 * (rounds as u64 + 1);
    assert!(blocks <= 32768, "{rounds} restarts need more than the 128 MiB disk");
    let daemon_args = ["--disk".to_string(), format!("{},iops=1000", daemon_disk(&socket, &file))];
    let start = |round: usize| {
        Daemon::start(&daemon_args, &[&socket], &dir.path().join(format!("daemon{round}.log")))
    };
    let mut daemon = start(0);
    let seed = 700;
    let cmdline = format!(
        "probe.workload=blk probe.rw=verify probe.ops={blocks} probe.qd=8 probe.seed={seed} probe.timeout_ms=30000"
    );
    let mut args = run_args(&socket, "exitless", &cmdline);
    // The guest's limit: its requests (written, then read) at the disk's 1000 per second, and
    // a minute for the restarts; 60 s alone is less than 20 restarts' run takes.
    let timeout = 2 * blocks / 1000 + 60;
    let at = args.iter().position(|a| a == "--timeout").unwrap() + 1;
    args[at] = timeout.to_string();
    let vm = std::thread::spawn(move || {
        exitless_within(Duration::from_secs(600), &args.iter().map(String::as_str).collect::<Vec<_>>())
    });
    let mut logs = Vec::new();
    for round in 1..=rounds {
        wait_for_frontend(&daemon);
        std::thread::sleep(Duration::from_millis(300));
        if round % 3 == 2 {
            logs.push(daemon.stop());
        } else {
            daemon.child().kill().unwrap();
            daemon.child().wait().unwrap();
            logs.push(daemon.log());
        }
        daemon = start(round);
    }
    let out = vm.join().unwrap();
    let last = daemon.stop();
    let what = format!("daemons: {}\n{last}", logs.join("\n"));
    assert_verified(&out, &what);
    // What each restart cost and carried over, for the reader of the test's output: the time
    // from the old daemon's hang-up to the new one serving the ring, which the guest's requests
    // wait (on top of the old daemon's own exit, for SIGTERM).
    let reconnects =
        stderr(&out).lines().filter(|l| l.contains("reconnected")).map(String::from).collect::<Vec<_>>();
    for (round, line) in reconnects.iter().enumerate() {
        let how = if (round + 1) % 3 == 2 { "SIGTERM" } else { "SIGKILL" };
        eprintln!("round {} ({how}): {line}", round + 1);
    }
    for line in what.lines().filter(|l| l.contains("in flight")) {
        eprintln!("{line}");
    }
    let stats = json_lines(&out).into_iter().find(|l| l["exitless"] == "run").expect("stats line");
    assert_eq!(stats["devices"][0]["reconnections"], rounds, "{stats}\n{}", stderr(&out));
    assert_eq!(stats["devices"][0]["daemon_gone"], false, "{stats}");
    assert_eq!(stderr(&out).matches("reconnected to a daemon").count(), rounds, "{}", stderr(&out));
    // A daemon stopped by SIGTERM had been handed the region the first one made (after a
    // kill -9 in between), and finished every request in it.
    if rounds >= 2 {
        assert!(logs[1].contains("marks 0 request(s) in flight as the connection ends"), "{}", logs[1]);
    }
    test_infra::assert_holds_only_pattern(&file, seed, blocks);
}

#[test]
fn polled_randread_through_a_polling_daemon_makes_no_exit_per_request() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ram.sock");
    let args = [
        "--disk".to_string(),
        format!("socket={},ram=8M", socket.display()),
        "--io-mode".to_string(),
        "sidecore".to_string(),
    ];
    let daemon = Daemon::start(&args, &[&socket], &dir.path().join("daemon.log"));
    let ops = 10_000;
    let cmdline = format!("probe.workload=blk probe.rw=randread probe.qd=1 probe.ops={ops}");
    let out = run_vm(&socket, "exitless", &cmdline);
    assert_eq!(out.status.code(), Some(0), "{}\n{}\n{}", stdout(&out), stderr(&out), daemon.log());
    assert_eq!(line_with(&out, "probe", "blk")["ops"], ops);
    let phase = test_infra::phase(&out, 0, 1);
    // A daemon in eventfd mode makes one exit per request here (the notification).
    let exits = test_infra::io_path_exits(&phase["counters"]) / ops as f64;
    assert!(exits < 0.05, "{exits} exits per request on the I/O path: {phase}");
}

/// Guest RAM from huge pages, shared with the daemon, serves a verify run; a run that needs more
/// than the host has reserved says how to get them.
#[test]
fn guest_memory_shared_from_huge_pages_works_and_too_few_say_what_is_missing() {
    let _one = one_at_a_time();
    // A memfd with MFD_HUGETLB, mapped by the daemon too; 48 MiB is 24 pages (see run_probe.rs).
    test_infra::huge_pages::require_free(24);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("huge.sock");
    let file = disk_file(dir.path(), "huge.img", DISK_BYTES);
    let daemon_args = ["--disk".to_string(), daemon_disk(&socket, &file)];
    let daemon = Daemon::start(&daemon_args, &[&socket], &dir.path().join("daemon.log"));
    let run = |mem: &str| {
        let mut args = run_args(&socket, "exitless", &verify(400));
        args.extend(["--mem", mem, "--hugepages"].map(String::from));
        exitless_within(RUN_LIMIT, &args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let out = run("48M");
    assert_verified(&out, &format!("huge pages; daemon: {}", daemon.log()));
    test_infra::assert_holds_only_pattern(&file, 400, 300);
    let too_many = format!("{}M", 2 * test_infra::huge_pages::more_than_reserved());
    let out = run(&too_many);
    assert_eq!(out.status.code(), Some(125), "{too_many}: {}", stderr(&out));
    assert!(stderr(&out).contains("nr_hugepages"), "{}", stderr(&out));
}
