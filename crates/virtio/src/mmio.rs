//! The virtio-mmio transport, device side, register layout version 2 (virtio 1.x §4.2.2).
//!
//! Register accesses are guest input: unknown offsets read as 0 and are ignored on write,
//! registers take 32-bit accesses only, and queue set-up is validated against guest RAM when the
//! driver sets DRIVER_OK. A queue the driver breaks later sets DEVICE_NEEDS_RESET (through the
//! worker's [`DeviceSignals`]); the device then waits for a reset.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtqueue::dirty::DirtyLog;
use virtqueue::queue::{Queue, QueueConfig};
use virtqueue::{QueueWorker, WorkerHost};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use crate::device::{DeviceSignals, DeviceStats, VirtioDevice, Workers};
use crate::interrupt::InterruptLine;
use crate::worker::Worker;
use crate::{VIRTIO_F_EVENT_IDX, VIRTIO_F_INDIRECT_DESC, VIRTIO_F_VERSION_1};
use state::{QueueState as SavedQueue, StateError, TransportState, CONFIG_SAVED};

/// The size of one transport's MMIO window.
pub const MMIO_SIZE: u64 = 0x1000;

const MAGIC_VALUE: u64 = 0x000;
const VERSION: u64 = 0x004;
const DEVICE_ID: u64 = 0x008;
const VENDOR_ID: u64 = 0x00c;
const DEVICE_FEATURES: u64 = 0x010;
const DEVICE_FEATURES_SEL: u64 = 0x014;
const DRIVER_FEATURES: u64 = 0x020;
const DRIVER_FEATURES_SEL: u64 = 0x024;
const QUEUE_SEL: u64 = 0x030;
const QUEUE_NUM_MAX: u64 = 0x034;
const QUEUE_NUM: u64 = 0x038;
const QUEUE_READY: u64 = 0x044;
/// The QueueNotify register's offset (where an ioeventfd is registered).
pub const QUEUE_NOTIFY: u64 = 0x050;
const INTERRUPT_STATUS: u64 = 0x060;
const INTERRUPT_ACK: u64 = 0x064;
const STATUS: u64 = 0x070;
const QUEUE_DESC_LOW: u64 = 0x080;
const QUEUE_DESC_HIGH: u64 = 0x084;
const QUEUE_DRIVER_LOW: u64 = 0x090;
const QUEUE_DRIVER_HIGH: u64 = 0x094;
const QUEUE_DEVICE_LOW: u64 = 0x0a0;
const QUEUE_DEVICE_HIGH: u64 = 0x0a4;
const CONFIG_GENERATION: u64 = 0x0fc;
const CONFIG: u64 = 0x100;

const MAGIC: u32 = 0x7472_6976; // "virt"
/// "EXLS": any value will do; drivers match on the device ID.
const VENDOR: u32 = 0x534c_5845;

/// Device status bits (virtio 1.x §2.1).
#[allow(missing_docs)] // The spec's names.
pub mod status {
    pub const ACKNOWLEDGE: u32 = 1;
    pub const DRIVER: u32 = 2;
    pub const DRIVER_OK: u32 = 4;
    pub const FEATURES_OK: u32 = 8;
    pub const NEEDS_RESET: u32 = 64;
    pub const FAILED: u32 = 128;
}

/// In `trap` mode a notification is served on the vCPU thread, synchronously: this long at most
/// for a backend's in-flight requests (a file on a slow disk) before the vCPU goes back; what
/// is still in flight then is completed by `reap_late_completions`.
const TRAP_COMPLETION_WAIT: Duration = Duration::from_secs(1);
/// How long a pause waits for a device's backend to complete the requests it holds.
const DRAIN_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, Default)]
struct QueueState {
    config: QueueConfig,
    ready: bool,
}

/// Who runs the device's workers once the driver is ready.
pub enum Runner {
    /// The transport itself, on every QueueNotify write (trap-and-emulate).
    OnNotify,
    /// An IOCore (or I/O thread): one [`Hosted`] per worker of the device
    /// ([`VirtioDevice::worker_count`]).
    Host {
        /// Who runs the workers.
        host: Arc<dyn WorkerHost<Worker>>,
        /// By worker: its id with the host and its notification.
        workers: Vec<Hosted>,
    },
}

/// How a host knows one of the device's workers.
pub struct Hosted {
    /// The worker's id with its host (unique among the host's workers).
    pub id: u64,
    /// The eventfd that notifications of the worker's queues reach (an ioeventfd on QueueNotify,
    /// with the queue's index as datamatch when the device has several workers), for the host
    /// to wait on.
    pub notify: Option<Arc<EventFd>>,
}

/// A virtio-mmio transport (virtio 1.x §4.2, version 2): the register interface the driver
/// programs, which validates the queues it sets up and starts (and resets) the device's worker.
pub struct MmioTransport {
    device: Box<dyn VirtioDevice>,
    mem: GuestMemoryMmap,
    runner: Runner,
    interrupt: InterruptLine,
    interrupt_status: Arc<AtomicU32>,
    needs_reset: Arc<AtomicBool>,
    /// The device's counts across resets, shared with every worker it starts.
    stats: Arc<DeviceStats>,
    status: u32,
    device_features_sel: u32,
    driver_features_sel: u32,
    driver_features: u64,
    queue_sel: u32,
    queues: Vec<QueueState>,
    /// The workers, while the transport runs them (`Runner::OnNotify`), by worker.
    local_workers: Workers,
    /// A live migration's dirty log, given to every worker started while it is on.
    dirty_log: Option<DirtyLog>,
    /// Which workers are out (here or with the host), by worker; empty while inactive.
    started: Vec<bool>,
    /// The workers taken back from the host while the VM is paused (`pause`), by worker; empty
    /// when the host has them.
    paused_workers: Workers,
    /// Paused: no worker takes requests until `resume`.
    paused: bool,
}

impl MmioTransport {
    /// `irq` raises the transport's interrupt line; `None` only in tests. `stats`
    /// names the device in logs and counts what its workers do.
    pub fn new(
        device: Box<dyn VirtioDevice>,
        mem: GuestMemoryMmap,
        runner: Runner,
        irq: Option<Arc<dyn crate::interrupt::Trigger>>,
        stats: Arc<DeviceStats>,
    ) -> MmioTransport {
        let interrupt_status = Arc::new(AtomicU32::new(0));
        let queues = vec![QueueState::default(); device.queue_max_sizes().len()];
        MmioTransport {
            device,
            mem,
            runner,
            interrupt: InterruptLine::new(interrupt_status.clone(), irq),
            interrupt_status,
            needs_reset: Arc::new(AtomicBool::new(false)),
            stats,
            status: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            driver_features: 0,
            queue_sel: 0,
            queues,
            local_workers: Vec::new(),
            dirty_log: None,
            started: Vec::new(),
            paused_workers: Vec::new(),
            paused: false,
        }
    }

    /// A driver's read of `data.len()` bytes at `offset` in the transport's window.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        if offset >= CONFIG {
            self.device.read_config(offset - CONFIG, data);
            return;
        }
        let value = if data.len() == 4 && offset.is_multiple_of(4) { self.register(offset) } else { 0 };
        let bytes = value.to_le_bytes();
        let n = data.len().min(4);
        data[..n].copy_from_slice(&bytes[..n]);
        data[n..].fill(0);
    }

    fn register(&self, offset: u64) -> u32 {
        let queue = self.queues.get(self.queue_sel as usize);
        match offset {
            MAGIC_VALUE => MAGIC,
            VERSION => 2,
            DEVICE_ID => self.device.device_id(),
            VENDOR_ID => VENDOR,
            DEVICE_FEATURES => match self.device_features_sel {
                0 => low_half(self.device.features()),
                1 => high_half(self.device.features()),
                _ => 0,
            },
            QUEUE_NUM_MAX => {
                self.device.queue_max_sizes().get(self.queue_sel as usize).copied().unwrap_or(0) as u32
            }
            QUEUE_READY => queue.is_some_and(|q| q.ready) as u32,
            INTERRUPT_STATUS => {
                let always = if self.active() { self.device.interrupt_status_while_active() } else { 0 };
                self.interrupt_status.load(Ordering::Acquire) | always
            }
            STATUS => {
                let needs_reset = self.needs_reset.load(Ordering::Acquire);
                self.status | if needs_reset { status::NEEDS_RESET } else { 0 }
            }
            CONFIG_GENERATION => 0,
            _ => 0,
        }
    }

    /// A driver's write of `data` at `offset` in the transport's window; what makes no sense is
    /// ignored, as a device would.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= CONFIG {
            self.device.write_config(offset - CONFIG, data);
            return;
        }
        let Ok(bytes) = <[u8; 4]>::try_from(data) else { return };
        if !offset.is_multiple_of(4) {
            return;
        }
        let value = u32::from_le_bytes(bytes);
        let setting_up = self.status & status::DRIVER_OK == 0;
        match offset {
            DEVICE_FEATURES_SEL => self.device_features_sel = value,
            DRIVER_FEATURES_SEL => self.driver_features_sel = value,
            DRIVER_FEATURES if self.status & status::FEATURES_OK == 0 => match self.driver_features_sel {
                0 => self.driver_features = (self.driver_features & !0xffff_ffff) | value as u64,
                1 => self.driver_features = (self.driver_features & 0xffff_ffff) | (value as u64) << 32,
                _ => {}
            },
            QUEUE_SEL => self.queue_sel = value,
            QUEUE_NUM | QUEUE_READY | QUEUE_DESC_LOW | QUEUE_DESC_HIGH | QUEUE_DRIVER_LOW
            | QUEUE_DRIVER_HIGH | QUEUE_DEVICE_LOW | QUEUE_DEVICE_HIGH
                if setting_up =>
            {
                self.write_queue_register(offset, value)
            }
            QUEUE_NOTIFY => self.notified(value),
            INTERRUPT_ACK => {
                self.interrupt_status.fetch_and(!value, Ordering::AcqRel);
            }
            STATUS => self.write_status(value),
            _ => {}
        }
    }

    fn write_queue_register(&mut self, offset: u64, value: u32) {
        let Some(queue) = self.queues.get_mut(self.queue_sel as usize) else { return };
        let set_low = |field: &mut u64| *field = (*field & !0xffff_ffff) | value as u64;
        let set_high = |field: &mut u64| *field = (*field & 0xffff_ffff) | (value as u64) << 32;
        let config = &mut queue.config;
        match offset {
            QUEUE_NUM => config.size = u16::try_from(value).unwrap_or(u16::MAX),
            QUEUE_READY => queue.ready = value == 1,
            QUEUE_DESC_LOW => set_low(&mut config.desc),
            QUEUE_DESC_HIGH => set_high(&mut config.desc),
            QUEUE_DRIVER_LOW => set_low(&mut config.avail),
            QUEUE_DRIVER_HIGH => set_high(&mut config.avail),
            QUEUE_DEVICE_LOW => set_low(&mut config.used),
            QUEUE_DEVICE_HIGH => set_high(&mut config.used),
            _ => {}
        }
    }

    fn write_status(&mut self, value: u32) {
        if value == 0 {
            self.reset();
            return;
        }
        // The driver only adds bits (§3.1.1); anything else is ignored.
        if value & self.status != self.status {
            return;
        }
        let mut value = value & !status::NEEDS_RESET;
        if value & status::FEATURES_OK != 0 && self.status & status::FEATURES_OK == 0 {
            let offered = self.device.features();
            let acceptable =
                self.driver_features & !offered == 0 && self.driver_features & (1 << VIRTIO_F_VERSION_1) != 0;
            if !acceptable {
                value &= !status::FEATURES_OK;
            }
        }
        let newly_ok = value & status::DRIVER_OK != 0 && self.status & status::DRIVER_OK == 0;
        self.status = value;
        if newly_ok {
            if self.status & status::FEATURES_OK == 0 {
                self.needs_reset.store(true, Ordering::Release);
                return;
            }
            self.activate();
        }
    }

    fn activate(&mut self) {
        match self.start(None) {
            Ok(workers) => self.place(workers),
            // A queue outside guest RAM or a device that would not start: the driver must
            // start over.
            Err(_) => self.needs_reset.store(true, Ordering::Release),
        }
    }

    /// Hand started workers to whoever runs them.
    fn place(&mut self, mut workers: Workers) {
        if let Some(log) = &self.dirty_log {
            workers.iter_mut().flatten().for_each(|worker| {
                worker.set_dirty_log(Some(log.clone()));
            });
        }
        match &self.runner {
            Runner::OnNotify => {
                workers.iter_mut().flatten().for_each(|worker| worker.set_polling(false));
                self.local_workers = workers;
            }
            Runner::Host { host, workers: hosted } => {
                for (worker, slot) in workers.into_iter().zip(hosted) {
                    if let Some(worker) = worker {
                        host.attach(slot.id, worker, slot.notify.clone());
                    }
                }
            }
        }
    }

    /// Start the device's workers on the queues the driver made ready (a queue not made ready
    /// is `None`: the device decides whether it can do without it); with `resume_at`, each
    /// ready queue continues at that avail index (a restored snapshot) rather than at 0.
    fn start(&mut self, resume_at: Option<&[u16]>) -> Result<Workers, StateError> {
        let event_idx = self.driver_features & (1 << VIRTIO_F_EVENT_IDX) != 0;
        let indirect = self.driver_features & (1 << VIRTIO_F_INDIRECT_DESC) != 0;
        let mut queues = Vec::with_capacity(self.queues.len());
        for (index, state) in self.queues.iter().enumerate() {
            let next_avail = resume_at.and_then(|at| at.get(index)).copied();
            if !state.ready {
                // The device cannot have taken requests from a queue it never had.
                if next_avail.is_some_and(|next| next != 0) {
                    return Err(StateError::QueueNotReady(index));
                }
                queues.push(None);
                continue;
            }
            let mut queue = Queue::new(&self.mem, state.config, event_idx)
                .map_err(|source| StateError::Queue { queue: index, source })?
                .with_indirect_descriptors(indirect);
            if let Some(next_avail) = next_avail {
                let in_memory = queue.used_index();
                if in_memory != next_avail {
                    return Err(StateError::UsedIndex { queue: index, saved: next_avail, in_memory });
                }
                queue.resume(next_avail);
            }
            queues.push(Some(queue));
        }
        let signals = DeviceSignals::new(self.interrupt.clone(), self.needs_reset.clone())
            .with_stats(self.stats.clone());
        let workers = self
            .device
            .activate(&self.mem, queues, self.driver_features, signals)
            .map_err(|_| StateError::Activate)?;
        self.started = workers.iter().map(Option::is_some).collect();
        Ok(workers)
    }

    /// Is the device's data path running (a worker out)?
    fn active(&self) -> bool {
        self.started.iter().any(|&started| started)
    }

    /// QueueNotify of queue `queue` reached the transport: serve the queue here (trap mode).
    /// With a host the notification goes to its ioeventfd and never exits to user space; if it
    /// does anyway (no ioeventfd), it is passed on to the worker's eventfd. A queue the device
    /// does not have is ignored.
    fn notified(&mut self, queue: u32) {
        let Some(index) = self.device.worker_of_queue(queue) else { return };
        if let Runner::Host { workers, .. } = &self.runner {
            if let Some(Hosted { notify: Some(fd), .. }) = workers.get(index) {
                let _ = fd.write(1);
            }
            return;
        }
        let Some(Some(worker)) = self.local_workers.get_mut(index) else { return };
        worker.poll();
        let started = Instant::now();
        while worker.in_flight() > 0 && started.elapsed() < TRAP_COMPLETION_WAIT {
            if worker.poll() == 0 {
                std::hint::spin_loop();
            }
        }
    }

    fn reset(&mut self) {
        self.paused = false;
        if self.active() {
            let held = std::mem::take(&mut self.paused_workers);
            let workers = match &self.runner {
                Runner::OnNotify => std::mem::take(&mut self.local_workers),
                // Paused: the transport holds the workers, the host has none of them.
                Runner::Host { .. } if !held.is_empty() => held,
                Runner::Host { host, workers } => workers
                    .iter()
                    .zip(&self.started)
                    .map(|(slot, &started)| if started { host.detach(slot.id) } else { None })
                    .collect(),
            };
            self.device.deactivate(workers);
            self.started.clear();
        }
        self.status = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.driver_features = 0;
        self.queue_sel = 0;
        self.queues.iter_mut().for_each(|q| *q = QueueState::default());
        self.interrupt_status.store(0, Ordering::Release);
        self.needs_reset.store(false, Ordering::Release);
    }

    /// Trap mode: complete what a notification's exit left in flight (a request slower than
    /// TRAP_COMPLETION_WAIT), as the driver may send no further notification until it is
    /// complete. Called on the VMM's control tick; nothing to do in any other mode or while
    /// paused.
    pub fn reap_late_completions(&mut self) {
        if self.paused || !matches!(self.runner, Runner::OnNotify) {
            return;
        }
        for worker in self.local_workers.iter_mut().flatten() {
            if worker.in_flight() > 0 {
                worker.poll();
            }
        }
    }

    /// Stop the data path (the VM is going away): take the workers back from their host.
    pub fn shutdown(&mut self) {
        self.reset();
    }

    /// Stop the data path for a pause (the vCPUs are stopped, so the driver adds no request):
    /// take every worker back from its host, which then holds nothing of this device, and serve
    /// them here until their backends have completed every request they took. Requests the
    /// driver made available and a worker had not taken stay in the ring for after the pause.
    pub fn pause(&mut self) -> Result<(), StateError> {
        if self.paused {
            return Ok(());
        }
        if let Runner::Host { host, workers } = &self.runner {
            if self.active() {
                // All taken back before any is drained: none runs on the host while another drains.
                self.paused_workers = workers
                    .iter()
                    .zip(&self.started)
                    .map(|(slot, &started)| if started { host.detach(slot.id) } else { None })
                    .collect();
                let lost =
                    self.started.iter().zip(&self.paused_workers).any(|(&out, held)| out && held.is_none());
                if lost {
                    return Err(StateError::WorkerLost);
                }
            }
        }
        self.paused = true;
        if self.active() {
            self.device.pause();
        }
        let held = match self.runner {
            Runner::OnNotify => &mut self.local_workers,
            Runner::Host { .. } => &mut self.paused_workers,
        };
        let started = Instant::now();
        for worker in held.iter_mut().flatten() {
            while worker.in_flight() > 0 {
                if started.elapsed() > DRAIN_WAIT {
                    return Err(StateError::DrainTimeout(worker.in_flight(), DRAIN_WAIT));
                }
                if worker.poll() == 0 {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        }
        Ok(())
    }

    /// Give every worker back to its host after `pause`; a notification the driver made while
    /// paused (none: the vCPUs were stopped) or requests left in a ring are found by the host's
    /// first pass over that worker.
    pub fn resume(&mut self) {
        self.paused = false;
        if self.active() {
            self.device.resume();
        }
        let held = std::mem::take(&mut self.paused_workers);
        if let Runner::Host { host, workers: hosted } = &self.runner {
            for (worker, slot) in held.into_iter().zip(hosted) {
                if let Some(worker) = worker {
                    host.attach(slot.id, worker, slot.notify.clone());
                    if let Some(fd) = &slot.notify {
                        let _ = fd.write(1);
                    }
                }
            }
        }
    }

    /// Start (`Some`) or stop (`None`) marking in `log` every guest page the device's workers
    /// write (a live migration). The workers are drained first (a pause), their log switched,
    /// then given back unless the transport was paused already. On error the transport is
    /// left as it was found, workers logging nothing.
    pub fn set_dirty_log(&mut self, log: Option<DirtyLog>) -> Result<(), StateError> {
        let was_paused = self.paused;
        let outcome = self.pause().and_then(|()| {
            let held = match self.runner {
                Runner::OnNotify => &mut self.local_workers,
                Runner::Host { .. } => &mut self.paused_workers,
            };
            let mut refused = false;
            for worker in held.iter_mut().flatten() {
                refused |= !worker.set_dirty_log(log.clone());
            }
            if refused {
                held.iter_mut().flatten().for_each(|w| {
                    w.set_dirty_log(None);
                });
                return Err(StateError::NoDirtyLog);
            }
            Ok(())
        });
        if !was_paused {
            self.resume();
        }
        self.dirty_log = if outcome.is_ok() { log } else { None };
        outcome
    }

    /// The transport's state for a snapshot; only while paused (no request in flight).
    pub fn save(&self) -> Result<TransportState, StateError> {
        if !self.paused {
            return Err(StateError::NotPaused);
        }
        let mut config = [0u8; CONFIG_SAVED];
        self.device.read_config(0, &mut config);
        let queues = self
            .queues
            .iter()
            .map(|q| SavedQueue {
                size: q.config.size,
                ready: q.ready,
                desc: q.config.desc,
                avail: q.config.avail,
                used: q.config.used,
                // Drained: the used index in guest memory is where the device stands. A queue not
                // made ready was never used.
                next_avail: match self.active() && q.ready {
                    true => used_index_in(&self.mem, q.config.used).unwrap_or(0),
                    false => 0,
                },
            })
            .collect();
        Ok(TransportState {
            device_id: self.device.device_id(),
            status: self.status,
            needs_reset: self.needs_reset.load(Ordering::Acquire),
            device_features_sel: self.device_features_sel,
            driver_features_sel: self.driver_features_sel,
            driver_features: self.driver_features,
            queue_sel: self.queue_sel,
            interrupt_status: self.interrupt_status.load(Ordering::Acquire),
            queues,
            config: state::hex(&config),
        })
    }

    /// Bring a new transport (the same device, opened afresh, not yet used by a driver) to
    /// `saved`, guest memory already restored: check it against the device and guest memory, and
    /// start the workers where the snapshot left each ready queue. The workers start paused;
    /// `resume` gives them to the host.
    pub fn restore(&mut self, saved: &TransportState) -> Result<(), StateError> {
        let here = self.device.device_id();
        if saved.device_id != here {
            return Err(StateError::DeviceType { saved: saved.device_id, here });
        }
        let max_sizes = self.device.queue_max_sizes().to_vec();
        if saved.queues.len() != max_sizes.len() {
            return Err(StateError::QueueCount { saved: saved.queues.len(), here: max_sizes.len() });
        }
        let offered = self.device.features();
        if saved.driver_features & !offered != 0 {
            return Err(StateError::Features { features: saved.driver_features, offered });
        }
        let config = state::unhex(&saved.config).map_err(StateError::Config)?;
        if config.len() != CONFIG_SAVED {
            return Err(StateError::Config(format!("{} bytes, not {CONFIG_SAVED}", config.len())));
        }
        // Bytes the driver may write (virtio-blk's cache mode) are written; the rest must match.
        let mut current = [0u8; CONFIG_SAVED];
        self.device.read_config(0, &mut current);
        for (offset, (&want, &have)) in config.iter().zip(&current).enumerate() {
            if want != have {
                self.device.write_config(offset as u64, &[want]);
            }
        }
        self.device.read_config(0, &mut current);
        if let Some(offset) = (0..CONFIG_SAVED).find(|&i| current[i] != config[i]) {
            return Err(StateError::ConfigDiffers { offset, saved: config[offset], here: current[offset] });
        }
        for (index, (queue, &max)) in saved.queues.iter().zip(&max_sizes).enumerate() {
            if queue.size > max {
                return Err(StateError::QueueSize { queue: index, size: queue.size, max });
            }
            self.queues[index] = QueueState {
                config: QueueConfig {
                    size: queue.size,
                    desc: queue.desc,
                    avail: queue.avail,
                    used: queue.used,
                },
                ready: queue.ready,
            };
        }
        self.status = saved.status & !status::NEEDS_RESET;
        self.device_features_sel = saved.device_features_sel;
        self.driver_features_sel = saved.driver_features_sel;
        self.driver_features = saved.driver_features;
        self.queue_sel = saved.queue_sel;
        self.interrupt_status.store(saved.interrupt_status, Ordering::Release);
        self.needs_reset.store(saved.needs_reset, Ordering::Release);
        self.device.announce();
        if self.status & status::DRIVER_OK != 0 && !saved.needs_reset {
            if self.status & status::FEATURES_OK == 0 {
                return Err(StateError::Features { features: saved.driver_features, offered });
            }
            let resume_at: Vec<u16> = saved.queues.iter().map(|q| q.next_avail).collect();
            let mut workers = self.start(Some(&resume_at))?;
            // Held back (paused) until the VM resumes.
            match self.runner {
                Runner::OnNotify => {
                    workers.iter_mut().flatten().for_each(|worker| worker.set_polling(false));
                    self.local_workers = workers;
                }
                Runner::Host { .. } => self.paused_workers = workers,
            }
        }
        self.paused = true;
        Ok(())
    }
}

/// The used ring's index in guest memory (the ring's second u16).
fn used_index_in(mem: &GuestMemoryMmap, used: u64) -> Option<u16> {
    use vm_memory::{Bytes, GuestAddress};
    mem.read_obj::<u16>(GuestAddress(used.checked_add(2)?)).ok().map(u16::from_le)
}

fn low_half(value: u64) -> u32 {
    value.to_le_bytes()[..4].try_into().map(u32::from_le_bytes).unwrap_or(0)
}

fn high_half(value: u64) -> u32 {
    value.to_le_bytes()[4..].try_into().map(u32::from_le_bytes).unwrap_or(0)
}

pub mod state;

#[cfg(test)]
mod tests;
