//! The probe guest that exitless embeds boots unchanged in QEMU-KVM (`-M microvm`).

use serde_json::Value;

use test_infra::qemu::Qemu;
use test_infra::{args, exitless, line_with, stderr};

/// The probe at `elf` in QEMU with `cmdline`: its output, once it has exited OK (QEMU exits with
/// (V << 1) | 1 for a debug-exit write of V).
fn qemu_probe(elf: &std::path::Path, cmdline: &str) -> std::process::Output {
    let qemu = Qemu::probe(elf, "128M", cmdline).output();
    assert_eq!(qemu.status.code(), Some(1), "stderr: {}", stderr(&qemu));
    qemu
}

#[test]
fn the_same_hello_line_in_exitless_and_qemu() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let elf = test_infra::probe_elf(dir.path());

    let qemu = qemu_probe(&elf, "probe.workload=hello");
    let in_qemu = line_with(&qemu, "probe", "hello");

    let line = "run --cmdline probe.workload=hello --mem 128M";
    let ours = exitless(&args(line, &["--kernel", elf.to_str().unwrap()]));
    assert_eq!(ours.status.code(), Some(0), "stderr: {}", stderr(&ours));
    let in_exitless = line_with(&ours, "probe", "hello");

    for field in ["probe", "cpl", "cpu_vendor", "hypervisor"] {
        assert_eq!(in_qemu[field], in_exitless[field], "{field}");
    }
    assert_eq!(in_qemu["cmdline"], "probe.workload=hello");
    assert!(in_qemu["ram_bytes"].as_u64().unwrap() > 100 << 20);
}

#[test]
fn exitcost_runs_in_qemu_and_skips_what_needs_our_test_device() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let elf = test_infra::probe_elf(dir.path());
    let qemu = qemu_probe(&elf, "probe.workload=exitcost probe.n=200 probe.tsc_khz=1000000");
    let lines = test_infra::json_lines(&qemu);
    let op = |name: &str| lines.iter().find(|l| l["op"] == name).cloned().unwrap();
    assert!(op("mmio")["ns_per_op"].as_f64().unwrap() > 0.0);
    assert!(op("cpuid")["ns_per_op"].as_f64().unwrap() > 0.0);
    assert!(op("ioeventfd")["skipped"].is_string());
    assert!(op("pingpong")["skipped"].is_string());
    assert!(op("irq")["skipped"].is_string());
}

/// The probe's block workload in QEMU on its own virtio-blk (virtio-mmio), `indirect_desc` on or
/// off; returns the exit status QEMU reports and the probe's result or error line.
fn qemu_blk_probe(elf: &std::path::Path, indirect_desc: &str, queue_depth: u32) -> (Option<i32>, Value) {
    let disk = tempfile::NamedTempFile::new_in("/dev/shm").unwrap();
    disk.as_file().set_len(8 << 20).unwrap();
    let cmdline = format!("probe.workload=blk probe.qd={queue_depth} probe.ops=2000 probe.warmup=0");
    let out = Qemu::probe(elf, "128M", &cmdline)
        .drive_with(disk.path(), &format!(",indirect_desc={indirect_desc}"))
        .output();
    let result = test_infra::json_lines(&out)
        .into_iter()
        .find(|l| l["probe"] == "blk" || l["probe"] == "error")
        .unwrap_or_else(|| panic!("no result line: {}; {}", test_infra::stdout(&out), stderr(&out)));
    (out.status.code(), result)
}

/// A device that offers VIRTIO_F_INDIRECT_DESC gets one indirect table per request, so the probe
/// reaches the queue size; one that does not (QEMU's `indirect_desc=off`) gets direct chains of
/// three descriptors per 4K request: 85 in flight complete, 86 are refused with the deepest that
/// fits.
#[test]
fn the_probe_uses_indirect_tables_only_when_the_device_offers_them() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let elf = test_infra::probe_elf(dir.path());
    // QEMU exits with (V << 1) | 1 for a debug-exit write of V: 1 is OK, 3 is FAILED.
    for (indirect_desc, queue_depth, uses_indirect) in [("on", 256, true), ("off", 85, false)] {
        let (code, result) = qemu_blk_probe(&elf, indirect_desc, queue_depth);
        assert_eq!(code, Some(1), "indirect_desc={indirect_desc}: {result}");
        assert_eq!((&result["ops"], &result["errors"]), (&2000.into(), &0.into()), "{result}");
        assert_eq!((&result["qd"], &result["indirect"]), (&queue_depth.into(), &uses_indirect.into()));
    }
    let (code, result) = qemu_blk_probe(&elf, "off", 86);
    assert_eq!(code, Some(3), "{result}");
    assert!(result["error"].as_str().unwrap().contains("too few descriptors"), "{result}");
    assert_eq!(result["detail"], 85, "{result}");
}
