//! QEMU-KVM as a peer in the block ladder: the same probe guest, workload and backing file,
//! under QEMU's own virtio-blk (microvm, virtio-mmio, an iothread, aio=io_uring, cache=none)
//! with interrupt and with polled completion, and under QEMU with exitless's vhost-user-blk
//! backend. Exits come from QMP `query-stats`, sampled at the probe's marks.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use super::blk::{Row, Scenario};
use super::causes_per;
use crate::cli::BlkBenchArgs;
use crate::qemu::{PeerMark, Qemu};
use crate::seccomp::SeccompArgs;
use vmm::Counters;

/// How long the probe idles at each mark while the runner samples QEMU's counters.
const MARK_LINGER_MS: u64 = 30;
const RUN_SLACK: Duration = Duration::from_secs(120);

/// The peer configurations, in report order: (mode name, guest completion, vhost-user).
const CONFIGS: [(&str, &str, bool); 3] = [
    ("qemu virtio-blk, interrupt", "interrupt", false),
    ("qemu virtio-blk, poll", "poll", false),
    ("qemu + exitless vhost-user-blk, poll", "poll", true),
];

pub struct QemuPeer {
    qemu: Qemu,
    dir: PathBuf,
    elf: PathBuf,
}

impl QemuPeer {
    pub fn new(qemu: Qemu) -> Result<QemuPeer, String> {
        let dir = std::env::temp_dir().join(format!("exitless-bench-qemu-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let elf = dir.join("exitless-probe.elf");
        crate::probe::export(&elf).map_err(|e| e.to_string())?;
        Ok(QemuPeer { qemu, dir, elf })
    }

    pub fn version(&self) -> &str {
        &self.qemu.version
    }

    /// One row per configuration for `scenario` on `disk`: the file (for QEMU's own device) and
    /// its `--disk` spec (for exitless's vhost-user backend).
    pub fn rows(
        &mut self,
        scenario: Scenario,
        args: &BlkBenchArgs,
        disk: (&Path, &str),
        tsc_khz: u32,
    ) -> Vec<Row> {
        CONFIGS
            .iter()
            .map(|&(name, completion, vhost_user)| {
                super::progress(format_args!(
                    "{name}: {} {} B, queue depth {}",
                    scenario.rw, scenario.bs, scenario.qd
                ));
                let mut row = Row::new("qemu", name.to_string(), scenario);
                if vhost_user {
                    row.device = "vhost-user-blk";
                }
                if let Err(e) = self.measure(&mut row, scenario, args, disk, tsc_khz, completion, vhost_user)
                {
                    row.note = Some(format!("not measured: {e}"));
                }
                row
            })
            .collect()
    }

    #[allow(clippy::too_many_arguments)]
    fn measure(
        &mut self,
        row: &mut Row,
        scenario: Scenario,
        args: &BlkBenchArgs,
        (disk, spec): (&Path, &str),
        tsc_khz: u32,
        completion: &str,
        vhost_user: bool,
    ) -> Result<(), String> {
        let Scenario { rw, bs, qd } = scenario;
        let cmdline = format!(
            "probe.workload=blk probe.rw={rw} probe.bs={bs} probe.qd={qd} probe.duration_ms={} probe.warmup={} \
             probe.tsc_khz={tsc_khz} probe.completion={completion} probe.mark_linger_ms={MARK_LINGER_MS}",
            args.duration_ms, args.warmup
        );
        let mut machine = "microvm,acpi=off".to_string();
        let mut extra: Vec<String> = Vec::new();
        let mut backend = None;
        if vhost_user {
            let socket = self.dir.join("vhost-user-blk.sock");
            backend = Some(Backend::start(&socket, spec, args.iocore_cpu, args.seccomp)?);
            machine += ",memory-backend=mem";
            extra.extend(
                [
                    "-object",
                    "memory-backend-memfd,id=mem,size=256M,share=on",
                    "-chardev",
                    &format!("socket,id=vu,path={}", socket.display()),
                    "-device",
                    "vhost-user-blk,chardev=vu",
                ]
                .map(String::from),
            );
        } else {
            extra.extend(
                [
                    "-object",
                    "iothread,id=io0",
                    "-drive",
                    &format!("file={},format=raw,if=none,id=d0,cache=none,aio=io_uring", disk.display()),
                    "-device",
                    "virtio-blk-device,drive=d0,iothread=io0",
                ]
                .map(String::from),
            );
        }
        let mut qemu_args = Qemu::probe_args(&self.elf, &cmdline, 256);
        let machine_at = qemu_args.iter().position(|a| a == "microvm").ok_or("unexpected QEMU arguments")?;
        qemu_args[machine_at] = machine;
        qemu_args.extend(["-global".to_string(), "virtio-mmio.force-legacy=false".to_string()]);
        qemu_args.extend(extra);
        let helpers: Vec<u32> = backend.iter().map(|b| b.child.id()).collect();
        let qmp = self.dir.join("qmp.sock");
        let _ = std::fs::remove_file(&qmp);
        let timeout = Duration::from_millis(args.duration_ms) + RUN_SLACK;
        let (run, marks) =
            self.qemu.run_marked(&qemu_args, Some(&qmp), &helpers, timeout).map_err(|e| e.to_string())?;
        row.command = Some(run.command_line.clone());
        drop(backend);
        let line = run
            .stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["probe"] == "blk")
            .ok_or_else(|| format!("the probe printed no result (status {})", run.guest_status))?;
        if run.guest_status != probe_abi::status::OK {
            return Err(format!("the probe exited with status {}: {line}", run.guest_status));
        }
        let ops = line["ops"].as_u64().unwrap_or(0);
        row.ops = ops;
        row.iops = line["iops"].as_f64();
        row.p50_us = line["p50_ns"].as_f64().map(|ns| ns / 1000.0);
        row.p99_us = line["p99_ns"].as_f64().map(|ns| ns / 1000.0);
        let (start, end) = (find(&marks, 0)?, find(&marks, 1)?);
        let counters = exits_between(start, end);
        row.exits_per_io = Some(counters.get("exits") as f64 / ops.max(1) as f64);
        row.exits_by_cause = causes_per(&counters, ops);
        let wall = end.at.duration_since(start.at).as_secs_f64();
        row.cpu_cores_used = (wall > 0.0).then(|| end.cpu.saturating_sub(start.cpu).as_secs_f64() / wall);
        Ok(())
    }
}

impl Drop for QemuPeer {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn find(marks: &[PeerMark], label: u32) -> Result<&PeerMark, String> {
    marks.iter().find(|m| m.label == label).ok_or_else(|| format!("no sample at mark {label}"))
}

/// Counter growth between two samples, less the exits the closing mark's console line cost.
fn exits_between(start: &PeerMark, end: &PeerMark) -> Counters {
    let before: Map<String, Value> = start.stats.iter().map(|(k, v)| (k.clone(), (*v).into())).collect();
    Counters(
        end.stats
            .iter()
            .map(|(name, value)| {
                let mut grown = value.saturating_sub(before.get(name).and_then(Value::as_u64).unwrap_or(0));
                if name == "exits" {
                    grown = grown.saturating_sub(end.line_bytes);
                }
                (name.clone(), grown)
            })
            .collect(),
    )
}

/// `exitless vhost-user-blk` serving the bench's disk, for QEMU.
struct Backend {
    child: Child,
}

impl Backend {
    fn start(socket: &Path, disk: &str, iocore_cpu: usize, seccomp: SeccompArgs) -> Result<Backend, String> {
        let _ = std::fs::remove_file(socket);
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let child = Command::new(exe)
            .args(["vhost-user-blk", "--socket"])
            .arg(socket)
            .args(["--disk", disk])
            .args(["--io-mode", "sidecore", "--iocore-cpu", &iocore_cpu.to_string()])
            .args(seccomp.flag())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start the vhost-user backend: {e}"))?;
        let mut backend = Backend { child };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            if Instant::now() > deadline || backend.child.try_wait().ok().flatten().is_some() {
                return Err("the vhost-user backend did not create its socket".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(backend)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
