//! The spin-or-sleep trial, on a made-up clock.

use super::*;

/// What `SpinTrial` chose for each of `waits` disk waits, each one unit of work long and lasting
/// `cost(wait index, spun)`.
fn choices(waits: u32, cost: impl Fn(u32, bool) -> Duration) -> Vec<bool> {
    let (mut trial, mut clock) = (SpinTrial::new(), Instant::now());
    (0..waits)
        .map(|index| {
            let now = clock;
            let spun = trial.begin_wait(u64::from(index), || now);
            clock += cost(index, spun);
            spun
        })
        .collect()
}

const HALF: usize = SPIN_TRIAL_WAITS as usize;
const EVERY: usize = SPIN_TRIAL_EVERY as usize;
/// Waits from the end of one trial to the start of the next.
const SETTLED: std::ops::Range<usize> = 2 * HALF..2 * HALF + EVERY;

fn micros(us: u64) -> Duration {
    Duration::from_micros(us)
}

#[test]
fn a_trial_spins_then_sleeps_then_keeps_spinning_where_spinning_finishes_waits_sooner() {
    let chosen = choices(3 * EVERY as u32, |_, spun| if spun { micros(45) } else { micros(65) });
    assert!(chosen[..HALF].iter().all(|&spun| spun));
    assert!(chosen[HALF..2 * HALF].iter().all(|&spun| !spun));
    assert!(chosen[SETTLED].iter().all(|&spun| spun));
}

#[test]
fn a_trial_stops_spinning_where_the_spin_holds_off_the_disks_worker_and_tries_again_later() {
    let next_trial = SETTLED.end;
    let chosen = choices(3 * EVERY as u32, |index, spun| {
        // Spinning costs until the next trial, and pays from then on.
        let spin_pays = index as usize >= next_trial;
        if spun == spin_pays {
            micros(90)
        } else {
            micros(130)
        }
    });
    assert!(chosen[SETTLED].iter().all(|&spun| !spun));
    assert!(chosen[next_trial..next_trial + HALF].iter().all(|&spun| spun));
    assert!(chosen[next_trial + 2 * HALF..next_trial + 2 * HALF + EVERY].iter().all(|&spun| spun));
}

#[test]
fn a_wait_that_does_not_spin_may_sleep_at_once() {
    let mut wait = DiskWait::new();
    wait.trial = SpinTrial { waits: 0, phase: TrialPhase::Settled { spin: false } };
    assert!(wait.spun_enough(0));
    wait.reset();
    wait.trial.phase = TrialPhase::Settled { spin: true };
    assert!(!wait.spun_enough(0), "a spinning wait spins first");
}
