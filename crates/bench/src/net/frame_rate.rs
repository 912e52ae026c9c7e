//! 64-byte frames through one IOCore's switch in `exitless bench net`, against DPDK's vhost-user
//! PMD (6.9 Mpps per vhost core in DPDK 18.05's PVP report, its guest's testpmd forwarding on
//! cores of its own). Two rows:
//!
//! - **NIC to NIC** (`row`): how many frames a second one IOCore core moves from one NIC's ring
//!   to another's. The two NICs' rings lie in memory laid out as a guest's, and the switch is
//!   exitless's own, running its pass on the IOCore's CPU as the daemon does. What stands in
//!   for the two guests is one host thread on the vCPU's CPU doing what a poll-mode driver such
//!   as testpmd does and no more: it gives the sender's sent frames back to its transmit ring
//!   and the receiver's filled buffers back to its receive ring. No VM runs, so the guests cost
//!   no CPU time beyond that, and the IOCore is what limits the rate.
//! - **VM to VM** (`vm_row`): two exitless probe VMs on one `exitless vhost-user-net`, one
//!   sending (`probe.workload=frames-send`), the other counting (`frames-count`). Two spinning
//!   vCPUs and the IOCore need three CPUs; on a host with two the counter shares one
//!   (`--vm-responder-cpu`) and takes what the scheduler lets it.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use switch::{MacAddr, Port, PortPolicy, QueuePair, Switch, SwitchControl, NET_HDR_LEN};
use virtio::interrupt::InterruptLine;
use virtio::DeviceSignals;
use virtqueue::queue::{Queue, QueueConfig, VIRTQ_DESC_F_WRITE};
use virtqueue::QueueWorker;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use super::{Row, FRAME_LEN};
use crate::args::NetBenchArgs;

/// Descriptors in each ring.
const RING: u16 = 256;
/// Each guest's memory.
const MEM: usize = 4 << 20;
/// (descriptors, avail, used) of the receive and the transmit ring.
const RX: (u64, u64, u64) = (0x1000, 0x3000, 0x4000);
const TX: (u64, u64, u64) = (0x6000, 0x8000, 0x9000);
/// Receive buffers, 2 KiB apart; transmit buffers after them.
const RX_BUFFERS: u64 = 0x10_0000;
const TX_BUFFERS: u64 = 0x20_0000;
const BUFFER: u64 = 2048;
/// virtq_avail.flags: no used-buffer interrupt wanted (the driver polls).
const NO_INTERRUPT: u16 = 1;
/// 64-byte frames a second one vhost core of DPDK's vhost-user PMD forwards (DPDK 18.05 PVP
/// report), in millions.
const DPDK_MPPS_PER_CORE: f64 = 6.9;
/// How long the rings run before the count starts.
const WARMUP: Duration = Duration::from_millis(200);

const SENDER: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x66, 0x72, 0x01]);
const RECEIVER: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x66, 0x72, 0x02]);

/// The row's name.
pub const ROW_NAME: &str = "64 B frames NIC to NIC through one exitless vhost-user-net IOCore (sidecore), \
                            guests' rings driven by a host thread";

/// The row: frames a second from the sender's transmit ring into the receiver's receive ring.
pub fn row(args: &NetBenchArgs) -> Row {
    let mut row = Row::new("exitless", ROW_NAME.to_string(), FRAME_LEN as u64);
    row.path = "nic-to-nic";
    row.workload = "frames";
    match measure(args) {
        Ok(measured) => measured.fill(&mut row, args),
        Err(e) => row.note = Some(format!("not measured: {e}")),
    }
    row
}

/// What a run counted.
struct Measured {
    frames: u64,
    seconds: f64,
    /// Frames for the receiver that found no receive buffer, warm-up included.
    dropped: u64,
}

impl Measured {
    fn fill(&self, row: &mut Row, args: &NetBenchArgs) {
        let mpps = self.frames as f64 / self.seconds / 1e6;
        row.transactions = self.frames;
        row.mpps = Some(mpps);
        // The IOCore and the ring driver, both spinning.
        row.cpu_cores_used = Some(2.0);
        row.note = Some(format!(
            "{mpps:.2} Mpps of {FRAME_LEN}-byte frames delivered ring to ring in {:.1} s ({} dropped for want \
             of a receive buffer, warm-up included) by one IOCore on CPU {}: {:.2}x the \
             {DPDK_MPPS_PER_CORE} Mpps per vhost core of DPDK's vhost-user PMD (DPDK 18.05 PVP report). Not the same path: here each frame is taken off one \
             ring and copied once into another; DPDK's core moves it between a physical NIC and a guest's \
             ring each way, through an mbuf. No VM runs: one thread on CPU {} stands in for both guests' \
             poll-mode drivers, recycling the sender's transmit buffers and the receiver's receive buffers, \
             as testpmd does in the guest of DPDK's test",
            self.seconds,
            self.dropped,
            args.iocore_cpu,
            mpps / DPDK_MPPS_PER_CORE,
            args.vcpu_cpu,
        ));
    }
}

/// One ring as its driver keeps it: where it lies, the next avail index, the used index last
/// seen.
struct Ring {
    /// (descriptors, avail, used).
    at: (u64, u64, u64),
    next: u16,
    seen: u16,
}

/// One NIC's guest: its memory and its driver's view of the receive and transmit rings.
struct Guest {
    mem: GuestMemoryMmap,
    rx: Ring,
    tx: Ring,
}

impl Guest {
    fn new() -> Result<Guest, String> {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).map_err(|e| e.to_string())?;
        Ok(Guest { mem, rx: Ring { at: RX, next: 0, seen: 0 }, tx: Ring { at: TX, next: 0, seen: 0 } })
    }

    fn write<T: vm_memory::ByteValued>(&self, value: T, at: u64) -> Result<(), String> {
        self.mem.write_obj(value, GuestAddress(at)).map_err(|e| e.to_string())
    }

    /// Descriptor `index` of the ring whose table is at `table`.
    fn describe(&self, table: u64, index: u16, addr: u64, len: u32, flags: u16) -> Result<(), String> {
        let at = table + 16 * u64::from(index);
        self.write(addr, at)?;
        self.write(len, at + 8)?;
        self.write(flags, at + 12)?;
        self.write(0u16, at + 14)
    }

    /// Lay out both rings, every descriptor one buffer: receive buffers writable and all
    /// offered; transmit buffers each holding `frame` after a zero header, offered if `send`.
    fn lay_out(&mut self, frame: &[u8], send: bool) -> Result<(), String> {
        for i in 0..RING {
            let rx_buffer = RX_BUFFERS + u64::from(i) * BUFFER;
            self.describe(RX.0, i, rx_buffer, BUFFER as u32, VIRTQ_DESC_F_WRITE)?;
            let tx_buffer = TX_BUFFERS + u64::from(i) * BUFFER;
            self.mem.write_slice(&[0u8; NET_HDR_LEN], GuestAddress(tx_buffer)).map_err(|e| e.to_string())?;
            let frame_at = GuestAddress(tx_buffer + NET_HDR_LEN as u64);
            self.mem.write_slice(frame, frame_at).map_err(|e| e.to_string())?;
            self.describe(TX.0, i, tx_buffer, (NET_HDR_LEN + frame.len()) as u32, 0)?;
            self.write(i, RX.1 + 4 + 2 * u64::from(i))?;
            self.write(i, TX.1 + 4 + 2 * u64::from(i))?;
        }
        self.write(NO_INTERRUPT, RX.1)?;
        self.write(NO_INTERRUPT, TX.1)?;
        self.rx.next = RING;
        self.tx.next = if send { RING } else { 0 };
        self.publish(RX.1 + 2, self.rx.next);
        self.publish(TX.1 + 2, self.tx.next);
        Ok(())
    }

    /// Store ring index `value` at `at`, ordered after the ring entries written before it.
    fn publish(&self, at: u64, value: u16) {
        let _ = self.mem.store(value, GuestAddress(at), Ordering::Release);
    }

    /// Give every buffer the device used on the receive (`rx`) or transmit ring back to it; how
    /// many there were.
    fn recycle(&mut self, rx: bool) -> u16 {
        let ring = if rx { &mut self.rx } else { &mut self.tx };
        let (_, avail, used) = ring.at;
        // Each ring looked up once a call, not once an entry.
        let (Ok(avail), Ok(used)) = (
            self.mem.get_slice(GuestAddress(avail), 4 + 2 * usize::from(RING)),
            self.mem.get_slice(GuestAddress(used), 4 + 8 * usize::from(RING)),
        ) else {
            return 0;
        };
        let now: u16 = used.load(2, Ordering::Acquire).unwrap_or(ring.seen);
        let fresh = now.wrapping_sub(ring.seen);
        while ring.seen != now {
            let slot = usize::from(ring.seen % RING);
            let head: u32 = used.read_obj(4 + 8 * slot).unwrap_or(0);
            // Heads are below RING (256); the avail index's release store below orders this.
            let head = u16::try_from(head).unwrap_or(0);
            let _ = avail.write_obj(head, 4 + 2 * usize::from(ring.next % RING));
            ring.next = ring.next.wrapping_add(1);
            ring.seen = ring.seen.wrapping_add(1);
        }
        if fresh > 0 {
            let _ = avail.store(ring.next, 2, Ordering::Release);
        }
        fresh
    }

    fn queue_pair(&self) -> Result<QueuePair, String> {
        let queue = |(desc, avail, used)| {
            Queue::new(&self.mem, QueueConfig { size: RING, desc, avail, used }, false)
                .map_err(|e| e.to_string())
        };
        let signals =
            || DeviceSignals::new(InterruptLine::new(Arc::default(), None), Arc::new(AtomicBool::new(false)));
        Ok(QueuePair {
            rx: queue(RX)?,
            tx: queue(TX)?,
            rx_signals: signals(),
            tx_signals: signals(),
            tx_kick: None,
        })
    }
}

/// A frame from the sender to the receiver, IPv4's type, the rest zero.
fn frame() -> [u8; FRAME_LEN] {
    let mut frame = [0u8; FRAME_LEN];
    frame[..6].copy_from_slice(&RECEIVER.0);
    frame[6..12].copy_from_slice(&SENDER.0);
    frame[12..14].copy_from_slice(&[0x08, 0x00]);
    frame
}

fn measure(args: &NetBenchArgs) -> Result<Measured, String> {
    let control = Arc::new(SwitchControl::new().map_err(|e| e.to_string())?);
    let mut switch = Switch::new(control.clone(), 0).map_err(|e| e.to_string())?;
    switch.set_polling(true);
    let (mut sender, mut receiver) = (Guest::new()?, Guest::new()?);
    sender.lay_out(&frame(), true)?;
    receiver.lay_out(&frame(), false)?;
    let pinned = |mac| PortPolicy { mac: Some(mac), ..PortPolicy::default() };
    control.attach(Port::new(sender.queue_pair()?).with_policy(pinned(SENDER))).map_err(|e| e.to_string())?;
    let to = control
        .attach(Port::new(receiver.queue_pair()?).with_policy(pinned(RECEIVER)))
        .map_err(|e| e.to_string())?;

    // Both sides on threads of their own, pinned, so that the bench's own thread (which starts
    // the other rows' processes) keeps its CPUs.
    let stop = AtomicBool::new(false);
    let started = Barrier::new(2);
    let (iocore_cpu, driver_cpu) = (args.iocore_cpu, args.vcpu_cpu);
    let duration = Duration::from_millis(args.duration_ms);
    std::thread::scope(|scope| {
        let named = |name: &str| std::thread::Builder::new().name(name.into());
        let iocore = named("frames-iocore").spawn_scoped(scope, || {
            let pinned = iocore::pin_current_thread(iocore_cpu);
            started.wait();
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..1024 {
                    switch.poll();
                }
            }
            pinned.map(|()| switch.port_counters(to).map_or(0, |c| c.rx_no_buffer))
        });
        let iocore = iocore.map_err(|e| format!("cannot start the IOCore thread: {e}"))?;
        let driver = named("frames-driver").spawn_scoped(scope, || {
            let pinned = iocore::pin_current_thread(driver_cpu);
            started.wait();
            let mut drive = |until: Instant| {
                let mut delivered = 0u64;
                while Instant::now() < until {
                    for _ in 0..64 {
                        sender.recycle(false);
                        delivered += u64::from(receiver.recycle(true));
                    }
                }
                delivered
            };
            drive(Instant::now() + WARMUP);
            let begin = Instant::now();
            let frames = drive(begin + duration);
            let seconds = begin.elapsed().as_secs_f64();
            stop.store(true, Ordering::Relaxed);
            pinned.map(|()| (frames, seconds))
        });
        let Ok(driver) = driver else {
            // Let the IOCore thread past its start, to see the stop and end.
            stop.store(true, Ordering::Relaxed);
            started.wait();
            return Err("cannot start the ring driver's thread".to_string());
        };
        let driven = driver.join().map_err(|_| "the ring driver panicked".to_string())?;
        let dropped = iocore.join().map_err(|_| "the IOCore thread panicked".to_string())?;
        let (frames, seconds) =
            driven.map_err(|e| format!("cannot pin the ring driver to CPU {driver_cpu}: {e}"))?;
        let dropped = dropped.map_err(|e| format!("cannot pin the IOCore to CPU {iocore_cpu}: {e}"))?;
        Ok(Measured { frames, seconds, dropped })
    })
}

/// The VM-to-VM row's name.
pub const VM_ROW_NAME: &str =
    "64 B frames exitless VM to exitless VM through one exitless vhost-user-net IOCore (sidecore)";

/// Two exitless probe VMs on one daemon (sidecore, no uplink): one sends 60-byte frames as
/// fast as its transmit ring takes them, the other counts them. The sender's vCPU is on the
/// vCPU's CPU, the counter's on `counter_cpu` (`None`: there is no CPU for it, and the row says
/// so), the IOCore on its own.
pub fn vm_row(args: &NetBenchArgs, tsc_khz: u32, counter_cpu: Option<usize>) -> Row {
    let mut row = Row::new("exitless", VM_ROW_NAME.to_string(), FRAME_LEN as u64);
    (row.path, row.workload) = ("vm-to-vm", "frames");
    let Some(cpu) = counter_cpu else {
        row.note = Some(
            "not measured: two spinning vCPUs and the IOCore need three CPUs; --vm-responder-cpu names one \
             for the counting VM to share"
                .into(),
        );
        return row;
    };
    if let Err(e) = measure_vms(&mut row, args, tsc_khz, cpu) {
        row.note = Some(format!("not measured: {}", super::super::one_line(&e)));
    }
    row
}

/// The counting VM's address and MAC, and the sending VM's.
const COUNTER: (&str, &str) = ("10.95.0.1", "52:54:00:66:73:01");
const SENDER_VM: (&str, &str) = ("10.95.0.2", "52:54:00:66:73:02");
/// How much longer the counter runs than the sender, which starts after it.
pub(super) const COUNTER_EXTRA_MS: u64 = 3000;

fn measure_vms(row: &mut Row, args: &NetBenchArgs, tsc_khz: u32, counter_cpu: usize) -> Result<(), String> {
    use crate::probe_dir::ProbeDir;
    use crate::scale::launch::{run_exitless, ExitlessVm};
    use exitless_args::VhostIoMode;

    let dir = ProbeDir::make("net-frames").map_err(|e| e.to_string())?;
    let sockets = [COUNTER, SENDER_VM].map(|(ip, _)| dir.path().join(format!("{ip}.sock")));
    let nics = [(sockets[0].as_path(), COUNTER.1), (sockets[1].as_path(), SENDER_VM.1)];
    let daemon = super::switch::start_switch(args, VhostIoMode::Sidecore, dir.path(), &nics, None)
        .map_err(|e| e.to_string())?;
    let device = |socket: &Path, mac: &str| format!("vhost-user={},mac={mac}", socket.display());
    let cmdline = |workload: &str, ip: &str, peer: &str, ms: u64| {
        format!("probe.workload={workload} probe.ip={ip} probe.dst={peer} probe.duration_ms={ms}")
    };
    let counter_ms = args.duration_ms + COUNTER_EXTRA_MS;
    let (counter_device, sender_device) = (device(&sockets[0], COUNTER.1), device(&sockets[1], SENDER_VM.1));
    let counter_vm = ExitlessVm {
        device: ["--net", &counter_device],
        cmdline: cmdline("frames-count", COUNTER.0, SENDER_VM.0, counter_ms),
        result: "frames-count",
        rate: "fps",
    };
    let sender_vm = ExitlessVm {
        device: ["--net", &sender_device],
        cmdline: cmdline("frames-send", SENDER_VM.0, COUNTER.0, args.duration_ms),
        result: "frames-send",
        rate: "fps",
    };
    let context =
        |cpu, ms| super::switch::exitless_vm_context(args, tsc_khz, &dir, cpu, ms).map_err(|e| e.to_string());
    let (counter_context, sender_context) =
        (context(counter_cpu, counter_ms)?, context(args.vcpu_cpu, args.duration_ms)?);
    let watcher: Arc<Mutex<Vec<u32>>> = Arc::default();
    let (counted, sent) = std::thread::scope(|scope| {
        let counter = scope.spawn(|| run_exitless(&counter_vm, false, &counter_context, &watcher));
        // The counter first: the sender asks for its address with ARP, once a second, ten times.
        std::thread::sleep(Duration::from_millis(500));
        let sent = run_exitless(&sender_vm, false, &sender_context, &watcher);
        (counter.join(), sent)
    });
    let _ = daemon.terminate(Duration::from_secs(10));
    let sent = sent.map_err(|e| format!("the sending VM: {e}"))?;
    let counted = counted.map_err(|_| "the counting VM's runner panicked".to_string())?;
    let counted = counted.map_err(|e| format!("the counting VM: {e}"))?;
    let exits = vmm::Counters::sum([&sent.counters, &counted.counters]);
    row.transactions = counted.ops;
    row.mpps = Some(counted.rate / 1e6);
    // Per frame sent: the counter takes fewer when it gets less of a CPU than the sender.
    row.exits_per_transaction = Some(exits.get("exits") as f64 / sent.ops.max(1) as f64);
    row.exits_by_cause = super::super::causes_per(&exits, sent.ops);
    row.note = Some(format!(
        "the sending VM offered {:.3} Mpps ({} frames), the counting VM took {:.3} Mpps ({} frames over its \
         active time); vCPUs on CPUs {} and {counter_cpu}, the IOCore on CPU {}; exits are both VMs', per \
         frame sent",
        sent.rate / 1e6,
        sent.ops,
        counted.rate / 1e6,
        counted.ops,
        args.vcpu_cpu,
        args.iocore_cpu,
    ));
    Ok(())
}
