//! VM to VM in `exitless bench net`: two probe guests in QEMU-KVM through `exitless
//! vhost-user-net`'s switch, and through two taps on a Linux bridge (QEMU's user-space tap
//! backend; this host has no vhost-net). Two workloads ([`Workload`]): UDP request-response
//! (one guest the `udp-rr` client, the other the `udp-echo` responder), and 64-byte frames (one
//! guest `frames-send`, the other `frames-count`).
//!
//! Each guest's vCPU has a CPU of its own (the probe waits in ring 3, spinning, even for an
//! interrupt): the client's (or sender's) on the vCPU CPU, polling; the responder's (or
//! counter's) on `--vm-responder-cpu` (by default a third CPU); what carries the frames (the
//! daemon's IOCore, or QEMU's main loops serving the taps) on the IOCore CPU. A host without a
//! third CPU measures none of these rows unless told which CPU the second guest shares. Exits
//! are both VMs', sampled at the client's marks; cores are every process's.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use exitless_args::VhostIoMode;

use super::frame_rate::COUNTER_EXTRA_MS;
use super::qemu::{
    in_netns, record, record_marks, tap_nic, thread_names, vhost_user_nic, QemuNet, QemuNetError,
    MARK_LINGER_MS, MEM_MIB,
};
use super::switch::{start_switch, SwitchError};
use super::{Lab, Row, BRIDGE_TAPS, FRAME_LEN, PORT, RUN_SLACK};
use crate::args::NetBenchArgs;
use crate::qemu::{pin_threads, PeerMark, ProbeError, Qemu, QemuRun};

/// What carries the frames between the two guests.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Carrier {
    /// `exitless vhost-user-net`: ring to ring through its switch.
    Switch,
    /// Two taps on a Linux bridge, each served by its QEMU's main loop.
    Bridge,
}

/// What the two guests do.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// UDP request-response: the client polls, the responder takes interrupts.
    UdpRr,
    /// 64-byte frames, as many as the sender's transmit ring takes; both guests poll.
    Frames,
}

/// The configurations, in report order: (mode name, carrier).
const UDP_RR_CONFIGS: [(&str, Carrier); 2] = [
    ("two qemu on exitless vhost-user-net, client poll, responder interrupt", Carrier::Switch),
    ("two qemu on taps and a linux bridge, client poll, responder interrupt", Carrier::Bridge),
];
const FRAMES_CONFIGS: [(&str, Carrier); 2] = [
    ("64 B frames two qemu on exitless vhost-user-net (sidecore), sender and counter poll", Carrier::Switch),
    ("64 B frames two qemu on taps and a linux bridge, sender and counter poll", Carrier::Bridge),
];

const RESPONDER_IP: &str = "10.96.0.1";
const CLIENT_IP: &str = "10.96.0.2";
const RESPONDER_MAC: &str = "52:54:00:65:78:11";
const CLIENT_MAC: &str = "52:54:00:65:78:12";

/// One row per configuration of `workload`.
pub fn rows(net: &QemuNet, args: &NetBenchArgs, lab: &Lab, tsc_khz: u32, workload: Workload) -> Vec<Row> {
    let responder_cpu = responder_cpu(args);
    let configs = match workload {
        Workload::UdpRr => UDP_RR_CONFIGS,
        Workload::Frames => FRAMES_CONFIGS,
    };
    configs
        .iter()
        .map(|&(name, carrier)| {
            let vmm = if carrier == Carrier::Switch { "qemu+exitless" } else { "qemu" };
            let size = if workload == Workload::Frames { FRAME_LEN as u64 } else { args.size };
            let mut row = Row::new(vmm, name.to_string(), size);
            row.path = "vm-to-vm";
            if workload == Workload::Frames {
                row.workload = "frames";
            }
            let Some(cpu) = responder_cpu else {
                row.note = Some(
                    "not measured: VM to VM needs a third CPU, for the second guest's vCPU (it spins), besides \
                     the first's and the IOCore; --vm-responder-cpu names one to share"
                        .into(),
                );
                return row;
            };
            match workload {
                Workload::UdpRr => super::super::progress(format_args!(
                    "{name}: UDP request-response VM to VM, {} B",
                    args.size
                )),
                Workload::Frames => super::super::progress(format_args!("{name}: as many as one VM sends the other")),
            }
            if let Err(e) = measure(net, &mut row, args, lab, tsc_khz, (carrier, workload), cpu) {
                row.note = Some(format!("not measured: {e}"));
            }
            row
        })
        .collect()
}

/// The CPU for the second guest of a VM-to-VM row: `--vm-responder-cpu`, or a spare one.
pub fn responder_cpu(args: &NetBenchArgs) -> Option<usize> {
    args.vm_responder_cpu.or_else(|| spare_cpu(args))
}

/// The first CPU this process may run on that is neither the vCPU's nor the IOCore's.
fn spare_cpu(args: &NetBenchArgs) -> Option<usize> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (0..cpus).find(|&cpu| cpu != args.vcpu_cpu && cpu != args.iocore_cpu)
}

fn measure(
    net: &QemuNet,
    row: &mut Row,
    args: &NetBenchArgs,
    lab: &Lab,
    tsc_khz: u32,
    (carrier, workload): (Carrier, Workload),
    responder_cpu: usize,
) -> Result<(), QemuNetError> {
    let dir = net.probe.path();
    let sockets = [dir.join("responder.sock"), dir.join("client.sock")];
    let (machine, nics, daemon, netns) = match carrier {
        Carrier::Switch => {
            let served = [(sockets[0].as_path(), RESPONDER_MAC), (sockets[1].as_path(), CLIENT_MAC)];
            let daemon = start_switch(args, VhostIoMode::Sidecore, dir, &served, None)?;
            let nics = [vhost_user_nic(&sockets[0], RESPONDER_MAC), vhost_user_nic(&sockets[1], CLIENT_MAC)];
            ("microvm,acpi=off,memory-backend=mem", nics, Some(daemon), None)
        }
        Carrier::Bridge => {
            let nics = [
                tap_nic(BRIDGE_TAPS[0], Some(RESPONDER_MAC), "vhost=off"),
                tap_nic(BRIDGE_TAPS[1], Some(CLIENT_MAC), "vhost=off"),
            ];
            ("microvm,acpi=off", nics, None, Some(lab.bridge.as_str()))
        }
    };
    let [responder_nic, client_nic] = nics;
    let timeout = Duration::from_millis(args.duration_ms) + RUN_SLACK;
    let addresses = format!("probe.port={PORT} probe.tsc_khz={tsc_khz}");
    let (responder_cmdline, cmdline, counter_ms) = match workload {
        Workload::UdpRr => {
            // It outlives the client's run, and is stopped when that ends.
            let lifetime_ms = timeout.as_millis();
            let responder = format!(
                "probe.workload=udp-echo probe.ip={RESPONDER_IP} probe.dst={CLIENT_IP} {addresses} \
                 probe.duration_ms={lifetime_ms} probe.completion=interrupt"
            );
            let client = format!(
                "probe.workload=udp-rr probe.ip={CLIENT_IP} probe.dst={RESPONDER_IP} {addresses} probe.size={} \
                 probe.duration_ms={} probe.warmup={} probe.completion=poll probe.pv_eoi=off \
                 probe.mark_linger_ms={MARK_LINGER_MS}",
                args.size, args.duration_ms, args.warmup
            );
            (responder, client, None)
        }
        Workload::Frames => {
            // It counts from before the sender boots to after it stops, and its result is read.
            let counter_ms = args.duration_ms + COUNTER_EXTRA_MS;
            let counter = format!(
                "probe.workload=frames-count probe.ip={RESPONDER_IP} probe.dst={CLIENT_IP} {addresses} \
                 probe.duration_ms={counter_ms} probe.completion=poll probe.pv_eoi=off"
            );
            let sender = format!(
                "probe.workload=frames-send probe.ip={CLIENT_IP} probe.dst={RESPONDER_IP} {addresses} \
                 probe.duration_ms={} probe.completion=poll probe.pv_eoi=off probe.mark_linger_ms={MARK_LINGER_MS}",
                args.duration_ms
            );
            (counter, sender, Some(counter_ms))
        }
    };
    let responder_qmp = dir.join("responder.qmp");
    let responder = Responder::start(
        net,
        machine,
        &responder_cmdline,
        responder_nic,
        &responder_qmp,
        netns,
        (responder_cpu, args.iocore_cpu),
    )?;
    let mut client_args = in_netns(netns, &net.qemu);
    client_args.extend(Qemu::probe_args(machine, net.probe.elf(), &cmdline, MEM_MIB));
    client_args.extend(thread_names());
    client_args.extend(client_nic);
    let client_qmp = dir.join("client.qmp");
    let _ = std::fs::remove_file(&client_qmp);
    let helpers: Vec<u32> = std::iter::once(responder.pid()).chain(daemon.iter().map(|d| d.id())).collect();
    let runner = Qemu { binary: client_args.remove(0).into(), version: net.qemu.version.clone() };
    let (vcpu_cpu, io_cpu) = (args.vcpu_cpu, args.iocore_cpu);
    let (run, marks) = runner.run_marked_sampling(
        &client_args,
        Some(&client_qmp),
        &[responder_qmp.as_path()],
        &helpers,
        timeout,
        |pid| pin_threads(pid, vcpu_cpu, io_cpu),
    )?;
    match counter_ms {
        None => record(row, &run, &marks)?,
        Some(counter_ms) => {
            let counted = responder.finish(Duration::from_millis(counter_ms) + RUN_SLACK)?;
            record_frames(row, (&run, &marks), &counted, (vcpu_cpu, responder_cpu, io_cpu))?;
        }
    }
    if let Some(daemon) = daemon {
        daemon.terminate(Duration::from_secs(10)).map_err(SwitchError::Daemon)?;
    }
    Ok(())
}

/// Fill `row` from a frame-rate run: the counter's result in `counted` (its console), the
/// sender's `run` and the exits and cores between its `marks`; the note says on which CPUs the
/// sender's vCPU, the counter's and what carried the frames ran.
fn record_frames(
    row: &mut Row,
    (run, marks): (&QemuRun, &[PeerMark]),
    counted: &str,
    (sender_cpu, counter_cpu, io_cpu): (usize, usize, usize),
) -> Result<(), QemuNetError> {
    row.command = Some(run.command_line.clone());
    let sent =
        crate::probe_result(&run.stdout, "frames-send").ok_or(ProbeError::NoResult(run.guest_status))?;
    if run.guest_status != probe_abi::status::OK {
        return Err(ProbeError::Status { status: run.guest_status, line: sent }.into());
    }
    let Some(counted) = crate::probe_result(counted, "frames-count") else {
        return Err(QemuNetError::ResponderSaid(counted.trim().to_string()));
    };
    let frames_sent = sent["ops"].as_u64().unwrap_or(0);
    row.transactions = counted["ops"].as_u64().unwrap_or(0);
    let fps = counted["fps"].as_f64().unwrap_or(0.0);
    row.mpps = Some(fps / 1e6);
    // Per frame sent: the counter takes fewer when it gets less of a CPU than the sender.
    record_marks(row, marks, frames_sent)?;
    row.note = Some(format!(
        "the sending VM offered {:.3} Mpps ({frames_sent} frames), the counting VM took {:.3} Mpps ({} frames, {} \
         lost); vCPUs on CPUs {sender_cpu} and {counter_cpu}, the frames carried on CPU {io_cpu}; exits are \
         both VMs', per frame sent",
        sent["fps"].as_f64().unwrap_or(0.0) / 1e6,
        fps / 1e6,
        row.transactions,
        counted["lost"].as_u64().unwrap_or(0),
    ));
    Ok(())
}

/// The responder's QEMU and its console's log, killed when dropped.
struct Responder(Child, PathBuf);

impl Responder {
    /// Boot the responder with `cmdline` and `nic`, its vCPU on `cpu` and its other threads on the
    /// IOCore CPU, QMP on `qmp`; wait (at most 10 s) until QMP listens, so it is up before the
    /// client asks for it.
    fn start(
        net: &QemuNet,
        machine: &str,
        cmdline: &str,
        nic: Vec<String>,
        qmp: &Path,
        netns: Option<&str>,
        (cpu, io_cpu): (usize, usize),
    ) -> Result<Responder, QemuNetError> {
        let _ = std::fs::remove_file(qmp);
        let mut words = in_netns(netns, &net.qemu);
        words.extend(Qemu::probe_args(machine, net.probe.elf(), cmdline, MEM_MIB));
        words.extend(thread_names());
        words.extend(nic);
        words.extend(["-qmp".to_string(), format!("unix:{},server=on,wait=off", qmp.display())]);
        let log = net.probe.path().join("responder.log");
        let out = std::fs::File::create(&log).map_err(QemuNetError::ResponderLog)?;
        let err = out.try_clone().map_err(QemuNetError::ResponderLog)?;
        let child = Command::new(&words[0])
            .args(&words[1..])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(QemuNetError::ResponderStart)?;
        let mut responder = Responder(child, log.clone());
        pin_threads(responder.pid(), cpu, io_cpu);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !qmp.exists() {
            if std::time::Instant::now() > deadline || responder.0.try_wait().ok().flatten().is_some() {
                let said = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(QemuNetError::ResponderNotUp(said.trim().to_string()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(responder)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Wait (at most `timeout`) for the guest to end; what its console said.
    fn finish(mut self, timeout: Duration) -> Result<String, QemuNetError> {
        let deadline = std::time::Instant::now() + timeout;
        while self.0.try_wait().ok().flatten().is_none() {
            if std::time::Instant::now() > deadline {
                return Err(QemuNetError::ResponderNotDone(timeout));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        std::fs::read_to_string(&self.1).map_err(QemuNetError::ResponderLog)
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
