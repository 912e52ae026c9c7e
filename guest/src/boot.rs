//! PVH entry, long mode, GDT/TSS/IDT and the drop to ring 3.
//!
//! On this host KVM emulates guest ring-0 code one instruction at a time (~1.5 µs each), so the
//! ring-0 path is kept to a few dozen instructions: the page tables and the GDT are built by the
//! assembler, the IDT is filled in by ring 3 (all memory is user-accessible), and the workload
//! runs in ring 3 (port I/O through the TSS bitmap; no `cli`/`sti`). Ring 3 enters ring 0 only
//! through exceptions and interrupts: this host's KVM turns `int n` from ring 3 into #UD, so the
//! one ring-0 service, [`wrmsr`], is reached through a `ud2` (see there).

use core::arch::global_asm;
use core::sync::atomic::{AtomicU32, Ordering};

/// The kernel code selector of the GDT below, for interrupt gates.
const KERNEL_CODE_SELECTOR: u16 = 0x08;

global_asm!(
    r#"
    /* XEN_ELFNOTE_PHYS32_ENTRY: where a PVH loader jumps, in 32-bit protected mode. */
    .section .note.Xen, "a"
    .balign 4
    .long 4
    .long 4
    .long 18
    .asciz "Xen"
    .balign 4
    .long pvh_start32
    .balign 4

    .section .text.boot, "ax"
    .code32
    .global pvh_start32
pvh_start32:
    cli
    movl %ebx, %esi                 /* hvm_start_info, handed to ring 3 */
    movl $pml4, %eax
    movl %eax, %cr3
    movl $0x20, %eax                /* CR4.PAE */
    movl %eax, %cr4
    movl $0xC0000080, %ecx          /* EFER.LME */
    rdmsr
    orl $0x100, %eax
    wrmsr
    movl $0x80010033, %eax          /* PG | WP | NE | ET | MP | PE */
    movl %eax, %cr0
    lgdt gdt_ptr
    ljmp $0x08, $long_mode

    .code64
long_mode:
    movw $0x10, %ax
    movw %ax, %ds
    movw %ax, %es
    movw %ax, %ss
    movw %ax, %fs
    movw %ax, %gs
    movq $kernel_stack_top, %rsp
    movq $tss, %rax                 /* TSS base into its descriptor */
    movw %ax, gdt_tss + 2
    shrq $16, %rax
    movb %al, gdt_tss + 4
    movb %ah, gdt_tss + 7
    movw $0x28, %ax
    ltr %ax
    lidt idt_ptr
    pushq $0x23                     /* ss: user data */
    pushq $user_stack_top           /* rsp */
    pushq $0x3202                   /* rflags: IF (IOPL 3 asked, 0 granted here) */
    pushq $0x1b                     /* cs: user code */
    pushq $probe_main               /* rip */
    movl %esi, %edi
    iretq

    /* Exception entry stubs, 16 bytes apart; the IDT is filled by ring 3 from their address. */
    .section .text
    .balign 16
    .global exception_stubs
exception_stubs:
    .set vector, 0
    .rept 32
    .balign 16
    .if (vector == 8) || ((vector >= 10) && (vector <= 14)) || (vector == 17) || (vector == 21) || (vector == 29) || (vector == 30)
    pushq $vector
    .else
    pushq $0
    pushq $vector
    .endif
    jmp exception_common
    .set vector, vector + 1
    .endr
exception_common:
    movq %rsp, %rdi
    subq $8, %rsp
    call exception_handler

    /* Counts an interrupt and ends it at the LAPIC. Six ring-0 instructions: on this host each
       is emulated, so interrupt handlers stay this small. */
    .global irq_count_handler
irq_count_handler:
    pushq %rax
    incl irq_counter
    movl $0xfee000b0, %eax          /* LAPIC EOI register */
    movl $0, (%rax)
    popq %rax
    iretq

    /* The same with KVM's paravirtual EOI on (MSR_KVM_PV_EOI_EN points at pv_eoi_flag). When
       KVM injected the interrupt with bit 0 of the flag set, clearing the bit is the EOI: KVM
       completes the interrupt itself at its next exit. Four instructions, no LAPIC access.
       Otherwise the LAPIC EOI as above, counted in pv_eoi_lapic_eois (always, on this host's
       kvm_pvm: see pv_eoi.rs). A plain btr, as Linux's kvm_guest_apic_eoi_write: KVM writes the
       flag only for and from this vCPU. */
    .global irq_pv_eoi_handler
irq_pv_eoi_handler:
    incl irq_counter
    btrl $0, pv_eoi_flag
    jnc 1f
    iretq
1:  incl pv_eoi_lapic_eois
    pushq %rax
    movl $0xfee000b0, %eax
    movl $0, (%rax)
    popq %rax
    iretq

    /* #UD handler while `wrmsr()` runs: wrmsr with ECX = MSR, EDX:EAX = value, then resume
       after the ud2 that raised it. Three ring-0 instructions. */
    .global wrmsr_service
wrmsr_service:
    wrmsr
    addq $2, (%rsp)
    iretq

    .section .data
    .balign 16
gdt:
    .quad 0
    .quad 0x00af9b000000ffff        /* 0x08 kernel code, 64-bit */
    .quad 0x00cf93000000ffff        /* 0x10 kernel data */
    .quad 0x00affb000000ffff        /* 0x18 user code, 64-bit */
    .quad 0x00cff3000000ffff        /* 0x20 user data */
gdt_tss:
    .quad 0x0000890000002068        /* 0x28 TSS with I/O bitmap, base patched at boot */
    .quad 0
gdt_end:
gdt_ptr:
    .word gdt_end - gdt - 1
    .quad gdt
idt_ptr:
    .word 256 * 16 - 1
    .quad idt
    .balign 16
tss:
    .long 0
    .quad kernel_stack_top          /* rsp0: stack for interrupts from ring 3 */
    .fill 0x66 - 12, 1, 0
    .word 0x68                      /* I/O bitmap offset */
    /* Every port allowed to ring 3. IOPL 3 alone is not enough here: this host's KVM keeps a
       ring-3 guest's IOPL at 0 and checks port access against this bitmap instead. */
    .fill 8192, 1, 0
    .byte 0xff

    /* Identity map of the first 4 GiB with 2 MiB pages, user-accessible; 3-4 GiB (device
       MMIO) uncached. */
    .section .data.pagetables, "aw"
    .balign 4096
pml4:
    .quad pdpt + 0x7
    .fill 511, 8, 0
pdpt:
    .quad pd + 0x7
    .quad pd + 0x1000 + 0x7
    .quad pd + 0x2000 + 0x7
    .quad pd + 0x3000 + 0x7
    .fill 508, 8, 0
pd:
    .set page, 0
    .rept 1536
    .quad (page << 21) | 0x87
    .set page, page + 1
    .endr
    .rept 512
    .quad (page << 21) | 0x9f
    .set page, page + 1
    .endr

    .section .bss
    .balign 64
    .global irq_counter
irq_counter:
    .long 0
    .balign 64
    .global pv_eoi_flag
pv_eoi_flag:                        /* KVM's PV EOI word: bit 0 set = KVM will do the EOI */
    .long 0
    .global pv_eoi_lapic_eois
pv_eoi_lapic_eois:                  /* interrupts irq_pv_eoi_handler ended at the LAPIC */
    .long 0
    .balign 4096
    .global idt
idt:
    .fill 256 * 16, 1, 0
    .balign 16
    .fill 16384, 1, 0
kernel_stack_top:
    .fill 65536, 1, 0
user_stack_top:
"#,
    options(att_syntax)
);

/// Invalid opcode, the exception [`wrmsr`] enters ring 0 by.
const UD_VECTOR: u8 = 6;
/// Bytes between two entry stubs of `exception_stubs`.
const STUB_SIZE: u64 = 16;

extern "C" {
    static exception_stubs: u8;
    static mut idt: [u64; 512];
    static irq_count_handler: u8;
    static irq_pv_eoi_handler: u8;
    static wrmsr_service: u8;
    static irq_counter: AtomicU32;
    static pv_eoi_flag: AtomicU32;
    static pv_eoi_lapic_eois: AtomicU32;
}

/// Interrupts taken by [`irq_handler_address`] so far.
pub fn irq_count() -> u32 {
    // SAFETY: `irq_counter` is a 4-byte-aligned word in .bss, only ever accessed atomically.
    unsafe { irq_counter.load(Ordering::Acquire) }
}

/// Interrupts the PV EOI handler had to end with a LAPIC EOI write (KVM had not set the flag).
pub fn pv_eoi_fallbacks() -> u32 {
    // SAFETY: as in `irq_count`.
    unsafe { pv_eoi_lapic_eois.load(Ordering::Acquire) }
}

/// Guest-physical address of the PV EOI flag word (4-byte aligned, as KVM requires).
pub fn pv_eoi_flag_address() -> u64 {
    core::ptr::addr_of!(pv_eoi_flag) as u64
}

/// The ring-0 interrupt handler the device drivers install: it counts the interrupt and ends
/// it, with KVM's paravirtual EOI when [`crate::pv_eoi::enabled`], else at the LAPIC.
pub fn irq_handler_address() -> u64 {
    if crate::pv_eoi::enabled() {
        core::ptr::addr_of!(irq_pv_eoi_handler) as u64
    } else {
        core::ptr::addr_of!(irq_count_handler) as u64
    }
}

/// Write `value` to `msr` from ring 3, which cannot run wrmsr: point the #UD gate at the
/// ring-0 `wrmsr_service`, raise #UD with `ud2`, and put the gate back. (A DPL-3 `int $0x80`
/// gate would be the usual way, but this host's KVM turns any `int n` from ring 3 into #UD.)
/// An MSR the hypervisor refuses raises #GP in ring 0, which the exception handler reports
/// (status CRASH).
pub fn wrmsr(msr: u32, value: u64) {
    set_interrupt_gate(UD_VECTOR, core::ptr::addr_of!(wrmsr_service) as u64);
    // SAFETY: the `ud2` enters `wrmsr_service` in ring 0, which writes the MSR and returns
    // after the `ud2` with every register as it was; the frame goes on the kernel stack from
    // the TSS, not on ours.
    unsafe {
        core::arch::asm!(
            "ud2",
            in("ecx") msr,
            in("eax") value as u32,
            in("edx") (value >> 32) as u32,
            options(nostack)
        )
    }
    set_interrupt_gate(UD_VECTOR, exception_stub(UD_VECTOR));
}

/// The entry stub that reports exception `vector`.
fn exception_stub(vector: u8) -> u64 {
    core::ptr::addr_of!(exception_stubs) as u64 + vector as u64 * STUB_SIZE
}

/// What the CPU and the entry stub pushed for an exception.
#[repr(C)]
pub struct ExceptionFrame {
    pub vector: u64,
    pub error_code: u64,
    pub rip: u64,
    pub cs: u64,
    pub rflags: u64,
    pub rsp: u64,
    pub ss: u64,
}

/// An interrupt-gate descriptor for `handler`, callable from ring `dpl`.
fn gate(handler: u64, dpl: u64) -> (u64, u64) {
    let low = (handler & 0xffff)
        | ((KERNEL_CODE_SELECTOR as u64) << 16)
        | ((0x8e | (dpl << 5)) << 40)
        | (((handler >> 16) & 0xffff) << 48);
    (low, handler >> 32)
}

/// Point `vector` at `handler` (ring 0 code). Runs in ring 3: the IDT is ordinary memory.
pub fn set_interrupt_gate(vector: u8, handler: u64) {
    let (low, high) = gate(handler, 0);
    // SAFETY: the IDT is a static table of 256 16-byte entries; `vector` indexes within it and
    // the writes are volatile because the CPU, not Rust, reads the table.
    unsafe {
        let entry = core::ptr::addr_of_mut!(idt).cast::<u64>().add(vector as usize * 2);
        entry.write_volatile(low);
        entry.add(1).write_volatile(high);
    }
}

/// Install the 32 exception handlers.
pub fn install_exception_handlers() {
    for vector in 0..32u8 {
        set_interrupt_gate(vector, exception_stub(vector));
    }
}

/// Empty the IDT: the next exception then triple-faults the VM (used by `triplefault`).
pub fn clear_idt() {
    for vector in 0..=255u8 {
        // SAFETY: as in `set_interrupt_gate`.
        unsafe {
            let entry = core::ptr::addr_of_mut!(idt).cast::<u64>().add(vector as usize * 2);
            entry.write_volatile(0);
            entry.add(1).write_volatile(0);
        }
    }
}

/// Ring 0: report an unexpected exception and end the VM.
#[no_mangle]
extern "C" fn exception_handler(frame: &ExceptionFrame) -> ! {
    crate::println!(
        "{{\"probe\":\"exception\",\"vector\":{},\"error_code\":{},\"rip\":\"{:#x}\",\"cs\":\"{:#x}\",\"rflags\":\"{:#x}\"}}",
        frame.vector,
        frame.error_code,
        frame.rip,
        frame.cs,
        frame.rflags
    );
    crate::x86::exit(probe_abi::status::CRASH)
}
