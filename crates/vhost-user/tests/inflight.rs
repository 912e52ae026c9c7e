//! In-flight tracking (VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD) against the test frontend over a
//! real socket: GET_INFLIGHT_FD's region, SET_INFLIGHT_FD's checks on hostile values, and the
//! recovery a ring makes when it starts on a region a crashed predecessor left (written here by
//! hand, in QEMU's and libvhost-user's layout), with its refusals of regions that cannot be
//! trusted.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;

use iocore::Policy;
use test_infra::backend::TestBackend;
use test_infra::frontend::*;
use vhost_user_protocol::message::{code, InflightInfo, Wire, FLAG_REPLY, VERSION};
use vmm_sys_util::eventfd::EventFd;

const FEATURES: u64 = F_VERSION_1 | F_EVENT_IDX | F_PROTOCOL_FEATURES | F_BLK_FLUSH | F_BLK_MQ;
const P_INFLIGHT: u64 = 1 << 12;
/// Header and descriptor-state sizes of the layout.
const HEADER_LEN: usize = 16;
const DESC_LEN: usize = 16;

/// libvhost-user's `vu_inflight_queue_size`.
fn area_size(queue_size: u16) -> usize {
    (DESC_LEN * queue_size as usize + 2).div_ceil(64) * 64
}

/// QEMU's handshake with the in-flight feature negotiated too.
fn negotiate(frontend: &mut Frontend) {
    let offered = frontend.get_u64(code::GET_FEATURES);
    frontend.set(code::SET_OWNER, &[], &[]);
    let protocol = frontend.get_u64(code::GET_PROTOCOL_FEATURES);
    assert_ne!(protocol & P_INFLIGHT, 0, "INFLIGHT_SHMFD is offered");
    let wanted = P_MQ | P_REPLY_ACK | P_CONFIG | P_INFLIGHT;
    frontend.set(code::SET_PROTOCOL_FEATURES, &wanted.to_le_bytes(), &[]);
    frontend.reply_ack = true;
    frontend.set(code::SET_FEATURES, &(FEATURES & offered).to_le_bytes(), &[]);
}

/// A shared memory file like the one GET_INFLIGHT_FD hands out, mapped here.
struct Region {
    fd: OwnedFd,
    base: *mut u8,
    len: usize,
}

impl Region {
    /// `len` bytes of memfd, sealed against shrinking if `sealed`.
    fn new(len: usize, sealed: bool) -> Region {
        let (fd, base) = shared_memfd(len, sealed);
        Region { fd, base, len }
    }

    /// Map the region GET_INFLIGHT_FD sent.
    fn map(fd: OwnedFd, len: usize) -> Region {
        let base = map_shared(fd.as_raw_fd(), len);
        Region { fd, base, len }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping of `len` bytes lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.base, self.len) }
    }

    fn write(&self, at: usize, bytes: &[u8]) {
        assert!(at + bytes.len() <= self.len);
        // SAFETY: inside the mapping.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(at), bytes.len()) }
    }

    fn u16_at(&self, at: usize) -> u16 {
        u16::from_le_bytes(self.bytes()[at..at + 2].try_into().unwrap())
    }

    /// Queue 0's header: version, desc_num, last_batch_head, used_idx.
    fn header(&self, version: u16, desc_num: u16, last_batch_head: u16, used_idx: u16) {
        for (i, v) in [version, desc_num, last_batch_head, used_idx].into_iter().enumerate() {
            self.write(8 + 2 * i, &v.to_le_bytes());
        }
    }

    /// Queue 0's entry for `head`.
    fn entry(&self, head: u16, inflight: u8, next: u16, counter: u64) {
        let at = HEADER_LEN + DESC_LEN * head as usize;
        self.write(at, &[inflight]);
        self.write(at + 6, &next.to_le_bytes());
        self.write(at + 8, &counter.to_le_bytes());
    }

    fn in_flight(&self, head: u16) -> u8 {
        self.bytes()[HEADER_LEN + DESC_LEN * head as usize]
    }

    /// SET_INFLIGHT_FD, without waiting for its acknowledgement.
    fn send(&self, frontend: &Frontend, info: InflightInfo) {
        frontend.send(code::SET_INFLIGHT_FD, &info.to_bytes(), &[self.fd.as_raw_fd()]);
    }

    fn set(&self, frontend: &Frontend, info: InflightInfo) {
        frontend.set(code::SET_INFLIGHT_FD, &info.to_bytes(), &[self.fd.as_raw_fd()]);
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`/`map`, unmapped once.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

fn info(mmap_size: usize, mmap_offset: u64, num_queues: u16, queue_size: u16) -> InflightInfo {
    InflightInfo { mmap_size: mmap_size as u64, mmap_offset, num_queues, queue_size }
}

/// GET_INFLIGHT_FD's reply and its descriptor.
fn get_inflight(frontend: &Frontend, request: InflightInfo) -> (InflightInfo, OwnedFd) {
    frontend.send_flags(code::GET_INFLIGHT_FD, VERSION, &request.to_bytes(), &[]);
    let (header, payload, mut fds) =
        Wire::new(&frontend.stream, TIMEOUT).with_idle_limit(TIMEOUT).recv().unwrap().expect("a reply");
    assert_eq!((header.request, header.flags), (code::GET_INFLIGHT_FD, VERSION | FLAG_REPLY));
    assert_eq!(payload.len(), 24);
    let u64_at = |at: usize| u64::from_le_bytes(payload[at..at + 8].try_into().unwrap());
    let u16_at = |at: usize| u16::from_le_bytes(payload[at..at + 2].try_into().unwrap());
    let reply = InflightInfo {
        mmap_size: u64_at(0),
        mmap_offset: u64_at(8),
        num_queues: u16_at(16),
        queue_size: u16_at(18),
    };
    assert_eq!(fds.len(), 1, "one descriptor with the reply");
    (reply, fds.pop().unwrap())
}

#[test]
fn get_inflight_fd_hands_out_a_sealed_zeroed_region_in_libvhost_users_layout() {
    let backend = TestBackend::start(Policy::Notified, 2, false);
    let mut frontend = Frontend::connect(&backend.socket);
    negotiate(&mut frontend);
    let (reply, fd) = get_inflight(&frontend, info(0, 0, 2, 128));
    let size = 2 * area_size(128);
    assert_eq!(size, 2 * 2112);
    assert_eq!(reply, info(size, 0, 2, 128));
    // SAFETY: F_GET_SEALS and fstat on the descriptor received.
    let (seals, file_size) = unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        assert_eq!(libc::fstat(fd.as_raw_fd(), &mut stat), 0);
        (libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS), stat.st_size as usize)
    };
    let wanted = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    assert_eq!(seals & wanted, wanted, "sealed against resizing");
    assert_eq!(file_size, size);
    let region = Region::map(fd, size);
    for queue in 0..2 {
        let at = queue * area_size(128);
        assert_eq!(region.u16_at(at + 10), 128, "queue {queue}'s desc_num");
        let mut rest = region.bytes()[at..at + area_size(128)].to_vec();
        rest[10..12].fill(0);
        assert!(rest.iter().all(|&b| b == 0), "queue {queue}'s area is otherwise zero");
    }
    // The region given back is accepted, and the connection goes on.
    region.set(&frontend, reply);
    frontend.set_mem_table();
}

/// Messages that must close the connection: (what, the frontend's steps).
type Case = (&'static str, fn(&mut Frontend));

const HOSTILE: &[Case] = &[
    ("GET_INFLIGHT_FD without the feature", |f| {
        f.negotiate(FEATURES);
        f.send_flags(code::GET_INFLIGHT_FD, VERSION, &info(0, 0, 1, 16).to_bytes(), &[]);
    }),
    ("SET_INFLIGHT_FD without the feature", |f| {
        f.negotiate(FEATURES);
        let region = Region::new(area_size(16), true);
        region.send(f, info(area_size(16), 0, 1, 16));
    }),
    ("GET_INFLIGHT_FD for 0 queues", |f| {
        negotiate(f);
        f.send_flags(code::GET_INFLIGHT_FD, VERSION, &info(0, 0, 0, 16).to_bytes(), &[]);
    }),
    ("GET_INFLIGHT_FD for more queues than the device has", |f| {
        negotiate(f);
        f.send_flags(code::GET_INFLIGHT_FD, VERSION, &info(0, 0, 2, 16).to_bytes(), &[]);
    }),
    ("GET_INFLIGHT_FD for queues of 0", |f| {
        negotiate(f);
        f.send_flags(code::GET_INFLIGHT_FD, VERSION, &info(0, 0, 1, 0).to_bytes(), &[]);
    }),
    ("GET_INFLIGHT_FD for queues larger than the device's", |f| {
        negotiate(f);
        f.send_flags(code::GET_INFLIGHT_FD, VERSION, &info(0, 0, 1, 1024).to_bytes(), &[]);
    }),
    ("GET_INFLIGHT_FD with a short payload", |f| {
        negotiate(f);
        f.send_flags(code::GET_INFLIGHT_FD, VERSION, &info(0, 0, 1, 16).to_bytes()[..20], &[]);
    }),
    ("SET_INFLIGHT_FD without a descriptor", |f| {
        negotiate(f);
        f.send(code::SET_INFLIGHT_FD, &info(area_size(16), 0, 1, 16).to_bytes(), &[]);
    }),
    ("SET_INFLIGHT_FD with a short payload", |f| {
        negotiate(f);
        let region = Region::new(area_size(16), true);
        f.send(
            code::SET_INFLIGHT_FD,
            &info(area_size(16), 0, 1, 16).to_bytes()[..16],
            &[region.fd.as_raw_fd()],
        );
    }),
    ("SET_INFLIGHT_FD with mmap_size below what the queues take", |f| {
        negotiate(f);
        let region = Region::new(area_size(16), true);
        region.send(f, info(area_size(16) - 64, 0, 1, 16));
    }),
    ("SET_INFLIGHT_FD reaching past the end of its file", |f| {
        negotiate(f);
        let region = Region::new(area_size(16), true);
        region.send(f, info(area_size(16), 4096, 1, 16));
    }),
    ("SET_INFLIGHT_FD at an unaligned offset", |f| {
        negotiate(f);
        let region = Region::new(3 * 4096, true);
        region.send(f, info(area_size(16), 100, 1, 16));
    }),
    ("SET_INFLIGHT_FD at an offset that wraps", |f| {
        negotiate(f);
        let region = Region::new(area_size(16), true);
        region.send(f, info(area_size(16), u64::MAX - 4095, 1, 16));
    }),
    ("SET_INFLIGHT_FD of a file that may shrink (not sealed)", |f| {
        negotiate(f);
        let region = Region::new(area_size(16), false);
        region.send(f, info(area_size(16), 0, 1, 16));
    }),
    ("SET_INFLIGHT_FD of an eventfd", |f| {
        negotiate(f);
        let event = EventFd::new(0).unwrap();
        f.send(code::SET_INFLIGHT_FD, &info(area_size(16), 0, 1, 16).to_bytes(), &[event.as_raw_fd()]);
    }),
    ("SET_INFLIGHT_FD for 0 queues", |f| {
        negotiate(f);
        let region = Region::new(area_size(16), true);
        region.send(f, info(area_size(16), 0, 0, 16));
    }),
    ("SET_INFLIGHT_FD for queues larger than the device's", |f| {
        negotiate(f);
        let region = Region::new(area_size(4096), true);
        region.send(f, info(area_size(4096), 0, 1, 4096));
    }),
];

#[test]
fn hostile_inflight_messages_close_the_connection_and_the_next_frontend_is_served() {
    let backend = TestBackend::start(Policy::Notified, 1, false);
    for (what, send) in HOSTILE {
        let mut frontend = Frontend::connect(&backend.socket);
        send(&mut frontend);
        let ack = frontend.expect_closed();
        // Refused: a failure acknowledgement for SET (REPLY_ACK), none for GET (its own reply).
        assert_ne!(ack, Some(0), "{what}: refused");
        eprintln!("refused as expected: {what}");
    }
    let mut frontend = Frontend::connect(&backend.socket);
    negotiate(&mut frontend);
    frontend.set_mem_table();
    frontend.start_vring(0, 0);
    frontend.mem.write(DATA, &[7u8; 4096]);
    assert_eq!(frontend.blk(0, T_OUT, 0, 4096), 0);
}

/// Write request `head`: a 4 KiB write of `fill` at `sector`, its header, data and status at
/// their own addresses; descriptors `head`, `head + 1`, `head + 2`.
fn write_request(frontend: &Frontend, head: u16, sector: u64, fill: u8) {
    let base = 0x10000 + head as u64 * 0x2000;
    let (header, data, status) = (base, base + 0x1000, base + 0x10);
    let mut bytes = [0u8; 16];
    bytes[0..4].copy_from_slice(&T_OUT.to_le_bytes());
    bytes[8..16].copy_from_slice(&sector.to_le_bytes());
    frontend.mem.write(header, &bytes);
    frontend.mem.write(data, &[fill; 4096]);
    frontend.mem.write(status, &[0xff]);
    let (desc, _, _) = frontend.ring(0);
    let chain = [(header, 16u32, 0u16), (data, 4096, 0), (status, 1, 2)];
    for (i, (addr, len, flags)) in chain.into_iter().enumerate() {
        let index = head + i as u16;
        let next = if i < 2 { 1 } else { 0 };
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&(flags | next).to_le_bytes());
        d[14..16].copy_from_slice(&(index + 1).to_le_bytes());
        frontend.mem.write(desc + 16 * index as u64, &d);
    }
}

fn status_of(frontend: &Frontend, head: u16) -> u8 {
    frontend.mem.read(0x10000 + head as u64 * 0x2000 + 0x10, 1)[0]
}

/// The rings as a crashed backend left them: requests at heads 0 and 4 (avail slots 0 and 1)
/// taken, `used` of them in the used ring.
fn rings_after_crash(frontend: &Frontend, used: &[u16]) {
    write_request(frontend, 0, 8, 0xa0);
    write_request(frontend, 4, 16, 0xa4);
    let (_, avail, used_ring) = frontend.ring(0);
    frontend.mem.u16(avail + 4).store(0, Ordering::Release);
    frontend.mem.u16(avail + 6).store(4, Ordering::Release);
    frontend.mem.u16(avail + 2).store(2, Ordering::Release);
    for (slot, &head) in used.iter().enumerate() {
        frontend.mem.write(used_ring + 4 + 8 * slot as u64, &[head as u8, 0, 0, 0, 1, 0, 0, 0]);
    }
    frontend.mem.u16(used_ring + 2).store(used.len() as u16, Ordering::Release);
}

/// A frontend reconnected after a crash: negotiated, `region` set, memory mapped.
fn reconnect(backend: &TestBackend, region_info: InflightInfo, region: &Region) -> Frontend {
    let mut frontend = Frontend::connect(&backend.socket);
    negotiate(&mut frontend);
    region.set(&frontend, region_info);
    frontend.set_mem_table();
    frontend
}

#[test]
fn a_ring_resubmits_what_its_predecessor_held_oldest_first_before_new_requests() {
    let backend = TestBackend::start(Policy::Notified, 1, false);
    let size = area_size(QUEUE_SIZE);
    let region = Region::new(size, true);
    // Head 4 was taken before head 0 (counters 7 and 9), though offered after it.
    region.header(1, QUEUE_SIZE, 0, 0);
    region.entry(0, 1, 0, 9);
    region.entry(4, 1, 0, 7);
    let mut frontend = reconnect(&backend, info(size, 0, 1, QUEUE_SIZE), &region);
    rings_after_crash(&frontend, &[]);
    // QEMU rewinds to the used index after a crash.
    frontend.start_vring(0, 0);
    assert_eq!(frontend.wait_used(0), (4, 1), "head 4 first: it was taken first");
    assert_eq!(frontend.wait_used(0), (0, 1));
    assert_eq!((status_of(&frontend, 0), status_of(&frontend, 4)), (0, 0));
    assert_eq!(backend.disk_bytes(8 * 512, 4096), vec![0xa0; 4096]);
    assert_eq!(backend.disk_bytes(16 * 512, 4096), vec![0xa4; 4096]);
    assert_eq!((region.in_flight(0), region.in_flight(4)), (0, 0), "both cleared");
    assert_eq!(region.u16_at(14), 2, "the region's used_idx follows the used ring");
    // New requests go on from avail index 2.
    frontend.vrings[0].avail_idx = 2;
    write_request(&frontend, 8, 24, 0xa8);
    frontend.publish(0, &[8]);
    assert_eq!(frontend.wait_used(0), (8, 1));
    assert_eq!(backend.disk_bytes(24 * 512, 4096), vec![0xa8; 4096]);
    assert_eq!(frontend.stop_vring(0), 3, "three requests taken in all");
}

#[test]
fn a_batch_published_but_not_cleared_is_finished_not_resubmitted() {
    let backend = TestBackend::start(Policy::Notified, 1, false);
    let size = area_size(QUEUE_SIZE);
    let region = Region::new(size, true);
    // The predecessor put head 4 in the used ring (batch of one, listed in last_batch_head)
    // and died before clearing it; head 0 is still in flight.
    region.header(1, QUEUE_SIZE, 4, 0);
    region.entry(0, 1, 0, 1);
    region.entry(4, 1, 0, 0);
    let mut frontend = reconnect(&backend, info(size, 0, 1, QUEUE_SIZE), &region);
    rings_after_crash(&frontend, &[4]);
    frontend.start_vring(0, 1);
    assert_eq!(frontend.wait_used(0), (0, 1), "only head 0 is served again");
    assert_eq!(backend.disk_bytes(8 * 512, 4096), vec![0xa0; 4096]);
    assert_eq!(backend.disk_bytes(16 * 512, 4096), vec![0; 4096], "head 4 was not run again");
    assert_eq!(region.u16_at(14), 2);
    assert_eq!(frontend.stop_vring(0), 2);
}

/// Region contents that must stop the ring (error eventfd, nothing served): (what, set-up).
type BadRegion = (&'static str, fn(&Region), &'static [u16]);

const BAD_REGIONS: &[BadRegion] = &[
    ("an unknown version", |r| r.header(7, QUEUE_SIZE, 0, 0), &[]),
    ("desc_num changed by the frontend", |r| r.header(1, 8, 0, 0), &[]),
    (
        "a head in flight beyond the ring's size",
        |r| {
            r.header(1, 2 * QUEUE_SIZE, 0, 0);
            r.entry(QUEUE_SIZE + 3, 1, 0, 0);
        },
        &[],
    ),
    (
        "an inflight byte that is neither 0 nor 1",
        |r| {
            r.header(1, QUEUE_SIZE, 0, 0);
            r.entry(2, 5, 0, 0);
        },
        &[],
    ),
    ("a last batch larger than the ring", |r| r.header(1, QUEUE_SIZE, 0, 40000), &[]),
    (
        "a last batch listing a head not in flight",
        |r| {
            r.header(1, QUEUE_SIZE, 3, 0);
            r.entry(0, 1, 0, 1);
        },
        &[4],
    ),
    (
        "a last batch whose list leaves the ring",
        |r| {
            r.header(1, QUEUE_SIZE, 4, 0);
            r.entry(4, 1, 200, 0);
            r.entry(0, 1, 0, 1);
        },
        &[4, 0],
    ),
    (
        "a last batch whose list loops",
        |r| {
            r.header(1, QUEUE_SIZE, 4, 0);
            r.entry(4, 1, 4, 0);
            r.entry(0, 1, 0, 1);
        },
        &[4, 0],
    ),
];

#[test]
fn a_region_that_cannot_be_trusted_stops_the_ring_with_a_device_error() {
    let backend = TestBackend::start(Policy::Notified, 1, false);
    for (what, corrupt, used) in BAD_REGIONS {
        // Regions for twice the ring's size, so that a head can lie beyond the ring.
        let size = area_size(2 * QUEUE_SIZE);
        let region = Region::new(size, true);
        let desc_num = if what.contains("beyond") { 2 * QUEUE_SIZE } else { QUEUE_SIZE };
        let mut frontend = reconnect(&backend, info(size, 0, 1, desc_num), &region);
        corrupt(&region);
        rings_after_crash(&frontend, used);
        frontend.start_vring(0, used.len() as u16);
        let err: RawFd = frontend.vrings[0].err.as_raw_fd();
        assert!(readable(err, TIMEOUT), "{what}: the error eventfd was signalled");
        let (_, _, used_ring) = frontend.ring(0);
        assert_eq!(
            frontend.mem.u16(used_ring + 2).load(Ordering::Acquire),
            used.len() as u16,
            "{what}: nothing served"
        );
        eprintln!("refused as expected: {what}");
    }
    // The backend is intact: a fresh region serves.
    let size = area_size(QUEUE_SIZE);
    let region = Region::new(size, true);
    let mut frontend = reconnect(&backend, info(size, 0, 1, QUEUE_SIZE), &region);
    frontend.start_vring(0, 0);
    frontend.mem.write(DATA, &[9u8; 4096]);
    assert_eq!(frontend.blk(0, T_OUT, 0, 4096), 0);
    assert_eq!(region.u16_at(8), 1, "the new region was initialised (version 1)");
}

/// Regression: QEMU sizes the region by its queue-size property (128), but a driver on
/// virtio-mmio may make its ring larger (the probe uses 256): the ring was refused with a device
/// error. It is served, untracked.
#[test]
fn a_ring_larger_than_the_region_is_served_untracked() {
    let backend = TestBackend::start(Policy::Notified, 1, false);
    let size = area_size(QUEUE_SIZE / 2);
    let region = Region::new(size, true);
    let mut frontend = reconnect(&backend, info(size, 0, 1, QUEUE_SIZE / 2), &region);
    frontend.start_vring(0, 0);
    frontend.mem.write(DATA, &[5u8; 4096]);
    assert_eq!(frontend.blk(0, T_OUT, 0, 4096), 0);
    assert_eq!(backend.disk_bytes(0, 4096), vec![5u8; 4096]);
    assert!(region.bytes().iter().enumerate().all(|(i, &b)| b == 0 || (10..12).contains(&i)), "untouched");
}
