//! The exitless VMM core: a KVM VM with an in-kernel irqchip, guest memory, vCPU threads, PVH
//! boot, the console and test devices, and exit accounting from KVM's binary statistics.

#![deny(missing_docs)]

pub mod boot;
mod cpuid;
mod devices;
pub mod memory;
pub mod migration;
mod peer;
mod regs;
pub mod snapshot;
mod stats;
mod vcpu;
mod vm;

pub use devices::console::ConsoleMode;
pub use devices::vhost_user::{VhostUserDisk, VhostUserNic};
pub use devices::virtio::{DiskBackend, DiskOptions, IoMode, NetConfig};
pub use iocore::pin_current_thread;
pub use sandbox::SeccompMode;
pub use stats::Counters;
pub use vcpu::{Mark, VcpuReport};
pub use virtio::net::{mac_text, parse_mac};
pub use vm::{
    tsc_khz, ControlError, DeviceReport, DisableExits, Ending, Kernel, RunOutcome, VhostUserReport, Vm,
    VmConfig, VmControl, VmError,
};
