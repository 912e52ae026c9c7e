//! Another local user against what the daemon and the VMM leave on the host: the daemon's API
//! socket, the VMM's API socket (`exitless run --probe --api-socket`), a vhost-user socket, the
//! hand-over socket and a RAM disk's memory. The attacker is `nobody` (`setpriv`), trying each
//! socket with the daemons started under umask 022 and under umask 000:
//!
//! - as plain `nobody`, whom the socket files' modes stop: connect fails with EACCES;
//! - as `nobody` holding CAP_DAC_OVERRIDE (file modes do not stop it), so only the peer check
//!   (SO_PEERCRED) stands between it and the socket: its connection is closed before any
//!   answer, the refusal is logged with its uid, and the daemon serves on.
//!
//! And the operator's allowance: `--socket-owner UID` lets exactly that user in, and
//! `--socket-owner :GID --socket-mode 660` exactly that group's processes.
//!
//! Needs root (setpriv changes user; the RAM disk test plants files as `nobody`) and python3
//! (the attacker's client).

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use test_infra::api::http;
use test_infra::daemon::Daemon;

/// The attacker's client: `connect PATH HEX` connects, sends the bytes and prints what came
/// back; `open PATH` opens a file for reading.
const CLIENT: &str = r#"
import errno, socket, sys
def name(e):
    return errno.errorcode.get(e.errno, str(e.errno))
kind, path = sys.argv[1], sys.argv[2]
if kind == "open":
    try:
        open(path, "rb").close()
        print("opened")
    except OSError as e:
        print("refused " + name(e))
    sys.exit(0)
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(path)
except OSError as e:
    print("refused " + name(e))
    sys.exit(0)
s.settimeout(60)
try:
    s.sendall(bytes.fromhex(sys.argv[3]))
    data = s.recv(65536)
except OSError as e:
    print("closed " + name(e))
    sys.exit(0)
print("answered " + data.hex() if data else "closed")
"#;

/// The system's python3 (scripts/setup.sh installs it): another user may run it, where a
/// python3 first in root's PATH may be root's own.
const PYTHON: &str = "/usr/bin/python3";

/// `nobody`, with no groups: file modes stop it.
const NOBODY: &[&str] = &["--reuid=nobody", "--regid=nogroup", "--clear-groups"];
/// `nobody` with CAP_DAC_OVERRIDE: file modes do not stop it, only the peer check does.
const NOBODY_PAST_MODES: &[&str] = &[
    "--reuid=nobody",
    "--regid=nogroup",
    "--clear-groups",
    "--inh-caps=+dac_override",
    "--ambient-caps=+dac_override",
];
const NOBODY_UID: u32 = 65534;

/// vhost-user GET_FEATURES (request 1, version 1, no payload): a daemon that serves the
/// connection answers it at once.
const GET_FEATURES: &str = "010000000100000000000000";

fn hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

/// What `user` (setpriv's options) gets trying `args` with the client: "refused EACCES",
/// "closed", "answered HEX", "opened".
fn attempt(user: &[&str], args: &[&str]) -> String {
    let out = Command::new("setpriv")
        .args(user)
        .args([PYTHON, "-c", CLIENT])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("setpriv and python3 (util-linux and python3, installed by scripts/setup.sh)");
    assert!(
        out.status.success(),
        "the attacker's client failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A socket another user must not get an answer on: refused by its mode, and closed unread
/// when the mode does not stop it. `what` names it for the assertions.
fn assert_refused(socket: &Path, request: &str, what: &str) {
    let plain = attempt(NOBODY, &["connect", socket.to_str().unwrap(), request]);
    assert_eq!(plain, "refused EACCES", "{what}: nobody connected");
    let past = attempt(NOBODY_PAST_MODES, &["connect", socket.to_str().unwrap(), request]);
    assert!(past.starts_with("closed"), "{what}: nobody past the file modes got {past}");
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

fn assert_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "these tests change user with setpriv: run them as root");
}

/// Does the daemon on `socket` serve us (GET_FEATURES answered)?
fn features_answered(socket: &Path) -> bool {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let request: Vec<u8> = (0..GET_FEATURES.len() / 2)
        .map(|i| u8::from_str_radix(&GET_FEATURES[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    stream.write_all(&request).unwrap();
    let mut reply = [0u8; 20];
    stream.read_exact(&mut reply).is_ok() && reply[0] == 1
}

/// Wait until `log()` holds `needle` (the refusal is logged as the connection closes).
fn wait_for_log(log: impl Fn() -> String, needle: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !log().contains(needle) {
        assert!(Instant::now() < deadline, "{what}: no {needle:?} in the log: {}", log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An `exitless run --probe` VM with a control API, waiting at its verify's gate (which the
/// test never opens) until killed.
struct Vm {
    child: test_infra::KillOnDrop,
    stderr: PathBuf,
}

impl Vm {
    fn start(dir: &Path, api: &Path, umask: libc::mode_t) -> Vm {
        use std::os::unix::process::CommandExt;
        const BLOCKS: u64 = 16;
        let disk = test_infra::disk_file(dir, "vm.disk", (BLOCKS + 1) * 4096);
        let stderr = dir.join("vm.err");
        let mut command = Command::new(env!("CARGO_BIN_EXE_exitless"));
        command
            .args(["run", "--probe", "--mem", "128M", "--disk"])
            .arg(format!("path={}", disk.display()))
            .arg("--cmdline")
            .arg(format!(
                "probe.workload=blk probe.rw=verify probe.ops={BLOCKS} probe.qd=1 probe.gate_block={BLOCKS} probe.timeout_ms=170000"
            ))
            .arg("--api-socket")
            .arg(api)
            .args(["--timeout", "170"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap());
        // SAFETY: umask is async-signal-safe and touches no memory.
        unsafe {
            command.pre_exec(move || {
                libc::umask(umask);
                Ok(())
            })
        };
        let mut vm = Vm { child: test_infra::KillOnDrop(command.spawn().expect("run exitless")), stderr };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !api.exists() {
            assert!(vm.child.try_wait().unwrap().is_none(), "the VM ended: {}", vm.log());
            assert!(Instant::now() < deadline, "no API socket: {}", vm.log());
            std::thread::sleep(Duration::from_millis(10));
        }
        vm
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

#[test]
fn another_user_gets_nothing_from_any_socket_whatever_the_umask() {
    let _shared = test_infra::alongside_others();
    assert_root();
    for umask in [0o022, 0o000] {
        let dir = tempfile::tempdir().unwrap();
        // Sticky and open to all, as /tmp: the attacker can reach every path in it.
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
        let path = |name: &str| dir.path().join(name);
        let (api, disk_socket, vm_api) = (path("daemon.api"), path("disk.sock"), path("vm.api"));
        let (handover, upgradable_socket) = (path("handover.sock"), path("upgradable.sock"));
        let daemon = Daemon::builder()
            .disk_on(&disk_socket, "ram=1M")
            .api_socket(&api)
            .umask(umask)
            .start(&path("daemon.err"));
        let upgradable = Daemon::builder()
            .disk_on(&upgradable_socket, "null=1M")
            .handover_socket(&handover)
            .umask(umask)
            .start(&path("upgradable.err"));
        let vm = Vm::start(dir.path(), &vm_api, umask);

        let sockets = [
            (&api, "the daemon's API socket"),
            (&disk_socket, "a vhost-user socket"),
            (&handover, "the hand-over socket"),
            (&vm_api, "the VMM's API socket"),
        ];
        for (socket, what) in sockets {
            assert_eq!(mode(socket), 0o600, "{what} made with umask {umask:03o}");
        }
        let get = hex("GET /disks HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_refused(&api, &get, &format!("the daemon's API (umask {umask:03o})"));
        assert_refused(&disk_socket, GET_FEATURES, &format!("a vhost-user socket (umask {umask:03o})"));
        assert_refused(&handover, "5b5d", &format!("the hand-over socket (umask {umask:03o})"));
        let pause = hex("GET /api/v1/vm.pause HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_refused(&vm_api, &pause, &format!("the VMM's API (umask {umask:03o})"));

        // Each refusal is logged with the user's uid; everything serves on.
        let refused = format!("refused a connection from uid {NOBODY_UID}");
        wait_for_log(|| daemon.log(), &format!("control API: {refused}"), "the daemon's API");
        wait_for_log(|| daemon.log(), &format!("{}: {refused}", disk_socket.display()), "the disk");
        wait_for_log(|| upgradable.log(), &format!("uid {NOBODY_UID}"), "the hand-over");
        wait_for_log(|| vm.log(), &format!("control API: {refused}"), "the VMM's API");
        assert_eq!(http(&api, "GET", "/disks", None).0, 200, "the daemon's API serves its owner");
        assert!(features_answered(&disk_socket), "the disk serves its owner's frontend");
        assert_eq!(http(&vm_api, "GET", "/api/v1/vm.pause", None).0, 405, "the VMM's API serves on");
        drop(vm);
        upgradable.stop();
        daemon.stop();
    }
}

#[test]
fn another_user_gets_nothing_from_a_nic_socket_or_the_nic_api_whatever_the_umask() {
    let _shared = test_infra::alongside_others();
    assert_root();
    for umask in [0o022, 0o000] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
        let socket = dir.path().join("nic.sock");
        let api = dir.path().join("api.sock");
        let log = dir.path().join("net.err");
        let script = format!(
            "umask {umask:03o}; exec \"$0\" vhost-user-net --nic socket={},mac=52:54:00:00:00:01 --api-socket {}",
            socket.display(),
            api.display()
        );
        let mut daemon = Command::new("sh")
            .args(["-c", &script])
            .arg(test_infra::exitless_bin())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() || !api.exists() {
            assert!(
                Instant::now() < deadline,
                "no NIC or API socket: {}",
                std::fs::read_to_string(&log).unwrap()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(mode(&socket), 0o600, "a NIC's socket made with umask {umask:03o}");
        assert_refused(&socket, GET_FEATURES, &format!("a NIC's socket (umask {umask:03o})"));
        let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
        wait_for_log(read_log, &format!("refused a connection from uid {NOBODY_UID}"), "the NIC");
        assert!(features_answered(&socket), "the NIC serves its owner's frontend");
        // Whoever writes the API's socket adds NICs and reads every NIC's counters.
        assert_eq!(mode(&api), 0o600, "the NIC daemon's API socket made with umask {umask:03o}");
        assert_refused(&api, &hex("GET /nics HTTP/1.1\r\n\r\n"), &format!("the NIC API (umask {umask:03o})"));
        let _ = daemon.kill();
        let _ = daemon.wait();
    }
}

#[test]
fn a_ram_disk_is_no_file_another_user_can_reach() {
    let _shared = test_infra::alongside_others();
    assert_root();
    let dir = tempfile::tempdir().unwrap();
    let api = dir.path().join("api.sock");
    let daemon = Daemon::builder().api_socket(&api).umask(0o000).start(&dir.path().join("daemon.err"));
    // The attacker plants the name the daemon's first RAM disk file had, and a second link to
    // it that outlives the daemon's unlinking the first.
    let planted = format!("/dev/shm/exitless-ram-{}-0", daemon.pid());
    let kept = format!("/dev/shm/exitless-attacker-{}", daemon.pid());
    let plant =
        format!("import os\nos.umask(0)\nopen({planted:?}, 'w').close()\nos.link({planted:?}, {kept:?})");
    let out = Command::new("setpriv").args(NOBODY).args([PYTHON, "-c", &plant]).output().unwrap();
    assert!(out.status.success(), "planting: {}", String::from_utf8_lossy(&out.stderr));
    let cleanup = [PathBuf::from(&planted), PathBuf::from(&kept)];

    let socket = dir.path().join("ram.sock");
    let body = format!(r#"{{"socket": "{}", "ram": "1M"}}"#, socket.display());
    let (status, answer) = http(&api, "PUT", "/disks/ram", Some(&body));
    let kept_size = std::fs::metadata(&kept).map(|m| m.len());
    for path in &cleanup {
        let _ = std::fs::remove_file(path);
    }
    assert_eq!(status, 201, "{answer}");
    assert_eq!(kept_size.unwrap(), 0, "the daemon made its RAM disk in the attacker's file");
    assert_eq!(mode(&socket), 0o600);

    // The disk's memory is a memfd: no path on the host leads to it.
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", daemon.pid())).unwrap();
    assert!(maps.contains("/memfd:exitless-ram"), "no memfd RAM disk mapped: {maps}");
    assert!(!maps.contains("/dev/shm/"), "a /dev/shm file is mapped: {maps}");
    let fds = std::fs::read_dir(format!("/proc/{}/fd", daemon.pid())).unwrap();
    for fd in fds {
        let target = std::fs::read_link(fd.unwrap().path()).unwrap_or_default();
        assert!(!target.starts_with("/dev/shm"), "the daemon holds {} open", target.display());
    }
    daemon.stop();
}

#[test]
fn the_operators_allowance_lets_exactly_that_user_or_group_in() {
    let _shared = test_infra::alongside_others();
    assert_root();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    let (api, socket) = (dir.path().join("api.sock"), dir.path().join("disk.sock"));
    let owner = NOBODY_UID.to_string();
    let daemon = Daemon::builder()
        .disk_on(&socket, "null=1M")
        .args(&["--api-socket".as_ref(), api.as_os_str(), "--socket-owner".as_ref(), owner.as_ref()], &[&api])
        .umask(0o000)
        .start(&dir.path().join("daemon.err"));
    let meta = std::fs::symlink_metadata(&socket).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (NOBODY_UID, 0o600), "the socket is given to nobody");
    let path = socket.to_str().unwrap();
    let answered = attempt(NOBODY, &["connect", path, GET_FEATURES]);
    assert!(answered.starts_with("answered 01000000"), "nobody, the named owner: {answered}");
    // Another user: stopped by the mode, and by the peer check past it.
    let daemon_user = ["--reuid=1", "--regid=1", "--clear-groups"];
    assert_eq!(attempt(&daemon_user, &["connect", path, GET_FEATURES]), "refused EACCES");
    let past = [&daemon_user[..], &["--inh-caps=+dac_override", "--ambient-caps=+dac_override"]].concat();
    assert!(attempt(&past, &["connect", path, GET_FEATURES]).starts_with("closed"));
    wait_for_log(|| daemon.log(), "refused a connection from uid 1 ", "uid 1 at the disk");
    // The control API stays the daemon's user's alone.
    assert_refused(&api, &hex("GET /disks HTTP/1.1\r\n\r\n"), "the API with --socket-owner");
    daemon.stop();

    // A group: its processes are served, whoever their user; the others' are not.
    const GROUP: u32 = 4242;
    let socket = dir.path().join("group.sock");
    let group = format!(":{GROUP}");
    let daemon = Daemon::builder()
        .disk_on(&socket, "null=1M")
        .args(&["--socket-owner", &group, "--socket-mode", "660"], &[])
        .umask(0o077)
        .start(&dir.path().join("group.err"));
    let meta = std::fs::symlink_metadata(&socket).unwrap();
    assert_eq!((meta.gid(), meta.mode() & 0o7777), (GROUP, 0o660));
    let path = socket.to_str().unwrap();
    let member = ["--reuid=1".to_owned(), format!("--regid={GROUP}"), "--clear-groups".to_owned()];
    let member: Vec<&str> = member.iter().map(String::as_str).collect();
    let answered = attempt(&member, &["connect", path, GET_FEATURES]);
    assert!(answered.starts_with("answered 01000000"), "a process of group {GROUP}: {answered}");
    assert_eq!(attempt(NOBODY, &["connect", path, GET_FEATURES]), "refused EACCES");
    assert!(attempt(NOBODY_PAST_MODES, &["connect", path, GET_FEATURES]).starts_with("closed"));
    daemon.stop();
}
