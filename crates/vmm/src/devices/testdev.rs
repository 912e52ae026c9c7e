//! The exitless test device (see `probe_abi::testdev`): a page of MMIO registers that the probe
//! guest uses to measure exit costs and to mark phases for exact exit accounting. A VM has it
//! only when its operator asks (`--probe` or `--testdev`).
//!
//! Its ping-pong responder spins on a host core for the guest, so it is bounded: it ends by
//! itself after [`RESPONDER_LIMIT`], and it is held (ended, and no new one started) while the VM
//! is paused or migrated: its writes to guest memory go through the host mapping, which KVM's
//! dirty log does not see, and a paused VM's memory must not change.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvm_ioctls::{IoEventAddress, NoDatamatch, VmFd};
use probe_abi::testdev as regs;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, VolatileMemory};
use vmm_sys_util::eventfd::EventFd;

use super::Action;

/// The longest a ping-pong responder runs; a guest that wants more starts another.
pub const RESPONDER_LIMIT: Duration = Duration::from_secs(30);
/// Spins between looks at the clock and the hold flag.
const SPINS_PER_CHECK: u32 = 1024;

pub struct TestDevice {
    base: u64,
    mem: GuestMemoryMmap,
    doorbell: EventFd,
    /// Raises IOAPIC pin `IRQ_PIN` (an irqfd).
    irq: EventFd,
    /// Set when the VM stops: ends a responder the guest never stopped.
    vm_stopped: Arc<AtomicBool>,
    responder: Mutex<Option<JoinHandle<()>>>,
    responder_running: Arc<AtomicBool>,
    /// Set while the VM is paused or migrated: the responder ends and none starts.
    held: Arc<AtomicBool>,
    /// How long a responder may run (`RESPONDER_LIMIT`).
    responder_limit: Duration,
    /// The seccomp filter a responder confines itself with before it reads guest memory.
    responder_filter: sandbox::Filter,
}

impl TestDevice {
    pub fn new(
        base: u64,
        mem: GuestMemoryMmap,
        vm_stopped: Arc<AtomicBool>,
        responder_filter: sandbox::Filter,
    ) -> std::io::Result<Self> {
        Ok(TestDevice {
            base,
            mem,
            doorbell: EventFd::new(libc::EFD_NONBLOCK)?,
            irq: EventFd::new(libc::EFD_NONBLOCK)?,
            vm_stopped,
            responder: Mutex::new(None),
            responder_running: Arc::new(AtomicBool::new(false)),
            held: Arc::new(AtomicBool::new(false)),
            responder_limit: RESPONDER_LIMIT,
            responder_filter,
        })
    }

    /// The same device with another bound on a responder's run (tests).
    #[cfg(test)]
    pub fn with_responder_limit(mut self, limit: Duration) -> Self {
        self.responder_limit = limit;
        self
    }

    /// End the responder, if one runs, and start none until `release`: the VM is paused (no
    /// vCPU in an exit, so none is starting one) or its memory is being migrated.
    pub fn hold(&self) {
        self.held.store(true, Ordering::Release);
        self.join();
    }

    /// Let the guest start a responder again.
    pub fn release(&self) {
        self.held.store(false, Ordering::Release);
    }

    /// Is a responder running?
    #[cfg(test)]
    pub fn responder_running(&self) -> bool {
        self.responder_running.load(Ordering::Acquire)
    }

    pub fn base(&self) -> u64 {
        self.base
    }

    /// Let KVM complete doorbell writes in the kernel (an exit, but none to user space), and
    /// deliver the device's interrupt without a trip through user space.
    pub fn register(&self, vm: &VmFd) -> Result<(), kvm_ioctls::Error> {
        vm.register_ioevent(&self.doorbell, &IoEventAddress::Mmio(self.base + regs::DOORBELL), NoDatamatch)?;
        vm.register_irqfd(&self.irq, regs::IRQ_PIN)
    }

    pub fn owns(&self, addr: u64) -> bool {
        addr >= self.base && addr - self.base < regs::SIZE
    }

    pub fn write(&self, addr: u64, data: &[u8]) -> Action {
        let mut bytes = [0u8; 8];
        let len = data.len().min(8);
        bytes[..len].copy_from_slice(&data[..len]);
        let value = u64::from_le_bytes(bytes);
        match addr - self.base {
            regs::MARK => Action::Mark(value as u32),
            regs::PINGPONG => {
                self.start_responder(value, Answer::Ack);
                Action::Continue
            }
            regs::PINGPONG_IRQ => {
                if let Ok(irq) = self.irq.try_clone() {
                    self.start_responder(value, Answer::Interrupt(irq));
                }
                Action::Continue
            }
            _ => Action::Continue,
        }
    }

    /// Start a host thread that answers the guest's ping-pong requests at `gpa`. The address is
    /// guest input: it must be cache-line aligned and the whole area inside one RAM region. One
    /// responder at a time; further requests are ignored until it ends.
    fn start_responder(&self, gpa: u64, answer: Answer) {
        if !gpa.is_multiple_of(64)
            || self.mem.get_slice(GuestAddress(gpa), regs::PINGPONG_LEN as usize).is_err()
        {
            return;
        }
        if self.held.load(Ordering::Acquire) || self.responder_running.swap(true, Ordering::AcqRel) {
            return;
        }
        let mem = self.mem.clone();
        let stop = Stop {
            vm_stopped: self.vm_stopped.clone(),
            held: self.held.clone(),
            deadline: Instant::now() + self.responder_limit,
        };
        let running = self.responder_running.clone();
        let filter = self.responder_filter.clone();
        let spawned = std::thread::Builder::new().name("testdev-pingpong".into()).spawn(move || {
            // A responder that cannot confine itself does not answer; the guest's ping-pong
            // times out and says so.
            if filter.install().is_ok() {
                respond(&mem, gpa, &answer, &stop);
            }
            running.store(false, Ordering::Release);
        });
        match spawned {
            Ok(handle) => {
                let previous = super::lock(&self.responder).replace(handle);
                if let Some(previous) = previous {
                    let _ = previous.join();
                }
            }
            Err(_) => self.responder_running.store(false, Ordering::Release),
        }
    }

    /// Wait for the responder thread, once the VM has stopped.
    pub fn join(&self) {
        if let Some(handle) = super::lock(&self.responder).take() {
            let _ = handle.join();
        }
    }
}

/// How the responder answers a request.
enum Answer {
    /// Copy the sequence number to the acknowledgement word: no exit on either side.
    Ack,
    /// Raise the device interrupt.
    Interrupt(EventFd),
}

/// What ends a responder besides the guest's `STOP`.
struct Stop {
    vm_stopped: Arc<AtomicBool>,
    held: Arc<AtomicBool>,
    deadline: Instant,
}

/// Answer every new request until the guest sends `STOP`, the VM stops or is held, or the
/// responder's time is up.
fn respond(mem: &GuestMemoryMmap, gpa: u64, answer: &Answer, stop: &Stop) {
    let Ok(area) = mem.get_slice(GuestAddress(gpa), regs::PINGPONG_LEN as usize) else { return };
    let (Ok(request), Ok(ack)) = (
        area.get_atomic_ref::<AtomicU32>(regs::PINGPONG_REQUEST as usize),
        area.get_atomic_ref::<AtomicU32>(regs::PINGPONG_ACK as usize),
    ) else {
        return;
    };
    // Answer whatever differs from the last acknowledgement: the guest's first request may
    // land before this thread first looks.
    let mut last = ack.load(Ordering::Acquire);
    let mut spins = 0u32;
    loop {
        // Held is looked at before every answer: once `hold` returns, nothing is written.
        if stop.held.load(Ordering::Acquire) || stop.vm_stopped.load(Ordering::Relaxed) {
            break;
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(SPINS_PER_CHECK) && Instant::now() >= stop.deadline {
            break;
        }
        let seq = request.load(Ordering::Acquire);
        if seq == last {
            std::hint::spin_loop();
            continue;
        }
        last = seq;
        match answer {
            _ if seq == regs::STOP => {
                ack.store(seq, Ordering::Release);
                break;
            }
            Answer::Ack => ack.store(seq, Ordering::Release),
            Answer::Interrupt(irq) => {
                let _ = irq.write(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use vm_memory::Bytes;

    /// Far beyond what ending a responder takes.
    const DEADLINE: Duration = Duration::from_secs(60);
    const BASE: u64 = probe_abi::testdev::DEFAULT_BASE;
    const AREA: u64 = 0x1000;

    fn device() -> TestDevice {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let filter = sandbox::Filter::off(sandbox::ThreadKind::PingPong);
        TestDevice::new(BASE, mem, Arc::new(AtomicBool::new(false)), filter).unwrap()
    }

    fn start(device: &TestDevice) {
        device.write(BASE + regs::PINGPONG, &AREA.to_le_bytes());
        assert!(device.responder_running(), "no responder started");
    }

    /// Wait (up to `DEADLINE`) for the responder to end; whether it did.
    fn ended(device: &TestDevice) -> bool {
        let started = Instant::now();
        while device.responder_running() && started.elapsed() < DEADLINE {
            std::thread::sleep(Duration::from_millis(5));
        }
        !device.responder_running()
    }

    /// A responder the guest never stops used to spin on a host core until the VM ended.
    #[test]
    fn a_responder_the_guest_never_stops_ends_by_itself() {
        let device = device().with_responder_limit(Duration::from_millis(100));
        start(&device);
        assert!(ended(&device), "the responder still spins after {DEADLINE:?}");
        device.join();
    }

    /// Held (the VM paused, or migrated), the responder has ended when `hold` returns, a
    /// request is not answered and no new responder starts; released, the guest can start one.
    #[test]
    fn a_held_device_ends_its_responder_and_starts_none_until_released() {
        let device = device();
        start(&device);
        device.hold();
        assert!(!device.responder_running(), "the responder runs on while the VM is paused");
        device.mem.write_obj(7u32, GuestAddress(AREA + regs::PINGPONG_REQUEST)).unwrap();
        device.write(BASE + regs::PINGPONG, &AREA.to_le_bytes());
        assert!(!device.responder_running(), "a responder started while the VM is paused");
        let ack: u32 = device.mem.read_obj(GuestAddress(AREA + regs::PINGPONG_ACK)).unwrap();
        assert_eq!(ack, 0, "a request answered while the VM is paused");
        device.release();
        start(&device);
        device.mem.write_obj(regs::STOP, GuestAddress(AREA + regs::PINGPONG_REQUEST)).unwrap();
        assert!(ended(&device), "the responder did not stop on STOP");
        device.join();
    }
}
