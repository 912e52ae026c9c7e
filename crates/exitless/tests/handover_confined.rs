//! A successor daemon (`--handover-socket`) reads its predecessor's messages (disks' states,
//! descriptors, sessions) only once the thread reading them is under its seccomp filter.
//!
//! The sandbox's self-test makes a thread of the named kind call a forbidden system call right
//! after it confines itself: here the successor's `daemon-control` thread, so the successor dies
//! of SIGSYS at the moment it confines the reader. If that happens before it reads, the
//! predecessor has handed nothing over and serves on; if the successor read first, the
//! predecessor has committed and exited, and the disk is gone with the successor.

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use test_infra::daemon::Daemon;

#[test]
fn a_successor_confines_itself_before_it_reads_its_predecessor() {
    let _shared = test_infra::alongside_others();
    let dir = tempfile::tempdir().unwrap();
    let disk = test_infra::disk_file(dir.path(), "disk", 1 << 20);
    let socket = dir.path().join("disk.sock");
    let handover = dir.path().join("handover.sock");
    let spec = format!("path={}", disk.display());
    let args = ["--handover-socket".as_ref(), handover.as_os_str()];
    let mut old = Daemon::builder()
        .disk_on(&socket, &spec)
        .args(&args, &[&handover])
        .start(&dir.path().join("old.log"));

    let successor = Daemon::builder()
        .disk_on(&socket, &spec)
        .args(&args, &[])
        .env(sandbox::SELF_TEST_ENV, "daemon-control")
        .command()
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("new.log")).unwrap())
        .spawn()
        .unwrap();
    let mut successor = test_infra::KillOnDrop(successor);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = successor.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the successor did not end; the predecessor's log: {}", old.log());
        std::thread::sleep(Duration::from_millis(20));
    };
    let new_log = std::fs::read_to_string(dir.path().join("new.log")).unwrap_or_default();
    assert_eq!(status.signal(), Some(libc::SIGSYS), "the successor's end: {status}; its log: {new_log}");

    // The predecessor handed nothing over: it is alive and serves its disk on, and it says so.
    let limit = Instant::now() + Duration::from_secs(60);
    while !old.log().contains("serving on") {
        old.assert_alive();
        assert!(Instant::now() < limit, "the predecessor never said it serves on: {}", old.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    old.assert_alive();
    assert!(!old.log().contains("handed every disk over"), "{}", old.log());
    assert!(socket.exists() && handover.exists());
    old.stop();
}
