//! A vhost-user frontend for tests: real messages over a Unix socket, "guest memory" in a memfd
//! shared as two regions, one split virtqueue laid out by hand, and kick/call/error eventfds.
//! It plays the part QEMU plays (set-up) and the guest driver's (requests in the ring).

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{fence, AtomicU16, Ordering};
use std::time::{Duration, Instant};

use vhost_user_protocol::message::{
    code, Header, MemoryRegion, VringAddr, Wire, FLAG_NEED_REPLY, FLAG_REPLY, VERSION,
};
use vmm_sys_util::eventfd::EventFd;

/// A mebibyte.
pub const MIB: u64 = 1 << 20;
/// Guest memory: 2 MiB of memfd, shared as region A (guest 0, file offset 0) and region B
/// (guest 1 GiB, file offset 1 MiB), so translation and offsets both matter.
pub const MEM_SIZE: u64 = 2 * MIB;
/// MEM_SIZE as a length in memory.
const MEM_LEN: usize = 2 << 20;
/// Guest address of region B.
pub const REGION_B_GPA: u64 = 1 << 30;
/// Entries per virtqueue the ring helpers lay out.
pub const QUEUE_SIZE: u16 = 16;
/// Rings in region B, one page apart per queue.
pub const DESC: u64 = REGION_B_GPA;
/// Guest address of queue 0's avail ring.
pub const AVAIL: u64 = REGION_B_GPA + 0x1000;
/// Guest address of queue 0's used ring.
pub const USED: u64 = REGION_B_GPA + 0x2000;
/// How far apart the queues' rings are.
pub const QUEUE_STRIDE: u64 = 0x4000;
/// Request buffers in region A.
pub const HEADER: u64 = 0x1000;
/// Guest address of the request's data.
pub const DATA: u64 = 0x2000;
/// Guest address of the request's status byte.
pub const STATUS: u64 = 0x8000;

/// VIRTIO_F_VERSION_1.
pub const F_VERSION_1: u64 = 1 << 32;
/// VIRTIO_RING_F_EVENT_IDX.
pub const F_EVENT_IDX: u64 = 1 << 29;
/// VHOST_USER_F_PROTOCOL_FEATURES.
pub const F_PROTOCOL_FEATURES: u64 = 1 << 30;
/// VIRTIO_BLK_F_MQ.
pub const F_BLK_MQ: u64 = 1 << 12;
/// VIRTIO_BLK_F_FLUSH.
pub const F_BLK_FLUSH: u64 = 1 << 9;
/// VIRTIO_BLK_F_RO.
pub const F_BLK_RO: u64 = 1 << 5;
/// VIRTIO_BLK_F_WRITE_ZEROES.
pub const F_BLK_WRITE_ZEROES: u64 = 1 << 14;
/// VIRTIO_BLK_F_CONFIG_WCE.
pub const F_BLK_CONFIG_WCE: u64 = 1 << 11;
/// `writeback` in struct virtio_blk_config (QEMU calls it `wce`).
pub const CONFIG_WRITEBACK: u32 = 32;
/// VHOST_USER_PROTOCOL_F_MQ.
pub const P_MQ: u64 = 1;
/// VHOST_USER_PROTOCOL_F_REPLY_ACK.
pub const P_REPLY_ACK: u64 = 1 << 3;
/// VHOST_USER_PROTOCOL_F_CONFIG.
pub const P_CONFIG: u64 = 1 << 9;
/// VHOST_USER_PROTOCOL_F_LOG_SHMFD.
pub const P_LOG_SHMFD: u64 = 1 << 1;
/// VHOST_F_LOG_ALL.
pub const F_LOG_ALL: u64 = 1 << 26;

/// VIRTIO_BLK_T_IN: a read.
pub const T_IN: u32 = 0;
/// VIRTIO_BLK_T_OUT: a write.
pub const T_OUT: u32 = 1;
/// VIRTIO_BLK_T_FLUSH.
pub const T_FLUSH: u32 = 4;
/// VIRTIO_BLK_T_WRITE_ZEROES.
pub const T_WRITE_ZEROES: u32 = 13;
const DESC_F_NEXT: u16 = 1;
const DESC_F_WRITE: u16 = 2;

/// How long the frontend waits for a reply or a completion.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// The guest's memory: a memfd of MEM_SIZE mapped here, shared with the backend as two regions.
pub struct GuestMemory {
    /// The memfd, sent with SET_MEM_TABLE.
    pub file: OwnedFd,
    base: *mut u8,
}

impl GuestMemory {
    /// A zeroed memfd of MEM_SIZE, mapped.
    pub fn new() -> GuestMemory {
        // SAFETY: memfd_create with a static name; the result is checked and then owned.
        let fd = unsafe { libc::memfd_create(c"vhost-user-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` was just created and is ours.
        let file = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ftruncate on our memfd; mmap of its whole length, shared, at an address the
        // kernel chooses; checked.
        let base = unsafe {
            assert_eq!(libc::ftruncate(fd, i64::try_from(MEM_SIZE).unwrap()), 0);
            let p = libc::mmap(
                std::ptr::null_mut(),
                MEM_LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            p.cast::<u8>()
        };
        GuestMemory { file, base }
    }

    /// The frontend's (our) address of guest address `gpa`.
    pub fn uva(&self, gpa: u64) -> u64 {
        let offset = if gpa >= REGION_B_GPA { gpa - REGION_B_GPA + MIB } else { gpa };
        assert!(offset < MEM_SIZE);
        u64::try_from(self.base.addr()).unwrap() + offset
    }

    fn ptr(&self, gpa: u64) -> *mut u8 {
        self.uva(gpa) as *mut u8
    }

    /// Write `bytes` at guest address `gpa`.
    pub fn write(&self, gpa: u64, bytes: &[u8]) {
        // SAFETY: `ptr` checks that `gpa` is inside the mapping; the test keeps writes short.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr(gpa), bytes.len()) }
    }

    /// `len` bytes at guest address `gpa`.
    pub fn read(&self, gpa: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        // SAFETY: as `write`.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr(gpa), out.as_mut_ptr(), len) }
        out
    }

    /// The 16-bit ring field at guest address `gpa`, shared with the backend.
    pub fn u16(&self, gpa: u64) -> &AtomicU16 {
        // SAFETY: 2-byte aligned addresses inside the mapping, which lives as long as `self`.
        unsafe { AtomicU16::from_ptr(self.ptr(gpa).cast()) }
    }

    /// The two regions of the memory table.
    pub fn regions(&self) -> [MemoryRegion; 2] {
        [
            MemoryRegion {
                guest_phys_addr: 0,
                memory_size: MIB,
                userspace_addr: self.uva(0),
                mmap_offset: 0,
            },
            MemoryRegion {
                guest_phys_addr: REGION_B_GPA,
                memory_size: MIB,
                userspace_addr: self.uva(REGION_B_GPA),
                mmap_offset: MIB,
            },
        ]
    }
}

impl Default for GuestMemory {
    fn default() -> GuestMemory {
        GuestMemory::new()
    }
}

impl Drop for GuestMemory {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.base.cast(), MEM_LEN) };
    }
}

/// SET_MEM_TABLE's payload for `regions`.
pub fn table_payload(regions: &[MemoryRegion]) -> Vec<u8> {
    let mut payload = Vec::new();
    payload.extend_from_slice(&u32::try_from(regions.len()).unwrap().to_le_bytes());
    payload.extend_from_slice(&0u32.to_le_bytes());
    for region in regions {
        payload.extend_from_slice(&region.to_bytes());
    }
    payload
}

/// A vring state payload (SET_VRING_NUM, SET_VRING_BASE, ...): index and number.
pub fn state(index: u32, num: u32) -> Vec<u8> {
    let mut payload = index.to_le_bytes().to_vec();
    payload.extend_from_slice(&num.to_le_bytes());
    payload
}

/// Wait until `fd` is readable; `false` on timeout.
pub fn readable(fd: RawFd, timeout: Duration) -> bool {
    let mut pollfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut pollfd, 1, i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX)) > 0 }
}

/// One started vring: its eventfds and the frontend's indexes.
pub struct Vring {
    /// Kicked by the frontend when it publishes.
    pub kick: EventFd,
    /// Signalled by the backend when it completes.
    pub call: EventFd,
    /// Signalled by the backend on a ring error.
    pub err: EventFd,
    /// Next avail index the driver (we) will publish; the used index we have seen.
    pub avail_idx: u16,
    /// The used index seen so far.
    pub used_seen: u16,
}

/// A vhost-user frontend connected to a backend's socket, with its guest memory and vrings.
pub struct Frontend {
    /// The connection.
    pub stream: UnixStream,
    /// The guest memory it shares.
    pub mem: GuestMemory,
    /// Its vrings, by queue index (unstarted ones are placeholders).
    pub vrings: Vec<Vring>,
    /// Whether requests ask for a REPLY_ACK (on after `negotiate`).
    pub reply_ack: bool,
}

impl Frontend {
    /// Connect to the backend at `path`, with fresh guest memory and no vring.
    pub fn connect(path: &Path) -> Frontend {
        let stream = UnixStream::connect(path).expect("connect to the backend");
        stream.set_read_timeout(Some(TIMEOUT)).unwrap();
        Frontend { stream, mem: GuestMemory::new(), vrings: Vec::new(), reply_ack: false }
    }

    /// Connect to the backend at `path`, do QEMU's handshake for `features` (`negotiate`), send
    /// the memory table and start vring 0 from avail index `base`: a frontend ready for requests.
    pub fn ready(path: &Path, features: u64, base: u16) -> Frontend {
        let mut frontend = Frontend::connect(path);
        frontend.negotiate(features);
        frontend.set_mem_table();
        frontend.start_vring(0, base);
        frontend
    }

    /// Send `request` with `payload` and `fds`, asking for an acknowledgement if REPLY_ACK is on.
    pub fn send(&self, request: u32, payload: &[u8], fds: &[RawFd]) {
        let flags = VERSION | if self.reply_ack { FLAG_NEED_REPLY } else { 0 };
        self.send_flags(request, flags, payload, fds);
    }

    /// Send `request` with the header flags `flags`, as they are.
    pub fn send_flags(&self, request: u32, flags: u32, payload: &[u8], fds: &[RawFd]) {
        let header = Header { request, flags, size: u32::try_from(payload.len()).unwrap() };
        Wire::new(&self.stream, TIMEOUT).send(header, payload, fds).expect("send to the backend");
    }

    /// Receive a reply to `request`; panics on anything else.
    pub fn reply(&self, request: u32) -> Vec<u8> {
        let (header, payload, fds) = Wire::new(&self.stream, TIMEOUT)
            .with_idle_limit(TIMEOUT)
            .recv()
            .expect("a reply")
            .unwrap_or_else(|| panic!("the backend closed the connection instead of answering {request}"));
        assert_eq!(header.request, request);
        assert_eq!(header.flags, VERSION | FLAG_REPLY);
        assert!(fds.is_empty());
        payload
    }

    /// Send a request that has no reply of its own (acknowledged if REPLY_ACK is on).
    pub fn set(&self, request: u32, payload: &[u8], fds: &[RawFd]) {
        self.send(request, payload, fds);
        if self.reply_ack {
            assert_eq!(self.reply(request), 0u64.to_le_bytes(), "acknowledgement of request {request}");
        }
    }

    /// Send `request` (a GET_*) and return its 64-bit reply.
    pub fn get_u64(&self, request: u32) -> u64 {
        self.send_flags(request, VERSION, &[], &[]);
        u64::from_le_bytes(self.reply(request).try_into().unwrap())
    }

    /// The connection is closed by the backend (after an optional failure acknowledgement);
    /// returns the acknowledgement if there was one.
    pub fn expect_closed(&mut self) -> Option<u64> {
        let mut ack = None;
        let mut bytes = Vec::new();
        // Reads to end of file; a reset connection counts as closed too.
        let _ = (&self.stream).read_to_end(&mut bytes);
        if bytes.len() == 12 + 8 {
            ack = Some(u64::from_le_bytes(bytes[12..20].try_into().unwrap()));
        } else {
            assert!(bytes.is_empty(), "unexpected bytes from the backend before it closed: {bytes:?}");
        }
        ack
    }

    /// The handshake QEMU does on connecting: features, protocol features, queue count, config.
    pub fn negotiate(&mut self, features: u64) -> u64 {
        self.negotiate_protocol(features, P_MQ | P_REPLY_ACK | P_CONFIG)
    }

    /// As `negotiate`, taking the protocol features `protocol` (REPLY_ACK among them).
    pub fn negotiate_protocol(&mut self, features: u64, protocol: u64) -> u64 {
        let offered = self.get_u64(code::GET_FEATURES);
        assert_ne!(offered & F_PROTOCOL_FEATURES, 0);
        self.set(code::SET_OWNER, &[], &[]);
        let offered_protocol = self.get_u64(code::GET_PROTOCOL_FEATURES);
        assert_eq!(offered_protocol & protocol, protocol);
        self.set(code::SET_PROTOCOL_FEATURES, &protocol.to_le_bytes(), &[]);
        self.reply_ack = true;
        self.set(code::SET_FEATURES, &(features & offered).to_le_bytes(), &[]);
        offered
    }

    /// GET_CONFIG of `size` bytes at `offset`: the bytes.
    pub fn config(&self, offset: u32, size: u32) -> Vec<u8> {
        let mut payload = Vec::new();
        for v in [offset, size, 0] {
            payload.extend_from_slice(&v.to_le_bytes());
        }
        payload.resize(12 + usize::try_from(size).unwrap(), 0);
        self.send_flags(code::GET_CONFIG, VERSION, &payload, &[]);
        let reply = self.reply(code::GET_CONFIG);
        assert_eq!(reply.len(), 12 + usize::try_from(size).unwrap());
        assert_eq!(&reply[..8], &payload[..8]);
        reply[12..].to_vec()
    }

    /// SET_CONFIG's payload: offset, size, flags, then `data` (`size` need not be its length).
    pub fn config_write(offset: u32, size: u32, flags: u32, data: &[u8]) -> Vec<u8> {
        let mut payload = Vec::new();
        for v in [offset, size, flags] {
            payload.extend_from_slice(&v.to_le_bytes());
        }
        payload.extend_from_slice(data);
        payload
    }

    /// Switch the cache mode as QEMU 7.2's vhost-user-blk does when its driver writes `wce`:
    /// SET_CONFIG of the 1-byte field at offsetof(struct virtio_blk_config, wce), flags 0.
    pub fn set_writeback(&self, writeback: u8) {
        self.set(code::SET_CONFIG, &Self::config_write(CONFIG_WRITEBACK, 1, 0, &[writeback]), &[]);
    }

    /// SET_MEM_TABLE of the two regions of its memory.
    pub fn set_mem_table(&self) {
        let regions = self.mem.regions();
        let fd = self.mem.file.as_raw_fd();
        self.set(code::SET_MEM_TABLE, &table_payload(&regions), &[fd, fd]);
    }

    /// Where vring `queue`'s descriptor table, avail and used rings are (guest addresses).
    pub fn ring(&self, queue: u16) -> (u64, u64, u64) {
        let offset = u64::from(queue) * QUEUE_STRIDE;
        (DESC + offset, AVAIL + offset, USED + offset)
    }

    /// Set up and start vring `queue` from avail index `base` (rings as the guest left them).
    pub fn start_vring(&mut self, queue: u16, base: u16) {
        self.start_vring_of_size(queue, base, QUEUE_SIZE);
    }

    /// As `start_vring`, with `size` entries (at most 256: the rings fit QUEUE_STRIDE). The
    /// helpers that lay out chains and publish them assume QUEUE_SIZE; a larger ring's user
    /// writes its own.
    pub fn start_vring_of_size(&mut self, queue: u16, base: u16, size: u16) {
        assert!(size <= 256 && size.is_power_of_two());
        let (desc, avail, used) = self.ring(queue);
        let index = u32::from(queue);
        self.set(code::SET_VRING_NUM, &state(index, u32::from(size)), &[]);
        self.set(code::SET_VRING_BASE, &state(index, u32::from(base)), &[]);
        let addr = VringAddr {
            index,
            flags: 0,
            desc: self.mem.uva(desc),
            used: self.mem.uva(used),
            avail: self.mem.uva(avail),
            log: 0,
        };
        self.set(code::SET_VRING_ADDR, &addr.to_bytes(), &[]);
        let vring = Vring {
            kick: EventFd::new(libc::EFD_NONBLOCK).unwrap(),
            call: EventFd::new(libc::EFD_NONBLOCK).unwrap(),
            err: EventFd::new(libc::EFD_NONBLOCK).unwrap(),
            avail_idx: self.mem.u16(avail + 2).load(Ordering::Acquire),
            used_seen: self.mem.u16(used + 2).load(Ordering::Acquire),
        };
        self.set(code::SET_VRING_CALL, &u64::from(index).to_le_bytes(), &[vring.call.as_raw_fd()]);
        self.set(code::SET_VRING_ERR, &u64::from(index).to_le_bytes(), &[vring.err.as_raw_fd()]);
        self.set(code::SET_VRING_KICK, &u64::from(index).to_le_bytes(), &[vring.kick.as_raw_fd()]);
        while self.vrings.len() <= usize::from(queue) {
            self.vrings.push(Vring {
                kick: EventFd::new(0).unwrap(),
                call: EventFd::new(0).unwrap(),
                err: EventFd::new(0).unwrap(),
                avail_idx: 0,
                used_seen: 0,
            });
        }
        self.vrings[usize::from(queue)] = vring;
        self.set(code::SET_VRING_ENABLE, &state(index, 1), &[]);
    }

    /// SET_VRING_ADDR for vring `queue` as `start_vring` sets it, with `flags` and
    /// `log_guest_addr` (the used ring's guest address, for VHOST_VRING_F_LOG).
    pub fn set_vring_addr(&self, queue: u16, flags: u32, log: u64) {
        let (desc, avail, used) = self.ring(queue);
        let addr = VringAddr {
            index: u32::from(queue),
            flags,
            desc: self.mem.uva(desc),
            used: self.mem.uva(used),
            avail: self.mem.uva(avail),
            log,
        };
        self.set(code::SET_VRING_ADDR, &addr.to_bytes(), &[]);
    }

    /// Stop vring `queue`; returns the backend's next avail index.
    pub fn stop_vring(&self, queue: u16) -> u16 {
        self.set(code::SET_VRING_ENABLE, &state(u32::from(queue), 0), &[]);
        self.send_flags(code::GET_VRING_BASE, VERSION, &state(u32::from(queue), 0), &[]);
        let reply = self.reply(code::GET_VRING_BASE);
        assert_eq!(reply[..4], u32::from(queue).to_le_bytes());
        u16::try_from(u32::from_le_bytes(reply[4..8].try_into().unwrap())).unwrap()
    }

    /// Put a chain of (guest address, length, device-writable) buffers in the ring and kick.
    pub fn submit(&mut self, queue: u16, chain: &[(u64, u32, bool)]) {
        self.write_chain(queue, chain);
        self.publish(queue, &[0]);
    }

    /// Lay out a chain in the descriptor table, starting at descriptor 0 (one request at a
    /// time).
    pub fn write_chain(&self, queue: u16, chain: &[(u64, u32, bool)]) {
        let (desc, _, _) = self.ring(queue);
        for (i, &(addr, len, writable)) in chain.iter().enumerate() {
            let mut flags = if writable { DESC_F_WRITE } else { 0 };
            if i + 1 < chain.len() {
                flags |= DESC_F_NEXT;
            }
            let mut bytes = [0u8; 16];
            bytes[0..8].copy_from_slice(&addr.to_le_bytes());
            bytes[8..12].copy_from_slice(&len.to_le_bytes());
            bytes[12..14].copy_from_slice(&flags.to_le_bytes());
            bytes[14..16].copy_from_slice(&(u16::try_from(i).unwrap() + 1).to_le_bytes());
            self.mem.write(desc + 16 * u64::try_from(i).unwrap(), &bytes);
        }
    }

    /// Make `heads` available in one update of the avail index, and kick.
    pub fn publish(&mut self, queue: u16, heads: &[u16]) {
        let (_, avail, _) = self.ring(queue);
        let vring = &mut self.vrings[usize::from(queue)];
        for &head in heads {
            let slot = vring.avail_idx % QUEUE_SIZE;
            self.mem.u16(avail + 4 + 2 * u64::from(slot)).store(head, Ordering::Release);
            vring.avail_idx = vring.avail_idx.wrapping_add(1);
        }
        // used_event: interrupt us on every completion (EVENT_IDX).
        self.mem.u16(avail + 4 + 2 * u64::from(QUEUE_SIZE)).store(vring.used_seen, Ordering::Release);
        fence(Ordering::SeqCst);
        self.mem.u16(avail + 2).store(vring.avail_idx, Ordering::Release);
        fence(Ordering::SeqCst);
        vring.kick.write(1).unwrap();
    }

    /// Wait for the next used element: (head, bytes written).
    pub fn wait_used(&mut self, queue: u16) -> (u32, u32) {
        let (_, _, used) = self.ring(queue);
        let vring = &mut self.vrings[usize::from(queue)];
        let deadline = Instant::now() + TIMEOUT;
        while self.mem.u16(used + 2).load(Ordering::Acquire) == vring.used_seen {
            assert!(Instant::now() < deadline, "no completion on queue {queue} within {TIMEOUT:?}");
            std::thread::sleep(Duration::from_micros(50));
        }
        let slot = u64::from(vring.used_seen % QUEUE_SIZE);
        vring.used_seen = vring.used_seen.wrapping_add(1);
        let elem = self.mem.read(used + 4 + 8 * slot, 8);
        (
            u32::from_le_bytes(elem[0..4].try_into().unwrap()),
            u32::from_le_bytes(elem[4..8].try_into().unwrap()),
        )
    }

    /// One virtio-blk request of type `kind` at `sector` with `len` data bytes at DATA; returns
    /// the status byte.
    pub fn blk(&mut self, queue: u16, kind: u32, sector: u64, len: u32) -> u8 {
        let chain = self.blk_chain(kind, sector, len);
        self.submit(queue, &chain);
        let (head, written) = self.wait_used(queue);
        assert_eq!(head, 0);
        let status = self.mem.read(STATUS, 1)[0];
        if status == 0 && kind == T_IN {
            assert_eq!(written, len + 1);
        }
        status
    }

    /// A 4 KiB write of `pattern(seed)` at `sector` through vring 0, read back and compared.
    pub fn write_and_read_back(&mut self, sector: u64, seed: u8) {
        let data = pattern(seed);
        self.mem.write(DATA, &data);
        assert_eq!(self.blk(0, T_OUT, sector, 4096), 0, "write status");
        self.mem.write(DATA, &[0; 4096]);
        assert_eq!(self.blk(0, T_IN, sector, 4096), 0, "read status");
        assert_eq!(self.mem.read(DATA, 4096), data, "read back what was written");
    }

    /// Write a virtio-blk request header (and a status byte of 0xff) and return its chain:
    /// header, `len` data bytes at DATA (none if 0), status.
    pub fn blk_chain(&self, kind: u32, sector: u64, len: u32) -> Vec<(u64, u32, bool)> {
        let mut header = [0u8; 16];
        header[0..4].copy_from_slice(&kind.to_le_bytes());
        header[8..16].copy_from_slice(&sector.to_le_bytes());
        self.mem.write(HEADER, &header);
        self.mem.write(STATUS, &[0xff]);
        let mut chain = vec![(HEADER, 16, false)];
        if len > 0 {
            chain.push((DATA, len, kind == T_IN));
        }
        chain.push((STATUS, 1, true));
        chain
    }
}

/// 4 KiB of data that differs with `seed`, for a write to be told from another.
pub fn pattern(seed: u8) -> Vec<u8> {
    (0..=u8::MAX).cycle().take(4096).map(|i| i.wrapping_mul(31).wrapping_add(seed)).collect()
}

/// A dirty log as QEMU makes one: a memfd of `len` bytes, sealed against resizing, mapped here.
pub struct DirtyLogFile {
    /// The memfd, sent with SET_LOG_BASE.
    pub file: OwnedFd,
    base: *mut u8,
    len: usize,
}

impl DirtyLogFile {
    /// A dirty log of `len` bytes; `seal`: sealed against resizing.
    pub fn new(len: usize, seal: bool) -> DirtyLogFile {
        let (file, base) = shared_memfd(len, seal);
        DirtyLogFile { file, base, len }
    }

    fn byte(&self, index: usize) -> &std::sync::atomic::AtomicU8 {
        assert!(index < self.len);
        // SAFETY: inside the mapping, which lives as long as `self`; the backend sets bits
        // concurrently, so only atomically.
        unsafe { std::sync::atomic::AtomicU8::from_ptr(self.base.add(index)) }
    }

    /// Clear every bit (QEMU does after each sync).
    pub fn clear(&self) {
        for i in 0..self.len {
            self.byte(i).store(0, Ordering::SeqCst);
        }
    }

    /// The guest pages (4 KiB) marked dirty.
    pub fn dirty_pages(&self) -> Vec<u64> {
        let mut pages = Vec::new();
        for i in 0..self.len {
            let bits = self.byte(i).load(Ordering::SeqCst);
            for bit in 0..8 {
                if bits & 1 << bit != 0 {
                    pages.push(u64::try_from(i * 8 + bit).unwrap());
                }
            }
        }
        pages
    }
}

impl Drop for DirtyLogFile {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// SET_LOG_BASE's payload: mmap_size, mmap_offset.
pub fn log_base_payload(size: u64, offset: u64) -> Vec<u8> {
    [size.to_le_bytes(), offset.to_le_bytes()].concat()
}

/// `len` bytes of a new memfd (sealed against resizing if `seal`, as QEMU's dirty log and
/// GET_INFLIGHT_FD's region are), mapped shared here.
pub fn shared_memfd(len: usize, seal: bool) -> (OwnedFd, *mut u8) {
    // SAFETY: memfd_create with a static name; the result is checked and then owned.
    let fd = unsafe {
        libc::memfd_create(c"vhost-user-test-shm".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
    };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` was just created and is ours.
    let file = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate and fcntl on our memfd; checked.
    unsafe {
        assert_eq!(libc::ftruncate(fd, i64::try_from(len).unwrap()), 0);
        if seal {
            assert_eq!(libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW), 0);
        }
    }
    let base = map_shared(fd, len);
    (file, base)
}

/// Map `len` bytes of `fd` shared, readable and writable; the caller unmaps them.
pub fn map_shared(fd: RawFd, len: usize) -> *mut u8 {
    // SAFETY: a new shared mapping at an address the kernel chooses; checked.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
    p.cast()
}
