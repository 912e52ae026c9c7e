//! `probe.workload=exitcost`: what one exit of each kind costs, timed with the TSC.
//!
//! Parameters: `probe.ops=mmio,ioeventfd,cpuid,pingpong,irq` (default: all), `probe.n=`
//! operations per exit kind (default 10000), `probe.pingpong_n=` round trips (default 100000).
//! `irq` is a round trip whose answer is an interrupt: the guest posts a request in shared
//! memory, a host thread raises the test device's IOAPIC pin, a ring-0 handler counts it and
//! writes the EOI. The ioeventfd, ping-pong and irq parts need exitless's test device
//! (`exitless.testdev=`); under other VMMs they are reported as skipped, and user-space MMIO
//! exits go to an unassigned address.

use core::sync::atomic::{AtomicU32, Ordering};

use crate::json::{Nanos, Str};
use crate::{apic, bad_parameter, boot, cmdline, println, x86, Env};
use probe_abi::{status, testdev};

const DEFAULT_OPS: &str = "mmio,ioeventfd,cpuid,pingpong,irq";
/// The vector the test device's interrupt is routed to.
const TESTDEV_VECTOR: u8 = 0x40;
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
    let testdev = env.testdev;
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
        let mark = |phase: u32| env.mark(index as u32 * 2 + phase);
        let needs_testdev = matches!(op, "ioeventfd" | "pingpong" | "irq");
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
            "pingpong" | "irq" => {
                let count = if op == "irq" { n } else { pingpong_n };
                match pingpong(env, mmio_base, op == "irq", count as u32, &mark) {
                    Some(cycles) => (count, cycles),
                    None => {
                        println!(
                            "{{\"probe\":\"exitcost\",\"op\":{},\"error\":\"no answer from the host thread\"}}",
                            Str(op)
                        );
                        result = status::FAILED;
                        continue;
                    }
                }
            }
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

/// Round trips with a host thread: requests through shared memory, answers through shared
/// memory too or, with `by_interrupt`, as interrupts. TSC cycles for `n` of them.
fn pingpong(env: &Env, base: u64, by_interrupt: bool, n: u32, mark: &dyn Fn(u32)) -> Option<u64> {
    let area = &PINGPONG_AREA;
    area.request.store(0, Ordering::SeqCst);
    area.ack.store(0, Ordering::SeqCst);
    let area_addr = area as *const PingPongArea as u64;
    let irqs_before = boot::irq_count();
    let answered = |seq: u32| {
        if by_interrupt && seq != testdev::STOP {
            boot::irq_count().wrapping_sub(irqs_before) == seq
        } else {
            area.ack.load(Ordering::Acquire) == seq
        }
    };
    if by_interrupt {
        boot::set_interrupt_gate(TESTDEV_VECTOR, boot::irq_count_handler_address());
        apic::enable_lapic();
        apic::route_ioapic_pin(testdev::IRQ_PIN, TESTDEV_VECTOR);
        x86::mmio_write64(base + testdev::PINGPONG_IRQ, area_addr);
    } else {
        x86::mmio_write64(base + testdev::PINGPONG, area_addr);
    }
    let timeout = if env.tsc_khz == 0 { 10_000_000_000 } else { env.tsc_khz * 1000 * PINGPONG_TIMEOUT_S };
    let round_trip = |seq: u32| -> bool {
        area.request.store(seq, Ordering::Release);
        let start = x86::rdtsc();
        let mut spins = 0u32;
        while !answered(seq) {
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
