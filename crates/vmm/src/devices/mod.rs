//! Legacy and test devices on the vCPU exit path, and the bus that routes exits to them.

pub mod console;
pub mod irq_line;
pub mod serial;
pub mod testdev;
pub mod vhost_user;
pub mod virtio;

use std::sync::Mutex;

use serial::Com1;
use testdev::TestDevice;
use virtio::VirtioDevices;

/// QEMU's isa-debug-exit port: a write of V ends the VM with status V.
pub const DEBUG_EXIT_PORT: u16 = 0xf4;

/// What the vCPU loop should do after a device handled an exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Continue,
    /// The guest asked for a statistics snapshot with this label (test device).
    Mark(u32),
    /// The guest wrote this status to the debug-exit port.
    GuestExit(u8),
}

/// The devices reached through port I/O and MMIO exits.
pub struct Bus {
    pub serial: Mutex<Com1>,
    /// The test device, in a VM that asked for it.
    pub testdev: Option<TestDevice>,
    pub virtio: VirtioDevices,
}

impl Bus {
    pub fn pio_write(&self, port: u16, data: &[u8]) -> Action {
        match port {
            DEBUG_EXIT_PORT => data.first().map_or(Action::Continue, |&v| Action::GuestExit(v)),
            _ if serial::owns(port) => {
                if let Some(&byte) = data.first() {
                    lock(&self.serial).write(port, byte);
                }
                Action::Continue
            }
            _ => Action::Continue,
        }
    }

    pub fn pio_read(&self, port: u16, data: &mut [u8]) {
        if serial::owns(port) && !data.is_empty() {
            data[0] = lock(&self.serial).read(port);
            data[1..].fill(0);
        } else {
            // Nothing there: an open bus reads as all ones.
            data.fill(0xff);
        }
    }

    pub fn mmio_write(&self, addr: u64, data: &[u8]) -> Action {
        if let Some(testdev) = self.testdev.as_ref().filter(|t| t.owns(addr)) {
            return testdev.write(addr, data);
        }
        if let Some(slot) = self.virtio.slots.iter().find(|s| s.owns(addr)) {
            lock(&slot.transport).write(addr - slot.base, data);
        }
        Action::Continue
    }

    pub fn mmio_read(&self, addr: u64, data: &mut [u8]) {
        match self.virtio.slots.iter().find(|s| s.owns(addr)) {
            Some(slot) => lock(&slot.transport).read(addr - slot.base, data),
            None => data.fill(0),
        }
    }
}

/// Lock a device, recovering it if another vCPU thread panicked while holding it: device state
/// is plain data, and one vCPU's crash must not wedge the others.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
