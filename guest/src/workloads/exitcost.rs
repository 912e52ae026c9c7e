//! `probe.workload=exitcost`: what one exit of each kind costs, timed with the TSC.
//!
//! Parameters: `probe.ops=mmio,ioeventfd,cpuid,pingpong` (default: all), `probe.n=` operations
//! per exit kind (default 10000), `probe.pingpong_n=` round trips (default 100000). The
//! ioeventfd and ping-pong parts need exitless's test device (`exitless.testdev=`); under other
//! VMMs they are reported as skipped, and user-space MMIO exits go to an unassigned address.

use core::sync::atomic::{AtomicU32, Ordering};

use crate::json::{Nanos, Str};
use crate::{bad_parameter, cmdline, println, x86, Env};
use probe_abi::{param, status, testdev};

const DEFAULT_OPS: &str = "mmio,ioeventfd,cpuid,pingpong";
const PINGPONG_WARMUP: u32 = 1000;
/// Give up on an unanswered ping-pong after this many seconds.
const PINGPONG_TIMEOUT_S: u64 = 5;

#[repr(C, align(128))]
struct PingPongArea {
    request: AtomicU32,
    _pad: [u8; 60],
    ack: AtomicU32,
}

static PINGPONG_AREA: PingPongArea =
    PingPongArea { request: AtomicU32::new(0), _pad: [0; 60], ack: AtomicU32::new(0) };

pub fn run(env: &Env) -> u8 {
    let testdev = cmdline::get(env.cmdline, param::TESTDEV)
        .map(|v| cmdline::parse_u64(v).unwrap_or_else(|| bad_parameter(param::TESTDEV)));
    let n = cmdline::get_u64(env.cmdline, "probe.n", 10_000).unwrap_or_else(|k| bad_parameter(k));
    let pingpong_n =
        cmdline::get_u64(env.cmdline, "probe.pingpong_n", 100_000).unwrap_or_else(|k| bad_parameter(k));
    if pingpong_n >= (testdev::STOP - PINGPONG_WARMUP) as u64 {
        bad_parameter("probe.pingpong_n");
    }
    let ops = cmdline::get(env.cmdline, "probe.ops").unwrap_or(DEFAULT_OPS);
    let mmio_base = testdev.unwrap_or(testdev::DEFAULT_BASE);

    let mut result = status::OK;
    for (index, op) in ops.split(',').enumerate() {
        let mark = |phase: u32| {
            if let Some(base) = testdev {
                x86::mmio_write32(base + testdev::MARK, index as u32 * 2 + phase);
            }
        };
        let needs_testdev = matches!(op, "ioeventfd" | "pingpong");
        if needs_testdev && testdev.is_none() {
            println!(
                "{{\"probe\":\"exitcost\",\"op\":{},\"skipped\":\"needs the exitless test device\"}}",
                Str(op)
            );
            continue;
        }
        let (count, cycles) = match op {
            "mmio" => timed(n, &mark, |i| x86::mmio_write32(mmio_base + testdev::USER_EXIT, i)),
            "ioeventfd" => timed(n, &mark, |i| x86::mmio_write32(mmio_base + testdev::DOORBELL, i)),
            "cpuid" => timed(n, &mark, |_| {
                x86::cpuid(0, 0);
            }),
            "pingpong" => match pingpong(env, mmio_base, pingpong_n as u32, &mark) {
                Some(cycles) => (pingpong_n, cycles),
                None => {
                    println!("{{\"probe\":\"exitcost\",\"op\":\"pingpong\",\"error\":\"no answer from the host thread\"}}");
                    result = status::FAILED;
                    continue;
                }
            },
            _ => bad_parameter("probe.ops"),
        };
        println!(
            "{{\"probe\":\"exitcost\",\"op\":{},\"n\":{},\"cycles\":{},\"ns_per_op\":{},\"mark\":{}}}",
            Str(op),
            count,
            cycles,
            Nanos(env.ps_per_op(cycles, count)),
            index * 2
        );
    }
    result
}

/// Run `op` `n` times between two marks; returns (n, TSC cycles).
fn timed(n: u64, mark: &dyn Fn(u32), mut op: impl FnMut(u32)) -> (u64, u64) {
    mark(0);
    let start = x86::rdtsc();
    for i in 0..n {
        op(i as u32);
    }
    let cycles = x86::rdtsc() - start;
    mark(1);
    (n, cycles)
}

/// Round trips through shared memory with a host thread; TSC cycles for `n` of them.
fn pingpong(env: &Env, base: u64, n: u32, mark: &dyn Fn(u32)) -> Option<u64> {
    let area = &PINGPONG_AREA;
    area.request.store(0, Ordering::SeqCst);
    area.ack.store(0, Ordering::SeqCst);
    x86::mmio_write64(base + testdev::PINGPONG, area as *const PingPongArea as u64);
    let timeout = if env.tsc_khz == 0 { 10_000_000_000 } else { env.tsc_khz * 1000 * PINGPONG_TIMEOUT_S };
    let round_trip = |seq: u32| -> bool {
        area.request.store(seq, Ordering::Release);
        let start = x86::rdtsc();
        let mut spins = 0u32;
        while area.ack.load(Ordering::Acquire) != seq {
            core::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) && x86::rdtsc() - start > timeout {
                return false;
            }
        }
        true
    };
    for seq in 1..=PINGPONG_WARMUP {
        if !round_trip(seq) {
            return None;
        }
    }
    mark(0);
    let start = x86::rdtsc();
    for seq in PINGPONG_WARMUP + 1..=PINGPONG_WARMUP + n {
        if !round_trip(seq) {
            return None;
        }
    }
    let cycles = x86::rdtsc() - start;
    mark(1);
    round_trip(testdev::STOP);
    Some(cycles)
}
