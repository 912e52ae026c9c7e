//! Live migration of a QEMU guest whose NIC is on `exitless vhost-user-net`, on one host: one
//! daemon serves two NICs with the guest's address (the second `shares-mac-with` the first), a
//! source QEMU (TCG, a Linux guest with busybox) runs on the first, a destination QEMU
//! (`-incoming`) waits on the second, and QMP's `migrate` moves the guest while it sends the
//! host (a network namespace on the far end of the daemon's uplink) 10 MiB over one TCP
//! connection, 64 KiB every 0.1 s.
//!
//! The bytes the host received must hash as the guest's did: the TCP connection survives the
//! move, its frames both ways going through the destination's NIC afterwards. That needs the
//! receive buffers the daemon filled and the used rings it wrote during the migration to reach
//! the destination, which they do only if it logged them (VHOST_F_LOG_ALL).
//!
//! After the move the network must learn where the guest is. Linux announces itself when its
//! NIC offers VIRTIO_NET_F_GUEST_ANNOUNCE (it does, and Linux takes it); a guest that does not
//! (QEMU's `guest_announce=off` stands in for one) has QEMU ask the daemon (SEND_RARP), whose
//! RARP from the guest's address the host sees. Needs what scripts/setup.sh installs
//! (qemu-system-x86, linux-image-cloud-amd64, busybox-static, iproute2, python3).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use test_infra::api::http;
use test_infra::console::Console;
use test_infra::linux::{initramfs, kernel_with, INIT_MOUNTS};
use test_infra::net::{Netns, RarpCapture, Veth};
use test_infra::qemu::Qemu;
use test_infra::qmp::Qmp;
use test_infra::sha256;
use test_infra::KillOnDrop;

/// Booting takes 10 to 20 s under TCG here, the migration of 256 MiB a few more.
const LIMIT: Duration = Duration::from_secs(300);
const MAC: &str = "52:54:00:00:00:31";
/// The host's address, on the far end of the uplink.
const HOST: &str = "10.0.0.100";

/// After `INIT_MOUNTS`: the NIC up as 10.0.0.1, the host answering a ping; then 10 MiB of
/// random bytes to the host's port 5002, slowly enough that the migration happens mid-way.
const INIT: &str = r#"
for m in $(cat /modules); do insmod /lib/modules/$m; done
fail() { echo "NM-FAIL $*"; dmesg | tail -20; sleep 3600; }
ip link set lo up
i=0
while ! ip link set eth0 up 2>/dev/null; do sleep 0.1; i=$((i + 1)); [ $i -gt 100 ] && fail "no eth0"; done
ip addr add 10.0.0.1/24 dev eth0 || fail "address"
echo "NM-FEATURES $(cat /sys/class/net/eth0/device/features)"
i=0
until ping -c 1 -W 1 10.0.0.100 >/dev/null 2>&1; do i=$((i + 1)); [ $i -gt 120 ] && fail "the host is unreachable"; done
dd if=/dev/urandom of=/tmp/data bs=64k count=160 2>/dev/null
echo "NM-SUM $(sha256sum < /tmp/data | cut -d' ' -f1) $(wc -c < /tmp/data)"
echo NM-SENDING
(i=0; while [ $i -lt 160 ]; do dd if=/tmp/data bs=64k skip=$i count=1 2>/dev/null; i=$((i + 1)); sleep 0.1; done) \
    | nc -w 30 10.0.0.100 5002 || fail "nc to the host"
echo NM-SENT
sleep 3600
"#;

fn read(path: &Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
}

#[test]
fn a_guest_migrates_between_two_qemus_on_one_nic_daemon_mid_tcp_transfer() {
    migrate_mid_transfer(true);
}

/// The same for a guest that does not announce itself: the daemon does, for it.
#[test]
fn a_guest_that_does_not_announce_itself_is_announced_by_the_daemon_after_its_move() {
    migrate_mid_transfer(false);
}

fn migrate_mid_transfer(guest_announce: bool) {
    let _serial = test_infra::one_at_a_time();
    let kernel = kernel_with(&["virtio_pci", "virtio_net"]);
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let initramfs_path = dir.path().join("initramfs.cpio");
    initramfs(&kernel, &format!("{INIT_MOUNTS}{INIT}"), &initramfs_path);
    let (netns, veth) = (Netns::create(), Veth::create());
    veth.peer_into(&netns, &format!("{HOST}/24"));

    // One daemon, two NICs with the guest's address: the source's and the destination's.
    let sockets = [dir.path().join("a.sock"), dir.path().join("b.sock")];
    let api = dir.path().join("api.sock");
    let mut command = Command::new(test_infra::exitless_bin());
    command.args(["vhost-user-net", "--uplink", &veth.ours, "--api-socket"]).arg(&api);
    command.args(["--nic", &format!("socket={},mac={MAC},name=a", sockets[0].display())]);
    command.args(["--nic", &format!("socket={},mac={MAC},name=b,shares-mac-with=a", sockets[1].display())]);
    let mut daemon = Console::spawn(&mut command, &dir.path().join("daemon.log"));
    let started = Instant::now();
    while !sockets.iter().all(|s| s.exists()) {
        daemon.assert_running("the daemon");
        assert!(started.elapsed() < Duration::from_secs(10), "no sockets after 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }

    let received = dir.path().join("received");
    let mut receiver = test_infra::net::receive_tcp(&netns, (HOST, 5002), &received);
    let qmp_paths = [dir.path().join("qmp-a"), dir.path().join("qmp-b")];
    let migration = dir.path().join("migration.sock");
    let machine = |socket: &Path, qmp: &Path| {
        let qmp = format!("unix:{},server=on,wait=off", qmp.display());
        let device = if guest_announce { "" } else { ",guest_announce=off" };
        Qemu::linux(&kernel, &initramfs_path, "256M", 1, "")
            .vhost_user_net_with(socket, MAC, "", device)
            .args(&["-qmp", &qmp])
    };
    let consoles = [dir.path().join("console-a.log"), dir.path().join("console-b.log")];
    let logs = [dir.path().join("qemu-a.log"), dir.path().join("qemu-b.log")];
    let mut source = KillOnDrop(
        machine(&sockets[0], &qmp_paths[0]).spawn(&consoles[0], std::fs::File::create(&logs[0]).unwrap()),
    );
    let incoming = format!("unix:{}", migration.display());
    let _destination = KillOnDrop(
        machine(&sockets[1], &qmp_paths[1])
            .args(&["-incoming", &incoming])
            .spawn(&consoles[1], std::fs::File::create(&logs[1]).unwrap()),
    );
    let wait_for = |what: &str, done: &dyn Fn(&str, &str) -> bool| loop {
        let (a, b) = (read(&consoles[0]), read(&consoles[1]));
        assert!(!a.contains("NM-FAIL") && !b.contains("NM-FAIL"), "the guest failed {what}: {a}\n{b}");
        if done(&a, &b) {
            return (a, b);
        }
        assert!(started.elapsed() < LIMIT, "{what}: not within {LIMIT:?}: {a}\n{b}");
        std::thread::sleep(Duration::from_millis(100));
    };

    // The guest is sending; the host has some of it.
    wait_for("sending from the source", &|a, _| a.contains("NM-SENDING"));
    while std::fs::metadata(&received).map_or(0, |m| m.len()) < 1 << 20 {
        assert!(started.elapsed() < LIMIT, "the host got less than 1 MiB: {}", read(&consoles[0]));
        std::thread::sleep(Duration::from_millis(50));
    }
    let rarp = dir.path().join("rarp");
    let capture = RarpCapture::start(&netns, &veth.peer, MAC, 120, &rarp);
    let mut qmp_source = Qmp::connect(&qmp_paths[0]);
    let _qmp_destination = Qmp::connect(&qmp_paths[1]);
    let info = qmp_source.migrate(&incoming, started + LIMIT, &mut || {
        daemon.assert_running("the daemon");
        format!("source QEMU: {}\ndaemon: {}", read(&logs[0]), daemon.stderr())
    });
    let at_switchover = std::fs::metadata(&received).map_or(0, |m| m.len());
    eprintln!(
        "migration completed: downtime {} ms, total time {} ms, with {at_switchover} bytes at the host",
        info["downtime"], info["total-time"]
    );
    let (sent_from, after) = wait_for("sending from the destination", &|_, b| b.contains("NM-SENT"));
    let _ = source.kill();
    let _ = source.wait();
    assert!(receiver.wait().unwrap().success(), "the host's receiver");
    let got = std::fs::read(&received).unwrap();
    assert!(at_switchover < got.len() as u64, "the transfer ended before the migration did");
    let sum = sent_from.lines().find(|l| l.contains("NM-SUM")).unwrap_or_default().to_owned();
    assert!(
        sum.ends_with(&format!("{} {}", sha256(&got), 10 << 20)),
        "the guest sent {sum}; the host got {} bytes of other data\n{after}",
        got.len()
    );
    // Linux took the announcement feature (bit 21) where offered, and announces its address
    // on a move; otherwise the daemon sent a RARP from it, which the host saw.
    let features = sent_from.lines().find(|l| l.contains("NM-FEATURES")).unwrap_or_default();
    let bits = features.split_whitespace().last().unwrap_or_default();
    let announce = if guest_announce { '1' } else { '0' };
    assert_eq!(bits.chars().nth(21), Some(announce), "GUEST_ANNOUNCE: {features}");
    // Linux reads the request to announce in the status word (STATUS, bit 16: QEMU's).
    assert_eq!(bits.chars().nth(16), Some('1'), "STATUS: {features}");
    if guest_announce {
        capture.stop();
    } else {
        let frame = capture.frame().unwrap_or_else(|| panic!("no RARP from {MAC} reached the host"));
        assert_eq!(frame[12..14], [0x80, 0x35], "a RARP frame: {frame:02x?}");
        assert!(daemon.stderr().contains(&format!("announced {MAC} with a RARP")), "{}", daemon.stderr());
    }
    // The host reaches the guest on the destination's NIC, which carried frames both ways.
    let ping = netns.command("busybox").args(["ping", "-c", "3", "-W", "2", "10.0.0.1"]).output().unwrap();
    assert!(
        ping.status.success(),
        "the host pings the moved guest: {}",
        String::from_utf8_lossy(&ping.stdout)
    );
    let (status, body) = http(&api, "GET", "/nics/b", None);
    assert_eq!(status, 200, "{body}");
    let nic: serde_json::Value = serde_json::from_str(&body).unwrap();
    let counters = &nic["counters"];
    assert!(counters["tx_frames"].as_u64() > Some(3) && counters["rx_frames"].as_u64() > Some(3), "{nic}");
    assert_eq!(nic["shares-mac-with"], "a", "{nic}");
    daemon.assert_running("the daemon");
    let log = daemon.stderr();
    assert!(
        log.contains("logs the guest pages it writes"),
        "the source's rings logged while migrating: {log}"
    );
}
