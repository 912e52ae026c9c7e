//! Live migration between two simulated hosts over TCP: each `exitless run` in a network
//! namespace of its own, the two joined by a veth pair (`exitless_bench::hosts`), with mutual
//! TLS (`--migration-tls-dir`, certificates from `scripts/tls-certs.sh`). The probe guest's
//! verify migrates mid-run and passes on the destination; plain TCP works only when named
//! `tcp+plain:`. Refused, each with one line that says why: a source whose certificate the
//! destination's CA did not sign, a destination whose certificate the source's CA did not sign
//! or that names another address, a plain source where TLS is expected, a stranger (no
//! certificate, or not TLS) on the destination's port, a closed port, and a destination that
//! dies midway. The destination waits on through strangers; the source's VM runs on and its
//! verify passes. Counts are asserted, never speed; the downtimes are printed.
//!
//! The namespaces need root and iproute2, and the certificates the openssl command: a test that
//! cannot have them fails, saying why.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use exitless_bench::hosts::{self, HostPair, DESTINATION_IP, SOURCE_IP};
use test_infra::api::http;
use test_infra::background::{Background, Ready, RUN_LIMIT};
use test_infra::migration::{
    assert_report, disk_spec, forward_up_to, send_migration_to, source_in, Verify, BLOCKS,
};
use test_infra::{assert_verify_passed, blk_result};
use test_infra::{exitless, one_at_a_time, stderr};

/// The destination's port, in its own namespace.
const PORT: u16 = 7070;
/// What a destination's log says of each connection it refuses.
const REFUSED: &str = "refused a migration connection";

/// Two simulated hosts, and certificates in `dir`: `dir/NAME/HOST` (`--migration-tls-dir`) for
/// each CA named (each its own CA), for the source's and the destination's addresses.
fn hosts_with_certificates(dir: &Path, cas: &[&str]) -> HostPair {
    let pair = HostPair::new().unwrap_or_else(|e| panic!("{e}"));
    for ca in cas {
        let (source, destination) = (SOURCE_IP.to_string(), DESTINATION_IP.to_string());
        hosts::make_certificates(&dir.join(ca), &[&source, &destination]).unwrap_or_else(|e| panic!("{e}"));
    }
    pair
}

/// The TLS directory of `host` under the CA `ca` in `dir`.
fn tls(dir: &Path, ca: &str, host: Ipv4Addr) -> PathBuf {
    dir.join(ca).join(host.to_string())
}

fn url(scheme: &str, port: u16) -> String {
    format!("{scheme}:{DESTINATION_IP}:{port}")
}

/// A destination on the destination host waiting on `url`, with `tls` if given, for a VM with
/// `disks` and the test device; ready once it says it waits.
fn destination(
    pair: &HostPair,
    dir: &Path,
    name: &str,
    url: &str,
    tls: Option<&Path>,
    disks: &[String],
) -> Background {
    let tls = tls.map(|t| t.to_str().unwrap().to_string());
    let mut args = vec!["run", "--receive-migration", url, "--testdev", "--timeout", "170"];
    if let Some(tls) = &tls {
        args.extend(["--migration-tls-dir", tls.as_str()]);
    }
    for disk in disks {
        args.extend(["--disk", disk.as_str()]);
    }
    Background::start_in(
        Some(&pair.destination),
        dir,
        name,
        &args,
        Ready::Says("waiting for a live migration"),
    )
}

/// Wait until `proc`'s log has `count` refused connections; its refusal lines.
fn refusals(proc: &Background, count: usize) -> Vec<String> {
    let started = Instant::now();
    loop {
        let err = proc.stderr();
        let lines: Vec<String> = err.lines().filter(|l| l.contains(REFUSED)).map(String::from).collect();
        if lines.len() >= count {
            return lines;
        }
        assert!(started.elapsed() < RUN_LIMIT, "fewer than {count} refusals: {err}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A failed send-migration's answer: a 500 whose error is one line saying `expect`.
fn assert_refused(what: &str, (status, body): (u16, String), expect: &str) -> String {
    assert_eq!(status, 500, "{what}: {body}");
    let error: serde_json::Value =
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{what}: {e}: {body}"));
    let message = error["error"].as_str().unwrap_or_else(|| panic!("{what}: {body}")).to_string();
    assert!(!message.contains('\n'), "{what}: not one line: {message}");
    assert!(message.contains(expect), "{what}: {message:?} does not say {expect:?}");
    println!("{what}: the source said: {message}");
    message
}

/// The source's VM runs on after failed migrations: it pauses and resumes, and its verify,
/// let through its gate, passes on it.
fn assert_runs_on_and_passes(src: Background, api: &Path, disk: &Path, seed: u64) {
    assert_eq!(http(api, "PUT", "/api/v1/vm.pause", None).0, 204);
    assert_eq!(http(api, "PUT", "/api/v1/vm.resume", None).0, 204);
    test_infra::open_gate(disk, BLOCKS);
    let (code, stdout, err) = src.wait();
    assert_eq!(code, Some(0), "the source's status; stderr: {err}");
    assert!(err.contains("failed; the VM runs on here"), "{err}");
    assert!(!err.contains("migrated to"), "{err}");
    assert_verify_passed(&stdout, &err, "the source after failed migrations", BLOCKS);
    test_infra::assert_holds_pattern_and_open_gate(disk, seed, BLOCKS);
}

/// A verify run of `seed` at queue depth 8 on one queue.
fn verify(seed: u64) -> (u64, Verify) {
    (seed, Verify { seed, qd: 8, queues: 1 })
}

/// The source host's VM: the probe's verify in eventfd mode, with `tls` as its
/// `--migration-tls-dir`; the VM, its API socket and its disk.
fn tls_source(pair: &HostPair, dir: &Path, verify: Verify, tls: &Path) -> (Background, PathBuf, PathBuf) {
    source_in(Some(&pair.source), dir, "eventfd", verify, &["--migration-tls-dir", tls.to_str().unwrap()])
}

/// Migrate `verify` in `mode` mid-run from the source host to the destination host, over
/// mutual TLS (`tls`) or plain TCP named so.
fn migrate_between_hosts(mode: &str, verify: Verify, tls_on: bool) {
    let what = format!("{mode} over {}", if tls_on { "tcp (mutual TLS)" } else { "tcp+plain" });
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let pair = hosts_with_certificates(dir, &["ca"]);
    let url = url(if tls_on { "tcp" } else { "tcp+plain" }, PORT);
    let (src_tls, dst_tls) = (tls(dir, "ca", SOURCE_IP), tls(dir, "ca", DESTINATION_IP));
    let dst =
        destination(&pair, dir, "destination", &url, tls_on.then_some(&*dst_tls), &[disk_spec(dir, verify)]);
    let src_tls_arg = src_tls.to_str().unwrap();
    let extra: &[&str] = if tls_on { &["--migration-tls-dir", src_tls_arg] } else { &[] };
    let (src, api, disk) = source_in(Some(&pair.source), dir, mode, verify, extra);
    let (status, body) = send_migration_to(&api, &url);
    assert_eq!(status, 200, "{what}: send-migration: {body}");
    let report = assert_report(&what, &body);
    test_infra::open_gate(&disk, BLOCKS);
    let (code, stdout, err) = src.wait();
    assert_eq!(code, Some(0), "{what}: the source's status; stderr: {err}");
    assert!(err.contains(&format!("migrated to {url}")), "{what}: {err}");
    assert!(blk_result(&stdout).is_none(), "{what}: the verify passed its gate on the source: {stdout}");
    let (code, stdout, dst_err) = dst.wait();
    assert_eq!(code, Some(0), "{what}: the destination's status; stderr: {dst_err}; stdout: {stdout}");
    assert!(dst_err.contains("0 connections refused"), "{what}: {dst_err}");
    assert_verify_passed(&stdout, &dst_err, &what, BLOCKS);
    test_infra::assert_holds_pattern_and_open_gate(&disk, verify.seed, BLOCKS);
    println!(
        "{what}, between two network namespaces: downtime {:.3} ms (pause {:.3} ms, last send {:.3} ms, destination {:.3} ms), total {:.1} ms, pages per round {}, {} bytes",
        report["downtime_ms"].as_f64().unwrap(),
        report["pause_ms"].as_f64().unwrap(),
        report["final_send_ms"].as_f64().unwrap(),
        report["destination_ms"].as_f64().unwrap(),
        report["total_ms"].as_f64().unwrap(),
        report["pages_per_round"],
        report["bytes"],
    );
}

#[test]
fn a_vm_migrated_between_two_hosts_over_mutual_tls_finishes_its_verify() {
    let _one = one_at_a_time();
    for (i, mode) in ["eventfd", "exitless"].into_iter().enumerate() {
        migrate_between_hosts(mode, Verify { seed: 3600 + i as u64, qd: 8, queues: 1 }, true);
    }
}

#[test]
fn plain_tcp_named_so_migrates_too() {
    let _one = one_at_a_time();
    migrate_between_hosts("eventfd", Verify { seed: 3610, qd: 8, queues: 1 }, false);
}

/// `ip netns exec NS timeout 30 openssl s_client ...ARGS` against the destination's port: a
/// stranger that speaks TLS.
fn openssl_client(pair: &HostPair, args: &[&str]) {
    let status = Command::new("ip")
        .args(["netns", "exec", &pair.source, "timeout", "30", "openssl", "s_client", "-connect"])
        .arg(format!("{DESTINATION_IP}:{PORT}"))
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("the openssl command (Debian's openssl package, which scripts/setup.sh installs)");
    // s_client's own status does not matter (the server refused it); only that it ran.
    assert_ne!(status.code(), Some(124), "openssl s_client {args:?} hung");
}

#[test]
fn a_destination_refuses_strangers_and_waits_on_for_its_source() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let pair = hosts_with_certificates(dir, &["ca", "other-ca"]);
    let (seed, verify) = verify(3620);
    let url = url("tcp", PORT);
    let dst_tls = tls(dir, "ca", DESTINATION_IP);
    let dst = destination(&pair, dir, "destination", &url, Some(&dst_tls), &[disk_spec(dir, verify)]);
    let src_tls = tls(dir, "ca", SOURCE_IP);
    let (src, api, disk) = tls_source(&pair, dir, verify, &src_tls);

    // The source itself, naming plain TCP where the destination takes TLS: refused by both.
    let plain = send_migration_to(&api, &self::url("tcp+plain", PORT));
    assert_refused("plain TCP to a TLS destination", plain, "answered with a TLS alert");
    let lines = refusals(&dst, 1);
    assert!(lines[0].contains("does not speak TLS"), "{lines:?}");
    // A TLS client without a certificate.
    openssl_client(&pair, &["-CAfile", dir.join("ca/ca/ca.pem").to_str().unwrap()]);
    let lines = refusals(&dst, 2);
    assert!(lines[1].contains("presented no certificate"), "{lines:?}");
    // A TLS client whose certificate another CA signed.
    let other = tls(dir, "other-ca", SOURCE_IP);
    let (cert, key) = (other.join("cert.pem"), other.join("key.pem"));
    openssl_client(&pair, &["-cert", cert.to_str().unwrap(), "-key", key.to_str().unwrap()]);
    let lines = refusals(&dst, 3);
    let ca = dst_tls.join("ca.pem");
    assert!(lines[2].contains(&format!("is not signed by a CA in {}", ca.display())), "{lines:?}");
    // Something that is not TLS at all.
    let garbage = hosts::thread_in(&pair.source, || {
        let mut conn = TcpStream::connect((DESTINATION_IP, PORT)).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let _ = conn.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        let mut answer = Vec::new();
        let _ = conn.read_to_end(&mut answer);
        answer
    });
    let answer = garbage.join().unwrap();
    let lines = refusals(&dst, 4);
    assert!(lines[3].contains("does not speak TLS"), "{lines:?}");
    assert!(!answer.windows(8).any(|w| w == b"EXLMIGR1"), "{answer:?}");
    for line in &lines {
        assert!(line.contains(&format!("from {SOURCE_IP}:")) && line.contains("still waiting"), "{line}");
        println!("the destination said: {line}");
    }

    // Still waiting: the source with its certificate gets through, and the VM runs there.
    let (status, body) = send_migration_to(&api, &url);
    assert_eq!(status, 200, "after the strangers: {body}");
    test_infra::open_gate(&disk, BLOCKS);
    let (code, _, err) = src.wait();
    assert_eq!(code, Some(0), "the source: {err}");
    let (code, stdout, dst_err) = dst.wait();
    assert_eq!(code, Some(0), "the destination: {dst_err}");
    assert!(dst_err.contains("4 connections refused"), "{dst_err}");
    assert_verify_passed(&stdout, &dst_err, "after the strangers", BLOCKS);
    test_infra::assert_holds_pattern_and_open_gate(&disk, seed, BLOCKS);
}

/// A TLS directory at `at` with `ca.pem` from the `cas` directories (concatenated) and the
/// certificate and key of `host`.
fn tls_dir(at: &Path, cas: &[&Path], host: &Path) -> PathBuf {
    std::fs::create_dir_all(at).unwrap();
    let bundle: String = cas.iter().map(|ca| std::fs::read_to_string(ca.join("ca.pem")).unwrap()).collect();
    std::fs::write(at.join("ca.pem"), bundle).unwrap();
    for file in ["cert.pem", "key.pem"] {
        std::fs::copy(host.join(file), at.join(file)).unwrap();
    }
    std::fs::set_permissions(at.join("key.pem"), std::fs::Permissions::from_mode(0o600)).unwrap();
    at.to_path_buf()
}

/// A TCP server on the destination host at `port` that speaks no TLS: it records what it is
/// sent and answers like a plain exitless destination.
fn plain_stranger(ns: &str, port: u16) -> std::thread::JoinHandle<Vec<u8>> {
    let listener =
        hosts::thread_in(ns, move || TcpListener::bind(SocketAddr::from((DESTINATION_IP, port))).unwrap())
            .join()
            .unwrap();
    std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = vec![0u8; 65536];
        let n = conn.read(&mut got).unwrap_or(0);
        got.truncate(n);
        // "Accepted": a reply of status 0 and no message.
        let _ = conn.write_all(&[0, 0, 0, 0, 0]);
        let mut rest = Vec::new();
        let _ = conn.read_to_end(&mut rest);
        got.extend(rest);
        got
    })
}

#[test]
fn a_source_refuses_destinations_it_cannot_authenticate_and_runs_on() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let pair = hosts_with_certificates(dir, &["ca", "other-ca", "third-ca"]);
    let (seed, verify) = verify(3630);
    // The source trusts "ca" and "other-ca", and its own certificate is other-ca's.
    let (ca, other) = (dir.join("ca/ca"), dir.join("other-ca/ca"));
    let src_tls = tls_dir(&dir.join("source-tls"), &[&ca, &other], &tls(dir, "other-ca", SOURCE_IP));
    let (src, api, disk) = tls_source(&pair, dir, verify, &src_tls);
    let disks = [disk_spec(dir, verify)];

    // A destination that trusts "ca" only: it refuses the source's certificate.
    let strict =
        destination(&pair, dir, "strict", &url("tcp", PORT), Some(&tls(dir, "ca", DESTINATION_IP)), &disks);
    let refused = send_migration_to(&api, &url("tcp", PORT));
    assert_refused("the source's certificate, another CA's", refused, "refused this host's certificate");
    let line = &refusals(&strict, 1)[0];
    assert!(line.contains("the source's certificate is not signed by a CA in"), "{line}");
    println!("the destination said: {line}");

    // A destination whose certificate a CA the source does not trust signed.
    let third = tls(dir, "third-ca", DESTINATION_IP);
    let stranger = destination(&pair, dir, "stranger", &url("tcp", PORT + 1), Some(&third), &disks);
    let refused = send_migration_to(&api, &url("tcp", PORT + 1));
    let ca_file = src_tls.join("ca.pem");
    let expect = format!("the destination's certificate is not signed by a CA in {}", ca_file.display());
    let message = assert_refused("a destination of another CA", refused, &expect);
    assert!(message.contains("nothing of the VM was sent"), "{message}");
    let line = &refusals(&stranger, 1)[0];
    assert!(line.contains("the source refused this host's certificate"), "{line}");
    println!("that destination said: {line}");

    // A destination whose certificate a trusted CA signed for another address.
    let elsewhere = tls(dir, "ca", SOURCE_IP);
    let misnamed = destination(&pair, dir, "misnamed", &url("tcp", PORT + 2), Some(&elsewhere), &disks);
    let refused = send_migration_to(&api, &url("tcp", PORT + 2));
    assert_refused("a destination certified for another address", refused, "does not name the IP address");
    refusals(&misnamed, 1);

    // Something on the port that speaks no TLS: it gets a TLS ClientHello and nothing of the VM.
    let plain = plain_stranger(&pair.destination, PORT + 3);
    let refused = send_migration_to(&api, &url("tcp", PORT + 3));
    assert_refused("a server that speaks no TLS", refused, "does not speak TLS");
    let got = plain.join().unwrap();
    assert_eq!(got.first(), Some(&0x16), "not a TLS handshake record: {got:?}");
    assert!(!got.windows(8).any(|w| w == b"EXLMIGR1"), "the stranger got the stream");

    // A closed port.
    let refused = send_migration_to(&api, &url("tcp", PORT + 4));
    assert_refused("a closed port", refused, &format!("cannot connect to {DESTINATION_IP}:{}", PORT + 4));

    // None of the destinations built a VM: each waits on.
    for (name, mut proc) in [("strict", strict), ("stranger", stranger), ("misnamed", misnamed)] {
        assert!(!proc.ended(), "{name} stopped waiting: {}", proc.stderr());
        proc.kill();
    }
    assert_runs_on_and_passes(src, &api, &disk, seed);
}

/// Forward a connection on the destination host (namespace `ns`) from `port` to the
/// destination's `PORT`; once `limit` bytes of the source's have gone through, kill the
/// destination (`pid`) and close both ends: a peer that dies midway. Returns once it listens;
/// its thread gives how many bytes it forwarded.
fn killing_proxy(ns: &str, port: u16, limit: usize, pid: u32) -> std::thread::JoinHandle<usize> {
    let (listening, listens) = std::sync::mpsc::channel();
    let proxy = hosts::thread_in(ns, move || {
        let listener = TcpListener::bind(SocketAddr::from((DESTINATION_IP, port))).unwrap();
        listening.send(()).unwrap();
        let (mut from_source, _) = listener.accept().unwrap();
        let mut to_destination = TcpStream::connect((DESTINATION_IP, PORT)).unwrap();
        let (mut replies_in, mut replies_out) =
            (to_destination.try_clone().unwrap(), from_source.try_clone().unwrap());
        std::thread::spawn(move || std::io::copy(&mut replies_in, &mut replies_out));
        let forwarded = forward_up_to(&mut from_source, &mut to_destination, limit);
        let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        let _ = to_destination.shutdown(std::net::Shutdown::Both);
        let _ = from_source.shutdown(std::net::Shutdown::Both);
        forwarded
    });
    listens.recv().expect("the proxy could not listen");
    proxy
}

#[test]
fn a_destination_that_dies_midway_leaves_the_source_running() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let pair = hosts_with_certificates(dir, &["ca"]);
    let (seed, verify) = verify(3640);
    let dst_tls = tls(dir, "ca", DESTINATION_IP);
    let dst =
        destination(&pair, dir, "destination", &url("tcp", PORT), Some(&dst_tls), &[disk_spec(dir, verify)]);
    let src_tls = tls(dir, "ca", SOURCE_IP);
    let (src, api, disk) = tls_source(&pair, dir, verify, &src_tls);
    // The source connects to the proxy (at the same address, which the destination's
    // certificate names).
    let proxy = killing_proxy(&pair.destination, PORT + 1, 100_000, dst.pid());
    let refused = send_migration_to(&api, &url("tcp", PORT + 1));
    let forwarded = proxy.join().unwrap();
    assert!(forwarded >= 100_000, "the destination died before the stream was midway: {forwarded} bytes");
    assert_refused("a destination that died midway", refused, "the connection broke");
    let (code, _, dst_err) = dst.wait();
    assert_eq!(code, None, "the destination was not killed: {dst_err}");
    assert_runs_on_and_passes(src, &api, &disk, seed);
}

#[test]
fn tcp_needs_a_tls_directory_or_tcp_plain_by_name() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    // No --migration-tls-dir: refused before anything listens, naming the flag and the scheme.
    let out = exitless(&["run", "--receive-migration", "tcp:127.0.0.1:7070", "--timeout", "5"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--migration-tls-dir") && err.contains("tcp+plain:"), "{err}");
    // A host name where an address goes.
    let out = exitless(&["run", "--receive-migration", "tcp:localhost:7070", "--timeout", "5"]);
    let err = stderr(&out);
    assert!(!out.status.success() && err.lines().count() == 1, "{err}");
    assert!(err.contains("tcp:IP:PORT"), "{err}");
    // A TLS directory whose key other users may read, or that lacks a file.
    hosts::make_certificates(&dir.path().join("ca"), &["127.0.0.1"]).unwrap_or_else(|e| panic!("{e}"));
    let tls = dir.path().join("ca/127.0.0.1");
    std::fs::set_permissions(tls.join("key.pem"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let tls_arg = tls.to_str().unwrap();
    let args = ["run", "--receive-migration", "tcp:127.0.0.1:7070", "--migration-tls-dir", tls_arg];
    let out = exitless(&[&args[..], &["--timeout", "5"]].concat());
    let err = stderr(&out);
    assert!(!out.status.success() && err.lines().count() == 1, "{err}");
    assert!(err.contains("key.pem") && err.contains("chmod 600"), "{err}");
    std::fs::remove_file(tls.join("cert.pem")).unwrap();
    let out = exitless(&[&args[..], &["--timeout", "5"]].concat());
    let err = stderr(&out);
    assert!(!out.status.success() && err.lines().count() == 1, "{err}");
    assert!(err.contains("cert.pem"), "{err}");
}

/// A VM whose disk is an RBD image migrates between the two hosts over mutual TLS in the middle
/// of its verify: the cluster runs on the source host, bound to its address, so both hosts reach
/// it; the destination opens the same image, takes its exclusive lock once the source has let it
/// go, and finishes the verify, and the image holds every block.
#[test]
fn a_vm_on_an_rbd_image_migrates_between_two_hosts_and_the_image_follows() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let pair = hosts_with_certificates(dir, &["ca"]);
    let cluster = storage::testing::ceph::TestCluster::own_in("migration", Some((&pair.source, SOURCE_IP)));
    const OPS: u64 = 3000;
    cluster.image("migrating", 64 << 20);
    let disk = format!("rbd=rbd/migrating,conf={}", cluster.conf().display());
    let url = url("tcp", PORT);
    let (src_tls, dst_tls) = (tls(dir, "ca", SOURCE_IP), tls(dir, "ca", DESTINATION_IP));
    let dst = destination(&pair, dir, "destination", &url, Some(&dst_tls), std::slice::from_ref(&disk));
    let cmdline = format!("probe.workload=blk probe.rw=verify probe.ops={OPS} probe.qd=8 probe.seed=3700 probe.timeout_ms=60000");
    let api = dir.join("source.api");
    let args = [
        "run",
        "--probe",
        "--mem",
        "256M",
        "--disk",
        &disk,
        "--io-mode",
        "eventfd",
        "--cmdline",
        &cmdline,
        "--api-socket",
        api.to_str().unwrap(),
        "--migration-tls-dir",
        src_tls.to_str().unwrap(),
        "--timeout",
        "170",
    ];
    let src = Background::start_in(Some(&pair.source), dir, "source", &args, Ready::Exists(&api));
    // Mid-verify: the outcome checked does not depend on how far it got.
    std::thread::sleep(Duration::from_millis(500));
    let (status, body) = send_migration_to(&api, &url);
    assert_eq!(status, 200, "send-migration: {body}");
    let (code, _, err) = src.wait();
    assert_eq!(code, Some(0), "the source's status; stderr: {err}");
    assert!(err.contains(&format!("migrated to {url}")), "{err}");
    let (code, stdout, dst_err) = dst.wait();
    assert_eq!(code, Some(0), "the destination's status; stderr: {dst_err}; stdout: {stdout}");
    let result = blk_result(&stdout).unwrap_or_else(|| panic!("no verify result: {dst_err}"));
    assert_eq!((result["mismatches"].as_u64(), result["errors"].as_u64()), (Some(0), Some(0)), "{result}");
    let image = dir.join("image");
    cluster.rbd(&["export", "rbd/migrating", image.to_str().unwrap()]);
    test_infra::assert_holds_pattern(&image, 3700, OPS);
    let locks = cluster.rbd(&["lock", "ls", "rbd/migrating"]);
    assert!(locks.trim().is_empty(), "both ends ended, yet the image is locked: {locks}");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    println!(
        "an RBD disk's VM, between two network namespaces over mutual TLS: downtime {} ms",
        report["downtime_ms"]
    );
}
