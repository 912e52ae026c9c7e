//! Progress of a planned series of runs, on standard error: one line per run with an estimate
//! of the time left, from the runs still planned and the mean measured duration of each kind.

use std::time::{Duration, Instant};

/// What a run is, for the estimate: runs of one kind take about as long as each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// fio on the host.
    Fio,
    /// The probe under exitless.
    Exitless,
    /// The probe under QEMU (and a vhost-user backend).
    Qemu,
}

impl Kind {
    fn index(self) -> usize {
        match self {
            Kind::Fio => 0,
            Kind::Exitless => 1,
            Kind::Qemu => 2,
        }
    }
}

/// The plan and what has run of it.
pub struct Progress {
    plan: Vec<Kind>,
    done: usize,
    /// Per kind: total time measured, runs measured.
    spent: [(Duration, u32); 3],
    /// Before any run of a kind: the measured time of each run plus this much.
    run_time: Duration,
    current: Option<(Kind, Instant)>,
}

impl Progress {
    /// A plan of runs, each measuring for `run_time`.
    pub fn new(plan: Vec<Kind>, run_time: Duration) -> Progress {
        Progress { plan, done: 0, spent: [(Duration::ZERO, 0); 3], run_time, current: None }
    }

    /// Ends the run in progress, if any, and announces the next one (of `kind`).
    pub fn start(&mut self, kind: Kind, what: std::fmt::Arguments) {
        self.finish();
        let left = self.left(self.done);
        let total = self.plan.len().max(self.done + 1);
        super::progress(format_args!(
            "[{}/{total}] {what} (about {} left)",
            self.done + 1,
            format_left(left)
        ));
        self.current = Some((kind, Instant::now()));
    }

    /// Ends the run in progress: its time counts for the estimates of its kind.
    pub fn finish(&mut self) {
        if let Some((kind, started)) = self.current.take() {
            let spent = &mut self.spent[kind.index()];
            spent.0 += started.elapsed();
            spent.1 += 1;
            self.done += 1;
        }
    }

    /// The estimated time of the planned runs from index `from` on.
    fn left(&self, from: usize) -> Duration {
        self.plan.iter().skip(from).map(|&kind| self.estimate(kind)).sum()
    }

    fn estimate(&self, kind: Kind) -> Duration {
        match self.spent[kind.index()] {
            (total, n) if n > 0 => total / n,
            // First guesses, from this host's start-up times (docs/tuning.md).
            _ => {
                self.run_time
                    + match kind {
                        Kind::Fio => Duration::from_millis(100),
                        Kind::Exitless => Duration::from_millis(500),
                        Kind::Qemu => Duration::from_millis(1000),
                    }
            }
        }
    }
}

/// `1m40s`, `12s`.
fn format_left(left: Duration) -> String {
    let secs = left.as_secs_f64().round() as u64;
    if secs >= 60 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{secs}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_from_the_plan_and_measured_runs() {
        let mut p = Progress::new(vec![Kind::Fio, Kind::Exitless, Kind::Exitless], Duration::from_secs(1));
        assert_eq!(p.left(0), Duration::from_millis(1100 + 1500 * 2));
        p.spent[Kind::Exitless.index()] = (Duration::from_secs(4), 2);
        assert_eq!(p.left(1), Duration::from_secs(4));
        assert_eq!(format_left(Duration::from_secs(100)), "1m40s");
        assert_eq!(format_left(Duration::from_millis(12_400)), "12s");
    }
}
