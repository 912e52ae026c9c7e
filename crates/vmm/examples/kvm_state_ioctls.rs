//! Which vCPU and VM state ioctls this host's KVM accepts: each GET, then the SET of what it
//! returned, on a fresh VM with an in-kernel irqchip (as `Vm::new` builds it).
//! `cargo run --release -p vmm --example kvm_state_ioctls`

use kvm_bindings::{
    kvm_irqchip, kvm_msr_entry, kvm_pit_config, Msrs, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER,
};
use kvm_ioctls::Kvm;

fn report<T, E: std::fmt::Display>(what: &str, result: Result<T, E>) -> Option<T> {
    match result {
        Ok(value) => {
            println!("{what}: ok");
            Some(value)
        }
        Err(e) => {
            println!("{what}: REFUSED ({e})");
            None
        }
    }
}

fn main() {
    let kvm = Kvm::new().expect("open /dev/kvm");
    let vm = kvm.create_vm().expect("create a VM");
    vm.create_irq_chip().expect("irqchip");
    let vcpu = vm.create_vcpu(0).expect("vCPU");
    vcpu.set_cpuid2(&kvm.get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES).unwrap()).unwrap();

    if let Some(r) = report("KVM_GET_REGS", vcpu.get_regs()) {
        report("KVM_SET_REGS", vcpu.set_regs(&r));
    }
    if let Some(s) = report("KVM_GET_SREGS", vcpu.get_sregs()) {
        report("KVM_SET_SREGS", vcpu.set_sregs(&s));
    }
    if let Some(f) = report("KVM_GET_FPU", vcpu.get_fpu()) {
        report("KVM_SET_FPU", vcpu.set_fpu(&f));
    }
    if let Some(list) = report("KVM_GET_MSR_INDEX_LIST", kvm.get_msr_index_list()) {
        println!("  {} MSRs listed", list.as_slice().len());
        let entries: Vec<_> =
            list.as_slice().iter().map(|&index| kvm_msr_entry { index, ..Default::default() }).collect();
        let mut msrs = Msrs::from_entries(&entries).unwrap();
        if let Some(n) = report("KVM_GET_MSRS (all listed)", vcpu.get_msrs(&mut msrs)) {
            println!("  read {n} of {}", entries.len());
            if n < entries.len() {
                println!("  first unreadable: {:#x}", entries[n].index);
            }
            let ok = Msrs::from_entries(&msrs.as_slice()[..n]).unwrap();
            if let Some(w) = report("KVM_SET_MSRS", vcpu.set_msrs(&ok)) {
                println!("  wrote {w} of {n}");
                if w < n {
                    println!("  first unwritable: {:#x}", ok.as_slice()[w].index);
                }
            }
        }
        // Which single MSRs cannot be read or written back.
        let mut unreadable = Vec::new();
        let mut unwritable = Vec::new();
        for &index in list.as_slice() {
            let mut one = Msrs::from_entries(&[kvm_msr_entry { index, ..Default::default() }]).unwrap();
            match vcpu.get_msrs(&mut one) {
                Ok(1) => {
                    if vcpu.set_msrs(&one) != Ok(1) {
                        unwritable.push(index);
                    }
                }
                _ => unreadable.push(index),
            }
        }
        println!("  unreadable one by one: {unreadable:x?}");
        println!("  unwritable one by one: {unwritable:x?}");
    }
    if let Some(l) = report("KVM_GET_LAPIC", vcpu.get_lapic()) {
        report("KVM_SET_LAPIC", vcpu.set_lapic(&l));
    }
    if let Some(x) = report("KVM_GET_XSAVE", vcpu.get_xsave()) {
        // SAFETY: the buffer is the one KVM_GET_XSAVE filled, of the legacy 4 KiB size.
        report("KVM_SET_XSAVE", unsafe { vcpu.set_xsave(&x) });
    }
    if let Some(e) = report("KVM_GET_VCPU_EVENTS", vcpu.get_vcpu_events()) {
        report("KVM_SET_VCPU_EVENTS", vcpu.set_vcpu_events(&e));
    }
    if let Some(x) = report("KVM_GET_XCRS", vcpu.get_xcrs()) {
        report("KVM_SET_XCRS", vcpu.set_xcrs(&x));
    }
    if let Some(m) = report("KVM_GET_MP_STATE", vcpu.get_mp_state()) {
        report("KVM_SET_MP_STATE", vcpu.set_mp_state(m));
    }
    if let Some(d) = report("KVM_GET_DEBUGREGS", vcpu.get_debug_regs()) {
        report("KVM_SET_DEBUGREGS", vcpu.set_debug_regs(&d));
    }
    if let Some(t) = report("KVM_GET_TSC_KHZ", vcpu.get_tsc_khz()) {
        println!("  {t} kHz");
        report("KVM_SET_TSC_KHZ (same)", vcpu.set_tsc_khz(t));
    }
    if let Some(c) = report("KVM_GET_CLOCK", vm.get_clock()) {
        println!("  flags {:#x}", c.flags);
        let mut c = c;
        c.flags = 0;
        report("KVM_SET_CLOCK", vm.set_clock(&c));
    }
    for (name, id) in [("PIC master", KVM_IRQCHIP_PIC_MASTER), ("IOAPIC", KVM_IRQCHIP_IOAPIC)] {
        let mut chip = kvm_irqchip { chip_id: id, ..Default::default() };
        if report(&format!("KVM_GET_IRQCHIP {name}"), vm.get_irqchip(&mut chip)).is_some() {
            report(&format!("KVM_SET_IRQCHIP {name}"), vm.set_irqchip(&chip));
        }
    }
    if report("KVM_CREATE_PIT2", vm.create_pit2(kvm_pit_config::default())).is_some() {
        if let Some(p) = report("KVM_GET_PIT2", vm.get_pit2()) {
            report("KVM_SET_PIT2", vm.set_pit2(&p));
        }
    }
    let mut run = vcpu;
    run.set_kvm_immediate_exit(1);
    println!("KVM_RUN with immediate_exit: {:?}", run.run().map(|_| ()).map_err(|e| e.errno()));
}
