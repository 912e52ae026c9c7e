//! `exitless bench`: the benchmark harness behind the `exitless` binary's `bench` subcommand.
//! Its scenarios (the block ladder, the backend matrix, the network ladder, exit costs, many
//! VMs at once, the pause of a daemon replaced under a guest, live migration), the bare-metal fio
//! baselines, the QEMU and qemu-storage-daemon peers it drives, the machine they ran on, and the
//! report formats (tables, Markdown, JSON, SVG plots).
//!
//! It runs guests in-process through `vmm` and starts other `exitless` processes (the
//! vhost-user-blk daemon, `run`, `udp-echo`, `udp-rr`) from the running executable, so it is
//! meant to be called from the `exitless` binary: [`main`] takes the parsed [`BenchArgs`].

#![deny(missing_docs)]

pub mod args;
mod backend;
mod baseline;
mod blk;
mod blk_qemu;
mod blk_table;
mod cache_line;
mod ceph;
mod daemon;
mod exitcost;
pub mod hosts;
mod loop_device;
mod machine;
mod migrate;
mod net;
mod plot;
mod probe_dir;
mod progress;
mod qemu;
mod rounds;
mod scale;
mod scratch;
mod table;
pub mod udp;
mod upgrade;

use serde_json::{Map, Value};
use thiserror::Error;
use vmm::{Counters, Ending, Kernel, RunOutcome, Vm, VmConfig, VmError};

pub use args::BenchArgs;
use args::BenchScenario;
pub use qemu::process_cpu_time;

/// Run `exitless bench` as `args` asks; the process's exit status.
pub fn main(args: BenchArgs) -> i32 {
    match args.scenario {
        Some(BenchScenario::Exitcost(args)) => exitcost::main(args),
        Some(BenchScenario::Net(args)) => net::main(args),
        Some(BenchScenario::Scale(args)) => scale::main(args),
        Some(BenchScenario::Upgrade(args)) => upgrade::main(args),
        Some(BenchScenario::Migrate(args)) => migrate::main(args),
        None => blk::main(args.blk),
    }
}

/// The probe's command line for `probe.rw=verify`: `blocks` 4 KiB blocks written with the
/// pattern of `seed`, `qd` requests at a time, then read back and compared. Add more
/// `probe.*` parameters after it.
pub fn verify_cmdline(blocks: u64, qd: u32, seed: u64) -> String {
    format!("probe.workload=blk probe.rw=verify probe.ops={blocks} probe.qd={qd} probe.seed={seed}")
}

/// The probe's result line for workload `probe` (its `"probe"` field) among the JSON lines of a
/// run's standard output or console, if it printed one.
pub fn probe_result(text: &str, probe: &str) -> Option<Value> {
    text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).find(|l| l["probe"] == probe)
}

/// The probe's `blk` result line among the JSON lines of a run's standard output, if it printed
/// one.
pub fn blk_result(stdout: &str) -> Option<Value> {
    probe_result(stdout, "blk")
}

/// Counters that say what caused the exits, shown per operation.
pub(crate) const CAUSES: [&str; 6] =
    ["mmio_exits", "io_exits", "halt_exits", "irq_exits", "insn_emulation", "irq_injections"];

/// vCPU 0's exits between the probe's marks `from` and `to`, less the closing mark's own MMIO
/// exit (the opening mark's snapshot is taken after its exit was counted).
pub(crate) fn marked_counters(outcome: &RunOutcome, from: u32, to: u32) -> Option<Counters> {
    let marks = &outcome.vcpus.first()?.marks;
    let start = marks.iter().find(|m| m.label == from)?;
    let end = marks.iter().find(|m| m.label == to)?;
    let mut counters = end.snapshot.since(&start.snapshot);
    for (name, value) in counters.0.iter_mut() {
        if name == "exits" || name == "mmio_exits" {
            *value = value.saturating_sub(1);
        }
    }
    Some(counters)
}

/// The exit causes per operation, leaving out those under 0.005 (background noise: timer
/// interrupts and the like).
pub(crate) fn causes_per(counters: &Counters, ops: u64) -> Map<String, Value> {
    let mut causes = Map::new();
    for cause in CAUSES {
        let value = counters.get(cause) as f64 / ops.max(1) as f64;
        if value >= 0.005 {
            causes.insert(cause.to_string(), value.into());
        }
    }
    causes
}

/// `name 0.12, other 1.00`, or `-` for none.
pub(crate) fn format_causes(causes: &Map<String, Value>) -> String {
    if causes.is_empty() {
        return "-".into();
    }
    causes.iter().map(|(k, v)| format!("{k} {:.2}", v.as_f64().unwrap_or(0.0))).collect::<Vec<_>>().join(", ")
}

/// The command as typed, for reports.
pub(crate) fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("exitless {}", crate::qemu::shell_words(&args))
}

/// Print `report` as JSON, or as the tables `tables` renders (Markdown or plain); returns the
/// process status.
pub(crate) fn print_report(
    report: &impl serde::Serialize,
    format: crate::args::ReportFormat,
    tables: impl Fn(bool) -> String,
) -> i32 {
    if format.json {
        match serde_json::to_string_pretty(report) {
            Ok(json) => println!("{json}"),
            Err(e) => return exitless_args::fail(format_args!("cannot write the report as JSON: {e}")),
        }
    } else {
        print!("{}", tables(format.markdown));
    }
    0
}

/// A new seed for the probe's random offsets, one per run: with the same seed every run read the
/// same blocks, which a real disk's lower layers (here the cloud host's page cache under the VM's
/// disk) had cached from the run before, while fio's offsets were new each time; guests then
/// "beat" bare metal on a real disk (docs/tuning.md).
pub(crate) fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos(),
    );
    hasher.finish() | 1
}

/// An error message on one line of at most 300 characters (`...` where it was cut), for a row's
/// note.
pub(crate) fn one_line(error: &str) -> String {
    let line = error.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(300) {
        Some((at, _)) => format!("{}...", &line[..at]),
        None => line,
    }
}

/// Progress for long runs, on standard error.
pub(crate) fn progress(message: std::fmt::Arguments) {
    eprintln!("exitless bench: {message}");
}

#[derive(Debug, Error)]
pub(crate) enum GuestRunError {
    #[error("{0}")]
    Vm(#[from] VmError),
    #[error("{ending}; the probe printed no `{probe}` result: {console}")]
    NoResult { ending: Ending, probe: &'static str, console: String },
    #[error("{ending}; result: {line}")]
    Failed { ending: Ending, line: Value },
    #[error("the probe set no exit marks around its measured phase")]
    NoMarks,
}

/// What one probe run measured between its marks 0 and 1.
pub(crate) struct GuestRun {
    /// The probe's JSON result line.
    pub line: Value,
    pub counters: Counters,
    pub cores_used: Option<f64>,
}

/// Boot the probe with `config` (console captured), and take its `probe` result line and the
/// exits and CPU time of its measured phase.
pub(crate) fn run_guest(config: &VmConfig, probe: &'static str) -> Result<GuestRun, GuestRunError> {
    let outcome = Vm::new(config, Kernel::Image(probe_image::PROBE_ELF)).and_then(Vm::run)?;
    let console = String::from_utf8_lossy(&outcome.console);
    let Some(line) = probe_result(&console, probe) else {
        return Err(GuestRunError::NoResult { ending: outcome.ending, probe, console: console.into_owned() });
    };
    if outcome.ending != Ending::GuestExit(probe_abi::status::OK) {
        return Err(GuestRunError::Failed { ending: outcome.ending, line });
    }
    let counters = marked_counters(&outcome, 0, 1).ok_or(GuestRunError::NoMarks)?;
    Ok(GuestRun { line, counters, cores_used: cores_used(&outcome, 0, 1) })
}

/// (vCPU + IOCore CPU time) / wall time between two marks.
fn cores_used(outcome: &RunOutcome, from: u32, to: u32) -> Option<f64> {
    let marks = &outcome.vcpus.first()?.marks;
    let start = marks.iter().find(|m| m.label == from)?;
    let end = marks.iter().find(|m| m.label == to)?;
    let wall = end.at.duration_since(start.at).as_secs_f64();
    let vcpu = end.vcpu_cpu.saturating_sub(start.vcpu_cpu).as_secs_f64();
    let iocore = match (start.iocore_cpu, end.iocore_cpu) {
        (Some(a), Some(b)) => b.saturating_sub(a).as_secs_f64(),
        _ => 0.0,
    };
    (wall > 0.0).then(|| (vcpu + iocore) / wall)
}
