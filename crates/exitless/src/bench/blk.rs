//! `exitless bench` (the default scenario): the block I/O ladder. The probe guest runs the same
//! block workload on a virtio-blk disk in each I/O mode, and fio runs it on the host against
//! the very same file: the bare-metal baseline.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};
use vmm::{ConsoleMode, DiskBackend, IoMode, VmConfig, VmError};

use super::baseline::{self, FioJob, FioResult};
use super::blk_qemu::QemuPeer;
use super::machine::About;
use super::table::Table;
use super::{causes_per, format_causes, progress};
use crate::cli::{BlkBenchArgs, Peer};
use crate::qemu::Qemu;
use crate::{fail, probe};

/// Time a VM gets beyond its measured run (boot, warm-up, teardown) before it is stopped.
const RUN_SLACK: Duration = Duration::from_secs(120);

#[derive(Serialize, Clone)]
pub struct Row {
    pub device: &'static str,
    pub vmm: &'static str,
    pub mode: String,
    pub workload: &'static str,
    pub block_size: u32,
    pub queue_depth: u32,
    pub iops: Option<f64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    /// Requests measured.
    pub ops: u64,
    pub exits_per_io: Option<f64>,
    pub exits_by_cause: Map<String, Value>,
    pub bare_metal_iops: Option<f64>,
    pub ratio_to_bare_metal: Option<f64>,
    /// IOPS over the best of QEMU's own virtio-blk configurations in the same run.
    pub ratio_to_qemu: Option<f64>,
    pub cpu_cores_used: Option<f64>,
    /// The command that ran the row (fio, QEMU); exitless's own rows ran in this process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    pub note: Option<String>,
}

impl Row {
    /// A row with nothing measured yet.
    pub fn new(vmm: &'static str, mode: String, scenario: Scenario) -> Row {
        Row {
            device: "virtio-blk",
            vmm,
            mode,
            workload: scenario.rw,
            block_size: scenario.bs,
            queue_depth: scenario.qd,
            iops: None,
            p50_us: None,
            p99_us: None,
            ops: 0,
            exits_per_io: None,
            exits_by_cause: Map::new(),
            bare_metal_iops: None,
            ratio_to_bare_metal: None,
            ratio_to_qemu: None,
            cpu_cores_used: None,
            command: None,
            note: None,
        }
    }
}

/// One workload shape.
#[derive(Clone, Copy)]
pub struct Scenario {
    pub rw: &'static str,
    pub bs: u32,
    pub qd: u32,
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    about: About,
    tsc_khz: u32,
    disk: String,
    fio_version: Option<String>,
    qemu_version: Option<String>,
    results: Vec<Row>,
}

pub fn main(args: BlkBenchArgs) -> i32 {
    match run(&args) {
        Ok(report) => super::print_report(&report, args.output, |markdown| report.tables(markdown)),
        Err(e) => fail(e),
    }
}

fn run(args: &BlkBenchArgs) -> Result<Report, String> {
    let tsc_khz = vmm::tsc_khz().map_err(|e| e.to_string())?;
    if let Some(dir) = &args.plot {
        super::plot::prepare(dir)?;
    }
    let disk = BenchDisk::prepare(&args.disk)?;
    let mut qemu = match args.peers.contains(&Peer::Qemu) {
        false => None,
        true => {
            let found = Qemu::find().ok_or(
                "--peers qemu: qemu-system-x86_64 not found (install qemu-system-x86, or pass --peers none)",
            )?;
            Some(QemuPeer::new(found)?)
        }
    };
    let mut results = Vec::new();
    for &rw in &args.rw {
        for &bs in &args.bs {
            for &qd in &args.qd {
                let scenario = Scenario { rw: rw.name(), bs, qd };
                let first = results.len();
                let bare_metal = if args.no_baseline {
                    None
                } else {
                    progress(format_args!("bare metal (fio): {} {bs} B, queue depth {qd}", scenario.rw));
                    let (best, all) =
                        baseline::best(&disk.fio_job(scenario, args)).map_err(|e| e.to_string())?;
                    results.push(host_row(scenario, &best, &all));
                    Some(best.iops)
                };
                for &mode in &args.modes {
                    let mode = IoMode::from(mode);
                    progress(format_args!("exitless {mode}: {} {bs} B, queue depth {qd}", scenario.rw));
                    let row = run_mode(mode, scenario, args, tsc_khz, &disk.vm_backend)
                        .map_err(|e| format!("{mode}, {} {bs} B, queue depth {qd}: {e}", scenario.rw))?;
                    results.push(row);
                }
                if let Some(peer) = qemu.as_mut() {
                    results.extend(peer.rows(scenario, args, (&disk.fio_path, &disk.spec), tsc_khz));
                }
                compare(&mut results[first..], bare_metal);
            }
        }
    }
    if let Some(dir) = &args.plot {
        let files = super::plot::write_all(dir, &results)?;
        progress(format_args!("wrote {} plot(s) to {}", files.len(), dir.display()));
    }
    Ok(Report {
        about: About::now("blk"),
        tsc_khz,
        disk: disk.describe.clone(),
        fio_version: (!args.no_baseline).then(baseline::fio_version).flatten(),
        qemu_version: qemu.as_ref().map(|q| q.version().to_string()),
        results,
    })
}

/// Fill in one scenario's ratios: to bare metal (the baseline's IOPS) and to the best of
/// QEMU's own virtio-blk configurations.
fn compare(rows: &mut [Row], bare_metal: Option<f64>) {
    let qemu_best = rows
        .iter()
        .filter(|r| r.vmm == "qemu" && r.device == "virtio-blk")
        .filter_map(|r| r.iops)
        .fold(None, |best: Option<f64>, v| Some(best.map_or(v, |b| b.max(v))));
    for row in rows {
        row.ratio_to_qemu = row.iops.zip(qemu_best).map(|(ours, theirs)| ours / theirs);
        if row.vmm != "host" {
            row.bare_metal_iops = bare_metal;
            row.ratio_to_bare_metal = row.iops.zip(bare_metal).map(|(ours, host)| ours / host);
        }
    }
}

/// The backing file both the VM and fio use.
struct BenchDisk {
    vm_backend: DiskBackend,
    /// The same disk as a `--disk` spec, for `exitless vhost-user-blk`.
    spec: String,
    fio_path: PathBuf,
    size: u64,
    describe: String,
    /// A RAM disk file this run made, removed at the end.
    made: Option<PathBuf>,
}

impl BenchDisk {
    fn prepare(spec: &DiskBackend) -> Result<BenchDisk, String> {
        let file_size = |path: &Path| {
            std::fs::metadata(path).map(|m| m.len()).map_err(|e| format!("{}: {e}", path.display()))
        };
        Ok(match spec {
            DiskBackend::Ram { size } => {
                let path = PathBuf::from(format!("/dev/shm/exitless-bench-{}.img", std::process::id()));
                progress(format_args!("filling a {} MiB RAM disk at {}", size >> 20, path.display()));
                fill(&path, *size)
                    .map_err(|e| format!("cannot make the RAM disk {}: {e}", path.display()))?;
                BenchDisk {
                    vm_backend: DiskBackend::RamFile { path: path.clone(), read_only: false },
                    spec: format!("ram,path={}", path.display()),
                    fio_path: path.clone(),
                    size: *size,
                    describe: format!("RAM disk, {} MiB file in /dev/shm (filled with data)", size >> 20),
                    made: Some(path),
                }
            }
            DiskBackend::RamFile { path, .. } => BenchDisk {
                vm_backend: spec.clone(),
                spec: format!("ram,path={}", path.display()),
                fio_path: path.clone(),
                size: file_size(path)?,
                describe: format!("RAM disk, {}", path.display()),
                made: None,
            },
            DiskBackend::File { path, direct, .. } => BenchDisk {
                vm_backend: spec.clone(),
                spec: format!("path={}{}", path.display(), if *direct { ",direct" } else { "" }),
                fio_path: path.clone(),
                size: file_size(path)?,
                describe: format!(
                    "file {} through io_uring{}",
                    path.display(),
                    if *direct { " with O_DIRECT" } else { "" }
                ),
                made: None,
            },
        })
    }

    fn fio_job(&self, scenario: Scenario, args: &BlkBenchArgs) -> FioJob {
        FioJob {
            path: self.fio_path.clone(),
            rw: scenario.rw,
            block_size: scenario.bs,
            queue_depth: scenario.qd,
            runtime: Duration::from_millis(args.duration_ms),
            cpu: args.vcpu_cpu,
            size: self.size / scenario.bs as u64 * scenario.bs as u64,
        }
    }
}

impl Drop for BenchDisk {
    fn drop(&mut self) {
        if let Some(path) = &self.made {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Write `size` bytes of non-zero data: reads of never-written tmpfs pages are cheaper than
/// reads of real data, which would flatter both sides.
fn fill(path: &Path, size: u64) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    let mut chunk = vec![0u8; 1 << 20];
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for byte in chunk.iter_mut() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        *byte = state as u8 | 1;
    }
    let mut left = size;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        file.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    file.sync_all()
}

fn host_row(scenario: Scenario, best: &FioResult, all: &[FioResult]) -> Row {
    let tried: Vec<String> =
        all.iter().map(|r| format!("{} qd {}: {:.0} IOPS", r.engine, r.queue_depth, r.iops)).collect();
    Row {
        device: "host file",
        iops: Some(best.iops),
        p50_us: Some(best.p50_us),
        p99_us: Some(best.p99_us),
        exits_per_io: Some(0.0),
        bare_metal_iops: Some(best.iops),
        ratio_to_bare_metal: Some(1.0),
        cpu_cores_used: Some(1.0),
        command: Some(best.command.clone()),
        note: Some(tried.join("; ")),
        ..Row::new("host", format!("bare metal (fio {})", best.engine), scenario)
    }
}

fn run_mode(
    mode: IoMode,
    scenario: Scenario,
    args: &BlkBenchArgs,
    tsc_khz: u32,
    disk: &DiskBackend,
) -> Result<Row, String> {
    let Scenario { rw, bs, qd } = scenario;
    let cmdline = format!(
        "probe.workload=blk probe.rw={rw} probe.bs={bs} probe.qd={qd} probe.duration_ms={} probe.warmup={} \
         probe.tsc_khz={tsc_khz}",
        args.duration_ms, args.warmup
    );
    let config = VmConfig {
        cmdline: probe::with_io_mode(&cmdline, mode),
        console: ConsoleMode::Capture,
        timeout: Some(Duration::from_millis(args.duration_ms) + RUN_SLACK),
        pin_vcpus: vec![args.vcpu_cpu],
        disks: vec![disk.clone()],
        io_mode: mode,
        iocore_cpu: Some(args.iocore_cpu),
        seccomp: args.seccomp.mode(),
        ..Default::default()
    };
    let mut row = Row::new("exitless", mode.name().to_string(), scenario);
    let run = match super::run_guest(&config, "blk") {
        Ok(run) => run,
        Err(super::GuestRunError::Vm(e @ VmError::PvEoiUnavailable(_))) => {
            row.note = Some(format!("not measured: {e}"));
            return Ok(row);
        }
        Err(e) => return Err(e.to_string()),
    };
    let line = run.line;
    let ops = line["ops"].as_u64().unwrap_or(0);
    row.ops = ops;
    row.iops = line["iops"].as_f64();
    row.p50_us = line["p50_ns"].as_f64().map(|ns| ns / 1000.0);
    row.p99_us = line["p99_ns"].as_f64().map(|ns| ns / 1000.0);
    row.exits_per_io = Some(run.counters.get("exits") as f64 / ops.max(1) as f64);
    row.exits_by_cause = causes_per(&run.counters, ops);
    row.cpu_cores_used = run.cores_used;
    row.note = pv_eoi_note(mode, &line);
    Ok(row)
}

/// Whether PV EOI, asked for, took any EOI exit away: the guest counts the interrupts KVM ended
/// through the PV EOI flag.
fn pv_eoi_note(mode: IoMode, line: &Value) -> Option<String> {
    if !mode.uses_pv_eoi() {
        return None;
    }
    let interrupts = line["interrupts"].as_u64().unwrap_or(0);
    let pv_eois = line["pv_eois"].as_u64().unwrap_or(0);
    (pv_eois < interrupts).then(|| {
        format!(
            "PV EOI enabled, but KVM ended only {pv_eois} of {interrupts} interrupts through it; the guest's \
             EOI write still exits for the rest (this host's KVM ends interrupts at delivery)"
        )
    })
}

impl Report {
    fn tables(&self, markdown: bool) -> String {
        let mut out = String::new();
        let mut scenarios: Vec<(&str, u32, u32)> = Vec::new();
        for row in &self.results {
            let key = (row.workload, row.block_size, row.queue_depth);
            if !scenarios.contains(&key) {
                scenarios.push(key);
            }
        }
        let header = vec![
            "vmm",
            "mode",
            "IOPS",
            "p50 µs",
            "p99 µs",
            "exits/IO",
            "exit causes per IO",
            "% of bare metal",
            "x QEMU",
            "cores",
        ];
        let number = |v: Option<f64>, digits: usize| v.map_or("n/a".into(), |v| format!("{v:.digits$}"));
        for (rw, bs, qd) in scenarios {
            let rows: Vec<&Row> = self
                .results
                .iter()
                .filter(|r| (r.workload, r.block_size, r.queue_depth) == (rw, bs, qd))
                .collect();
            let cells = rows
                .iter()
                .map(|r| {
                    vec![
                        r.vmm.to_string(),
                        r.mode.clone(),
                        number(r.iops, 0),
                        number(r.p50_us, 1),
                        number(r.p99_us, 1),
                        number(r.exits_per_io, 3),
                        format_causes(&r.exits_by_cause),
                        number(r.ratio_to_bare_metal.map(|x| x * 100.0), 1),
                        number(r.ratio_to_qemu, 2),
                        number(r.cpu_cores_used, 2),
                    ]
                })
                .collect();
            let mut context = self.about.context();
            context.push(("disk".to_string(), self.disk.clone()));
            if let Some(v) = &self.fio_version {
                context.push(("baseline".into(), format!("{v}, O_DIRECT, one job pinned to one core")));
            }
            if let Some(v) = &self.qemu_version {
                context
                    .push(("peer".into(), format!("{v}; exits from QMP query-stats at the probe's marks")));
            }
            if !markdown {
                context.retain(|(k, _)| k == "machine" || k == "disk");
            }
            let mut notes: Vec<String> =
                rows.iter().filter_map(|r| r.note.as_ref().map(|n| format!("{}: {n}", r.mode))).collect();
            if markdown {
                notes.extend(
                    rows.iter().filter_map(|r| r.command.as_ref().map(|c| format!("{}: `{c}`", r.mode))),
                );
            }
            let title =
                format!("blk: {rw} {bs} B, queue depth {qd}, exitless's I/O modes against bare metal");
            out += &Table { title, context, header: header.clone(), rows: cells, notes }.render(markdown);
        }
        out
    }
}
