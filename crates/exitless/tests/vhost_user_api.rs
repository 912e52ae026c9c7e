//! `exitless vhost-user-blk --api-socket` and `exitless vhost-user-net --api-socket`: the
//! daemons' control APIs. A block daemon started with no disk gets one through `PUT`, serves a
//! QEMU guest (the probe under KVM) on it, has its limit changed while it runs, and removes it;
//! its `/metrics` are read by Prometheus's own parser (python3-prometheus-client) and agree with
//! what the guest did. Bad requests get a 4xx and a JSON error, and a client that connects and
//! never sends holds up nobody. A disk added through it opens a file only inside an
//! `--api-disk-dir`, whatever links or `..` the path holds. A NIC daemon gets two NICs through
//! `PUT` that carry two guests' UDP request-response, and its metrics account for every frame.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use test_infra::api::http;
use test_infra::daemon::Daemon;
use test_infra::qemu::Qemu;
use test_infra::{line_with, stderr};

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// The samples of `/metrics` as Prometheus's parser reads them: `name{labels}` -> value.
fn scrape(api: &Path) -> Vec<(String, Value, f64)> {
    let (status, text) = http(api, "GET", "/metrics", None);
    assert_eq!(status, 200, "{text}");
    const PARSE: &str = "import json, sys\n\
        from prometheus_client.parser import text_string_to_metric_families\n\
        out = []\n\
        for family in text_string_to_metric_families(sys.stdin.read()):\n\
        \x20   for s in family.samples:\n\
        \x20       out.append([s.name, s.labels, s.value])\n\
        print(json.dumps(out))\n";
    // Debian's python3, where its prometheus-client package is installed.
    let mut parser = Command::new("/usr/bin/python3")
        .args(["-c", PARSE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("/usr/bin/python3 (scripts/setup.sh installs python3-prometheus-client)");
    parser.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = parser.wait_with_output().unwrap();
    assert!(out.status.success(), "Prometheus's parser refused /metrics: {}\n{text}", stderr(&out));
    let samples: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    samples
        .into_iter()
        .map(|s| (s[0].as_str().unwrap().to_owned(), s[1].clone(), s[2].as_f64().unwrap()))
        .collect()
}

fn sample(samples: &[(String, Value, f64)], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .find(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l[*k] == *v))
        .unwrap_or_else(|| panic!("no {name} {labels:?} in {samples:?}"))
        .2
}

/// Wait until the disk `name` has (`true`) or has not a frontend connected, and, with one, until
/// it served a request.
fn wait_for_frontend(api: &Path, name: &str, connected: bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (_, body) = http(api, "GET", &format!("/disks/{name}"), None);
        let disk = json(&body);
        let served = !connected || disk["figures"]["completed"].as_u64() > Some(0);
        if disk["frontend_connected"] == connected && served {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "frontend_connected never {connected}: {disk}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

struct Rig {
    dir: tempfile::TempDir,
    api: PathBuf,
    daemon: Daemon,
    elf: PathBuf,
}

impl Rig {
    /// A daemon whose API may open files in DIR/disks (`Rig::disks`).
    fn start() -> Rig {
        Rig::start_allowing(true)
    }

    /// A daemon with a control API, and `--api-disk-dir DIR/disks` if `allow_disks`.
    fn start_allowing(allow_disks: bool) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let api = dir.path().join("api.sock");
        let disks = dir.path().join("disks");
        std::fs::create_dir(&disks).unwrap();
        let mut args = vec!["--api-socket".as_ref(), api.as_os_str()];
        if allow_disks {
            args.extend(["--api-disk-dir".as_ref(), disks.as_os_str()]);
        }
        let daemon = Daemon::builder().args(&args, &[&api]).start(&dir.path().join("daemon.log"));
        let elf = test_infra::probe_elf(dir.path());
        Rig { dir, api, daemon, elf }
    }

    fn socket(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.sock"))
    }

    /// DIR/disks, the directory `--api-disk-dir` allows.
    fn disks(&self) -> PathBuf {
        self.dir.path().join("disks")
    }

    /// The probe under QEMU-KVM reading `ops` random 4 KiB blocks of the disk on `socket`, no
    /// warm-up: its result line, whose `iops` the probe measures with the TSC (QEMU does not
    /// tell the guest its frequency, so the test does).
    fn guest_reads(&self, socket: &Path, ops: u64) -> Value {
        let tsc_khz = vmm::tsc_khz().unwrap();
        let cmdline = format!(
            "probe.workload=blk probe.rw=randread probe.qd=1 probe.ops={ops} probe.warmup=0 probe.tsc_khz={tsc_khz}"
        );
        let out = Qemu::probe(&self.elf, "128M", &cmdline).vhost_user_blk(socket).output();
        // QEMU exits with (V << 1) | 1 for the probe's exit value V (0: every request done).
        assert_eq!(out.status.code(), Some(1), "{}\ndaemon: {}", stderr(&out), self.daemon.log());
        let result = line_with(&out, "probe", "blk");
        assert_eq!((result["ops"].as_u64(), result["errors"].as_u64()), (Some(ops), Some(0)), "{result}");
        assert!(result["iops"].as_f64().is_some_and(|iops| iops > 0.0), "timed: {result}");
        result
    }
}

#[test]
fn a_disk_added_through_the_api_serves_a_qemu_guest_is_relimited_live_and_removed() {
    let _shared = test_infra::alongside_others();
    let mut rig = Rig::start();
    let (status, body) = http(&rig.api, "GET", "/disks", None);
    assert_eq!((status, json(&body)), (200, serde_json::json!([])), "no disk at start");

    let socket = rig.socket("vm");
    let put = format!(r#"{{"socket": "{}", "ram": "64M", "iops": 200}}"#, socket.display());
    let (status, body) = http(&rig.api, "PUT", "/disks/vm", Some(&put));
    assert_eq!(status, 201, "{body}");
    let disk = json(&body);
    assert_eq!((disk["name"].as_str(), disk["figures"]["iops_limit"].as_u64()), (Some("vm"), Some(200)));
    assert_eq!(disk["socket"], socket.display().to_string());

    // At 200 IOPS with a one-second burst, 600 reads take at least 2 s.
    let limited = rig.guest_reads(&socket, 600);
    let iops = limited["iops"].as_f64().unwrap();
    assert!(iops <= test_infra::limited_iops(200.0, 600.0), "{iops} IOPS under a limit of 200: {limited}");
    let samples = scrape(&rig.api);
    let waits = sample(&samples, "exitless_disk_rate_limit_waits_total", &[("disk", "vm")]);
    assert!(waits > 0.0, "the guest waited for the limit");
    assert_eq!(sample(&samples, "exitless_disk_iops_limit", &[("disk", "vm")]), 200.0);

    // No limit: nothing waits any more.
    let (status, body) = http(&rig.api, "PATCH", "/disks/vm", Some(r#"{"iops": null}"#));
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["figures"]["iops_limit"], Value::Null);
    rig.guest_reads(&socket, 600);
    let samples = scrape(&rig.api);
    assert_eq!(sample(&samples, "exitless_disk_rate_limit_waits_total", &[("disk", "vm")]), waits);

    // A lower limit than at first holds for the next guest.
    let (status, body) = http(&rig.api, "PATCH", "/disks/vm", Some(r#"{"iops": 100}"#));
    assert_eq!(status, 200, "{body}");
    let slower = rig.guest_reads(&socket, 300);
    let iops = slower["iops"].as_f64().unwrap();
    assert!(iops <= test_infra::limited_iops(100.0, 300.0), "{iops} IOPS under a limit of 100: {slower}");

    // What the metrics count is what the guests did: 1500 reads of 4 KiB, nothing failed.
    let samples = scrape(&rig.api);
    let requests =
        |outcome| sample(&samples, "exitless_disk_requests_total", &[("disk", "vm"), ("outcome", outcome)]);
    assert_eq!((requests("completed"), requests("io_error"), requests("refused")), (1500.0, 0.0, 0.0));
    assert_eq!(sample(&samples, "exitless_disk_bytes_total", &[("disk", "vm")]), 1500.0 * 4096.0);
    assert_eq!(sample(&samples, "exitless_disk_request_duration_seconds_count", &[("disk", "vm")]), 1500.0);
    let inf =
        sample(&samples, "exitless_disk_request_duration_seconds_bucket", &[("disk", "vm"), ("le", "+Inf")]);
    assert_eq!(inf, 1500.0);
    assert!(sample(&samples, "exitless_disk_request_duration_seconds_sum", &[("disk", "vm")]) > 0.0);
    assert!(sample(&samples, "exitless_iocore_busy_seconds_total", &[("iocore", "0")]) > 0.0);
    assert!(sample(&samples, "exitless_iocore_idle_seconds_total", &[("iocore", "0")]) > 0.0);

    // The last guest has gone: once the daemon has seen its connection close, the disk goes.
    wait_for_frontend(&rig.api, "vm", false);
    let samples = scrape(&rig.api);
    assert_eq!(sample(&samples, "exitless_disk_frontend_connected", &[("disk", "vm")]), 0.0);
    let (status, body) = http(&rig.api, "DELETE", "/disks/vm", None);
    assert_eq!((status, body.as_str()), (204, ""));
    assert!(!socket.exists(), "the socket file goes with the disk");
    let (status, body) = http(&rig.api, "GET", "/disks/vm", None);
    assert_eq!(status, 404, "{body}");
    rig.daemon.assert_alive();
    let log = rig.daemon.stop();
    assert!(log.contains("disk vm removed"), "{log}");
}

/// A null disk through the control API: its JSON key, its spec as `GET /disks` shows it, and a
/// QEMU guest's reads served from it (zeros, no file behind it).
#[test]
fn a_null_disk_added_through_the_api_serves_a_qemu_guest() {
    let _shared = test_infra::alongside_others();
    let rig = Rig::start();
    let socket = rig.socket("null");
    let put = format!(r#"{{"socket": "{}", "null": "64M"}}"#, socket.display());
    let (status, body) = http(&rig.api, "PUT", "/disks/zero", Some(&put));
    assert_eq!(status, 201, "{body}");
    rig.guest_reads(&socket, 500);
    let (status, body) = http(&rig.api, "GET", "/disks", None);
    assert_eq!(status, 200, "{body}");
    let disk = &json(&body)[0];
    assert_eq!(disk["disk"], serde_json::json!({"null": 64 << 20, "readonly": false}), "{disk}");
    let figures = &disk["figures"];
    assert_eq!(
        (figures["completed"].as_u64(), figures["io_errors"].as_u64()),
        (Some(500), Some(0)),
        "{disk}"
    );
}

#[test]
fn a_disk_with_a_frontend_is_not_removed_and_the_others_keep_serving() {
    let _shared = test_infra::alongside_others();
    let rig = Rig::start();
    let busy = rig.socket("busy");
    for (name, socket) in [("busy", &busy), ("other", &rig.socket("other"))] {
        let put = format!(r#"{{"socket": "{}", "ram": "64M"}}"#, socket.display());
        let (status, body) = http(&rig.api, "PUT", &format!("/disks/{name}"), Some(&put));
        assert_eq!(status, 201, "{body}");
    }
    // The probe keeps reading "busy" while "other" is removed and added again, and the disk it
    // uses cannot be removed meanwhile.
    let cmdline = "probe.workload=blk probe.rw=randread probe.qd=4 probe.ops=200000 probe.warmup=0";
    let guest = Qemu::probe(&rig.elf, "128M", cmdline)
        .vhost_user_blk(&busy)
        .spawn_console(&rig.dir.path().join("qemu.err"));
    wait_for_frontend(&rig.api, "busy", true);
    let (status, body) = http(&rig.api, "DELETE", "/disks/busy", None);
    assert_eq!(status, 409, "{body}");
    assert!(json(&body)["error"].as_str().unwrap().contains("frontend is connected"), "{body}");
    for _ in 0..3 {
        let (status, body) = http(&rig.api, "DELETE", "/disks/other", None);
        assert_eq!(status, 204, "{body}");
        let put = format!(r#"{{"socket": "{}", "ram": "64M"}}"#, rig.socket("other").display());
        let (status, body) = http(&rig.api, "PUT", "/disks/other", Some(&put));
        assert_eq!(status, 201, "{body}");
    }
    let (status, _) = guest.finish(Duration::from_secs(120));
    assert_eq!(status.code(), Some(1), "the guest's 200000 reads all succeeded: {}", rig.daemon.log());
    let (_, body) = http(&rig.api, "GET", "/disks/busy", None);
    let figures = &json(&body)["figures"];
    assert_eq!((figures["completed"].as_u64(), figures["io_errors"].as_u64()), (Some(200_000), Some(0)));
}

#[test]
fn bad_requests_get_a_4xx_and_say_why() {
    let _shared = test_infra::alongside_others();
    let rig = Rig::start();
    let taken = rig.socket("taken");
    let put = format!(r#"{{"socket": "{}", "ram": "1M"}}"#, taken.display());
    assert_eq!(http(&rig.api, "PUT", "/disks/a", Some(&put)).0, 201);
    let file = rig.dir.path().join("plain-file");
    std::fs::write(&file, b"not a socket").unwrap();
    let other = rig.socket("other");
    let cases: Vec<(&str, String, Option<String>, u16, &str)> = vec![
        ("PUT", "/disks/b".into(), Some("{\"socket\":".into()), 400, "malformed JSON"),
        ("PUT", "/disks/b".into(), None, 400, "needs a JSON body"),
        (
            "PUT",
            "/disks/b".into(),
            Some(format!(r#"{{"socket":"{}","ram":"1M","size":1}}"#, other.display())),
            400,
            "unknown key `size`",
        ),
        (
            "PUT",
            "/disks/b".into(),
            Some(format!(r#"{{"socket":"{}","path":"/no/such/file"}}"#, other.display())),
            403,
            "not inside any --api-disk-dir",
        ),
        (
            "PUT",
            "/disks/b".into(),
            Some(format!(
                r#"{{"socket":"{}","path":"{}"}}"#,
                other.display(),
                rig.disks().join("no-such-file").display()
            )),
            400,
            "No such file",
        ),
        (
            "PUT",
            "/disks/b".into(),
            Some(format!(r#"{{"socket":"{}","ram":"3"}}"#, other.display())),
            400,
            "multiple of 512",
        ),
        (
            "PUT",
            "/disks/a".into(),
            Some(format!(r#"{{"socket":"{}","ram":"1M"}}"#, other.display())),
            409,
            "exists already",
        ),
        ("PUT", "/disks/b".into(), Some(put.clone()), 409, "served on"),
        (
            "PUT",
            "/disks/b".into(),
            Some(format!(r#"{{"socket":"{}","ram":"1M"}}"#, file.display())),
            400,
            "not a socket",
        ),
        (
            "PUT",
            "/disks/b".into(),
            Some(format!(r#"{{"socket":"{}","ram":"1M"}}"#, rig.api.display())),
            409,
            "in use",
        ),
        ("PUT", "/disks/a%2Fb".into(), Some(put.clone()), 404, "no such resource"),
        ("PUT", "/disks/..".into(), Some(put.clone()), 400, "disk name"),
        ("PATCH", "/disks/a".into(), Some(r#"{"iops": 0}"#.into()), 400, "iops=0"),
        ("PATCH", "/disks/a".into(), Some(r#"{"queues": 2}"#.into()), 400, "unknown key"),
        ("PATCH", "/disks/nope".into(), Some(r#"{"iops": 5}"#.into()), 404, "no disk"),
        ("DELETE", "/disks/nope".into(), None, 404, "no disk"),
        ("GET", "/nowhere".into(), None, 404, "no such resource"),
        ("DELETE", "/metrics".into(), None, 405, "GET"),
        ("POST", "/disks/a".into(), None, 405, "method POST"),
    ];
    for (method, path, body, status, says) in cases {
        let (got, answer) = http(&rig.api, method, &path, body.as_deref());
        let error = json(&answer)["error"].as_str().unwrap_or_default().to_owned();
        assert_eq!(got, status, "{method} {path} {body:?}: {answer}");
        assert!(error.contains(says), "{method} {path}: {error:?} does not say {says:?}");
    }
    // Raw bytes that are not HTTP.
    let mut stream = UnixStream::connect(&rig.api).unwrap();
    stream.write_all(b"\x00\x01garbage\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    // Nothing was added, and the disk that was is unchanged.
    let (_, body) = http(&rig.api, "GET", "/disks", None);
    let disks = json(&body);
    assert_eq!(disks.as_array().map(Vec::len), Some(1), "{disks}");
    assert!(!other.exists());
}

#[test]
fn a_client_that_never_sends_holds_up_nobody() {
    let _shared = test_infra::alongside_others();
    let rig = Rig::start();
    // Connected, silent, for longer than a client may take.
    let idle: Vec<UnixStream> = (0..4).map(|_| UnixStream::connect(&rig.api).unwrap()).collect();
    let mut half = UnixStream::connect(&rig.api).unwrap();
    half.write_all(b"PUT /disks/x HTTP/1.1\r\nContent-Length: 100\r\n\r\n{").unwrap();
    for _ in 0..3 {
        assert_eq!(http(&rig.api, "GET", "/disks", None).0, 200, "served beside silent clients");
    }
    // The silent ones are dropped with a 408 once their time is up.
    for mut stream in idle.into_iter().chain([half]) {
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    }
    assert_eq!(http(&rig.api, "GET", "/disks", None), (200, "[]".to_owned()));
}

#[test]
fn the_api_socket_and_no_disks_are_checked_at_start() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let out = test_infra::exitless(&["vhost-user-blk"]);
    assert_eq!(out.status.code(), Some(2), "no --disk and no --api-socket is a usage error");
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let out = test_infra::exitless(&["vhost-user-blk", "--api-socket", file.to_str().unwrap()]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr(&out).contains("--api-socket") && stderr(&out).contains("not a socket"),
        "{}",
        stderr(&out)
    ); // --api-disk-dir only with --api-socket, and only a directory that is there.
    let disks = dir.path().to_str().unwrap();
    let out = test_infra::exitless(&[
        "vhost-user-blk",
        "--disk",
        "ram=1M",
        "--socket",
        "/tmp/x",
        "--api-disk-dir",
        disks,
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let api = dir.path().join("api.sock");
    let api = api.to_str().unwrap();
    let out = test_infra::exitless(&[
        "vhost-user-blk",
        "--api-socket",
        api,
        "--api-disk-dir",
        "/nonexistent/disks",
    ]);
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("--api-disk-dir /nonexistent/disks"), "{}", stderr(&out));
}

/// `PUT /disks/NAME` with `body` on its own connection, waiting as long as the daemon takes.
fn put_disk(api: &Path, name: &str, body: &str) -> (u16, String) {
    // Beyond the daemon's bound on opening a disk; only a hang reaches it.
    test_infra::api::http_within(Duration::from_secs(120), api, "PUT", &format!("/disks/{name}"), Some(body))
}

/// A daemon with a control API that may open files in `allowed`, and a FUSE disk (in `dir`)
/// whose opens are held.
fn held_open_rig(dir: &Path, allowed: &Path) -> (Daemon, PathBuf, test_infra::held_disk::HeldDisk) {
    let api = dir.join("api.sock");
    let args = ["--api-socket".as_ref(), api.as_os_str(), "--api-disk-dir".as_ref(), allowed.as_os_str()];
    let daemon = Daemon::builder().args(&args, &[&api]).start(&dir.join("daemon.log"));
    let file = test_infra::disk_file(dir, "backing", 1 << 20);
    let held = test_infra::held_disk::HeldDisk::start(dir, &file, 0);
    held.hold_open();
    (daemon, api, held)
}

/// PUT /disks/NAME of `held`'s disk on DIR/NAME.sock, in a thread, once the daemon's open of
/// the disk is held: the socket, and the thread that answers the PUT's status and body.
fn put_held_disk(
    dir: &Path,
    api: &Path,
    name: &str,
    held: &test_infra::held_disk::HeldDisk,
    daemon: &Daemon,
) -> (PathBuf, std::thread::JoinHandle<(u16, String)>) {
    let socket = dir.join(format!("{name}.sock"));
    let body = format!(r#"{{"socket": "{}", "path": "{}"}}"#, socket.display(), held.disk().display());
    let put = {
        let (api, name) = (api.to_owned(), name.to_owned());
        std::thread::spawn(move || put_disk(&api, &name, &body))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !held.open_held() {
        assert!(std::time::Instant::now() < deadline, "the daemon never opened the disk: {}", daemon.log());
        std::thread::sleep(Duration::from_millis(10));
    }
    (socket, put)
}

#[test]
fn a_put_whose_open_outlasts_ten_seconds_is_answered_when_it_ends() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let (daemon, api, held) = held_open_rig(dir.path(), dir.path());
    let (socket, put) = put_held_disk(dir.path(), &api, "slow", &held, &daemon);
    // Longer than the 10 s after which the API used to answer 503 while the PUT went on.
    std::thread::sleep(Duration::from_secs(11));
    held.release_open();
    let (status, answer) = put.join().unwrap();
    assert_eq!(status, 201, "the disk was added, and the client must be told so: {answer}");
    assert_eq!(json(&answer)["name"], "slow", "{answer}");
    let (status, listed) = http(&api, "GET", "/disks/slow", None);
    assert_eq!(status, 200, "{listed}");
    assert!(socket.exists());
}

#[test]
fn a_put_whose_open_never_ends_fails_and_adds_nothing() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let (daemon, api, held) = held_open_rig(dir.path(), dir.path());
    let (socket, put) = put_held_disk(dir.path(), &api, "stuck", &held, &daemon);
    // Held until the daemon gives up on it (its bound, 30 s): the client is told it failed.
    let (status, answer) = put.join().unwrap();
    assert_eq!(status, 504, "{answer}");
    assert!(json(&answer)["error"].as_str().unwrap().contains("did not answer"), "{answer}");
    // The open ends at last: the disk is still not added, and the daemon serves on.
    held.release_open();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(http(&api, "GET", "/disks", None), (200, "[]".to_owned()));
    assert!(!socket.exists(), "no socket for a disk that was not added");
    let null = format!(r#"{{"socket": "{}", "null": "1M"}}"#, dir.path().join("null.sock").display());
    assert_eq!(put_disk(&api, "null", &null).0, 201);
}

/// The disks `GET /disks` lists, by name.
fn listed(api: &Path) -> Vec<String> {
    let (status, body) = http(api, "GET", "/disks", None);
    assert_eq!(status, 200, "{body}");
    json(&body).as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap().to_owned()).collect()
}

/// `PUT /disks/NAME` of a disk on DIR/NAME.sock opening `path` (`ram` with `path` if `ram`).
fn put_path(rig: &Rig, name: &str, path: &Path, ram: bool) -> (u16, String) {
    let ram = if ram { r#", "ram": true"# } else { "" };
    let body =
        format!(r#"{{"socket": "{}", "path": "{}"{ram}}}"#, rig.socket(name).display(), path.display());
    http(&rig.api, "PUT", &format!("/disks/{name}"), Some(&body))
}

/// Assert a 403 whose error says `says`, and that nothing was added: not listed, no socket.
fn assert_refused(rig: &Rig, name: &str, (status, answer): (u16, String), says: &str) {
    assert_eq!(status, 403, "{name}: {answer}");
    let error = json(&answer)["error"].as_str().unwrap_or_default().to_owned();
    assert!(error.contains(says), "{name}: {error:?} does not say {says:?}");
    assert!(!listed(&rig.api).contains(&name.to_owned()), "{name} was added");
    assert!(!rig.socket(name).exists(), "{name}: a socket for a refused disk");
}

#[test]
fn without_api_disk_dir_the_api_adds_no_disk_that_opens_a_file() {
    let _shared = test_infra::alongside_others();
    let rig = Rig::start_allowing(false);
    let image = rig.disks().join("a.img");
    std::fs::File::create(&image).unwrap().set_len(1 << 20).unwrap();
    assert_refused(&rig, "file", put_path(&rig, "file", &image, false), "--api-disk-dir");
    assert_refused(&rig, "ramfile", put_path(&rig, "ramfile", &image, true), "--api-disk-dir");
    // Disks that open no file are the API's to add.
    for (name, disk) in [("ram", r#""ram": "1M""#), ("null", r#""null": "1M""#)] {
        let body = format!(r#"{{"socket": "{}", {disk}}}"#, rig.socket(name).display());
        let (status, answer) = http(&rig.api, "PUT", &format!("/disks/{name}"), Some(&body));
        assert_eq!(status, 201, "{name}: {answer}");
    }
    assert_eq!(listed(&rig.api), ["null", "ram"]);
}

#[test]
fn an_api_disk_opens_a_file_only_inside_api_disk_dir() {
    let _shared = test_infra::alongside_others();
    let rig = Rig::start();
    let disks = rig.disks();
    let image = |path: &Path| std::fs::File::create(path).unwrap().set_len(1 << 20).unwrap();
    let outside = rig.dir.path().join("outside.img");
    image(&outside);
    image(&disks.join("inside.img"));
    std::fs::create_dir(disks.join("sub")).unwrap();
    std::os::unix::fs::symlink(&outside, disks.join("absolute-link")).unwrap();
    std::os::unix::fs::symlink("../outside.img", disks.join("relative-link")).unwrap();
    std::os::unix::fs::symlink("../inside.img", disks.join("sub/link-inside")).unwrap();

    let refusals = [
        ("outside", outside.clone(), "not inside any --api-disk-dir"),
        ("dotdot", disks.join("../outside.img"), "leads out of --api-disk-dir"),
        ("subdotdot", disks.join("sub/../../outside.img"), "leads out of --api-disk-dir"),
        ("abslink", disks.join("absolute-link"), "leads out of --api-disk-dir"),
        ("rellink", disks.join("relative-link"), "leads out of --api-disk-dir"),
        ("etc", PathBuf::from("/etc/passwd"), "not inside any --api-disk-dir"),
    ];
    for (name, path, says) in &refusals {
        assert_refused(&rig, name, put_path(&rig, name, path, false), says);
        let ramfile = format!("{name}-ram");
        assert_refused(&rig, &ramfile, put_path(&rig, &ramfile, path, true), says);
    }

    // Inside: the file itself, through `..` that stays inside, and through a link to it.
    for (name, path) in [
        ("inside", disks.join("inside.img")),
        ("inside-dotdot", disks.join("sub/../inside.img")),
        ("inside-link", disks.join("sub/link-inside")),
    ] {
        let (status, answer) = put_path(&rig, name, &path, false);
        assert_eq!(status, 201, "{name}: {answer}");
        // Shown as the client named it.
        assert_eq!(json(&answer)["disk"]["path"], path.display().to_string(), "{answer}");
        assert!(rig.socket(name).exists(), "{name} is served");
        assert_eq!(http(&rig.api, "DELETE", &format!("/disks/{name}"), None).0, 204);
    }
}

#[test]
fn a_path_outside_api_disk_dir_is_never_opened() {
    let _shared = test_infra::alongside_others();
    // The FUSE disk holds every open of its file: a refused PUT that opened it would hang.
    let dir = tempfile::tempdir().unwrap();
    let allowed = dir.path().join("allowed");
    std::fs::create_dir(&allowed).unwrap();
    let (daemon, api, held) = held_open_rig(dir.path(), &allowed);
    std::os::unix::fs::symlink(held.disk(), allowed.join("link")).unwrap();
    let through_dotdot = allowed.join("../held/disk");
    for (name, path) in [("direct", held.disk()), ("link", allowed.join("link")), ("dotdot", through_dotdot)]
    {
        let socket = dir.path().join(format!("{name}.sock"));
        let body = format!(r#"{{"socket": "{}", "path": "{}"}}"#, socket.display(), path.display());
        let (status, answer) = put_disk(&api, name, &body);
        assert_eq!(status, 403, "{name}: {answer}\n{}", daemon.log());
        assert!(!held.open_held(), "{name}: the daemon opened the refused file");
        assert!(!socket.exists());
    }
    assert_eq!(http(&api, "GET", "/disks", None), (200, "[]".to_owned()));
}

/// `exitless vhost-user-net --api-socket`: two NICs added through `PUT` carry a UDP
/// request-response between two QEMU guests (the probe's `udp-rr` client and `udp-echo`
/// responder); `GET /nics` and `/metrics` (read by Prometheus's parser) count what the switch
/// did, a NIC with a frontend is not removed, one without goes with its socket, and bad
/// requests are refused with why.
#[test]
fn nics_added_through_the_api_carry_two_guests_and_their_metrics_count_it() {
    let _shared = test_infra::alongside_others();
    use test_infra::background::Background;
    let dir = tempfile::tempdir().unwrap();
    let api = dir.path().join("api.sock");
    let daemon = Background::start(
        dir.path(),
        "vhost-user-net",
        &["vhost-user-net", "--api-socket", api.to_str().unwrap()],
        &api,
    );
    let socket = |name: &str| dir.path().join(format!("{name}.net"));
    let nics = [("server", "52:54:00:00:01:01", "10.0.0.1"), ("client", "52:54:00:00:01:02", "10.0.0.2")];
    for (name, mac, _) in nics {
        let body = format!(r#"{{"socket": "{}", "mac": "{mac}", "pps": 100000}}"#, socket(name).display());
        let (status, answer) = http(&api, "PUT", &format!("/nics/{name}"), Some(&body));
        assert_eq!(status, 201, "{answer}");
        assert_eq!(json(&answer)["pps"], 100_000, "{answer}");
    }
    for (method, path, body, status, says) in [
        (
            "PUT",
            "/nics/again",
            Some(format!(r#"{{"socket": "{}", "mac": "52:54:00:00:01:01"}}"#, socket("x").display())),
            409,
            "is NIC server's already",
        ),
        (
            "PUT",
            "/nics/server",
            Some(format!(r#"{{"socket": "{}", "mac": "52:54:00:00:01:09"}}"#, socket("y").display())),
            409,
            "named server already",
        ),
        (
            "PUT",
            "/nics/odd",
            Some(r#"{"socket": "/tmp/odd.net", "mac": "52:54:00:00:01:03", "speed": 1}"#.to_owned()),
            400,
            "unknown key",
        ),
        ("PUT", "/nics/odd", None, 400, "JSON body"),
        ("GET", "/nics/nobody", None, 404, "no NIC is named nobody"),
        ("PATCH", "/nics/server", Some("{}".to_owned()), 405, "GET, PUT and DELETE"),
    ] {
        let (got, answer) = http(&api, method, path, body.as_deref());
        assert_eq!(got, status, "{method} {path}: {answer}");
        assert!(
            json(&answer)["error"].as_str().is_some_and(|e| e.contains(says)),
            "{method} {path}: {answer}"
        );
    }
    assert!(!socket("x").exists() && !socket("y").exists(), "a refused NIC makes no socket");

    let elf = test_infra::probe_elf(dir.path());
    let tsc_khz = vmm::tsc_khz().unwrap();
    let guest = |(name, mac, ip): (&str, &str, &str), peer: &str, workload: &str, workload_args: &str| {
        let cmdline =
            format!("probe.workload={workload} probe.ip={ip} probe.dst={peer} probe.tsc_khz={tsc_khz} {workload_args}");
        Qemu::probe(&elf, "128M", &cmdline).vhost_user_net(&socket(name), mac)
    };
    // The responder answers until it is stopped; the client's requests are UDP: one lost (three
    // spinning threads share two CPUs here) is counted and the next one sent.
    let responder = guest(nics[0], nics[1].2, "udp-echo", "probe.duration_ms=600000")
        .spawn(&dir.path().join("server.out"), Stdio::null());
    let client =
        guest(nics[1], nics[0].2, "udp-rr", "probe.ops=200 probe.warmup=10 probe.max_timeouts=100").output();
    let result = line_with(&client, "probe", "udp-rr");
    assert_eq!(result["ops"], 200, "{result}\ndaemon: {}", daemon.stderr());
    assert_eq!(result["mismatches"], 0, "{result}");

    // The responder still runs: its NIC is not removed.
    let (status, answer) = http(&api, "DELETE", "/nics/server", None);
    assert_eq!(status, 409, "{answer}");
    let mut responder = responder;
    responder.kill().unwrap();
    responder.wait().unwrap();
    let connected =
        |name: &str| json(&http(&api, "GET", &format!("/nics/{name}"), None).1)["frontend_connected"] == true;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while connected("server") || connected("client") {
        assert!(std::time::Instant::now() < deadline, "the guests' connections never closed");
        std::thread::sleep(Duration::from_millis(20));
    }

    // Every frame one NIC sent went to the other (the only other port; there is no uplink),
    // which either took it or counted why not, or found it not there yet (its driver not
    // started: the first ARP request may go out before it is).
    let samples = scrape(&api);
    let count = |counter: &str, nic: &str| {
        sample(&samples, &format!("exitless_nic_{counter}_total"), &[("nic", nic)])
    };
    for (from, to) in [("client", "server"), ("server", "client")] {
        let sent = count("tx_frames", from);
        assert!(sent >= 210.0, "{from} sent {sent} frames");
        let arrived = ["rx_frames", "rx_no_buffer", "rx_too_big", "rx_malformed"]
            .map(|c| count(c, to))
            .iter()
            .sum::<f64>();
        assert_eq!(sent, arrived + count("tx_unheard", from), "{from} to {to}: {samples:?}");
        assert_eq!(count("tx_malformed", from), 0.0);
    }
    assert_eq!(sample(&samples, "exitless_nic_frontend_connected", &[("nic", "server")]), 0.0);
    assert!(sample(&samples, "exitless_iocore_busy_seconds_total", &[("iocore", "0")]) > 0.0);
    let (_, listed) = http(&api, "GET", "/nics", None);
    let listed = json(&listed);
    assert_eq!(listed[1]["counters"]["tx_frames"].as_f64(), Some(count("tx_frames", "client")), "{listed}");

    for (name, _, _) in nics {
        let (status, answer) = http(&api, "DELETE", &format!("/nics/{name}"), None);
        assert_eq!((status, answer.as_str()), (204, ""));
        assert!(!socket(name).exists(), "the socket goes with the NIC");
    }
    let (_, listed) = http(&api, "GET", "/nics", None);
    assert_eq!(json(&listed), serde_json::json!([]));
    // SAFETY: kill(2) on our own child, not yet waited for.
    unsafe { libc::kill(daemon.pid() as i32, libc::SIGTERM) };
    let (status, _, log) = daemon.wait();
    assert_eq!(status, Some(0), "{log}");
    assert!(log.contains("NIC server removed"), "{log}");
}
