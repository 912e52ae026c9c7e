//! `exitless bench`: scenarios, the machine they ran on, and report formats.

mod baseline;
mod blk;
mod exitcost;
mod machine;
mod table;

use serde_json::{Map, Value};
use vmm::{Counters, RunOutcome};

use crate::cli::{BenchArgs, BenchScenario};

pub fn main(args: BenchArgs) -> i32 {
    match args.scenario {
        Some(BenchScenario::Exitcost(args)) => exitcost::main(args),
        None => blk::main(args.blk),
    }
}

/// Counters that say what caused the exits, shown per operation.
pub const CAUSES: [&str; 6] =
    ["mmio_exits", "io_exits", "halt_exits", "irq_exits", "insn_emulation", "irq_injections"];

/// vCPU 0's exits between the probe's marks `from` and `to`, less the closing mark's own MMIO
/// exit (the opening mark's snapshot is taken after its exit was counted).
pub fn marked_counters(outcome: &RunOutcome, from: u32, to: u32) -> Option<Counters> {
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
pub fn causes_per(counters: &Counters, ops: u64) -> Map<String, Value> {
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
pub fn format_causes(causes: &Map<String, Value>) -> String {
    if causes.is_empty() {
        return "-".into();
    }
    causes.iter().map(|(k, v)| format!("{k} {:.2}", v.as_f64().unwrap_or(0.0))).collect::<Vec<_>>().join(", ")
}

/// The command as typed, for reports.
pub fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("exitless {}", crate::qemu::shell_words(&args))
}

/// Progress for long runs, on standard error.
pub fn progress(message: std::fmt::Arguments) {
    eprintln!("exitless bench: {message}");
}
