//! A confined thread that makes a system call outside its allowlist: in kill mode the process
//! dies of SIGSYS, in log mode the call goes through, with no filter nothing changes. Each case
//! runs in a child process (this test binary again, told what to do through the environment),
//! since the filter cannot be taken off again and kill mode ends the whole process.

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output};

use sandbox::{Filter, SeccompMode, ThreadKind};

/// Set in the child: `<thread kind>,<mode>,<forbidden call: socket or none>`.
const CHILD_ENV: &str = "SANDBOX_TEST_CHILD";
/// Printed by the child once its filter is installed, before the forbidden call.
const INSTALLED: &str = "filter installed";
/// Printed by the child when the forbidden call returned a descriptor.
const CALL_ALLOWED: &str = "socket() allowed";
/// Printed by the child when it opened a disk again under its filter.
const REOPENED: &str = "disk reopened";

fn mode_name(mode: SeccompMode) -> &'static str {
    match mode {
        SeccompMode::Kill => "kill",
        SeccompMode::Log => "log",
        SeccompMode::Off => "off",
    }
}

/// Run the `child` test of this binary in a new process, confined as `kind` in `mode`; the
/// confined thread calls socket() if `forbidden_call`.
fn run_child(kind: ThreadKind, mode: SeccompMode, forbidden_call: bool) -> (Output, String) {
    run_child_calling(kind, mode, if forbidden_call { "socket" } else { "none" })
}

/// Run the `child` test confined as `kind` in `mode`, making `call` (socket, reopen or none):
/// its output, and its standard output as text.
fn run_child_calling(kind: ThreadKind, mode: SeccompMode, call: &str) -> (Output, String) {
    let exe = std::env::current_exe().expect("the test binary's path");
    let output = Command::new(exe)
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{},{},{call}", kind.name(), mode_name(mode)))
        .output()
        .expect("the child test process starts");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    (output, stdout)
}

/// In a run of the suite: a thread confined in kill mode that calls socket() kills its process
/// with SIGSYS, before the call returns (run in a child process, as the other tests do). In the
/// child process (`CHILD_ENV` set): the child's body, which itself fails if a filter in kill
/// mode let the forbidden call through.
#[test]
fn child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        let (output, stdout) = run_child(ThreadKind::VhostUserConnection, SeccompMode::Kill, true);
        assert!(stdout.contains(INSTALLED), "the filter was not installed: {stdout}");
        assert!(!stdout.contains(CALL_ALLOWED), "socket() went through the filter: {stdout}");
        assert_eq!(output.status.signal(), Some(libc::SIGSYS), "{:?}: {stdout}", output.status);
        return;
    };
    let [kind, mode, call] = spec.split(',').collect::<Vec<_>>()[..] else {
        panic!("kind,mode,call: {spec}")
    };
    let kind = ThreadKind::ALL.into_iter().find(|&k| k.name() == kind).expect("a known thread kind");
    let mode = [SeccompMode::Kill, SeccompMode::Log, SeccompMode::Off]
        .into_iter()
        .find(|&m| mode_name(m) == mode)
        .expect("a known mode");
    let filter = Filter::new(kind, mode).expect("the filter builds");
    // On a thread of its own, as exitless's threads are.
    let forbidden_call = call == "socket";
    let image = tempfile::NamedTempFile::new_in("/tmp").expect("a file in /tmp");
    image.as_file().set_len(1 << 20).expect("a 1 MiB image");
    let disk = (call == "reopen")
        .then(|| storage::FileDisk::open(image.path(), false, true).expect("the disk opens"));
    std::thread::spawn(move || {
        filter.install().expect("the filter installs");
        println!("{INSTALLED}");
        if let Some(disk) = disk {
            use storage::Backend;
            drop(disk.reopen().expect("the disk opens again"));
            println!("{REOPENED}");
        }
        if !forbidden_call {
            return;
        }
        // No exitless thread opens sockets once it serves a guest.
        // SAFETY: socket() takes no pointers; the descriptor is closed below.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
        if fd >= 0 {
            println!("{CALL_ALLOWED}");
            // SAFETY: `fd` was just opened here and is not used again.
            unsafe { libc::close(fd) };
        }
        // Kill mode must not have come back here: the child fails (exit status 101), so that
        // the test that ran it fails even if it looked only at the status.
        assert_ne!(mode, SeccompMode::Kill, "kill mode let socket() through (it returned {fd})");
    })
    .join()
    .expect("the confined thread ends");
}

#[test]
fn a_confined_thread_runs_and_ends_without_a_forbidden_call() {
    for kind in ThreadKind::ALL {
        let (output, stdout) = run_child(kind, SeccompMode::Kill, false);
        assert!(stdout.contains(INSTALLED), "{kind}: the filter was not installed: {stdout}");
        assert!(output.status.success(), "{kind}: {:?}: {stdout}", output.status);
    }
}

#[test]
fn kill_mode_kills_the_process_with_sigsys_on_a_forbidden_call() {
    for kind in ThreadKind::ALL {
        let (output, stdout) = run_child(kind, SeccompMode::Kill, true);
        assert!(stdout.contains(INSTALLED), "{kind}: the filter was not installed: {stdout}");
        assert!(!stdout.contains(CALL_ALLOWED), "{kind}: socket() went through: {stdout}");
        assert_eq!(output.status.signal(), Some(libc::SIGSYS), "{kind}: {:?}: {stdout}", output.status);
    }
}

#[test]
fn log_mode_lets_a_forbidden_call_through() {
    for kind in ThreadKind::ALL {
        let (output, stdout) = run_child(kind, SeccompMode::Log, true);
        assert!(output.status.success(), "{kind}: {:?}: {stdout}", output.status);
        assert!(stdout.contains(CALL_ALLOWED), "{kind}: socket() was refused: {stdout}");
    }
}

#[test]
fn off_mode_installs_nothing() {
    let (output, stdout) = run_child(ThreadKind::IoCore, SeccompMode::Off, true);
    assert!(output.status.success(), "{:?}: {stdout}", output.status);
    assert!(stdout.contains(CALL_ALLOWED), "socket() was refused: {stdout}");
}

/// A queue started after a reset gave up on a disk that did not answer opens the disk again,
/// on the thread that starts it: the vCPU (DRIVER_OK) or a vhost-user connection.
#[test]
fn the_threads_that_start_queues_may_open_a_disk_again() {
    for kind in [ThreadKind::Vcpu, ThreadKind::VhostUserConnection] {
        let (output, stdout) = run_child_calling(kind, SeccompMode::Kill, "reopen");
        assert!(output.status.success(), "{kind}: {:?}: {stdout}", output.status);
        assert!(stdout.contains(REOPENED), "{kind}: {stdout}");
    }
}
