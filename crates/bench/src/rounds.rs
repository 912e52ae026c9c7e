//! `--rounds N`: a scenario's guest rows measured N times in turn, each row then reported by its
//! median run. This host's disk and CPU placement drift by tens of percent within minutes, so one
//! run per row compares moments as much as VMMs; rows measured in turn share the drift.

use super::blk::Row;

/// The rows of `rounds` (each round the same configurations, in the same order), one per
/// configuration: its run with the median IOPS (the lower middle of an even count; a run that
/// failed counts below every measured one), carrying every round's IOPS in round order.
pub(crate) fn median_rows(rounds: Vec<Vec<Row>>) -> Vec<Row> {
    let Some(first) = rounds.first() else { return Vec::new() };
    let keys: Vec<(&'static str, String)> = first.iter().map(|row| (row.vmm, row.mode.clone())).collect();
    let mut runs: Vec<Vec<Row>> = keys.iter().map(|_| Vec::with_capacity(rounds.len())).collect();
    for round in rounds {
        for row in round {
            if let Some(index) = keys.iter().position(|(vmm, mode)| *vmm == row.vmm && *mode == row.mode) {
                runs[index].push(row);
            }
        }
    }
    runs.into_iter().filter_map(median).collect()
}

fn median(mut runs: Vec<Row>) -> Option<Row> {
    let round_iops: Vec<Option<f64>> = runs.iter().map(|row| row.iops).collect();
    runs.sort_by(|a, b| a.iops.unwrap_or(f64::NEG_INFINITY).total_cmp(&b.iops.unwrap_or(f64::NEG_INFINITY)));
    let middle = runs.len().checked_sub(1)? / 2;
    let mut row = runs.swap_remove(middle);
    row.round_iops = round_iops;
    Some(row)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;
    use crate::blk::Scenario;

    fn row(vmm: &'static str, mode: &str, iops: Option<f64>, p50_us: f64) -> Row {
        let scenario = Scenario { disk: "null", rw: "randread", bs: 4096, qd: 32, backend: Backend::Null };
        Row { iops, p50_us: Some(p50_us), ..Row::new(vmm, mode.into(), scenario) }
    }

    #[test]
    fn each_configuration_is_reported_by_its_median_run_with_every_rounds_iops() {
        let rounds = vec![
            vec![row("exitless", "exitless", Some(3.0), 30.0), row("qemu", "poll", Some(10.0), 1.0)],
            vec![row("exitless", "exitless", Some(1.0), 10.0), row("qemu", "poll", None, 2.0)],
            vec![row("exitless", "exitless", Some(2.0), 20.0), row("qemu", "poll", Some(5.0), 3.0)],
        ];
        let rows = median_rows(rounds);
        assert_eq!(rows.len(), 2);
        // The median run whole, its latency with it.
        assert_eq!((rows[0].vmm, rows[0].iops, rows[0].p50_us), ("exitless", Some(2.0), Some(20.0)));
        assert_eq!(rows[0].round_iops, [Some(3.0), Some(1.0), Some(2.0)]);
        // A failed run sorts below the measured ones.
        assert_eq!((rows[1].iops, rows[1].p50_us), (Some(5.0), Some(3.0)));
        assert_eq!(rows[1].round_iops, [Some(10.0), None, Some(5.0)]);
    }

    #[test]
    fn an_even_count_takes_the_lower_middle_and_one_round_changes_nothing_but_the_list() {
        let rounds = vec![
            vec![row("exitless", "adaptive", Some(4.0), 4.0)],
            vec![row("exitless", "adaptive", Some(1.0), 1.0)],
            vec![row("exitless", "adaptive", Some(3.0), 3.0)],
            vec![row("exitless", "adaptive", Some(2.0), 2.0)],
        ];
        assert_eq!(median_rows(rounds)[0].iops, Some(2.0));
        let one = median_rows(vec![vec![row("exitless", "trap", Some(7.0), 7.0)]]);
        assert_eq!((one[0].iops, one[0].round_iops.as_slice()), (Some(7.0), &[Some(7.0)][..]));
        assert!(median_rows(Vec::new()).is_empty());
    }
}
