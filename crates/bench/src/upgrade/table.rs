//! `bench upgrade`'s table: the guest's I/O pause per frontend and way of stopping the daemon.

use super::{median, Report, Row};
use crate::table::Table;

pub(super) fn render(report: &Report, markdown: bool) -> String {
    let mut context = report.about.context();
    context.push(("backend".into(), report.backend.clone()));
    context.push(("workload".into(), report.workload.clone()));
    context.push((
        "restart at".into(),
        format!(
            "{} ms after the guest's first write reached the file, once per round; {} round(s) per row, \
             one VM and one verify run per round",
            report.restart_after_ms, report.rounds
        ),
    ));
    for (name, what) in &report.frontends {
        context.push((name.to_string(), what.to_string()));
    }
    if let Some(v) = &report.qemu_version {
        context.push(("QEMU".into(), v.clone()));
    }
    Table {
        title: "bench upgrade: the guest's I/O pause while its vhost-user-blk daemon is replaced".into(),
        context,
        header: vec![
            "frontend",
            "restart",
            "rounds",
            "pause min ms",
            "pause median ms",
            "pause max ms",
            "reconnected after ms",
            "reconnections",
            "to exit ms",
            "request p50 ms",
            "resubmitted",
            "errors",
            "mismatches",
            "note",
        ],
        rows: report.results.iter().map(cells).collect(),
        notes: NOTES.iter().map(|n| n.to_string()).collect(),
    }
    .render(markdown)
}

fn cells(row: &Row) -> Vec<String> {
    let reconnected: Vec<f64> = row
        .reconnected_ms
        .iter()
        .map(|&ms| std::time::Duration::from_millis(ms).as_secs_f64() * 1e3)
        .collect();
    vec![
        row.frontend.to_string(),
        row.stop.to_string(),
        row.rounds.to_string(),
        fixed(row.pause_min_ms),
        fixed(row.pause_median_ms),
        fixed(row.pause_max_ms),
        spread(&reconnected),
        row.reconnections.map_or("-".into(), |n| n.to_string()),
        spread(if row.handover_to_exit_ms.is_empty() {
            &row.sigterm_to_exit_ms
        } else {
            &row.handover_to_exit_ms
        }),
        fixed(row.p50_median_ms),
        if row.rounds > 0 { row.resubmitted.to_string() } else { "-".into() },
        if row.rounds > 0 { row.errors.to_string() } else { "-".into() },
        if row.rounds > 0 { row.mismatches.to_string() } else { "-".into() },
        row.note.clone().unwrap_or_default(),
    ]
}

/// `12.3`, or `-` for none.
fn fixed(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| format!("{v:.1}"))
}

/// The median with the range, `47 (41-63)`, or `-` for no values.
fn spread(values: &[f64]) -> String {
    let (Some(mid), Some(min), Some(max)) =
        (median(values), values.iter().copied().reduce(f64::min), values.iter().copied().reduce(f64::max))
    else {
        return "-".into();
    };
    format!("{mid:.1} ({min:.1}-{max:.1})")
}

const NOTES: [&str; 9] = [
    "restart: how the old daemon was ended before a new one was started on the same socket (sigterm: a \
     graceful upgrade; kill -9: a crash); handover: the new daemon, started with the old one's \
     --handover-socket, took the disk's socket, the frontend's connection and its session over, and the old \
     one exited, the frontend not reconnecting; none: no restart, the same run on one daemon, the control: its \
     longest request is what the host's own hiccups give, the floor under the others' pause",
    "pause: the guest's longest request in the round's verify run (the probe's max_ns), the one that \
     waited through the restart; min/median/max over the rounds. It is the old daemon's exit (SIGTERM: it \
     finishes the requests it holds; kill -9: none), the new daemon's start (its process, the disk file \
     opened, the socket bound), the frontend's connect retry (exitless: every 10 ms from the hang-up; QEMU: \
     a timer of reconnect=1 s started at the hang-up, 7.2 counting in whole seconds, so its pause is that \
     second however soon the new daemon listens), and the set-up replayed on the new connection (features, memory table, in-flight region, rings)",
    "reconnected after: the exitless frontend's own figure (`reconnected to a daemon after N ms`), from \
     the hang-up it saw to the new daemon serving the ring, median (min-max); QEMU logs none",
    "to exit: the old daemon's time from SIGTERM to its exit status, as the harness saw it (the new daemon is \
     started after it: both want the socket); for handover, from the new daemon's start (its process, disk \
     file and IOCore) to the old one's exit, the hand-over itself being the end of that",
    "handover pause: the old daemon stops taking requests and drains its ring only once the new one, \
     started, asks; then the ring, its eventfds, the memory table and the in-flight region are passed \
     over the hand-over socket and replayed, and the new daemon serves the ring without a reconnection",
    "reconnections: the exitless frontend's own count; for QEMU the connections the daemons logged (\
     \"frontend connected\"), less the first of each round",
    "resubmitted: requests the new daemons took again from the in-flight region (kill -9 leaves the ones \
     the old daemon held; SIGTERM none)",
    "request p50: the median request of the runs, for scale: the daemon's rate limit spaces requests so \
     that a verify run lasts seconds on any host (each new daemon starts with a second's worth)",
    "errors, mismatches: the guest's I/O errors and verify mismatches over the rounds: every block written \
     reads back as written across the restart, or the round fails",
];
