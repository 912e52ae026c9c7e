//! COM1, a 16550 UART (vm-superio) at I/O ports 0x3f8-0x3ff on IRQ 4.

use vm_superio::serial::NoEvents;
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use super::console::ConsoleWriter;

pub const COM1_BASE: u16 = 0x3f8;
pub const COM1_IRQ: u32 = 4;
const COM1_PORTS: u16 = 8;

pub fn owns(port: u16) -> bool {
    (COM1_BASE..COM1_BASE + COM1_PORTS).contains(&port)
}

/// Raises the UART's interrupt through an eventfd (an irqfd when the VM has an irqchip).
pub struct IrqTrigger(pub EventFd);

impl Trigger for IrqTrigger {
    type E = std::io::Error;

    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}

pub struct Com1 {
    uart: Serial<IrqTrigger, NoEvents, ConsoleWriter>,
}

impl Com1 {
    pub fn new(irq: EventFd, out: ConsoleWriter) -> Self {
        Com1 { uart: Serial::new(IrqTrigger(irq), out) }
    }

    pub fn write(&mut self, port: u16, value: u8) {
        // The only error is a failed interrupt trigger; the byte itself has been handled.
        let _ = self.uart.write((port - COM1_BASE) as u8, value);
    }

    pub fn read(&mut self, port: u16) -> u8 {
        self.uart.read((port - COM1_BASE) as u8)
    }
}
