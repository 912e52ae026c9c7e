//! Another local user against what `exitless run` leaves on the host: the migration listener
//! (before its source connects, and after), a migration to a path that user bound first, and a
//! snapshot's files and directory. The attacker is `nobody` (`setpriv --reuid=nobody
//! --regid=nogroup --clear-groups`, running this test binary's `attacker` helper), and exitless
//! runs with umask 0, so that only what exitless itself does protects it. Each attempt must be
//! refused: EACCES, or a connection closed before a byte of VM state goes through.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use test_infra::api::http;
use test_infra::background::Background;
use test_infra::one_at_a_time;

/// What the helper prints before its result.
const RESULT: &str = "ATTACKER-RESULT ";
/// The helper test, by its path in the integration test binary.
const HELPER: &str = "local_attacker_vm::attacker";
/// Bounds the helper's waits: far beyond what a refusal takes.
const HELPER_WAIT: Duration = Duration::from_secs(60);

/// Run this binary's `attacker` helper as nobody:nogroup with `action` and `path`; its result.
fn as_nobody(action: &str, path: &Path) -> String {
    which("setpriv");
    let out = Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", HELPER, "--nocapture", "--test-threads=1"])
        .env("EXITLESS_ATTACKER", action)
        .env("EXITLESS_ATTACKER_PATH", path)
        .output()
        .expect("run setpriv");
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        // libtest may have begun the line ("test attacker ... ").
        .find_map(|l| l.split_once(RESULT).map(|(_, result)| result))
        .unwrap_or_else(|| {
            panic!(
                "the helper ({action} {}) said nothing: {stdout} {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .to_string()
}

/// A program the test needs; a missing one fails the test and says so.
fn which(program: &str) {
    let found = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()));
    assert!(found, "{program} is missing: run scripts/setup.sh (util-linux)");
}

/// The helper itself: does nothing unless run by `as_nobody`.
#[test]
fn attacker() {
    let _shared = test_infra::alongside_others();
    let (Some(action), Some(path)) =
        (std::env::var_os("EXITLESS_ATTACKER"), std::env::var_os("EXITLESS_ATTACKER_PATH"))
    else {
        return;
    };
    let path = PathBuf::from(path);
    let errno = |e: std::io::Error| format!("error {}", e.raw_os_error().unwrap_or(0));
    let result = match action.to_str().unwrap() {
        // Connect, send a hello of a VM without disks, and count what comes back.
        "connect" => match UnixStream::connect(&path) {
            Err(e) => errno(e),
            Ok(mut conn) => {
                conn.set_read_timeout(Some(HELPER_WAIT)).unwrap();
                let _ = conn.write_all(&test_infra::migration::hello());
                let mut answer = Vec::new();
                let _ = conn.read_to_end(&mut answer);
                format!("connected answered {}", answer.len())
            }
        },
        // Listen first, then count what the one who connects sends.
        "listen" => {
            let listener = UnixListener::bind(&path).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
            println!("{RESULT}listening");
            let (mut conn, _) = listener.accept().unwrap();
            conn.set_read_timeout(Some(HELPER_WAIT)).unwrap();
            let mut got = Vec::new();
            let _ = conn.read_to_end(&mut got);
            // Stop here: the result line for the waiting test is written to a file.
            std::fs::write(path.with_extension("got"), got.len().to_string()).unwrap();
            "done".into()
        }
        "read" => match std::fs::File::open(&path).and_then(|mut f| f.read(&mut [0u8; 1])) {
            Err(e) => errno(e),
            Ok(_) => "read".into(),
        },
        "list" => match std::fs::read_dir(&path) {
            Err(e) => errno(e),
            Ok(_) => "listed".into(),
        },
        "mkdir" => match std::fs::create_dir(&path)
            .and_then(|()| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)))
        {
            Err(e) => errno(e),
            Ok(()) => "made".into(),
        },
        other => panic!("no action {other}"),
    };
    println!("{RESULT}{result}");
}

/// A new directory any user may create files in (mode 1777, like /tmp), so that only the modes
/// of what exitless creates there protect it; and umask 0 for the processes started from now on.
fn shared_dir() -> tempfile::TempDir {
    // SAFETY: umask only sets this process's file mode creation mask.
    unsafe { libc::umask(0) };
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    dir
}

/// A VM running the probe on a null disk (so it may be migrated and snapshotted), with a
/// control API, for as long as the test needs.
fn long_running_vm(dir: &Path, name: &str) -> (Background, PathBuf) {
    let api = dir.join(format!("{name}.api"));
    let args = [
        "run",
        "--probe",
        "--disk",
        "null=16M",
        "--api-socket",
        api.to_str().unwrap(),
        "--timeout",
        "170",
        "--cmdline",
        "probe.workload=blk probe.rw=randread probe.ops=1000000000 probe.qd=1",
    ];
    (Background::start(dir, name, &args, &api), api)
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

/// EACCES, as the helper reports it.
fn eacces() -> String {
    format!("error {}", libc::EACCES)
}

/// The listener of `run --receive-migration` is 0600 whatever the umask: another user cannot
/// connect. A connection from another user's process that does get through (the socket opened
/// to all by hand, as an operator might) is closed unanswered, and the destination goes on
/// waiting for its source, whose migration then succeeds. Once it has, the path is gone.
#[test]
fn the_migration_listener_refuses_another_user_before_and_after_its_source() {
    let _one = one_at_a_time();
    let dir = shared_dir();
    let socket = dir.path().join("destination.mig");
    let url = format!("unix:{}", socket.display());
    let args = ["run", "--receive-migration", &url, "--disk", "null=16M", "--testdev", "--timeout", "170"];
    let destination = Background::start(dir.path(), "destination", &args, &socket);
    assert_eq!(mode(&socket), 0o600, "the listener's mode with umask 0");
    assert_eq!(as_nobody("connect", &socket), eacces(), "nobody connected to the listener");

    // Opened to all: nobody's connection is closed before a byte of answer.
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert_eq!(as_nobody("connect", &socket), "connected answered 0", "nobody was answered");
    assert!(socket.exists(), "the destination stopped waiting: {}", destination.stderr());

    // The real source (root, this test's user) still gets through, and its VM runs there.
    let (source, api) = long_running_vm(dir.path(), "source");
    let body = format!(r#"{{"destination_url": "{url}"}}"#);
    let (status, answer) = http(&api, "PUT", "/api/v1/vm.send-migration", Some(&body));
    assert_eq!(status, 200, "the migration after nobody's attempt: {answer}");
    let (code, _, err) = source.wait();
    assert_eq!(code, Some(0), "the source: {err}");
    assert!(!socket.exists(), "the listener is still there after the migration");
    assert_eq!(as_nobody("connect", &socket), format!("error {}", libc::ENOENT), "after the migration");
    let dst_err = destination.kill().1;
    assert!(dst_err.contains("refused a migration connection from uid 65534"), "{dst_err}");
}

/// A migration to a path another user bound first sends that user nothing: the source checks
/// who listens before its first byte, refuses, and the VM runs on.
#[test]
fn a_migration_to_a_path_another_user_bound_first_sends_nothing() {
    let _one = one_at_a_time();
    let dir = shared_dir();
    let trap = dir.path().join("trap.mig");
    let helper = std::thread::spawn({
        let trap = trap.clone();
        move || as_nobody("listen", &trap)
    });
    let (vm, api) = long_running_vm(dir.path(), "vm");
    let deadline = std::time::Instant::now() + HELPER_WAIT;
    while !trap.exists() {
        assert!(std::time::Instant::now() < deadline, "nobody's listener did not appear");
        std::thread::sleep(Duration::from_millis(10));
    }
    let body = format!(r#"{{"destination_url": "unix:{}"}}"#, trap.display());
    let (status, answer) = http(&api, "PUT", "/api/v1/vm.send-migration", Some(&body));
    assert_eq!(status, 500, "a migration to nobody's socket: {answer}");
    assert!(answer.contains("uid 65534"), "{answer}");
    helper.join().unwrap();
    let got = std::fs::read_to_string(trap.with_extension("got")).unwrap();
    assert_eq!(got, "0", "bytes nobody received from the source");
    // The VM runs on: it pauses and resumes.
    assert_eq!(http(&api, "PUT", "/api/v1/vm.pause", None).0, 204);
    assert_eq!(http(&api, "PUT", "/api/v1/vm.resume", None).0, 204);
    vm.kill();
}

/// A vhost-user disk whose socket path another user bound first sends that user nothing (the
/// connection would carry the guest's memory): the VMM checks who listens before its first
/// message and refuses to start, naming the uid. `daemon-uid=` names a daemon of another user,
/// which is then talked to.
#[test]
fn a_vhost_user_disk_on_a_path_another_user_bound_first_sends_nothing() {
    let _one = one_at_a_time();
    let dir = shared_dir();
    for (allowance, refused) in [("", true), (",daemon-uid=65534", false)] {
        let trap = dir.path().join(format!("trap{}.sock", allowance.len()));
        let helper = std::thread::spawn({
            let trap = trap.clone();
            move || as_nobody("listen", &trap)
        });
        let deadline = std::time::Instant::now() + HELPER_WAIT;
        while !trap.exists() {
            assert!(std::time::Instant::now() < deadline, "nobody's listener did not appear");
            std::thread::sleep(Duration::from_millis(10));
        }
        let disk = format!("vhost-user={},reconnect=0{allowance}", trap.display());
        let out = Command::new(env!("CARGO_BIN_EXE_exitless"))
            .args(["run", "--probe", "--timeout", "30", "--disk", &disk])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "the VM ran on nobody's daemon: {stderr}");
        helper.join().unwrap();
        let got: usize = std::fs::read_to_string(trap.with_extension("got")).unwrap().parse().unwrap();
        if refused {
            assert!(stderr.contains("runs as uid 65534"), "{stderr}");
            assert_eq!(got, 0, "bytes nobody received from the VMM");
        } else {
            assert!(got > 0, "with daemon-uid=65534 the VMM talks to that user's daemon: {stderr}");
        }
    }
}

/// A snapshot's directory is 0700 and its files 0600 whatever the umask, so another user can
/// neither list nor read them; a directory another user made, one open to others, or a
/// symbolic link in its place is refused, and nothing is written there.
#[test]
fn a_snapshot_is_unreadable_to_another_user_and_refuses_planted_directories() {
    let _one = one_at_a_time();
    let dir = shared_dir();
    let (vm, api) = long_running_vm(dir.path(), "vm");
    assert_eq!(http(&api, "PUT", "/api/v1/vm.pause", None).0, 204);
    let snapshot = |to: &Path| {
        let body = format!(r#"{{"destination_url": "file://{}"}}"#, to.display());
        http(&api, "PUT", "/api/v1/vm.snapshot", Some(&body))
    };

    let snap = dir.path().join("snap");
    let (status, answer) = snapshot(&snap);
    assert_eq!(status, 204, "{answer}");
    assert_eq!(mode(&snap), 0o700, "the snapshot directory");
    for file in ["memory", "state.json"] {
        assert_eq!(mode(&snap.join(file)), 0o600, "{file}");
        assert_eq!(as_nobody("read", &snap.join(file)), eacces(), "nobody read {file}");
    }
    assert_eq!(as_nobody("list", &snap), eacces(), "nobody listed the snapshot");

    // A directory nobody made first (0777, theirs).
    let planted = dir.path().join("planted");
    assert_eq!(as_nobody("mkdir", &planted), "made");
    let (status, answer) = snapshot(&planted);
    assert_eq!(status, 500, "a snapshot into nobody's directory: {answer}");
    assert!(answer.contains("belongs to uid 65534"), "{answer}");
    assert_eq!(std::fs::read_dir(&planted).unwrap().count(), 0, "written into nobody's directory");

    // A symbolic link to a directory nobody can read.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&planted, &link).unwrap();
    let (status, answer) = snapshot(&link);
    assert_eq!(status, 500, "a snapshot through a symbolic link: {answer}");
    assert!(answer.contains("symbolic link"), "{answer}");
    assert_eq!(std::fs::read_dir(&planted).unwrap().count(), 0, "written through the link");

    // This user's own directory, but open to others.
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (status, answer) = snapshot(&open);
    assert_eq!(status, 500, "a snapshot into a 0755 directory: {answer}");
    assert!(answer.contains("mode is 0755"), "{answer}");
    assert_eq!(std::fs::read_dir(&open).unwrap().count(), 0, "written into a 0755 directory");

    // A second snapshot over the first keeps the modes.
    let (status, answer) = snapshot(&snap);
    assert_eq!(status, 204, "a snapshot over another: {answer}");
    assert_eq!(mode(&snap.join("memory")), 0o600);
    vm.kill();
}
