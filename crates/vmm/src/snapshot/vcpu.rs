//! One vCPU's state as KVM exposes it: read when the vCPU parks (pause), written into a new
//! vCPU on restore.

use kvm_bindings::{
    kvm_debugregs, kvm_lapic_state, kvm_mp_state, kvm_msr_entry, kvm_regs, kvm_sregs, kvm_vcpu_events,
    kvm_xcrs, kvm_xsave, Msrs,
};
use kvm_ioctls::VcpuFd;
use serde::{Deserialize, Serialize};

use super::raw::Raw;
use super::SnapshotError;

/// The most MSRs a snapshot may carry (KVM lists a few hundred at most).
pub const MAX_MSRS: usize = 1024;

/// A vCPU's registers, MSRs, local APIC, extended state and pending events.
#[derive(Clone, Serialize, Deserialize)]
pub struct VcpuState {
    /// The vCPU's index (its APIC ID).
    pub index: u8,
    /// General-purpose registers, RIP and RFLAGS (KVM_GET_REGS).
    pub regs: Raw<kvm_regs>,
    /// Segment, control and descriptor-table registers, EFER and the APIC base (KVM_GET_SREGS).
    pub sregs: Raw<kvm_sregs>,
    /// (index, value) of each MSR KVM lists as saveable (KVM_GET_MSR_INDEX_LIST): all of them.
    pub msrs: Vec<(u32, u64)>,
    /// The local APIC's registers (KVM_GET_LAPIC).
    pub lapic: Raw<kvm_lapic_state>,
    /// FPU, SSE and AVX state (KVM_GET_XSAVE, the legacy 4 KiB area).
    pub xsave: Raw<kvm_xsave>,
    /// Pending exceptions, interrupts and NMIs, and interrupt shadows (KVM_GET_VCPU_EVENTS).
    pub events: Raw<kvm_vcpu_events>,
    /// Extended control registers, XCR0 (KVM_GET_XCRS).
    pub xcrs: Raw<kvm_xcrs>,
    /// Running, halted or waiting for INIT/SIPI (KVM_GET_MP_STATE).
    pub mp_state: Raw<kvm_mp_state>,
    /// The debug registers DR0-DR3, DR6 and DR7 (KVM_GET_DEBUGREGS).
    pub debugregs: Raw<kvm_debugregs>,
}

fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> SnapshotError {
    move |source| SnapshotError::Kvm { what, source }
}

impl VcpuState {
    /// Read vCPU `index`'s state; `msr_list` is what KVM_GET_MSR_INDEX_LIST reported, and every
    /// MSR in it is saved: one KVM will not read fails the capture, naming it (as Firecracker
    /// does), rather than leave a restored guest with a register silently reset.
    pub fn capture(fd: &VcpuFd, index: u8, msr_list: &[u32]) -> Result<VcpuState, SnapshotError> {
        // MSRs first: reading the TSC before the rest keeps it closest to where the guest stopped.
        let entries: Vec<_> =
            msr_list.iter().map(|&index| kvm_msr_entry { index, ..Default::default() }).collect();
        let mut batch = Msrs::from_entries(&entries).map_err(|_| SnapshotError::TooMany("MSRs"))?;
        let read = fd.get_msrs(&mut batch).map_err(kvm("read MSRs"))?;
        if let Some(refused) = entries.get(read) {
            return Err(SnapshotError::MsrUnreadable { vcpu: index, msr: refused.index });
        }
        let msrs = batch.as_slice().iter().map(|e| (e.index, e.data)).collect();
        Ok(VcpuState {
            index,
            regs: Raw(fd.get_regs().map_err(kvm("read registers"))?),
            sregs: Raw(fd.get_sregs().map_err(kvm("read special registers"))?),
            msrs,
            lapic: Raw(fd.get_lapic().map_err(kvm("read the local APIC"))?),
            xsave: Raw(fd.get_xsave().map_err(kvm("read the XSAVE area"))?),
            events: Raw(fd.get_vcpu_events().map_err(kvm("read vCPU events"))?),
            xcrs: Raw(fd.get_xcrs().map_err(kvm("read XCRs"))?),
            mp_state: Raw(fd.get_mp_state().map_err(kvm("read the MP state"))?),
            debugregs: Raw(fd.get_debug_regs().map_err(kvm("read debug registers"))?),
        })
    }

    /// Write the state into a new vCPU (same CPUID as the one it was read from). The order is
    /// KVM's: special registers before MSRs (EFER), MSRs before the local APIC (APIC base),
    /// events last.
    pub fn apply(&self, fd: &VcpuFd) -> Result<(), SnapshotError> {
        if self.msrs.len() > MAX_MSRS {
            return Err(SnapshotError::TooMany("MSRs"));
        }
        fd.set_sregs(&self.sregs.0).map_err(kvm("set special registers"))?;
        fd.set_regs(&self.regs.0).map_err(kvm("set registers"))?;
        // SAFETY: `xsave` is a whole kvm_xsave of the legacy size, which is what KVM_SET_XSAVE
        // reads; KVM checks its contents (reserved bits) and refuses what is invalid.
        unsafe { fd.set_xsave(&self.xsave.0) }.map_err(kvm("set the XSAVE area"))?;
        fd.set_xcrs(&self.xcrs.0).map_err(kvm("set XCRs"))?;
        let entries: Vec<_> = self
            .msrs
            .iter()
            .map(|&(index, data)| kvm_msr_entry { index, data, ..Default::default() })
            .collect();
        let msrs = Msrs::from_entries(&entries).map_err(|_| SnapshotError::TooMany("MSRs"))?;
        let written = fd.set_msrs(&msrs).map_err(kvm("set MSRs"))?;
        if written != entries.len() {
            return Err(SnapshotError::MsrRefused { vcpu: self.index, msr: entries[written].index });
        }
        fd.set_lapic(&self.lapic.0).map_err(kvm("set the local APIC"))?;
        fd.set_debug_regs(&self.debugregs.0).map_err(kvm("set debug registers"))?;
        fd.set_mp_state(self.mp_state.0).map_err(kvm("set the MP state"))?;
        fd.set_vcpu_events(&self.events.0).map_err(kvm("set vCPU events"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vCPU of a new VM with KVM's supported CPUID.
    fn vcpu() -> (kvm_ioctls::Kvm, kvm_ioctls::VmFd, VcpuFd) {
        let kvm = kvm_ioctls::Kvm::new().expect("open /dev/kvm");
        let vm = kvm.create_vm().expect("create a VM");
        vm.create_irq_chip().expect("create the irqchip");
        let vcpu = vm.create_vcpu(0).expect("create a vCPU");
        let cpuid = kvm.get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES).expect("supported CPUID");
        vcpu.set_cpuid2(&cpuid).expect("set CPUID");
        (kvm, vm, vcpu)
    }

    #[test]
    fn every_msr_kvm_lists_is_saved() {
        let (kvm, _vm, fd) = vcpu();
        let list = kvm.get_msr_index_list().expect("KVM's MSR list");
        let state = VcpuState::capture(&fd, 0, list.as_slice()).expect("capture");
        let saved: Vec<u32> = state.msrs.iter().map(|&(index, _)| index).collect();
        assert_eq!(saved, list.as_slice());
    }

    /// An MSR KVM will not read (here one no CPU has) fails the capture, named; it used to be
    /// left out of the snapshot without a word.
    #[test]
    fn an_msr_kvm_will_not_read_fails_the_snapshot_and_is_named() {
        let (kvm, _vm, fd) = vcpu();
        let mut list = kvm.get_msr_index_list().expect("KVM's MSR list").as_slice().to_vec();
        list.insert(1, 0x4b56_ffff);
        match VcpuState::capture(&fd, 0, &list) {
            Err(e @ SnapshotError::MsrUnreadable { vcpu: 0, msr: 0x4b56_ffff }) => {
                assert!(e.to_string().contains("0x4b56ffff"), "{e}");
            }
            Err(e) => panic!("another error: {e}"),
            Ok(state) => panic!("captured {} MSRs without the one KVM refused", state.msrs.len()),
        }
    }
}
