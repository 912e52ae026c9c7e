//! Per-thread seccomp-bpf filters: each kind of long-lived exitless thread gets an allowlist of
//! the system calls it makes, and anything else kills the process (or is logged, or the filter
//! is left out: [`SeccompMode`]).
//!
//! A filter is built where the thread is started (so a build error is reported there) and
//! installed by the thread itself, after its set-up and before it serves guest or frontend
//! input. Filters hold for the calling thread and every thread it starts later.

#![deny(missing_docs)]

mod allowlists;
mod libc_state;

pub use libc_state::settle_allocator;

use std::fmt;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};
use thiserror::Error;

/// What a thread's filter does with a system call outside its allowlist.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SeccompMode {
    /// Kill the whole process with SIGSYS.
    #[default]
    Kill,
    /// Allow the call and log it to the kernel's audit log (`audit: type=1326 ... syscall=N` in
    /// `dmesg`): to find what an allowlist lacks.
    Log,
    /// Install no filter.
    Off,
}

/// The kinds of thread exitless runs, each with its own allowlist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadKind {
    /// A vCPU: KVM_RUN and the devices its exits reach (including a trap-mode disk).
    Vcpu,
    /// The VMM's IOCore: serves queues from ioeventfds, io_uring and taps.
    IoCore,
    /// The vhost-user daemon's IOCore: the VMM's, plus the descriptor checks a frontend's fds
    /// need, and surviving a shrunk memory file.
    VhostUserIoCore,
    /// `exitless vhost-user-net`'s IOCore: runs the switch, polling every NIC's rings and the
    /// uplink's; its one system call of its own is the zero-length send that flushes the
    /// uplink's transmit ring.
    SwitchIoCore,
    /// The vhost-user daemon's connection thread: accepts frontends, reads their messages and
    /// maps their memory.
    VhostUserConnection,
    /// The test device's ping-pong responder (started by a vCPU on the guest's request).
    PingPong,
    /// The VMM's watcher of a vhost-user disk: waits for the ring's error eventfd or the
    /// daemon's hang-up, then flags the device (an irqfd write) and logs a line.
    VhostUserWatch,
    /// `exitless run`'s main thread once the vCPUs run: waits for the guest's end, stops and
    /// joins the other threads, tears the VM down and reports.
    VmmMain,
    /// The vhost-user daemon's stop watchdog: waits for SIGINT/SIGTERM, then ends the process
    /// if the orderly stop takes too long.
    StopWatchdog,
    /// The vhost-user daemon's control API: accepts local HTTP clients and reads and answers
    /// their requests, which the control thread carries out.
    ApiServer,
    /// `exitless run`'s control API: accepts local HTTP clients and reads and answers their
    /// requests (pause, resume, snapshot), which the VMM's main thread carries out.
    VmmApi,
    /// The vhost-user daemon's main thread when it has a control API: opens disks, listens on
    /// their sockets and starts their connection threads while the daemon runs.
    DaemonControl,
    /// `exitless run`'s live-migration sender: connects to the destination, reads KVM's dirty
    /// log and sends guest pages and the VM's state.
    Migration,
    /// The watcher of a pinned idle-class IOCore: reads the IOCore's scheduler figures and
    /// moves it out of the idle class when a busy thread holds it off its core.
    IoCoreWatch,
    /// `exitless run --restore` and `--receive-migration`'s reader: reads the snapshot's files
    /// or accepts the source and reads its stream, and parses and checks every byte of it
    /// before the VMM's main thread builds anything from it.
    StateReader,
    /// The RBD client thread and every thread librbd starts from it (messengers, timers,
    /// finishers, the thread that calls back when a request completes): a network client of the
    /// Ceph cluster that reads its configuration and keyring.
    RbdClient,
}

impl ThreadKind {
    /// Every kind, for what iterates over them (tests, the self-test's names).
    pub const ALL: [ThreadKind; 16] = [
        ThreadKind::Vcpu,
        ThreadKind::IoCore,
        ThreadKind::VhostUserIoCore,
        ThreadKind::SwitchIoCore,
        ThreadKind::VhostUserConnection,
        ThreadKind::PingPong,
        ThreadKind::VhostUserWatch,
        ThreadKind::VmmMain,
        ThreadKind::StopWatchdog,
        ThreadKind::ApiServer,
        ThreadKind::DaemonControl,
        ThreadKind::VmmApi,
        ThreadKind::Migration,
        ThreadKind::IoCoreWatch,
        ThreadKind::StateReader,
        ThreadKind::RbdClient,
    ];

    /// A short name without spaces (`SELF_TEST_ENV`'s values).
    pub fn name(self) -> &'static str {
        match self {
            ThreadKind::Vcpu => "vcpu",
            ThreadKind::IoCore => "iocore",
            ThreadKind::VhostUserIoCore => "vhost-user-iocore",
            ThreadKind::SwitchIoCore => "switch-iocore",
            ThreadKind::VhostUserConnection => "vhost-user-connection",
            ThreadKind::PingPong => "pingpong",
            ThreadKind::VhostUserWatch => "vhost-user-watch",
            ThreadKind::VmmMain => "vmm-main",
            ThreadKind::StopWatchdog => "stop-watchdog",
            ThreadKind::ApiServer => "api-server",
            ThreadKind::DaemonControl => "daemon-control",
            ThreadKind::VmmApi => "vmm-api",
            ThreadKind::Migration => "migration",
            ThreadKind::IoCoreWatch => "iocore-watch",
            ThreadKind::StateReader => "state-reader",
            ThreadKind::RbdClient => "rbd-client",
        }
    }
}

/// When this environment variable names a thread kind (`ThreadKind::name`), each thread of that
/// kind makes one system call outside its allowlist (getppid) right after it installs its
/// filter: to see a filter at work in the real process (in kill mode it dies of SIGSYS).
pub const SELF_TEST_ENV: &str = "EXITLESS_SECCOMP_SELF_TEST";

impl fmt::Display for ThreadKind {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(match self {
            ThreadKind::Vcpu => "vCPU",
            ThreadKind::IoCore => "IOCore",
            ThreadKind::VhostUserIoCore => "vhost-user IOCore",
            ThreadKind::SwitchIoCore => "switch IOCore",
            ThreadKind::VhostUserConnection => "vhost-user connection",
            ThreadKind::PingPong => "ping-pong responder",
            ThreadKind::VhostUserWatch => "vhost-user watcher",
            ThreadKind::VmmMain => "VMM main",
            ThreadKind::StopWatchdog => "stop watchdog",
            ThreadKind::ApiServer => "control API",
            ThreadKind::DaemonControl => "daemon control",
            ThreadKind::VmmApi => "VMM control API",
            ThreadKind::Migration => "live-migration sender",
            ThreadKind::IoCoreWatch => "IOCore watcher",
            ThreadKind::StateReader => "snapshot and migration reader",
            ThreadKind::RbdClient => "RBD client",
        })
    }
}

/// Why a filter could not be built or installed.
#[derive(Debug, Error)]
pub enum SandboxError {
    /// The allowlist did not compile to BPF: a fault of the allowlist, not of the host.
    #[error("cannot build the {thread} thread's seccomp filter: {source}")]
    Build {
        /// Whose filter.
        thread: ThreadKind,
        /// What seccompiler refused.
        source: seccompiler::BackendError,
    },
    /// The kernel refused the filter (no seccomp, or not permitted); nothing was installed.
    #[error(
        "cannot install the {thread} thread's seccomp filter (does this kernel have seccomp?): {source}"
    )]
    Install {
        /// Whose filter.
        thread: ThreadKind,
        /// What the prctl or seccomp call returned.
        source: seccompiler::Error,
    },
}

/// A thread kind's compiled filter, ready to install (nothing to install in [`SeccompMode::Off`]).
#[derive(Debug, Clone)]
pub struct Filter {
    thread: ThreadKind,
    mode: SeccompMode,
    program: Option<BpfProgram>,
}

impl Filter {
    /// Build the filter of `thread` for `mode`.
    pub fn new(thread: ThreadKind, mode: SeccompMode) -> Result<Filter, SandboxError> {
        let refuse = match mode {
            SeccompMode::Kill => SeccompAction::KillProcess,
            SeccompMode::Log => SeccompAction::Log,
            SeccompMode::Off => return Ok(Filter::off(thread)),
        };
        let build = |source| SandboxError::Build { thread, source };
        let rules = allowlists::rules(thread).map_err(build)?;
        let filter =
            SeccompFilter::new(rules, refuse, SeccompAction::Allow, TargetArch::x86_64).map_err(build)?;
        let program = BpfProgram::try_from(filter).map_err(build)?;
        Ok(Filter { thread, mode, program: Some(program) })
    }

    /// A filter that installs nothing.
    pub fn off(thread: ThreadKind) -> Filter {
        Filter { thread, mode: SeccompMode::Off, program: None }
    }

    /// The filter of another kind of thread, in this one's mode: for a thread that starts a
    /// helper of its own.
    pub fn for_kind(&self, thread: ThreadKind) -> Result<Filter, SandboxError> {
        Filter::new(thread, self.mode)
    }

    /// The filter's BPF program as `(code, jt, jf, k)` instructions, as the kernel keeps it once
    /// installed and shows it to a tracer (PTRACE_SECCOMP_GET_FILTER); empty in
    /// [`SeccompMode::Off`]. For tests that check which filter a running thread is under.
    pub fn instructions(&self) -> Vec<(u16, u8, u8, u32)> {
        self.program.iter().flatten().map(|i| (i.code, i.jt, i.jf, i.k)).collect()
    }

    /// Confine the calling thread (and the threads it starts from now on) to the allowlist.
    pub fn install(&self) -> Result<(), SandboxError> {
        if let Some(program) = &self.program {
            seccompiler::apply_filter(program)
                .map_err(|source| SandboxError::Install { thread: self.thread, source })?;
        }
        if std::env::var_os(SELF_TEST_ENV).is_some_and(|kind| kind == self.thread.name()) {
            // SAFETY: getppid has no arguments and no memory effects.
            unsafe { libc::getppid() };
        }
        Ok(())
    }
}

/// Build and install `thread`'s filter on the calling thread.
pub fn install(thread: ThreadKind, mode: SeccompMode) -> Result<(), SandboxError> {
    Filter::new(thread, mode)?.install()
}
