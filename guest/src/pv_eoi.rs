//! KVM's paravirtual EOI (`probe.pv_eoi=on`), ELI's exitless interrupt completion: the guest
//! gives KVM the address of a flag word (MSR_KVM_PV_EOI_EN); KVM sets bit 0 when it injects an
//! interrupt whose EOI it can do by itself (edge-triggered, no ack notifier, nothing else
//! pending), and the guest's handler then clears the bit instead of writing the LAPIC EOI
//! register. The handler is `irq_pv_eoi_handler` in `boot.rs`; the workloads report in
//! `"pv_eois"` how many interrupts it found the flag set for.
//!
//! On this host's kvm_pvm the flag is never set: kvm_pvm completes each interrupt (KVM's
//! `kvm_eoi` trace event) as it delivers it to the ring-0 handler, so by the time KVM would arm
//! PV EOI nothing is in service, and the handler's own LAPIC EOI write finds nothing to end
//! (`kvm_eoi` with vector -1). The handler then takes its LAPIC path and `pv_eois` is 0.

use core::sync::atomic::{AtomicBool, Ordering};

use crate::json::Str;
use crate::{bad_parameter, boot, cmdline, println, x86, Env};
use probe_abi::status;

const MSR_KVM_PV_EOI_EN: u32 = 0x4b56_4d04;
/// KVM_FEATURE_PV_EOI in CPUID 0x4000_0001 EAX.
const KVM_FEATURE_PV_EOI: u32 = 1 << 6;
const PARAM: &str = "probe.pv_eoi";

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Is PV EOI on (so that `boot::irq_handler_address` is the PV EOI handler)?
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Does the hypervisor offer PV EOI?
pub fn available() -> bool {
    x86::kvm_features() & KVM_FEATURE_PV_EOI != 0
}

/// Hand KVM the flag word. Call before installing interrupt handlers.
fn enable() {
    boot::wrmsr(MSR_KVM_PV_EOI_EN, boot::pv_eoi_flag_address() | 1);
    ENABLED.store(true, Ordering::Relaxed);
}

/// `probe.pv_eoi=on|off` (default off) for the workload `probe`: with `on`, enable PV EOI, or,
/// when KVM does not offer it, print an error line with `"pv_eoi":"unavailable"` and stop with
/// status FAILED. Returns whether PV EOI is on.
pub fn from_cmdline(env: &Env, probe: &str) -> bool {
    match cmdline::get(env.cmdline, PARAM).unwrap_or("off") {
        "off" | "0" => false,
        "on" | "1" => {
            if !available() {
                println!(
                    "{{\"probe\":{},\"error\":\"KVM paravirtual EOI is not offered (CPUID 0x40000001 EAX bit 6, KVM_FEATURE_PV_EOI)\",\"pv_eoi\":\"unavailable\"}}",
                    Str(probe)
                );
                x86::exit(status::FAILED)
            }
            enable();
            true
        }
        _ => bad_parameter(PARAM),
    }
}

/// Interrupt counts at one moment, to tell afterwards how many interrupts KVM completed.
#[derive(Clone, Copy)]
pub struct Tally {
    irqs: u32,
    lapic_eois: u32,
}

impl Tally {
    pub fn now() -> Tally {
        Tally { irqs: boot::irq_count(), lapic_eois: boot::pv_eoi_fallbacks() }
    }

    /// Interrupts since `self` whose EOI KVM did (the handler found the flag set); 0 with PV
    /// EOI off.
    pub fn pv_eois_since(self) -> u64 {
        if !enabled() {
            return 0;
        }
        let now = Tally::now();
        let irqs = now.irqs.wrapping_sub(self.irqs);
        let lapic_eois = now.lapic_eois.wrapping_sub(self.lapic_eois);
        irqs.saturating_sub(lapic_eois) as u64
    }
}
