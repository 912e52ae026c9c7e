//! `exitless bench upgrade`: how long a guest's I/O stops while its vhost-user-blk daemon is
//! replaced under it: the exitless VMM and QEMU-KVM as frontends, the old daemon stopped by
//! SIGTERM (a graceful upgrade) or killed (kill -9), a new one started on the same socket; or
//! the new one taking the disk and the frontend's connection over (`--handover-socket`). One
//! probe verify run per round with one restart in it; min/median/max over the rounds.

mod round;
mod table;

use std::time::Duration;

use serde::Serialize;

use crate::args::{UpgradeBenchArgs, UpgradeFrontend as Frontend, UpgradeStop as Stop};
use crate::machine::About;
use crate::probe_dir::{ProbeDir, ProbeDirError};
use crate::qemu::Qemu;
use round::{Context, Round};

/// The disk's size: the verify run's `--blocks` (at most 16384) of 4 KiB fit in it.
const DISK_SIZE: u64 = 64 << 20;

/// One row of the report: a frontend and a way of stopping the daemon, over the rounds.
#[derive(Serialize)]
pub struct Row {
    pub frontend: &'static str,
    pub stop: &'static str,
    /// Rounds measured (each one restart).
    pub rounds: u32,
    /// The guest's I/O pause in each round: its longest request (the probe's `max_ns`), in ms.
    pub pause_ms: Vec<f64>,
    pub pause_min_ms: Option<f64>,
    pub pause_median_ms: Option<f64>,
    pub pause_max_ms: Option<f64>,
    /// The guest's median request over the rounds' runs, in ms (what a request takes without a
    /// restart: the rate limit's spacing).
    pub p50_median_ms: Option<f64>,
    /// The frontend's own "reconnected to a daemon after N ms" per round (exitless only).
    pub reconnected_ms: Vec<u64>,
    /// Reconnections over the rounds: the exitless frontend's own count; for QEMU, the
    /// connections the daemons logged less the first of each round.
    pub reconnections: Option<u64>,
    /// From SIGTERM to the old daemon's exit, per round (SIGTERM rows only), in ms.
    pub sigterm_to_exit_ms: Vec<f64>,
    /// From the successor's start to the old daemon's exit, per round (hand-over rows only), in
    /// ms.
    pub handover_to_exit_ms: Vec<f64>,
    /// Requests the new daemons resubmitted from the in-flight region, over the rounds.
    pub resubmitted: u64,
    /// The guest's I/O errors and verify mismatches over the rounds (0 when it passed).
    pub errors: u64,
    pub mismatches: u64,
    pub note: Option<String>,
}

impl Row {
    fn new(frontend: Frontend, stop: Stop) -> Row {
        Row {
            frontend: frontend_name(frontend),
            stop: stop_name(stop),
            rounds: 0,
            pause_ms: Vec::new(),
            pause_min_ms: None,
            pause_median_ms: None,
            pause_max_ms: None,
            p50_median_ms: None,
            reconnected_ms: Vec::new(),
            reconnections: None,
            sigterm_to_exit_ms: Vec::new(),
            handover_to_exit_ms: Vec::new(),
            resubmitted: 0,
            errors: 0,
            mismatches: 0,
            note: None,
        }
    }

    /// Adds one round's figures.
    fn add(&mut self, round: &Round, p50s: &mut Vec<f64>) {
        self.rounds += 1;
        self.pause_ms.push(round.pause_ms);
        p50s.push(round.p50_ms);
        self.reconnected_ms.extend(round.reconnected_ms);
        if let Some(n) = round.reconnections {
            self.reconnections = Some(self.reconnections.unwrap_or(0) + n);
        }
        self.sigterm_to_exit_ms.extend(round.sigterm_to_exit.map(|d| d.as_secs_f64() * 1e3));
        self.handover_to_exit_ms.extend(round.handover_to_exit.map(|d| d.as_secs_f64() * 1e3));
        self.resubmitted += round.resubmitted;
        self.errors += round.errors;
        self.mismatches += round.mismatches;
    }

    /// Fills in the summaries from the rounds.
    fn summarize(&mut self, p50s: &[f64]) {
        self.pause_min_ms = self.pause_ms.iter().copied().reduce(f64::min);
        self.pause_max_ms = self.pause_ms.iter().copied().reduce(f64::max);
        self.pause_median_ms = median(&self.pause_ms);
        self.p50_median_ms = median(p50s);
    }
}

/// The median (the mean of the middle two for an even count); `None` for none.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

fn frontend_name(frontend: Frontend) -> &'static str {
    match frontend {
        Frontend::Exitless => "exitless",
        Frontend::Qemu => "qemu",
    }
}

fn stop_name(stop: Stop) -> &'static str {
    match stop {
        Stop::None => "none",
        Stop::Sigterm => "sigterm",
        Stop::Kill => "kill -9",
        Stop::Handover => "handover",
    }
}

/// How each frontend reconnects, for the report.
fn describe(frontend: Frontend) -> &'static str {
    match frontend {
        Frontend::Exitless => {
            "`exitless run --probe --io-mode eventfd --disk vhost-user=SOCKET,reconnect=10`: the disk's \
             watcher retries the socket every 10 ms for up to 10 s, then replays the set-up"
        }
        Frontend::Qemu => {
            "QEMU-KVM microvm, `-chardev socket,...,reconnect=1` and `-device vhost-user-blk,queue-size=256`: \
             QEMU tries the socket again a second after the hang-up (7.2 counts in whole seconds), then replays \
             the set-up"
        }
    }
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    about: About,
    /// What the daemons serve, and how.
    backend: String,
    /// The guest's workload.
    workload: String,
    rounds: u32,
    restart_after_ms: u64,
    frontends: Vec<(&'static str, &'static str)>,
    qemu_version: Option<String>,
    results: Vec<Row>,
}

/// `exitless bench upgrade`: the process's exit status.
pub fn main(args: UpgradeBenchArgs) -> i32 {
    match run(&args) {
        Ok(report) => crate::print_report(&report, args.output, |markdown| table::render(&report, markdown)),
        Err(Error::Scratch(e)) => exitless_args::usage_error(e),
        Err(e) => exitless_args::fail(e),
    }
}

/// Why the bench could not start.
#[derive(Debug, thiserror::Error)]
enum Error {
    /// A bad `--scratch`.
    #[error("{0}")]
    Scratch(#[from] crate::scratch::ScratchError),
    /// The run's directory, with the probe for the VMs, could not be made.
    #[error(transparent)]
    Dir(#[from] ProbeDirError),
    /// The path of this executable, which the VMs and the daemons run, is unknown.
    #[error("cannot find this program: {0}")]
    CurrentExe(#[source] std::io::Error),
    /// The TSC's rate could not be read from KVM.
    #[error(transparent)]
    TscKhz(vmm::VmError),
}

fn run(args: &UpgradeBenchArgs) -> Result<Report, Error> {
    let scratch = args.scratch.clone().unwrap_or_else(std::env::temp_dir);
    let disk = crate::scratch::prepare_as(&scratch, "exitless-bench-upgrade", DISK_SIZE, |path| {
        crate::progress(format_args!("writing {} (once: later runs reuse it)", path.display()))
    })?;
    let probe = ProbeDir::make("upgrade")?;
    let ctx = Context {
        exe: std::env::current_exe().map_err(Error::CurrentExe)?,
        dir: probe.path().to_owned(),
        disk: disk.clone(),
        elf: probe.elf().to_owned(),
        tsc_khz: vmm::tsc_khz().map_err(Error::TscKhz)?,
        qemu: args.frontends.contains(&Frontend::Qemu).then(Qemu::find).flatten(),
        blocks: args.blocks,
        qd: args.qd,
        iops: args.iops,
        io_mode: args.daemon_io_mode.name(),
        restart_after: Duration::from_millis(args.restart_after_ms),
        seccomp: args.seccomp,
    };
    let mut results = Vec::new();
    for &frontend in &args.frontends {
        for &stop in &args.stops {
            results.push(measure(frontend, stop, args.rounds, &ctx));
        }
    }
    flag_noise(&mut results);
    Ok(Report {
        about: About::now("upgrade"),
        backend: format!(
            "{}: `exitless vhost-user-blk --disk socket=SOCKET,path={},direct,iops={} --io-mode {}`, a {} \
             MiB file (filled with data, kept for later runs) through io_uring, capped at {} requests/s",
            crate::backend::Backend::of_file(&disk, true).name(),
            disk.display(),
            args.iops,
            args.daemon_io_mode.name(),
            DISK_SIZE >> 20,
            args.iops
        ),
        workload: format!(
            "probe.rw=verify: {} blocks of 4 KiB written at queue depth {}, flushed, read back and compared",
            args.blocks, args.qd
        ),
        rounds: args.rounds,
        restart_after_ms: args.restart_after_ms,
        frontends: args.frontends.iter().map(|&f| (frontend_name(f), describe(f))).collect(),
        qemu_version: ctx.qemu.as_ref().map(|q| q.version.clone()),
        results,
    })
}

/// Notes the restart rows whose median pause is under twice their frontend's control (the same
/// run with no restart): the host's own hiccups, not the restart, set those figures.
fn flag_noise(rows: &mut [Row]) {
    let controls: Vec<(&'static str, f64)> = rows
        .iter()
        .filter(|r| r.stop == stop_name(Stop::None))
        .filter_map(|r| Some((r.frontend, r.pause_median_ms?)))
        .collect();
    for row in rows.iter_mut().filter(|r| r.stop != stop_name(Stop::None)) {
        let control = controls.iter().find(|(frontend, _)| *frontend == row.frontend).map(|&(_, ms)| ms);
        let (Some(control), Some(pause)) = (control, row.pause_median_ms) else { continue };
        if control * 2.0 > pause {
            let noisy = format!(
                "noisy: with no restart the longest request was already {control:.1} ms (median), so the host's \
                 own stalls, not the restart, set this row"
            );
            row.note = Some(row.note.take().map_or(noisy.clone(), |note| format!("{note}; {noisy}")));
        }
    }
}

/// `rounds` rounds of `frontend` with the daemon ended by `stop`; a round that fails is run once
/// more (a loaded host), and the row ends, with a note, at one that fails twice.
fn measure(frontend: Frontend, stop: Stop, rounds: u32, ctx: &Context) -> Row {
    let mut row = Row::new(frontend, stop);
    let mut p50s = Vec::new();
    let mut notes = Vec::new();
    if frontend == Frontend::Qemu && ctx.qemu.is_none() {
        row.note = Some("not measured: qemu-system-x86_64 not found (install qemu-system-x86)".into());
        return row;
    }
    for index in 0..rounds {
        let what = format!("{} frontend, daemon ended by {}", row.frontend, row.stop);
        crate::progress(format_args!("{what}: round {} of {rounds}", index + 1));
        let name = |attempt: u32| usize::try_from(index * 2 + attempt).unwrap_or(usize::MAX);
        let measured = round::run(frontend, stop, name(0), ctx).or_else(|first| {
            crate::progress(format_args!("that round failed ({first}); running it again"));
            notes.push(format!(
                "round {} was run twice; the first failed: {}",
                index + 1,
                crate::one_line(&first.to_string())
            ));
            round::run(frontend, stop, name(1), ctx).map_err(|second| Box::new((first, second)))
        });
        match measured {
            Ok(round) => row.add(&round, &mut p50s),
            Err(both) => {
                let (first, second) = *both;
                notes.pop();
                notes.push(format!(
                    "round {} failed twice: {}; then: {}",
                    index + 1,
                    crate::one_line(&first.to_string()),
                    crate::one_line(&second.to_string())
                ));
                break;
            }
        }
    }
    row.summarize(&p50s);
    row.note = (!notes.is_empty()).then(|| notes.join("; "));
    row
}

#[cfg(test)]
mod tests {
    #[test]
    fn medians() {
        assert_eq!(super::median(&[]), None);
        assert_eq!(super::median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(super::median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }

    #[test]
    fn a_pause_no_longer_than_the_controls_is_flagged_as_noise() {
        use super::{Frontend, Row, Stop};
        let row = |frontend, stop, median| {
            let mut row = Row::new(frontend, stop);
            row.pause_median_ms = Some(median);
            row
        };
        let mut rows = [
            row(Frontend::Exitless, Stop::None, 20.0),
            row(Frontend::Exitless, Stop::Sigterm, 35.0),
            row(Frontend::Exitless, Stop::Kill, 45.0),
            row(Frontend::Qemu, Stop::Kill, 1000.0),
        ];
        super::flag_noise(&mut rows);
        assert!(rows[1].note.as_deref().is_some_and(|n| n.starts_with("noisy")), "35 < 2 x 20");
        assert_eq!(rows[2].note, None, "45 > 2 x 20");
        assert_eq!(rows[0].note, None, "the control itself");
        assert_eq!(rows[3].note, None, "no QEMU control");
    }
}
