//! virtio-net end to end: the probe guest's ring-3 driver and UDP stack, exitless's device and
//! IOCore, a real tap in a network namespace of the test's own, and `exitless udp-echo` there.

use std::process::{Child, Command, Stdio};

use test_infra::net::{ip, wait_for_echo};
use test_infra::{args, exitless, json_lines, line_with, stderr, stdout};

const MODES: [&str; 6] = ["trap", "eventfd", "pv-eoi", "sidecore", "exitless", "adaptive"];
const TAP: &str = "exltest0";

struct Lab {
    netns: String,
    responder: Child,
}

impl Lab {
    fn new(tag: &str) -> Lab {
        let netns = format!("exl-test-{tag}-{}", std::process::id());
        ip(&["netns", "add", &netns]);
        ip(&["-n", &netns, "link", "set", "lo", "up"]);
        ip(&["-n", &netns, "tuntap", "add", "dev", TAP, "mode", "tap"]);
        ip(&["-n", &netns, "addr", "add", "10.0.0.1/24", "dev", TAP]);
        ip(&["-n", &netns, "link", "set", TAP, "up"]);
        let responder = Command::new("ip")
            .args([
                "netns",
                "exec",
                &netns,
                env!("CARGO_BIN_EXE_exitless"),
                "udp-echo",
                "--bind",
                "0.0.0.0:7",
                // With the IOCore, away from the vCPU, whose every preemption is an exit.
                "--cpu",
                "1",
            ])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_for_echo(&netns);
        Lab { netns, responder }
    }

    fn run(&self, mode: &str, cmdline: &str) -> std::process::Output {
        let net = format!("tap={TAP},netns={}", self.netns);
        let line = "run --probe --pin-vcpu 0 --iocore-cpu 1 --timeout 120 --stats --json";
        exitless(&args(line, &["--net", &net, "--io-mode", mode, "--cmdline", cmdline]))
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.responder.kill();
        let _ = self.responder.wait();
        let _ = Command::new("ip").args(["netns", "del", &self.netns]).status();
    }
}

#[test]
fn udp_echo_with_payload_check_in_every_mode() {
    let _one = test_infra::one_at_a_time();
    let lab = Lab::new("echo");
    for mode in MODES {
        let out = lab.run(mode, "probe.workload=udp-rr probe.ops=300 probe.size=200");
        assert_eq!(out.status.code(), Some(0), "{mode}: {}\n{}", stdout(&out), stderr(&out));
        let result = line_with(&out, "probe", "udp-rr");
        assert_eq!(result["ops"], 300, "{mode}: {result}");
        assert_eq!(result["mismatches"], 0, "{mode}: {result}");
        assert_eq!(result["errors"], 0, "{mode}: {result}");
    }
}

#[test]
fn exitless_mode_makes_no_exit_per_transaction() {
    let _one = test_infra::one_at_a_time();
    let lab = Lab::new("exits");
    let out = lab.run("exitless", "probe.workload=udp-rr probe.ops=10000");
    assert_eq!(out.status.code(), Some(0), "{}\n{}", stdout(&out), stderr(&out));
    assert_eq!(line_with(&out, "probe", "udp-rr")["ops"], 10_000);
    let phase = test_infra::phase(&out, 0, 1);
    let caused_by_io = test_infra::io_path_exits(&phase["counters"]) / 10_000.0;
    assert!(caused_by_io < 0.01, "{caused_by_io} exits per transaction on the I/O path: {phase}");
}

/// What the device must do with each net-hostile case on the transmit queue: (case, result,
/// used length, a configuration-change interrupt). A chain it cannot send comes back unsent
/// (used, length 0); a queue the driver broke gets DEVICE_NEEDS_RESET, announced by a
/// configuration-change interrupt, and nothing in the used ring.
const NET_HOSTILE_EXPECTED: [(&str, &str, Option<u64>, bool); 8] = [
    ("addr_outside_ram", "used", Some(0), false),
    ("addr_len_wraps", "used", Some(0), false),
    ("descriptor_loop", "used", Some(0), false),
    ("frame_too_large", "used", Some(0), false),
    ("shorter_than_header", "used", Some(0), false),
    ("device_writable", "used", Some(0), false),
    ("avail_index_jump", "needs_reset", None, true),
    // The same chain in flight twice: a driver bug the device must not serve twice. The first
    // is sent and returned once, then the device needs a reset.
    ("duplicate_head", "needs_reset", Some(0), true),
];

#[test]
fn hostile_driver_gets_the_expected_outcome_per_case_and_the_device_keeps_working() {
    let _one = test_infra::one_at_a_time();
    let lab = Lab::new("hostile");
    let mut wrong = Vec::new();
    for mode in ["trap", "eventfd", "exitless", "adaptive"] {
        let out = lab.run(mode, "probe.workload=net-hostile");
        let Some(result) = json_lines(&out).into_iter().find(|l| l["probe"] == "net-hostile") else {
            wrong.push(format!("{mode}: no result line; stdout: {}; stderr: {}", stdout(&out), stderr(&out)));
            continue;
        };
        let cases = result["cases"].as_array().cloned().unwrap_or_default();
        for (name, outcome, used_len, config_interrupt) in NET_HOSTILE_EXPECTED {
            let Some(case) = cases.iter().find(|c| c["case"] == name) else {
                wrong.push(format!("{mode}: {name}: missing from {result}"));
                continue;
            };
            let expected = (outcome, used_len, config_interrupt, true);
            let seen = (
                case["result"].as_str().unwrap_or("?"),
                case["used_len"].as_u64(),
                case["config_interrupt"] == true,
                case["works_after"] == true,
            );
            if seen != expected {
                wrong.push(format!("{mode}: {name}: expected {expected:?} (with works_after), got {case}"));
            }
        }
        if result["ok"] != true || out.status.code() != Some(0) {
            wrong.push(format!("{mode}: status {:?}, {result}; {}", out.status.code(), stderr(&out)));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn bad_network_options_are_one_line_errors() {
    let cases = [
        ("tap=", 2),
        ("netns=x", 2),
        ("tap=t,mac=01:02:03:04:05:06", 2),
        ("tap=t,netns=exitless-missing", 125),
    ];
    test_infra::assert_each_refused("run --probe --net", &cases, "net");
}

/// `exitless bench net` on a short run: QEMU-KVM's rows are there, on the same tap and
/// responder, and hold what a measured row must (transactions, a latency, exits from QMP); the
/// vhost-net row is measured where the host has /dev/vhost-net and says why not where it has
/// not; exitless's rows carry their ratio to the best QEMU row, and so does QEMU on exitless
/// vhost-user-net, which reaches the responder through the daemon's uplink. And VM to VM, both
/// guests' QEMUs on the daemon or on a bridge, eight exitless VMs on one daemon, and the frame
/// rates with their peers (bare metal over veth, two QEMUs on a bridge). Shorter than the
/// probe's mark linger under QEMU (30 ms), so a run whose measured time the linger ate shows
/// as no transactions. Nothing here is a speed claim.
#[test]
fn bench_net_measures_qemu_on_the_same_tap() {
    let _one = test_infra::one_at_a_time();
    // The VM-to-VM responder shares the IOCore's CPU: slow, but the path is what is checked.
    let line = "bench net --json --modes exitless --duration-ms 20 --warmup 50 --vm-responder-cpu 1";
    let out = exitless(&args(line, &[]));
    assert_eq!(out.status.code(), Some(0), "{}\n{}", stdout(&out), stderr(&out));
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("a JSON report");
    let rows = report["results"].as_array().expect("results");
    assert!(report["qemu"].as_str().is_some_and(|v| v.contains("QEMU")), "{report}");
    assert!(report["bare_metal"].as_str().is_some_and(|v| v.contains("veth")), "{report}");
    let row = |mode: &str| {
        rows.iter().find(|r| r["mode"] == mode).unwrap_or_else(|| panic!("no row {mode}: {report}"))
    };
    let measured = |mode: &str| {
        let r = row(mode);
        assert_eq!(r["vmm"], "qemu", "{r}");
        assert!(r["transactions"].as_u64().is_some_and(|n| n > 0), "{mode}: no transactions: {r}");
        assert!(r["transactions_per_s"].as_f64().is_some_and(|t| t > 0.0), "{mode}: {r}");
        assert!(r["p50_us"].as_f64().is_some_and(|p| p > 0.0), "{mode}: {r}");
        assert!(r["p99_us"].as_f64() >= r["p50_us"].as_f64(), "{mode}: {r}");
        // Every transaction kicks the device through an MMIO write QEMU's KVM counts.
        assert!(
            r["exits_per_transaction"].as_f64().is_some_and(|e| e > 0.0),
            "{mode}: exits not counted: {r}"
        );
        assert!(r["exits_by_cause"].as_object().is_some_and(|c| !c.is_empty()), "{mode}: {r}");
        assert!(r["command"].as_str().is_some_and(|c| c.contains("vhost=") && c.contains("ifname=")), "{r}");
        r["transactions_per_s"].as_f64().unwrap()
    };
    // Every bare-metal client measured, the AF_PACKET one too.
    for mode in [
        "bare metal (veth, blocking client)",
        "bare metal (veth, busy-poll client)",
        "bare metal (veth, AF_PACKET busy-poll client)",
        "bare metal (veth, blocking client, responder on its CPU)",
    ] {
        let r = row(mode);
        assert!(r["transactions"].as_u64().is_some_and(|n| n > 0), "{mode}: no transactions: {r}");
        assert!(r["p50_us"].as_f64().is_some_and(|p| p > 0.0), "{mode}: {r}");
    }
    let interrupt = measured("qemu virtio-net, tap, interrupt");
    let poll = measured("qemu virtio-net, tap, poll");
    let mut best = interrupt.max(poll);
    let vhost = "qemu virtio-net, vhost-net poll-us, poll";
    if std::path::Path::new("/dev/vhost-net").exists() {
        best = best.max(measured(vhost));
    } else {
        let r = row(vhost);
        assert!(r["transactions_per_s"].is_null(), "{r}");
        assert!(
            r["note"].as_str().is_some_and(|n| n.contains("/dev/vhost-net")),
            "skipped without a reason: {r}"
        );
    }
    // QEMU on exitless vhost-user-net: the guest reaches the responder through the daemon's
    // switch and uplink; an exitless row, against QEMU's own backends.
    let switched = row("qemu virtio-net on exitless vhost-user-net (uplink), poll");
    assert_eq!(switched["vmm"], "qemu+exitless", "{switched}");
    assert_eq!(switched["path"], "vm-to-host", "{switched}");
    assert!(switched["transactions"].as_u64().is_some_and(|n| n > 0), "no transactions: {switched}");
    assert!(switched["command"].as_str().is_some_and(|c| c.contains("vhost-user,")), "{switched}");
    // And exitless's own VM, its NIC on the daemon (`--net vhost-user=`), through the uplink:
    // a row per daemon I/O mode.
    let own: Vec<_> = ["sidecore", "adaptive", "eventfd"]
        .map(|mode| row(&format!("exitless on exitless vhost-user-net (uplink), daemon {mode}")))
        .into();
    for own in &own {
        assert_eq!(
            (own["vmm"].as_str(), own["path"].as_str()),
            (Some("exitless"), Some("vm-to-host")),
            "{own}"
        );
        assert!(own["transactions"].as_u64().is_some_and(|n| n > 0), "no transactions: {own}");
        assert!(own["command"].as_str().is_some_and(|c| c.contains("--io-mode")), "{own}");
    }
    // Eight VMs at once on the daemon's one IOCore: each measured, their rates and fairness.
    let many = row("8 exitless VMs on one exitless vhost-user-net IOCore (uplink), daemon sidecore");
    assert_eq!((many["vms"].as_u64(), many["path"].as_str()), (Some(8), Some("vm-to-host")), "{many}");
    let rates: Vec<f64> = many["per_vm_transactions_per_s"]
        .as_array()
        .expect("per-VM rates")
        .iter()
        .map(|r| r.as_f64().unwrap())
        .collect();
    assert!(rates.len() == 8 && rates.iter().all(|&r| r > 0.0), "a VM made no transaction: {many}");
    let sum: f64 = rates.iter().sum();
    assert!((many["transactions_per_s"].as_f64().unwrap() - sum).abs() < 1e-6 * sum, "{many}");
    let jain = many["jain_fairness"].as_f64().expect("Jain's index");
    let expected = sum * sum / (8.0 * rates.iter().map(|r| r * r).sum::<f64>());
    assert!((jain - expected).abs() < 1e-9, "{jain} is not Jain's index of {rates:?}");
    for ours in [row("exitless"), switched].into_iter().chain(own) {
        let tps = ours["transactions_per_s"].as_f64().expect("exitless measured");
        let ratio = ours["ratio_to_qemu"].as_f64().expect("exitless's x QEMU");
        assert!((ratio - tps / best).abs() < 1e-9 * ratio.max(1.0), "{ratio} is not {tps} / {best}: {ours}");
    }
    // VM to VM: a client guest and a responder guest through the daemon's switch, and through
    // taps on a bridge; measured (the client fails, and the row says why, if echoes do not come
    // back), the switch's row against the bridge's.
    let vm_to_vm = |mode: &str, carried_by: &str| {
        let r = row(mode);
        assert_eq!(r["path"], "vm-to-vm", "{r}");
        assert!(r["note"].is_null(), "{mode}: {r}");
        assert!(r["command"].as_str().is_some_and(|c| c.contains(carried_by)), "{r}");
        r.clone()
    };
    let switch =
        vm_to_vm("two qemu on exitless vhost-user-net, client poll, responder interrupt", "vhost-user,");
    let bridge = vm_to_vm("two qemu on taps and a linux bridge, client poll, responder interrupt", "tap,");
    if let (Some(ours), Some(theirs)) =
        (switch["transactions_per_s"].as_f64(), bridge["transactions_per_s"].as_f64())
    {
        let ratio = switch["ratio_to_qemu"].as_f64().expect("the switch's x QEMU");
        assert!((ratio - ours / theirs).abs() < 1e-9 * ratio.max(1.0), "against the bridge: {switch}");
    }
    assert!(
        many["ratio_to_qemu"].is_null() && many["ratio_to_bare_metal"].is_null(),
        "a sum of 8 VMs: {many}"
    );
    // 64-byte frames from one NIC's ring to another's through one IOCore: frames counted, their
    // rate in Mpps, no transaction rate and so no ratio.
    let frames = row(
        "64 B frames NIC to NIC through one exitless vhost-user-net IOCore (sidecore), guests' rings driven by \
         a host thread",
    );
    assert_eq!(
        (frames["path"].as_str(), frames["size"].as_u64()),
        (Some("nic-to-nic"), Some(60)),
        "{frames}"
    );
    let (count, mpps) = (frames["transactions"].as_u64().unwrap(), frames["mpps"].as_f64().unwrap());
    assert!(count > 0 && mpps > 0.0, "no frame moved: {frames}");
    assert!(frames["transactions_per_s"].is_null() && frames["ratio_to_qemu"].is_null(), "{frames}");
    // Two exitless VMs, one sending 60-byte frames through the daemon, the other (on the IOCore's
    // CPU here) counting them: it counts some, as many as its share of a CPU lets it.
    let vm_frames =
        row("64 B frames exitless VM to exitless VM through one exitless vhost-user-net IOCore (sidecore)");
    assert_eq!(vm_frames["path"], "vm-to-vm", "{vm_frames}");
    let counted = vm_frames["transactions"].as_u64().unwrap();
    assert!(counted > 0 && vm_frames["mpps"].as_f64().is_some_and(|m| m > 0.0), "none counted: {vm_frames}");
    assert!(vm_frames["note"].as_str().is_some_and(|n| n.contains("the sending VM offered")), "{vm_frames}");
    assert!(frames["ratio_to_bare_metal"].is_null(), "no guest, no stack: {frames}");
    // The frame rate's peers: sockets over the veth pair between two namespaces, and two QEMU
    // guests (`frames-send`, `frames-count`) on taps and a bridge; and the same two QEMU guests
    // on the daemon. Each counted frames; the VM-to-VM rows carry their ratios to both peers.
    let host_frames = row("64 B frames bare metal (veth, UDP sockets: sendmmsg, busy-poll recvmmsg)");
    assert_eq!(
        (host_frames["vmm"].as_str(), host_frames["workload"].as_str()),
        (Some("host"), Some("frames"))
    );
    let host_mpps = host_frames["mpps"].as_f64().filter(|&m| m > 0.0).expect("bare-metal frames counted");
    let qemu_frames = |mode: &str, carried_by: &str| {
        let r = row(mode);
        assert_eq!((r["path"].as_str(), r["workload"].as_str()), (Some("vm-to-vm"), Some("frames")), "{r}");
        assert!(r["transactions"].as_u64().is_some_and(|n| n > 0), "none counted: {r}");
        assert!(r["note"].as_str().is_some_and(|n| n.contains("the sending VM offered")), "{r}");
        let command = r["command"].as_str().unwrap_or_default();
        assert!(command.contains("frames-send") && command.contains(carried_by), "{r}");
        r.clone()
    };
    let bridge_frames =
        qemu_frames("64 B frames two qemu on taps and a linux bridge, sender and counter poll", "tap,");
    let switch_frames = qemu_frames(
        "64 B frames two qemu on exitless vhost-user-net (sidecore), sender and counter poll",
        "vhost-user,",
    );
    let bridge_mpps = bridge_frames["mpps"].as_f64().expect("the bridge's frame rate");
    for ours in [&switch_frames, vm_frames] {
        let mpps = ours["mpps"].as_f64().expect("a frame rate");
        let against = |key: &str, peer: f64| {
            let ratio = ours[key].as_f64().unwrap_or_else(|| panic!("no {key}: {ours}"));
            assert!((ratio - mpps / peer).abs() < 1e-9 * ratio.max(1.0), "{key}: {ours}");
        };
        against("ratio_to_qemu", bridge_mpps);
        against("ratio_to_bare_metal", host_mpps);
    }
    for r in rows.iter().filter(|r| r["vmm"] != "exitless" && r["vmm"] != "qemu+exitless") {
        assert!(r["ratio_to_qemu"].is_null(), "x QEMU is for exitless's rows: {r}");
    }
}

/// `exitless udp-flood` and `exitless udp-count` over a namespace's loopback: what the counter
/// counted and what it knows lost add up to no more than was sent, and both say how many.
#[test]
fn udp_count_counts_what_udp_flood_sends() {
    let _shared = test_infra::alongside_others();
    let netns = test_infra::net::Netns::create();
    let counter = netns
        .command(env!("CARGO_BIN_EXE_exitless"))
        .args(["udp-count", "--bind", "127.0.0.1:9", "--idle-ms", "500"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("udp-count starts");
    test_infra::net::wait_for_udp(&netns.name, 9, "udp-count");
    let flood = netns
        .command(env!("CARGO_BIN_EXE_exitless"))
        .args(["udp-flood", "--to", "127.0.0.1:9", "--duration-ms", "200"])
        .output()
        .expect("udp-flood runs");
    assert_eq!(flood.status.code(), Some(0), "{}", stderr(&flood));
    let counted = counter.wait_with_output().expect("udp-count ends");
    assert_eq!(counted.status.code(), Some(0), "{}", stderr(&counted));
    let (sent, got) = (line_with(&flood, "probe", "udp-flood"), line_with(&counted, "probe", "udp-count"));
    let sent_frames = sent["ops"].as_u64().expect("frames sent");
    assert!(sent_frames > 0 && sent["size"] == 60, "{sent}");
    // Loopback drops what finds the counter's socket buffer full: the counter tells them by
    // the sequence numbers missing.
    let (ops, lost) = (got["ops"].as_u64().unwrap(), got["lost"].as_u64().unwrap());
    assert!(ops > 0 && ops + lost <= sent_frames, "sent {sent}, counted {got}");
    assert!(got["fps"].as_f64().is_some_and(|f| f > 0.0), "{got}");
}

/// `exitless udp-count` with nobody sending: it gives up after `--wait-ms`, saying so.
#[test]
fn udp_count_without_a_sender_says_none_came() {
    let _shared = test_infra::alongside_others();
    let netns = test_infra::net::Netns::create();
    let out = netns
        .command(env!("CARGO_BIN_EXE_exitless"))
        .args(["udp-count", "--bind", "127.0.0.1:9", "--wait-ms", "100"])
        .output()
        .expect("udp-count runs");
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    assert!(stderr(&out).contains("no datagram came in 100 ms"), "{}", stderr(&out));
}

#[test]
fn the_af_packet_client_refuses_what_it_cannot_send_on_one_line() {
    let _shared = test_infra::alongside_others();
    // Without its addresses: a usage error.
    let out = exitless(&["udp-rr", "--to", "10.0.0.1:7", "--packet", "lo"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let with = |extra: &[&str]| {
        let mut args = vec![
            "udp-rr",
            "--to",
            "10.0.0.1:7",
            "--from",
            "10.0.0.3:40000",
            "--from-mac",
            "02:00:00:00:00:03",
        ];
        args.extend(["--to-mac", "02:00:00:00:00:01"]);
        args.extend(extra);
        exitless(&args)
    };
    for (extra, says) in [
        (&["--packet", "exitless-missing0"][..], "no network interface"),
        (&["--packet", "lo", "--size", "1473"][..], "at most 1472"),
    ] {
        let out = with(extra);
        assert_eq!(out.status.code(), Some(125), "{extra:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{extra:?}: {}", stderr(&out));
        assert_eq!(stderr(&out).lines().count(), 1, "{extra:?}: {}", stderr(&out));
    }
}

/// exitless's own VM with its NIC on `exitless vhost-user-net --io-mode MODE`
/// (`--net vhost-user=`): `ops` UDP request-responses with the host's `exitless udp-echo` (a
/// namespace on the far end of the daemon's uplink, a veth pair), every payload checked. The
/// VM's output, and the daemon's standard error once SIGTERM ended it.
fn vm_on_the_nic_daemon(mode: &str, ops: u64) -> (std::process::Output, String) {
    use test_infra::background::Background;
    use test_infra::net::{Netns, Veth};
    let (netns, veth) = (Netns::create(), Veth::create());
    veth.peer_into(&netns, "10.94.0.1/24");
    let mut responder = netns
        .command(test_infra::exitless_bin().to_str().unwrap())
        .args(["udp-echo", "--bind", "0.0.0.0:7", "--cpu", "1"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nic.sock");
    let mac = "52:54:00:00:09:02";
    let nic = format!("socket={},mac={mac}", socket.display());
    let daemon_args =
        ["vhost-user-net", "--nic", &nic, "--uplink", &veth.ours, "--iocore-cpu", "1", "--io-mode", mode];
    let daemon = Background::start(dir.path(), "net", &daemon_args, &socket);
    wait_for_echo(&netns.name);
    let net = format!("vhost-user={},mac={mac}", socket.display());
    let cmdline = format!(
        "probe.workload=udp-rr probe.ip=10.94.0.2 probe.dst=10.94.0.1 probe.ops={ops} probe.size=200"
    );
    let line = "run --probe --io-mode exitless --pin-vcpu 0 --timeout 120 --stats --json";
    let out = exitless(&args(line, &["--net", &net, "--cmdline", &cmdline]));
    let _ = responder.kill();
    let _ = responder.wait();
    // SAFETY: kill(2) on our own child, not yet waited for.
    unsafe { libc::kill(daemon.pid() as i32, libc::SIGTERM) };
    let (status, _, daemon_log) = daemon.wait();
    assert_eq!(status, Some(0), "the daemon ends on SIGTERM: {daemon_log}");
    assert_eq!(out.status.code(), Some(0), "{}\n{}\ndaemon: {daemon_log}", stdout(&out), stderr(&out));
    let result = line_with(&out, "probe", "udp-rr");
    assert_eq!((result["ops"].as_u64(), result["mismatches"].as_u64()), (Some(ops), Some(0)), "{result}");
    let report = line_with(&out, "exitless", "run");
    let device = &report["devices"][0];
    assert_eq!(
        (device["device"].as_str(), device["activations"].as_u64()),
        (Some("vhost-user-net"), Some(1)),
        "{report}"
    );
    assert!(daemon_log.contains("on the switch as port 0"), "{daemon_log}");
    (out, daemon_log)
}

/// How often the daemon's IOCore slept, from the line it logs when it stops.
fn iocore_sleeps(daemon_log: &str) -> u64 {
    let line = daemon_log.lines().find(|l| l.contains("switch IOCore 0 took")).expect("the IOCore's line");
    let slept = line.split(" and slept ").nth(1).and_then(|rest| rest.split(' ').next());
    slept.and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("no count in {line}"))
}

/// Polled (sidecore), the daemon asks the VM for no kick: no exit per transaction on the I/O
/// path, and its IOCore never sleeps.
#[test]
fn an_exitless_vm_on_the_nic_daemon_reaches_the_host_with_no_exit_per_transaction() {
    let _one = test_infra::one_at_a_time();
    let (out, daemon_log) = vm_on_the_nic_daemon("sidecore", 10_000);
    let phase = test_infra::phase(&out, 0, 1);
    let caused_by_io = test_infra::io_path_exits(&phase["counters"]) / 10_000.0;
    assert!(caused_by_io < 0.01, "{caused_by_io} exits per transaction on the I/O path: {phase}");
    assert_eq!(iocore_sleeps(&daemon_log), 0, "{daemon_log}");
}

/// eventfd: the daemon's IOCore sleeps whenever a pass found nothing, and only the VM's kicks
/// (its transmit ring's) and the uplink's frames wake it: every transaction still completes.
#[test]
fn an_eventfd_nic_daemon_sleeps_between_frames_and_kicks_and_the_uplink_wake_it() {
    let _one = test_infra::one_at_a_time();
    let (_, daemon_log) = vm_on_the_nic_daemon("eventfd", 2_000);
    let sleeps = iocore_sleeps(&daemon_log);
    assert!(sleeps >= 2_000, "it slept {sleeps} times for 2000 transactions: {daemon_log}");
}

/// adaptive: the daemon's IOCore polls while frames come and sleeps once idle; every transaction
/// completes either way.
#[test]
fn an_adaptive_nic_daemon_serves_a_vm_and_sleeps_when_idle() {
    let _one = test_infra::one_at_a_time();
    let (_, daemon_log) = vm_on_the_nic_daemon("adaptive", 2_000);
    assert!(iocore_sleeps(&daemon_log) > 0, "{daemon_log}");
}
