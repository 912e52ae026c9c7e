//! Bad input gets one line on standard error and a non-zero status, never a panic.

mod common;

use common::{elf, exitless, stderr};

fn assert_one_line_error(args: &[&str], status: i32, needle: &str) {
    let out = exitless(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(status), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: one line expected, got: {err}");
    assert!(err.starts_with("exitless: "), "{err}");
    assert!(err.contains(needle), "{args:?}: expected `{needle}` in: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn missing_kernel_file() {
    assert_one_line_error(
        &["run", "--kernel", "/nonexistent/vmlinux"],
        125,
        "cannot open the kernel /nonexistent/vmlinux",
    );
}

#[test]
fn kernel_that_is_not_elf() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kernel.txt");
    std::fs::write(&path, "this is not a kernel\n").unwrap();
    assert_one_line_error(&["run", "--kernel", path.to_str().unwrap()], 125, "not an ELF file");
    std::fs::write(&path, "").unwrap();
    assert_one_line_error(&["run", "--kernel", path.to_str().unwrap()], 125, "not an ELF file");
}

#[test]
fn elf_without_a_pvh_note() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nopvh.elf");
    std::fs::write(&path, elf(&[(0x10_0000, 64, 64)], None)).unwrap();
    assert_one_line_error(&["run", "--kernel", path.to_str().unwrap()], 125, "no PVH entry point");
}

#[test]
fn truncated_elf() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("truncated.elf");
    let image = elf(&[(0x10_0000, 4096, 4096)], Some(0x10_0000));
    std::fs::write(&path, &image[..100]).unwrap();
    assert_one_line_error(&["run", "--kernel", path.to_str().unwrap()], 125, "malformed");
}

#[test]
fn memory_too_small_for_the_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.elf");
    // 64 MiB of memory image (mostly bss) into a 16 MiB VM.
    std::fs::write(&path, elf(&[(0x10_0000, 64, 64 << 20)], Some(0x10_0000))).unwrap();
    assert_one_line_error(
        &["run", "--kernel", path.to_str().unwrap(), "--mem", "16M"],
        125,
        "--mem too small",
    );
}

#[test]
fn memory_too_small_for_a_vm() {
    assert_one_line_error(&["run", "--probe", "--mem", "1M"], 125, "too small");
}

#[test]
fn unknown_option() {
    assert_one_line_error(&["run", "--probe", "--frobnicate"], 2, "--frobnicate");
}

#[test]
fn zero_vcpus() {
    assert_one_line_error(&["run", "--probe", "--vcpus", "0"], 2, "--vcpus");
}

#[test]
fn malformed_values() {
    assert_one_line_error(&["run", "--probe", "--mem", "lots"], 2, "--mem");
    assert_one_line_error(&["run", "--probe", "--timeout", "-1"], 2, "--timeout");
    assert_one_line_error(&["run", "--probe", "--disable-exits", "mwait"], 2, "--disable-exits");
    assert_one_line_error(&["run", "--probe", "--pin-vcpu", "4096"], 125, "cannot pin");
}

#[test]
fn kernel_and_probe_are_exclusive_and_one_is_required() {
    assert_one_line_error(&["run"], 2, "required");
    assert_one_line_error(&["run", "--probe", "--kernel", "/x"], 2, "cannot be used with");
}

#[test]
fn probe_export_to_an_unwritable_place() {
    assert_one_line_error(&["probe", "export", "/nonexistent/dir/probe.elf"], 125, "cannot write");
}
