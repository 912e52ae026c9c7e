//! A device interrupt raised by the VMM itself, with the KVM_IRQ_LINE ioctl, rather than through
//! an irqfd.
//!
//! KVM injects an irqfd routed to the IOAPIC from a kernel worker on the CPU that wrote the
//! eventfd, not in the writer's context (only MSI routes are injected at once). The writer is an
//! IOCore that spins on its core, or a vCPU thread that goes straight back into the guest, so
//! that worker waited for the core and interrupts came late and merged (docs/tuning.md).
//! KVM_IRQ_LINE delivers in the caller's own system call.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use kvm_ioctls::VmFd;
use virtio::interrupt::Trigger;

/// `_IOW(KVMIO, 0x61, struct kvm_irq_level)`.
const KVM_IRQ_LINE: u64 =
    (1 << 30) | ((std::mem::size_of::<kvm_bindings::kvm_irq_level>() as u64) << 16) | (0xae << 8) | 0x61;

/// One GSI of a VM, pulsed (raised, then lowered) for each interrupt: an edge on an IOAPIC pin.
pub struct IrqLine {
    /// A descriptor of the VM of its own, so the line stays usable for as long as it lives.
    vm: OwnedFd,
    gsi: u32,
}

impl IrqLine {
    /// The line for `gsi` of `vm`.
    pub fn new(vm: &VmFd, gsi: u32) -> io::Result<IrqLine> {
        // SAFETY: dup(2) of an open descriptor; the result is checked before it is owned.
        let fd = unsafe { libc::fcntl(vm.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor that nothing else owns.
        Ok(IrqLine { vm: unsafe { OwnedFd::from_raw_fd(fd) }, gsi })
    }

    fn set(&self, level: bool) {
        let irq_level = kvm_bindings::kvm_irq_level {
            __bindgen_anon_1: kvm_bindings::kvm_irq_level__bindgen_ty_1 { irq: self.gsi },
            level: u32::from(level),
        };
        // SAFETY: the descriptor is a KVM VM this IrqLine owns; KVM_IRQ_LINE reads a
        // kvm_irq_level, which lives on the stack for the call. It fails only for a GSI the VM
        // has no route for, when there is nothing to raise.
        unsafe { libc::ioctl(self.vm.as_raw_fd(), KVM_IRQ_LINE as _, &irq_level) };
    }
}

impl Trigger for IrqLine {
    fn trigger(&self) {
        self.set(true);
        self.set(false);
    }
}
