//! Snapshot, restore and live migration of an exitless VM with a NIC on a tap. Two taps on one
//! Linux bridge stand for the ports of two hosts: the VM leaves one and comes back on the other.
//! - Live migration in the middle of the probe's UDP request-response with the host: the
//!   destination's guest carries on through the other tap, no payload is wrong, and at most the
//!   request in flight at the switch is lost (UDP's due).
//! - A VM answering UDP (the probe's `udp-echo`) snapshotted, killed and restored on the other
//!   tap: the restored NIC's RARP moves its address on the bridge, so the host's requests reach
//!   it at once, though the guest sent nothing itself.
//! - The same with its NIC on `exitless vhost-user-net`: the daemon stops the rings for the
//!   pause, and announces the restored NIC's address for it.

use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use test_infra::api::http;
use test_infra::background::Background;
use test_infra::migration::{assert_report, send_migration_to};
use test_infra::net::{ip, wait_for_echo, Netns, RarpCapture};
use test_infra::{one_at_a_time, probe_result};

/// The guest's MAC address (exitless's default for the first device).
const GUEST_MAC: &str = "52:54:00:45:58:00";

/// A namespace with a bridge (10.0.0.1/24) joining taps `exlA` and `exlB`, and `exitless
/// udp-echo` answering on port 7 there.
struct Lab {
    netns: Netns,
    responder: Child,
}

impl Lab {
    fn new() -> Lab {
        let netns = Netns::create();
        let n = netns.name.as_str();
        ip(&["-n", n, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", n, "addr", "add", "10.0.0.1/24", "dev", "br0"]);
        ip(&["-n", n, "link", "set", "br0", "up"]);
        for tap in ["exlA", "exlB"] {
            ip(&["-n", n, "tuntap", "add", "dev", tap, "mode", "tap"]);
            ip(&["-n", n, "link", "set", tap, "master", "br0"]);
            ip(&["-n", n, "link", "set", tap, "up"]);
        }
        let responder = netns
            .command(env!("CARGO_BIN_EXE_exitless"))
            .args(["udp-echo", "--bind", "10.0.0.1:7"])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let lab = Lab { netns, responder };
        wait_for_echo(&lab.netns.name);
        lab
    }

    /// `--net` for the tap called `tap`.
    fn net(&self, tap: &str) -> String {
        format!("tap={tap},netns={}", self.netns.name)
    }

    /// Datagrams the namespace's UDP stack has taken in (`Udp: InDatagrams`).
    fn datagrams_in(&self) -> u64 {
        let out = self.netns.command("cat").arg("/proc/net/snmp").output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let mut udp = text.lines().filter(|l| l.starts_with("Udp: "));
        let (names, values) = (udp.next().unwrap(), udp.next().unwrap());
        let at = names.split_whitespace().position(|n| n == "InDatagrams").unwrap();
        values.split_whitespace().nth(at).unwrap().parse().unwrap()
    }

    /// Frames the tap handed to its VM (the tap's transmit count).
    fn frames_to_vm(&self, tap: &str) -> u64 {
        let path = format!("/sys/class/net/{tap}/statistics/tx_packets");
        let out = self.netns.command("cat").arg(path).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }

    /// `exitless run --probe` with its NIC on `tap`, in I/O mode `mode`, and an API socket (its
    /// path returned): the probe's workload as `cmdline` says.
    fn start_vm(
        &self,
        dir: &Path,
        name: &str,
        tap: &str,
        mode: &str,
        cmdline: &str,
    ) -> (Background, PathBuf) {
        let api = dir.join(format!("{name}.api"));
        let net = self.net(tap);
        let args = ["run", "--probe", "--mem", "64M", "--net", &net, "--io-mode", mode, "--cmdline", cmdline];
        let args = [&args[..], &["--api-socket", api.to_str().unwrap(), "--timeout", "170"]].concat();
        (Background::start(dir, name, &args, &api), api)
    }

    /// `exitless udp-rr` from the namespace to the guest's `udp-echo`, for `ms`, giving up after
    /// `max_timeouts` unanswered requests.
    fn ask_guest(&self, ms: u32, max_timeouts: u32) -> Output {
        self.netns
            .command(env!("CARGO_BIN_EXE_exitless"))
            .args(["udp-rr", "--to", "10.0.0.2:7", "--duration-ms", &ms.to_string()])
            .args(["--timeout-ms", "500", "--max-timeouts", &max_timeouts.to_string()])
            .output()
            .unwrap()
    }

    fn wait_until(&self, done: impl Fn() -> bool, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done() {
            assert!(Instant::now() < deadline, "waited 30 s for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.responder.kill();
        let _ = self.responder.wait();
    }
}

#[test]
fn a_vm_migrated_mid_request_response_carries_on_through_the_destinations_tap() {
    let _one = one_at_a_time();
    let lab = Lab::new();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("destination.mig");
    let url = format!("unix:{}", socket.display());
    let net_b = lab.net("exlB");
    let dst_args = ["run", "--receive-migration", &url, "--testdev", "--net", &net_b, "--timeout", "170"];
    let destination = Background::start(dir.path(), "destination", &dst_args, &socket);
    // Four seconds of guest time: the migration starts a few hundred transactions in and takes
    // well under a second for 64 MiB.
    let cmdline = "probe.workload=udp-rr probe.duration_ms=4000 probe.timeout_ms=500 probe.max_timeouts=3";
    let (source, api) = lab.start_vm(dir.path(), "source", "exlA", "exitless", cmdline);
    let before = lab.datagrams_in();
    lab.wait_until(|| lab.datagrams_in() > before + 500, "the guest's requests");

    let (status, body) = send_migration_to(&api, &url);
    assert_eq!(status, 200, "the migration: {body}");
    // The receive rings are filled through the host mapping: only the device's log sees them.
    let report = assert_report("a VM with a NIC", &body);
    let (code, _, source_err) = source.wait();
    assert_eq!(code, Some(0), "the source, once migrated: {source_err}");

    let (code, stdout, stderr) = destination.wait();
    assert_eq!(code, Some(0), "the destination's guest: {stdout}\n{stderr}");
    let result = probe_result(&stdout, "udp-rr").unwrap_or_else(|| panic!("no udp-rr result: {stdout}"));
    assert_eq!(result["mismatches"], 0, "{result}");
    let timeouts = result["timeouts"].as_u64().unwrap();
    assert!(timeouts <= 1, "more requests lost than the one in flight at the switch: {result}");
    assert!(result["ops"].as_u64().unwrap() > 1000, "{result}");
    assert!(lab.frames_to_vm("exlB") > 100, "the destination's tap carried no echoes: {result}");
    println!(
        "migrated mid udp-rr: downtime {} ms, {} transactions, {timeouts} timed out",
        report["downtime_ms"], result["ops"]
    );
}

#[test]
fn a_restored_nic_announces_itself_so_the_bridge_sends_its_frames_to_the_new_tap() {
    let _one = one_at_a_time();
    let lab = Lab::new();
    let dir = tempfile::tempdir().unwrap();
    let cmdline = "probe.workload=udp-echo probe.duration_ms=120000";
    let (vm, api) = lab.start_vm(dir.path(), "vm", "exlA", "eventfd", cmdline);
    let asked = lab.ask_guest(200, 10);
    assert!(
        asked.status.success(),
        "the guest before the snapshot: {}",
        String::from_utf8_lossy(&asked.stderr)
    );
    let snap = dir.path().join("snap");
    assert_eq!(http(&api, "PUT", "/api/v1/vm.pause", None).0, 204, "pause");
    let config = snapshot(&api, &snap);
    vm.kill();
    assert_eq!(config["nets"][0]["mac"], GUEST_MAC, "{config}");

    let source = format!("source_url=file://{}", snap.display());
    let refused = |net_args: &[&str], expect: &str| restore_refused(&source, net_args, expect);
    refused(&[], "the VM has 1 NIC(s) (52:54:00:45:58:00) and 0 were named with --net");
    let other_mac = format!("{},mac=52:54:00:00:00:01", lab.net("exlB"));
    refused(&["--net", &other_mac], "NIC 0: the guest knows it as 52:54:00:45:58:00");

    // The restored guest sends nothing until asked; the bridge learned its address on exlA.
    let restored_api = dir.path().join("restored.api");
    let net_b = lab.net("exlB");
    let args = ["run", "--restore", &source, "--testdev", "--net", &net_b, "--api-socket"];
    let restored = Background::start(
        dir.path(),
        "restored",
        &[&args[..], &[restored_api.to_str().unwrap()]].concat(),
        &restored_api,
    );
    // Without the announcement every request would go to exlA, where nobody reads, until the
    // bridge forgot the address (300 s); a request lost before the bridge took it in is retried.
    let asked = lab.ask_guest(200, 1);
    assert!(
        asked.status.success(),
        "the restored guest did not answer: {}{}",
        String::from_utf8_lossy(&asked.stdout),
        String::from_utf8_lossy(&asked.stderr)
    );
    assert!(lab.frames_to_vm("exlB") > 0);
    restored.kill();
}

/// A VM answering UDP with its NIC on `exitless vhost-user-net` (`--net vhost-user=`), its host
/// a namespace beyond the daemon's uplink: paused (the daemon stops its rings, so guest memory
/// holds still: the host's requests land in no receive buffer), snapshotted, killed, and restored in a new process on the same daemon NIC. The
/// restored NIC asks the daemon to announce its address (SEND_RARP), which the host sees as a
/// RARP from it; the host's requests reach the guest again. A restore that names no vhost-user
/// NIC, or one with another address, is refused on one line; so is a live migration.
#[test]
fn a_vm_with_a_nic_on_the_daemon_is_snapshotted_and_restored_there() {
    use test_infra::net::Veth;
    let _one = one_at_a_time();
    let (netns, veth) = (Netns::create(), Veth::create());
    veth.peer_into(&netns, "10.0.0.1/24");
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nic.sock");
    let nic = format!("socket={},mac={GUEST_MAC}", socket.display());
    let daemon_api = dir.path().join("net.api");
    let daemon_args = ["vhost-user-net", "--nic", &nic, "--uplink", &veth.ours, "--io-mode", "eventfd"];
    let daemon_args = [&daemon_args[..], &["--api-socket", daemon_api.to_str().unwrap()]].concat();
    let daemon = Background::start(dir.path(), "net", &daemon_args, &socket);
    // Frames the daemon put into the guest's receive ring so far.
    let delivered = || {
        let (status, body) = http(&daemon_api, "GET", "/nics/nic0", None);
        assert_eq!(status, 200, "{body}");
        let nic: serde_json::Value = serde_json::from_str(&body).unwrap();
        nic["counters"]["rx_frames"].as_u64().unwrap()
    };
    let ask_guest = |ms: u32, max_timeouts: u32| {
        netns
            .command(env!("CARGO_BIN_EXE_exitless"))
            .args(["udp-rr", "--to", "10.0.0.2:7", "--duration-ms", &ms.to_string()])
            .args(["--timeout-ms", "500", "--max-timeouts", &max_timeouts.to_string()])
            .output()
            .unwrap()
    };
    let net = format!("vhost-user={},mac={GUEST_MAC}", socket.display());
    let api = dir.path().join("vm.api");
    let cmdline = "probe.workload=udp-echo probe.ip=10.0.0.2 probe.dst=10.0.0.1 probe.duration_ms=120000";
    let args =
        ["run", "--probe", "--mem", "64M", "--net", &net, "--io-mode", "eventfd", "--cmdline", cmdline];
    let args = [&args[..], &["--api-socket", api.to_str().unwrap(), "--timeout", "170"]].concat();
    let vm = Background::start(dir.path(), "vm", &args, &api);
    let asked = ask_guest(200, 10);
    assert!(
        asked.status.success(),
        "the guest before the snapshot: {}",
        String::from_utf8_lossy(&asked.stderr)
    );

    let snap = dir.path().join("snap");
    assert_eq!(http(&api, "PUT", "/api/v1/vm.pause", None).0, 204, "pause");
    // Paused, the daemon holds none of the guest's rings: it writes nothing into guest memory,
    // which the snapshot is about to save.
    let before = delivered();
    let while_paused = ask_guest(300, 0);
    assert!(!while_paused.status.success(), "the paused guest answered");
    assert_eq!(delivered(), before, "the daemon delivered frames into the paused guest");
    let config = snapshot(&api, &snap);
    vm.kill();
    assert_eq!(config["vhost_user_nets"][0]["mac"], GUEST_MAC, "{config}");

    let source = format!("source_url=file://{}", snap.display());
    let refused = |net_args: &[&str], expect: &str| restore_refused(&source, net_args, expect);
    refused(&[], "the VM has 1 NIC(s) on vhost-user daemons (52:54:00:45:58:00) and 0 were named");
    let other_mac = format!("vhost-user={},mac=52:54:00:00:00:01", socket.display());
    refused(&["--net", &other_mac], "NIC 0: the guest knows it as 52:54:00:45:58:00");

    // Listening before the restore announces the guest.
    let capture = RarpCapture::start(&netns, &veth.peer, GUEST_MAC, 60, &dir.path().join("rarp"));
    let restored_api = dir.path().join("restored.api");
    let args = ["run", "--restore", &source, "--testdev", "--net", &net, "--api-socket"];
    let restored = Background::start(
        dir.path(),
        "restored",
        &[&args[..], &[restored_api.to_str().unwrap()]].concat(),
        &restored_api,
    );
    let asked = ask_guest(200, 1);
    assert!(
        asked.status.success(),
        "the restored guest did not answer: {}{}",
        String::from_utf8_lossy(&asked.stdout),
        String::from_utf8_lossy(&asked.stderr)
    );
    // Live migration is refused, saying why: the daemon would have to log what it writes.
    let nowhere = format!("unix:{}", dir.path().join("nowhere.mig").display());
    let (status, body) = send_migration_to(&restored_api, &nowhere);
    assert!(
        status >= 400 && body.contains("NIC on a vhost-user daemon is not supported yet"),
        "{status} {body}"
    );
    let (_, restored_log) = restored.kill();
    // SAFETY: kill(2) on our own child, not yet waited for.
    unsafe { libc::kill(daemon.pid() as i32, libc::SIGTERM) };
    let (_, _, daemon_log) = daemon.wait();
    let announced = format!("announced {GUEST_MAC} with a RARP");
    assert!(daemon_log.contains(&announced), "daemon: {daemon_log}\nrestored VM: {restored_log}");
    let frame = capture.frame().expect("no RARP from the guest reached the host");
    assert_eq!(frame[12..14], [0x80, 0x35], "a RARP frame: {frame:02x?}");
}

/// Snapshot the paused VM whose API is `api` into `snap`: the configuration it saved.
fn snapshot(api: &Path, snap: &Path) -> serde_json::Value {
    let body = format!(r#"{{"destination_url": "file://{}"}}"#, snap.display());
    let (status, answer) = http(api, "PUT", "/api/v1/vm.snapshot", Some(&body));
    assert_eq!(status, 204, "snapshot: {answer}");
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(snap.join("state.json")).unwrap()).unwrap();
    state["config"].clone()
}

/// `exitless run --restore SOURCE --testdev NET_ARGS...` fails, saying `expect` on one line.
fn restore_refused(source: &str, net_args: &[&str], expect: &str) {
    let out = test_infra::exitless(&[&["run", "--restore", source, "--testdev"], net_args].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "restored: {stderr}");
    assert!(stderr.contains(expect) && stderr.trim_end().lines().count() == 1, "{stderr}");
}
