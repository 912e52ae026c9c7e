//! The exitless test device (see `probe_abi::testdev`): a page of MMIO registers that the probe
//! guest uses to measure exit costs and to mark phases for exact exit accounting.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use kvm_ioctls::{IoEventAddress, NoDatamatch, VmFd};
use probe_abi::testdev as regs;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, VolatileMemory};
use vmm_sys_util::eventfd::EventFd;

use super::Action;

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
            responder_filter,
        })
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
        if self.responder_running.swap(true, Ordering::AcqRel) {
            return;
        }
        let mem = self.mem.clone();
        let vm_stopped = self.vm_stopped.clone();
        let running = self.responder_running.clone();
        let filter = self.responder_filter.clone();
        let spawned = std::thread::Builder::new().name("testdev-pingpong".into()).spawn(move || {
            // A responder that cannot confine itself does not answer; the guest's ping-pong
            // times out and says so.
            if filter.install().is_ok() {
                respond(&mem, gpa, &answer, &vm_stopped);
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

/// Answer every new request until the guest sends `STOP` or the VM stops.
fn respond(mem: &GuestMemoryMmap, gpa: u64, answer: &Answer, vm_stopped: &AtomicBool) {
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
    while !vm_stopped.load(Ordering::Relaxed) {
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
