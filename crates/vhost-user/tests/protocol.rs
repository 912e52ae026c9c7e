//! The vhost-user backend against a test frontend over a real Unix socket: memfd guest memory,
//! a hand-made virtqueue, eventfds, real IOCore threads and RAM disk backends. No VM.

use std::io::Write;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;

use iocore::Policy;
use test_infra::backend::{TestBackend, DISK_SIZE};
use test_infra::frontend::*;
use vhost_user::{Error, Server};
use vhost_user_protocol::message::{
    code, Header, MemoryRegion, VringAddr, FLAG_NEED_REPLY, FLAG_REPLY, VERSION, VRING_NOFD,
};
use vmm_sys_util::eventfd::EventFd;

const FEATURES: u64 = F_VERSION_1 | F_EVENT_IDX | F_PROTOCOL_FEATURES | F_BLK_FLUSH | F_BLK_MQ | F_BLK_RO;

fn write_read_flush(frontend: &mut Frontend, queue: u16, sector: u64, data: &[u8]) {
    frontend.mem.write(DATA, data);
    assert_eq!(frontend.blk(queue, T_OUT, sector, 4096), 0, "write status");
    frontend.mem.write(DATA, &[0u8; 4096]);
    assert_eq!(frontend.blk(queue, T_IN, sector, 4096), 0, "read status");
    assert_eq!(frontend.mem.read(DATA, 4096), data, "read back what was written");
    assert_eq!(frontend.blk(queue, T_FLUSH, 0, 0), 0, "flush status");
}

#[test]
fn a_4k_write_and_read_through_the_ring_in_every_io_mode_and_across_reconnection() {
    let policies = [Policy::Notified, Policy::Adaptive { idle: Duration::from_micros(50) }, Policy::Polling];
    for (seed, policy) in policies.into_iter().enumerate() {
        let backend = TestBackend::start(policy, 1, false);
        let mut frontend = Frontend::connect(&backend.socket);
        let offered = frontend.negotiate(FEATURES);
        assert_eq!(
            offered & (F_VERSION_1 | F_EVENT_IDX | F_BLK_FLUSH),
            F_VERSION_1 | F_EVENT_IDX | F_BLK_FLUSH
        );
        assert_eq!(offered & (F_BLK_MQ | F_BLK_RO), 0, "one writable queue");
        assert_eq!(frontend.get_u64(code::GET_QUEUE_NUM), 1);
        // QEMU 7.2 reads the whole virtio_blk_config (60 bytes).
        let config = frontend.config(0, 60);
        assert_eq!(u64::from_le_bytes(config[0..8].try_into().unwrap()), DISK_SIZE / 512, "capacity");
        assert_eq!(u32::from_le_bytes(config[12..16].try_into().unwrap()), 128, "seg_max");
        assert_eq!(u32::from_le_bytes(config[20..24].try_into().unwrap()), 512, "blk_size");
        assert_eq!(u16::from_le_bytes(config[34..36].try_into().unwrap()), 1, "num_queues");
        assert_eq!(frontend.config(20, 4), 512u32.to_le_bytes(), "a read at an offset");
        frontend.set_mem_table();
        frontend.start_vring(0, 0);

        let data = pattern(seed as u8);
        write_read_flush(&mut frontend, 0, 8, &data);
        assert!(readable(frontend.vrings[0].call.as_raw_fd(), TIMEOUT), "the call eventfd was signalled");
        assert!(!readable(frontend.vrings[0].err.as_raw_fd(), Duration::ZERO), "no vring error");
        assert_eq!(frontend.stop_vring(0), 3, "three requests taken");
        assert_eq!(backend.disk_bytes(4096, 4096), data, "{policy:?}: the write is in the backend");

        // The ring restarts where it stopped on the same connection (as QEMU does when the
        // guest's device is stopped and started again).
        frontend.start_vring(0, 3);
        write_read_flush(&mut frontend, 0, 16, &pattern(seed as u8 + 100));
        drop(frontend);

        // A new frontend (a restarted QEMU: new memory, fresh rings) finds both writes.
        let mut frontend = Frontend::ready(&backend.socket, FEATURES, 0);
        frontend.mem.write(DATA, &[0u8; 4096]);
        assert_eq!(frontend.blk(0, T_IN, 8, 4096), 0);
        assert_eq!(frontend.mem.read(DATA, 4096), data, "{policy:?}: data survives the reconnection");
        assert_eq!(frontend.blk(0, T_IN, 16, 4096), 0);
        assert_eq!(frontend.mem.read(DATA, 4096), pattern(seed as u8 + 100));
    }
}

#[test]
fn several_queues_each_with_its_own_backend_on_one_disk() {
    let backend = TestBackend::start(Policy::Notified, 2, false);
    let mut frontend = Frontend::connect(&backend.socket);
    let offered = frontend.negotiate(FEATURES);
    assert_ne!(offered & F_BLK_MQ, 0);
    assert_eq!(frontend.get_u64(code::GET_QUEUE_NUM), 2);
    assert_eq!(u16::from_le_bytes(frontend.config(34, 2).try_into().unwrap()), 2, "num_queues");
    frontend.set_mem_table();
    frontend.start_vring(0, 0);
    frontend.start_vring(1, 0);
    let data = pattern(7);
    frontend.mem.write(DATA, &data);
    assert_eq!(frontend.blk(1, T_OUT, 40, 4096), 0);
    frontend.mem.write(DATA, &[0u8; 4096]);
    assert_eq!(frontend.blk(0, T_IN, 40, 4096), 0);
    assert_eq!(frontend.mem.read(DATA, 4096), data, "queue 0 reads what queue 1 wrote");
    // A new memory table moves running rings to it; they go on where they were.
    frontend.set_mem_table();
    write_read_flush(&mut frontend, 1, 48, &pattern(8));
    assert_eq!(frontend.stop_vring(1), 4);
    assert_eq!(frontend.stop_vring(0), 1);
}

#[test]
fn new_call_and_kick_descriptors_take_effect_on_a_running_ring() {
    // Notified: the IOCore sleeps on the kick eventfd, so a kick it did not switch to would
    // never be seen. QEMU replaces the call descriptor whenever the guest masks the vector.
    let backend = TestBackend::start(Policy::Notified, 1, false);
    let mut frontend = Frontend::ready(&backend.socket, FEATURES, 0);
    write_read_flush(&mut frontend, 0, 0, &pattern(4));
    let call = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    frontend.set(code::SET_VRING_CALL, &0u64.to_le_bytes(), &[call.as_raw_fd()]);
    let kick = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    frontend.set(code::SET_VRING_KICK, &0u64.to_le_bytes(), &[kick.as_raw_fd()]);
    let old_call = std::mem::replace(&mut frontend.vrings[0].call, call);
    let _old_kick = std::mem::replace(&mut frontend.vrings[0].kick, kick);
    while old_call.read().is_ok() {}
    write_read_flush(&mut frontend, 0, 8, &pattern(5));
    assert!(readable(frontend.vrings[0].call.as_raw_fd(), TIMEOUT), "the new call eventfd was signalled");
    assert!(old_call.read().is_err(), "the old call eventfd was not");
    assert_eq!(frontend.stop_vring(0), 6);
}

/// SET_VRING_KICK with VRING_NOFD: no kick descriptor, so "polling should be used instead".
/// Regression: an IOCore that sleeps (notified, or adaptive once idle) never looked at such a
/// ring again, and its first request waited for ever.
#[test]
fn a_ring_without_a_kick_descriptor_is_served_by_an_iocore_that_sleeps() {
    for policy in [Policy::Notified, Policy::Adaptive { idle: Duration::from_micros(50) }] {
        let backend = TestBackend::start(policy, 1, false);
        let mut frontend = Frontend::ready(&backend.socket, FEATURES, 0);
        frontend.set(code::SET_VRING_KICK, &VRING_NOFD.to_le_bytes(), &[]);
        // Long enough for an adaptive IOCore to have gone to sleep.
        std::thread::sleep(Duration::from_millis(50));
        write_read_flush(&mut frontend, 0, 0, &pattern(9));
        assert_eq!(frontend.stop_vring(0), 3, "{policy:?}: three requests taken");
    }
}

#[test]
fn a_read_only_disk_is_offered_read_only_and_refuses_writes() {
    let backend = TestBackend::start(Policy::Notified, 1, true);
    let mut frontend = Frontend::connect(&backend.socket);
    assert_ne!(frontend.negotiate(FEATURES) & F_BLK_RO, 0);
    frontend.set_mem_table();
    frontend.start_vring(0, 0);
    frontend.mem.write(DATA, &pattern(1));
    assert_eq!(frontend.blk(0, T_OUT, 0, 4096), 1, "VIRTIO_BLK_S_IOERR");
    assert_eq!(frontend.blk(0, T_IN, 0, 4096), 0);
    assert_eq!(frontend.mem.read(DATA, 4096), vec![0u8; 4096]);
    assert_eq!(backend.disk_bytes(0, 4096), vec![0u8; 4096]);
}

/// A WRITE_ZEROES of 8 sectors at sector 0: its one 16-byte segment at DATA.
fn write_zeroes(frontend: &mut Frontend) -> u8 {
    let mut segment = [0u8; 16];
    segment[8..12].copy_from_slice(&8u32.to_le_bytes());
    frontend.mem.write(DATA, &segment);
    frontend.blk(0, T_WRITE_ZEROES, 0, 16)
}

#[test]
fn write_zeroes_is_served_only_to_a_frontend_that_negotiated_it() {
    let backend = TestBackend::start(Policy::Notified, 1, false);
    let mut frontend = Frontend::ready(&backend.socket, FEATURES, 0);
    frontend.mem.write(DATA, &pattern(3));
    assert_eq!(frontend.blk(0, T_OUT, 0, 4096), 0);
    assert_eq!(write_zeroes(&mut frontend), 2, "VIRTIO_BLK_S_UNSUPP: the feature was offered, not taken");
    assert_eq!(backend.disk_bytes(0, 4096), pattern(3), "the data is untouched");
    drop(frontend);

    let mut frontend = Frontend::connect(&backend.socket);
    assert_ne!(frontend.negotiate(FEATURES | F_BLK_WRITE_ZEROES) & F_BLK_WRITE_ZEROES, 0);
    frontend.set_mem_table();
    frontend.start_vring(0, 0);
    assert_eq!(write_zeroes(&mut frontend), 0);
    assert_eq!(backend.disk_bytes(0, 4096), vec![0u8; 4096]);
}

#[test]
fn a_broken_ring_is_reported_through_the_error_eventfd() {
    let backend = TestBackend::start(Policy::Notified, 1, false);
    let mut frontend = Frontend::ready(&backend.socket, FEATURES, 0);
    // An avail entry naming descriptor 200 of a 16-entry queue.
    frontend.mem.u16(AVAIL + 4).store(200, std::sync::atomic::Ordering::Release);
    frontend.mem.u16(AVAIL + 2).store(1, std::sync::atomic::Ordering::Release);
    frontend.vrings[0].kick.write(1).unwrap();
    assert!(readable(frontend.vrings[0].err.as_raw_fd(), TIMEOUT), "the error eventfd was signalled");
    // The connection itself is fine: the ring stops and restarts on request.
    assert_eq!(frontend.stop_vring(0), 0, "the bad entry was not taken");
    frontend.mem.u16(AVAIL + 2).store(0, std::sync::atomic::Ordering::Release);
    frontend.mem.u16(USED + 2).store(0, std::sync::atomic::Ordering::Release);
    frontend.start_vring(0, 0);
    write_read_flush(&mut frontend, 0, 0, &pattern(3));
}

/// `sendmsg` of `bytes` with any number of descriptors (the library's sender caps them).
fn send_with_fds(stream: &UnixStream, bytes: &[u8], fds: &[RawFd]) {
    let mut control = vec![0u64; 64];
    let data_len = (4 * fds.len()) as u32;
    let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut _, iov_len: bytes.len() };
    // SAFETY: a zeroed msghdr filled in below; the control buffer (512 bytes, 8-aligned) holds
    // one SCM_RIGHTS cmsg of up to 100 descriptors; all buffers outlive the call.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(data_len) as usize;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(data_len) as usize;
        for (i, fd) in fds.iter().enumerate() {
            libc::CMSG_DATA(cmsg).add(4 * i).cast::<RawFd>().write_unaligned(*fd);
        }
        assert_eq!(libc::sendmsg(stream.as_raw_fd(), &msg, 0), bytes.len() as isize);
    }
}

fn raw(request: u32, flags: u32, size: u32, payload: &[u8]) -> Vec<u8> {
    let mut bytes = Header { request, flags, size }.to_bytes().to_vec();
    bytes.extend_from_slice(payload);
    bytes
}

/// What is wrong, whether a well-framed request with REPLY_ACK gets a failure acknowledgement
/// before the connection closes, and how to send it.
type Case = (&'static str, bool, fn(&mut Frontend));

fn region(gpa: u64, size: u64, uva: u64, offset: u64) -> MemoryRegion {
    MemoryRegion { guest_phys_addr: gpa, memory_size: size, userspace_addr: uva, mmap_offset: offset }
}

fn bad_table(f: &mut Frontend, regions: &[MemoryRegion]) {
    f.negotiate(FEATURES);
    let fd = f.mem.file.as_raw_fd();
    f.send(code::SET_MEM_TABLE, &table_payload(regions), &vec![fd; regions.len()]);
}

/// Malformed messages; each must close the connection (after a failure acknowledgement where
/// REPLY_ACK was negotiated and the message was well-framed).
const CASES: &[Case] = &[
    ("wrong payload size", true, |f| f.send_flags(code::GET_FEATURES, VERSION, &[0; 4], &[])),
    ("wrong size for a fixed-size request", true, |f| {
        f.negotiate(FEATURES);
        f.send(code::SET_VRING_ADDR, &[0; 32], &[]);
    }),
    ("unknown request code", true, |f| f.send_flags(77, VERSION, &[], &[])),
    ("request code 0", true, |f| f.send_flags(0, VERSION, &[], &[])),
    ("reply flag in a request", true, |f| f.send_flags(code::GET_FEATURES, VERSION | FLAG_REPLY, &[], &[])),
    ("protocol version 2", true, |f| f.send_flags(code::GET_FEATURES, 2, &[], &[])),
    ("request not offered (IOTLB)", true, |f| {
        f.negotiate(FEATURES);
        f.send(code::IOTLB_MSG, &[0; 16], &[]);
    }),
    ("a NIC's MTU to a disk (NET_MTU not negotiated)", true, |f| {
        f.negotiate(FEATURES);
        f.send(code::NET_SET_MTU, &1500u64.to_le_bytes(), &[]);
    }),
    ("NET_SET_MTU of 4 bytes", true, |f| {
        f.negotiate(FEATURES);
        f.send(code::NET_SET_MTU, &[0; 4], &[]);
    }),
    ("an address to announce to a disk (RARP not negotiated)", true, |f| {
        f.negotiate(FEATURES);
        f.send(code::SEND_RARP, &[0x52, 0x54, 0, 0, 0, 1, 0, 0], &[]);
    }),
    ("SEND_RARP of 6 bytes", true, |f| {
        f.negotiate(FEATURES);
        f.send(code::SEND_RARP, &[0x52, 0x54, 0, 0, 0, 1], &[]);
    }),
    ("virtio features not offered", true, |f| {
        f.negotiate(FEATURES);
        f.send(code::SET_FEATURES, &(1u64 << 63).to_le_bytes(), &[]);
    }),
    ("protocol features not offered", true, |f| {
        f.send(code::SET_PROTOCOL_FEATURES, &(1u64 << 16).to_le_bytes(), &[])
    }),
    ("payload longer than any request's", false, |f| {
        (&f.stream).write_all(&raw(code::SET_MEM_TABLE, VERSION, 1 << 20, &[])).unwrap();
    }),
    ("message cut short", false, |f| {
        (&f.stream).write_all(&raw(code::SET_FEATURES, VERSION, 8, &[0; 4])).unwrap();
        f.stream.shutdown(std::net::Shutdown::Write).unwrap();
    }),
    ("garbage", false, |f| (&f.stream).write_all(&[0xa5; 64]).unwrap()),
    ("descriptors on a request that takes none", true, |f| {
        f.send_flags(code::GET_FEATURES, VERSION, &[], &[f.mem.file.as_raw_fd()]);
    }),
    ("more descriptors than any message carries", false, |f| {
        let fd = f.mem.file.as_raw_fd();
        send_with_fds(&f.stream, &raw(code::SET_VRING_CALL, VERSION, 8, &[0; 8]), &[fd; 12]);
    }),
    ("kick without its descriptor", true, |f| {
        f.negotiate(FEATURES);
        f.send(code::SET_VRING_KICK, &0u64.to_le_bytes(), &[]);
    }),
    ("memory regions that overlap in guest-physical space", true, |f| {
        let uva = f.mem.uva(0);
        bad_table(f, &[region(0, MIB, uva, 0), region(MIB / 2, MIB, uva + 4 * MIB, MIB)]);
    }),
    ("memory regions that overlap in the frontend's address space", true, |f| {
        let uva = f.mem.uva(0);
        bad_table(f, &[region(0, MIB, uva, 0), region(4 * MIB, MIB, uva + MIB / 2, MIB)]);
    }),
    ("a memory region past the end of its file", true, |f| {
        let uva = f.mem.uva(0);
        bad_table(f, &[region(0, 64 * MIB, uva, 0)]);
    }),
    ("a memory region at an offset past the end of its file", true, |f| {
        let uva = f.mem.uva(0);
        bad_table(f, &[region(0, MIB, uva, 1 << 40)]);
    }),
    ("a memory region of size 0", true, |f| {
        let uva = f.mem.uva(0);
        bad_table(f, &[region(0, 0, uva, 0)]);
    }),
    ("a memory region that wraps around", true, |f| {
        let uva = f.mem.uva(0);
        bad_table(f, &[region(u64::MAX - 0xfff, 0x2000, uva, 0)]);
    }),
    ("a memory region at an unaligned file offset", true, |f| {
        let uva = f.mem.uva(0);
        bad_table(f, &[region(0, 0x1000, uva, 0x10)]);
    }),
    ("a memory region whose descriptor is not memory", true, |f| {
        f.negotiate(FEATURES);
        let event = EventFd::new(0).unwrap();
        let table = table_payload(&[region(0, MIB, f.mem.uva(0), 0)]);
        f.send(code::SET_MEM_TABLE, &table, &[event.as_raw_fd()]);
    }),
    ("a memory region that cannot be mapped writable", true, |f| {
        f.negotiate(FEATURES);
        // A file opened read-only: a shared writable mapping of it fails.
        let path = format!("/dev/shm/vhost-user-test-ro-{}", std::process::id());
        std::fs::File::create(&path).unwrap().set_len(MIB).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let table = table_payload(&[region(0, MIB, f.mem.uva(0), 0)]);
        f.send(code::SET_MEM_TABLE, &table, &[file.as_raw_fd()]);
    }),
    ("fewer descriptors than memory regions", true, |f| {
        f.negotiate(FEATURES);
        let table = table_payload(&f.mem.regions());
        f.send(code::SET_MEM_TABLE, &table, &[f.mem.file.as_raw_fd()]);
    }),
    ("nine memory regions", false, |f| {
        f.negotiate(FEATURES);
        let regions: Vec<_> = (0..9).map(|i| region(i * MIB, 4096, f.mem.uva(0) + i * MIB, 0)).collect();
        f.send(code::SET_MEM_TABLE, &table_payload(&regions), &[f.mem.file.as_raw_fd(); 8]);
    }),
    ("a vring index beyond the queues", true, |f| {
        f.negotiate(FEATURES);
        f.send(code::SET_VRING_NUM, &state(5, 16), &[]);
    }),
    ("a ring size that is not a power of two", true, |f| {
        f.negotiate(FEATURES);
        f.send(code::SET_VRING_NUM, &state(0, 3), &[]);
    }),
    ("a ring outside the memory table", true, |f| {
        f.negotiate(FEATURES);
        f.set_mem_table();
        f.set(code::SET_VRING_NUM, &state(0, 16), &[]);
        let addr = VringAddr { index: 0, flags: 0, desc: 0x1000, used: 0x2000, avail: 0x3000, log: 0 };
        f.set(code::SET_VRING_ADDR, &addr.to_bytes(), &[]);
        f.set(code::SET_VRING_ENABLE, &state(0, 1), &[]);
        let kick = EventFd::new(0).unwrap();
        f.send(code::SET_VRING_KICK, &0u64.to_le_bytes(), &[kick.as_raw_fd()]);
    }),
    ("a config read beyond the configuration space", true, |f| {
        let mut payload = vec![0u8; 12];
        payload[0..4].copy_from_slice(&250u32.to_le_bytes());
        payload[4..8].copy_from_slice(&10u32.to_le_bytes());
        payload.resize(22, 0);
        f.send_flags(code::GET_CONFIG, VERSION, &payload, &[]);
    }),
];

/// Each case on a new connection: the backend closes it, with a failure acknowledgement where
/// the case says so and REPLY_ACK was negotiated (never for a request with a reply of its own).
fn refused(backend: &TestBackend, cases: &[Case]) {
    for (what, acked, send) in cases {
        let mut frontend = Frontend::connect(&backend.socket);
        send(&mut frontend);
        let ack = frontend.expect_closed();
        if frontend.reply_ack && *acked {
            assert!(ack.is_some_and(|a| a != 0), "{what}: a failure acknowledgement, got {ack:?}");
        } else {
            assert_eq!(ack, None, "{what}");
        }
        eprintln!("refused as expected: {what}");
    }
}

#[test]
fn malformed_messages_are_refused_and_the_next_frontend_is_served() {
    let backend = TestBackend::start(Policy::Notified, 1, false);
    refused(&backend, CASES);
    // Still serving, with the backend intact.
    let mut frontend = Frontend::ready(&backend.socket, FEATURES, 0);
    write_read_flush(&mut frontend, 0, 100, &pattern(9));
    assert_eq!(backend.disk_bytes(100 * 512, 4096), pattern(9));
}

/// SET_CONFIG as QEMU 7.2's vhost-user-blk sends it (the `writeback` byte, offset 32, size 1,
/// flags 0) switches the cache mode that GET_CONFIG reports; the mode is the disk's, so the next
/// frontend finds it (QEMU does not send it again when it reconnects). Writes still land.
#[test]
fn set_config_of_writeback_switches_the_cache_mode_for_this_and_the_next_frontend() {
    let backend = TestBackend::start(Policy::Notified, 2, false);
    let mut frontend = Frontend::connect(&backend.socket);
    let offered = frontend.negotiate(FEATURES | F_BLK_CONFIG_WCE);
    assert_ne!(offered & F_BLK_CONFIG_WCE, 0, "a writable disk offers CONFIG_WCE");
    assert_eq!(frontend.config(CONFIG_WRITEBACK, 1), [1], "write back to begin with");
    frontend.set_mem_table();
    frontend.start_vring(0, 0);
    frontend.start_vring(1, 0);
    frontend.set_writeback(0);
    assert_eq!(frontend.config(CONFIG_WRITEBACK, 1), [0], "write through once switched");
    // The whole config space, as QEMU reads it, says so too; the rings serve on.
    assert_eq!(frontend.config(0, 60)[32], 0);
    write_read_flush(&mut frontend, 0, 8, &pattern(1));
    write_read_flush(&mut frontend, 1, 16, &pattern(2));
    drop(frontend);

    let mut frontend = Frontend::ready(&backend.socket, FEATURES, 0);
    assert_eq!(frontend.config(CONFIG_WRITEBACK, 1), [0], "the next frontend finds write through");
    frontend.set_writeback(1);
    assert_eq!(frontend.config(CONFIG_WRITEBACK, 1), [1], "and may switch it back");
    write_read_flush(&mut frontend, 0, 24, &pattern(3));
    assert_eq!(backend.disk_bytes(8 * 512, 4096), pattern(1));
    assert_eq!(backend.disk_bytes(16 * 512, 4096), pattern(2));
    assert_eq!(backend.disk_bytes(24 * 512, 4096), pattern(3));
}

/// Every SET_CONFIG but the `writeback` switch is refused with a failure acknowledgement and
/// the connection closed; the mode stays as it was and the next frontend is served.
#[test]
fn hostile_set_configs_are_refused_and_the_next_frontend_is_served() {
    let w = CONFIG_WRITEBACK;
    let config_write = Frontend::config_write;
    let cases: [(&str, bool, Vec<u8>); 12] = [
        ("another offset (capacity)", true, config_write(0, 1, 0, &[0])),
        ("the byte after writeback", true, config_write(w + 1, 1, 0, &[0])),
        ("an offset past the configuration space", true, config_write(u32::MAX, 1, 0, &[0])),
        ("two bytes at writeback", true, config_write(w, 2, 0, &[0, 0])),
        ("no bytes", true, config_write(w, 0, 0, &[])),
        ("the whole configuration space", true, config_write(0, 60, 0, &[0; 60])),
        ("a size over the configuration space", false, config_write(w, 257, 0, &[0; 257])),
        ("a size longer than the data", true, config_write(w, 4, 0, &[0])),
        ("a payload shorter than its header", true, vec![32, 0, 0, 0, 1, 0]),
        ("live migration's flags", true, config_write(w, 1, 1, &[0])),
        ("writeback 2", true, config_write(w, 1, 0, &[2])),
        ("writeback 255", true, config_write(w, 1, 0, &[255])),
    ];
    let backend = TestBackend::start(Policy::Notified, 1, false);
    // Acknowledged unless the message is longer than any request's: the wire refuses that
    // before it reads the payload, so not even the header is taken.
    for (what, acked, payload) in &cases {
        let mut frontend = Frontend::connect(&backend.socket);
        frontend.negotiate(FEATURES);
        frontend.send(code::SET_CONFIG, payload, &[]);
        let ack = frontend.expect_closed();
        if *acked {
            assert!(ack.is_some_and(|a| a != 0), "{what}: a failure acknowledgement, got {ack:?}");
        } else {
            assert_eq!(ack, None, "{what}");
        }
        eprintln!("refused as expected: {what}");
    }
    // Before CONFIG was negotiated.
    let mut frontend = Frontend::connect(&backend.socket);
    frontend.send_flags(code::SET_CONFIG, VERSION, &config_write(w, 1, 0, &[0]), &[]);
    assert_eq!(frontend.expect_closed(), None, "before protocol features");
    // Still serving, still write back, and the switch still works.
    let mut frontend = Frontend::ready(&backend.socket, FEATURES, 0);
    assert_eq!(frontend.config(w, 1), [1], "no refused SET_CONFIG changed the mode");
    frontend.set_writeback(0);
    assert_eq!(frontend.config(w, 1), [0]);
    write_read_flush(&mut frontend, 0, 100, &pattern(9));
    assert_eq!(backend.disk_bytes(100 * 512, 4096), pattern(9));

    // A read-only disk offers no switch, and refuses it.
    let backend = TestBackend::start(Policy::Notified, 1, true);
    let mut frontend = Frontend::connect(&backend.socket);
    let offered = frontend.negotiate(FEATURES);
    assert_eq!(offered & F_BLK_CONFIG_WCE, 0, "a read-only disk offers no CONFIG_WCE");
    frontend.send(code::SET_CONFIG, &config_write(w, 1, 0, &[0]), &[]);
    assert!(frontend.expect_closed().is_some_and(|a| a != 0), "read-only: refused");
    let frontend = Frontend::ready(&backend.socket, FEATURES, 0);
    assert_eq!(frontend.config(w, 1), [1], "read-only disks stay write back");
}

/// Regression: a refused request that has a reply of its own (GET_CONFIG, GET_VRING_BASE, ...)
/// got REPLY_ACK's failure acknowledgement, which the frontend reads as that reply (a u64 of 1:
/// config bytes, or a vring base of 1). Only requests without a reply are acknowledged.
#[test]
fn a_refused_request_with_its_own_reply_gets_no_acknowledgement() {
    let backend = TestBackend::start(Policy::Notified, 1, false);
    let mut frontend = Frontend::connect(&backend.socket);
    frontend.negotiate(FEATURES);
    assert!(frontend.reply_ack, "REPLY_ACK negotiated");
    let mut payload = vec![0u8; 12];
    payload[0..4].copy_from_slice(&250u32.to_le_bytes());
    payload[4..8].copy_from_slice(&10u32.to_le_bytes());
    payload.resize(22, 0);
    frontend.send_flags(code::GET_CONFIG, VERSION | FLAG_NEED_REPLY, &payload, &[]);
    assert_eq!(frontend.expect_closed(), None, "nothing the frontend would take for GET_CONFIG's reply");
}

#[test]
fn a_frontend_that_stalls_inside_a_message_is_dropped() {
    let backend = TestBackend::start(Policy::Notified, 1, false);
    let frontend = Frontend::connect(&backend.socket);
    (&frontend.stream).write_all(&raw(code::SET_FEATURES, VERSION | FLAG_NEED_REPLY, 8, &[0; 2])).unwrap();
    let started = std::time::Instant::now();
    let mut frontend = frontend;
    assert_eq!(frontend.expect_closed(), None);
    assert!(started.elapsed() >= Duration::from_secs(4), "dropped after the stall timeout");
}

#[test]
fn the_socket_path_is_replaced_only_when_it_is_a_stale_socket() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, b"not a socket").unwrap();
    assert!(matches!(Server::bind(&file), Err(Error::Socket(unix_socket::ListenError::NotASocket { .. }))));
    assert_eq!(std::fs::read(&file).unwrap(), b"not a socket");

    let stale = dir.path().join("stale");
    drop(UnixListener::bind(&stale).unwrap());
    assert!(Path::new(&stale).exists());
    let server = Server::bind(&stale).expect("a stale socket is replaced");
    assert!(
        matches!(Server::bind(&stale), Err(Error::Socket(unix_socket::ListenError::SocketInUse { .. }))),
        "a live one is not"
    );
    drop(server);
    assert!(!Path::new(&stale).exists(), "the server removes its socket");
}

/// Bytes of dirty log for the test's guest memory (up to 1 GiB + 1 MiB, a bit per 4 KiB).
const LOG_LEN: usize = ((REGION_B_GPA + MIB) / 4096 / 8) as usize;

/// Connect with LOG_SHMFD, map memory, start vring 0, and share `log` (SET_LOG_BASE, whose
/// reply QEMU waits for).
fn ready_with_log(backend: &TestBackend, log: &DirtyLogFile) -> Frontend {
    let mut frontend = Frontend::connect(&backend.socket);
    let offered = frontend.negotiate_protocol(FEATURES, P_MQ | P_REPLY_ACK | P_CONFIG | P_LOG_SHMFD);
    assert_ne!(offered & F_LOG_ALL, 0, "VHOST_F_LOG_ALL offered");
    frontend.set_mem_table();
    frontend.start_vring(0, 0);
    frontend.send(code::SET_LOG_BASE, &log_base_payload(LOG_LEN as u64, 0), &[log.file.as_raw_fd()]);
    assert_eq!(frontend.reply(code::SET_LOG_BASE), 0u64.to_le_bytes(), "SET_LOG_BASE's reply");
    frontend
}

/// Logging on or off while the ring runs, as QEMU switches it when a migration starts or ends:
/// SET_FEATURES with or without LOG_ALL, then SET_VRING_ADDR with or without VHOST_VRING_F_LOG.
fn set_logging(frontend: &Frontend, on: bool) {
    let features = FEATURES & !(F_BLK_MQ | F_BLK_RO) | if on { F_LOG_ALL } else { 0 };
    frontend.set(code::SET_FEATURES, &features.to_le_bytes(), &[]);
    let (_, _, used) = frontend.ring(0);
    frontend.set_vring_addr(0, if on { 1 } else { 0 }, if on { used } else { 0 });
}

#[test]
fn while_logging_a_read_marks_its_data_status_and_used_ring_pages_and_nothing_else() {
    let backend = TestBackend::start(Policy::Notified, 1, false);
    std::fs::write(&backend.disk, pattern(3).repeat(256)).unwrap();
    let log = DirtyLogFile::new(LOG_LEN, true);
    let mut frontend = ready_with_log(&backend, &log);
    let (_, _, used) = frontend.ring(0);
    let page = |gpa: u64| gpa / 4096;

    // Before LOG_ALL: the log is shared, but nothing is marked.
    assert_eq!(frontend.blk(0, T_IN, 0, 8192), 0);
    assert_eq!(log.dirty_pages(), Vec::<u64>::new(), "no logging before LOG_ALL");

    set_logging(&frontend, true);
    log.clear();
    // An 8 KiB read into DATA: two data pages, the status byte's page, the used ring's page.
    frontend.mem.write(DATA, &[0u8; 8192]);
    assert_eq!(frontend.blk(0, T_IN, 8, 8192), 0);
    assert_eq!(frontend.mem.read(DATA, 4096), pattern(3), "the read's data");
    let read_pages = vec![page(DATA), page(DATA) + 1, page(STATUS), page(used)];
    assert_eq!(log.dirty_pages(), read_pages, "data, status and used ring pages of a read");
    eprintln!("pages logged by one 8 KiB read: {}", read_pages.len());

    // A write: the device writes only the status byte and the used ring.
    log.clear();
    frontend.mem.write(DATA, &pattern(4));
    assert_eq!(frontend.blk(0, T_OUT, 16, 4096), 0);
    assert_eq!(log.dirty_pages(), vec![page(STATUS), page(used)], "status and used ring of a write");

    // GET_ID: the answer's page, the status and the used ring.
    const T_GET_ID: u32 = 8;
    log.clear();
    let mut chain = frontend.blk_chain(T_GET_ID, 0, 20);
    chain[1].2 = true; // the device writes the answer
    frontend.submit(0, &chain);
    frontend.wait_used(0);
    assert_eq!(frontend.mem.read(STATUS, 1), [0], "GET_ID's status");
    assert_eq!(log.dirty_pages(), vec![page(DATA), page(STATUS), page(used)], "pages of a GET_ID");
    // A request refused without reaching the disk (an unknown type: UNSUPP).
    log.clear();
    assert_eq!(frontend.blk(0, 99, 0, 0), 2, "UNSUPP");
    assert_eq!(log.dirty_pages(), vec![page(STATUS), page(used)], "status and used ring of a refusal");

    // Logging off (migration over): no bits, whatever the device writes.
    set_logging(&frontend, false);
    log.clear();
    assert_eq!(frontend.blk(0, T_IN, 16, 4096), 0);
    assert_eq!(frontend.mem.read(DATA, 4096), pattern(4));
    assert_eq!(log.dirty_pages(), Vec::<u64>::new(), "no logging after LOG_ALL is cleared");
}

/// Negotiate LOG_SHMFD and send SET_LOG_BASE of `size` bytes at `offset` of a LOG_LEN-byte
/// memfd, sealed against shrinking if `sealed`.
fn send_log_base(f: &mut Frontend, size: u64, offset: u64, sealed: bool) {
    f.negotiate_protocol(FEATURES, P_REPLY_ACK | P_LOG_SHMFD);
    let log = DirtyLogFile::new(LOG_LEN, sealed);
    f.send(code::SET_LOG_BASE, &log_base_payload(size, offset), &[log.file.as_raw_fd()]);
}

/// Hostile dirty-log messages; each closes the connection.
const LOG_CASES: &[Case] = &[
    ("SET_LOG_BASE without LOG_SHMFD negotiated", false, |f| {
        f.negotiate(FEATURES | F_LOG_ALL);
        let log = DirtyLogFile::new(LOG_LEN, true);
        f.send(code::SET_LOG_BASE, &log_base_payload(LOG_LEN as u64, 0), &[log.file.as_raw_fd()]);
    }),
    ("SET_LOG_BASE with an eventfd for a log", false, |f| {
        f.negotiate_protocol(FEATURES, P_REPLY_ACK | P_LOG_SHMFD);
        let event = EventFd::new(0).unwrap();
        f.send(code::SET_LOG_BASE, &log_base_payload(LOG_LEN as u64, 0), &[event.as_raw_fd()]);
    }),
    ("SET_LOG_BASE with a memfd not sealed against shrinking", false, |f| {
        send_log_base(f, LOG_LEN as u64, 0, false)
    }),
    ("SET_LOG_BASE too small for guest memory", false, |f| {
        f.negotiate_protocol(FEATURES, P_REPLY_ACK | P_LOG_SHMFD);
        f.set_mem_table();
        let log = DirtyLogFile::new(LOG_LEN, true);
        f.send(code::SET_LOG_BASE, &log_base_payload(4096, 0), &[log.file.as_raw_fd()]);
    }),
    ("SET_LOG_BASE reaching past the end of its file", false, |f| {
        send_log_base(f, LOG_LEN as u64, 4096, true)
    }),
    ("SET_LOG_BASE with an offset that wraps", false, |f| {
        send_log_base(f, LOG_LEN as u64, u64::MAX - 4095, true)
    }),
    ("SET_LOG_BASE with an unaligned offset", false, |f| send_log_base(f, 8, 8, true)),
    ("SET_LOG_BASE of size 0", false, |f| send_log_base(f, 0, 0, true)),
    // The log is accessed only in 64-bit words: a partial last word is refused.
    ("SET_LOG_BASE of a size not a multiple of 8 bytes", false, |f| {
        send_log_base(f, LOG_LEN as u64 - 4, 0, true)
    }),
    ("SET_LOG_BASE without a descriptor", false, |f| {
        f.negotiate_protocol(FEATURES, P_REPLY_ACK | P_LOG_SHMFD);
        f.send(code::SET_LOG_BASE, &log_base_payload(LOG_LEN as u64, 0), &[]);
    }),
    ("SET_LOG_BASE with a short payload", false, |f| {
        f.negotiate_protocol(FEATURES, P_REPLY_ACK | P_LOG_SHMFD);
        let log = DirtyLogFile::new(LOG_LEN, true);
        f.send(code::SET_LOG_BASE, &[0; 8], &[log.file.as_raw_fd()]);
    }),
    ("SET_LOG_FD with a pipe", true, |f| {
        f.negotiate_protocol(FEATURES, P_REPLY_ACK | P_LOG_SHMFD);
        let mut ends = [0; 2];
        // SAFETY: pipe2 fills two descriptors, closed right after sending.
        assert_eq!(unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        f.send(code::SET_LOG_FD, &[], &[ends[0]]);
        // SAFETY: the two descriptors pipe2 made, closed once.
        unsafe { (libc::close(ends[0]), libc::close(ends[1])) };
    }),
    ("SET_LOG_FD with a payload", true, |f| {
        f.negotiate_protocol(FEATURES, P_REPLY_ACK | P_LOG_SHMFD);
        let event = EventFd::new(0).unwrap();
        f.send(code::SET_LOG_FD, &[0; 8], &[event.as_raw_fd()]);
    }),
    ("SET_VRING_ADDR with an unknown flag", true, |f| {
        f.negotiate_protocol(FEATURES, P_REPLY_ACK | P_LOG_SHMFD);
        f.send(
            code::SET_VRING_ADDR,
            &VringAddr { index: 0, flags: 2, desc: 0, used: 0, avail: 0, log: 0 }.to_bytes(),
            &[],
        );
    }),
];

#[test]
fn hostile_dirty_log_messages_are_refused_and_the_next_frontend_is_served() {
    let backend = TestBackend::start(Policy::Notified, 1, false);
    // SET_LOG_BASE has a reply of its own: refused, it is not acknowledged.
    refused(&backend, LOG_CASES);
    // A log eventfd is taken (and closed); the next frontend logs as it should.
    let log = DirtyLogFile::new(LOG_LEN, true);
    let mut frontend = ready_with_log(&backend, &log);
    let event = EventFd::new(0).unwrap();
    frontend.set(code::SET_LOG_FD, &[], &[event.as_raw_fd()]);
    set_logging(&frontend, true);
    write_read_flush(&mut frontend, 0, 100, &pattern(9));
    assert!(log.dirty_pages().contains(&(DATA / 4096)), "the read's data page is logged");
}
