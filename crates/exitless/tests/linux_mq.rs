//! Multiqueue with Linux: a guest with 2 vCPUs (QEMU TCG, Debian's cloud kernel) on a disk of
//! `exitless vhost-user-blk` with `queues=2` and `num-queues=2`, running fio with crc32c verify
//! from each CPU (blk-mq maps each CPU to its own queue), in every `--io-mode`. The daemon's
//! control API then shows both queues served, and neither job saw an error.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use test_infra::daemon::Daemon;
use test_infra::linux::{initramfs_in, kernel, FIO, INIT_MOUNTS};
use test_infra::qemu::Qemu;

/// A guest still running after this is stuck (about 30 s under TCG on this 2-CPU host).
const LIMIT: Duration = Duration::from_secs(300);

/// The guest's /init after `INIT_MOUNTS`: one fio job pinned to each CPU, each writing its own range with
/// crc32c checksums and reading it back; the hardware queues Linux made and fio's result.
const INIT: &str = r#"
fail() { echo "MQ-FAIL $*"; dmesg | tail -30; poweroff -f; }
for m in $(cat /modules); do insmod /lib/modules/$m || fail insmod-$m; done
i=0
while [ ! -b /dev/vda ]; do sleep 0.1; i=$((i + 1)); [ $i -gt 100 ] && fail "no vda"; done
echo "MQ-CPUS $(grep -c ^processor /proc/cpuinfo) MQ-QUEUES $(ls /sys/block/vda/mq | wc -l)"
/usr/bin/fio --ioengine=libaio --iodepth=8 --direct=1 --rw=randwrite --bsrange=4k-64k \
    --verify=crc32c --filename=/dev/vda --size=16m \
    --name=cpu0 --cpus_allowed=0 --offset=0 --name=cpu1 --cpus_allowed=1 --offset=16m \
    > /tmp/fio 2>&1 || { cat /tmp/fio; fail fio; }
[ "$(grep -c ': err= 0: ' /tmp/fio)" = 2 ] && ! grep -q 'verify failed' /tmp/fio || { cat /tmp/fio; fail fio-jobs; }
dmesg | grep -iE 'i/o error|blk_update_request' && fail dmesg
echo MQ-DONE
poweroff -f
"#;

fn disk_figures(api: &Path) -> serde_json::Value {
    let mut stream = UnixStream::connect(api).unwrap();
    stream.write_all(b"GET /disks/mq HTTP/1.1\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"))
}

fn two_queues_from_two_cpus(mode: &str) {
    let _serial = test_infra::one_at_a_time();
    let kernel = kernel();
    let dir = tempfile::tempdir().unwrap();
    let initramfs = initramfs_in(dir.path(), &kernel, &format!("{INIT_MOUNTS}{INIT}"), &[FIO]);
    let image = test_infra::disk_file(dir.path(), "disk.img", 64 << 20);
    let (socket, api) = (dir.path().join("mq.sock"), dir.path().join("api.sock"));
    let mut daemon = Daemon::builder()
        .disk_on(&socket, &format!("path={},direct,queues=2,name=mq", image.display()))
        .io_mode(mode)
        .api_socket(&api)
        .start(&dir.path().join("daemon.log"));
    let console = dir.path().join("console.log");
    let mut qemu = Qemu::linux(&kernel, &initramfs, "512M", 2, "")
        .vhost_user_blk_with(&socket, "", ",num-queues=2")
        .spawn(&console, std::fs::File::create(dir.path().join("qemu.log")).unwrap());
    let started = Instant::now();
    let read_console = || String::from_utf8_lossy(&std::fs::read(&console).unwrap_or_default()).into_owned();
    let status = loop {
        if let Some(status) = qemu.try_wait().unwrap() {
            break status;
        }
        daemon.assert_alive();
        if started.elapsed() > LIMIT || read_console().contains("MQ-FAIL") {
            let _ = qemu.kill();
            let _ = qemu.wait();
            panic!("{mode}: the guest failed or hung: {}\ndaemon: {}", read_console(), daemon.log());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = read_console();
    assert!(status.success(), "{mode}: QEMU: {status}");
    assert!(output.contains("MQ-CPUS 2 MQ-QUEUES 2"), "{mode}: Linux made one queue per CPU: {output}");
    assert!(output.contains("MQ-DONE"), "{mode}: {output}");
    let disk = disk_figures(&api);
    let per_queue: Vec<u64> =
        disk["queue_requests"].as_array().unwrap().iter().map(|n| n.as_u64().unwrap()).collect();
    assert_eq!(per_queue.len(), 2, "{disk}");
    // Each fio job writes and reads back 16 MiB in blocks of at most 64 KiB: 512 requests at least.
    assert!(per_queue.iter().all(|&n| n >= 512), "{mode}: both queues served: {per_queue:?}");
    let figures = &disk["figures"];
    assert_eq!((figures["io_errors"].as_u64(), figures["rejected"].as_u64()), (Some(0), Some(0)), "{disk}");
    let log = daemon.stop();
    assert!(!log.contains("needs a reset"), "{log}");
    eprintln!("{mode}: requests per queue {per_queue:?}, {:.1} s", started.elapsed().as_secs_f64());
}

#[test]
fn two_queues_from_two_cpus_sidecore() {
    two_queues_from_two_cpus("sidecore");
}

#[test]
fn two_queues_from_two_cpus_adaptive() {
    two_queues_from_two_cpus("adaptive");
}

#[test]
fn two_queues_from_two_cpus_eventfd() {
    two_queues_from_two_cpus("eventfd");
}
