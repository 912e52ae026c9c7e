//! The I/O modes on the command line (`--io-mode`, the bench's `--modes`).

use clap::ValueEnum;

/// How I/O is served (`vmm::IoMode`), as the command line names it.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IoModeArg {
    /// Queue notifications exit to user space; the vCPU serves the queues.
    Trap,
    /// Notifications through an ioeventfd wake an I/O thread; completion by irqfd.
    Eventfd,
    /// `eventfd`, and the guest completes interrupts with paravirtual EOI.
    PvEoi,
    /// An IOCore polls the rings: no notification exits.
    Sidecore,
    /// `sidecore`, and the guest polls for completions: no exit per I/O.
    Exitless,
    /// The IOCore polls under load and sleeps on notifications when idle.
    Adaptive,
}

impl From<IoModeArg> for vmm::IoMode {
    fn from(mode: IoModeArg) -> vmm::IoMode {
        match mode {
            IoModeArg::Trap => vmm::IoMode::Trap,
            IoModeArg::Eventfd => vmm::IoMode::Eventfd,
            IoModeArg::PvEoi => vmm::IoMode::PvEoi,
            IoModeArg::Sidecore => vmm::IoMode::Sidecore,
            IoModeArg::Exitless => vmm::IoMode::Exitless,
            IoModeArg::Adaptive => vmm::IoMode::Adaptive,
        }
    }
}
