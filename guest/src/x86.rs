//! The few x86 instructions the probe needs. Ring 3 may use the port ones: it runs with IOPL 3.

use core::arch::asm;

/// QEMU's isa-debug-exit port, also implemented by exitless.
const DEBUG_EXIT_PORT: u16 = 0xf4;

pub fn outb(port: u16, value: u8) {
    // SAFETY: port output has no memory effects on the guest; IOPL 3 allows it in ring 3.
    unsafe { asm!("out dx, al", in("dx") port, in("al") value, options(nomem, nostack, preserves_flags)) }
}

pub fn rdtsc() -> u64 {
    // SAFETY: RDTSC only reads the time-stamp counter.
    unsafe { core::arch::x86_64::_rdtsc() }
}

pub fn cpuid(leaf: u32, subleaf: u32) -> core::arch::x86_64::CpuidResult {
    core::arch::x86_64::__cpuid_count(leaf, subleaf)
}

/// KVM's paravirtual feature bits (CPUID 0x4000_0001 EAX); 0 when the hypervisor is not KVM.
pub fn kvm_features() -> u32 {
    let hv = cpuid(0x4000_0000, 0);
    // "KVMKVMKVM\0\0\0" in EBX, ECX, EDX.
    if [hv.ebx, hv.ecx, hv.edx] != [0x4b4d_564b, 0x564b_4d56, 0x4d] {
        return 0;
    }
    cpuid(0x4000_0001, 0).eax
}

/// Volatile MMIO write of a 32-bit value.
pub fn mmio_write32(addr: u64, value: u32) {
    // SAFETY: the caller passes a device address from the command line or the probe's own map;
    // the identity map covers the whole low 4 GiB, so the access is a page-table-valid store.
    unsafe { (addr as *mut u32).write_volatile(value) }
}

/// Volatile MMIO read of a 32-bit value.
pub fn mmio_read32(addr: u64) -> u32 {
    // SAFETY: as in `mmio_write32`: a page-table-valid load from a device address.
    unsafe { (addr as *const u32).read_volatile() }
}

/// Volatile MMIO read of one byte.
pub fn mmio_read8(addr: u64) -> u8 {
    // SAFETY: as in `mmio_write32`: a page-table-valid load from a device address.
    unsafe { (addr as *const u8).read_volatile() }
}

/// Volatile MMIO write of one byte.
pub fn mmio_write8(addr: u64, value: u8) {
    // SAFETY: as in `mmio_write32`.
    unsafe { (addr as *mut u8).write_volatile(value) }
}

/// Volatile MMIO write of a 64-bit value.
pub fn mmio_write64(addr: u64, value: u64) {
    // SAFETY: as in `mmio_write32`.
    unsafe { (addr as *mut u64).write_volatile(value) }
}

/// End the VM with `status` (exitless: the process status; QEMU: `(status << 1) | 1`).
/// Should the VMM ignore the port, an empty IDT and an invalid opcode triple-fault the VM.
pub fn exit(status: u8) -> ! {
    outb(DEBUG_EXIT_PORT, status);
    triple_fault()
}

pub fn triple_fault() -> ! {
    crate::boot::clear_idt();
    // SAFETY: deliberately raises #UD with no IDT entry, which shuts the VM down.
    unsafe { asm!("ud2", options(noreturn)) }
}
