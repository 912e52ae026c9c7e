//! The virtio-blk device end to end: the probe guest's ring-3 driver against exitless's
//! transport, IOCore and backends on real KVM, in every I/O mode.

use std::time::Duration;

use serde_json::Value;
use test_infra::disks::DISK_KINDS;
use test_infra::{args, exitless, exitless_within, json_lines, line_with, one_at_a_time, per_queue, stderr};

const MODES: [&str; 6] = ["trap", "eventfd", "pv-eoi", "sidecore", "exitless", "adaptive"];

const DISK_BYTES: u64 = 8 << 20;
/// Far beyond what a run takes; a run that takes longer is stuck, and fails the test.
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// A zeroed disk of DISK_BYTES in `dir` (/dev/shm or /tmp), removed when dropped.
fn temp_disk(dir: &str) -> tempfile::TempPath {
    let file = tempfile::Builder::new().prefix("exitless-blk-test").tempfile_in(dir).unwrap();
    file.as_file().set_len(DISK_BYTES).unwrap();
    file.into_temp_path()
}

/// A RAM disk loaded from a new file in /dev/shm: the file, and the disk's spec with `options`
/// (each led by a comma) after its path.
fn ram_disk(options: &str) -> (tempfile::TempPath, String) {
    let file = temp_disk("/dev/shm");
    let spec = format!("ram,path={}{options}", file.display());
    (file, spec)
}

/// `exitless run --probe ... --stats --json`, the guest stopped after `guest_timeout` seconds and
/// the run killed if it outlives RUN_LIMIT.
fn run_probe(mode: &str, disk: &str, cmdline: &str, guest_timeout: &str) -> std::process::Output {
    let more = ["--disk", disk, "--io-mode", mode, "--cmdline", cmdline, "--timeout", guest_timeout];
    exitless_within(RUN_LIMIT, &args("run --probe --stats --json", &more))
}

fn run_blk(mode: &str, disk: &str, cmdline: &str) -> std::process::Output {
    let out = run_probe(mode, disk, cmdline, "120");
    assert_eq!(out.status.code(), Some(0), "{mode} {disk}: {}\n{}", test_infra::stdout(&out), stderr(&out));
    out
}

/// `--disk` for the file at `path` with `queues` queues: as a RAM disk ("ram") or a file read
/// and written with O_DIRECT (anything else).
fn disk_spec(backend: &str, path: &std::path::Path, queues: u16) -> String {
    match backend {
        "ram" => format!("ram,path={},queues={queues}", path.display()),
        _ => format!("path={},direct,queues={queues}", path.display()),
    }
}

/// `probe.rw=verify` over 300 blocks at depth 8 on a disk of `queues` queues, all used, in
/// `mode`, on a RAM disk and on a file (direct): verify passes, FLUSH is answered and the file
/// holds what the guest wrote. The runs' output and result line, by backend.
fn verify_on_both_backends(mode: &str, seed: u64, queues: u16) -> Vec<(std::process::Output, Value)> {
    let cmdline = format!(
        "probe.workload=blk probe.rw=verify probe.ops=300 probe.qd=8 probe.queues={queues} probe.seed={seed}"
    );
    let mut runs = Vec::new();
    for (backend, path) in [("ram", temp_disk("/dev/shm")), ("file", temp_disk("/tmp"))] {
        let out = run_blk(mode, &disk_spec(backend, &path, queues), &cmdline);
        let result = line_with(&out, "probe", "blk");
        assert_eq!(result["mismatches"], 0, "{mode} {backend}: {result}");
        assert_eq!(result["errors"], 0, "{mode} {backend}: {result}");
        assert_eq!(result["flush"], true, "{mode} {backend}: FLUSH offered and answered");
        assert_eq!(result["id"], "exitless-disk0");
        test_infra::assert_holds_only_pattern(&path, seed, 300);
        runs.push((out, result));
    }
    runs
}

#[test]
fn verify_passes_in_every_mode_on_both_backends_and_the_file_holds_what_the_guest_wrote() {
    let _one = one_at_a_time();
    for (i, mode) in MODES.iter().enumerate() {
        verify_on_both_backends(mode, 100 + i as u64, 1);
    }
}

/// WRITE_ZEROES and DISCARD from the probe's ring-3 driver (`probe.rw=zeroes`) in every mode on
/// both backends: the guest reads zeros back where it zeroed and its pattern elsewhere, and the
/// file holds the same (a discarded block too: both backends zero what they discard, the RAM
/// disk by writing zeros, the file by punching a hole).
#[test]
fn write_zeroes_and_discard_pass_in_every_mode_on_both_backends_and_reach_the_file() {
    let _one = one_at_a_time();
    const BLOCKS: u64 = 300;
    for (i, mode) in MODES.iter().enumerate() {
        let seed = 300 + i as u64;
        let cmdline =
            format!("probe.workload=blk probe.rw=zeroes probe.ops={BLOCKS} probe.qd=8 probe.seed={seed}");
        for (backend, path) in [("ram", temp_disk("/dev/shm")), ("file", temp_disk("/tmp"))] {
            let out = run_blk(mode, &disk_spec(backend, &path, 1), &cmdline);
            let result = line_with(&out, "probe", "blk");
            let bytes = std::fs::read(&*path).unwrap();
            test_infra::assert_zeroes_run(&format!("{mode} {backend}"), &result, &bytes, seed, BLOCKS);
        }
    }
}

/// The guest switches the VMM's disk to write through (CONFIG_WCE, `writeback` 0): its writes
/// to a buffered file then leave no dirty page behind, each durable when it completes; written
/// back (1, the default) the same writes stay dirty in the page cache until a FLUSH.
#[test]
fn a_disk_switched_to_write_through_leaves_no_dirty_pages() {
    let _one = one_at_a_time();
    for mode in ["trap", "exitless"] {
        for writeback in [0, 1] {
            let path = temp_disk("/tmp");
            let cmdline = format!(
                "probe.workload=blk probe.rw=write probe.ops=300 probe.warmup=0 probe.qd=8 probe.writeback={writeback}"
            );
            let out = run_blk(mode, &format!("path={}", path.display()), &cmdline);
            let result = line_with(&out, "probe", "blk");
            assert_eq!(result["errors"], 0, "{mode} writeback={writeback}: {result}");
            assert_eq!(result["writeback"], writeback, "{mode}: the mode the device reports");
            let dirty = test_infra::dirty_pages(&path);
            if writeback == 0 {
                assert_eq!(dirty, 0, "{mode}: written through, yet {dirty} pages are dirty");
            } else {
                assert!(dirty >= 100, "{mode}: written back, only {dirty} dirty pages (the control)");
            }
        }
    }
}

/// `serial=` reaches the guest's GET_ID; without it the disk is `exitless-diskN`.
#[test]
fn a_disks_serial_number_is_its_get_id_answer() {
    let _one = one_at_a_time();
    let cmdline = "probe.workload=blk probe.rw=verify probe.ops=8 probe.qd=1";
    let (_file, disk) = ram_disk(",serial=probe disk #7");
    let out = run_blk("exitless", &disk, cmdline);
    assert_eq!(line_with(&out, "probe", "blk")["id"], "probe disk #7");
    let (_file, disk) = ram_disk(",serial=123456789012345678901");
    let out = run_probe("exitless", &disk, cmdline, "10");
    assert_ne!(out.status.code(), Some(0), "a 21-byte serial was accepted");
    assert!(stderr(&out).contains("1 to 20 characters"), "{}", stderr(&out));
}

/// A real block device path: a loop device doing direct I/O over an ext4 file. A polling IOCore
/// used to starve the loop device's worker on its core (5-17% of fio's rate); data must land
/// in the backing file either way.
#[test]
fn verify_passes_on_a_loop_device_with_direct_io_in_the_polling_modes() {
    let _one = one_at_a_time();
    let file = temp_disk("/tmp");
    let device = test_infra::LoopDevice::attach(&file);
    for (i, mode) in ["exitless", "adaptive"].iter().enumerate() {
        let seed = 200 + i as u64;
        let cmdline =
            format!("probe.workload=blk probe.rw=verify probe.ops=300 probe.qd=8 probe.seed={seed}");
        let out = run_blk(mode, &format!("path={},direct", device.path.display()), &cmdline);
        let result = line_with(&out, "probe", "blk");
        assert_eq!(result["mismatches"], 0, "{mode}: {result}");
        assert_eq!(result["errors"], 0, "{mode}: {result}");
        assert_eq!(result["flush"], true, "{mode}: FLUSH offered and answered");
        test_infra::assert_holds_only_pattern(&file, seed, 300);
    }
}

/// Every interrupt a device raises reaches the guest. Regression: raised through an irqfd, KVM
/// injected them from a kernel worker on the raising thread's core, which the vCPU (trap) or a
/// spinning IOCore (sidecore) held, so they came late and merged: 977 injections for 4000
/// interrupts in trap mode, 3728 in eventfd mode.
#[test]
fn every_interrupt_a_device_raises_is_injected() {
    let _one = one_at_a_time();
    let (_file, disk) = ram_disk("");
    for mode in ["trap", "eventfd", "sidecore"] {
        let out = run_blk(mode, &disk, "probe.workload=blk probe.rw=randread probe.qd=1 probe.ops=2000");
        let stats = json_lines(&out).into_iter().find(|l| l["exitless"] == "run").expect("stats line");
        let raised = stats["devices"][0]["interrupts"].as_f64().unwrap();
        let injected = stats["vcpus"][0]["counters"]["irq_injections"].as_f64().unwrap_or(0.0);
        assert!(raised >= 2000.0, "{mode}: one interrupt per request was asked for: {stats}");
        assert!(injected >= 0.98 * raised, "{mode}: {injected} interrupts injected of {raised} raised");
    }
}

/// Exits per request in the measured phase on a RAM disk of `queues` queues, all used (requests
/// go to them in turn, so each completes its share): `exitless` mode makes none, `trap` mode
/// several. Trap mode at queue depth 1: the notify exit, the interrupt's EOI and the driver's
/// two interrupt-status accesses. At depth 32 one notification and one interrupt serve a batch
/// of requests (EVENT_IDX), so the batch shares those exits.
fn check_exits_per_request(queues: u16) {
    let disk = temp_disk("/dev/shm");
    let disk = disk_spec("ram", &disk, queues);
    type Check = fn(f64) -> bool;
    let expectations: [(u32, &str, Check); 4] = [
        (1, "exitless", |e| e < 0.01),
        (1, "trap", |e| e >= 2.0),
        (32, "exitless", |e| e < 0.01),
        (32, "trap", |e| e >= 2.0 / 32.0),
    ];
    for (qd, mode, check) in expectations {
        let cmdline = format!(
            "probe.workload=blk probe.rw=randread probe.qd={qd} probe.ops=10000 probe.queues={queues}"
        );
        let out = run_blk(mode, &disk, &cmdline);
        let result = line_with(&out, "probe", "blk");
        let ops = result["ops"].as_u64().unwrap();
        assert_eq!(ops, 10_000);
        let share = ops / u64::from(queues);
        assert!(per_queue(&result, queues.into()).iter().all(|&c| c == share), "{mode}: {result}");
        let exits = test_infra::io_path_exits(&test_infra::phase(&out, 0, 1)["counters"]) / ops as f64;
        assert!(check(exits), "{mode} at queue depth {qd} on {queues} queues: {exits} exits per request");
    }
}

#[test]
fn exitless_mode_makes_no_exit_per_request_and_trap_mode_several() {
    let _one = one_at_a_time();
    check_exits_per_request(1);
}

/// The same on two queues: the IOCore polls both rings, so still no exit per request.
#[test]
fn exitless_mode_makes_no_exit_per_request_on_two_queues() {
    let _one = one_at_a_time();
    check_exits_per_request(2);
}

/// A `queues=2` disk and `probe.queues=2` (VIRTIO_BLK_F_MQ, requests in turn on both queues) in
/// every mode on both backends: verify passes, the file holds what the guest wrote, both queues
/// answered requests, and the VMM's per-queue counts (`queue_requests`) cover the guest's and add
/// up to its total (GET_ID, after the guest's count, is in them).
#[test]
fn two_queues_pass_verify_in_every_mode_on_both_backends_and_both_serve() {
    let _one = one_at_a_time();
    for (i, mode) in MODES.iter().enumerate() {
        for (out, result) in verify_on_both_backends(mode, 200 + i as u64, 2) {
            assert_eq!(result["queues"], 2, "{mode}: {result}");
            let counts = per_queue(&result, 2);
            assert!(counts.iter().all(|&c| c > 0), "{mode}: a queue served nothing: {result}");
            // The writes, the FLUSH and the reads (GET_ID comes after the count).
            let ops = result["ops"].as_u64().unwrap();
            assert_eq!(counts.iter().sum::<u64>(), ops + 1, "{mode}: {result}");
            let stats = json_lines(&out).into_iter().find(|l| l["exitless"] == "run").expect("stats line");
            let device = &stats["devices"][0];
            let served: Vec<u64> =
                device["queue_requests"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()).collect();
            assert_eq!(served.len(), 2, "{mode}: {device}");
            assert!(served.iter().zip(&counts).all(|(vmm, guest)| vmm >= guest), "{served:?} {counts:?}");
            assert_eq!(served.iter().sum::<u64>(), device["completed"].as_u64().unwrap(), "{device}");
        }
    }
}

/// A probe that asks for more queues than the disk offers stops with an error that says so
/// and how many there are; so does one asking for two of a single-queue disk (no MQ).
#[test]
fn asking_for_more_queues_than_the_disk_offers_is_a_clear_error() {
    let _one = one_at_a_time();
    let disk = temp_disk("/dev/shm");
    for (queues, asked) in [(2, 3), (1, 2)] {
        let spec = disk_spec("ram", &disk, queues);
        let out = run_probe("exitless", &spec, &format!("probe.workload=blk probe.queues={asked}"), "60");
        assert_ne!(out.status.code(), Some(0), "{}", test_infra::stdout(&out));
        let result = line_with(&out, "probe", "blk");
        let error = result["error"].as_str().unwrap_or_default();
        assert!(error.contains("fewer queues"), "{queues} offered, {asked} asked: {result}");
        assert_eq!(result["detail"], queues, "{result}");
    }
}

/// A verify's gate (`probe.gate_block`) holds it between writing and reading back: a gate the
/// host never opens fails the run with a line that says so, once every block is written; an
/// open one lets it pass; a gate among the blocks it checks, or past the disk, is a bad command
/// line.
#[test]
fn a_verify_waits_at_its_gate_until_the_host_opens_it() {
    let _one = one_at_a_time();
    let blocks = DISK_BYTES / 4096;
    let verify = |seed: u64, gate: u64| {
        format!(
            "probe.workload=blk probe.rw=verify probe.ops=300 probe.qd=8 probe.seed={seed} probe.gate_block={gate} probe.timeout_ms=500"
        )
    };
    let (disk, spec) = ram_disk("");

    let out = run_probe("eventfd", &spec, &verify(9, 300), "60");
    assert_eq!(out.status.code(), Some(1), "{}", test_infra::stdout(&out));
    let result = line_with(&out, "probe", "blk");
    assert_eq!(result["gate_block"], 300, "{result}");
    assert!(result["error"].as_str().unwrap_or_default().contains("gate block stayed shut"), "{result}");
    test_infra::assert_holds_pattern(&disk, 9, 300);

    test_infra::open_gate(&disk, blocks - 1);
    let result = line_with(&run_blk("eventfd", &spec, &verify(10, blocks - 1)), "probe", "blk");
    assert_eq!((result["mismatches"].as_u64(), result["errors"].as_u64()), (Some(0), Some(0)), "{result}");
    assert_eq!(result["blocks"], 300, "{result}");

    for gate in [299, blocks] {
        let out = run_probe("eventfd", &spec, &verify(11, gate), "60");
        assert_eq!(out.status.code(), Some(2), "gate {gate}: {}", test_infra::stdout(&out));
        assert_eq!(line_with(&out, "probe", "error")["parameter"], "probe.gate_block");
    }
}

#[test]
fn adaptive_sleeps_when_the_guest_is_idle_and_polls_under_load() {
    let _one = one_at_a_time();
    let (_file, disk) = ram_disk("");
    let cmdline = "probe.workload=blk probe.rw=randread probe.qd=4 probe.ops=20000 probe.idle_ms=1200";
    let out = run_blk("adaptive", &disk, cmdline);
    let result = line_with(&out, "probe", "blk");
    assert_eq!(result["post_idle_errors"], 0, "{result}");
    assert_eq!(result["post_idle_ops"], 20000, "served after the idle phase: {result}");
    let load = test_infra::phase(&out, 0, 1);
    let exits = test_infra::io_path_exits(&load["counters"]) / 20000.0;
    assert!(exits < 0.05, "{exits} exits per request under load: {load}");
    let idle = test_infra::phase(&out, 2, 3);
    let share = idle["iocore_cpu_s"].as_f64().unwrap() / idle["wall_s"].as_f64().unwrap();
    assert!(idle["wall_s"].as_f64().unwrap() >= 1.0, "{idle}");
    assert!(share < 0.01, "the IOCore used {:.1}% of a core while the guest was idle", share * 100.0);
}

/// What the device must do with each blk-hostile case: (case, outcome, used length, a
/// configuration-change interrupt). A chain it can parse gets its status byte (IOERR, UNSUPP)
/// and a used length of 1; a chain with no writable status byte comes back unanswered (length
/// 0); a queue the driver broke gets DEVICE_NEEDS_RESET, announced by a configuration-change
/// interrupt, and nothing in the used ring. A descriptor loop is such a queue: the device walks
/// a chain to its end for the status byte (a request of more than seg_max segments is answered
/// IOERR there), and a loop has none. (It once stopped after seg_max + 2 descriptors and
/// completed the loop unanswered.)
const BLK_HOSTILE_EXPECTED: [(&str, &str, Option<u64>, bool); 10] = [
    ("addr_outside_ram", "ioerr", Some(1), false),
    ("addr_len_wraps", "ioerr", Some(1), false),
    ("descriptor_loop", "needs_reset", None, true),
    ("short_header", "ioerr", Some(1), false),
    ("status_read_only", "no_status", Some(0), false),
    ("write_read_only_disk", "ioerr", Some(1), false),
    ("sector_past_end", "ioerr", Some(1), false),
    ("avail_index_jump", "needs_reset", None, true),
    ("unknown_type", "unsupp", Some(1), false),
    // The same request in flight twice would break the backend's rule that no two requests
    // share bytes, and its in-flight accounting: the first is served once (a 4 KiB read), then
    // the device needs a reset.
    ("duplicate_head", "needs_reset", Some(4097), true),
];

/// What differs from `BLK_HOSTILE_EXPECTED` in one run (`write_read_only_disk` runs only on a
/// read-only disk); then valid requests must all have succeeded.
fn blk_hostile_mismatches(what: &str, out: &std::process::Output, read_only: bool) -> Vec<String> {
    let lines = json_lines(out);
    let case = |name: &str| lines.iter().find(|l| l["probe"] == "blk-hostile" && l["case"] == name).cloned();
    let mut wrong = Vec::new();
    for (name, outcome, used_len, config_interrupt) in BLK_HOSTILE_EXPECTED {
        let Some(line) = case(name) else {
            wrong.push(format!(
                "{what}: {name}: no line; stdout: {}; stderr: {}",
                test_infra::stdout(out),
                stderr(out)
            ));
            continue;
        };
        if name == "write_read_only_disk" && !read_only {
            if !line["skipped"].is_string() {
                wrong.push(format!("{what}: {name}: expected skipped on a writable disk, got {line}"));
            }
            continue;
        }
        let expected = (outcome, used_len, config_interrupt);
        let seen = (
            line["outcome"].as_str().unwrap_or("?"),
            line["used_len"].as_u64(),
            line["config_interrupt"] == true,
        );
        if seen != expected {
            wrong.push(format!("{what}: {name}: expected {expected:?}, got {line}"));
        }
    }
    match case("valid_after") {
        Some(after) if after["outcome"] == "ok" && after["ops"] == 100 && after["errors"] == 0 => {}
        after => wrong.push(format!("{what}: valid requests after the cases: {after:?}")),
    }
    if out.status.code() != Some(0) {
        wrong.push(format!("{what}: status {:?}: {}", out.status.code(), stderr(out)));
    }
    wrong
}

fn run_hostile(mode: &str, disk: &str) -> std::process::Output {
    run_probe(mode, disk, "probe.workload=blk-hostile", "90")
}

/// The host's side of the broken queues: each NEEDS_RESET logged with its reason and counted
/// in `--stats --json`.
fn needs_reset_mismatches(mode: &str, out: &std::process::Output) -> Vec<String> {
    let expected = BLK_HOSTILE_EXPECTED.iter().filter(|case| case.1 == "needs_reset").count();
    let stats = test_infra::json_lines(out).into_iter().find(|line| line["exitless"] == "run");
    let device = stats.as_ref().map(|stats| stats["devices"][0].clone()).unwrap_or_default();
    let mut wrong = Vec::new();
    if device["device"] != "virtio-blk" || device["needs_reset"].as_u64() != Some(expected as u64) {
        wrong.push(format!("{mode}: expected {expected} resets counted, got {device}"));
    }
    let logged = stderr(out).lines().filter(|line| line.contains("the device needs a reset")).count();
    let duplicate = stderr(out).contains("was made available again while the device still held it");
    if logged != expected || !duplicate {
        wrong.push(format!(
            "{mode}: {logged} resets logged (expected {expected}, one for the duplicate head): {}",
            stderr(out)
        ));
    }
    wrong
}

/// Every case on every backend kind: a RAM disk finishes a request inside `submit`, an io_uring
/// disk once the kernel has it. Regression: on the io_uring disks the pass that met the
/// duplicate head ended before handing the first copy to the kernel, so it never finished and
/// the driver's reset waited for it for ever (the run outlived its time limit).
#[test]
fn hostile_driver_gets_the_expected_outcome_per_case_and_the_device_keeps_serving() {
    let _one = one_at_a_time();
    let mut wrong = Vec::new();
    for kind in DISK_KINDS {
        for mode in ["trap", "eventfd", "exitless", "adaptive"] {
            let disk = kind.make(DISK_BYTES);
            let what = format!("{} {mode}", kind.name());
            let out = run_hostile(mode, &disk.spec);
            wrong.extend(blk_hostile_mismatches(&what, &out, false));
            wrong.extend(needs_reset_mismatches(&what, &out));
        }
    }
    for kind in DISK_KINDS {
        let disk = kind.make(DISK_BYTES);
        let out = run_hostile("exitless", &format!("{},readonly", disk.spec));
        wrong.extend(blk_hostile_mismatches(&format!("{} exitless, read-only", kind.name()), &out, true));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Runs the probe's blk workload on a RAM disk; returns its result line.
fn run_blk_within(mode: &str, cmdline: &str) -> (std::process::Output, Value) {
    let (_file, disk) = ram_disk("");
    let out = run_probe(mode, &disk, cmdline, "90");
    let result = json_lines(&out)
        .into_iter()
        .find(|l| l["probe"] == "blk" || l["probe"] == "error")
        .unwrap_or_else(|| {
            panic!(
                "{mode} {cmdline}: no result line; stdout: {}; stderr: {}",
                test_infra::stdout(&out),
                stderr(&out)
            )
        });
    (out, result)
}

/// A queue as deep as the ring holds: with VIRTIO_F_INDIRECT_DESC each request takes one ring
/// descriptor (its header, data and status in an indirect table), so a 256-entry queue holds 256
/// requests, and the device hands far more than 64 completions to the driver in one go; none may
/// be lost.
#[test]
fn requests_at_the_deepest_queue_the_ring_holds_all_complete() {
    let _one = one_at_a_time();
    const QUEUE_SIZE: u64 = 256;
    for mode in ["trap", "eventfd", "exitless"] {
        let cmdline = format!(
            "probe.workload=blk probe.rw=randread probe.qd={QUEUE_SIZE} probe.ops=5000 probe.warmup=0"
        );
        let (out, result) = run_blk_within(mode, &cmdline);
        assert_eq!((&result["ops"], &result["errors"]), (&5000.into(), &0.into()), "{mode}: {result}");
        assert_eq!((&result["qd"], &result["indirect"]), (&QUEUE_SIZE.into(), &true.into()), "{result}");
        assert_eq!(out.status.code(), Some(0), "{mode}: {}", stderr(&out));
    }
    // Beyond the queue size is a bad parameter.
    let (out, result) = run_blk_within("exitless", "probe.workload=blk probe.qd=257");
    assert_eq!(out.status.code(), Some(2));
    assert_eq!((&result["error"], &result["parameter"]), (&"bad parameter".into(), &"probe.qd".into()));
}

/// Without indirect tables (`probe.indirect=off`, as with a device that does not offer
/// VIRTIO_F_INDIRECT_DESC) a 4K request takes three ring descriptors: 85 fit a 256-entry queue
/// and all complete; one more does not fit, and the probe says how deep it can go.
#[test]
fn direct_chains_fill_the_ring_to_a_third_of_its_size() {
    let _one = one_at_a_time();
    const DEEPEST_4K: u64 = 256 / 3;
    let cmdline = format!(
        "probe.workload=blk probe.indirect=off probe.rw=randread probe.qd={DEEPEST_4K} probe.ops=5000 probe.warmup=0"
    );
    let (out, result) = run_blk_within("exitless", &cmdline);
    assert_eq!((&result["ops"], &result["errors"]), (&5000.into(), &0.into()), "{result}");
    assert_eq!((&result["qd"], &result["indirect"]), (&DEEPEST_4K.into(), &false.into()), "{result}");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let cmdline = format!("probe.workload=blk probe.indirect=off probe.qd={}", DEEPEST_4K + 1);
    let (out, result) = run_blk_within("exitless", &cmdline);
    assert_eq!(out.status.code(), Some(1), "{result}");
    assert!(result["error"].as_str().unwrap().contains("too few descriptors"), "{result}");
    assert_eq!(result["detail"], DEEPEST_4K, "{result}");
}

/// 100 FLUSH requests published at once (two descriptors each, so they fit one 256-entry
/// queue): every one completes with OK status.
#[test]
fn a_batch_of_100_flushes_all_complete() {
    let _one = one_at_a_time();
    for mode in ["trap", "eventfd", "exitless", "adaptive"] {
        let (out, result) = run_blk_within(
            mode,
            "probe.workload=blk probe.rw=flush probe.qd=100 probe.ops=100 probe.warmup=0",
        );
        assert_eq!((&result["ops"], &result["errors"]), (&100.into(), &0.into()), "{mode}: {result}");
        assert_eq!(out.status.code(), Some(0), "{mode}: {}", stderr(&out));
    }
}

#[test]
fn writes_to_a_read_only_disk_fail_and_leave_it_unchanged() {
    let _one = one_at_a_time();
    let (path, disk) = ram_disk(",readonly");
    let line = "run --probe --timeout 60";
    let out = exitless(&args(
        line,
        &["--disk", &disk, "--cmdline", "probe.workload=blk probe.rw=randwrite probe.ops=10"],
    ));
    assert_eq!(out.status.code(), Some(1), "the probe reports failed writes: {}", stderr(&out));
    let result = line_with(&out, "probe", "blk");
    assert_eq!(result["read_only"], true);
    assert!(result["errors"].as_u64().unwrap() > 0);
    assert!(std::fs::read(&path).unwrap().iter().all(|&b| b == 0));
}

#[test]
fn bad_disk_options_are_one_line_errors() {
    let cases = [
        ("ram=7", 2),
        ("size=1G", 2),
        ("ram=1M,queues=0", 2),
        ("ram=1M,queues=17", 2),
        ("ram=1M,queues=two", 2),
        ("path=/nonexistent/disk.img", 125),
        ("ram,path=/nonexistent", 125),
    ];
    test_infra::assert_each_refused("run --probe --disk", &cases, "disk");
}

/// Trap mode serves a notification on the vCPU thread and waits there at most a second for the
/// disk. A request the disk holds longer must still complete: the guest, waiting for it, sends
/// no further notification. Here the 11th write of a verify is held by a FUSE disk for two
/// seconds, well past that wait; the guest must see it complete and the verify pass (before the
/// VMM reaped late completions, it waited until its own timeout).
#[test]
fn a_trap_mode_request_the_disk_holds_past_the_exit_completes() {
    const BLOCKS: u64 = 64;
    const HELD_BLOCK: u64 = 10;
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let file = test_infra::disk_file(dir.path(), "backing", BLOCKS * 4096);
    let held = test_infra::held_disk::HeldDisk::start(dir.path(), &file, HELD_BLOCK * 4096);
    held.hold();
    let disk = format!("path={},direct", held.disk().display());
    let cmdline = format!(
        "probe.workload=blk probe.rw=verify probe.ops={BLOCKS} probe.qd=1 probe.seed=77 probe.timeout_ms=60000"
    );
    let out = std::thread::scope(|scope| {
        scope.spawn(|| {
            let started = std::time::Instant::now();
            while held.held().is_none() {
                assert!(started.elapsed() < RUN_LIMIT, "the disk was never asked for block {HELD_BLOCK}");
                std::thread::sleep(Duration::from_millis(10));
            }
            println!("held: {:?}", held.held());
            std::thread::sleep(Duration::from_secs(2));
            held.release(false);
        });
        run_blk("trap", &disk, &cmdline)
    });
    let result = line_with(&out, "probe", "blk");
    assert_eq!(result["mismatches"], 0, "{result}");
    assert_eq!(result["errors"], 0, "{result}");
    assert_eq!(result["blocks"], BLOCKS, "{result}");
    test_infra::assert_holds_only_pattern(&file, 77, BLOCKS);
}
