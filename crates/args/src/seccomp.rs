//! `--seccomp`: what the per-thread seccomp filters do with a system call a thread never makes.

use clap::{Args, ValueEnum};
use vmm::SeccompMode;

/// `--seccomp ACTION`, flattened into every command that starts threads with filters.
#[derive(Args, Clone, Copy)]
pub struct SeccompArgs {
    /// Each vCPU, IOCore and vhost-user thread allows only the system calls it makes (seccomp-bpf);
    /// what happens to any other call.
    #[arg(long, value_name = "ACTION", default_value = "kill")]
    pub seccomp: SeccompArg,
}

/// What a filter does with a call it does not allow.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SeccompArg {
    /// The process dies of SIGSYS (status 159 from a shell): a compromised thread gets no further.
    Kill,
    /// The call goes through and the kernel logs it (`dmesg`: "audit: type=1326 ... syscall=N"):
    /// to find what a filter lacks.
    Log,
    /// No filters.
    Off,
}

impl SeccompArgs {
    /// The mode the VMM and the daemon take.
    pub fn mode(self) -> SeccompMode {
        match self.seccomp {
            SeccompArg::Kill => SeccompMode::Kill,
            SeccompArg::Log => SeccompMode::Log,
            SeccompArg::Off => SeccompMode::Off,
        }
    }

    /// The flag as given, for a process started with the same choice.
    pub fn flag(self) -> [&'static str; 2] {
        let name = match self.seccomp {
            SeccompArg::Kill => "kill",
            SeccompArg::Log => "log",
            SeccompArg::Off => "off",
        };
        ["--seccomp", name]
    }
}
