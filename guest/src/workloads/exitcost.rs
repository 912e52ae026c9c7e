//! `probe.workload=exitcost`: what one exit of each kind costs, timed with the TSC.
//!
//! Parameters: `probe.ops=mmio,ioeventfd,cpuid,pingpong,irq` (default: all), `probe.n=`
//! operations per exit kind (default 10000), `probe.pingpong_n=` round trips (default 100000),
//! `probe.pv_eoi=on|off` (default off).
//! `irq` is a round trip whose answer is an interrupt: the guest posts a request in shared
//! memory, a host thread raises the test device's IOAPIC pin (edge-triggered), a ring-0 handler
//! counts it and writes the LAPIC EOI. With `probe.pv_eoi=on` the probe enables KVM's
//! paravirtual EOI first and the handler skips the EOI write whenever KVM set the PV EOI flag
//! (`pv_eoi.rs`); if KVM does not offer PV EOI, the probe prints an error line with
//! `"pv_eoi":"unavailable"` and stops with status FAILED (1) before measuring anything.
//! Every result line says `"pv_eoi":true|false`; the `irq` line also has `"pv_eois"`, how many
//! of the measured interrupts KVM completed itself (all of them when PV EOI works; 0 when off,
//! and 0 on this host's kvm_pvm, which ends every interrupt as it delivers it: see `pv_eoi.rs`).
//! The ioeventfd, ping-pong and irq parts need exitless's test device
//! (`exitless.testdev=`); under other VMMs they are reported as skipped, and user-space MMIO
//! exits go to an unassigned address.

use core::sync::atomic::{AtomicU32, Ordering};

use crate::json::{Nanos, Str};
use crate::pv_eoi::{self, Tally};
use crate::{apic, bad_parameter, boot, cmdline, print, println, x86, Env};
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
    let pv_eoi = pv_eoi::from_cmdline(env, "exitcost");
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
        let mut pv_eois = None;
        let (count, cycles) = match op {
            "mmio" => timed(n, &mark, |i| x86::mmio_write32(mmio_base + testdev::USER_EXIT, i)),
            "ioeventfd" => timed(n, &mark, |i| x86::mmio_write32(mmio_base + testdev::DOORBELL, i)),
            "cpuid" => timed(n, &mark, |_| {
                x86::cpuid(0, 0);
            }),
            "pingpong" | "irq" => {
                let count = if op == "irq" { n } else { pingpong_n };
                match pingpong(env, mmio_base, op == "irq", count as u32, &mark) {
                    Some((cycles, pv)) => {
                        pv_eois = (op == "irq").then_some(pv);
                        (count, cycles)
                    }
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
        print!(
            "{{\"probe\":\"exitcost\",\"op\":{},\"n\":{},\"cycles\":{},\"ns_per_op\":{},\"mark\":{},\"pv_eoi\":{}",
            Str(op),
            count,
            cycles,
            Nanos(env.ps_per_op(cycles, count)),
            index * 2,
            pv_eoi
        );
        if let Some(pv_eois) = pv_eois {
            print!(",\"pv_eois\":{}", pv_eois);
        }
        println!("}}");
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
/// memory too or, with `by_interrupt`, as interrupts. TSC cycles for `n` of them, and how many
/// of their interrupts KVM completed by PV EOI.
fn pingpong(env: &Env, base: u64, by_interrupt: bool, n: u32, mark: &dyn Fn(u32)) -> Option<(u64, u64)> {
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
        boot::set_interrupt_gate(TESTDEV_VECTOR, boot::irq_handler_address());
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
    let tally = Tally::now();
    let start = x86::rdtsc();
    for seq in PINGPONG_WARMUP + 1..=PINGPONG_WARMUP + n {
        if !round_trip(seq) {
            return None;
        }
    }
    let cycles = x86::rdtsc() - start;
    let pv_eois = tally.pv_eois_since();
    mark(1);
    round_trip(testdev::STOP);
    Some((cycles, pv_eois))
}
