//! Linux's chain shapes from the probe guest (`probe.workload=blk-chains`), so the VMM's own
//! device and the daemon behind its vhost-user frontend are held to the reference the Linux
//! compatibility suite sets (linux_compat.rs): 128 data segments in an indirect table of 130 on a
//! queue of 128 (`probe.queue_size=128`, as QEMU gives Linux on vhost-user-blk), 512-byte
//! segments, 4 KiB pages out of order, the same page 128 times, each written and read back.
//! QEMU's own virtio-blk, the reference, serves them all; so must exitless in every I/O mode, on
//! a RAM disk and a file. One data segment more than `seg_max` is IOERR here (QEMU, whose
//! `seg_max` is 254, serves 255), never a broken queue.

use std::process::Output;
use std::time::Duration;

use serde_json::Value;
use test_infra::daemon::Daemon;
use test_infra::qemu::Qemu;
use test_infra::{exitless_within, json_lines, one_at_a_time, stderr, stdout};

const CMDLINE: &str = "probe.workload=blk-chains probe.queue_size=128";
const RUN_LIMIT: Duration = Duration::from_secs(120);
const CASES: [&str; 3] = ["sectors_512", "pages_4k_out_of_order", "same_page_128_times"];

/// The probe's lines for `what`: every case within `seg_max` written, read back and verified;
/// one segment more than `seg_max` answered as one of `too_many`.
fn assert_served(what: &str, out: &Output, too_many: &[&str]) {
    let lines = json_lines(out);
    let all = || format!("{}\n{}", stdout(out), stderr(out));
    let case = |name: &str| -> Value {
        lines
            .iter()
            .find(|l| l["case"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{what}: no {name}: {}", all()))
    };
    let settings =
        lines.iter().find(|l| l["queue_size"].is_u64()).unwrap_or_else(|| panic!("{what}: {}", all()));
    assert_eq!(settings["queue_size"], 128, "{what}: {settings}");
    for name in CASES {
        let line = case(name);
        assert_eq!(line["descriptors"], 130, "{what}: {line}");
        let result = (&line["outcome"], &line["read_outcome"], &line["verified"]);
        assert_eq!(result, (&"ok".into(), &"ok".into(), &true.into()), "{what}: {line}");
    }
    let line = case("too_many_segments");
    assert!(too_many.iter().any(|&o| line["outcome"] == o), "{what}: expected {too_many:?}: {line}");
}

#[test]
fn qemus_virtio_blk_serves_linuxs_chain_shapes_on_a_queue_of_128() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let elf = test_infra::probe_elf(dir.path());
    let disk = tempfile::NamedTempFile::new_in("/dev/shm").unwrap();
    disk.as_file().set_len(8 << 20).unwrap();
    let out = Qemu::probe(&elf, "128M", CMDLINE).drive(disk.path()).output();
    // QEMU exits with (V << 1) | 1 for the probe's debug-exit write of V: 1 is OK.
    assert_eq!(out.status.code(), Some(1), "{}\n{}", stdout(&out), stderr(&out));
    assert_served("QEMU virtio-blk", &out, &["ok", "ioerr"]);
}

/// `exitless run --probe` with the workload; it must pass (exit 0).
fn run_probe(mode: &str, disk: &str) -> Output {
    let args = ["run", "--probe", "--disk", disk, "--io-mode", mode, "--cmdline", CMDLINE, "--timeout", "60"];
    let out = exitless_within(RUN_LIMIT, &args);
    assert_eq!(out.status.code(), Some(0), "{mode} {disk}: {}\n{}", stdout(&out), stderr(&out));
    out
}

#[test]
fn the_vmms_own_device_serves_linuxs_chain_shapes_in_every_io_mode() {
    let _one = one_at_a_time();
    for mode in ["trap", "eventfd", "pv-eoi", "sidecore", "exitless", "adaptive"] {
        let out = run_probe(mode, "ram=16M");
        assert_served(&format!("{mode}, RAM disk"), &out, &["ioerr"]);
    }
    let file = tempfile::Builder::new().prefix("exitless-chains").tempfile_in("/var/tmp").unwrap();
    file.as_file().set_len(16 << 20).unwrap();
    for options in ["", ",direct"] {
        let disk = format!("path={}{options}", file.path().display());
        let out = run_probe("exitless", &disk);
        assert_served(&disk, &out, &["ioerr"]);
    }
}

#[test]
fn the_daemon_serves_linuxs_chain_shapes_through_the_vmms_vhost_user_frontend() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    for mode in ["sidecore", "adaptive", "eventfd"] {
        let socket = dir.path().join(format!("{mode}.sock"));
        let log = dir.path().join(format!("{mode}.log"));
        let args = ["--socket", socket.to_str().unwrap(), "--disk", "ram=16M", "--io-mode", mode];
        let daemon = Daemon::start(&args, &[socket.as_path()], &log);
        let out = run_probe("exitless", &format!("vhost-user={}", socket.display()));
        assert_served(&format!("daemon in {mode} mode"), &out, &["ioerr"]);
        let log = daemon.stop();
        assert!(!log.contains("needs a reset"), "{mode}: {log}");
    }
}
