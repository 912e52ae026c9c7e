//! vhost-user: message parsing (`Message::parse`) and the per-connection state machine
//! (`Session::handle`), fed sequences of messages as `server.rs` feeds them (a refused message
//! ends the connection, and the next one gets a new session), with real descriptors attached:
//! memfds for memory tables, eventfds, pipes (one with its reader gone), sockets, /dev/null, and
//! sealed memfds of arbitrary contents as in-flight regions (SET_INFLIGHT_FD), which the next
//! ring to start recovers from, and as dirty logs (SET_LOG_BASE, of plausible and arbitrary
//! sizes and offsets), with SET_LOG_FD and VHOST_VRING_F_LOG rings.
//! Between messages the frontend's guest posts virtio-blk requests in the shared memory, and the
//! running rings' workers are polled. Nothing may panic; after a poll nothing is left in flight
//! (RAM disks); when a connection ends, every ring it started has been stopped.
#![no_main]

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, Once, OnceLock};

use arbitrary::{Result, Unstructured};
use exitless_fuzz::{clear_memfd, queue_config, ram_disk, DriverRing, MAX_STEPS};
use libfuzzer_sys::fuzz_target;
use vhost_user::backend::OFFERED_PROTOCOL_FEATURES;
use vhost_user::{Session, VhostUserBlk};
use vhost_user_protocol::message::{
    code, Header, InflightInfo, MemoryRegion, Message, VringAddr, FLAG_NEED_REPLY, VERSION, VRING_F_LOG,
    VRING_NOFD,
};
use virtio::block::Block;
use virtio::{QueueWorker, WorkerHost};
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap, MmapRegion};
use vmm_sys_util::eventfd::EventFd;

/// The frontend's guest RAM: one memfd, guest-physical address = file offset.
const FRONTEND_MEM: u64 = 0x3_0000;
/// Where the frontend has its guest RAM mapped (ring addresses are given in this space).
const FRONTEND_BASE: u64 = 0x7f00_0000_0000;

/// Runs workers on the caller's thread, when the target says: the IOCore's role, without a
/// thread, so every input runs the same way.
#[derive(Default)]
struct InlineHost {
    workers: Mutex<Vec<(u64, Box<dyn QueueWorker>)>>,
}

impl WorkerHost for InlineHost {
    fn attach(&self, id: u64, worker: Box<dyn QueueWorker>, _notify: Option<Arc<EventFd>>) {
        let mut workers = self.workers.lock().unwrap();
        assert!(workers.iter().all(|(other, _)| *other != id), "worker {id:#x} attached twice");
        workers.push((id, worker));
    }

    fn detach(&self, id: u64) -> Option<Box<dyn QueueWorker>> {
        let mut workers = self.workers.lock().unwrap();
        let at = workers.iter().position(|(other, _)| *other == id)?;
        Some(workers.swap_remove(at).1)
    }
}

impl InlineHost {
    fn poll(&self) {
        for (_, worker) in self.workers.lock().unwrap().iter_mut() {
            worker.poll();
            assert_eq!(worker.in_flight(), 0, "requests left in flight after a poll of a RAM disk");
        }
    }

    fn attached(&self) -> usize {
        self.workers.lock().unwrap().len()
    }
}

/// The frontend's memfd (zeroed) and this process's own view of it, to write requests into.
fn frontend_memory() -> (&'static File, GuestMemoryMmap) {
    static MEMORY: OnceLock<(File, GuestMemoryMmap)> = OnceLock::new();
    let (file, mem) = MEMORY.get_or_init(|| {
        // SAFETY: a NUL-terminated name; the result is checked before it is owned.
        let fd = unsafe { libc::memfd_create(c"exitless-fuzz-frontend".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(FRONTEND_MEM).expect("sizing the frontend's memfd");
        let view = FileOffset::new(file.try_clone().expect("dup"), 0);
        let region = MmapRegion::from_file(view, FRONTEND_MEM as usize).expect("mapping the memfd");
        let region = GuestRegionMmap::new(region, GuestAddress(0)).expect("a region at 0");
        let mem = GuestMemoryMmap::from_regions(vec![region]).expect("one region");
        (file, mem)
    });
    clear_memfd(file, FRONTEND_MEM);
    (file, mem.clone())
}

fn owned(fd: libc::c_int) -> OwnedFd {
    assert!(fd >= 0, "creating a descriptor: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` was just created and nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn duplicate(file: &File) -> OwnedFd {
    // SAFETY: duplicates an open descriptor; the result is checked in `owned`.
    owned(unsafe { libc::dup(file.as_raw_fd()) })
}

fn eventfd() -> OwnedFd {
    // SAFETY: creates a descriptor; the result is checked in `owned`.
    owned(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) })
}

/// A pipe's (reader, writer).
fn pipe() -> (OwnedFd, OwnedFd) {
    let mut ends = [-1; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given; checked in `owned`.
    unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) };
    (owned(ends[0]), owned(ends[1]))
}

/// An in-flight region as a frontend hands it back: a memfd of `len` bytes (at most 64 KiB)
/// sealed against shrinking, its contents from the input (the rest zero).
fn inflight_region(u: &mut Unstructured, len: u64) -> Result<OwnedFd> {
    let len = len.min(0x1_0000);
    // SAFETY: memfd_create with a static name; `owned` checks the result.
    let fd = unsafe {
        libc::memfd_create(c"exitless-fuzz-inflight".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
    };
    let file = File::from(owned(fd));
    file.set_len(len).expect("sizing the in-flight memfd");
    let available = u.len().min(len as usize);
    let count = u.int_in_range(0..=available)?;
    let contents = u.bytes(count)?;
    std::os::unix::fs::FileExt::write_all_at(&file, contents, 0).expect("filling the in-flight memfd");
    // SAFETY: fcntl on the memfd we own.
    let sealed =
        unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW) };
    assert_eq!(sealed, 0, "sealing the in-flight memfd");
    Ok(OwnedFd::from(file))
}

/// A descriptor a frontend might send: mostly the right kind, sometimes a hostile one.
fn descriptor(u: &mut Unstructured, memfd: &File, want_memory: bool) -> Result<OwnedFd> {
    let kind = if u.ratio(1, 4)? { u.int_in_range(0..=5)? } else { u8::from(!want_memory) };
    Ok(match kind {
        0 => duplicate(memfd),
        1 => eventfd(),
        2 | 3 => {
            let (reader, writer) = pipe();
            // The read end (writes to it fail), or the write end with its reader gone (EPIPE).
            if kind == 2 {
                reader
            } else {
                writer
            }
        }
        4 => OwnedFd::from(UnixStream::pair().expect("socketpair").0),
        _ => OwnedFd::from(File::open("/dev/null").expect("/dev/null")),
    })
}

fn index(u: &mut Unstructured) -> Result<u32> {
    Ok(if u.ratio(1, 8)? { u.arbitrary()? } else { u.int_in_range(0..=2)? })
}

/// One message as a frontend would send it: header, payload and descriptors, mostly well
/// formed for its request code.
fn message(
    u: &mut Unstructured,
    memfd: &File,
    features: u64,
    rings: &[DriverRing],
) -> Result<(Header, Vec<u8>, Vec<OwnedFd>)> {
    let request = if u.ratio(1, 16)? { u.arbitrary()? } else { u.int_in_range(1..=code::GET_STATUS + 1)? };
    let mut payload = Vec::new();
    let mut fds = Vec::new();
    let word = |u: &mut Unstructured, offered: u64| -> Result<u64> {
        Ok(if u.ratio(1, 8)? { u.arbitrary()? } else { offered & u.arbitrary::<u64>()? })
    };
    match request {
        code::SET_FEATURES => payload.extend_from_slice(&word(u, features)?.to_le_bytes()),
        code::SET_PROTOCOL_FEATURES => {
            payload.extend_from_slice(&word(u, OFFERED_PROTOCOL_FEATURES)?.to_le_bytes())
        }
        code::SET_VRING_NUM | code::SET_VRING_BASE | code::GET_VRING_BASE | code::SET_VRING_ENABLE => {
            let index = index(u)?;
            let num: u32 = match u.int_in_range(0..=4)? {
                0 => u.arbitrary()?,
                1 => u.int_in_range(0..=1)?,
                2 => 1 << u.int_in_range(0..=9)?,
                // The size the guest's driver uses.
                _ => rings.get(index as usize).map_or(0, |ring| ring.config.size.into()),
            };
            payload.extend_from_slice(&index.to_le_bytes());
            payload.extend_from_slice(&num.to_le_bytes());
        }
        code::SET_VRING_ADDR => {
            let index = index(u)?;
            let config = match rings.get(index as usize) {
                Some(ring) if !u.ratio(1, 8)? => ring.config,
                _ => queue_config(u, u64::from(index.min(1)))?.0,
            };
            let frontend = |addr: u64| FRONTEND_BASE.wrapping_add(addr);
            let flags = match u.int_in_range(0..=7)? {
                0 => u.arbitrary()?,
                1 | 2 => VRING_F_LOG,
                _ => 0,
            };
            // The used ring's guest address, as QEMU gives it for logging, or anything.
            let log = if u.ratio(1, 8)? { u.arbitrary()? } else { config.used };
            let addr = VringAddr {
                index,
                flags,
                desc: frontend(config.desc),
                used: frontend(config.used),
                avail: frontend(config.avail),
                log,
            };
            payload.extend_from_slice(&addr.to_bytes());
        }
        code::SET_VRING_KICK | code::SET_VRING_CALL | code::SET_VRING_ERR => {
            let no_fd = u.ratio(1, 4)?;
            let value = u64::from(index(u)? & 0xff) | if no_fd { VRING_NOFD } else { 0 };
            let value = if u.ratio(1, 16)? { u.arbitrary()? } else { value };
            payload.extend_from_slice(&value.to_le_bytes());
            if !no_fd {
                fds.push(descriptor(u, memfd, false)?);
            }
        }
        code::SET_MEM_TABLE => {
            let count: u32 = if u.ratio(1, 16)? { u.int_in_range(0..=9)? } else { u.int_in_range(1..=2)? };
            payload.extend_from_slice(&count.to_le_bytes());
            payload.extend_from_slice(&[0; 4]);
            for i in 0..u64::from(count.min(9)) {
                let region = if u.ratio(1, 8)? {
                    MemoryRegion {
                        guest_phys_addr: u.arbitrary()?,
                        memory_size: u.arbitrary()?,
                        userspace_addr: u.arbitrary()?,
                        mmap_offset: u.arbitrary()?,
                    }
                } else {
                    // The whole memfd, or a page-aligned piece of it, at its own offset.
                    let start = 0x1_0000 * u.int_in_range(0..=2)? * i.min(1);
                    let size = 0x1_0000 * u.int_in_range(1..=3)?;
                    MemoryRegion {
                        guest_phys_addr: start,
                        memory_size: size,
                        userspace_addr: FRONTEND_BASE + start,
                        mmap_offset: start,
                    }
                };
                payload.extend_from_slice(&region.to_bytes());
                fds.push(descriptor(u, memfd, true)?);
            }
        }
        code::GET_INFLIGHT_FD | code::SET_INFLIGHT_FD => {
            let queue_size: u16 = if u.ratio(1, 8)? { u.arbitrary()? } else { 1 << u.int_in_range(0..=8)? };
            let num_queues: u16 = if u.ratio(1, 8)? { u.arbitrary()? } else { u.int_in_range(1..=2)? };
            // libvhost-user's size per queue.
            let needed = (16 * u64::from(queue_size) + 2).div_ceil(64) * 64 * u64::from(num_queues);
            let set = request == code::SET_INFLIGHT_FD;
            let info = InflightInfo {
                mmap_size: if u.ratio(1, 8)? {
                    u.arbitrary()?
                } else if set {
                    needed
                } else {
                    0
                },
                mmap_offset: if u.ratio(1, 8)? { u.arbitrary()? } else { 0 },
                num_queues,
                queue_size,
            };
            payload.extend_from_slice(&info.to_bytes());
            if set {
                fds.push(if u.ratio(1, 8)? {
                    descriptor(u, memfd, false)?
                } else {
                    inflight_region(u, needed)?
                });
            }
        }
        code::SET_LOG_BASE => {
            // Enough for the memfd's guest memory (a bit per 4 KiB page), or anything.
            let size: u64 = match u.int_in_range(0..=7)? {
                0 => u.arbitrary()?,
                1 => u.int_in_range(0..=8)?,
                _ => 0x1000,
            };
            let offset: u64 = if u.ratio(1, 8)? { u.arbitrary()? } else { 0 };
            payload.extend_from_slice(&size.to_le_bytes());
            payload.extend_from_slice(&offset.to_le_bytes());
            fds.push(if u.ratio(1, 8)? { descriptor(u, memfd, false)? } else { inflight_region(u, 0x1000)? });
        }
        code::SET_LOG_FD => fds.push(descriptor(u, memfd, false)?),
        code::GET_CONFIG | code::SET_CONFIG => {
            // SET_CONFIG: now and then exactly QEMU's switch of `writeback` (offset 32, one
            // byte, flags 0), so the mode changes under running rings.
            let wce = request == code::SET_CONFIG && u.ratio(1, 2)?;
            let offset: u32 = if wce {
                32
            } else if u.ratio(1, 8)? {
                u.arbitrary()?
            } else {
                u.int_in_range(0..=64)?
            };
            let size: u32 = if wce {
                1
            } else if u.ratio(1, 8)? {
                u.arbitrary()?
            } else {
                u.int_in_range(0..=64)?
            };
            let flags: u32 = if u.ratio(1, 8)? { u.arbitrary()? } else { 0 };
            for v in [offset, size, flags] {
                payload.extend_from_slice(&v.to_le_bytes());
            }
            let len = size.min(300) as usize;
            // GET_CONFIG's data area is zeros, as QEMU sends it; SET_CONFIG's is the input's.
            if wce {
                payload.push(u.int_in_range(0..=2)?);
            } else if request == code::SET_CONFIG {
                payload.extend_from_slice(u.bytes(len.min(u.len()))?);
            }
            payload.resize(12 + len, 0);
        }
        _ => {}
    }
    // Now and then: a payload of any length, bytes from the input, stray descriptors.
    if u.ratio(1, 16)? {
        let len = u.int_in_range(0..=300)?;
        payload = u.bytes(len)?.to_vec();
    }
    for _ in 0..if u.ratio(1, 16)? { u.int_in_range(1..=9)? } else { 0 } {
        fds.push(descriptor(u, memfd, false)?);
    }
    let flags = match u.int_in_range(0..=15)? {
        0 => u.arbitrary()?,
        1..=3 => VERSION | FLAG_NEED_REPLY,
        _ => VERSION,
    };
    let size = if u.ratio(1, 32)? { u.arbitrary()? } else { payload.len() as u32 };
    Ok((Header { request, flags, size }, payload, fds))
}

type Raw = (Header, Vec<u8>, Vec<OwnedFd>);

fn raw(request: u32, payload: &[u8], fds: Vec<OwnedFd>) -> Raw {
    (Header { request, flags: VERSION, size: payload.len() as u32 }, payload.to_vec(), fds)
}

fn pair(a: u32, b: u32) -> [u8; 8] {
    (u64::from(a) | u64::from(b) << 32).to_le_bytes()
}

/// What QEMU sends to start queue `index` (after features and a memory table covering the
/// memfd): size, rings where the guest put them, base 0, call and kick eventfds, enable.
fn start_ring(
    u: &mut Unstructured,
    memfd: &File,
    features: u64,
    ring: &DriverRing,
    index: u32,
) -> Result<Vec<Raw>> {
    let config = ring.config;
    let addr = VringAddr {
        index,
        flags: 0,
        desc: FRONTEND_BASE.wrapping_add(config.desc),
        used: FRONTEND_BASE.wrapping_add(config.used),
        avail: FRONTEND_BASE.wrapping_add(config.avail),
        log: 0,
    };
    let table = MemoryRegion {
        guest_phys_addr: 0,
        memory_size: FRONTEND_MEM,
        userspace_addr: FRONTEND_BASE,
        mmap_offset: 0,
    };
    let mut table_payload = pair(1, 0).to_vec();
    table_payload.extend_from_slice(&table.to_bytes());
    let memory = duplicate(memfd);
    let mut messages = vec![
        raw(code::SET_FEATURES, &(features & u.arbitrary::<u64>()?).to_le_bytes(), vec![]),
        raw(
            code::SET_PROTOCOL_FEATURES,
            &(OFFERED_PROTOCOL_FEATURES & u.arbitrary::<u64>()?).to_le_bytes(),
            vec![],
        ),
        raw(code::SET_MEM_TABLE, &table_payload, vec![memory]),
        raw(code::SET_VRING_NUM, &pair(index, config.size.into()), vec![]),
        raw(code::SET_VRING_ADDR, &addr.to_bytes(), vec![]),
        raw(code::SET_VRING_BASE, &pair(index, 0), vec![]),
        raw(code::SET_VRING_CALL, &u64::from(index).to_le_bytes(), vec![eventfd()]),
        raw(code::SET_VRING_ERR, &u64::from(index).to_le_bytes(), vec![eventfd()]),
        raw(code::SET_VRING_KICK, &u64::from(index).to_le_bytes(), vec![eventfd()]),
        raw(code::SET_VRING_ENABLE, &pair(index, 1), vec![]),
    ];
    // Sometimes one of them is left out.
    if u.ratio(1, 8)? {
        let skip = u.choose_index(messages.len())?;
        messages.remove(skip);
    }
    Ok(messages)
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});

fn run(u: &mut Unstructured) -> Result<()> {
    static IGNORE_SIGPIPE: Once = Once::new();
    // As Rust's runtime does for the exitless binary (libFuzzer's main is not Rust's): a write
    // to a pipe or socket whose reader is gone is an EPIPE error, not a fatal signal.
    // SAFETY: setting a signal's disposition to "ignore" has no memory-safety effect.
    IGNORE_SIGPIPE.call_once(|| unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    });
    let (memfd, mem) = frontend_memory();
    let queues = u.int_in_range(1..=2)?;
    let backends = (0..queues).map(|_| Box::new(ram_disk(false)) as Box<dyn storage::Backend>).collect();
    let block =
        Block::with_queues(backends, "exitless-fuzz-vhost").expect("two queues fit").with_writeback_switch();
    let host = Arc::new(InlineHost::default());
    let mut device = VhostUserBlk::new(block, host.clone());
    let features = device.features();
    // The frontend's guest, on each queue's rings where SET_VRING_ADDR mostly puts them.
    let mut rings = Vec::with_capacity(2);
    for q in 0..2 {
        let (config, laid_out) = queue_config(u, q)?;
        rings.push(DriverRing::new(config, laid_out));
    }
    let mut steps = 0;
    while steps < MAX_STEPS && !u.is_empty() {
        // One connection; its session ends (is dropped) with it, however it ends.
        let outcome = connection(u, device.session(), memfd, &mem, &mut rings, &host, features, &mut steps);
        assert_eq!(host.attached(), 0, "a connection ended with rings still running");
        if !outcome? {
            return Ok(());
        }
    }
    Ok(())
}

/// Serve one connection until a message is refused (as the server closes the connection then)
/// or the steps run out. `Ok(false)`: the input ends here (it would only meet an open bug).
#[allow(clippy::too_many_arguments)]
fn connection(
    u: &mut Unstructured,
    mut session: Session,
    memfd: &File,
    mem: &GuestMemoryMmap,
    rings: &mut [DriverRing],
    host: &InlineHost,
    features: u64,
    steps: &mut usize,
) -> Result<bool> {
    while *steps < MAX_STEPS && !u.is_empty() {
        *steps += 1;
        let messages = match u.int_in_range(0..=8)? {
            0..=3 => vec![message(u, memfd, features, rings)?],
            4 => {
                let index = u.int_in_range(0..=1)?;
                start_ring(u, memfd, features, &rings[index as usize], index)?
            }
            5 | 6 => {
                rings[usize::from(u.ratio(1, 2)?)].blk_request(u, mem)?;
                vec![]
            }
            7 => {
                rings[usize::from(u.ratio(1, 2)?)].driver_step(u, mem)?;
                vec![]
            }
            _ => {
                host.poll();
                vec![]
            }
        };
        let refused = messages.into_iter().any(|(header, payload, fds)| {
            Message::parse(header, &payload, fds)
                .map_err(vhost_user::Error::from)
                .and_then(|m| session.handle(m))
                .is_err()
        });
        if refused {
            break;
        }
    }
    Ok(true)
}
