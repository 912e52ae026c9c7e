//! A vhost-user-blk backend served in a thread of the test's own process, over a RAM disk file,
//! for the test frontend ([`crate::frontend`]) to talk to: no daemon process, no VM.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

use iocore::{IoCore, Policy};
use storage::{Backend, RamDisk};
use vhost_user::{Server, VhostUserBlk};
use virtio::block::Block;
use vmm_sys_util::eventfd::EventFd;

use crate::frontend::MIB;

/// The RAM disk's size.
pub const DISK_SIZE: u64 = MIB;

/// A backend serving on a socket in its own thread, over a RAM disk file in /dev/shm. Stopped,
/// and its thread joined, when dropped.
pub struct TestBackend {
    /// The socket it listens on.
    pub socket: PathBuf,
    /// The RAM disk's file.
    pub disk: PathBuf,
    stop: EventFd,
    thread: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl TestBackend {
    /// A backend of `queues` queues, each its own handle on the disk, on an IOCore of `policy`;
    /// a writable disk offers the cache-mode switch, as the daemon's do.
    pub fn start(policy: Policy, queues: usize, read_only: bool) -> TestBackend {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let disk = dir.path().join("disk");
        drop(RamDisk::create(&disk, DISK_SIZE).unwrap());
        let backends: Vec<Box<dyn Backend>> = (0..queues)
            .map(|_| Box::new(RamDisk::open(&disk, read_only).unwrap()) as Box<dyn Backend>)
            .collect();
        let mut block = Block::with_queues(backends, "vhost-user-test").unwrap();
        if !read_only {
            block = block.with_writeback_switch();
        }
        let iocore = Arc::new(IoCore::spawn(policy, None).unwrap());
        let mut device = VhostUserBlk::new(block, iocore.clone());
        let socket = dir.path().join("sock");
        let server = Server::bind(&socket).unwrap();
        let stop = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let stop_fd = stop.try_clone().unwrap();
        let thread = std::thread::spawn(move || {
            // SAFETY: `stop_fd` lives in this closure until `serve` returns.
            let stop = unsafe { BorrowedFd::borrow_raw(stop_fd.as_raw_fd()) };
            server.serve(&mut device, Some(stop)).unwrap();
            drop(device);
            iocore.stop();
        });
        TestBackend { socket, disk, stop, thread: Some(thread), _dir: dir }
    }

    /// `len` bytes of the disk file from `offset`.
    pub fn disk_bytes(&self, offset: usize, len: usize) -> Vec<u8> {
        std::fs::read(&self.disk).unwrap()[offset..offset + len].to_vec()
    }
}

impl Drop for TestBackend {
    fn drop(&mut self) {
        self.stop.write(1).unwrap();
        if let Some(thread) = self.thread.take() {
            let result = thread.join();
            if !std::thread::panicking() {
                result.expect("the server thread panicked");
            }
        }
    }
}
