//! QEMU-KVM as the peer in `bench net`: the same probe guest, `udp-rr` workload and responder,
//! under QEMU's virtio-net (`virtio-net-device` on `-M microvm`, virtio-mmio) on the same tap in
//! the same network namespace. With QEMU's user-space tap backend (`vhost=off`: its main loop
//! reads and writes the tap) once with guest interrupts and once with the guest polling; and,
//! where the host has `/dev/vhost-net`, with kernel vhost-net busy polling (`vhost=on,poll-us=`)
//! and the guest polling. QEMU's vCPU thread runs on the vCPU CPU and its other threads (the
//! main loop that serves the tap) on the IOCore CPU, as exitless's would. And with its NIC on
//! `exitless vhost-user-net` (`-netdev vhost-user`), whose switch's IOCore, on the IOCore CPU,
//! carries the frames to the responder through the daemon's uplink, a veth pair into the
//! responder's namespace. Exits come from QMP `query-stats`, sampled at the probe's marks;
//! cores are QEMU's (and the daemon's) CPU time over wall time.

use std::path::Path;
use std::time::Duration;

use exitless_args::VhostIoMode;
use thiserror::Error;

use super::super::blk_qemu::{exits_between, find};
use super::super::causes_per;
use super::switch::{start_switch, SwitchError, GUEST_MAC_TEXT};
use super::{Lab, Row, GUEST_IP, PORT, RUN_SLACK, SERVER_TAP_IP, SERVER_UPLINK_IP, TAP, UPLINK_GUEST_IP};
use crate::args::NetBenchArgs;
use crate::daemon::Backend as Daemon;
use crate::probe_dir::{ProbeDir, ProbeDirError};
use crate::qemu::{PeerMark, ProbeError, Qemu, QemuError, QemuRun};

/// How long the probe idles at each mark while the runner samples QEMU's counters.
pub(super) const MARK_LINGER_MS: u64 = 30;

/// QEMU's guest RAM, as exitless's own (the VM config's default).
pub(super) const MEM_MIB: u64 = 256;

/// vhost-net's busy polling (`poll-us`): longer than a round trip through the responder here
/// (tens of µs), so that the vhost worker that sent a request is still polling when its echo
/// comes back, as exitless's polling IOCore is.
const VHOST_POLL_US: u32 = 200;

/// The kernel's vhost-net device, which `vhost=on` opens.
const VHOST_NET: &str = "/dev/vhost-net";

/// How QEMU's virtio-net reaches the tap.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// QEMU's own user-space tap backend (its main loop).
    UserSpace,
    /// Kernel vhost-net with busy polling.
    VhostNet,
    /// `exitless vhost-user-net`: the frames go through its switch and uplink.
    ExitlessSwitch,
}

/// The peer configurations, in report order: (mode name, guest completion, backend).
pub const CONFIGS: [(&str, &str, Backend); 4] = [
    ("qemu virtio-net, tap, interrupt", "interrupt", Backend::UserSpace),
    ("qemu virtio-net, tap, poll", "poll", Backend::UserSpace),
    ("qemu virtio-net, vhost-net poll-us, poll", "poll", Backend::VhostNet),
    ("qemu virtio-net on exitless vhost-user-net (uplink), poll", "poll", Backend::ExitlessSwitch),
];

/// Why the QEMU peer could not be set up, or one of its runs failed.
#[derive(Debug, Error)]
pub enum QemuNetError {
    /// The directory of its QMP socket and the probe could not be made.
    #[error(transparent)]
    Dir(#[from] ProbeDirError),
    /// A vhost-net row, and this host has no vhost-net.
    #[error(
        "this host has no {} (kernel vhost-net; `modprobe vhost_net` where the kernel has it)",
        VHOST_NET
    )]
    NoVhostNet,
    /// QEMU failed.
    #[error(transparent)]
    Qemu(#[from] QemuError),
    /// `exitless vhost-user-net` could not be started or stopped.
    #[error(transparent)]
    Switch(#[from] SwitchError),
    /// The VM-to-VM responder's log could not be made.
    #[error("the responder's log: {0}")]
    ResponderLog(#[source] std::io::Error),
    /// The VM-to-VM responder's QEMU could not be started.
    #[error("cannot start the responder's QEMU: {0}")]
    ResponderStart(#[source] std::io::Error),
    /// The VM-to-VM responder's QEMU did not come up.
    #[error("the responder's QEMU did not come up: {0}")]
    ResponderNotUp(String),
    /// The VM-to-VM frame counter's QEMU did not end in time.
    #[error("the counting guest's QEMU did not end within {0:?}")]
    ResponderNotDone(Duration),
    /// The VM-to-VM frame counter gave no result (what its console said).
    #[error("the counting guest gave no result: {0}")]
    ResponderSaid(String),
    /// The probe's run under QEMU gave no usable result.
    #[error(transparent)]
    Probe(#[from] ProbeError),
}

/// QEMU with the probe exported for it.
pub struct QemuNet {
    pub(super) qemu: Qemu,
    pub(super) probe: ProbeDir,
}

impl QemuNet {
    /// `qemu`, with the probe ELF exported to a directory of this run's (removed on drop).
    pub fn new(qemu: Qemu) -> Result<QemuNet, QemuNetError> {
        Ok(QemuNet { qemu, probe: ProbeDir::make("net-qemu")? })
    }

    /// QEMU's version line.
    pub fn version(&self) -> &str {
        &self.qemu.version
    }

    /// One row per configuration, the probe talking to `lab`'s responder through its tap.
    pub fn rows(&self, args: &NetBenchArgs, lab: &Lab, tsc_khz: u32) -> Vec<Row> {
        CONFIGS
            .iter()
            .map(|&(name, completion, backend)| {
                let through = match backend {
                    Backend::ExitlessSwitch => "the daemon's switch and uplink",
                    _ => "the tap",
                };
                super::super::progress(format_args!(
                    "{name}: UDP request-response through {through}, {} B",
                    args.size
                ));
                let vmm = if backend == Backend::ExitlessSwitch { "qemu+exitless" } else { "qemu" };
                let mut row = Row::new(vmm, name.to_string(), args.size);
                if let Err(e) = self.measure(&mut row, args, lab, tsc_khz, completion, backend) {
                    row.note = Some(format!("not measured: {e}"));
                }
                row
            })
            .collect()
    }

    fn measure(
        &self,
        row: &mut Row,
        args: &NetBenchArgs,
        lab: &Lab,
        tsc_khz: u32,
        completion: &str,
        backend: Backend,
    ) -> Result<(), QemuNetError> {
        if backend == Backend::VhostNet && !Path::new(VHOST_NET).exists() {
            return Err(QemuNetError::NoVhostNet);
        }
        let (guest_ip, server_ip) = match backend {
            Backend::ExitlessSwitch => (UPLINK_GUEST_IP, SERVER_UPLINK_IP),
            _ => (GUEST_IP, SERVER_TAP_IP),
        };
        let cmdline = format!(
            "probe.workload=udp-rr probe.ip={guest_ip} probe.dst={server_ip} probe.port={PORT} probe.size={} \
             probe.duration_ms={} probe.warmup={} probe.tsc_khz={tsc_khz} probe.completion={completion} \
             probe.pv_eoi=off probe.mark_linger_ms={MARK_LINGER_MS}",
            args.size, args.duration_ms, args.warmup
        );
        let (machine, nic, daemon) = match backend {
            Backend::UserSpace | Backend::VhostNet => {
                let vhost = match backend {
                    Backend::VhostNet => format!("vhost=on,poll-us={VHOST_POLL_US}"),
                    _ => "vhost=off".to_string(),
                };
                ("microvm,acpi=off", tap_nic(TAP, None, &vhost), None)
            }
            Backend::ExitlessSwitch => {
                let (nic, daemon) = self.switch_nic(args, lab)?;
                ("microvm,acpi=off,memory-backend=mem", nic, Some(daemon))
            }
        };
        // QEMU opens the tap by name, so it starts in the tap's namespace.
        let mut wrapped = in_netns(Some(&lab.server), &self.qemu);
        wrapped.extend(Qemu::probe_args(machine, self.probe.elf(), &cmdline, MEM_MIB));
        wrapped.extend(thread_names());
        wrapped.extend(nic);
        let helpers: Vec<u32> = daemon.iter().map(Daemon::id).collect();
        let runner = Qemu { binary: wrapped.remove(0).into(), version: self.qemu.version.clone() };
        let qmp = self.probe.path().join("qmp.sock");
        let _ = std::fs::remove_file(&qmp);
        let timeout = Duration::from_millis(args.duration_ms) + RUN_SLACK;
        let (vcpu_cpu, io_cpu) = (args.vcpu_cpu, args.iocore_cpu);
        let (run, marks) = runner.run_marked_with(&wrapped, Some(&qmp), &helpers, timeout, |pid| {
            crate::qemu::pin_threads(pid, vcpu_cpu, io_cpu)
        })?;
        record(row, &run, &marks)?;
        if let Some(daemon) = daemon {
            daemon.terminate(Duration::from_secs(10)).map_err(SwitchError::Daemon)?;
        }
        Ok(())
    }

    /// Start `exitless vhost-user-net` with one NIC and `lab`'s uplink, its IOCore on the IOCore
    /// CPU: QEMU's arguments for a guest NIC on it, and the daemon.
    fn switch_nic(&self, args: &NetBenchArgs, lab: &Lab) -> Result<(Vec<String>, Daemon), QemuNetError> {
        let socket = self.probe.path().join("nic.sock");
        let daemon = start_switch(
            args,
            VhostIoMode::Sidecore,
            self.probe.path(),
            &[(&socket, GUEST_MAC_TEXT)],
            Some(&lab.uplink),
        )?;
        Ok((vhost_user_nic(&socket, GUEST_MAC_TEXT), daemon))
    }
}

/// Fill `row` from the client's run: its `udp-rr` result, and the exits (of every QEMU sampled)
/// and cores between the probe's marks.
pub(super) fn record(row: &mut Row, run: &QemuRun, marks: &[PeerMark]) -> Result<(), QemuNetError> {
    row.command = Some(run.command_line.clone());
    let line = crate::probe_result(&run.stdout, "udp-rr").ok_or(ProbeError::NoResult(run.guest_status))?;
    if run.guest_status != probe_abi::status::OK {
        return Err(ProbeError::Status { status: run.guest_status, line }.into());
    }
    let ops = line["ops"].as_u64().unwrap_or(0);
    row.transactions = ops;
    row.transactions_per_s = line["tps"].as_f64();
    row.p50_us = line["p50_ns"].as_f64().map(|ns| ns / 1000.0);
    row.p99_us = line["p99_ns"].as_f64().map(|ns| ns / 1000.0);
    record_marks(row, marks, ops)
}

/// Fill `row`'s exits (of every QEMU sampled), per one of `ops`, and cores between the probe's
/// marks 0 and 1.
pub(super) fn record_marks(row: &mut Row, marks: &[PeerMark], ops: u64) -> Result<(), QemuNetError> {
    let (start, end) = (find(marks, 0)?, find(marks, 1)?);
    let counters = exits_between(start, end);
    row.exits_per_transaction = Some(counters.get("exits") as f64 / ops.max(1) as f64);
    row.exits_by_cause = causes_per(&counters, ops);
    let wall = end.at.duration_since(start.at).as_secs_f64();
    row.cpu_cores_used = (wall > 0.0).then(|| end.cpu.saturating_sub(start.cpu).as_secs_f64() / wall);
    Ok(())
}

/// QEMU's arguments for a guest, RAM in a memfd shared with the daemon, whose NIC `mac` is on
/// the vhost-user socket `socket` (with `-M ...,memory-backend=mem`).
pub(super) fn vhost_user_nic(socket: &Path, mac: &str) -> Vec<String> {
    [
        "-object".to_string(),
        format!("memory-backend-memfd,id=mem,size={MEM_MIB}M,share=on"),
        "-chardev".to_string(),
        format!("socket,id=nic0,path={}", socket.display()),
        "-netdev".to_string(),
        "vhost-user,id=net0,chardev=nic0".to_string(),
        "-device".to_string(),
        format!("virtio-net-device,netdev=net0,mac={mac}"),
    ]
    .to_vec()
}

/// The program and arguments that start QEMU, in network namespace `netns` if one is named (it
/// opens its tap by name there; `ip netns exec` execs QEMU, which keeps the process id the
/// pinning and CPU time need).
pub(super) fn in_netns(netns: Option<&str>, qemu: &Qemu) -> Vec<String> {
    let binary = qemu.binary.display().to_string();
    match netns {
        Some(netns) => ["ip", "netns", "exec", netns, &binary].map(String::from).to_vec(),
        None => vec![binary],
    }
}

/// Modern virtio-mmio, and thread names, so that `pin_threads` tells the vCPU thread from the
/// others.
pub(super) fn thread_names() -> [String; 4] {
    ["-global", "virtio-mmio.force-legacy=false", "-name", "exitless-bench,debug-threads=on"]
        .map(String::from)
}

/// QEMU's arguments for a NIC (with address `mac`, or QEMU's default) on tap `tap`, its
/// back-end options `vhost` (`vhost=off`: QEMU's own user-space backend).
pub(super) fn tap_nic(tap: &str, mac: Option<&str>, vhost: &str) -> Vec<String> {
    let mac = mac.map_or(String::new(), |mac| format!(",mac={mac}"));
    [
        "-netdev".to_string(),
        format!("tap,id=net0,ifname={tap},script=no,downscript=no,{vhost}"),
        "-device".to_string(),
        format!("virtio-net-device,netdev=net0{mac}"),
    ]
    .to_vec()
}
