//! Two Linux guests (QEMU TCG, virtio-net-pci over `-netdev vhost-user`) on one
//! `exitless vhost-user-net` daemon talk to each other through its switch, and to a host (a
//! network namespace of the test's own) through its uplink, a veth pair: they ping each other
//! and the host with small and MTU-sized frames; one sends the other 4 MiB over TCP and the host
//! sends it 1 MiB, both checksummed. Needs what scripts/setup.sh installs (qemu-system-x86,
//! linux-image-cloud-amd64, busybox-static, iproute2, ethtool).

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use test_infra::console::Console;
use test_infra::linux::{initramfs, kernel_with, INIT_MOUNTS};
use test_infra::net::{Netns, Veth};
use test_infra::qemu::Qemu;

/// Both guests boot and ping within about 30 s under TCG here; one not done after this is stuck.
const LIMIT: Duration = Duration::from_secs(300);
const MACS: [&str; 2] = ["52:54:00:00:00:01", "52:54:00:00:00:02"];
/// The host's address, on the far end of the uplink.
const HOST: &str = "10.0.0.100";
/// What the host sends guest 1 over TCP.
const HOST_BYTES: usize = 1 << 20;

/// After `INIT_MOUNTS`: the guest's own address and its peer's come from the kernel command
/// line (`exitless.me=N exitless.peer=M`); the NIC is up and the peer answers a ping.
const NET_UP: &str = r#"
for m in $(cat /modules); do insmod /lib/modules/$m; done
fail() { echo "LN-FAIL $*"; dmesg | tail -20; sleep 3600; }
arg() { sed -n "s/.*exitless\.$1=\([0-9]*\).*/\1/p" /proc/cmdline; }
me=$(arg me); peer=$(arg peer)
ip link set lo up
i=0
while ! ip link set eth0 up 2>/dev/null; do sleep 0.1; i=$((i + 1)); [ $i -gt 100 ] && fail "no eth0"; done
ip addr add 10.0.0.$me/24 dev eth0 || fail "address"
i=0
until ping -c 1 -W 1 10.0.0.$peer >/dev/null 2>&1; do i=$((i + 1)); [ $i -gt 120 ] && fail "10.0.0.$peer unreachable"; done
"#;

/// After `NET_UP`: pings, guest to guest and to the host; 4 MiB from guest 1 to guest 2 and 1 MiB
/// from the host to guest 1 over TCP, checksummed.
const INIT: &str = r#"
ping -c 5 -i 0.2 -W 2 10.0.0.$peer > /tmp/small || fail "small pings"
echo "LN-SMALL $(grep -o '[0-9]* packets received' /tmp/small)"
# 1472 bytes of ICMP payload: 1500-byte IP packets, 1514-byte frames.
ping -c 5 -i 0.2 -W 2 -s 1472 10.0.0.$peer > /tmp/big || fail "MTU-sized pings"
echo "LN-BIG $(grep -o '[0-9]* packets received' /tmp/big)"
ping -c 3 -i 0.2 -W 2 -s 1472 10.0.0.100 > /tmp/host || fail "pings to the host"
echo "LN-HOST $(grep -o '[0-9]* packets received' /tmp/host)"
# 4 MiB over TCP, guest 1 to guest 2: both print the bytes' checksum and count.
if [ $me = 2 ]; then
    nc -l -p 5000 > /tmp/got || fail "nc -l"
    echo "LN-SUM $(sha256sum < /tmp/got | cut -d' ' -f1) $(wc -c < /tmp/got)"
else
    # And the host's 1 MiB, at the same time.
    nc -l -p 5001 > /tmp/from-host &
    listener=$!
    echo LN-LISTENING
    dd if=/dev/urandom of=/tmp/data bs=64k count=64 2>/dev/null
    echo "LN-SUM $(sha256sum < /tmp/data | cut -d' ' -f1) $(wc -c < /tmp/data)"
    i=0
    until nc -w 5 10.0.0.$peer 5000 < /tmp/data; do i=$((i + 1)); [ $i -gt 50 ] && fail "nc"; sleep 0.2; done
    wait $listener || fail "nc -l from the host"
    echo "LN-HOSTSUM $(sha256sum < /tmp/from-host | cut -d' ' -f1) $(wc -c < /tmp/from-host)"
fi
echo LN-DONE
sleep 3600
"#;

fn wait_for_path(path: &Path, daemon: &mut Console) {
    let started = Instant::now();
    while !path.exists() {
        daemon.assert_running("the daemon");
        assert!(started.elapsed() < Duration::from_secs(10), "no {} after 10 s", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The host: a namespace on the far end of a veth pair whose near end is the uplink, with
/// segmentation offloads off (the switch takes frames of at most 1518 bytes), checksum offload
/// left on (the switch fills the checksums in).
fn host() -> (Netns, Veth) {
    let (netns, veth) = (Netns::create(), Veth::create());
    veth.peer_into(&netns, &format!("{HOST}/24"));
    let ethtool = netns.command("ethtool").args(["-K", &veth.peer, "tso", "off", "gso", "off"]).status();
    assert!(ethtool.is_ok_and(|s| s.success()), "ethtool (installed by setup) turns TSO and GSO off");
    (netns, veth)
}

/// Send `data` from the host to guest 1's port 5001 (it listens, or is about to), and wait for
/// guest 1 to close the connection: the sending socket stays open until everything is acked.
fn send_from_host(netns: &Netns, data: &[u8], dir: &Path) {
    let file = dir.join("from-host");
    std::fs::write(&file, data).unwrap();
    let send = format!(
        r#"
import socket, sys, time
data = open("{}", "rb").read()
for attempt in range(50):
    try:
        s = socket.create_connection(("10.0.0.1", 5001), timeout=120)
        break
    except ConnectionRefusedError:
        time.sleep(0.2)
else:
    sys.exit("guest 1 never listened")
s.sendall(data)
s.shutdown(socket.SHUT_WR)
while s.recv(4096):
    pass
"#,
        file.display()
    );
    let sent = netns.command("python3").args(["-c", &send]).status().unwrap();
    assert!(sent.success(), "the host's send to guest 1");
}

#[test]
fn two_linux_guests_ping_and_move_data_over_tcp_through_the_switch() {
    let _serial = test_infra::one_at_a_time();
    let kernel = kernel_with(&["virtio_pci", "virtio_net"]);
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let initramfs_path = dir.path().join("initramfs.cpio");
    initramfs(&kernel, &format!("{INIT_MOUNTS}{NET_UP}{INIT}"), &initramfs_path);
    let sockets = [dir.path().join("a.sock"), dir.path().join("b.sock")];
    let mut command = Command::new(test_infra::exitless_bin());
    let (netns, veth) = host();
    command.args(["vhost-user-net", "--uplink", &veth.ours]);
    for (socket, mac) in sockets.iter().zip(MACS) {
        command.args(["--nic", &format!("socket={},mac={mac}", socket.display())]);
    }
    let mut daemon = Console::spawn(&mut command, &dir.path().join("daemon.log"));
    for socket in &sockets {
        wait_for_path(socket, &mut daemon);
    }
    let mut guests: Vec<Console> = (0..2)
        .map(|i| {
            let append = format!("exitless.me={} exitless.peer={}", i + 1, 2 - i);
            let qemu = Qemu::linux(&kernel, &initramfs_path, "256M", 1, &append)
                .vhost_user_net(&sockets[i], MACS[i]);
            qemu.spawn_console(&dir.path().join(format!("qemu{i}.log")))
        })
        .collect();
    let started = Instant::now();
    let listening = guests[0].wait_for(LIMIT, |l| l.contains("LN-LISTENING") || l.contains("LN-FAIL"));
    assert!(listening.contains("LN-LISTENING"), "guest 0: {listening}\n{}", guests[0].seen.join("\n"));
    let from_host: Vec<u8> = (0..HOST_BYTES).map(|i| (i * 7 % 251) as u8).collect();
    send_from_host(&netns, &from_host, dir.path());
    for guest in ["10.0.0.1", "10.0.0.2"] {
        let ping = netns.command("busybox").args(["ping", "-c", "3", "-W", "2", guest]).output().unwrap();
        assert!(ping.status.success(), "the host pings {guest}: {}", String::from_utf8_lossy(&ping.stdout));
    }
    for (i, guest) in guests.iter_mut().enumerate() {
        let left = LIMIT.saturating_sub(started.elapsed());
        let line = guest.wait_for(left, |l| l.contains("LN-DONE") || l.contains("LN-FAIL"));
        assert!(line.contains("LN-DONE"), "guest {i}: {line}\n{}", guest.seen.join("\n"));
        for kind in ["LN-SMALL", "LN-BIG"] {
            let result = guest.seen.iter().find(|l| l.contains(kind)).cloned().unwrap_or_default();
            assert!(result.contains("5 packets received"), "guest {i}: {kind}: {result}");
        }
        let result = guest.seen.iter().find(|l| l.contains("LN-HOST ")).cloned().unwrap_or_default();
        assert!(result.contains("3 packets received"), "guest {i}: pings to the host: {result}");
    }
    let expected = format!("LN-HOSTSUM {} {HOST_BYTES}", sha256(&from_host));
    let got = guests[0].seen.iter().find(|l| l.contains("LN-HOSTSUM")).cloned().unwrap_or_default();
    assert!(got.ends_with(&expected), "what guest 1 received from the host: {got}, expected {expected}");
    let sums: Vec<String> = guests
        .iter()
        .map(|g| g.seen.iter().find(|l| l.contains("LN-SUM")).cloned().unwrap_or_default())
        .map(|l| l[l.find("LN-SUM").unwrap_or(0)..].to_owned())
        .collect();
    assert!(sums[0].ends_with(" 4194304"), "the sender's data: {sums:?}");
    assert_eq!(sums[0], sums[1], "what guest 2 received is not what guest 1 sent");
    eprintln!(
        "both guests pinged each other and the host and moved 4 MiB and 1 MiB over TCP in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    daemon.assert_running("the daemon");
    drop(guests);
    let log = daemon.stderr();
    assert!(log.contains("on the switch as port"), "no port on the switch: {log}");
}

/// sha256sum's digest of `data`.
fn sha256(data: &[u8]) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(data).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).split(' ').next().unwrap_or_default().to_owned()
}

/// After `NET_UP`: 16 MiB from guest 1 to guest 2 over TCP, checksummed; guest 1 says when it
/// starts sending.
const RESTART_INIT: &str = r#"
if [ $me = 2 ]; then
    nc -l -p 5000 > /tmp/got || fail "nc -l"
    echo "LN-SUM $(sha256sum < /tmp/got | cut -d' ' -f1) $(wc -c < /tmp/got)"
else
    dd if=/dev/urandom of=/tmp/data bs=64k count=256 2>/dev/null
    echo "LN-SUM $(sha256sum < /tmp/data | cut -d' ' -f1) $(wc -c < /tmp/data)"
    echo LN-SENDING
    i=0
    until nc 10.0.0.$peer 5000 < /tmp/data; do i=$((i + 1)); [ $i -gt 50 ] && fail "nc"; sleep 0.2; done
fi
echo LN-DONE
sleep 3600
"#;

/// The daemon killed (SIGKILL) in the middle of a TCP transfer between two Linux guests and
/// started again on the same sockets: QEMU connects to the new one (`reconnect=1`), the guests'
/// NICs go on where their rings stopped, and the transfer completes, every byte right.
#[test]
fn a_tcp_transfer_survives_the_daemon_killed_and_started_again() {
    let _serial = test_infra::one_at_a_time();
    let kernel = kernel_with(&["virtio_pci", "virtio_net"]);
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let initramfs_path = dir.path().join("initramfs.cpio");
    initramfs(&kernel, &format!("{INIT_MOUNTS}{NET_UP}{RESTART_INIT}"), &initramfs_path);
    let sockets = [dir.path().join("a.sock"), dir.path().join("b.sock")];
    let daemon = |log: &str| {
        let mut command = Command::new(test_infra::exitless_bin());
        command.arg("vhost-user-net");
        for (socket, mac) in sockets.iter().zip(MACS) {
            command.args(["--nic", &format!("socket={},mac={mac}", socket.display())]);
        }
        let mut daemon = Console::spawn(&mut command, &dir.path().join(log));
        for socket in &sockets {
            wait_for_path(socket, &mut daemon);
        }
        daemon
    };
    let first = daemon("daemon1.log");
    let mut guests: Vec<Console> = (0..2)
        .map(|i| {
            let append = format!("exitless.me={} exitless.peer={}", i + 1, 2 - i);
            let qemu = Qemu::linux(&kernel, &initramfs_path, "256M", 1, &append).vhost_user_net_with(
                &sockets[i],
                MACS[i],
                ",reconnect=1",
            );
            qemu.spawn_console(&dir.path().join(format!("qemu{i}.log")))
        })
        .collect();
    let sending = guests[0].wait_for(LIMIT, |l| l.contains("LN-SENDING") || l.contains("LN-FAIL"));
    assert!(sending.contains("LN-SENDING"), "guest 0: {sending}\n{}", guests[0].seen.join("\n"));
    // Frames are flowing: kill the daemon, and start another on the same sockets (the killed
    // one's socket files are stale; the new one replaces them).
    std::thread::sleep(Duration::from_millis(300));
    let (status, _) = first.kill(Duration::from_secs(10));
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    let mut second = daemon("daemon2.log");
    let started = Instant::now();
    for (i, guest) in guests.iter_mut().enumerate() {
        let line = guest.wait_for(LIMIT, |l| l.contains("LN-DONE") || l.contains("LN-FAIL"));
        assert!(
            line.contains("LN-DONE"),
            "guest {i}: {line}\n{}\n{}",
            guest.seen.join("\n"),
            second.stderr()
        );
    }
    let sums: Vec<String> = guests
        .iter()
        .map(|g| g.seen.iter().find(|l| l.contains("LN-SUM")).cloned().unwrap_or_default())
        .map(|l| l[l.find("LN-SUM").unwrap_or(0)..].to_owned())
        .collect();
    assert!(sums[0].ends_with(" 16777216"), "the sender's data: {sums:?}");
    assert_eq!(sums[0], sums[1], "what guest 2 received is not what guest 1 sent");
    eprintln!(
        "16 MiB over TCP across the daemon's restart, {:.1} s after it",
        started.elapsed().as_secs_f64()
    );
    second.assert_running("the second daemon");
    drop(guests);
    let log = second.stderr();
    assert!(log.matches("on the switch as port").count() >= 2, "both NICs on the new switch: {log}");
}
