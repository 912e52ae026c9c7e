//! Completion by interrupt, as both drivers take it: the transport's IOAPIC pin is routed to a
//! vector whose ring-0 handler only counts, and the driver acknowledges the device's interrupt
//! status whenever that count has moved. With polled completion only the waiting is shared.

use super::mmio::Transport;
use super::queue::SplitQueue;
use super::{Completion, Error};
use crate::deadline::{Deadline, Spinner};
use crate::{apic, boot};

/// Pins of the one IOAPIC the probe programs.
const IOAPIC_PINS: u32 = 24;

/// The queues a driver waits on for completions: one, or every queue of a multi-queue device.
pub trait UsedRings {
    /// Has any of them a used entry the driver has not taken?
    fn has_used(&self) -> bool;
    /// Ask for an interrupt at the next used entry of each.
    fn request_interrupt(&mut self);
}

impl UsedRings for SplitQueue {
    fn has_used(&self) -> bool {
        SplitQueue::has_used(self)
    }

    fn request_interrupt(&mut self) {
        SplitQueue::request_interrupt(self)
    }
}

/// The queues a multi-queue device's driver set up (the first ones of the array).
impl UsedRings for [Option<SplitQueue>] {
    fn has_used(&self) -> bool {
        self.iter().flatten().any(SplitQueue::has_used)
    }

    fn request_interrupt(&mut self) {
        self.iter_mut().flatten().for_each(SplitQueue::request_interrupt)
    }
}

/// A driver's completion mode and, with interrupts, what it has acknowledged.
pub struct Interrupts {
    /// Whether completions come by interrupt (else the driver polls the used ring).
    enabled: bool,
    /// The interrupt count when the device's interrupt status was last acknowledged.
    acked: u32,
}

impl Interrupts {
    /// `IrqOutOfRange` if interrupt completion is asked for and the device's line is not on the
    /// IOAPIC the probe programs.
    pub fn new(transport: &Transport, completion: Completion) -> Result<Interrupts, Error> {
        let enabled = completion == Completion::Interrupt;
        if enabled && transport.irq >= IOAPIC_PINS {
            return Err(Error::IrqOutOfRange);
        }
        Ok(Interrupts { enabled, acked: 0 })
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Route the transport's pin to `vector`, served by the counting handler.
    pub fn route(&self, transport: &Transport, vector: u8) {
        boot::set_interrupt_gate(vector, boot::irq_handler_address());
        apic::enable_lapic();
        apic::route_ioapic_pin(transport.irq, vector);
    }

    /// After (re)starting the device: anything pending from before is stale, and the line must
    /// be low so the next interrupt is an edge.
    pub fn forget_pending(&mut self, transport: &Transport) {
        self.acked = boot::irq_count();
        transport.ack_interrupt();
    }

    /// If interrupts came since the last acknowledgement, acknowledge the device's interrupt
    /// status, so its (level-triggered) line drops and the next completion raises a new edge.
    /// Returns how many came.
    pub fn acknowledge(&mut self, transport: &Transport) -> u64 {
        let count = boot::irq_count();
        if count == self.acked {
            return 0;
        }
        let new = count.wrapping_sub(self.acked);
        self.acked = count;
        transport.ack_interrupt();
        new as u64
    }

    /// Wait until `queue` (one or several) has a used entry (`true`) or `deadline` passes
    /// (`false`): spinning on the used index, or with interrupts on the interrupt count.
    /// Interrupts acknowledged on the way are added to `counted`.
    pub fn wait_for_used<Q: UsedRings + ?Sized>(
        &mut self,
        transport: &Transport,
        queue: &mut Q,
        counted: &mut u64,
        deadline: Deadline,
    ) -> bool {
        let mut spinner = Spinner::new(deadline);
        loop {
            if self.enabled {
                *counted += self.acknowledge(transport);
            }
            if queue.has_used() {
                return true;
            }
            if self.enabled {
                // Ask for an interrupt at the next used entry, then look once more: an entry
                // used before the device saw the request raises none.
                queue.request_interrupt();
                if queue.has_used() {
                    continue;
                }
                while boot::irq_count() == self.acked {
                    if !spinner.spin() {
                        return false;
                    }
                }
            } else if !spinner.spin() {
                return false;
            }
        }
    }
}
