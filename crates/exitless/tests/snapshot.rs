//! Pause, resume, snapshot and restore of `exitless run` on real KVM: the probe guest's verify
//! workload on a file disk is paused mid-run through the control API (Cloud Hypervisor's
//! verbs), snapshotted, its process killed, and restored in a new process, where the verify
//! goes on and passes; the disk file holds the pattern. A pause and resume alone keeps verify
//! passing. A corrupt or truncated snapshot is refused with a one-line error. The snapshot's
//! size and the pause, snapshot and restore times are printed, not asserted.

use std::path::{Path, PathBuf};

use serde_json::Value;
use test_infra::api::http;
use test_infra::background::{Background, RUN_LIMIT};
use test_infra::{
    assert_verify_passed, blk_result, disk_file, exitless_within, line_with, one_at_a_time, per_queue,
    stderr, threads_named, verify_cmdline,
};

/// Blocks the verify writes and reads back at depth 8. Every verify here waits at its gate
/// (`probe.gate_block`, the block after these) until the test has done what it does mid-run,
/// so the sizes only set how much I/O is under way meanwhile, not whether the run is.
const BLOCKS: u64 = 16384;
/// The verify of the tests that run one request at a time (pause/resume rounds, and the
/// snapshot the corruption cases are made from).
const PAUSE_BLOCKS: u64 = 4096;

/// A running `exitless run` with its API socket at `dir/NAME.sock`.
struct Vm {
    process: Background,
    api: PathBuf,
}

impl Vm {
    fn start(dir: &Path, name: &str, args: &[&str]) -> Vm {
        let api = dir.join(format!("{name}.sock"));
        let args = [args, &["--api-socket", api.to_str().unwrap()]].concat();
        Vm { process: Background::start(dir, name, &args, &api), api }
    }

    fn put(&self, verb: &str, body: Option<&str>) -> (u16, String) {
        http(&self.api, "PUT", &format!("/api/v1/vm.{verb}"), body)
    }

    /// Wait for the process to end; its status code, standard output and error.
    fn wait(self) -> (Option<i32>, String, String) {
        self.process.wait()
    }

    fn kill(self) -> (String, String) {
        self.process.kill()
    }
}

/// What a verify run is: its seed, queue depth, blocks, and the disk's queues (all used).
#[derive(Clone, Copy)]
struct Verify {
    seed: u64,
    qd: u32,
    blocks: u64,
    queues: u16,
}

/// A VM running the probe's verify on a new file disk in `dir`, once it has begun writing; the
/// disk's path. The verify reads back only after `test_infra::open_gate(disk, blocks)`.
fn start_verify(dir: &Path, mode: &str, verify: Verify) -> (Vm, PathBuf) {
    let Verify { seed, qd, blocks, queues } = verify;
    // `blocks` 4 KiB blocks and the verify's gate block after them.
    let disk = disk_file(dir, "disk", (blocks + 1) * 4096);
    let disk_arg = format!("path={},direct,queues={queues}", disk.display());
    // Its requests in turn on `queues` queues, its gate in block `blocks`. A long timeout: a
    // pause freezes the guest's requests, not its clock, and the gate stays shut until the test
    // is done with the VM.
    let cmdline = format!(
        "{} probe.queues={queues} probe.gate_block={blocks} probe.timeout_ms=60000",
        verify_cmdline(blocks, qd, seed)
    );
    let args =
        ["run", "--probe", "--mem", "64M", "--disk", &disk_arg, "--io-mode", mode, "--cmdline", &cmdline];
    let vm = Vm::start(dir, "vm", &args);
    vm.process.wait_for_first_write(&disk);
    (vm, disk)
}

/// Pause `vm` and snapshot it into `snap` through the API.
fn pause_and_snapshot(vm: &Vm, snap: &Path) {
    assert_eq!(vm.put("pause", None).0, 204, "pause");
    let body = format!(r#"{{"destination_url": "file://{}"}}"#, snap.display());
    let (status, answer) = vm.put("snapshot", Some(&body));
    assert_eq!(status, 204, "snapshot: {answer}");
}

/// The milliseconds a log line `... <what> ... in X ms` gives, for the report.
fn logged_ms(stderr: &str, what: &str) -> String {
    stderr
        .lines()
        .find(|l| l.contains(what))
        .and_then(|l| l.rsplit(" in ").next())
        .map_or("?".into(), |t| t.trim().to_string())
}

/// What a run paused, snapshotted, killed and restored left: the restored run's verify result
/// and the snapshot's state.
struct Restored {
    result: Value,
    state: Value,
}

/// Start `verify` in `mode`, pause and snapshot it mid-run, kill it, restore the snapshot in a
/// new process and wait for it: the verify must pass and the disk hold its pattern. Prints the
/// snapshot's size and the logged times.
fn pause_snapshot_kill_restore(mode: &str, verify: Verify) -> Restored {
    let dir = tempfile::tempdir().unwrap();
    let (first, disk) = start_verify(dir.path(), mode, verify);
    let snap = dir.path().join("snap");
    pause_and_snapshot(&first, &snap);
    let (stdout, first_err) = first.kill();
    assert!(blk_result(&stdout).is_none(), "{mode}: the verify passed its gate before the pause: {stdout}");

    // The restore names the VM's disk itself, and gives it the test device it had.
    let disk_arg = format!("path={},direct,queues={}", disk.display(), verify.queues);
    let restored = Vm::start(
        dir.path(),
        "restored",
        &[
            "run",
            "--restore",
            &format!("source_url=file://{}", snap.display()),
            "--disk",
            &disk_arg,
            "--testdev",
        ],
    );
    test_infra::open_gate(&disk, verify.blocks);
    let (code, stdout, restored_err) = restored.wait();
    assert_eq!(code, Some(0), "{mode}: the restored guest's status; stderr: {restored_err}");
    assert_verify_passed(&stdout, &restored_err, mode, verify.blocks);
    test_infra::assert_holds_pattern_and_open_gate(&disk, verify.seed, verify.blocks);

    let state_bytes = std::fs::metadata(snap.join("state.json")).unwrap().len();
    let size = std::fs::metadata(snap.join("memory")).unwrap().len() + state_bytes;
    println!(
        "{mode}, {} queues: snapshot {size} bytes (state.json {state_bytes} bytes); paused in {}, snapshot written in {}, restored in {}",
        verify.queues,
        logged_ms(&first_err, "paused"),
        logged_ms(&first_err, "snapshot written"),
        logged_ms(&restored_err, "restored from"),
    );
    Restored {
        result: blk_result(&stdout).unwrap(),
        state: serde_json::from_slice(&std::fs::read(snap.join("state.json")).unwrap()).unwrap(),
    }
}

#[test]
fn a_vm_paused_mid_verify_snapshotted_killed_and_restored_finishes_its_verify() {
    let _one = one_at_a_time();
    for (i, mode) in ["trap", "eventfd", "exitless"].into_iter().enumerate() {
        let verify = Verify { seed: 2200 + i as u64, qd: 8, blocks: BLOCKS, queues: 1 };
        pause_snapshot_kill_restore(mode, verify);
    }
}

/// The same on a `queues=2` disk with the probe's requests in turn on both queues: the pause
/// takes back and drains both workers, the snapshot records where each queue stands, and the
/// restore restarts both there.
#[test]
fn a_two_queue_disk_paused_mid_verify_snapshotted_killed_and_restored_finishes_its_verify() {
    let _one = one_at_a_time();
    for (i, mode) in ["trap", "eventfd", "exitless"].into_iter().enumerate() {
        let verify = Verify { seed: 2250 + i as u64, qd: 8, blocks: BLOCKS, queues: 2 };
        let Restored { result, state } = pause_snapshot_kill_restore(mode, verify);
        assert_eq!(result["queues"], 2, "{mode}: {result}");
        assert!(per_queue(&result, 2).iter().all(|&c| c > 0), "{mode}: a queue served nothing: {result}");
        let queues = state["devices"][0]["transport"]["queues"].as_array().expect("saved queues");
        assert_eq!(queues.len(), 2, "{mode}: {queues:?}");
        assert!(queues.iter().all(|q| q["ready"] == true), "{mode}: {queues:?}");
        println!(
            "{mode}: next avail indices at the snapshot {:?}",
            queues.iter().map(|q| &q["next_avail"]).collect::<Vec<_>>()
        );
    }
}

#[test]
fn pause_and_resume_keep_verify_passing_and_wrong_states_are_refused() {
    let _one = one_at_a_time();
    for (i, mode) in ["eventfd", "sidecore"].into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let (seed, blocks) = (2300 + i as u64, PAUSE_BLOCKS);
        let (vm, disk) = start_verify(dir.path(), mode, Verify { seed, qd: 1, blocks, queues: 1 });
        let (status, body) = vm.put("resume", None);
        assert_eq!(status, 409, "{mode}: resume of a running VM: {body}");
        let (status, body) = vm.put("snapshot", Some(r#"{"destination_url": "file:///nonexistent"}"#));
        assert_eq!(status, 409, "{mode}: snapshot of a running VM: {body}");
        for round in 0..5 {
            assert_eq!(vm.put("pause", None).0, 204, "{mode}: pause {round}");
            let (status, body) = vm.put("pause", None);
            assert_eq!(status, 409, "{mode}: a second pause: {body}");
            assert_eq!(vm.put("resume", None).0, 204, "{mode}: resume {round}");
        }
        test_infra::open_gate(&disk, blocks);
        let (code, stdout, err) = vm.wait();
        assert_eq!(code, Some(0), "{mode}: stderr: {err}");
        assert_verify_passed(&stdout, &err, mode, blocks);
        test_infra::assert_holds_pattern_and_open_gate(&disk, seed, blocks);
        println!(
            "{mode}: pauses took {:?}",
            err.lines().filter(|l| l.contains("paused in")).collect::<Vec<_>>()
        );
    }
}

/// `exitless run --restore` of `snap` with `disk` (the VM's, as `--disk` names it), which must
/// be refused with one line on standard error.
fn assert_refused(snap: &Path, disk: &str, what: &str, expect: &str) {
    assert_restore_refused(snap, &["--disk", disk], what, expect);
}

/// `exitless run --restore` of `snap` with `disk_args`, refused with one line saying `expect`.
fn assert_restore_refused(snap: &Path, disk_args: &[&str], what: &str, expect: &str) {
    let source = format!("source_url=file://{}", snap.display());
    let args = [&["run", "--restore", &source, "--testdev", "--timeout", "30"], disk_args].concat();
    let out = exitless_within(RUN_LIMIT, &args);
    let err = stderr(&out);
    assert!(!out.status.success(), "{what}: restored; stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{what}: not one line: {err}");
    assert!(!err.contains("panicked"), "{what}: {err}");
    assert!(err.contains(expect), "{what}: {err:?} does not say {expect:?}");
    println!("{what}: {}", err.trim_end());
}

/// A change to a snapshot's state.
type Edit = Box<dyn FnOnce(&mut Value)>;

/// Copy the snapshot in `from` to `to`, its state changed by `edit`.
fn edited(from: &Path, to: &Path, edit: impl FnOnce(&mut Value)) {
    std::fs::create_dir_all(to).unwrap();
    std::fs::copy(from.join("memory"), to.join("memory")).unwrap();
    let mut state: Value = serde_json::from_slice(&std::fs::read(from.join("state.json")).unwrap()).unwrap();
    edit(&mut state);
    std::fs::write(to.join("state.json"), serde_json::to_vec(&state).unwrap()).unwrap();
}

#[test]
fn a_corrupt_or_truncated_snapshot_is_refused_with_a_one_line_error() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let (vm, disk) =
        start_verify(dir.path(), "eventfd", Verify { seed: 2400, qd: 1, blocks: PAUSE_BLOCKS, queues: 1 });
    let snap = dir.path().join("snap");
    pause_and_snapshot(&vm, &snap);
    // A second snapshot over the first replaces it whole.
    let body = format!(r#"{{"destination_url": "file://{}"}}"#, snap.display());
    assert_eq!(vm.put("snapshot", Some(&body)).0, 204, "a snapshot over another");
    vm.kill();
    let bad = |name: &str| dir.path().join(name);
    let disk_arg = format!("path={},direct", disk.display());
    let assert_refused =
        |snap: &Path, what: &str, expect: &str| assert_refused(snap, &disk_arg, what, expect);

    // Guest memory one page short.
    edited(&snap, &bad("short-memory"), |_| {});
    let memory = std::fs::OpenOptions::new().write(true).open(bad("short-memory").join("memory")).unwrap();
    memory.set_len(memory.metadata().unwrap().len() - 4096).unwrap();
    assert_refused(&bad("short-memory"), "a truncated memory file", "bytes");

    // The state file cut in half, and one that is not JSON at all.
    std::fs::create_dir_all(bad("half-state")).unwrap();
    std::fs::copy(snap.join("memory"), bad("half-state").join("memory")).unwrap();
    let state = std::fs::read(snap.join("state.json")).unwrap();
    std::fs::write(bad("half-state").join("state.json"), &state[..state.len() / 2]).unwrap();
    assert_refused(&bad("half-state"), "a truncated state file", "not an exitless snapshot");
    std::fs::write(bad("half-state").join("state.json"), b"\x00\xffgarbage").unwrap();
    assert_refused(&bad("half-state"), "a state file of garbage", "not an exitless snapshot");

    let cases: [(&str, &str, Edit); 7] = [
        ("another version", "format version 99", Box::new(|s: &mut Value| s["version"] = 99.into())),
        (
            "a vCPU count that disagrees",
            "vCPU states",
            Box::new(|s: &mut Value| s["config"]["vcpus"] = 2.into()),
        ),
        (
            "a queue outside guest memory",
            "queue 0",
            Box::new(|s: &mut Value| s["devices"][0]["transport"]["queues"][0]["desc"] = (1u64 << 40).into()),
        ),
        (
            "a used index that disagrees with guest memory",
            "used ring",
            Box::new(|s: &mut Value| {
                let next = s["devices"][0]["transport"]["queues"][0]["next_avail"].as_u64().unwrap();
                s["devices"][0]["transport"]["queues"][0]["next_avail"] = ((next + 1) % 65536).into();
            }),
        ),
        (
            "registers one byte short",
            "hex digits",
            Box::new(|s: &mut Value| {
                let regs = s["vcpus"][0]["regs"].as_str().unwrap().to_string();
                s["vcpus"][0]["regs"] = regs[2..].into();
            }),
        ),
        (
            "a memory size that disagrees",
            "bytes",
            Box::new(|s: &mut Value| s["memory_bytes"] = (s["memory_bytes"].as_u64().unwrap() * 2).into()),
        ),
        (
            "a device missing",
            "device states",
            Box::new(|s: &mut Value| s["devices"] = Value::Array(Vec::new())),
        ),
    ];
    for (i, (what, expect, edit)) in cases.into_iter().enumerate() {
        let to = bad(&format!("case{i}"));
        edited(&snap, &to, edit);
        assert_refused(&to, what, expect);
    }
    // The restore opens the disks its operator names, never the snapshot's paths (it used to
    // reopen them, read-write, whatever they were): none named, one of another size, one of
    // another kind, and a VM with the test device restored without it, are refused.
    assert_restore_refused(&snap, &[], "no disk named", "were named with --disk");
    let small = bad("small-disk");
    std::fs::File::create(&small).unwrap().set_len(4096).unwrap();
    let small_arg = format!("path={}", small.display());
    assert_restore_refused(&snap, &["--disk", &small_arg], "a disk of another size", "bytes");
    assert_restore_refused(
        &snap,
        &["--disk", "null=64M"],
        "a disk of another kind",
        "name it with --disk path=FILE",
    );
    let source = format!("source_url=file://{}", snap.display());
    let out =
        exitless_within(RUN_LIMIT, &["run", "--restore", &source, "--disk", &disk_arg, "--timeout", "30"]);
    assert!(!out.status.success() && stderr(&out).contains("give --testdev"), "{}", stderr(&out));
    // And the snapshot itself, untouched, restores (the cases above were refused for their flaw)
    // and finishes its verify: PAUSE_BLOCKS at depth 1, not BLOCKS, whose 32768 requests a loaded
    // two-CPU host did not finish within the timeout.
    test_infra::open_gate(&disk, PAUSE_BLOCKS);
    let source = format!("source_url=file://{}", snap.display());
    let args = ["run", "--restore", &source, "--disk", &disk_arg, "--testdev", "--timeout", "170"];
    let out = exitless_within(RUN_LIMIT, &args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let result = line_with(&out, "probe", "blk");
    assert_eq!(result["mismatches"], 0, "{result}");
}

/// The test device's ping-pong responder spins on a host core and writes guest memory through
/// the host mapping, which no dirty log sees: a pause ends it (the pause answers once it has
/// ended, so nothing changes the paused VM's memory behind a snapshot), and while the VM is
/// paused it stays ended. It used to spin on through the pause.
#[test]
fn a_pause_ends_the_test_devices_responder() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let cmdline = "probe.workload=exitcost probe.ops=pingpong probe.pingpong_n=2000000000";
    let vm = Vm::start(dir.path(), "vm", &["run", "--probe", "--timeout", "170", "--cmdline", cmdline]);
    let pid = vm.process.pid();
    // The thread's name, as /proc shows it (15 bytes).
    let responder = "testdev-pingpon";
    let started = std::time::Instant::now();
    while threads_named(pid, responder) == 0 {
        assert!(started.elapsed() < RUN_LIMIT, "no responder started: {}", vm.process.stderr());
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(vm.put("pause", None).0, 204, "pause");
    assert_eq!(threads_named(pid, responder), 0, "the responder runs on in the paused VM");
    let body = format!(r#"{{"destination_url": "file://{}"}}"#, dir.path().join("snap").display());
    assert_eq!(vm.put("snapshot", Some(&body)).0, 204, "snapshot");
    assert_eq!(threads_named(pid, responder), 0, "a responder started in the paused VM");
    vm.kill();
}
