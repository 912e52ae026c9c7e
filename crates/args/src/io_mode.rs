//! The I/O modes on the command line (`--io-mode`, the bench's `--modes`).

use clap::ValueEnum;

/// How I/O is served (`vmm::IoMode`), as the command line names it.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IoModeArg {
    Trap,
    Eventfd,
    PvEoi,
    Sidecore,
    Exitless,
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
