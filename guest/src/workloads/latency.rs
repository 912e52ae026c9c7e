//! The latency fields of the measuring workloads' result lines (`blk`, `udp-rr`).

use crate::histogram::Histogram;
use crate::json::Nanos;
use crate::{print, Env};

/// The percentiles a result line reports, in TSC cycles.
pub struct Percentiles {
    p50: u64,
    p99: u64,
    p999: u64,
    max: u64,
}

impl Percentiles {
    pub fn of(latencies: &Histogram) -> Percentiles {
        Percentiles {
            p50: latencies.percentile(500),
            p99: latencies.percentile(990),
            p999: latencies.percentile(999),
            max: latencies.max(),
        }
    }

    /// Print `,"p50_ns":..,"p99_ns":..,"p999_ns":..,"max_ns":..`.
    pub fn print_ns(&self, env: &Env) {
        let ns = |cycles: u64| Nanos(env.ps_per_op(cycles, 1));
        print!(
            ",\"p50_ns\":{},\"p99_ns\":{},\"p999_ns\":{},\"max_ns\":{}",
            ns(self.p50),
            ns(self.p99),
            ns(self.p999),
            ns(self.max)
        );
    }

    /// Print `,"p50_cycles":..,"p99_cycles":..,"p999_cycles":..,"max_cycles":..`.
    pub fn print_cycles(&self) {
        print!(
            ",\"p50_cycles\":{},\"p99_cycles\":{},\"p999_cycles\":{},\"max_cycles\":{}",
            self.p50, self.p99, self.p999, self.max
        );
    }
}
