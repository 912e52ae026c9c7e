//! `exitless vhost-user-blk`: exitless's virtio-blk device and IOCore served over vhost-user, so
//! the guests of other VMMs (QEMU's `vhost-user-blk-pci`, Cloud Hypervisor, ...) use them.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
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
    pub disk: storage::DiskSpec,
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
every write the guest saw completed is in it. A frontend that connects while another is served
is refused at once (\"another frontend is connected to this disk\" in the log). A frontend is
dropped, and the next one accepted, when it sends a malformed or refused message (call, error
and kick descriptors must be eventfds), has not negotiated its features 10 s after connecting,
pauses 5 s inside a message or leaves its replies unread for 5 s, or shrinks the memory it
shared (its rings get an error eventfd signal; the daemon survives the SIGBUS). Every reason
is logged. SIGINT or SIGTERM stops it within 2 s, whatever the frontend does.

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
    exit_after_stop_grace(&stop).map_err(|e| format!("cannot start the stop watchdog: {e}"))?;
    let backends =
        args.disk.open_queues(args.queues as usize).map_err(|e| format!("cannot open the disk: {e}"))?;
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

/// How long stopping may take before the daemon exits without finishing: every write a
/// frontend saw completed is in the disk already (RAM disk pages are in /dev/shm, file writes
/// in the page cache or, after FLUSH, on the disk), so an orderly stop only tidies up.
const STOP_GRACE: Duration = Duration::from_millis(1500);

/// Exit (status 0) STOP_GRACE after SIGINT/SIGTERM arrives, if the orderly stop has not ended
/// the process by then: a watchdog thread that polls the same signalfd (the signal stays
/// pending on it, so the server sees it too).
fn exit_after_stop_grace(stop: &OwnedFd) -> std::io::Result<()> {
    let stop = stop.try_clone()?;
    std::thread::Builder::new().name("stop-watchdog".into()).spawn(move || {
        let mut pollfd = libc::pollfd { fd: stop.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd; waits without limit (EINTR cannot happen: the signals this
        // process handles are blocked and come through the signalfd).
        while unsafe { libc::poll(&mut pollfd, 1, -1) } <= 0 {}
        std::thread::sleep(STOP_GRACE);
        ::vhost_user::log(format_args!(
            "stopping took more than {} ms; exiting without waiting further",
            STOP_GRACE.as_millis()
        ));
        std::process::exit(0);
    })?;
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
