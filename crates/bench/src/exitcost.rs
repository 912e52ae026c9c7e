//! `exitless bench exitcost`: what each kind of exit costs a ring-3 guest, timed by the probe
//! with the TSC, with exits counted by KVM between two marks the probe sets around the loop.

use std::time::Duration;

use exitless_args::fail;
use probe_image as probe;
use serde::Serialize;
use serde_json::Value;
use thiserror::Error;
use vmm::{ConsoleMode, Ending, Kernel, Vm, VmConfig, VmError};

use super::machine::About;
use super::table::Table;
use super::{marked_counters, progress};
use crate::args::{ExitcostArgs, Peer};
use crate::probe_dir::{ProbeDir, ProbeDirError};
use crate::qemu::{Qemu, QemuError};

/// The exit kinds, in report order: (probe op, what it is).
const OPS: [(&str, &str); 5] = [
    ("mmio", "MMIO write, exit to VMM user space"),
    ("ioeventfd", "MMIO write to an ioeventfd (in-kernel exit)"),
    ("cpuid", "cpuid instruction"),
    ("pingpong", "shared-memory round trip with a host thread"),
    ("irq", "round trip answered by an interrupt (irqfd, IOAPIC, ring-0 handler, EOI)"),
];
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

/// Why an exit kind was not measured.
#[derive(Debug, Error)]
enum ExitcostError {
    /// The VM could not be made or run.
    #[error(transparent)]
    Vm(#[from] VmError),
    /// The guest did not exit with status OK (`console`: what it printed).
    #[error("{ending}; console: {console}")]
    Ending { ending: Ending, console: String },
    /// The probe printed no result line for this kind.
    #[error("no result line for {0} in the console output")]
    NoResult(&'static str),
    /// The probe set no exit marks around its loop.
    #[error("the probe set no exit marks")]
    NoMarks,
    /// The directory of the probe for QEMU could not be made.
    #[error(transparent)]
    Dir(#[from] ProbeDirError),
    /// QEMU failed.
    #[error(transparent)]
    Qemu(#[from] QemuError),
    /// The probe exited under QEMU with a failure status (`stdout`: what it printed).
    #[error("the probe exited with status {status}: {stdout}")]
    QemuStatus { status: u8, stdout: String },
}

#[derive(Serialize)]
struct Row {
    vmm: &'static str,
    op: &'static str,
    n: u64,
    ns_per_op: Option<f64>,
    exits_per_op: Option<f64>,
    exits_by_cause: serde_json::Map<String, Value>,
    note: Option<String>,
}

pub fn main(args: ExitcostArgs) -> i32 {
    let tsc_khz = match vmm::tsc_khz() {
        Ok(k) => k,
        Err(e) => return fail(e),
    };
    let mut rows = Vec::new();
    for (op, _) in OPS {
        let n = if op == "pingpong" { args.pingpong_n } else { args.n };
        progress(format_args!("exitless: {op} x {n}"));
        match run_exitless(op, n, &args, tsc_khz) {
            Ok(row) => rows.push(row),
            Err(e) => return fail(format_args!("exitless {op}: {e}")),
        }
    }
    let mut qemu_version = None;
    let mut qemu_command = None;
    if args.peers.contains(&Peer::Qemu) {
        match Qemu::find() {
            None => return fail(
                "--peers qemu: qemu-system-x86_64 not found (install qemu-system-x86, or pass --peers none)",
            ),
            Some(qemu) => {
                progress(format_args!("QEMU-KVM: all kinds in one boot"));
                match run_qemu(&qemu, &args, tsc_khz) {
                    Ok((qemu_rows, command)) => {
                        rows.extend(qemu_rows);
                        qemu_command = Some(command);
                    }
                    Err(e) => return fail(format_args!("QEMU: {e}")),
                }
                qemu_version = Some(qemu.version);
            }
        }
    }
    let report = Report { about: About::now("exitcost"), tsc_khz, qemu_version, qemu_command, results: rows };
    super::print_report(&report, args.output, |markdown| report.table(markdown))
}

fn run_exitless(op: &'static str, n: u64, args: &ExitcostArgs, tsc_khz: u32) -> Result<Row, ExitcostError> {
    let cmdline = format!(
        "probe.workload=exitcost probe.ops={op} probe.n={} probe.pingpong_n={} probe.tsc_khz={tsc_khz}",
        args.n, args.pingpong_n
    );
    let config = VmConfig {
        cmdline,
        // The probe guest: its exit marks and ping-pong are the test device's.
        testdev: true,
        console: ConsoleMode::Capture,
        timeout: Some(RUN_TIMEOUT),
        seccomp: args.seccomp.mode(),
        ..Default::default()
    };
    let outcome = Vm::new(&config, Kernel::Image(probe::PROBE_ELF)).and_then(Vm::run)?;
    if outcome.ending != Ending::GuestExit(probe_abi::status::OK) {
        let console = String::from_utf8_lossy(&outcome.console).into_owned();
        return Err(ExitcostError::Ending { ending: outcome.ending, console });
    }
    let line =
        result_line(&String::from_utf8_lossy(&outcome.console), op).ok_or(ExitcostError::NoResult(op))?;
    let counters = marked_counters(&outcome, 0, 1).ok_or(ExitcostError::NoMarks)?;
    let per_op = |v: u64| v as f64 / n as f64;
    let causes = super::causes_per(&counters, n);
    Ok(Row {
        vmm: "exitless",
        op,
        n,
        ns_per_op: line["ns_per_op"].as_f64(),
        exits_per_op: Some(per_op(counters.get("exits"))),
        exits_by_cause: causes,
        note: None,
    })
}

fn result_line(console: &str, op: &str) -> Option<Value> {
    console
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["probe"] == "exitcost" && v["op"] == op)
}

fn run_qemu(qemu: &Qemu, args: &ExitcostArgs, tsc_khz: u32) -> Result<(Vec<Row>, String), ExitcostError> {
    let probe = ProbeDir::make("exitcost")?;
    let cmdline = format!(
        "probe.workload=exitcost probe.n={} probe.pingpong_n={} probe.tsc_khz={tsc_khz}",
        args.n, args.pingpong_n
    );
    let run = qemu.run_probe(probe.elf(), &cmdline, RUN_TIMEOUT);
    drop(probe);
    let run = run?;
    if run.guest_status != probe_abi::status::OK {
        return Err(ExitcostError::QemuStatus { status: run.guest_status, stdout: run.stdout });
    }
    let rows = OPS
        .iter()
        .map(|&(op, _)| {
            let line = result_line(&run.stdout, op);
            let skipped = line.as_ref().and_then(|l| l["skipped"].as_str()).map(str::to_string);
            Row {
                vmm: "qemu",
                op,
                n: line.as_ref().and_then(|l| l["n"].as_u64()).unwrap_or(0),
                ns_per_op: line.as_ref().and_then(|l| l["ns_per_op"].as_f64()),
                exits_per_op: None,
                exits_by_cause: serde_json::Map::new(),
                note: skipped.or_else(|| Some("exit counts need QMP query-stats (not yet)".into())),
            }
        })
        .collect();
    Ok((rows, run.command_line))
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    about: About,
    tsc_khz: u32,
    qemu_version: Option<String>,
    qemu_command: Option<String>,
    results: Vec<Row>,
}

impl Report {
    fn table(&self, markdown: bool) -> String {
        let has_qemu = self.qemu_version.is_some();
        let mut header = vec!["exit kind", "what", "exitless ns/op", "exits/op", "exit causes per op"];
        if has_qemu {
            header.push("QEMU-KVM ns/op");
        }
        let mut rows = Vec::new();
        for (op, what) in OPS {
            let ours = self.results.iter().find(|r| r.vmm == "exitless" && r.op == op);
            let theirs = self.results.iter().find(|r| r.vmm == "qemu" && r.op == op);
            let fmt_ns =
                |r: Option<&Row>| r.and_then(|r| r.ns_per_op).map_or("n/a".into(), |v| format!("{v:.1}"));
            let mut row = vec![
                op.to_string(),
                what.to_string(),
                fmt_ns(ours),
                ours.and_then(|r| r.exits_per_op).map_or("n/a".into(), |v| format!("{v:.2}")),
                ours.map_or("-".into(), |r| super::format_causes(&r.exits_by_cause)),
            ];
            if has_qemu {
                row.push(fmt_ns(theirs));
            }
            rows.push(row);
        }
        let title = format!(
            "exitcost: one exit of each kind from the probe guest in ring 3 (n={}, ping-pong n={})",
            self.results.iter().find(|r| r.op == "mmio").map_or(0, |r| r.n),
            self.results.iter().find(|r| r.op == "pingpong").map_or(0, |r| r.n),
        );
        let mut context = self.about.context();
        if let Some(v) = &self.qemu_version {
            context.push(("peer".into(), v.clone()));
        }
        if let Some(c) = &self.qemu_command {
            context.push(("QEMU command".into(), format!("`{c}`")));
        }
        if !markdown {
            context.retain(|(k, _)| k == "machine" || k == "peer");
        }
        Table { title, context, header, rows, notes: Vec::new() }.render(markdown)
    }
}
