//! The device-to-driver interrupt: the transport's InterruptStatus bits plus an irqfd.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

/// InterruptStatus bits (virtio-mmio).
pub const INT_USED_BUFFER: u32 = 1;
pub const INT_CONFIG_CHANGE: u32 = 2;

#[derive(Clone)]
pub struct InterruptLine {
    status: Arc<AtomicU32>,
    /// Raises the device's interrupt (an irqfd registered with KVM); `None` in unit tests that
    /// only look at the status bits.
    irq: Option<Arc<EventFd>>,
}

impl InterruptLine {
    pub fn new(status: Arc<AtomicU32>, irq: Option<Arc<EventFd>>) -> Self {
        InterruptLine { status, irq }
    }

    pub fn signal_used_buffer(&self) {
        self.signal(INT_USED_BUFFER);
    }

    pub fn signal_config_change(&self) {
        self.signal(INT_CONFIG_CHANGE);
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
            // Fails only if the counter would overflow, when the interrupt is pending anyway.
            let _ = irq.write(1);
        }
    }
}
