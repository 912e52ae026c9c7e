//! `exitless vhost-user-blk`: exitless's virtio-blk device and IOCore served over vhost-user, so
//! the guests of other VMMs (QEMU's `vhost-user-blk-pci`, Cloud Hypervisor, ...) use them.

use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, ValueEnum};
use iocore::{IoCore, Policy};
use sandbox::{Filter, ThreadKind};
use virtio::block::Block;
use virtio::WorkerHost;

#[derive(Args)]
#[command(after_help = AFTER_HELP)]
pub struct VhostUserBlkArgs {
    /// The Unix socket to listen on (a stale socket file there is replaced).
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,
    /// The disk: `path=FILE[,readonly][,direct]` (raw file through io_uring), `ram=SIZE` (a new
    /// RAM disk, kept across frontend connections while this runs) or `ram,path=FILE[,readonly]`
    /// (an existing /dev/shm file, shared with the host).
    #[arg(long, value_name = "SPEC", value_parser = crate::disk::parse)]
    pub disk: vmm::DiskBackend,
    /// Virtqueues offered (VIRTIO_BLK_F_MQ above 1); each has its own backend.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub queues: u16,
    /// How the IOCore serves the queues: sidecore (polls the rings, the guest never notifies),
    /// adaptive (polls under load, sleeps on the kick eventfds when idle), eventfd (sleeps on
    /// the kick eventfds, like QEMU's own backends).
    #[arg(long, value_name = "MODE", default_value = "adaptive")]
    pub io_mode: VhostIoMode,
    /// Pin the IOCore to this host CPU.
    #[arg(long, value_name = "CPU")]
    pub iocore_cpu: Option<usize>,
    /// adaptive: microseconds the IOCore spins without a request before it sleeps.
    #[arg(long, value_name = "US", default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub idle_budget_us: u64,
    #[command(flatten)]
    pub seccomp: crate::seccomp::SeccompArgs,
}

const AFTER_HELP: &str = "\
Serves one frontend at a time and keeps serving across reconnections: the disk stays open, and
every write the guest saw completed is in it. Malformed protocol messages are logged and refused
(the connection is closed; the next frontend is accepted). SIGINT or SIGTERM stops it.

Example with QEMU (guest memory must be shared with the backend):
  exitless vhost-user-blk --socket /tmp/vhost.sock --disk path=disk.img &
  qemu-system-x86_64 -m 1G -object memory-backend-memfd,id=mem,size=1G,share=on \\
      -machine memory-backend=mem -chardev socket,id=vu,path=/tmp/vhost.sock \\
      -device vhost-user-blk-pci,chardev=vu ...";

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum VhostIoMode {
    Sidecore,
    Adaptive,
    Eventfd,
}

pub fn main(args: VhostUserBlkArgs) -> i32 {
    match serve(args) {
        Ok(()) => 0,
        Err(message) => crate::fail(message),
    }
}

fn serve(args: VhostUserBlkArgs) -> Result<(), String> {
    // SIGINT/SIGTERM arrive through a signalfd the server polls; blocked before any thread
    // starts, so every thread inherits the mask.
    let stop = stop_signals().map_err(|e| format!("cannot set up SIGINT/SIGTERM handling: {e}"))?;
    let backends = vmm::devices::virtio::open_backends(&args.disk, args.queues as usize)
        .map_err(|e| format!("cannot open the disk: {e}"))?;
    let block = Block::with_queues(backends, "exitless-vhost-user")
        .ok_or("the disk's queues disagree on its size (was it resized while opening?)")?;
    let policy = match args.io_mode {
        VhostIoMode::Sidecore => Policy::Polling,
        VhostIoMode::Adaptive => Policy::Adaptive { idle: Duration::from_micros(args.idle_budget_us) },
        VhostIoMode::Eventfd => Policy::Notified,
    };
    let seccomp = args.seccomp.mode();
    let iocore_filter = Filter::new(ThreadKind::VhostUserIoCore, seccomp).map_err(|e| e.to_string())?;
    let iocore =
        Arc::new(IoCore::spawn_confined(policy, args.iocore_cpu, iocore_filter).map_err(|e| e.to_string())?);
    let host: Arc<dyn WorkerHost> = iocore.clone();
    let mut device = ::vhost_user::VhostUserBlk::new(block, host);
    let server = ::vhost_user::Server::bind(&args.socket).map_err(|e| e.to_string())?;
    ::vhost_user::log(format_args!(
        "listening on {} ({} queue{}, {} mode)",
        args.socket.display(),
        args.queues,
        if args.queues == 1 { "" } else { "s" },
        args.io_mode.to_possible_value().map(|v| v.get_name().to_owned()).unwrap_or_default(),
    ));
    // This thread reads every frontend's messages from here on.
    sandbox::install(ThreadKind::VhostUserConnection, seccomp).map_err(|e| e.to_string())?;
    server.serve(&mut device, Some(stop.as_fd())).map_err(|e| e.to_string())?;
    ::vhost_user::log(format_args!("stopping"));
    drop(device);
    iocore.stop();
    Ok(())
}

/// Block SIGINT and SIGTERM and return a signalfd that becomes readable when one arrives.
fn stop_signals() -> std::io::Result<OwnedFd> {
    // SAFETY: sigset_t is plain data initialised by sigemptyset before use; pthread_sigmask and
    // signalfd read it; the returned descriptor is checked and then owned.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}
