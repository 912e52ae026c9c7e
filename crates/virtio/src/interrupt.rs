//! The device-to-driver interrupt: the transport's InterruptStatus bits plus an irqfd.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

/// InterruptStatus bit 0 (virtio 1.x §4.2.2): the device put buffers in a used ring.
pub const INT_USED_BUFFER: u32 = 1;
/// InterruptStatus bit 1: the configuration changed, or the device needs a reset.
pub const INT_CONFIG_CHANGE: u32 = 2;

/// What raises a device's interrupt in the guest: an irqfd (an eventfd KVM listens to), or a
/// line the VMM drives itself.
pub trait Trigger: Send + Sync {
    /// Raise the interrupt in the guest; called from whichever thread serves the device.
    fn trigger(&self);
}

impl Trigger for EventFd {
    fn trigger(&self) {
        // Fails only if the counter would overflow, when the interrupt is pending anyway.
        let _ = self.write(1);
    }
}

/// A device's interrupt: its InterruptStatus bits, shared with the transport that shows them to
/// the driver, and what raises it. Clones share both.
#[derive(Clone)]
pub struct InterruptLine {
    status: Arc<AtomicU32>,
    /// Raises the device's interrupt; `None` in unit tests that only look at the status bits.
    irq: Option<Arc<dyn Trigger>>,
}

impl InterruptLine {
    /// A line that sets bits in `status` (the transport's InterruptStatus) and fires `irq`.
    pub fn new(status: Arc<AtomicU32>, irq: Option<Arc<dyn Trigger>>) -> Self {
        InterruptLine { status, irq }
    }

    /// Flag used buffers and interrupt the driver.
    pub(crate) fn signal_used_buffer(&self) {
        self.signal(INT_USED_BUFFER);
    }

    fn signal(&self, bit: u32) {
        self.raise_status(bit);
        self.fire();
    }

    /// Set `bit` in InterruptStatus without interrupting (yet): for a state change the driver
    /// must find already flagged when it sees it.
    pub fn raise_status(&self, bit: u32) {
        self.status.fetch_or(bit, Ordering::AcqRel);
    }

    /// Interrupt the driver.
    pub fn fire(&self) {
        if let Some(irq) = &self.irq {
            irq.trigger();
        }
    }
}
