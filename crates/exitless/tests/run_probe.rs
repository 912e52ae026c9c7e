//! `exitless run` boots the probe guest on real KVM: output, exit statuses, exit accounting.

use serde_json::Value;
use test_infra::{args, exitless, json_lines, line_with, stderr};

#[test]
fn hello_boots_and_reports_what_it_found() {
    let _shared = test_infra::alongside_others();
    let out = exitless(&["run", "--probe", "--mem", "128M"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let hello = line_with(&out, "probe", "hello");
    assert_eq!(hello["cpl"], 3, "the workload runs in ring 3");
    assert_eq!(hello["hypervisor"], "KVMKVMKVM");
    assert!(hello["kvm_features"].as_u64().unwrap() != 0, "the KVM paravirtual leaf reaches the guest");
    // Conventional RAM below the EBDA (0x9fc00) plus everything from 1 MiB: the PVH memory map.
    assert_eq!(hello["ram_bytes"], 0x9fc00 + (128 << 20) - (1 << 20));
    let cmdline = hello["cmdline"].as_str().unwrap();
    assert!(cmdline.contains("probe.workload=hello"), "{cmdline}");
    assert!(cmdline.contains("exitless.testdev=0xfe000000"), "{cmdline}");
    assert!(hello["tsc_khz"].as_u64().unwrap() > 0);
}

/// The test device (and its spinning ping-pong responder) is in a VM only when asked for:
/// `--probe` has it; the same probe booted with `--kernel` has it with `--testdev` only. It used
/// to be in every VM.
#[test]
fn the_test_device_is_there_only_when_asked_for() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let elf = test_infra::probe_elf(dir.path());
    for (extra, has) in [(None, false), (Some("--testdev"), true)] {
        let mut args = vec!["run", "--kernel", elf.to_str().unwrap(), "--cmdline", "probe.workload=hello"];
        args.extend(extra);
        let out = exitless(&args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        let hello = line_with(&out, "probe", "hello");
        let cmdline = hello["cmdline"].as_str().unwrap();
        assert_eq!(cmdline.contains("exitless.testdev="), has, "{args:?}: {cmdline}");
    }
}

#[test]
fn user_cmdline_reaches_the_guest_and_exit_status_passes_through() {
    let _shared = test_infra::alongside_others();
    let out = exitless(&["run", "--probe", "--cmdline", "probe.workload=nonsense"]);
    assert_eq!(out.status.code(), Some(probe_status::BAD_CMDLINE as i32));
    let error = line_with(&out, "probe", "error");
    assert_eq!(error["workload"], "nonsense");
}

/// User-space MMIO exits are counted exactly: N writes give N exits plus the probe's two phase
/// marks (also MMIO writes). Serial output is port I/O and does not count here.
#[test]
fn mmio_exits_match_the_writes_the_guest_made() {
    let _shared = test_infra::alongside_others();
    const SLACK: u64 = 8;
    let mut counted = Vec::new();
    for n in [2000u64, 5000] {
        let cmdline = format!("probe.workload=exitcost probe.ops=mmio probe.n={n}");
        let out = exitless(&["run", "--probe", "--cmdline", &cmdline, "--stats", "--json"]);
        assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
        let summary = line_with(&out, "exitless", "run");
        let counters = &summary["vcpus"][0]["counters"];
        let mmio_exits = counters["mmio_exits"].as_u64().unwrap();
        assert!((n..=n + SLACK).contains(&mmio_exits), "{n} writes gave {mmio_exits} mmio_exits");
        assert!(counters["exits"].as_u64().unwrap() >= mmio_exits);
        counted.push(mmio_exits);
    }
    assert_eq!(counted[1] - counted[0], 3000, "exit counts are deterministic");
}

#[test]
fn exitcost_measures_every_kind_of_exit() {
    let _shared = test_infra::alongside_others();
    let line = "run --probe --stats --json";
    let out =
        exitless(&args(line, &["--cmdline", "probe.workload=exitcost probe.n=500 probe.pingpong_n=5000"]));
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let lines = json_lines(&out);
    for op in ["mmio", "ioeventfd", "cpuid", "pingpong", "irq"] {
        let line = lines.iter().find(|l| l["probe"] == "exitcost" && l["op"] == op).expect(op);
        assert!(line["ns_per_op"].as_f64().unwrap() > 0.0, "{op}: {line}");
    }
    // Every interrupt the host raised reached the guest (500 measured plus 1000 warm-up).
    let summary = line_with(&out, "exitless", "run");
    assert!(summary["vcpus"][0]["counters"]["irq_injections"].as_u64().unwrap() >= 1500, "{summary}");
}

#[test]
fn stats_text_goes_to_stderr() {
    let _shared = test_infra::alongside_others();
    let out = exitless(&["run", "--probe", "--stats"]);
    assert_eq!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(err.contains("vcpu0: exits="), "{err}");
    assert!(err.contains("mmio_exits="), "{err}");
}

#[test]
fn a_triple_fault_ends_the_run_with_a_message() {
    let _shared = test_infra::alongside_others();
    let out = exitless(&["run", "--probe", "--cmdline", "probe.workload=triplefault", "--timeout", "30"]);
    assert_eq!(out.status.code(), Some(123), "stderr: {}", stderr(&out));
    assert!(stderr(&out).contains("triple-faulted"), "{}", stderr(&out));
}

#[test]
fn a_guest_that_never_exits_is_stopped_at_the_timeout() {
    let _shared = test_infra::alongside_others();
    let out =
        exitless(&["run", "--probe", "--cmdline", "probe.workload=spin", "--vcpus", "2", "--timeout", "1"]);
    assert_eq!(out.status.code(), Some(124));
    assert!(stderr(&out).contains("timeout of 1.0 s"), "{}", stderr(&out));
}

#[test]
fn an_exception_in_the_guest_is_reported_by_the_probe() {
    let _shared = test_infra::alongside_others();
    let out = exitless(&["run", "--probe", "--cmdline", "probe.workload=exception"]);
    assert_eq!(out.status.code(), Some(probe_status::CRASH as i32));
    let report: Value = line_with(&out, "probe", "exception");
    assert_eq!(report["vector"], 6, "#UD");
    assert_eq!(report["cs"], "0x1b", "raised in ring 3");
}

#[test]
fn pinned_vcpus_with_hlt_and_pause_exits_disabled() {
    let _shared = test_infra::alongside_others();
    let out =
        exitless(&["run", "--probe", "--vcpus", "2", "--pin-vcpu", "0,1", "--disable-exits", "hlt,pause"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    line_with(&out, "probe", "hello");
}

/// Huge pages: the run works on them, and a run that needs more than the host has reserved
/// says how to get them.
#[test]
fn hugepages_work_and_too_few_say_what_is_missing() {
    let _shared = test_infra::alongside_others();
    // The probe's static buffers (256 request slots) need more than 32 MiB: 48 MiB is 24 pages.
    test_infra::huge_pages::require_free(24);
    let out = exitless(&["run", "--probe", "--mem", "48M", "--hugepages"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    line_with(&out, "probe", "hello");
    let too_many = format!("{}M", 2 * test_infra::huge_pages::more_than_reserved());
    let out = exitless(&["run", "--probe", "--mem", &too_many, "--hugepages"]);
    assert_eq!(out.status.code(), Some(125), "{too_many}: {}", stderr(&out));
    assert!(stderr(&out).contains("nr_hugepages"), "{}", stderr(&out));
}

mod probe_status {
    pub const BAD_CMDLINE: u8 = 2;
    pub const CRASH: u8 = 3;
}
