//! The exitless probe guest: a tiny PVH kernel that every VMM under test boots, so every
//! comparison runs the very same guest code. Ring 0 only sets up; workloads run in ring 3.
//! Results are JSON lines on COM1; the exit status goes out through the isa-debug-exit port.
#![no_std]
#![no_main]

mod apic;
mod boot;
mod cmdline;
mod deadline;
mod histogram;
mod inet;
mod json;
mod pv_eoi;
mod serial;
mod start_info;
mod virtio;
mod workloads;
mod x86;

use probe_abi::{param, status};

/// What every workload gets.
pub struct Env {
    pub cmdline: &'static str,
    pub ram_bytes: u64,
    /// TSC frequency from `probe.tsc_khz=` (0 when not given: results are then in cycles).
    pub tsc_khz: u64,
    /// Address of exitless's test device (`exitless.testdev=`); `None` under other VMMs.
    pub testdev: Option<u64>,
    /// `probe.mark_linger_ms=`: see [`Env::mark`] (needs `probe.tsc_khz=`).
    pub mark_linger_ms: u64,
}

impl Env {
    /// Label a phase for the VMM's exact exit accounting. Without exitless's test device, and
    /// with `probe.mark_linger_ms=N`, print `{"mark":LABEL}` on a line of its own and spin N ms,
    /// so a runner reading the console can sample the VMM's exit counters (QEMU's QMP
    /// `query-stats`) while the guest does nothing; printing costs one exit per byte.
    pub fn mark(&self, label: u32) {
        if let Some(base) = self.testdev {
            x86::mmio_write32(base + probe_abi::testdev::MARK, label);
        } else if self.mark_linger_ms > 0 {
            println!("{{\"mark\":{}}}", label);
            let until = x86::rdtsc() + self.mark_linger_ms * self.tsc_khz;
            while x86::rdtsc() < until {
                core::hint::spin_loop();
            }
        }
    }

    /// Picoseconds per operation for `cycles` spent on `ops` operations (0 without a TSC rate).
    pub fn ps_per_op(&self, cycles: u64, ops: u64) -> u64 {
        if self.tsc_khz == 0 || ops == 0 {
            return 0;
        }
        (cycles as u128 * 1_000_000_000 / self.tsc_khz as u128 / ops as u128) as u64
    }

    /// Operations per second for `ops` operations in `cycles` (0 without a TSC rate).
    pub fn ops_per_second(&self, ops: u64, cycles: u64) -> u64 {
        if self.tsc_khz == 0 || cycles == 0 {
            return 0;
        }
        (ops as u128 * self.tsc_khz as u128 * 1000 / cycles as u128) as u64
    }
}

/// Ring-3 entry, from `boot.rs`, with the physical address of `hvm_start_info`.
#[no_mangle]
extern "C" fn probe_main(start_info_addr: u64) -> ! {
    boot::install_exception_handlers();
    let Some(info) = start_info::read(start_info_addr) else {
        println!("{{\"probe\":\"error\",\"error\":\"no PVH start info\"}}");
        x86::exit(status::BAD_CMDLINE)
    };
    let tsc_khz = match cmdline::get_u64(info.cmdline, param::TSC_KHZ, 0) {
        Ok(v) => v,
        Err(key) => bad_parameter(key),
    };
    let testdev = cmdline::get(info.cmdline, param::TESTDEV)
        .map(|v| cmdline::parse_u64(v).unwrap_or_else(|| bad_parameter(param::TESTDEV)));
    let mark_linger_ms = match cmdline::get_u64(info.cmdline, "probe.mark_linger_ms", 0) {
        Ok(ms) if ms == 0 || tsc_khz > 0 => ms,
        _ => bad_parameter("probe.mark_linger_ms"),
    };
    let env = Env { cmdline: info.cmdline, ram_bytes: info.ram_bytes, tsc_khz, testdev, mark_linger_ms };
    let workload = cmdline::get(info.cmdline, param::WORKLOAD).unwrap_or("hello");
    let status = match workload {
        "hello" => workloads::hello::run(&env),
        "exitcost" => workloads::exitcost::run(&env),
        "blk" => workloads::blk::run(&env),
        "blk-hostile" => workloads::blk_hostile::run(&env),
        "blk-chains" => workloads::blk_chains::run(&env),
        "blk-faults" => workloads::blk_faults::run(&env),
        "blk-durable" => workloads::blk_durable::run(&env),
        "udp-rr" => workloads::udp_rr::run(&env),
        "udp-echo" => workloads::udp_echo::run(&env),
        "frames-send" => workloads::frames::send(&env),
        "frames-count" => workloads::frames::count(&env),
        "net-hostile" => workloads::net_hostile::run(&env),
        "triplefault" => x86::triple_fault(),
        "exception" => workloads::faults::invalid_opcode(),
        "spin" => workloads::faults::spin_forever(),
        other => {
            println!(
                "{{\"probe\":\"error\",\"error\":\"unknown workload\",\"workload\":{}}}",
                json::Str(other)
            );
            status::BAD_CMDLINE
        }
    };
    x86::exit(status)
}

/// Report a malformed `key=value` parameter and stop.
pub fn bad_parameter(key: &str) -> ! {
    println!("{{\"probe\":\"error\",\"error\":\"bad parameter\",\"parameter\":{}}}", json::Str(key));
    x86::exit(status::BAD_CMDLINE)
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    println!("{{\"probe\":\"panic\",\"message\":\"{}\"}}", info.message());
    x86::exit(status::CRASH)
}
