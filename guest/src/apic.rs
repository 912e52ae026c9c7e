//! The local APIC and the IOAPIC, programmed from ring 3 through their MMIO pages (the identity
//! map makes them user-accessible). The in-kernel irqchip handles each access as an exit.

use crate::x86::mmio_write32;

const LAPIC_BASE: u64 = 0xfee0_0000;
const LAPIC_SVR: u64 = 0xf0;
const IOAPIC_BASE: u64 = 0xfec0_0000;
const IOAPIC_REGSEL: u64 = 0x00;
const IOAPIC_WINDOW: u64 = 0x10;

/// Software-enable the local APIC (spurious vector 0xff).
pub fn enable_lapic() {
    mmio_write32(LAPIC_BASE + LAPIC_SVR, 0x1ff);
}

/// Route IOAPIC input `pin` to `vector` on APIC 0: fixed delivery, edge-triggered, unmasked.
pub fn route_ioapic_pin(pin: u32, vector: u8) {
    let entry = 0x10 + 2 * pin;
    mmio_write32(IOAPIC_BASE + IOAPIC_REGSEL, entry + 1);
    mmio_write32(IOAPIC_BASE + IOAPIC_WINDOW, 0); // destination APIC ID 0
    mmio_write32(IOAPIC_BASE + IOAPIC_REGSEL, entry);
    mmio_write32(IOAPIC_BASE + IOAPIC_WINDOW, vector as u32);
}
