//! CPUID for a vCPU: what KVM supports (including the KVM paravirtual leaves 0x4000_00xx), with
//! the per-vCPU APIC IDs filled in.

use kvm_bindings::{CpuId, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::Kvm;

/// CPUID leaf 1 ECX bit 31: running under a hypervisor.
const LEAF1_ECX_HYPERVISOR: u32 = 1 << 31;

/// KVM's supported CPUID table, once per VM.
pub fn supported(kvm: &Kvm) -> Result<CpuId, kvm_ioctls::Error> {
    kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
}

/// KVM_FEATURE_PV_EOI: CPUID 0x4000_0001 EAX bit 6.
const KVM_FEATURE_PV_EOI: u32 = 1 << 6;

/// Does KVM offer guests its paravirtual EOI?
pub fn has_pv_eoi(cpuid: &CpuId) -> bool {
    cpuid.as_slice().iter().any(|e| e.function == 0x4000_0001 && e.eax & KVM_FEATURE_PV_EOI != 0)
}

/// `base` specialised for vCPU `index` of `count`.
pub fn for_vcpu(base: &CpuId, index: u8, count: u8) -> CpuId {
    let mut cpuid = base.clone();
    for entry in cpuid.as_mut_slice() {
        match entry.function {
            1 => {
                entry.ebx = (entry.ebx & 0x0000_ffff) | ((index as u32) << 24) | ((count as u32) << 16);
                entry.ecx |= LEAF1_ECX_HYPERVISOR;
            }
            0xb | 0x1f => entry.edx = index as u32,
            _ => {}
        }
    }
    cpuid
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn includes_the_kvm_paravirtual_leaf() {
        let kvm = Kvm::new().expect("/dev/kvm");
        let cpuid = for_vcpu(&supported(&kvm).unwrap(), 1, 2);
        let signature = cpuid.as_slice().iter().find(|e| e.function == 0x4000_0000).unwrap();
        let bytes: Vec<u8> =
            [signature.ebx, signature.ecx, signature.edx].iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(&bytes[..9], b"KVMKVMKVM");
        let leaf1 = cpuid.as_slice().iter().find(|e| e.function == 1).unwrap();
        assert_eq!(leaf1.ebx >> 24, 1, "initial APIC ID of vCPU 1");
        assert_ne!(leaf1.ecx & LEAF1_ECX_HYPERVISOR, 0);
    }
}
