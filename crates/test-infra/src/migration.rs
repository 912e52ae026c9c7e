//! A probe guest to migrate: its verify on a file disk, started as a live migration's source
//! (with a control API), and the checks of its result.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::api::http;
use crate::background::{Background, Ready};

/// Blocks the verify writes and reads back; the disk has one more, the verify's gate
/// (`probe.gate_block`): the guest reads back only once the test has opened it.
pub const BLOCKS: u64 = 16384;

/// What a verify run is.
#[derive(Clone, Copy)]
pub struct Verify {
    /// `probe.seed`.
    pub seed: u64,
    /// `probe.qd`: requests in flight.
    pub qd: u32,
    /// `probe.queues`: the disk's queues, all used.
    pub queues: u16,
}

/// The `--disk` spec of the source's disk in `dir`, for the source and the destination.
pub fn disk_spec(dir: &Path, verify: Verify) -> String {
    format!("path={},direct,queues={}", dir.join("disk").display(), verify.queues)
}

/// A 256 MiB VM running the probe's verify on a new file disk in `dir`, with a control API,
/// once it has begun writing; the VM, its API socket and its disk. The verify waits at its gate
/// after writing, whatever the disk's speed, until the test calls `common::open_gate`.
pub fn source(dir: &Path, mode: &str, verify: Verify) -> (Background, PathBuf, PathBuf) {
    source_in(None, dir, mode, verify, &[])
}

/// As `source`, in the network namespace `netns` if one is named, with `extra` arguments.
pub fn source_in(
    netns: Option<&str>,
    dir: &Path,
    mode: &str,
    verify: Verify,
    extra: &[&str],
) -> (Background, PathBuf, PathBuf) {
    let Verify { seed, qd, queues } = verify;
    let disk = crate::disk_file(dir, "disk", (BLOCKS + 1) * 4096);
    let disk_arg = disk_spec(dir, verify);
    let cmdline = format!(
        "{} probe.queues={queues} probe.gate_block={BLOCKS} probe.timeout_ms=60000",
        crate::verify_cmdline(BLOCKS, qd, seed)
    );
    let api = dir.join("source.api");
    let api_arg = api.to_str().unwrap();
    let mut args = vec![
        "run",
        "--probe",
        "--mem",
        "256M",
        "--disk",
        &disk_arg,
        "--io-mode",
        mode,
        "--cmdline",
        &cmdline,
        "--api-socket",
        api_arg,
        "--timeout",
        "170",
    ];
    args.extend(extra);
    let vm = Background::start_in(netns, dir, "source", &args, Ready::Exists(&api));
    vm.wait_for_first_write(&disk);
    (vm, api, disk)
}

/// `PUT /api/v1/vm.send-migration` to `url`: the status and body.
pub fn send_migration_to(api: &Path, url: &str) -> (u16, String) {
    let body = format!(r#"{{"destination_url": "{url}"}}"#);
    http(api, "PUT", "/api/v1/vm.send-migration", Some(&body))
}

/// The report of a migration that succeeded (its JSON body), checked: the pre-copy rounds and
/// their pages, both dirty logs used, the pause inside the downtime, a state sent.
pub fn assert_report(what: &str, body: &str) -> Value {
    let report: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{what}: {e}: {body}"));
    let rounds = report["rounds"].as_u64().unwrap();
    let per_round: Vec<u64> =
        report["pages_per_round"].as_array().unwrap().iter().map(|p| p.as_u64().unwrap()).collect();
    // Round 0 (all of memory) and at least one round of dirty pages; pre-copy stopped because
    // its last round sent at most 1024 pages, or after its 30 rounds.
    assert!(rounds >= 2, "{what}: no round of dirty pages: {report}");
    // Each pre-copy round, then the stop-and-copy.
    assert_eq!(u64::try_from(per_round.len()).unwrap(), rounds + 1, "{what}: {report}");
    assert!(per_round[0] > 0, "{what}: the first round sent nothing: {report}");
    let last = per_round[usize::try_from(rounds).unwrap() - 1];
    assert!(last <= 1024 || rounds == 30, "{what}: pre-copy stopped before it converged: {report}");
    // The guest reads the verify's gate block over and over while pre-copy runs: the device
    // writes each answer into guest memory through the host mapping, which only the devices'
    // own log sees. The guest's own writes are KVM's to log.
    assert!(report["device_dirty_pages"].as_u64().unwrap() > 0, "{what}: no device-dirtied page: {report}");
    assert!(report["kvm_dirty_pages"].as_u64().unwrap() > 0, "{what}: no KVM-dirtied page: {report}");
    let (downtime, pause) = (report["downtime_ms"].as_f64().unwrap(), report["pause_ms"].as_f64().unwrap());
    assert!(pause > 0.0 && pause <= downtime, "{what}: the pause is not part of the downtime: {report}");
    assert!(report["state_bytes"].as_u64().unwrap() > 0, "{what}: {report}");
    report
}

/// The hello a migration stream opens with, for a 64 MiB VM without disks.
pub fn hello() -> Vec<u8> {
    hello_with_disks(serde_json::json!([]))
}

/// The hello a migration stream opens with, for a 64 MiB VM with `disks` (its config's
/// `disks`).
pub fn hello_with_disks(disks: Value) -> Vec<u8> {
    let json = serde_json::json!({
        "config": {
            "mem_bytes": 64u64 << 20, "vcpus": 1, "hugepages": false, "cmdline": "",
            "io_mode": "eventfd", "idle_budget_us": 50, "disable_hlt_exits": false,
            "disable_pause_exits": false, "disks": disks
        },
        "memory_bytes": 64u64 << 20
    })
    .to_string();
    let mut bytes = b"EXLMIGR1".to_vec();
    bytes.extend_from_slice(&u32::try_from(json.len()).unwrap().to_le_bytes());
    bytes.extend_from_slice(json.as_bytes());
    bytes
}

/// Copy `from` to `to` until `limit` bytes have gone through, `from` ends or `to` fails: a
/// proxy's forwarding, cut short. How many bytes went through.
pub fn forward_up_to(from: &mut impl Read, to: &mut impl Write, limit: usize) -> usize {
    let mut forwarded = 0;
    let mut buffer = vec![0u8; 65536];
    while forwarded < limit {
        let n = match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => n.min(limit - forwarded),
        };
        if to.write_all(&buffer[..n]).is_err() {
            break;
        }
        forwarded += n;
    }
    forwarded
}
