//! The device-to-driver interrupt: the transport's InterruptStatus bits plus an irqfd.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

/// InterruptStatus bits (virtio-mmio).
pub const INT_USED_BUFFER: u32 = 1;
pub const INT_CONFIG_CHANGE: u32 = 2;

/// What raises a device's interrupt in the guest: an irqfd (an eventfd KVM listens to), or a
/// line the VMM drives itself.
pub trait Trigger: Send + Sync {
    fn trigger(&self);
}

impl Trigger for EventFd {
    fn trigger(&self) {
        // Fails only if the counter would overflow, when the interrupt is pending anyway.
        let _ = self.write(1);
    }
}

#[derive(Clone)]
pub struct InterruptLine {
    status: Arc<AtomicU32>,
    /// Raises the device's interrupt; `None` in unit tests that only look at the status bits.
    irq: Option<Arc<dyn Trigger>>,
}

impl InterruptLine {
    pub fn new(status: Arc<AtomicU32>, irq: Option<Arc<dyn Trigger>>) -> Self {
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
            irq.trigger();
        }
    }
}
