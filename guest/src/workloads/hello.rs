//! `probe.workload=hello`: one JSON line with what the probe found.

use crate::json::Str;
use crate::{print, println, x86, Env};
use probe_abi::status;

/// KVM paravirtual feature bits (CPUID 0x4000_0001 EAX) and their names.
const KVM_FEATURES: &[(u32, &str)] = &[
    (0, "clocksource"),
    (1, "nop_io_delay"),
    (2, "mmu_op"),
    (3, "clocksource2"),
    (4, "async_pf"),
    (5, "steal_time"),
    (6, "pv_eoi"),
    (7, "pv_unhalt"),
    (9, "pv_tlb_flush"),
    (10, "async_pf_vmexit"),
    (11, "pv_send_ipi"),
    (12, "poll_control"),
    (13, "pv_sched_yield"),
    (14, "async_pf_int"),
    (15, "msi_ext_dest_id"),
    (16, "hc_map_gpa_range"),
    (17, "migration_control"),
    (24, "clocksource_stable"),
];

fn signature(words: [u32; 3]) -> [u8; 12] {
    let mut bytes = [0u8; 12];
    for (chunk, word) in bytes.chunks_exact_mut(4).zip(words) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    bytes
}

fn ascii(bytes: &[u8]) -> &str {
    let len = bytes.iter().position(|&b| b == 0 || !b.is_ascii_graphic()).unwrap_or(bytes.len());
    core::str::from_utf8(&bytes[..len]).unwrap_or("")
}

pub fn run(env: &Env) -> u8 {
    let leaf0 = x86::cpuid(0, 0);
    let vendor = signature([leaf0.ebx, leaf0.edx, leaf0.ecx]);
    let hv = x86::cpuid(0x4000_0000, 0);
    let hv_signature = signature([hv.ebx, hv.ecx, hv.edx]);
    let hv_name = ascii(&hv_signature);
    let kvm_features = x86::kvm_features();
    let cs: u16;
    // SAFETY: reading the code segment register has no side effects.
    unsafe { core::arch::asm!("mov {0:x}, cs", out(reg) cs, options(nomem, nostack)) };

    print!(
        "{{\"probe\":\"hello\",\"cpl\":{},\"ram_bytes\":{},\"cmdline\":{},\"cpu_vendor\":{},\"hypervisor\":{},\"kvm_features\":{},\"kvm_feature_names\":[",
        cs & 3,
        env.ram_bytes,
        Str(env.cmdline),
        Str(ascii(&vendor)),
        Str(hv_name),
        kvm_features
    );
    let mut first = true;
    for &(bit, name) in KVM_FEATURES {
        if kvm_features & (1 << bit) != 0 {
            print!("{}{}", if first { "" } else { "," }, Str(name));
            first = false;
        }
    }
    let rflags: u64;
    // SAFETY: pushfq/pop only reads the flags register through the stack.
    unsafe { core::arch::asm!("pushfq", "pop {0}", out(reg) rflags) };
    println!("],\"tsc_khz\":{},\"rflags\":{}}}", env.tsc_khz, rflags);
    status::OK
}
