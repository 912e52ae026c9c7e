//! The probe guest that exitless embeds boots unchanged in QEMU-KVM (`-M microvm`).

mod common;

use std::process::Command;

use common::{exitless, line_with, stderr};

fn qemu_probe(elf: &std::path::Path, cmdline: &str) -> std::process::Output {
    Command::new("qemu-system-x86_64")
        .args(["-M", "microvm", "-accel", "kvm", "-m", "128M", "-nographic", "-nodefaults", "-no-reboot"])
        .args(["-serial", "stdio", "-device", "isa-debug-exit,iobase=0xf4,iosize=1"])
        .arg("-kernel")
        .arg(elf)
        .args(["-append", cmdline])
        .output()
        .expect("qemu-system-x86_64 must be installed (the README's test command installs it)")
}

#[test]
fn the_same_hello_line_in_exitless_and_qemu() {
    let dir = tempfile::tempdir().unwrap();
    let elf = dir.path().join("probe.elf");
    let out = exitless(&["probe", "export", elf.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let qemu = qemu_probe(&elf, "probe.workload=hello");
    // QEMU exits with (V << 1) | 1 for a debug-exit write of V.
    assert_eq!(qemu.status.code(), Some(1), "stderr: {}", stderr(&qemu));
    let in_qemu = line_with(&qemu, "probe", "hello");

    let ours = exitless(&[
        "run",
        "--kernel",
        elf.to_str().unwrap(),
        "--cmdline",
        "probe.workload=hello",
        "--mem",
        "128M",
    ]);
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
    let dir = tempfile::tempdir().unwrap();
    let elf = dir.path().join("probe.elf");
    exitless(&["probe", "export", elf.to_str().unwrap()]);
    let qemu = qemu_probe(&elf, "probe.workload=exitcost probe.n=200 probe.tsc_khz=1000000");
    assert_eq!(qemu.status.code(), Some(1), "stderr: {}", stderr(&qemu));
    let lines = common::json_lines(&qemu);
    let op = |name: &str| lines.iter().find(|l| l["op"] == name).cloned().unwrap();
    assert!(op("mmio")["ns_per_op"].as_f64().unwrap() > 0.0);
    assert!(op("cpuid")["ns_per_op"].as_f64().unwrap() > 0.0);
    assert!(op("ioeventfd")["skipped"].is_string());
    assert!(op("pingpong")["skipped"].is_string());
    assert!(op("irq")["skipped"].is_string());
}
