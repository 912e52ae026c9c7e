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

/// How often a [`Spinner`] looks at the clock.
const SPINS_PER_CLOCK_CHECK: u32 = 64;

/// A busy wait bounded by a deadline that reads the TSC only every
/// `SPINS_PER_CLOCK_CHECK` spins.
pub struct Spinner {
    deadline: Deadline,
    spins: u32,
}

impl Spinner {
    pub fn new(deadline: Deadline) -> Spinner {
        Spinner { deadline, spins: 0 }
    }

    /// Spin once; `false` (without spinning) once the deadline has passed.
    pub fn spin(&mut self) -> bool {
        self.spins = self.spins.wrapping_add(1);
        if self.spins.is_multiple_of(SPINS_PER_CLOCK_CHECK) && self.deadline.passed() {
            return false;
        }
        core::hint::spin_loop();
        true
    }
}
