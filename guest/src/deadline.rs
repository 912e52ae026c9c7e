//! Bounded waits: every wait on a device ends, with an error if the device never answers.

use crate::x86;

/// TSC rate assumed when the runner gave no `probe.tsc_khz=`: waits then last between about
/// half and twice what was asked on the machines the probe runs on, which is enough to turn a
/// hang into an error.
const FALLBACK_TSC_KHZ: u64 = 2_000_000;

#[derive(Clone, Copy)]
pub struct Deadline {
    end: u64,
}

impl Deadline {
    /// `ms` milliseconds from now, measured with the TSC.
    pub fn after_ms(tsc_khz: u64, ms: u64) -> Deadline {
        let khz = if tsc_khz == 0 { FALLBACK_TSC_KHZ } else { tsc_khz };
        Deadline { end: x86::rdtsc().saturating_add(khz.saturating_mul(ms)) }
    }

    pub fn passed(&self) -> bool {
        x86::rdtsc() >= self.end
    }
}
