//! The vCPU state the PVH boot protocol promises the kernel: 32-bit protected mode, flat
//! segments, paging off, %ebx pointing at `hvm_start_info`.

use kvm_bindings::{kvm_fpu, kvm_regs, kvm_segment, kvm_sregs};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::boot::{GDT_ADDR, START_INFO_ADDR};

const CR0_PE: u64 = 1;
const CODE_SELECTOR: u16 = 0x08;
const DATA_SELECTOR: u16 = 0x10;
const TSS_SELECTOR: u16 = 0x18;

/// Flat 32-bit GDT: null, code, data, TSS. The kernel loads its own before using segments; this
/// one only makes the hidden segment state below consistent with memory.
const GDT: [u64; 4] = [0, 0x00cf_9b00_0000_ffff, 0x00cf_9300_0000_ffff, 0x0000_8b00_0000_0067];

/// Write the boot GDT into guest memory.
pub fn write_gdt(mem: &GuestMemoryMmap) -> Result<(), vm_memory::GuestMemoryError> {
    for (i, entry) in GDT.iter().enumerate() {
        mem.write_obj(*entry, GuestAddress(GDT_ADDR + i as u64 * 8))?;
    }
    Ok(())
}

fn segment(selector: u16, type_: u8, s: u8) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_,
        present: 1,
        dpl: 0,
        db: 1,
        s,
        l: 0,
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// Special registers for PVH entry, starting from the vCPU's current ones.
pub fn pvh_sregs(mut sregs: kvm_sregs) -> kvm_sregs {
    sregs.cs = segment(CODE_SELECTOR, 0xb, 1);
    let data = segment(DATA_SELECTOR, 0x3, 1);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = kvm_segment { limit: 0x67, g: 0, db: 0, ..segment(TSS_SELECTOR, 0xb, 0) };
    sregs.gdt.base = GDT_ADDR;
    sregs.gdt.limit = (GDT.len() * 8 - 1) as u16;
    sregs.idt.base = 0;
    sregs.idt.limit = 0;
    sregs.cr0 = CR0_PE;
    sregs.cr3 = 0;
    sregs.cr4 = 0;
    sregs.efer = 0;
    sregs
}

/// General registers for PVH entry at `entry`.
pub fn pvh_regs(entry: GuestAddress) -> kvm_regs {
    kvm_regs { rip: entry.0, rbx: START_INFO_ADDR, rflags: 0x2, ..Default::default() }
}

/// The FPU state after reset (x87 control word, SSE control/status).
pub fn reset_fpu() -> kvm_fpu {
    kvm_fpu { fcw: 0x37f, mxcsr: 0x1f80, ..Default::default() }
}
