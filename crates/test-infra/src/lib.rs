//! The one test rig of the workspace: the `exitless` binary and its daemon, QEMU, a Linux
//! guest's initramfs, held disks, consoles, and a vhost-user frontend and in-process backend,
//! for the integration tests (`crates/exitless/tests`, `crates/vhost-user/tests`). What the
//! bench does too (the probe's verify command line and result, a process's CPU time) is the
//! bench's own function, re-exported. Every helper panics, saying why, where a test cannot go on.
#![deny(missing_docs)]

pub mod api;
pub mod backend;
pub mod background;
pub mod console;
pub mod daemon;
pub mod disks;
pub mod frontend;
pub mod held_disk;
pub mod huge_pages;
pub mod linux;
pub mod migration;
pub mod net;
pub mod qemu;
pub mod qmp;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub use exitless_bench::{blk_result, probe_result, process_cpu_time, verify_cmdline};
use serde_json::Value;
pub use storage::testing::command_in;

/// The `exitless` binary under test: `CARGO_BIN_EXE_exitless` where Cargo sets it (running the
/// integration tests of the `exitless` package), else the one Cargo built beside the running
/// test binary (`target/PROFILE/exitless` for `target/PROFILE/deps/TEST-HASH`).
pub fn exitless_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("CARGO_BIN_EXE_exitless") {
        return PathBuf::from(path);
    }
    let test = std::env::current_exe().expect("the test binary's path");
    let beside = test.parent().and_then(Path::parent).map(|profile| profile.join("exitless"));
    beside.filter(|path| path.exists()).unwrap_or_else(|| {
        panic!("no exitless binary beside {}: build it (cargo build --release)", test.display())
    })
}

/// A command line as one reads it: the words of `line`, then `more` (the values known only at run
/// time, or those with spaces).
pub fn args<'a>(line: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    line.split_whitespace().chain(more.iter().copied()).collect()
}

/// One `#[test]` per `NAME => CASE;` line, for a topic whose tests differ only in what they pass
/// to one function (a device, a mode, a disk kind): each case stays a test of its own, run,
/// filtered and reported by its name. Attributes (doc comments) before a name go on its test.
#[macro_export]
macro_rules! tests {
    ($($(#[$attribute:meta])* $name:ident => $case:expr;)+) => {
        $(
            $(#[$attribute])*
            #[test]
            fn $name() {
                $case;
            }
        )+
    };
}

/// Run `exitless ARGS` to the end: its status and output.
pub fn exitless(args: &[&str]) -> Output {
    Command::new(exitless_bin()).args(args).output().expect("run exitless")
}

/// Run exitless like `exitless`, but kill it and fail the test if it has not finished within
/// `limit`: for what used to hang, so that a regression fails rather than hangs the suite.
pub fn exitless_within(limit: Duration, args: &[&str]) -> Output {
    let mut child = Command::new(exitless_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run exitless");
    // Drained by threads, so a full pipe cannot stall the child while we wait.
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for exitless") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            let err = String::from_utf8_lossy(&stderr.join().unwrap()).into_owned();
            panic!("exitless {args:?} did not finish within {limit:?}; stderr: {err}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output { status, stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() }
}

/// A zeroed file of `bytes` at DIR/NAME, a disk's backing file: its path.
pub fn disk_file(dir: &Path, name: &str, bytes: u64) -> PathBuf {
    let path = dir.join(name);
    std::fs::File::create(&path).unwrap().set_len(bytes).unwrap();
    path
}

/// The probe guest's ELF (`exitless probe export`), for QEMU to boot, at DIR/probe.elf: its path.
pub fn probe_elf(dir: &Path) -> PathBuf {
    let elf = dir.join("probe.elf");
    let out = exitless(&["probe", "export", elf.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "exitless probe export: {}", stderr(&out));
    elf
}

/// The probe's verify result in the standard output `stdout` of the run named `what` (whose
/// standard error, `stderr`, is shown if there is none), checked: no mismatch, no error, and all
/// `blocks` blocks verified.
pub fn assert_verify_passed(stdout: &str, stderr: &str, what: &str, blocks: u64) -> Value {
    let result = blk_result(stdout).unwrap_or_else(|| panic!("{what}: no verify result; stderr: {stderr}"));
    assert_eq!(result["mismatches"], 0, "{what}: {result}");
    assert_eq!(result["errors"], 0, "{what}: {result}");
    assert_eq!(result["blocks"], blocks, "{what}: {result}");
    result
}

/// How many threads of process `pid` have a name (`comm`) starting with `prefix`; 0 once it is
/// gone.
pub fn threads_named(pid: u32, prefix: &str) -> usize {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm")).is_ok_and(|name| name.starts_with(prefix))
        })
        .count()
}

/// Bad input is refused at once; far longer than that means exitless waits on something.
const PROMPTLY: Duration = Duration::from_secs(30);

/// `exitless ARGS` must fail at once (within `PROMPTLY`) with `status`, saying why on one line
/// of standard error that starts `exitless: ` and holds `needle`, and without a panic: the line.
pub fn assert_one_line_error(args: &[&str], status: i32, needle: &str) -> String {
    let out = exitless_within(PROMPTLY, args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(status), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: one line expected, got: {err}");
    assert!(err.starts_with("exitless: "), "{err}");
    assert!(err.contains(needle), "{args:?}: expected `{needle}` in: {err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

/// `exitless LINE VALUE` for each `(VALUE, status)` of `cases`: each ends with that status and
/// one line on standard error that contains `needle`. Holds `alongside_others()`: the caller
/// takes no lock of its own.
pub fn assert_each_refused(line: &str, cases: &[(&str, i32)], needle: &str) {
    let _shared = alongside_others();
    for &(value, status) in cases {
        assert_one_line_error(&args(line, &[value]), status, needle);
    }
}

/// A finished process's standard output, as text.
pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A finished process's standard error, as text.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The JSON lines on standard output.
pub fn json_lines(output: &Output) -> Vec<Value> {
    stdout(output).lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// The first JSON line whose `key` is `value`.
pub fn line_with(output: &Output, key: &str, value: &str) -> Value {
    json_lines(output).into_iter().find(|l| l[key] == value).unwrap_or_else(|| {
        panic!("no line with {key}={value}; stdout: {}; stderr: {}", stdout(output), stderr(output))
    })
}

/// A minimal ELF64 executable with the given loadable segments (physical address, file bytes,
/// memory bytes) and, optionally, a PVH entry note.
pub fn elf(segments: &[(u64, u64, u64)], pvh_entry: Option<u32>) -> Vec<u8> {
    let phnum = segments.len() + usize::from(pvh_entry.is_some());
    let mut image = vec![0u8; 64 + 56 * phnum];
    image[..4].copy_from_slice(b"\x7fELF");
    image[4] = 2; // 64-bit
    image[5] = 1; // little endian
    image[6] = 1;
    image[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    image[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86-64
    image[20..24].copy_from_slice(&1u32.to_le_bytes());
    image[24..32].copy_from_slice(&segments.first().map_or(0x10_0000, |s| s.0).to_le_bytes());
    image[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
    image[52..54].copy_from_slice(&64u16.to_le_bytes());
    image[54..56].copy_from_slice(&56u16.to_le_bytes());
    image[56..58].copy_from_slice(&u16::try_from(phnum).unwrap().to_le_bytes());
    let mut phdrs = Vec::new();
    for &(paddr, filesz, memsz) in segments {
        let offset = u64::try_from(image.len()).unwrap();
        image.resize(image.len() + filesz as usize, 0xf4); // hlt
        phdrs.push((1u32, offset, paddr, filesz, memsz));
    }
    if let Some(entry) = pvh_entry {
        let offset = u64::try_from(image.len()).unwrap();
        for word in [4u32, 4, 18] {
            image.extend_from_slice(&word.to_le_bytes());
        }
        image.extend_from_slice(b"Xen\0");
        image.extend_from_slice(&entry.to_le_bytes());
        phdrs.push((4u32, offset, 0, 20, 20));
    }
    for (i, (kind, offset, paddr, filesz, memsz)) in phdrs.into_iter().enumerate() {
        let at = 64 + 56 * i;
        image[at..at + 4].copy_from_slice(&kind.to_le_bytes());
        image[at + 4..at + 8].copy_from_slice(&5u32.to_le_bytes());
        image[at + 8..at + 16].copy_from_slice(&offset.to_le_bytes());
        image[at + 16..at + 24].copy_from_slice(&paddr.to_le_bytes());
        image[at + 24..at + 32].copy_from_slice(&paddr.to_le_bytes());
        image[at + 32..at + 40].copy_from_slice(&filesz.to_le_bytes());
        image[at + 40..at + 48].copy_from_slice(&memsz.to_le_bytes());
        image[at + 48..at + 56].copy_from_slice(&4096u64.to_le_bytes());
    }
    image
}

/// A child process killed and reaped when dropped, however the test ends; otherwise used as the
/// `Child` it holds.
pub struct KillOnDrop(pub std::process::Child);

impl std::ops::Deref for KillOnDrop {
    type Target = std::process::Child;

    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loop block device over a file with direct I/O (`losetup --direct-io=on`): a real block
/// device path. Detached when dropped.
pub struct LoopDevice {
    /// The device (`/dev/loopN`).
    pub path: std::path::PathBuf,
}

impl LoopDevice {
    /// Attach `file` (a multiple of 512 bytes, on a file system that takes O_DIRECT).
    pub fn attach(file: &std::path::Path) -> LoopDevice {
        let out = Command::new("losetup")
            .args(["--find", "--show", "--direct-io=on"])
            .arg(file)
            .output()
            .expect("losetup must be installed (Debian's mount package: scripts/setup.sh installs it)");
        assert!(out.status.success(), "losetup {}: {}", file.display(), stderr(&out));
        let path = std::path::PathBuf::from(stdout(&out).trim());
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let dio = std::fs::read_to_string(format!("/sys/block/{name}/loop/dio")).unwrap_or_default();
        assert_eq!(dio.trim(), "1", "{} does not do direct I/O", path.display());
        LoopDevice { path }
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.path).status();
    }
}

/// The first `blocks` 4 KiB blocks of `path` hold the pattern the probe's `verify` writes with
/// `seed`.
pub fn assert_holds_pattern(path: &std::path::Path, seed: u64, blocks: u64) {
    let bytes = std::fs::read(path).unwrap();
    let written = &bytes[..usize::try_from(blocks * 4096).unwrap()];
    for (block, data) in written.chunks_exact(4096).enumerate() {
        let sector = u64::try_from(block).unwrap() * 8;
        assert!(probe_abi::pattern::check(seed, sector, data), "block {block} of {} differs", path.display());
    }
}

/// A `probe.rw=zeroes` run over `blocks` blocks with `seed`, as its result line `result` says and
/// as the disk's bytes (`disk`, read from the host) hold it: no error, half the blocks zeroed and
/// a quarter discarded, both read back as zeros; the pattern stays only on every fourth block
/// from block 3, and everything else is zero. `what` names the run in messages.
pub fn assert_zeroes_run(what: &str, result: &Value, disk: &[u8], seed: u64, blocks: u64) {
    assert_eq!(result["errors"], 0, "{what}: {result}");
    assert_eq!(result["zero_mismatches"], 0, "{what}: {result}");
    assert_eq!(result["zeroed"], blocks / 2, "{what}: {result}");
    assert_eq!(result["discarded"], (blocks - 1).div_ceil(4), "{what}: {result}");
    assert_eq!(result["discarded_zero"], result["discarded"], "{what}: {result}");
    for (block, data) in disk.chunks_exact(4096).enumerate() {
        let block = u64::try_from(block).unwrap();
        let pattern = block < blocks && block % 4 == 3;
        let holds = if pattern {
            probe_abi::pattern::check(seed, block * 8, data)
        } else {
            data.iter().all(|&b| b == 0)
        };
        assert!(holds, "{what}: block {block} (pattern: {pattern}) on the disk");
    }
}

/// As `assert_holds_pattern`, and every byte after those blocks is still zero.
pub fn assert_holds_only_pattern(path: &std::path::Path, seed: u64, blocks: u64) {
    assert_holds_pattern(path, seed, blocks);
    let bytes = std::fs::read(path).unwrap();
    let rest = &bytes[usize::try_from(blocks * 4096).unwrap()..];
    assert!(rest.iter().all(|&b| b == 0), "bytes beyond what the guest wrote changed in {}", path.display());
}

/// Lets a probe verify with `probe.gate_block=BLOCK` on the disk file `path` go on to its
/// read-back: until then it waits, so what the host does meanwhile surely lands mid-verify.
pub fn open_gate(path: &std::path::Path, block: u64) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(&probe_abi::verify_gate::OPEN.to_le_bytes(), block * 4096).unwrap();
    // On the disk, not only in the page cache, for a VMM that reads with O_DIRECT.
    file.sync_all().unwrap();
}

/// As `assert_holds_pattern`, then the open gate (`open_gate`) in the next block, and nothing
/// after it.
pub fn assert_holds_pattern_and_open_gate(path: &std::path::Path, seed: u64, blocks: u64) {
    assert_holds_pattern(path, seed, blocks);
    let mut gate = vec![0u8; 4096];
    gate[..8].copy_from_slice(&probe_abi::verify_gate::OPEN.to_le_bytes());
    let bytes = std::fs::read(path).unwrap();
    assert!(
        bytes[usize::try_from(blocks * 4096).unwrap()..] == gate[..],
        "the gate block of {} changed",
        path.display()
    );
}

/// Pages of `path` in the host's page cache not yet written back (dirty or under writeback),
/// by cachestat(2) (Linux 6.5 and later).
pub fn dirty_pages(path: &std::path::Path) -> u64 {
    dirty_pages_in(path, 0..0)
}

pub use storage::testing::dirty_pages as dirty_pages_in;

/// A probe result's per-queue completions (`per_queue`), checked to be `queues` counts.
pub fn per_queue(result: &Value, queues: usize) -> Vec<u64> {
    let counts: Vec<u64> =
        result["per_queue"].as_array().expect("per_queue").iter().map(|c| c.as_u64().unwrap()).collect();
    assert_eq!(counts.len(), queues, "{result}");
    counts
}

/// The exits the I/O path makes between two marks, from a phase's `counters`: MMIO exits
/// (notifications, register accesses; less the closing mark's own), port I/O and halts, plus
/// the interrupts injected. Left out are those a busy host causes whatever the guest does: its
/// own interrupts landing on the vCPU's core (`irq_exits`), and after each preemption of the
/// vCPU thread an emulated page fault (`preemption_other`, `pf_emulate`, `insn_emulation` in
/// step).
pub fn io_path_exits(counters: &Value) -> f64 {
    let caused = ["mmio_exits", "io_exits", "halt_exits", "irq_injections"];
    caused.iter().map(|name| counters[name].as_f64().unwrap_or(0.0)).sum::<f64>() - 1.0
}

/// Exits and CPU time between two of the probe's marks, from `exitless run --stats --json`.
pub fn phase(out: &Output, from: u64, to: u64) -> Value {
    let stats = json_lines(out).into_iter().find(|l| l["exitless"] == "run").expect("stats line");
    stats["vcpus"][0]["phases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["from"] == from && p["to"] == to)
        .cloned()
        .unwrap_or_else(|| panic!("no phase {from}->{to} in {stats}"))
}

/// The machine the tests of one binary share: polling modes need both of this machine's cores,
/// and exit counts and idle CPU time are only clean when a test has it to itself.
static MACHINE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Held for a whole test that needs the machine to itself: no other test runs beside it. A test
/// that failed while holding it does not fail the next one.
pub fn one_at_a_time() -> std::sync::RwLockWriteGuard<'static, ()> {
    MACHINE.write().unwrap_or_else(|p| p.into_inner())
}

/// Held for a whole test that may run beside others, but never beside one that holds
/// [`one_at_a_time`].
pub fn alongside_others() -> std::sync::RwLockReadGuard<'static, ()> {
    MACHINE.read().unwrap_or_else(|p| p.into_inner())
}

/// The most IOPS `ops` requests can show under a limit of `iops` per second whose bucket starts
/// full (one second's worth): over t seconds at most iops * (t + 1) requests.
pub fn limited_iops(iops: f64, ops: f64) -> f64 {
    iops * ops / (ops - iops)
}

/// sha256sum's digest of `data`, as a guest's `sha256sum` prints it.
pub fn sha256(data: &[u8]) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sha256sum (coreutils) runs");
    child.stdin.take().unwrap().write_all(data).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).split(' ').next().unwrap_or_default().to_owned()
}
