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
    pub regs: Raw<kvm_regs>,
    pub sregs: Raw<kvm_sregs>,
    /// (index, value) of each MSR KVM listed and let us read.
    pub msrs: Vec<(u32, u64)>,
    pub lapic: Raw<kvm_lapic_state>,
    /// FPU, SSE and AVX state (KVM_GET_XSAVE, the legacy 4 KiB area).
    pub xsave: Raw<kvm_xsave>,
    pub events: Raw<kvm_vcpu_events>,
    pub xcrs: Raw<kvm_xcrs>,
    pub mp_state: Raw<kvm_mp_state>,
    pub debugregs: Raw<kvm_debugregs>,
}

fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> SnapshotError {
    move |source| SnapshotError::Kvm { what, source }
}

impl VcpuState {
    /// Read vCPU `index`'s state; `msr_list` is what KVM_GET_MSR_INDEX_LIST reported. An MSR KVM
    /// lists but will not read back is left out (KVM_GET_MSRS stops at the first it refuses).
    pub fn capture(fd: &VcpuFd, index: u8, msr_list: &[u32]) -> Result<VcpuState, SnapshotError> {
        // MSRs first: reading the TSC before the rest keeps it closest to where the guest stopped.
        let mut msrs = Vec::with_capacity(msr_list.len());
        let mut rest = msr_list;
        while !rest.is_empty() {
            let entries: Vec<_> =
                rest.iter().map(|&index| kvm_msr_entry { index, ..Default::default() }).collect();
            let mut batch = Msrs::from_entries(&entries).map_err(|_| SnapshotError::TooMany("MSRs"))?;
            let read = fd.get_msrs(&mut batch).map_err(kvm("read MSRs"))?;
            msrs.extend(batch.as_slice()[..read].iter().map(|e| (e.index, e.data)));
            // Skip the one it refused.
            rest = rest.get(read + 1..).unwrap_or_default();
        }
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
