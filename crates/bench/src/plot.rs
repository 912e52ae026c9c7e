//! Plots for the bench reports (`--plot DIR`): one SVG per scenario, three panels stacked: the
//! rate per row (IOPS or transactions/s) with bare metal and the best peer marked, exits per
//! operation stacked by cause, and p50/p99 latency. Drawn with plotters' SVG backend, whose text
//! needs no font files (labels are `<text>` elements the viewer renders).

use std::path::{Path, PathBuf};

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::{Map, Value};
use thiserror::Error;

use super::blk::Row;
use super::CAUSES;

/// Bars: bare metal, exitless, the best peer, other peers, other host rows.
const BARE_METAL: RGBColor = RGBColor(0x2c, 0xa0, 0x2c);
const EXITLESS: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
const BEST_PEER: RGBColor = RGBColor(0xd6, 0x27, 0x28);
const PEER: RGBColor = RGBColor(0xa0, 0xa0, 0xa0);
const HOST: RGBColor = RGBColor(0x98, 0xdf, 0x8a);
const MISSING: RGBColor = RGBColor(0x80, 0x80, 0x80);
/// Exit causes, in `CAUSES` order, then for any other cause.
const CAUSE_COLOURS: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
];
const P50: RGBColor = RGBColor(0x6b, 0xae, 0xd6);
const P99: RGBColor = RGBColor(0x08, 0x45, 0x94);

const WIDTH: u32 = 1200;
const LEGEND_WIDTH: u32 = 210;
const FONT: &str = "sans-serif";

/// The scenario a row belongs to: one plot each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScenarioKey {
    /// `randread`, `randwrite`, `read`, `write`.
    pub workload: String,
    /// Bytes.
    pub block_size: u32,
    pub queue_depth: u32,
    /// Which disk, when a report measures more than one.
    pub disk: Option<String>,
}

/// The one place that says which rows share a plot; `several_disks`: the report measured more
/// than one disk, so the disk is part of the scenario.
fn scenario_key(row: &Row, several_disks: bool) -> ScenarioKey {
    ScenarioKey {
        workload: row.workload.to_string(),
        block_size: row.block_size,
        queue_depth: row.queue_depth,
        disk: several_disks.then(|| row.disk.to_string()),
    }
}

impl ScenarioKey {
    /// `randread-4k-qd32.svg`, or `<disk>-randread-4k-qd32.svg` with a disk.
    pub fn file_name(&self) -> String {
        let mut name = String::new();
        if let Some(disk) = &self.disk {
            name += &slug(disk);
            name += "-";
        }
        let bs = match self.block_size % 1024 {
            0 => format!("{}k", self.block_size / 1024),
            _ => self.block_size.to_string(),
        };
        name += &format!("{}-{bs}-qd{}.svg", slug(&self.workload), self.queue_depth);
        name
    }

    /// `blk: randread 4096 B, queue depth 32`, with the disk in front when there is one.
    pub fn title(&self) -> String {
        let disk = self.disk.as_ref().map(|d| format!("{d}, ")).unwrap_or_default();
        format!("blk: {disk}{} {} B, queue depth {}", self.workload, self.block_size, self.queue_depth)
    }
}

/// Lower-case letters and digits, anything else one `-`.
fn slug(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_end_matches('-').to_string()
}

/// Rows grouped by scenario, in the order scenarios first appear.
fn group(rows: &[Row]) -> Vec<(ScenarioKey, Vec<&Row>)> {
    let mut groups: Vec<(ScenarioKey, Vec<&Row>)> = Vec::new();
    let several_disks = rows.iter().any(|r| r.disk != rows[0].disk);
    for row in rows {
        let key = scenario_key(row, several_disks);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push(row),
            None => groups.push((key, vec![row])),
        }
    }
    groups
}

/// Why a plot could not be written.
#[derive(Debug, Error)]
pub enum PlotError {
    /// The `--plot` directory could not be made.
    #[error("--plot: cannot create the directory {}: {source}", .dir.display())]
    CreateDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// plotters could not draw the plot.
    #[error("cannot draw the plot {}: {source}", .path.display())]
    Draw {
        path: PathBuf,
        #[source]
        source: DrawingAreaErrorKind<std::io::Error>,
    },
    /// The SVG file could not be written.
    #[error("--plot: cannot write {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Make `dir` (and its parents) if missing: called before a long run so that a bad path fails
/// at once.
pub fn prepare(dir: &Path) -> Result<(), PlotError> {
    std::fs::create_dir_all(dir).map_err(|source| PlotError::CreateDir { dir: dir.to_owned(), source })
}

/// Write one SVG per scenario of the block bench's `rows` into `dir`; returns the files.
pub fn write_all(dir: &Path, rows: &[Row]) -> Result<Vec<PathBuf>, PlotError> {
    prepare(dir)?;
    let mut written = Vec::new();
    for (key, rows) in group(rows) {
        let path = dir.join(key.file_name());
        write(&path, &key.title(), &blk_bars(&rows), &Units::BLK)?;
        written.push(path);
    }
    Ok(written)
}

/// Render `bars` and write them to `path`.
pub fn write(path: &Path, title: &str, bars: &[Bar], units: &Units) -> Result<(), PlotError> {
    let svg =
        render(title, bars, units).map_err(|source| PlotError::Draw { path: path.to_owned(), source })?;
    std::fs::write(path, svg).map_err(|source| PlotError::Write { path: path.to_owned(), source })
}

/// How a kind of report names its rate and its operation.
pub struct Units {
    /// The rate axis: `IOPS`.
    pub rate: &'static str,
    /// One operation: `I/O`.
    pub op: &'static str,
}

impl Units {
    /// The block bench's.
    pub const BLK: Units = Units { rate: "IOPS", op: "I/O" };
    /// The network bench's.
    pub const NET: Units = Units { rate: "transactions/s", op: "transaction" };
}

/// What a bar stands for, which sets its colour and its mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The bare-metal baseline the ratios are against.
    BareMetal,
    /// Another host measurement.
    Host,
    /// exitless serves the I/O (its own VMM, or its backend behind another).
    Exitless,
    /// The fastest peer configuration.
    BestPeer,
    /// Another peer configuration.
    Peer,
}

impl Kind {
    fn colour(self) -> RGBColor {
        match self {
            Kind::BareMetal => BARE_METAL,
            Kind::Host => HOST,
            Kind::Exitless => EXITLESS,
            Kind::BestPeer => BEST_PEER,
            Kind::Peer => PEER,
        }
    }

    /// The mark written after the bar's value, and the legend's name.
    fn name(self) -> &'static str {
        match self {
            Kind::BareMetal => "bare metal",
            Kind::Host => "host",
            Kind::Exitless => "exitless",
            Kind::BestPeer => "best peer",
            Kind::Peer => "peer",
        }
    }
}

/// One row of a plot.
pub struct Bar<'a> {
    /// The row's name on the y axis: `exitless trap`, `bare metal (fio psync)`.
    pub label: String,
    pub kind: Kind,
    /// IOPS or transactions/s; `None` (or not a finite number): drawn as "not measured".
    pub rate: Option<f64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub exits_per_op: Option<f64>,
    /// Per operation, by counter name (`mmio_exits`, `insn_emulation`, ...).
    pub exits_by_cause: &'a Map<String, Value>,
}

/// The block bench's rows of one scenario as bars: host rows are bare metal (the one whose
/// IOPS the guests' ratios are against), rows whose I/O exitless serves are exitless's, and the
/// fastest of the others on exitless's backend (as "x QEMU" pairs them) is the best peer.
fn blk_bars<'a>(rows: &[&'a Row]) -> Vec<Bar<'a>> {
    let ours = |r: &Row| r.vmm == "exitless" || r.mode.contains("exitless");
    let baseline = rows.iter().filter(|r| r.vmm != "host").find_map(|r| r.bare_metal_iops);
    let best_host = rows.iter().filter(|r| r.vmm == "host").filter_map(|r| finite(r.iops)).fold(None, max);
    let bare_metal = baseline.or(best_host);
    let our_backend = rows.iter().find(|r| r.vmm == "exitless").map(|r| r.backend);
    let best_peer = rows
        .iter()
        .filter(|r| r.vmm != "host" && !ours(r) && our_backend.is_none_or(|b| r.backend == b))
        .filter_map(|r| finite(r.iops))
        .fold(None, max);
    rows.iter()
        .map(|r| {
            let kind = if r.vmm == "host" {
                match r.iops == bare_metal {
                    true => Kind::BareMetal,
                    false => Kind::Host,
                }
            } else if ours(r) {
                Kind::Exitless
            } else if best_peer.is_some() && finite(r.iops) == best_peer {
                Kind::BestPeer
            } else {
                Kind::Peer
            };
            let label = match r.vmm {
                "host" => r.mode.clone(),
                vmm if vmm != "exitless" && r.mode.starts_with(vmm) => r.mode.clone(),
                vmm => format!("{vmm} {}", r.mode),
            };
            Bar {
                label,
                kind,
                rate: r.iops,
                p50_us: r.p50_us,
                p99_us: r.p99_us,
                exits_per_op: r.exits_per_io,
                exits_by_cause: &r.exits_by_cause,
            }
        })
        .collect()
}

fn max(best: Option<f64>, v: f64) -> Option<f64> {
    Some(best.map_or(v, |b| b.max(v)))
}

/// A measurement a bar can be drawn from: finite and not negative.
fn finite(value: Option<f64>) -> Option<f64> {
    value.filter(|v| v.is_finite() && *v >= 0.0)
}

type Area<'b> = DrawingArea<SVGBackend<'b>, Shift>;
type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RowAxis>>;

/// The y axis of a bar chart: row `i` (0 at the top) is centred at `i`, and each row has one key
/// point: its label.
#[derive(Clone)]
struct RowAxis(usize);

impl Ranged for RowAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, row: &f64, (bottom, top): (i32, i32)) -> i32 {
        let from_top = (row + 0.5) / self.0.max(1) as f64;
        (top as f64 + (bottom - top) as f64 * from_top).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, _hint: Hint) -> Vec<f64> {
        (0..self.0).map(|i| i as f64).collect()
    }

    fn range(&self) -> std::ops::Range<f64> {
        -0.5..self.0 as f64 - 0.5
    }
}

/// The SVG document: a title and the three panels.
fn render(title: &str, bars: &[Bar], units: &Units) -> Result<String, DrawingAreaErrorKind<std::io::Error>> {
    let panel_height = 110 + 30 * bars.len().max(1) as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, 50 + 3 * panel_height)).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.titled(title, (FONT, 24))?;
        let panels = root.split_evenly((3, 1));
        let labels: Vec<&str> = bars.iter().map(|b| b.label.as_str()).collect();
        rate_panel(&panels[0], bars, &labels, units)?;
        exits_panel(&panels[1], bars, &labels, units)?;
        latency_panel(&panels[2], bars, &labels)?;
        root.present()?;
    }
    Ok(svg)
}

type DrawResult = Result<(), DrawingAreaErrorKind<std::io::Error>>;

/// A horizontal bar chart on the left of `area`, one row per label from top to bottom, and the
/// legend's column on the right.
fn chart<'a, 'b>(
    area: &'a Area<'b>,
    caption: &str,
    x_desc: &str,
    labels: &[&str],
    x_max: f64,
    legend: &[(String, RGBColor)],
) -> Result<Chart<'a, 'b>, DrawingAreaErrorKind<std::io::Error>> {
    let (plot, legend_area) = area.split_horizontally(WIDTH - LEGEND_WIDTH);
    for (i, (name, colour)) in legend.iter().enumerate() {
        let y = 40 + 22 * i as i32;
        legend_area.draw(&Rectangle::new([(10, y - 7), (24, y + 7)], colour.filled()))?;
        legend_area.draw(&Text::new(name.clone(), (32, y), text_style(14)))?;
    }
    let n = labels.len();
    let longest = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0) as u32;
    let mut chart = ChartBuilder::on(&plot)
        .caption(caption, (FONT, 18))
        .margin(10)
        .x_label_area_size(45)
        .y_label_area_size((longest * 8 + 20).clamp(100, 420))
        .build_cartesian_2d(0.0..x_max, RowAxis(n))?;
    let label_at = |y: &f64| {
        let i = y.round();
        match i >= 0.0 && (i as usize) < n {
            true => labels[i as usize].to_string(),
            false => String::new(),
        }
    };
    chart
        .configure_mesh()
        .disable_y_mesh()
        .light_line_style(TRANSPARENT)
        .y_labels(n)
        .y_label_formatter(&label_at)
        .x_labels(8)
        .x_label_formatter(&|x| grouped(*x, 2))
        .x_desc(x_desc)
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .draw()?;
    Ok(chart)
}

fn text_style(size: u32) -> TextStyle<'static> {
    TextStyle::from((FONT, size).into_font()).pos(Pos::new(HPos::Left, VPos::Center))
}

/// A value or mark written after a bar that ends at `x`.
fn note(text: String, x: f64, x_max: f64, y: f64, colour: &RGBColor) -> Text<'_, (f64, f64), String> {
    Text::new(text, (x + x_max * 0.01, y), text_style(13).color(colour))
}

/// The largest of `values`, with room on the right for the notes after the bars.
fn axis_max(values: impl Iterator<Item = Option<f64>>) -> f64 {
    let max = values.filter_map(finite).fold(0.0, f64::max);
    match max > 0.0 {
        true => max * 1.45,
        false => 1.0,
    }
}

fn rate_panel(area: &Area, bars: &[Bar], labels: &[&str], units: &Units) -> DrawResult {
    let x_max = axis_max(bars.iter().map(|b| b.rate));
    let mut kinds: Vec<Kind> = Vec::new();
    for bar in bars {
        if !kinds.contains(&bar.kind) {
            kinds.push(bar.kind);
        }
    }
    let legend: Vec<(String, RGBColor)> = kinds.iter().map(|k| (k.name().to_string(), k.colour())).collect();
    let caption = format!("{} per row (higher is better)", units.rate);
    let mut chart = chart(area, &caption, units.rate, labels, x_max, &legend)?;
    for (i, bar) in bars.iter().enumerate() {
        let y = i as f64;
        let Some(rate) = finite(bar.rate) else {
            chart.draw_series([note("not measured".into(), 0.0, x_max, y, &MISSING)])?;
            continue;
        };
        let colour = bar.kind.colour();
        let mark = match bar.kind {
            Kind::BareMetal | Kind::BestPeer => format!(" ({})", bar.kind.name()),
            _ => String::new(),
        };
        chart.draw_series([Rectangle::new([(0.0, y - 0.35), (rate, y + 0.35)], colour.filled())])?;
        chart.draw_series([note(format!("{}{mark}", grouped(rate, 0)), rate, x_max, y, &BLACK)])?;
    }
    Ok(())
}

/// The counters in `exits_by_cause` that are exits (KVM's exit reasons): they add up to at most
/// the row's exits. The others (emulated instructions, injected interrupts) count events that
/// may or may not come with an exit, so they are drawn apart, in a thin bar.
const EXIT_REASONS: [&str; 4] = ["mmio_exits", "io_exits", "halt_exits", "irq_exits"];
/// The part of a row's exits that no listed reason accounts for.
const OTHER_EXITS: &str = "other exits";

/// The causes any bar has, known ones first in `CAUSES` order, each with its colour, and
/// "other exits" when some bar's exits exceed its reasons' sum.
fn causes_present(bars: &[Bar]) -> Vec<(String, RGBColor)> {
    let mut names: Vec<String> = CAUSES
        .iter()
        .filter(|c| bars.iter().any(|b| b.exits_by_cause.contains_key(**c)))
        .map(|c| c.to_string())
        .collect();
    for bar in bars {
        for name in bar.exits_by_cause.keys() {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
    }
    if bars.iter().any(|b| other_exits(b) > 0.0) {
        names.push(OTHER_EXITS.into());
    }
    names.into_iter().enumerate().map(|(i, name)| (name, CAUSE_COLOURS[i % CAUSE_COLOURS.len()])).collect()
}

/// A cause's count per operation.
fn cause(bar: &Bar, name: &str) -> Option<f64> {
    finite(bar.exits_by_cause.get(name).and_then(Value::as_f64))
}

/// Exits no listed reason accounts for (under the report's 0.005 noise floor: none).
fn other_exits(bar: &Bar) -> f64 {
    let reasons: f64 = EXIT_REASONS.iter().filter_map(|r| cause(bar, r)).sum();
    let other = finite(bar.exits_per_op).unwrap_or(0.0) - reasons;
    match other >= 0.005 {
        true => other,
        false => 0.0,
    }
}

fn exits_panel(area: &Area, bars: &[Bar], labels: &[&str], units: &Units) -> DrawResult {
    let causes = causes_present(bars);
    let is_exit = |name: &str| EXIT_REASONS.contains(&name) || name == OTHER_EXITS;
    let value = |bar: &Bar, name: &str| match name {
        OTHER_EXITS => Some(other_exits(bar)),
        name => cause(bar, name),
    };
    let events =
        |bar: &Bar| causes.iter().filter(|(n, _)| !is_exit(n)).filter_map(|(n, _)| value(bar, n)).sum();
    let x_max = axis_max(bars.iter().flat_map(|b| [b.exits_per_op, Some(events(b))]));
    let axis = format!("exits per {}", units.op);
    let caption =
        format!("{axis} by cause (lower is better); thin bars: events per {} that are not exits", units.op);
    let mut chart = chart(area, &caption, &axis, labels, x_max, &causes)?;
    for (i, bar) in bars.iter().enumerate() {
        let y = i as f64;
        let (mut exits_end, mut events_end) = (0.0, 0.0);
        for (name, colour) in &causes {
            let Some(v) = value(bar, name).filter(|v| *v > 0.0) else { continue };
            let (x, top, bottom) = match is_exit(name) {
                true => (&mut exits_end, y - 0.36, y + 0.12),
                false => (&mut events_end, y + 0.18, y + 0.36),
            };
            chart.draw_series([Rectangle::new([(*x, top), (*x + v, bottom)], colour.filled())])?;
            *x += v;
        }
        let text = match finite(bar.exits_per_op) {
            Some(total) => format!("{total:.3} exits/{}", units.op),
            None => "n/a".into(),
        };
        chart.draw_series([note(text, f64::max(exits_end, events_end), x_max, y, &BLACK)])?;
    }
    Ok(())
}

fn latency_panel(area: &Area, bars: &[Bar], labels: &[&str]) -> DrawResult {
    let x_max = axis_max(bars.iter().flat_map(|b| [b.p50_us, b.p99_us]));
    let legend = [("p50".to_string(), P50), ("p99".to_string(), P99)];
    let mut chart = chart(
        area,
        "latency per row, p50 and p99 (lower is better)",
        "latency (µs)",
        labels,
        x_max,
        &legend,
    )?;
    for (i, bar) in bars.iter().enumerate() {
        let y = i as f64;
        let (p50, p99) = (finite(bar.p50_us), finite(bar.p99_us));
        if let Some(v) = p50 {
            chart.draw_series([Rectangle::new([(0.0, y - 0.36), (v, y - 0.02)], P50.filled())])?;
        }
        if let Some(v) = p99 {
            chart.draw_series([Rectangle::new([(0.0, y + 0.02), (v, y + 0.36)], P99.filled())])?;
        }
        let text = match (p50, p99) {
            (None, None) => "n/a".to_string(),
            _ => {
                let us = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.1}"));
                format!("p50 {} / p99 {} µs", us(p50), us(p99))
            }
        };
        let end = p50.into_iter().chain(p99).fold(0.0, f64::max);
        chart.draw_series([note(text, end, x_max, y, &BLACK)])?;
    }
    Ok(())
}

/// `1,234,567` (with `digits` decimals below 10).
fn grouped(value: f64, digits: usize) -> String {
    if value.abs() < 10.0 && value.fract() != 0.0 {
        return format!("{value:.digits$}");
    }
    let whole = format!("{:.0}", value.abs());
    let mut out = String::new();
    for (i, c) in whole.chars().enumerate() {
        if i > 0 && (whole.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    match value < 0.0 {
        true => format!("-{out}"),
        false => out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;
    use crate::blk::Scenario;

    fn row(vmm: &'static str, mode: &str, qd: u32, iops: Option<f64>) -> Row {
        let scenario = Scenario { disk: "ram", rw: "randread", bs: 4096, qd, backend: Backend::Ram };
        let mut row = Row::new(vmm, mode.to_string(), scenario);
        row.iops = iops;
        row.p50_us = iops.map(|v| 1e6 / v);
        row.p99_us = iops.map(|v| 2e6 / v);
        row.exits_per_io = iops.map(|_| 1.5);
        if iops.is_some() {
            row.exits_by_cause.insert("mmio_exits".into(), 1.0.into());
            row.exits_by_cause.insert("irq_exits".into(), 0.5.into());
        }
        row
    }

    fn report() -> Vec<Row> {
        let mut rows = Vec::new();
        for qd in [1, 32] {
            let mut host = row("host", "bare metal (fio psync)", qd, Some(500_000.0));
            host.exits_by_cause.clear();
            host.exits_per_io = Some(0.0);
            rows.push(host);
            for (vmm, mode, iops) in [
                ("exitless", "trap", Some(30_000.0)),
                ("exitless", "exitless", Some(800_000.0)),
                ("exitless", "pv-eoi", None),
                ("qemu", "qemu virtio-blk, interrupt", Some(40_000.0)),
                ("qemu", "qemu virtio-blk, poll", Some(55_000.0)),
                ("qemu", "qemu + exitless vhost-user-blk, poll", Some(90_000.0)),
            ] {
                let mut r = row(vmm, mode, qd, iops);
                r.bare_metal_iops = Some(500_000.0);
                rows.push(r);
            }
        }
        rows
    }

    #[test]
    fn rows_group_by_scenario_in_order() {
        let rows = report();
        let groups = group(&rows);
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].0.queue_depth, 1);
        assert_eq!(groups[1].0.queue_depth, 32);
        assert!(groups.iter().all(|(_, members)| members.len() == 7));
    }

    #[test]
    fn file_names_follow_the_scenario() {
        let key = |bs, disk: Option<&str>| ScenarioKey {
            workload: "randread".into(),
            block_size: bs,
            queue_depth: 32,
            disk: disk.map(str::to_string),
        };
        assert_eq!(key(4096, None).file_name(), "randread-4k-qd32.svg");
        assert_eq!(key(131072, None).file_name(), "randread-128k-qd32.svg");
        assert_eq!(key(1536, None).file_name(), "randread-1536-qd32.svg");
        assert_eq!(
            key(4096, Some("ext4 file /tmp/x.img")).file_name(),
            "ext4-file-tmp-x-img-randread-4k-qd32.svg"
        );
        assert_eq!(key(4096, None).title(), "blk: randread 4096 B, queue depth 32");
    }

    #[test]
    fn bare_metal_and_best_peer_are_marked() {
        let rows = report();
        let groups = group(&rows);
        let bars = blk_bars(&groups[0].1);
        let kind = |label: &str| bars.iter().find(|b| b.label == label).unwrap().kind;
        assert_eq!(kind("bare metal (fio psync)"), Kind::BareMetal);
        assert_eq!(kind("exitless trap"), Kind::Exitless);
        // exitless's backend behind QEMU is ours, not a peer, however fast.
        assert_eq!(kind("qemu + exitless vhost-user-blk, poll"), Kind::Exitless);
        assert_eq!(kind("qemu virtio-blk, poll"), Kind::BestPeer);
        assert_eq!(kind("qemu virtio-blk, interrupt"), Kind::Peer);
    }

    /// QEMU on another backend (a tmpfs file) may outrun QEMU on its null device, but exitless's
    /// rows are on a null disk: the best peer is QEMU's fastest there.
    #[test]
    fn the_best_peer_is_on_exitlesss_backend() {
        let on = |backend, vmm, mode, iops| Row { backend, ..row(vmm, mode, 1, Some(iops)) };
        let rows = [
            on(Backend::Null, "exitless", "exitless", 800_000.0),
            on(Backend::TmpfsDirect, "qemu", "qemu virtio-blk, poll", 500_000.0),
            on(Backend::Null, "qemu", "qemu virtio-blk null-co, poll", 300_000.0),
        ];
        let refs: Vec<&Row> = rows.iter().collect();
        let bars = blk_bars(&refs);
        let kinds: Vec<Kind> = bars.iter().map(|b| b.kind).collect();
        assert_eq!(kinds, [Kind::Exitless, Kind::Peer, Kind::BestPeer]);
    }

    #[test]
    fn rows_without_measurements_keep_their_label() {
        let rows = report();
        let groups = group(&rows);
        let svg = render("t", &blk_bars(&groups[0].1), &Units::BLK).unwrap();
        for text in [
            "exitless pv-eoi",
            "not measured",
            "bare metal (fio psync)",
            "500,000 (bare metal)",
            "55,000 (best peer)",
            "mmio_exits",
            "irq_exits",
            "latency (µs)",
            "exits per I/O",
        ] {
            assert!(svg.contains(text), "{text} in the SVG");
        }
        assert!(!svg.contains("halt_exits"), "only the causes that occurred");
    }

    #[test]
    fn nothing_measured_still_draws() {
        let rows =
            [row("exitless", "trap", 1, None), row("qemu", "qemu virtio-blk, poll", 1, Some(f64::NAN))];
        let refs: Vec<&Row> = rows.iter().collect();
        let svg = render("t", &blk_bars(&refs), &Units::BLK).unwrap();
        assert!(svg.contains("exitless trap") && svg.contains("not measured"));
        assert!(render("empty", &[], &Units::BLK).unwrap().contains("empty"));
    }

    #[test]
    fn an_unwritable_directory_is_one_line_of_error() {
        let rows = report();
        let e = write_all(Path::new("/proc/no-such-dir/plots"), &rows).unwrap_err().to_string();
        assert!(e.starts_with("--plot: cannot create the directory /proc/no-such-dir/plots"), "{e}");
        assert!(!e.contains('\n'));
    }

    #[test]
    fn exits_no_reason_accounts_for_are_other_exits() {
        let mut causes = Map::new();
        causes.insert("mmio_exits".into(), 0.09.into());
        causes.insert("insn_emulation".into(), 0.28.into());
        let bar = |exits| Bar {
            label: "exitless trap".into(),
            kind: Kind::Exitless,
            rate: Some(1.0),
            p50_us: None,
            p99_us: None,
            exits_per_op: exits,
            exits_by_cause: &causes,
        };
        // Emulated instructions are no exits: 0.125 - 0.09 are exits of other reasons.
        assert!((other_exits(&bar(Some(0.125))) - 0.035).abs() < 1e-9);
        assert_eq!(other_exits(&bar(Some(0.092))), 0.0, "under the noise floor");
        assert_eq!(other_exits(&bar(None)), 0.0);
        let names: Vec<String> = causes_present(&[bar(Some(0.125))]).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["mmio_exits", "insn_emulation", "other exits"]);
        let svg = render("t", &[bar(Some(0.125))], &Units::NET).unwrap();
        assert!(svg.contains("exits per transaction") && svg.contains("transactions/s"));
    }

    #[test]
    fn numbers_are_grouped() {
        assert_eq!(grouped(1234567.4, 0), "1,234,567");
        assert_eq!(grouped(999.0, 0), "999");
        assert_eq!(grouped(1.5, 2), "1.50");
        assert_eq!(grouped(0.0, 2), "0");
    }
}
