//! How a vhost-user daemon's IOCores wait for their guests (`--io-mode`, `--idle-budget-us`),
//! the same for the disk daemon and the NIC daemon.

use std::time::Duration;

use clap::{Args, ValueEnum};
use iocore::Policy;

/// `--io-mode`: how the IOCores serve the rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum VhostIoMode {
    /// Poll the rings; the guest never notifies.
    Sidecore,
    /// Poll under load, sleep on the kick eventfds when idle.
    Adaptive,
    /// Sleep on the kick eventfds, as QEMU's own backends do.
    Eventfd,
}

impl VhostIoMode {
    /// The mode's name, as the command line spells it.
    pub fn name(self) -> String {
        self.to_possible_value().map(|v| v.get_name().to_owned()).unwrap_or_default()
    }
}

/// A vhost-user daemon's `--io-mode` and `--idle-budget-us`.
#[derive(Debug, Args)]
pub struct VhostIoArgs {
    /// How the IOCores serve the rings: sidecore (polls the rings, the guest never notifies),
    /// adaptive (polls under load, sleeps on the kick eventfds when idle), eventfd (sleeps on
    /// the kick eventfds, like QEMU's own backends).
    #[arg(long, value_name = "MODE", default_value = "adaptive")]
    pub io_mode: VhostIoMode,
    /// adaptive: microseconds an IOCore spins without a request before it sleeps.
    #[arg(long, value_name = "US", default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub idle_budget_us: u64,
}

impl VhostIoArgs {
    /// The IOCores' policy.
    pub fn policy(&self) -> Policy {
        match self.io_mode {
            VhostIoMode::Sidecore => Policy::Polling,
            VhostIoMode::Adaptive => Policy::Adaptive { idle: Duration::from_micros(self.idle_budget_us) },
            VhostIoMode::Eventfd => Policy::Notified,
        }
    }

    /// The mode's name, as the command line spells it.
    pub fn mode_name(&self) -> String {
        self.io_mode.name()
    }
}
