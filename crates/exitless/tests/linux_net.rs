//! Two Linux guests (QEMU TCG, virtio-net-pci over `-netdev vhost-user`) on one
//! `exitless vhost-user-net` daemon talk to each other through its switch, and to a host (a
//! network namespace of the test's own) through its uplink, a veth pair: they ping each other
//! and the host with small and MTU-sized frames, and each other with jumbo frames (NICs of a
//! 9000-byte MTU, which QEMU's `host_mtu` gives the guests); one sends the other 4 MiB over TCP and the host
//! 1 MiB, and the host sends it 1 MiB, all checksummed. Linux takes every offload the daemon
//! offers (checksums, TCP super-frames, merged receive buffers): between two such guests the
//! switch passes super-frames on as they are; to a guest whose NIC has them off, and to the host,
//! it cuts them into segments. Needs what scripts/setup.sh installs (qemu-system-x86,
//! linux-image-cloud-amd64, busybox-static, iproute2, ethtool).

use std::ffi::OsStr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use test_infra::api::http;
use test_infra::console::Console;
use test_infra::linux::{initramfs, kernel_with, Kernel, INIT_MOUNTS};
use test_infra::net::{Netns, Veth};
use test_infra::qemu::Qemu;
use test_infra::sha256;

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
echo "LN-FEATURES $(cat /sys/class/net/eth0/device/features)"
i=0
until ping -c 1 -W 1 10.0.0.$peer >/dev/null 2>&1; do i=$((i + 1)); [ $i -gt 120 ] && fail "10.0.0.$peer unreachable"; done
"#;

/// After `NET_UP`: pings, guest to guest and to the host; 4 MiB from guest 1 to guest 2, 1 MiB
/// from the host to guest 1 and 1 MiB from guest 1 to the host over TCP, checksummed.
const INIT: &str = r#"
ping -c 5 -i 0.2 -W 2 10.0.0.$peer > /tmp/small || fail "small pings"
echo "LN-SMALL $(grep -o '[0-9]* packets received' /tmp/small)"
# 1472 bytes of ICMP payload: 1500-byte IP packets, 1514-byte frames.
ping -c 5 -i 0.2 -W 2 -s 1472 10.0.0.$peer > /tmp/big || fail "MTU-sized pings"
echo "LN-BIG $(grep -o '[0-9]* packets received' /tmp/big)"
# 8972 bytes of ICMP payload: 9000-byte IP packets, on the MTU the NIC's configuration gave.
ping -c 3 -i 0.2 -W 2 -s 8972 10.0.0.$peer > /tmp/jumbo || fail "jumbo pings"
echo "LN-JUMBO $(ip link show eth0 | grep -o 'mtu [0-9]*'), $(grep -o '[0-9]* packets received' /tmp/jumbo)"
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
    dd if=/dev/urandom of=/tmp/to-host bs=64k count=16 2>/dev/null
    echo "LN-TOHOSTSUM $(sha256sum < /tmp/to-host | cut -d' ' -f1) $(wc -c < /tmp/to-host)"
    i=0
    until nc -w 5 10.0.0.100 5002 < /tmp/to-host; do i=$((i + 1)); [ $i -gt 50 ] && fail "nc to the host"; sleep 0.2; done
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

/// `exitless vhost-user-net` with `args`, and a NIC on each of `sockets` (addresses `MACS`,
/// named `one` and `two`, with `nic` added to their options), its output in `log`; once both
/// sockets are there.
fn start_daemon(sockets: &[PathBuf; 2], nic: &str, args: &[&OsStr], log: &Path) -> Console {
    let mut command = Command::new(test_infra::exitless_bin());
    command.arg("vhost-user-net").args(args);
    for ((socket, mac), name) in sockets.iter().zip(MACS).zip(["one", "two"]) {
        command.args(["--nic", &format!("socket={},mac={mac},name={name}{nic}", socket.display())]);
    }
    let mut daemon = Console::spawn(&mut command, log);
    for socket in sockets {
        wait_for_path(socket, &mut daemon);
    }
    daemon
}

/// The two guests, each with `vcpus` CPUs, booting `initramfs`, told their address and their
/// peer's; `nic` adds guest `i`'s NIC to its QEMU.
fn start_guests(
    kernel: &Kernel,
    initramfs: &Path,
    vcpus: u32,
    dir: &Path,
    nic: impl Fn(Qemu, usize) -> Qemu,
) -> Vec<Console> {
    (0..2)
        .map(|i| {
            let append = format!("exitless.me={} exitless.peer={}", i + 1, 2 - i);
            let qemu = nic(Qemu::linux(kernel, initramfs, "256M", vcpus, &append), i);
            qemu.spawn_console(&dir.join(format!("qemu{i}.log")))
        })
        .collect()
}

/// The host: a namespace on the far end of a veth pair whose near end is the uplink, its
/// offloads as Linux sets them: its TCP sends super-frames of up to 64 KiB (TSO, GSO) and
/// leaves checksums to the switch, which passes them on to a guest that takes them and cuts or
/// finishes them for one that does not.
fn host() -> (Netns, Veth) {
    let (netns, veth) = (Netns::create(), Veth::create());
    veth.peer_into(&netns, &format!("{HOST}/24"));
    let features =
        netns.command("ethtool").args(["-k", &veth.peer]).output().expect("ethtool (installed by setup)");
    let features = String::from_utf8_lossy(&features.stdout);
    assert!(
        features.contains("tcp-segmentation-offload: on"),
        "the host's veth sends super-frames: {features}"
    );
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

/// Receive one TCP connection's bytes on the host's port 5002 into `dir/to-host`, in the
/// background.
fn receive_on_host(netns: &Netns, dir: &Path) -> (std::process::Child, std::path::PathBuf) {
    let file = dir.join("to-host");
    (test_infra::net::receive_tcp(netns, (HOST, 5002), &file), file)
}

/// The offload feature bits (virtio 1.x §5.1.3) a driver took: CSUM, GUEST_CSUM, GUEST_TSO4,
/// GUEST_TSO6, HOST_TSO4, HOST_TSO6, MRG_RXBUF, as sysfs lists a virtio device's features (one
/// character per bit, from bit 0).
fn offload_bits(features_line: &str) -> String {
    let bits = features_line.split_whitespace().last().unwrap_or_default();
    [0, 1, 7, 8, 11, 12, 15].iter().map(|&bit| bits.chars().nth(bit).unwrap_or('?')).collect()
}

/// QEMU's virtio-net-pci options that turn every offload off.
const NO_OFFLOADS: &str = ",csum=off,guest_csum=off,gso=off,guest_tso4=off,guest_tso6=off,guest_ecn=off,\
guest_ufo=off,host_tso4=off,host_tso6=off,host_ecn=off,host_ufo=off,mrg_rxbuf=off";

/// Both guests take every offload: TCP super-frames go from one to the other as they are, over
/// merged receive buffers.
#[test]
fn two_linux_guests_ping_and_move_data_over_tcp_through_the_switch() {
    guests_ping_and_move_data(false, 1);
}

/// The same with `--iocores 2`: each guest's NIC on a switch of its own IOCore, the uplink on
/// the first. Frames between the guests cross between the two switches, super-frames cut into
/// segments on the way.
#[test]
fn two_linux_guests_on_two_iocores_ping_and_move_data_over_tcp() {
    guests_ping_and_move_data(false, 2);
}

/// Guest 2's NIC has every offload off: the switch fills in guest 1's checksums and cuts its
/// super-frames into segments for it.
#[test]
fn a_guest_without_offloads_gets_the_others_super_frames_cut_into_segments() {
    guests_ping_and_move_data(true, 1);
}

fn guests_ping_and_move_data(guest_2_without_offloads: bool, iocores: u16) {
    let _serial = test_infra::one_at_a_time();
    let kernel = kernel_with(&["virtio_pci", "virtio_net"]);
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let initramfs_path = dir.path().join("initramfs.cpio");
    initramfs(&kernel, &format!("{INIT_MOUNTS}{NET_UP}{INIT}"), &initramfs_path);
    let sockets = [dir.path().join("a.sock"), dir.path().join("b.sock")];
    let (netns, veth) = host();
    let api = dir.path().join("api.sock");
    let iocores_arg = iocores.to_string();
    let args = [
        "--uplink".as_ref(),
        veth.ours.as_ref(),
        "--api-socket".as_ref(),
        api.as_os_str(),
        "--iocores".as_ref(),
        iocores_arg.as_ref(),
    ];
    // Jumbo frames: the NICs' MTU is 9000, and QEMU gives the guests that (the daemon checks).
    let mut daemon = start_daemon(&sockets, ",mtu=9000", &args, &dir.path().join("daemon.log"));
    let mut guests = start_guests(&kernel, &initramfs_path, 1, dir.path(), |qemu, i| {
        let offloads = if i == 1 && guest_2_without_offloads { NO_OFFLOADS } else { "" };
        qemu.vhost_user_net_with(&sockets[i], MACS[i], "", &format!(",host_mtu=9000{offloads}"))
    });
    let (mut receiver, to_host) = receive_on_host(&netns, dir.path());
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
        let jumbo = guest.seen.iter().find(|l| l.contains("LN-JUMBO")).cloned().unwrap_or_default();
        assert!(jumbo.contains("mtu 9000, 3 packets received"), "guest {i}: jumbo pings: {jumbo}");
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
    assert!(receiver.wait().unwrap().success(), "the host's receiver");
    let to_host = std::fs::read(&to_host).unwrap();
    let sent = guests[0].seen.iter().find(|l| l.contains("LN-TOHOSTSUM")).cloned().unwrap_or_default();
    assert!(
        sent.ends_with(&format!("{} {}", sha256(&to_host), 1 << 20)),
        "guest 1 sent {sent}, the host got other bytes"
    );

    // What the drivers took, and what the switch did for them.
    let features: Vec<String> = guests
        .iter()
        .map(|g| {
            offload_bits(&g.seen.iter().find(|l| l.contains("LN-FEATURES")).cloned().unwrap_or_default())
        })
        .collect();
    let guest_2_features = if guest_2_without_offloads { "0000000" } else { "1111111" };
    assert_eq!(features, ["1111111", guest_2_features], "offload bits the drivers took");
    let counters = |name: &str| {
        let (status, body) = http(&api, "GET", &format!("/nics/{name}"), None);
        assert_eq!(status, 200, "{body}");
        let nic: serde_json::Value = serde_json::from_str(&body).unwrap();
        let counter = |key: &str| nic["counters"][key].as_u64().unwrap_or_else(|| panic!("{key}: {body}"));
        ["tx_frames", "tx_segmented", "tx_checksummed", "rx_frames", "rx_buffers"].map(counter)
    };
    let [tx_frames, tx_segmented, _, _, _] = counters("one");
    let [_, _, _, rx_frames, rx_buffers] = counters("two");
    // The host's 1 MiB went out in segments either way; 4 MiB to guest 2 too when it takes no
    // super-frame, or when it is on another IOCore. Cut into segments of the 9000-byte MTU,
    // 4 MiB is about 470 frames; of the 1500-byte one, about 2,900.
    match guest_2_without_offloads || iocores > 1 {
        true => assert!(
            tx_segmented > 2 && (460..2_800).contains(&rx_frames),
            "{tx_segmented} cut, {rx_frames} received"
        ),
        false => assert!(
            tx_frames < 2_900 && rx_buffers > rx_frames,
            "{tx_frames} sent, {rx_frames} in {rx_buffers}"
        ),
    }
    eprintln!(
        "both guests pinged each other and the host and moved 4 MiB, 1 MiB and 1 MiB over TCP in {:.1} s; \
         offloads {features:?}; guest 1 sent {tx_frames} frames ({tx_segmented} cut by the switch), \
         guest 2 received {rx_frames} in {rx_buffers} buffers",
        started.elapsed().as_secs_f64()
    );
    let (status, metrics) = http(&api, "GET", "/metrics", None);
    assert_eq!(status, 200, "{metrics}");
    // The host's TCP sent its 1 MiB in super-frames, which the uplink took.
    let super_frames = metrics
        .lines()
        .find(|l| l.starts_with("exitless_uplink_rx_super_frames_total"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
    assert!(super_frames.is_some_and(|n| n > 0), "no super-frame from the host: {metrics}");
    // And guest 1's TCP sent its 1 MiB to the host in super-frames, which the uplink passed on
    // whole, for the host's kernel to cut; unless its NIC is on the other IOCore, whose switch
    // cuts them before they cross to the uplink's.
    let sent_whole = metrics
        .lines()
        .find(|l| l.starts_with("exitless_uplink_tx_super_frames_total"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
    if iocores == 1 {
        assert!(sent_whole.is_some_and(|n| n > 0), "no super-frame to the host: {metrics}");
    }
    for k in 0..iocores {
        let sample = format!("exitless_iocore_cpu_seconds_total{{iocore=\"{k}\"}}");
        assert!(metrics.contains(&sample), "no {sample}: {metrics}");
    }
    daemon.assert_running("the daemon");
    drop(guests);
    let log = daemon.stderr();
    assert!(log.contains("on the switch as port"), "no port on the switch: {log}");
    assert!(log.contains(&format!("{iocores} switch IOCore(s) serve")), "{log}");
    for k in 0..iocores {
        assert!(log.contains(&format!("(IOCore {k})")), "no NIC on IOCore {k}: {log}");
    }
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

/// How the daemon serving a TCP transfer is replaced.
#[derive(Clone, Copy, PartialEq)]
enum Replaced {
    /// SIGKILLed and started again on the same sockets: QEMU connects again (`reconnect=1`).
    Killed,
    /// A successor takes the NICs over (`--handover-socket`), QEMU's connections with them:
    /// QEMU has no `reconnect`, so a hang-up would leave its NIC without a backend for good.
    HandedOver,
}

test_infra::tests! {
    /// The daemon killed (SIGKILL) in the middle of a TCP transfer between two Linux guests and
    /// started again on the same sockets: QEMU connects to the new one (`reconnect=1`), the
    /// guests' NICs go on where their rings stopped, and the transfer completes, every byte right.
    a_tcp_transfer_survives_the_daemon_killed_and_started_again =>
        a_tcp_transfer_survives_the_daemon(Replaced::Killed);
    /// A new daemon takes the NICs over in the middle of a TCP transfer between two Linux guests:
    /// the old one exits by itself, QEMU never sees a hang-up, and the transfer completes, every
    /// byte right.
    a_tcp_transfer_survives_a_hand_over_to_a_new_daemon =>
        a_tcp_transfer_survives_the_daemon(Replaced::HandedOver);
}

fn a_tcp_transfer_survives_the_daemon(replaced: Replaced) {
    let _serial = test_infra::one_at_a_time();
    let kernel = kernel_with(&["virtio_pci", "virtio_net"]);
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let initramfs_path = dir.path().join("initramfs.cpio");
    initramfs(&kernel, &format!("{INIT_MOUNTS}{NET_UP}{RESTART_INIT}"), &initramfs_path);
    let sockets = [dir.path().join("a.sock"), dir.path().join("b.sock")];
    let handover = dir.path().join("handover.sock");
    let handover_args = [OsStr::new("--handover-socket"), handover.as_os_str()];
    let args: &[&OsStr] = if replaced == Replaced::HandedOver { &handover_args } else { &[] };
    // 2 MB/s a NIC: 16 MiB take 7 s at least, so the replacement below comes in the middle of
    // the transfer however fast the guests run.
    let daemon = |log: &str| start_daemon(&sockets, ",bw=2M", args, &dir.path().join(log));
    let mut first = daemon("daemon1.log");
    let reconnect = if replaced == Replaced::Killed { ",reconnect=1" } else { "" };
    let mut guests = start_guests(&kernel, &initramfs_path, 1, dir.path(), |qemu, i| {
        qemu.vhost_user_net_with(&sockets[i], MACS[i], reconnect, "")
    });
    let sending = guests[0].wait_for(LIMIT, |l| l.contains("LN-SENDING") || l.contains("LN-FAIL"));
    assert!(sending.contains("LN-SENDING"), "guest 0: {sending}\n{}", guests[0].seen.join("\n"));
    // Frames are flowing: replace the daemon.
    std::thread::sleep(Duration::from_millis(300));
    let mut second = match replaced {
        Replaced::Killed => {
            let (status, _) = first.kill(Duration::from_secs(10));
            assert_eq!(status.signal(), Some(libc::SIGKILL));
            // The killed one's socket files are stale; the new one replaces them.
            daemon("daemon2.log")
        }
        Replaced::HandedOver => {
            wait_for_path(&handover, &mut first);
            let second = daemon("daemon2.log");
            let (status, _) = first.finish(Duration::from_secs(60));
            let log = std::fs::read_to_string(dir.path().join("daemon1.log")).unwrap_or_default();
            assert!(status.success(), "the old daemon exits once it handed over: {status}\n{log}");
            let handed = log.lines().find(|l| l.contains("handed every NIC over to the successor"));
            eprintln!("{}", handed.unwrap_or_else(|| panic!("the old daemon did not hand over: {log}")));
            second
        }
    };
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
        "16 MiB over TCP across the daemon's replacement, {:.1} s after it",
        started.elapsed().as_secs_f64()
    );
    second.assert_running("the second daemon");
    drop(guests);
    let log = second.stderr();
    assert!(log.matches("on the switch as port").count() >= 2, "both NICs on the new switch: {log}");
    if replaced == Replaced::HandedOver {
        assert!(log.contains("took every NIC over"), "{log}");
        assert!(!log.contains("frontend connected"), "QEMU connected again, so it was hung up on: {log}");
    }
}

/// After `NET_UP`, on guests with two CPUs whose NICs have two queue pairs: guest 1 sends guest 2
/// eight TCP streams of 512 KiB at once, from fixed ports (`MQ_FLOWS`), from both CPUs in turn;
/// both then print what each of their queues carried (`ethtool -S`).
const MQ_INIT: &str = r#"
echo "LN-QUEUES $(ls -d /sys/class/net/eth0/queues/rx-* | wc -l)"
if [ $me = 2 ]; then
    # A listener's input must not end: busybox nc shuts the connection's sending side when it
    # does, and the sender's nc then stops sending.
    for i in 0 1 2 3 4 5 6 7; do sleep 3600 | nc -l -p $((5000 + i)) > /tmp/got$i & done
    for i in 0 1 2 3 4 5 6 7; do
        j=0
        while [ $(wc -c < /tmp/got$i) -lt 524288 ]; do j=$((j + 1)); [ $j -gt 600 ] && break; sleep 0.2; done
    done
    for i in 0 1 2 3 4 5 6 7; do echo "LN-GOT $(sha256sum < /tmp/got$i | cut -d' ' -f1) $(wc -c < /tmp/got$i)"; done
else
    dd if=/dev/urandom of=/tmp/data bs=64k count=8 2>/dev/null
    echo "LN-SENT $(sha256sum < /tmp/data | cut -d' ' -f1) $(wc -c < /tmp/data)"
    for i in 0 1 2 3 4 5 6 7; do
        (
            j=0
            until taskset -c $((i % 2)) nc -p $((6000 + i)) 10.0.0.$peer $((5000 + i)) < /tmp/data; do
                j=$((j + 1)); [ $j -gt 100 ] && fail "stream $i"; sleep 0.2
            done
        ) &
    done
    wait
fi
ethtool -S eth0 | grep -E '(rx|tx)_queue_[01]_packets' | tr -d ' ' | sed 's/^/LN-STAT /'
echo LN-DONE
sleep 3600
"#;

/// The streams of `MQ_INIT`: (guest 1's port, guest 2's port).
const MQ_FLOWS: [(u16, u16); 8] = [
    (6000, 5000),
    (6001, 5001),
    (6002, 5002),
    (6003, 5003),
    (6004, 5004),
    (6005, 5005),
    (6006, 5006),
    (6007, 5007),
];

/// What `ethtool -S` said a queue carried: `counter` is `rx_queue_0_packets` and the like.
fn queue_packets(guest: &Console, counter: &str) -> u64 {
    let prefix = format!("LN-STAT {counter}:");
    let line = guest.seen.iter().find_map(|l| l.find(&prefix).map(|at| l[at + prefix.len()..].to_owned()));
    line.and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {counter}: {}", guest.seen.join("\n")))
}

/// Two Linux guests with two CPUs each, their NICs with two queue pairs (`-netdev
/// vhost-user,queues=2`): Linux uses both pairs; guest 1 sends from both CPUs, so from both
/// transmit queues, and the switch spreads guest 2's flows over both its receive queues. Every
/// stream arrives whole.
#[test]
fn a_nic_with_two_queue_pairs_carries_frames_on_both() {
    let _serial = test_infra::one_at_a_time();
    // The flows hash onto both of guest 2's receive queues (as the switch will see them: IPv4
    // from 10.0.0.1 to 10.0.0.2), so each queue must carry some.
    let receive_queue = |(from, to): (u16, u16)| {
        let mut start = [0u8; 38];
        start[12..14].copy_from_slice(&[0x08, 0x00]);
        start[26..34].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        start[34..36].copy_from_slice(&from.to_be_bytes());
        start[36..38].copy_from_slice(&to.to_be_bytes());
        switch::ethernet::flow_of(&start) % 2
    };
    let queues: Vec<u32> = MQ_FLOWS.iter().map(|&flow| receive_queue(flow)).collect();
    assert!(
        queues.contains(&0) && queues.contains(&1),
        "the streams' flows all hash to one queue: {queues:?}"
    );

    let kernel = kernel_with(&["virtio_pci", "virtio_net"]);
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let initramfs = test_infra::linux::initramfs_in(
        dir.path(),
        &kernel,
        &format!("{INIT_MOUNTS}{NET_UP}{MQ_INIT}"),
        &[("/usr/sbin/ethtool", "ethtool")],
    );
    let sockets = [dir.path().join("a.sock"), dir.path().join("b.sock")];
    let mut daemon = start_daemon(&sockets, "", &[], &dir.path().join("daemon.log"));
    let mut guests = start_guests(&kernel, &initramfs, 2, dir.path(), |qemu, i| {
        qemu.vhost_user_net_pairs(&sockets[i], MACS[i], 2)
    });
    let started = Instant::now();
    for (i, guest) in guests.iter_mut().enumerate() {
        let left = LIMIT.saturating_sub(started.elapsed());
        let line = guest.wait_for(left, |l| l.contains("LN-DONE") || l.contains("LN-FAIL"));
        assert!(line.contains("LN-DONE"), "guest {i}: {line}\n{}", guest.seen.join("\n"));
        let queues = guest.seen.iter().find(|l| l.contains("LN-QUEUES")).cloned().unwrap_or_default();
        assert!(queues.ends_with("LN-QUEUES 2"), "guest {i} uses both queue pairs: {queues}");
    }
    let sent = guests[0].seen.iter().find_map(|l| l.find("LN-SENT ").map(|at| l[at + 8..].to_owned()));
    let sent = sent.expect("what guest 1 sent");
    let got: Vec<String> =
        guests[1].seen.iter().filter_map(|l| l.find("LN-GOT ").map(|at| l[at + 7..].to_owned())).collect();
    assert_eq!(
        got,
        vec![sent.clone(); 8],
        "the eight streams guest 2 received; guest 1:\n{}\nguest 2:\n{}\ndaemon:\n{}",
        guests[0].seen.join("\n"),
        guests[1].seen.join("\n"),
        daemon.stderr()
    );
    let [tx0, tx1] = ["tx_queue_0_packets", "tx_queue_1_packets"].map(|c| queue_packets(&guests[0], c));
    let [rx0, rx1] = ["rx_queue_0_packets", "rx_queue_1_packets"].map(|c| queue_packets(&guests[1], c));
    assert!(tx0 > 0 && tx1 > 0, "guest 1 sent on both transmit queues: {tx0} and {tx1}");
    assert!(rx0 > 0 && rx1 > 0, "guest 2 received on both receive queues: {rx0} and {rx1}");
    eprintln!(
        "eight streams of 512 KiB over two queue pairs in {:.1} s: guest 1 sent {tx0} and {tx1} frames on its \
         transmit queues, guest 2 received {rx0} and {rx1} on its receive queues",
        started.elapsed().as_secs_f64()
    );
    daemon.assert_running("the daemon");
}
