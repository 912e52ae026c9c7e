//! Surviving a frontend that shrinks a file it shared with us.
//!
//! The frontend's memory regions are files (memfds, /dev/shm or hugetlbfs files) we map; if the
//! frontend truncates one, touching a page past the new end raises SIGBUS in whichever thread
//! touched it (the IOCore, reading a ring), and SIGBUS kills the process. Seals cannot prevent
//! this in general: QEMU seals its memfds (F_SEAL_SHRINK, with `seal=on`, the default), but
//! files on /dev/shm or hugetlbfs cannot be sealed, and Cloud Hypervisor's memfds are not. So
//! every mapped region is registered here, and a SIGBUS handler that finds the faulting address
//! inside one maps anonymous zero pages over the whole region (MAP_FIXED), signals the region's
//! fault eventfd and returns: the access is retried and reads zeros (a ring reading zeros makes
//! no progress). The server then drops the connection and tells the rings' error eventfds.
//! A SIGBUS anywhere else goes to the handler that was there before (Rust's stack-overflow
//! handler, or the default action), as if we were not here.
//!
//! The handler only reads atomics and calls mmap(2) and write(2), both async-signal-safe.

use std::os::fd::RawFd;
use std::sync::atomic::{fence, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Regions that can be registered at once: a frontend maps at most 8, 16 while a new memory
/// table replaces the old one, so 512 is room for 32 frontends of one daemon at once.
pub const MAX_REGIONS: usize = 512;

/// One registered region. Writers (under `WRITERS`) change it as a sequence lock: `seq` is odd
/// while they do, and moves on by two each time, so the handler, which cannot wait, takes a
/// start, length and eventfd only when all three came from one registration.
struct Slot {
    seq: AtomicUsize,
    start: AtomicUsize,
    /// 0: the slot is free.
    len: AtomicUsize,
    /// The eventfd to signal when the region faulted.
    event: AtomicI32,
}

impl Slot {
    /// Write the slot (the caller holds `WRITERS`).
    fn set(&self, start: usize, len: usize, event: RawFd) {
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.start.store(start, Ordering::Relaxed);
        self.event.store(event, Ordering::Relaxed);
        self.len.store(len, Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// (start, len, event) as one registration left them; `None` for a free slot or one a
    /// writer is changing.
    fn read(&self) -> Option<(usize, usize, RawFd)> {
        let before = self.seq.load(Ordering::Acquire);
        if before % 2 == 1 {
            return None;
        }
        let (start, len, event) = (
            self.start.load(Ordering::Relaxed),
            self.len.load(Ordering::Relaxed),
            self.event.load(Ordering::Relaxed),
        );
        fence(Ordering::Acquire);
        (len != 0 && self.seq.load(Ordering::Relaxed) == before).then_some((start, len, event))
    }
}

#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise SLOTS.
const FREE: Slot = Slot {
    seq: AtomicUsize::new(0),
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    event: AtomicI32::new(-1),
};
static SLOTS: [Slot; MAX_REGIONS] = [FREE; MAX_REGIONS];
/// Serialises registration and removal (never taken by the handler).
static WRITERS: Mutex<()> = Mutex::new(());
/// The SIGBUS action before ours; set once, when ours is installed.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// A registered region; removed from the table when dropped.
#[derive(Debug)]
pub struct Registration(usize);

/// Watch `len` bytes of a shared mapping at `start`: if an access there raises SIGBUS, zero
/// pages replace the mapping and `event` (an eventfd, open for as long as the registration
/// lives) is signalled. `None` when every slot is taken.
///
/// The caller must drop the registration before it unmaps the region, and must not unmap it
/// while another thread may still touch it (the handler maps over exactly this range).
pub fn register(start: usize, len: usize, event: RawFd) -> std::io::Result<Option<Registration>> {
    install()?;
    let _writers = WRITERS.lock().unwrap_or_else(|p| p.into_inner());
    let Some(index) = SLOTS.iter().position(|s| s.len.load(Ordering::Relaxed) == 0) else {
        return Ok(None);
    };
    SLOTS[index].set(start, len, event);
    Ok(Some(Registration(index)))
}

impl Drop for Registration {
    fn drop(&mut self) {
        let _writers = WRITERS.lock().unwrap_or_else(|p| p.into_inner());
        SLOTS[self.0].set(0, 0, -1);
    }
}

/// Install the handler once for the process.
fn install() -> std::io::Result<()> {
    static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();
    let result = INSTALLED.get_or_init(|| {
        // SAFETY: an all-zero sigaction is valid; we fill in the handler, flags and an empty
        // mask, and sigaction reads it and writes the previous action into `previous`.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, &action, &mut previous) != 0 {
                return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL));
            }
            let _ = PREVIOUS.set(previous);
        }
        Ok(())
    });
    result.map_err(std::io::Error::from_raw_os_error)
}

extern "C" fn on_sigbus(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for a SA_SIGINFO handler; si_addr is the
    // faulting address for SIGBUS.
    let addr = unsafe { (*info).si_addr() } as usize;
    for slot in &SLOTS {
        let Some((start, len, event)) = slot.read() else { continue };
        if addr < start || addr - start >= len {
            continue;
        }
        // SAFETY: [start, start + len) is a mapping registered by its owner, who keeps it
        // mapped while registered (see `register`); replacing it with private zero pages
        // changes what it reads, never which addresses are mapped.
        let mapped = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if mapped == libc::MAP_FAILED {
            break;
        }
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to the registered eventfd (if it was closed
        // meanwhile the write fails harmlessly).
        unsafe { libc::write(event, (&one as *const u64).cast(), 8) };
        return;
    }
    forward(signal, info, context);
}

/// Not ours: hand the signal to the previous handler, or restore the default action so the
/// retried access ends the process as it would have without us.
fn forward(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    if let Some(previous) = PREVIOUS.get() {
        let handler = previous.sa_sigaction;
        if handler != libc::SIG_DFL && handler != libc::SIG_IGN {
            if previous.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: a SA_SIGINFO handler has this signature; we pass what we were given.
                let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(handler) };
                handler(signal, info, context);
            } else {
                // SAFETY: a plain handler takes the signal number.
                let handler: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
                handler(signal);
            }
            return;
        }
    }
    // SAFETY: an all-zero sigaction is SIG_DFL with an empty mask; sigaction is
    // async-signal-safe.
    unsafe {
        let default: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, &default, std::ptr::null_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_handler_reads_a_slot_only_as_one_registration_left_it() {
        let slot = FREE;
        assert_eq!(slot.read(), None, "free");
        slot.set(0x1000, 0x2000, 7);
        assert_eq!(slot.read(), Some((0x1000, 0x2000, 7)));
        // A writer in the middle of a change (an odd sequence number): not to be trusted.
        slot.seq.fetch_add(1, Ordering::Relaxed);
        assert_eq!(slot.read(), None, "being written");
        slot.seq.fetch_add(1, Ordering::Relaxed);
        slot.set(0, 0, -1);
        assert_eq!(slot.read(), None, "removed");
    }
}
