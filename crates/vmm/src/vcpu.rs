//! A vCPU thread: runs KVM_RUN, sends port I/O and MMIO exits to the device bus, and reports
//! how the VM ended.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use kvm_ioctls::{VcpuExit, VcpuFd};

use crate::devices::{Action, Bus};
use crate::snapshot::VcpuState;
use crate::stats::{Counters, Snapshot, VcpuStats};
use crate::vm::Ending;

/// The most phase marks one vCPU keeps; a guest that asks for more gets no more.
pub const MAX_MARKS: usize = 4096;

const KVM_SYSTEM_EVENT_SHUTDOWN: u32 = 1;
const KVM_SYSTEM_EVENT_RESET: u32 = 2;
const KVM_SYSTEM_EVENT_CRASH: u32 = 3;

/// Shared by the VM's threads: who ends the run first, and the flag that stops the others.
#[derive(Default)]
pub struct RunControl {
    pub stop: Arc<AtomicBool>,
    ending: Mutex<Option<Ending>>,
    ended: Condvar,
    /// Pausing the vCPUs.
    pub pause: PauseControl,
}

/// How long a parked vCPU sleeps between looks at the stop flag (stopping does not wake it).
const PARKED_TICK: Duration = Duration::from_millis(20);

/// Pausing: the VMM's control thread sets `requested` and kicks the vCPUs out of KVM_RUN; each
/// parks (its state read for a snapshot) until the request is withdrawn.
#[derive(Default)]
pub struct PauseControl {
    /// Checked by each vCPU once per pass of its loop (per exit), never per request.
    requested: AtomicBool,
    parked: Mutex<Parked>,
    changed: Condvar,
}

#[derive(Default)]
struct Parked {
    /// The state each parked vCPU read when it parked, by index (an error as text).
    states: Vec<Option<Result<VcpuState, String>>>,
}

impl PauseControl {
    /// Ask the vCPUs to park.
    pub fn request(&self) {
        self.requested.store(true, Ordering::Release);
    }

    /// Let parked vCPUs go back to the guest.
    pub fn withdraw(&self) {
        let _guard = self.parked.lock().unwrap_or_else(|p| p.into_inner());
        self.requested.store(false, Ordering::Release);
        self.changed.notify_all();
    }

    /// Is a pause asked for?
    pub fn requested(&self) -> bool {
        self.requested.load(Ordering::Acquire)
    }

    /// Which of `count` vCPUs are parked, after waiting up to `wait` for a change.
    pub fn parked(&self, count: usize, wait: Duration) -> Vec<bool> {
        let guard = self.parked.lock().unwrap_or_else(|p| p.into_inner());
        let all = |p: &Parked| (0..count).all(|i| p.states.get(i).is_some_and(Option::is_some));
        let guard = match all(&guard) {
            true => guard,
            false => self.changed.wait_timeout(guard, wait).unwrap_or_else(|p| p.into_inner()).0,
        };
        (0..count).map(|i| guard.states.get(i).is_some_and(Option::is_some)).collect()
    }

    /// The states the parked vCPUs read, by index (all of them parked).
    pub fn states(&self, count: usize) -> Option<Vec<Result<VcpuState, String>>> {
        let guard = self.parked.lock().unwrap_or_else(|p| p.into_inner());
        (0..count).map(|i| guard.states.get(i).cloned().flatten()).collect()
    }

    /// A vCPU parks with its state until the pause is withdrawn or the VM stops.
    fn park(&self, index: u8, state: Result<VcpuState, String>, stop: &AtomicBool) {
        let index = index as usize;
        let mut guard = self.parked.lock().unwrap_or_else(|p| p.into_inner());
        if guard.states.len() <= index {
            guard.states.resize(index + 1, None);
        }
        guard.states[index] = Some(state);
        self.changed.notify_all();
        while self.requested.load(Ordering::Acquire) && !stop.load(Ordering::Acquire) {
            guard = self.changed.wait_timeout(guard, PARKED_TICK).unwrap_or_else(|p| p.into_inner()).0;
        }
        guard.states[index] = None;
    }
}

impl RunControl {
    /// Record how the VM ended; the first ending wins.
    pub fn end(&self, ending: Ending) {
        let mut slot = self.ending.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(ending);
        }
        self.stop.store(true, Ordering::Release);
        self.ended.notify_all();
    }

    /// Wait for an ending, or `timeout`; returns the ending if one came.
    pub fn wait(&self, timeout: Option<std::time::Duration>) -> Option<Ending> {
        let slot = self.ending.lock().unwrap_or_else(|p| p.into_inner());
        let slot = match timeout {
            Some(t) => {
                self.ended.wait_timeout_while(slot, t, |e| e.is_none()).unwrap_or_else(|p| p.into_inner()).0
            }
            None => self.ended.wait_while(slot, |e| e.is_none()).unwrap_or_else(|p| p.into_inner()),
        };
        slot.clone()
    }
}

/// A statistics snapshot the guest asked for (test device MARK register).
#[derive(Debug, Clone)]
pub struct Mark {
    /// The value the guest wrote to MARK.
    pub label: u32,
    /// This vCPU's KVM statistics at that moment.
    pub snapshot: Snapshot,
    /// When the mark was taken.
    pub at: std::time::Instant,
    /// CPU time of this vCPU's thread so far (guest and host side of the vCPU).
    pub vcpu_cpu: Duration,
    /// CPU time of the IOCore thread so far, if the VM has one.
    pub iocore_cpu: Option<Duration>,
}

/// What one vCPU did during the run.
#[derive(Debug, Clone)]
pub struct VcpuReport {
    /// The vCPU's index (0: the boot vCPU).
    pub index: u8,
    /// Counter growth from just before the vCPU first ran to after it stopped.
    pub counters: Counters,
    /// The marks the guest took on this vCPU, in order.
    pub marks: Vec<Mark>,
}

pub struct Vcpu {
    pub index: u8,
    pub fd: VcpuFd,
    pub stats: VcpuStats,
    pub pin_cpu: Option<usize>,
    /// The IOCore's CPU, which a vCPU not pinned anywhere stays off: a pinned IOCore owns its
    /// core, and runs there in the idle scheduling class, which any other thread holds off.
    pub iocore_cpu: Option<usize>,
    /// The seccomp filter the thread confines itself with before it first runs the guest.
    pub filter: sandbox::Filter,
    /// The MSRs KVM lists (KVM_GET_MSR_INDEX_LIST), read when the vCPU parks.
    pub msr_list: Arc<[u32]>,
}

impl Vcpu {
    /// The vCPU thread's body.
    pub fn run(mut self, bus: &Bus, control: &RunControl, start: Snapshot) -> VcpuReport {
        if let Some(cpu) = self.pin_cpu {
            if let Err(e) = iocore::pin_current_thread(cpu) {
                control.end(Ending::HostError(format!("cannot pin vCPU {} to CPU {cpu}: {e}", self.index)));
            }
        } else if let Some(cpu) = self.iocore_cpu {
            if let Err(e) = iocore::keep_current_thread_off(cpu) {
                control.end(Ending::HostError(format!("cannot keep vCPU {} off CPU {cpu}: {e}", self.index)));
            }
        }
        if let Err(e) = self.filter.install() {
            control.end(Ending::HostError(format!("vCPU {}: {e}", self.index)));
        }
        let mut marks = Vec::new();
        while !control.stop.load(Ordering::Acquire) {
            if control.pause.requested() {
                self.park(control);
                continue;
            }
            if let Some(ending) = self.run_once(bus, &mut marks) {
                control.end(ending);
            }
        }
        let counters = match self.stats.snapshot() {
            Ok(end) => end.since(&start),
            Err(_) => Counters::default(),
        };
        VcpuReport { index: self.index, counters, marks }
    }

    /// Park for a pause: finish the exit being handled, read the vCPU's state, wait.
    fn park(&mut self, control: &RunControl) {
        // An MMIO or port read's data reaches the guest's registers only on the next KVM_RUN:
        // enter once with immediate_exit so KVM completes it and returns at once (EINTR), and
        // the state read below is the guest's as it will continue.
        self.fd.set_kvm_immediate_exit(1);
        let _ = self.fd.run();
        self.fd.set_kvm_immediate_exit(0);
        let state = VcpuState::capture(&self.fd, self.index, &self.msr_list).map_err(|e| e.to_string());
        control.pause.park(self.index, state, &control.stop);
    }

    /// One KVM_RUN; `Some` when the VM should end.
    fn run_once(&mut self, bus: &Bus, marks: &mut Vec<Mark>) -> Option<Ending> {
        let index = self.index;
        let action = match self.fd.run() {
            Ok(VcpuExit::IoOut(port, data)) => bus.pio_write(port, data),
            Ok(VcpuExit::IoIn(port, data)) => {
                bus.pio_read(port, data);
                Action::Continue
            }
            Ok(VcpuExit::MmioWrite(addr, data)) => bus.mmio_write(addr, data),
            Ok(VcpuExit::MmioRead(addr, data)) => {
                bus.mmio_read(addr, data);
                Action::Continue
            }
            Ok(VcpuExit::Shutdown) => return Some(Ending::Shutdown { vcpu: index }),
            Ok(VcpuExit::Hlt) => return Some(Ending::Halted { vcpu: index }),
            Ok(VcpuExit::SystemEvent(kind, _)) => {
                return Some(match kind {
                    KVM_SYSTEM_EVENT_SHUTDOWN => Ending::Shutdown { vcpu: index },
                    KVM_SYSTEM_EVENT_RESET => Ending::Reset { vcpu: index },
                    KVM_SYSTEM_EVENT_CRASH => Ending::GuestCrash { vcpu: index },
                    other => Ending::UnexpectedExit { vcpu: index, exit: format!("system event {other}") },
                })
            }
            Ok(VcpuExit::FailEntry(reason, _)) => return Some(Ending::FailEntry { vcpu: index, reason }),
            Ok(VcpuExit::InternalError) => return Some(self.internal_error()),
            Ok(other) => return Some(Ending::UnexpectedExit { vcpu: index, exit: format!("{other:?}") }),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => Action::Continue,
            Err(e) => return Some(Ending::HostError(format!("KVM_RUN failed on vCPU {index}: {e}"))),
        };
        match action {
            Action::Continue => None,
            Action::GuestExit(status) => Some(Ending::GuestExit(status)),
            Action::Mark(label) => {
                if marks.len() < MAX_MARKS {
                    if let Ok(snapshot) = self.stats.snapshot() {
                        let iocore_cpu = bus.virtio.iocore.as_ref().and_then(|io| io.cpu_time());
                        let at = std::time::Instant::now();
                        marks.push(Mark { label, snapshot, at, vcpu_cpu: thread_cpu_time(), iocore_cpu });
                    }
                }
                None
            }
        }
    }

    fn internal_error(&mut self) -> Ending {
        // SAFETY: after KVM_EXIT_INTERNAL_ERROR the `internal` member of the exit union is valid.
        let suberror = unsafe { self.fd.get_kvm_run().__bindgen_anon_1.internal.suberror };
        let rip = self.fd.get_regs().map(|r| r.rip).unwrap_or(0);
        Ending::InternalError { vcpu: self.index, suberror, rip }
    }
}

/// CPU time the calling thread has used.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_THREAD_CPUTIME_ID always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}
