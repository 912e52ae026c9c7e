//! What the vhost-user targets share: a frontend's guest memory on a memfd, descriptors a
//! frontend might send (right and hostile ones), vhost-user messages mostly well formed per
//! request code, QEMU's ring start-up sequence, and a worker host that runs workers inline.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, OnceLock};

use arbitrary::{Result, Unstructured};
use vhost_user::backend::OFFERED_PROTOCOL_FEATURES;
use vhost_user_protocol::message::{
    code, Header, InflightInfo, MemoryRegion, VringAddr, FLAG_NEED_REPLY, VERSION, VRING_F_LOG, VRING_NOFD,
};
use virtio::block::BlockWorker;
use virtqueue::{QueueWorker, WorkerHost};
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap, MmapRegion};
use vmm_sys_util::eventfd::EventFd;

use crate::{clear_memfd, queue_config, DriverRing};

/// The frontend's guest RAM: one memfd, guest-physical address = file offset.
pub const FRONTEND_MEM: u64 = 0x3_0000;
/// Where the frontend has its guest RAM mapped (ring addresses are given in this space).
pub const FRONTEND_BASE: u64 = 0x7f00_0000_0000;

/// Runs workers on the caller's thread, when the target says: the IOCore's role, without a
/// thread, so every input runs the same way.
#[derive(Default)]
pub struct InlineHost {
    workers: Mutex<Vec<(u64, BlockWorker)>>,
}

impl WorkerHost<BlockWorker> for InlineHost {
    fn attach(&self, id: u64, worker: BlockWorker, _notify: Option<Arc<EventFd>>) {
        let mut workers = self.workers.lock().unwrap();
        assert!(workers.iter().all(|(other, _)| *other != id), "worker {id:#x} attached twice");
        workers.push((id, worker));
    }

    fn detach(&self, id: u64) -> Option<BlockWorker> {
        let mut workers = self.workers.lock().unwrap();
        let at = workers.iter().position(|(other, _)| *other == id)?;
        Some(workers.swap_remove(at).1)
    }
}

impl InlineHost {
    /// Poll every attached worker once: after it, a RAM disk's worker holds nothing in flight.
    pub fn poll(&self) {
        for (_, worker) in self.workers.lock().unwrap().iter_mut() {
            worker.poll();
            assert_eq!(worker.in_flight(), 0, "requests left in flight after a poll of a RAM disk");
        }
    }

    /// How many workers are attached (running rings).
    pub fn attached(&self) -> usize {
        self.workers.lock().unwrap().len()
    }
}

/// The frontend's memfd (zeroed) and this process's own view of it, to write requests into.
pub fn frontend_memory() -> (&'static File, GuestMemoryMmap) {
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

pub fn owned(fd: libc::c_int) -> OwnedFd {
    assert!(fd >= 0, "creating a descriptor: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` was just created and nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

pub fn duplicate(file: &File) -> OwnedFd {
    // SAFETY: duplicates an open descriptor; the result is checked in `owned`.
    owned(unsafe { libc::dup(file.as_raw_fd()) })
}

pub fn eventfd() -> OwnedFd {
    // SAFETY: creates a descriptor; the result is checked in `owned`.
    owned(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) })
}

/// A pipe's (reader, writer).
pub fn pipe() -> (OwnedFd, OwnedFd) {
    let mut ends = [-1; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given; checked in `owned`.
    unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) };
    (owned(ends[0]), owned(ends[1]))
}

/// An in-flight region as a frontend hands it back: a memfd of `len` bytes (at most 64 KiB)
/// sealed against shrinking, its contents from the input (the rest zero).
pub fn inflight_region(u: &mut Unstructured, len: u64) -> Result<OwnedFd> {
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
pub fn descriptor(u: &mut Unstructured, memfd: &File, want_memory: bool) -> Result<OwnedFd> {
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

pub fn index(u: &mut Unstructured) -> Result<u32> {
    Ok(if u.ratio(1, 8)? { u.arbitrary()? } else { u.int_in_range(0..=2)? })
}

/// One message as a frontend would send it: header, payload and descriptors, mostly well
/// formed for its request code.
pub fn message(
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

pub type Raw = (Header, Vec<u8>, Vec<OwnedFd>);

pub fn raw(request: u32, payload: &[u8], fds: Vec<OwnedFd>) -> Raw {
    (Header { request, flags: VERSION, size: payload.len() as u32 }, payload.to_vec(), fds)
}

pub fn pair(a: u32, b: u32) -> [u8; 8] {
    (u64::from(a) | u64::from(b) << 32).to_le_bytes()
}

/// What QEMU sends to start queue `index` (after features and a memory table covering the
/// memfd): size, rings where the guest put them, base 0, call and kick eventfds, enable.
pub fn start_ring(
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
