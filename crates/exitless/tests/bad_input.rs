//! Bad input gets one line on standard error and a non-zero status, never a panic.

use std::path::Path;

use test_infra::{args, assert_one_line_error, elf, stderr};

/// `exitless LINE` ends with status `code` and one line on standard error that says `says`.
fn refused(line: &str, code: i32, says: &str) {
    let _shared = test_infra::alongside_others();
    assert_one_line_error(&args(line, &[]), code, says);
}

/// `exitless run --kernel FILE MORE`, FILE holding `image`, ends with status 125 and one line on
/// standard error that says `says`.
fn kernel_refused(image: &[u8], more: &[&str], says: &str) {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kernel");
    std::fs::write(&path, image).unwrap();
    assert_one_line_error(&args("run --kernel", &[&[path.to_str().unwrap()], more].concat()), 125, says);
}

test_infra::tests! {
    missing_kernel_file =>
        refused("run --kernel /nonexistent/vmlinux", 125, "cannot open the kernel /nonexistent/vmlinux");
    kernel_that_is_not_elf => {
        kernel_refused(b"this is not a kernel\n", &[], "not an ELF file");
        kernel_refused(b"", &[], "not an ELF file")
    };
    elf_without_a_pvh_note => kernel_refused(&elf(&[(0x10_0000, 64, 64)], None), &[], "no PVH entry point");
    truncated_elf =>
        kernel_refused(&elf(&[(0x10_0000, 4096, 4096)], Some(0x10_0000))[..100], &[], "malformed");
    /// 64 MiB of memory image (mostly bss) into a 16 MiB VM.
    memory_too_small_for_the_kernel => {
        let image = elf(&[(0x10_0000, 64, 64 << 20)], Some(0x10_0000));
        kernel_refused(&image, &["--mem", "16M"], "--mem too small")
    };
    memory_too_small_for_a_vm => refused("run --probe --mem 1M", 125, "too small");
    unknown_option => refused("run --probe --frobnicate", 2, "--frobnicate");
    zero_vcpus => refused("run --probe --vcpus 0", 2, "--vcpus");
    probe_export_to_an_unwritable_place =>
        refused("probe export /nonexistent/dir/probe.elf", 125, "cannot write");
}

#[test]
fn malformed_values() {
    let _shared = test_infra::alongside_others();
    assert_one_line_error(&["run", "--probe", "--mem", "lots"], 2, "--mem");
    assert_one_line_error(&["run", "--probe", "--timeout", "-1"], 2, "--timeout");
    assert_one_line_error(&["run", "--probe", "--disable-exits", "mwait"], 2, "--disable-exits");
    assert_one_line_error(&["run", "--probe", "--pin-vcpu", "4096"], 125, "cannot pin");
}

#[test]
fn kernel_and_probe_are_exclusive_and_one_is_required() {
    let _shared = test_infra::alongside_others();
    assert_one_line_error(&["run"], 2, "required");
    assert_one_line_error(&["run", "--probe", "--kernel", "/x"], 2, "cannot be used with");
}

/// A new FIFO at DIR/fifo: its path.
fn fifo(dir: &Path) -> String {
    let path = dir.join("fifo").to_str().unwrap().to_owned();
    let c_path = std::ffi::CString::new(path.as_str()).unwrap();
    // SAFETY: a NUL-terminated path that lives across the call.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0, "mkfifo");
    path
}

/// Opening a FIFO for reading used to wait for a writer forever, with no output.
#[test]
fn kernel_that_is_a_fifo_a_directory_or_a_device_is_refused_at_once() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let (fifo, dir_path) = (&*fifo(dir.path()), dir.path().to_str().unwrap());
    for (kernel, kind) in [(fifo, "a FIFO"), (dir_path, "a directory"), ("/dev/zero", "a character device")] {
        assert_one_line_error(
            &["run", "--kernel", kernel],
            125,
            &format!("the kernel {kernel} is {kind}, not a regular file"),
        );
    }
}

/// A FIFO disk used to wait forever when read-only, and to say "Illegal seek" otherwise;
/// /dev/zero was "smaller than one 512-byte sector".
#[test]
fn disk_that_is_not_a_file_or_block_device_is_refused_with_what_it_is() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let (fifo, dir_path) = (&*fifo(dir.path()), dir.path().to_str().unwrap());
    let file_disk = "not a regular file or block device";
    let ram_disk = "not a regular file";
    let cases = [
        (format!("path={fifo}"), fifo, "a FIFO", file_disk),
        (format!("path={fifo},readonly"), fifo, "a FIFO", file_disk),
        (format!("path={fifo},direct"), fifo, "a FIFO", file_disk),
        ("path=/dev/zero".to_string(), "/dev/zero", "a character device", file_disk),
        (format!("path={dir_path}"), dir_path, "a directory", file_disk),
        (format!("ram,path={fifo},readonly"), fifo, "a FIFO", ram_disk),
        ("ram,path=/dev/zero".to_string(), "/dev/zero", "a character device", ram_disk),
        (format!("ram,path={dir_path}"), dir_path, "a directory", ram_disk),
    ];
    for (spec, path, kind, wanted) in cases {
        assert_one_line_error(
            &["run", "--probe", "--disk", &spec],
            125,
            &format!("{path} is {kind}, {wanted}"),
        );
    }
}

#[test]
fn over_long_or_unprintable_cmdline_says_the_limit() {
    let _shared = test_infra::alongside_others();
    let long = "a".repeat(5000);
    assert_one_line_error(
        &["run", "--probe", "--cmdline", &long],
        2,
        "--cmdline is 5000 bytes; the limit is 4095",
    );
    // Within the limit alone, beyond it with what exitless appends.
    let almost = "a".repeat(4090);
    assert_one_line_error(
        &["run", "--probe", "--cmdline", &almost],
        125,
        "the limit is 4095: shorten --cmdline by",
    );
    assert_one_line_error(&["run", "--probe", "--cmdline", "a\tb"], 2, "--cmdline has '\\t' at byte 1");
}

#[test]
fn a_log_level_that_is_not_one() {
    let _shared = test_infra::alongside_others();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_exitless"))
        .args(["probe", "export", "/nonexistent/probe.elf"])
        .env("EXITLESS_LOG", "loud")
        .output()
        .expect("run exitless");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "one line expected, got: {err}");
    assert!(err.starts_with("exitless: EXITLESS_LOG=loud: not a level (off, error, warn"), "{err}");
}

#[test]
fn nics_that_cannot_be_told_apart_or_have_no_address_and_uplinks_that_do_not_exist() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let socket = |name: &str| dir.path().join(name).display().to_string();
    let nic = |name: &str, mac: &str| format!("socket={},mac={mac}", socket(name));
    let (a, b) = (nic("a", "52:54:00:00:00:01"), nic("b", "52:54:00:00:00:01"));
    assert_one_line_error(
        &["vhost-user-net", "--nic", &a, "--nic", &b],
        2,
        "NIC nic1: address 52:54:00:00:00:01 is NIC nic0's already",
    );
    let c = nic("a", "52:54:00:00:00:02");
    assert_one_line_error(&["vhost-user-net", "--nic", &a, "--nic", &c], 2, "is NIC nic0's already");
    // Sharing an address (a live migration on this host) is said, of a NIC before it with it.
    let twin = |name: &str, mac: &str, of: &str| format!("{},shares-mac-with={of}", nic(name, mac));
    let cases = [
        (twin("b", "52:54:00:00:00:01", "nic2"), "shares-mac-with=nic2, but no NIC before it is named nic2"),
        (twin("b", "52:54:00:00:00:02", "nic0"), "shares-mac-with=nic0, whose address is 52:54:00:00:00:01"),
        (twin("b", "52:54:00:00:00:01", "nic1"), "shares-mac-with=nic1, but no NIC before it"),
    ];
    for (b, says) in cases {
        assert_one_line_error(&["vhost-user-net", "--nic", &a, "--nic", &b], 2, says);
    }
    // A third NIC with the address, sharing it with the second: the first still has it.
    let (b, c) = (twin("b", "52:54:00:00:00:01", "nic0"), twin("c", "52:54:00:00:00:01", "nic1"));
    assert_one_line_error(
        &["vhost-user-net", "--nic", &a, "--nic", &b, "--nic", &c],
        2,
        "is NIC nic0's already",
    );
    let group = nic("a", "01:00:5e:00:00:01");
    assert_one_line_error(&["vhost-user-net", "--nic", &group], 2, "must be unicast");
    assert_one_line_error(
        &["vhost-user-net", "--nic", &format!("socket={}", socket("a"))],
        2,
        "needs mac=MAC",
    );
    assert_one_line_error(&["vhost-user-net"], 2, "--nic");
    assert_one_line_error(&["vhost-user-net", "--nic", &format!("{a},isolated=maybe")], 2, "isolated=on|off");
    assert_one_line_error(&["vhost-user-net", "--nic", &format!("{a},pps=0")], 2, "above 0");
    assert_one_line_error(
        &["vhost-user-net", "--nic", &a, "--uplink", "xl-no-such-if"],
        2,
        "no network interface is called `xl-no-such-if`",
    );
    assert!(!dir.path().join("a").exists(), "no socket was made");
}
