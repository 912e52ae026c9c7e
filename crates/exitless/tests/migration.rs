//! Live migration between two `exitless run` processes on real KVM: the probe guest's verify
//! workload on a file disk is migrated mid-run (`PUT /api/v1/vm.send-migration` on the source,
//! `run --receive-migration unix:PATH` on the destination), finishes on the destination and
//! passes; the disk file holds the pattern. A damaged stream is refused by the destination with
//! a one-line error, and the source, told so, goes on running and finishes its verify. What a
//! migration cannot carry (a new RAM disk) is refused up front. Counts are asserted, never
//! speed; the downtimes are printed.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use test_infra::api::http;
use test_infra::background::Background;
use test_infra::migration::{
    assert_report, disk_spec, forward_up_to, hello, hello_with_disks, send_migration_to, source, Verify,
    BLOCKS,
};
use test_infra::{assert_verify_passed, blk_result, threads_named};
use test_infra::{one_at_a_time, per_queue};

/// A destination waiting on `dir/NAME.mig`, for a VM with `disks` (`--disk` specs, as the
/// source's) and the test device.
fn destination(dir: &Path, name: &str, disks: &[String]) -> (Background, PathBuf) {
    let socket = dir.join(format!("{name}.mig"));
    let url = format!("unix:{}", socket.display());
    let mut args = vec!["run", "--receive-migration", &url, "--testdev", "--timeout", "170"];
    for disk in disks {
        args.extend(["--disk", disk.as_str()]);
    }
    let proc = Background::start(dir, name, &args, &socket);
    (proc, socket)
}

/// A source running `verify` in `mode` mid-run (`source`) and a destination waiting for it, in a
/// new directory.
struct Pair {
    dir: tempfile::TempDir,
    dst: Background,
    /// The destination's migration socket.
    socket: PathBuf,
    src: Background,
    /// The source's API socket.
    api: PathBuf,
    /// The source's disk, which the destination opens too.
    disk: PathBuf,
}

impl Pair {
    fn start(mode: &str, verify: Verify) -> Pair {
        let dir = tempfile::tempdir().unwrap();
        let (dst, socket) = destination(dir.path(), "destination", &[disk_spec(dir.path(), verify)]);
        let (src, api, disk) = source(dir.path(), mode, verify);
        Pair { dir, dst, socket, src, api, disk }
    }
}

fn send_migration(api: &Path, socket: &Path) -> (u16, String) {
    send_migration_to(api, &format!("unix:{}", socket.display()))
}

/// Migrate `verify` in `mode` mid-run; the destination's verify result.
fn migrate_mid_verify(mode: &str, verify: Verify) -> Value {
    let Pair { dir: _dir, dst, socket, src, api, disk } = Pair::start(mode, verify);
    let (status, body) = send_migration(&api, &socket);
    assert_eq!(status, 200, "{mode}: send-migration: {body}");
    let report = assert_report(mode, &body);
    let rounds = report["rounds"].as_u64().unwrap();
    let per_round = &report["pages_per_round"];
    test_infra::open_gate(&disk, BLOCKS);

    let (code, stdout, err) = src.wait();
    assert_eq!(code, Some(0), "{mode}: the source's status; stderr: {err}");
    assert!(err.contains("migrated to"), "{mode}: {err}");
    assert!(blk_result(&stdout).is_none(), "{mode}: the verify passed its gate on the source: {stdout}");
    let (code, stdout, dst_err) = dst.wait();
    assert_eq!(code, Some(0), "{mode}: the destination's status; stderr: {dst_err}; stdout: {stdout}");
    let result = assert_verify_passed(&stdout, &dst_err, mode, BLOCKS);
    test_infra::assert_holds_pattern_and_open_gate(&disk, verify.seed, BLOCKS);
    println!(
        "{mode}, {} queues: downtime {:.3} ms (pause {:.3} ms), total {:.1} ms, {rounds} pre-copy rounds, pages per round {per_round}, device-dirtied pages {}, KVM-dirtied pages {}",
        verify.queues,
        report["downtime_ms"].as_f64().unwrap(),
        report["pause_ms"].as_f64().unwrap(),
        report["total_ms"].as_f64().unwrap(),
        report["device_dirty_pages"],
        report["kvm_dirty_pages"],
    );
    result
}

#[test]
fn a_vm_migrated_mid_verify_finishes_its_verify_on_the_destination() {
    let _one = one_at_a_time();
    for (i, mode) in ["trap", "eventfd", "exitless"].into_iter().enumerate() {
        migrate_mid_verify(mode, Verify { seed: 3100 + i as u64, qd: 8, queues: 1 });
    }
}

#[test]
fn a_two_queue_disk_migrated_mid_verify_finishes_its_verify() {
    let _one = one_at_a_time();
    for (i, mode) in ["eventfd", "exitless"].into_iter().enumerate() {
        let result = migrate_mid_verify(mode, Verify { seed: 3150 + i as u64, qd: 8, queues: 2 });
        assert_eq!(result["queues"], 2, "{mode}: {result}");
        assert!(per_queue(&result, 2).iter().all(|&c| c > 0), "{mode}: a queue served nothing: {result}");
    }
}

/// A destination fed `stream` directly must end with a one-line error saying `expect`.
fn assert_destination_refuses(what: &str, stream: &[u8], expect: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (dst, socket) = destination(dir.path(), "destination", &[]);
    let mut conn = UnixStream::connect(&socket).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    // A peer that has gone may refuse the rest: what matters is what the destination says.
    let _ = conn.write_all(stream);
    let _ = conn.shutdown(std::net::Shutdown::Write);
    let mut answer = Vec::new();
    let _ = conn.read_to_end(&mut answer);
    let (code, _, err) = dst.wait();
    assert_ne!(code, Some(0), "{what}: the destination ran the VM; stderr: {err}");
    assert!(!err.contains("panicked"), "{what}: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.contains("waiting for a live migration")).collect();
    assert_eq!(lines.len(), 1, "{what}: not one line: {err}");
    assert!(lines[0].contains(expect), "{what}: {:?} does not say {expect:?}", lines[0]);
    // The destination's last answer refuses, with the same reason.
    let refusal =
        answer.iter().rposition(|&b| b == 1).map(|at| String::from_utf8_lossy(&answer[at..]).into_owned());
    println!("{what}: {} (the source was told {refusal:?})", lines[0]);
}

fn pages_record(gpa: u64, pages: u32, data: usize) -> Vec<u8> {
    let mut bytes = vec![1u8];
    bytes.extend_from_slice(&gpa.to_le_bytes());
    bytes.extend_from_slice(&pages.to_le_bytes());
    bytes.extend(std::iter::repeat_n(0xa5, data));
    bytes
}

#[test]
fn a_damaged_stream_is_refused_by_the_destination_with_a_one_line_error() {
    let _one = one_at_a_time();
    let with_hello = |rest: &[u8]| [hello(), rest.to_vec()].concat();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("not a migration stream", b"GET / HTTP/1.1\r\n\r\n".to_vec(), "not an exitless migration"),
        ("a hello cut short", hello()[..40].to_vec(), "connection broke"),
        ("a hello of 2 GiB", [b"EXLMIGR1".as_slice(), &[0, 0, 0, 0x80]].concat(), "more than"),
        (
            "pages beyond guest memory",
            with_hello(&pages_record(64 << 20, 1, 4096)),
            "not inside guest memory",
        ),
        (
            "pages across the end of memory",
            with_hello(&pages_record((64 << 20) - 4096, 2, 8192)),
            "not inside",
        ),
        ("a page count of 2^32-1", with_hello(&pages_record(0, u32::MAX, 0)), "pages (1 to"),
        ("pages cut short", with_hello(&pages_record(0x10000, 4, 5000)), "connection broke"),
        ("a record of unknown kind", with_hello(&[7, 0, 0]), "unknown kind"),
        (
            "a state that is not JSON",
            with_hello(&[2, 4, 0, 0, 0, b'{', b'x', 0, 0]),
            "not an exitless snapshot",
        ),
        ("no state at all", hello(), "connection broke"),
        // The destination opens the disks its operator names, never a path from the stream
        // (it used to open this one, read-write).
        (
            "a disk the destination did not name",
            hello_with_disks(serde_json::json!([{
                "kind": "file", "path": "/nonexistent/victim", "size": 0, "read_only": false,
                "direct": false, "serial": null, "queues": 1
            }])),
            "were named with --disk",
        ),
    ];
    for (what, stream, expect) in cases {
        assert_destination_refuses(what, &stream, expect);
    }
}

/// Forward a source's connection to `to`, but only its first `limit` bytes: then both ends are
/// shut, a stream cut mid-migration. Replies go back unchanged.
fn cutting_proxy(listen: &Path, to: PathBuf, limit: usize) -> std::thread::JoinHandle<usize> {
    proxy(listen, to, move |mut from_source, mut to_destination, mut replies_in, mut replies_out| {
        std::thread::spawn(move || std::io::copy(&mut replies_in, &mut replies_out));
        let forwarded = forward_up_to(&mut from_source, &mut to_destination, limit);
        let _ = to_destination.shutdown(std::net::Shutdown::Both);
        let _ = from_source.shutdown(std::net::Shutdown::Both);
        forwarded
    })
}

/// Listen on `listen`, and in a thread accept a source's connection there, connect to the
/// destination at `to`, and `forward` with the source's end, the destination's, and a clone of
/// each for the replies: its result.
fn proxy<T: Send + 'static>(
    listen: &Path,
    to: PathBuf,
    forward: impl FnOnce(UnixStream, UnixStream, UnixStream, UnixStream) -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let listener = UnixListener::bind(listen).unwrap();
    std::thread::spawn(move || {
        let (from_source, _) = listener.accept().unwrap();
        let to_destination = UnixStream::connect(&to).unwrap();
        let (replies_in, replies_out) =
            (to_destination.try_clone().unwrap(), from_source.try_clone().unwrap());
        forward(from_source, to_destination, replies_in, replies_out)
    })
}

/// Forward a source's connection to `to`, holding back the destination's first reply (that it
/// built the VM) for `hold`.
fn delaying_proxy(listen: &Path, to: PathBuf, hold: Duration) -> std::thread::JoinHandle<()> {
    proxy_holding_the_first_reply(listen, to, move || std::thread::sleep(hold))
}

/// Forward a source's connection to `to`; once the destination's first reply has come, run
/// `hold` before passing it on.
fn proxy_holding_the_first_reply(
    listen: &Path,
    to: PathBuf,
    hold: impl FnOnce() + Send + 'static,
) -> std::thread::JoinHandle<()> {
    proxy(listen, to, move |mut from_source, mut to_destination, mut replies_in, mut replies_out| {
        let replies = std::thread::spawn(move || {
            let mut first = [0u8; 1];
            if replies_in.read_exact(&mut first).is_ok() {
                hold();
                let _ = replies_out.write_all(&first);
                let _ = std::io::copy(&mut replies_in, &mut replies_out);
            }
        });
        let _ = std::io::copy(&mut from_source, &mut to_destination);
        let _ = to_destination.shutdown(std::net::Shutdown::Write);
        let _ = replies.join();
    })
}

/// A migration that takes longer than 10 s (its destination's first reply held back 11 s) is
/// answered when it ends, with its report. The API used to give up after 10 s with a 503 while
/// the migration went on and succeeded: the client was told of a failure that did not happen.
#[test]
fn a_migration_slower_than_ten_seconds_is_answered_when_it_ends() {
    let _one = one_at_a_time();
    let seed = 3300;
    let Pair { dir, dst, socket, src, api, disk } = Pair::start("eventfd", Verify { seed, qd: 8, queues: 1 });
    let proxy = dir.path().join("slow.mig");
    let forwarding = delaying_proxy(&proxy, socket, Duration::from_secs(11));
    let (status, body) = send_migration(&api, &proxy);
    assert_eq!(status, 200, "a slow migration: {body}");
    let report: Value = serde_json::from_str(&body).unwrap();
    assert!(report["total_ms"].as_f64().unwrap() >= 11_000.0, "{report}");
    test_infra::open_gate(&disk, BLOCKS);
    let (code, _, err) = src.wait();
    assert_eq!(code, Some(0), "the source's status; stderr: {err}");
    assert!(err.contains("migrated to"), "{err}");
    let (code, stdout, dst_err) = dst.wait();
    assert_eq!(code, Some(0), "the destination's status; stderr: {dst_err}");
    assert_verify_passed(&stdout, &dst_err, "after a slow migration", BLOCKS);
    forwarding.join().unwrap();
    test_infra::assert_holds_pattern_and_open_gate(&disk, seed, BLOCKS);
}

#[test]
fn a_migration_cut_short_leaves_the_source_running_and_its_verify_passes() {
    let _one = one_at_a_time();
    let seed = 3200;
    let Pair { dir, dst, socket, src, api, disk } = Pair::start("eventfd", Verify { seed, qd: 8, queues: 1 });
    // Cut after the hello and some pages (the first round alone is over 200 KiB).
    let proxy = dir.path().join("proxy.mig");
    let forwarded = cutting_proxy(&proxy, socket, 100_000);
    let (status, body) = send_migration(&api, &proxy);
    assert_eq!(status, 500, "a cut migration: {body}");
    println!("the source was told: {body} ({} bytes forwarded)", forwarded.join().unwrap());
    let (code, _, dst_err) = dst.wait();
    assert_ne!(code, Some(0), "the destination ran a VM it did not have whole: {dst_err}");
    assert!(!dst_err.contains("panicked"), "{dst_err}");
    println!("the destination said: {}", dst_err.lines().last().unwrap_or_default());

    // The source runs on: a pause and resume work, and its verify finishes and passes.
    assert_eq!(http(&api, "PUT", "/api/v1/vm.pause", None).0, 204);
    assert_eq!(http(&api, "PUT", "/api/v1/vm.resume", None).0, 204);
    test_infra::open_gate(&disk, BLOCKS);
    let (code, stdout, err) = src.wait();
    assert_eq!(code, Some(0), "the source's status; stderr: {err}");
    assert!(err.contains("failed; the VM runs on here"), "{err}");
    assert_verify_passed(&stdout, &err, "the source after a failed migration", BLOCKS);
    test_infra::assert_holds_pattern_and_open_gate(&disk, seed, BLOCKS);
}

#[test]
fn what_a_migration_cannot_carry_is_refused_and_the_vm_runs_on() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let api = dir.path().join("ram.api");
    let args = [
        "run",
        "--probe",
        "--disk",
        "ram=16M",
        "--api-socket",
        api.to_str().unwrap(),
        "--timeout",
        "60",
        "--cmdline",
        "probe.workload=blk probe.rw=randread probe.ops=100000000 probe.qd=1",
    ];
    let vm = Background::start(dir.path(), "ram", &args, &api);
    let (status, body) = send_migration(&api, &dir.path().join("nobody.mig"));
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("RAM disk"), "{body}");
    // A host name is not an address: refused before anything, naming the URL forms.
    let body = r#"{"destination_url": "tcp:migration.example:5"}"#;
    let (status, answer) = http(&api, "PUT", "/api/v1/vm.send-migration", Some(body));
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("unix:/PATH") && answer.contains("tcp+plain:IP:PORT"), "{answer}");
    // TCP without --migration-tls-dir: refused before a connection, naming the flag and the
    // plain scheme.
    let body = r#"{"destination_url": "tcp:192.0.2.1:5"}"#;
    let (status, answer) = http(&api, "PUT", "/api/v1/vm.send-migration", Some(body));
    assert_eq!(status, 500, "{answer}");
    assert!(answer.contains("--migration-tls-dir") && answer.contains("tcp+plain:"), "{answer}");
    // Still running: it pauses.
    assert_eq!(http(&api, "PUT", "/api/v1/vm.pause", None).0, 204);
    vm.kill();
}

/// Forward a source's connection to `to`; once the destination's first reply (the VM built)
/// has come, say so on `replied` and hold it until `release` says go.
fn holding_proxy(
    listen: &Path,
    to: PathBuf,
    replied: std::sync::mpsc::Sender<()>,
    release: std::sync::mpsc::Receiver<()>,
) -> std::thread::JoinHandle<()> {
    proxy_holding_the_first_reply(listen, to, move || {
        let _ = replied.send(());
        let _ = release.recv();
    })
}

/// The test device's ping-pong responder writes guest memory through the host mapping, which
/// no dirty log sees: while a migration's logging is on it is ended, and none starts. It used
/// to spin on, writing pages no round would send again.
#[test]
fn a_migration_ends_the_test_devices_responder_while_it_logs() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let (dst, socket) = destination(dir.path(), "destination", &[]);
    let api = dir.path().join("source.api");
    let cmdline = "probe.workload=exitcost probe.ops=pingpong probe.pingpong_n=2000000000";
    let args =
        ["run", "--probe", "--api-socket", api.to_str().unwrap(), "--timeout", "170", "--cmdline", cmdline];
    let src = Background::start(dir.path(), "source", &args, &api);
    let responder = "testdev-pingpon"; // The thread's name as /proc shows it (15 bytes).
    let started = std::time::Instant::now();
    while threads_named(src.pid(), responder) == 0 {
        assert!(started.elapsed() < test_infra::background::RUN_LIMIT, "no responder: {}", src.stderr());
        std::thread::sleep(Duration::from_millis(5));
    }
    let (replied_tx, replied) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel();
    let proxy = dir.path().join("holding.mig");
    let forwarding = holding_proxy(&proxy, socket, replied_tx, release_rx);
    let migration = std::thread::spawn({
        let (api, proxy) = (api.clone(), proxy.clone());
        move || send_migration(&api, &proxy)
    });
    // The source has sent its hello, so its logging is on; the destination's answer is held.
    replied
        .recv_timeout(test_infra::background::RUN_LIMIT)
        .expect("the destination never answered the hello");
    let during = threads_named(src.pid(), responder);
    release.send(()).unwrap();
    let (status, body) = migration.join().unwrap();
    assert_eq!(during, 0, "the responder ran on while the migration logged");
    assert_eq!(status, 200, "{body}");
    forwarding.join().unwrap();
    let (code, _, err) = src.wait();
    assert_eq!(code, Some(0), "the source: {err}");
    dst.kill();
}
