//! The system calls each kind of thread makes, found by reading the code and confirmed by running
//! the test suite with the filters in log mode. Arguments are checked where that is cheap and
//! says something: which ioctls, fcntl commands and prctl options, and that no mapping is made
//! executable.

use std::collections::BTreeMap;

use seccompiler::{BackendError, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompRule};

use crate::ThreadKind;

type Rules = BTreeMap<i64, Vec<SeccompRule>>;

/// `_IO(KVMIO, 0x80)`.
const KVM_RUN: u64 = 0xae80;
/// `_IOR(KVMIO, 0x81, struct kvm_regs)`: read after a KVM internal error, for the report.
const KVM_GET_REGS: u64 = ioc_read(0xae, 0x81, std::mem::size_of::<kvm_bindings::kvm_regs>());

/// `_IOW(KVMIO, 0x61, struct kvm_irq_level)`: a device's interrupt, raised by the thread that
/// completes its requests (vmm's `IrqLine`).
const KVM_IRQ_LINE: u64 = ioc_write(0xae, 0x61, std::mem::size_of::<kvm_bindings::kvm_irq_level>());

/// What a vCPU reads of itself when it parks for a pause (a snapshot's vCPU state).
const VCPU_STATE_READS: &[u64] = &[
    ioc_read(0xae, 0x83, std::mem::size_of::<kvm_bindings::kvm_sregs>()),
    ioc_readwrite(0xae, 0x88, std::mem::size_of::<kvm_bindings::kvm_msrs>()),
    ioc_read(0xae, 0x8e, std::mem::size_of::<kvm_bindings::kvm_lapic_state>()),
    ioc_read(0xae, 0x98, std::mem::size_of::<kvm_bindings::kvm_mp_state>()),
    ioc_read(0xae, 0x9f, std::mem::size_of::<kvm_bindings::kvm_vcpu_events>()),
    ioc_read(0xae, 0xa1, std::mem::size_of::<kvm_bindings::kvm_debugregs>()),
    ioc_read(0xae, 0xa4, std::mem::size_of::<kvm_bindings::kvm_xsave>()),
    ioc_read(0xae, 0xa6, std::mem::size_of::<kvm_bindings::kvm_xcrs>()),
];

/// What the VMM's main thread reads of the VM for a snapshot: the irqchip and the KVM clock.
const VM_STATE_READS: &[u64] = &[
    ioc_readwrite(0xae, 0x62, std::mem::size_of::<kvm_bindings::kvm_irqchip>()),
    ioc_read(0xae, 0x7c, std::mem::size_of::<kvm_bindings::kvm_clock_data>()),
];

/// A live migration's sender: dirty logging switched on and off on each memory slot
/// (KVM_SET_USER_MEMORY_REGION), and the log read and cleared (KVM_GET_DIRTY_LOG).
const DIRTY_LOG_IOCTLS: &[u64] = &[
    ioc_write(0xae, 0x46, std::mem::size_of::<kvm_bindings::kvm_userspace_memory_region>()),
    ioc_write(0xae, 0x42, std::mem::size_of::<kvm_bindings::kvm_dirty_log>()),
];

/// Writing a snapshot directory: create it and its files, remove an older state file, write,
/// sync, rename the new state file into place (std's create_dir_all looks at the path first).
const SNAPSHOT_FILES: &[i64] = &[
    libc::SYS_openat,
    libc::SYS_unlink,
    libc::SYS_unlinkat,
    libc::SYS_mkdirat,
    libc::SYS_mkdir,
    libc::SYS_statx,
    libc::SYS_newfstatat,
    libc::SYS_fsync,
    libc::SYS_rename,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    // The directory must be this user's (`vmm::snapshot::SnapshotDir`).
    libc::SYS_geteuid,
];

const fn ioc_readwrite(kind: u64, nr: u64, size: usize) -> u64 {
    const IOC_READ_WRITE: u64 = 3;
    (IOC_READ_WRITE << 30) | ((size as u64) << 16) | (kind << 8) | nr
}

const fn ioc_write(kind: u64, nr: u64, size: usize) -> u64 {
    const IOC_WRITE: u64 = 1;
    (IOC_WRITE << 30) | ((size as u64) << 16) | (kind << 8) | nr
}

const fn ioc_read(kind: u64, nr: u64, size: usize) -> u64 {
    const IOC_READ: u64 = 2;
    (IOC_READ << 30) | ((size as u64) << 16) | (kind << 8) | nr
}

/// What every thread needs from the Rust and C runtime: locks and channels, the allocator,
/// signal returns, time and sleeps, messages on standard error, and ending the thread (glibc
/// blocks signals and Rust takes down its alternate signal stack) or the process. The kernel
/// itself makes restart_syscall to resume a timed wait (poll, nanosleep, futex) that a stop
/// and continue (SIGSTOP/SIGCONT, a debugger, a cgroup freeze) interrupted: without it such a
/// pause killed the process with SIGSYS.
const RUNTIME: &[i64] = &[
    libc::SYS_futex,
    libc::SYS_restart_syscall,
    libc::SYS_sched_yield,
    libc::SYS_brk,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_rt_sigreturn,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_write,
    libc::SYS_sigaltstack,
    libc::SYS_rt_sigprocmask,
    libc::SYS_exit,
    libc::SYS_exit_group,
];

/// Starting a thread (glibc's pthread_create and the new thread's own start-up, before it
/// installs its own filter: rseq, set_robust_list, rt_sigprocmask, prctl(PR_SET_NAME), mmap and
/// mprotect of its signal stack, sched_getaffinity, gettid): only the vCPU does, for the
/// ping-pong responder the guest asks for.
const THREAD_START: &[i64] = &[
    libc::SYS_clone3,
    libc::SYS_set_robust_list,
    libc::SYS_rseq,
    // pthread_getattr_np, which Rust's std uses to find the new thread's stack guard, and
    // glibc's check that it asks about itself.
    libc::SYS_sched_getaffinity,
    libc::SYS_gettid,
];

/// The I/O an IOCore does for its queues: sleep in epoll on ioeventfds and backend fds, drain
/// eventfds, drive io_uring, move frames to and from taps, close what a detached queue held, read
/// its own scheduler statistics (pread of /proc/thread-self/schedstat, opened before the filter).
const IOCORE: &[i64] = &[
    libc::SYS_pread64,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait2,
    libc::SYS_epoll_ctl,
    libc::SYS_read,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_io_uring_enter,
    libc::SYS_close,
];

/// Checks on descriptors a vhost-user frontend sends (is it an eventfd: readlink of
/// /proc/self/fd/N; how big is a memory file): fstat is newfstatat in today's glibc and statx
/// in Rust's `File::metadata`. fcntl's commands are limited separately.
const DESCRIPTOR_CHECKS: &[i64] =
    &[libc::SYS_fstat, libc::SYS_newfstatat, libc::SYS_statx, libc::SYS_readlink];

/// fcntl commands on a frontend's descriptors: make a kick or call fd non-blocking, read a
/// memfd's seals.
const FCNTL_COMMANDS: &[u64] = &[libc::F_GETFL as u64, libc::F_SETFL as u64, libc::F_GET_SEALS as u64];

/// The vhost-user connection thread: wait for and accept frontends, exchange messages with
/// descriptors, create and replace eventfds, map guest memory, remove the socket file at the end.
const CONNECTION: &[i64] = &[
    libc::SYS_poll,
    libc::SYS_accept4,
    libc::SYS_recvmsg,
    libc::SYS_sendmsg,
    libc::SYS_read,
    libc::SYS_close,
    libc::SYS_dup3,
    libc::SYS_eventfd2,
    libc::SYS_unlink,
    // GET_INFLIGHT_FD: the in-flight tracking region is a sealed memfd (sealed with fcntl
    // F_ADD_SEALS, allowed with fcntl's commands).
    libc::SYS_memfd_create,
    libc::SYS_ftruncate,
];

/// A disk that does not answer: a reset that waited longer than the disk's reset timeout
/// cancels its requests (`storage::Backend::cancel_all`: IORING_OP_ASYNC_CANCEL, handed to the
/// kernel with io_uring_enter), and a queue's start after a reset gave up on some opens the disk
/// again (`storage::Backend::reopen`): the same file (fcntl F_DUPFD_CLOEXEC, allowed with fcntl's
/// commands) on a new io_uring, whose rings are mapped (mmap, allowed without PROT_EXEC).
const REOPEN_DISK: &[i64] = &[libc::SYS_io_uring_setup, libc::SYS_io_uring_enter];

/// A vhost-user frontend's exchanges with its daemon (the vCPU starts and resets the disk).
const VHOST_USER_FRONTEND: &[i64] = &[libc::SYS_sendmsg, libc::SYS_recvmsg, libc::SYS_poll];

/// librados and librbd, Ceph's client: load the libraries and read the configuration and keyring
/// (files), connect to monitors and OSDs over TCP and serve those connections from their own
/// event loops (epoll, eventfds, pipes), start their threads, name them and set their CPU
/// affinity, and wake the thread that polls a queue's completions (an eventfd write).
const RBD_CLIENT: &[i64] = &[
    libc::SYS_openat,
    libc::SYS_read,
    libc::SYS_pread64,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_lseek,
    libc::SYS_close,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_access,
    libc::SYS_readlink,
    libc::SYS_getdents64,
    libc::SYS_connect,
    libc::SYS_setsockopt,
    libc::SYS_getsockopt,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_sendmsg,
    libc::SYS_recvmsg,
    libc::SYS_sendto,
    libc::SYS_recvfrom,
    libc::SYS_shutdown,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_epoll_create,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_eventfd2,
    libc::SYS_pipe2,
    libc::SYS_getrandom,
    libc::SYS_getpid,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_uname,
    libc::SYS_sysinfo,
    libc::SYS_prlimit64,
    libc::SYS_sched_setaffinity,
    libc::SYS_rt_sigaction,
    libc::SYS_tgkill,
];

pub(crate) fn rules(thread: ThreadKind) -> Result<Rules, BackendError> {
    let mut rules = Rules::new();
    allow(&mut rules, RUNTIME);
    // Allocations and thread stacks; never an executable mapping.
    not_executable(&mut rules, libc::SYS_mmap)?;
    not_executable(&mut rules, libc::SYS_mprotect)?;
    match thread {
        ThreadKind::Vcpu => {
            allow(&mut rules, THREAD_START);
            allow(&mut rules, &[libc::SYS_pread64, libc::SYS_io_uring_enter, libc::SYS_close]);
            // In trap mode the vCPU completes requests, and raises their interrupts, itself.
            // And it reads its own state when it parks for a pause.
            let ioctls = [&[KVM_RUN, KVM_GET_REGS, KVM_IRQ_LINE], VCPU_STATE_READS].concat();
            one_of(&mut rules, libc::SYS_ioctl, 1, &ioctls)?;
            // The new thread names itself and installs its own filter.
            one_of(
                &mut rules,
                libc::SYS_prctl,
                0,
                &[libc::PR_SET_NAME as u64, libc::PR_SET_NO_NEW_PRIVS as u64],
            )?;
            one_of(&mut rules, libc::SYS_seccomp, 0, &[libc::SECCOMP_SET_MODE_FILTER as u64])?;
            // The interrupting responder gets its own copy of the test device's irqfd; a
            // descriptor a vhost-user daemon sends with a reply is made close-on-exec (then
            // closed: replies carry none).
            one_of(&mut rules, libc::SYS_fcntl, 1, &[libc::F_DUPFD_CLOEXEC as u64, libc::F_SETFD as u64])?;
            // A vhost-user disk's start (DRIVER_OK) and reset, in the Status write's exit:
            // messages with descriptors, each wait bounded by poll.
            allow(&mut rules, VHOST_USER_FRONTEND);
            allow(&mut rules, REOPEN_DISK);
        }
        ThreadKind::IoCore => {
            allow(&mut rules, IOCORE);
            own_scheduling_class(&mut rules)?;
            one_of(&mut rules, libc::SYS_ioctl, 1, &[KVM_IRQ_LINE])?;
        }
        ThreadKind::VhostUserIoCore => {
            allow(&mut rules, IOCORE);
            own_scheduling_class(&mut rules)?;
            allow(&mut rules, DESCRIPTOR_CHECKS);
            one_of(&mut rules, libc::SYS_fcntl, 1, FCNTL_COMMANDS)?;
        }
        ThreadKind::SwitchIoCore => {
            allow(&mut rules, IOCORE);
            own_scheduling_class(&mut rules)?;
            // The uplink's flush: send(fd, NULL, 0, MSG_DONTWAIT), a send of no bytes (the
            // frames are in the ring already).
            one_of(&mut rules, libc::SYS_sendto, 2, &[0])?;
        }
        ThreadKind::VhostUserConnection => {
            allow(&mut rules, CONNECTION);
            allow(&mut rules, DESCRIPTOR_CHECKS);
            allow(&mut rules, REOPEN_DISK);
            // And close-on-exec on the descriptors a frontend sends; F_DUPFD_CLOEXEC to open a
            // disk again (`REOPEN_DISK`).
            let commands = [
                FCNTL_COMMANDS,
                &[libc::F_SETFD as u64, libc::F_DUPFD_CLOEXEC as u64, libc::F_ADD_SEALS as u64],
            ]
            .concat();
            one_of(&mut rules, libc::SYS_fcntl, 1, &commands)?;
            // A frontend's socket is made non-blocking (FIONBIO).
            one_of(&mut rules, libc::SYS_ioctl, 1, &[libc::FIONBIO])?;
            // The SIGBUS handler that survives a shrunk memory file is installed when guest
            // memory is first mapped.
            one_of(&mut rules, libc::SYS_rt_sigaction, 0, &[libc::SIGBUS as u64])?;
            peer_credentials(&mut rules)?;
        }
        // Closes its copy of the irqfd when it ends.
        ThreadKind::PingPong => allow(&mut rules, &[libc::SYS_close]),
        ThreadKind::VmmMain => {
            // Kick vCPUs out of KVM_RUN (pthread_kill: tgkill on getpid), wait for the IOCore
            // to drain its backends (io_uring_enter), close every descriptor of the VM.
            allow(
                &mut rules,
                &[libc::SYS_tgkill, libc::SYS_getpid, libc::SYS_io_uring_enter, libc::SYS_close],
            );
            // A vhost-user disk's daemon is told the rings stop as the VM goes.
            allow(&mut rules, VHOST_USER_FRONTEND);
            // Pause: the devices' workers drained here, whose completions raise interrupts;
            // snapshot: the VM's state, and the files.
            allow(&mut rules, SNAPSHOT_FILES);
            one_of(&mut rules, libc::SYS_ioctl, 1, &[&[KVM_IRQ_LINE], VM_STATE_READS].concat())?;
        }
        // Waits on the stop signal's descriptor.
        ThreadKind::StopWatchdog => allow(&mut rules, &[libc::SYS_poll]),
        // Reads the IOCore's /proc figures (opened by the IOCore, closed at the end) and moves
        // the IOCore, which is another thread (pid argument), to its fallback class: batch or
        // normal, never a real-time one.
        ThreadKind::IoCoreWatch => {
            allow(&mut rules, &[libc::SYS_pread64, libc::SYS_close]);
            one_of(
                &mut rules,
                libc::SYS_sched_setscheduler,
                1,
                &[libc::SCHED_BATCH as u64, libc::SCHED_OTHER as u64],
            )?;
        }
        // The same HTTP thread serves the daemon's API and the VMM's.
        ThreadKind::ApiServer | ThreadKind::VmmApi => {
            // Clients: accept, read (recvfrom), answer (sendto) and close; the control thread
            // is woken by an eventfd write (`write` is in RUNTIME); the socket file is removed
            // at the end.
            allow(
                &mut rules,
                &[
                    libc::SYS_poll,
                    libc::SYS_accept4,
                    libc::SYS_recvfrom,
                    libc::SYS_sendto,
                    libc::SYS_read,
                    libc::SYS_close,
                    libc::SYS_unlink,
                ],
            );
            // A client's socket is made non-blocking (FIONBIO).
            one_of(&mut rules, libc::SYS_ioctl, 1, &[libc::FIONBIO])?;
            // Each client's user is checked before its request is read; the socket file is
            // removed at the end only if it is still a socket of ours (lstat).
            peer_credentials(&mut rules)?;
            allow(&mut rules, &[libc::SYS_newfstatat, libc::SYS_statx]);
        }
        ThreadKind::DaemonControl => daemon_control(&mut rules)?,
        ThreadKind::Migration => {
            // Connect to the destination (a Unix socket, or TCP), bound every wait with socket
            // timeouts, send pages (write; writev: TLS records, many at once) and read the
            // destination's answers, close at the end.
            allow(
                &mut rules,
                &[
                    libc::SYS_connect,
                    libc::SYS_sendto,
                    libc::SYS_writev,
                    libc::SYS_read,
                    libc::SYS_recvfrom,
                    libc::SYS_close,
                ],
            );
            migration_sockets(&mut rules)?;
            socket_settings(&mut rules)?;
            // A TCP connect within a time limit (std's connect_timeout): non-blocking for the
            // connect (FIONBIO), poll, then the socket's error (SO_ERROR).
            one_of(&mut rules, libc::SYS_ioctl, 1, &[DIRTY_LOG_IOCTLS, &[libc::FIONBIO]].concat())?;
            allow(&mut rules, &[libc::SYS_poll]);
            // Who listens on the destination's Unix socket (SO_PEERCRED), checked before any
            // byte; a TCP connect's outcome (SO_ERROR).
            socket_options(&mut rules, &[libc::SO_PEERCRED, libc::SO_ERROR])?;
            // TLS: its key shares and nonces.
            allow(&mut rules, &[libc::SYS_getrandom]);
        }
        ThreadKind::StateReader => {
            // A snapshot: read its files (opened by the main thread; std looks at a file's
            // size and position before reading it whole). A migration: accept connections on
            // the listening socket (opened by the main thread), ask who each peer is (a Unix
            // socket's uid; a TCP peer's TLS handshake), bound every wait with socket timeouts,
            // read the stream and answer (writev: TLS records), close at the end.
            allow(
                &mut rules,
                &[
                    libc::SYS_read,
                    libc::SYS_statx,
                    libc::SYS_fstat,
                    libc::SYS_lseek,
                    libc::SYS_accept,
                    libc::SYS_accept4,
                    libc::SYS_recvfrom,
                    libc::SYS_sendto,
                    libc::SYS_writev,
                    libc::SYS_close,
                ],
            );
            socket_settings(&mut rules)?;
            peer_credentials(&mut rules)?;
            // TLS: its key shares and nonces.
            allow(&mut rules, &[libc::SYS_getrandom]);
        }
        ThreadKind::RbdClient => {
            allow(&mut rules, RBD_CLIENT);
            tcp_sockets(&mut rules)?;
            allow(&mut rules, THREAD_START);
            one_of(&mut rules, libc::SYS_prctl, 0, &[libc::PR_SET_NAME as u64, libc::PR_GET_NAME as u64])?;
            one_of(
                &mut rules,
                libc::SYS_fcntl,
                1,
                &[libc::F_GETFL as u64, libc::F_SETFL as u64, libc::F_GETFD as u64, libc::F_SETFD as u64],
            )?;
            one_of(&mut rules, libc::SYS_ioctl, 1, &[libc::FIONBIO, libc::FIONREAD])?;
        }
        ThreadKind::VhostUserWatch => {
            // Waits on the error eventfd and the socket, drains the eventfd; when the daemon
            // goes away, connects to the next (a Unix socket), sets it up with messages that
            // carry descriptors and keeps a duplicate of the connection to watch.
            allow(&mut rules, &[libc::SYS_read, libc::SYS_close, libc::SYS_connect]);
            allow(&mut rules, VHOST_USER_FRONTEND);
            one_of(&mut rules, libc::SYS_socket, 0, &[libc::AF_UNIX as u64])?;
            let own = [libc::F_SETFD, libc::F_DUPFD_CLOEXEC].map(|c| c as u64);
            one_of(&mut rules, libc::SYS_fcntl, 1, &[FCNTL_COMMANDS, &own].concat())?;
            // Who listens there (SO_PEERCRED), checked before the guest's memory is sent.
            peer_credentials(&mut rules)?;
        }
    }
    Ok(rules)
}

/// The daemon's control thread adds disks while it runs: it opens the disk (a file or block
/// device: its size by lseek, O_DIRECT's alignment by fstatfs; a new RAM disk is a memfd,
/// memfd_create being in `CONNECTION`; a file the control API names is first looked up
/// beneath an `--api-disk-dir` with openat2), sets up its io_uring,
/// listens on its socket (checking first that no live server answers there), and starts its
/// connection thread, whose own filter (the connection's) is installed on top of this one, so
/// this one allows all that thread needs too.
fn daemon_control(rules: &mut Rules) -> Result<(), BackendError> {
    allow(rules, THREAD_START);
    allow(rules, CONNECTION);
    allow(rules, DESCRIPTOR_CHECKS);
    allow(rules, REOPEN_DISK);
    allow(
        rules,
        &[
            libc::SYS_openat,
            libc::SYS_openat2,
            libc::SYS_lseek,
            libc::SYS_ftruncate,
            libc::SYS_fstatfs,
            libc::SYS_bind,
            libc::SYS_listen,
            libc::SYS_connect,
            // A disk's socket is made 0600 before it is bound (fchmod), then given the
            // operator's owner and mode (--socket-owner, --socket-mode).
            libc::SYS_fchmod,
            libc::SYS_chmod,
            libc::SYS_fchmodat,
            libc::SYS_lchown,
            libc::SYS_fchownat,
        ],
    );
    // Disks' sockets are Unix sockets; no other kind.
    one_of(rules, libc::SYS_socket, 0, &[libc::AF_UNIX as u64])?;
    one_of(rules, libc::SYS_prctl, 0, &[libc::PR_SET_NAME as u64, libc::PR_SET_NO_NEW_PRIVS as u64])?;
    // A file disk asks its file system whether it punches holes (DISCARD) by punching one past
    // the end of the file; the data path's fallocates go through io_uring.
    let punch_hole = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    one_of(rules, libc::SYS_fallocate, 1, &[punch_hole as u64])?;
    one_of(rules, libc::SYS_seccomp, 0, &[libc::SECCOMP_SET_MODE_FILTER as u64])?;
    // F_ADD_SEALS: the connection thread seals its in-flight region (GET_INFLIGHT_FD).
    let own = [libc::F_SETFD, libc::F_GETFD, libc::F_DUPFD_CLOEXEC, libc::F_ADD_SEALS].map(|c| c as u64);
    one_of(rules, libc::SYS_fcntl, 1, &[FCNTL_COMMANDS, &own].concat())?;
    // The connection thread makes a frontend's socket non-blocking (FIONBIO).
    one_of(rules, libc::SYS_ioctl, 1, &[libc::FIONBIO])?;
    one_of(rules, libc::SYS_rt_sigaction, 0, &[libc::SIGBUS as u64])?;
    // A successor takes its predecessor's disks over under this filter: it checks the sockets
    // handed over (getsockname, SO_ACCEPTCONN) and the predecessor's user against its own.
    allow(rules, &[libc::SYS_getsockname, libc::SYS_geteuid, libc::SYS_getegid]);
    socket_options(rules, &[libc::SO_PEERCRED, libc::SO_ACCEPTCONN])
}

/// getsockopt(SOL_SOCKET, one of `options`) only.
fn socket_options(rules: &mut Rules, options: &[libc::c_int]) -> Result<(), BackendError> {
    let alternatives = options
        .iter()
        .map(|&option| {
            SeccompRule::new(vec![
                condition(1, SeccompCmpOp::Eq, libc::SOL_SOCKET as u64)?,
                condition(2, SeccompCmpOp::Eq, option as u64)?,
            ])
        })
        .collect::<Result<_, _>>()?;
    rules.insert(libc::SYS_getsockopt, alternatives);
    Ok(())
}

/// socket(AF_INET or AF_INET6, SOCK_STREAM with any flags, any): librados' connections to the
/// cluster's monitors and OSDs; no datagram, raw or local socket.
fn tcp_sockets(rules: &mut Rules) -> Result<(), BackendError> {
    let mut alternatives = Vec::new();
    for family in [libc::AF_INET, libc::AF_INET6] {
        alternatives.push(SeccompRule::new(vec![
            condition(0, SeccompCmpOp::Eq, family as u64)?,
            condition(1, SeccompCmpOp::MaskedEq(0xf), libc::SOCK_STREAM as u64)?,
        ])?);
    }
    rules.insert(libc::SYS_socket, alternatives);
    Ok(())
}

/// socket(AF_UNIX, any), and socket(AF_INET or AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, any) as
/// std's TcpStream makes it: a migration's connection, to this host or another; no datagram or
/// raw socket.
fn migration_sockets(rules: &mut Rules) -> Result<(), BackendError> {
    let stream = (libc::SOCK_STREAM | libc::SOCK_CLOEXEC) as u64;
    let mut alternatives = vec![rule(0, SeccompCmpOp::Eq, libc::AF_UNIX as u64)?];
    for family in [libc::AF_INET, libc::AF_INET6] {
        alternatives.push(SeccompRule::new(vec![
            condition(0, SeccompCmpOp::Eq, family as u64)?,
            condition(1, SeccompCmpOp::Eq, stream)?,
        ])?);
    }
    rules.insert(libc::SYS_socket, alternatives);
    Ok(())
}

/// setsockopt(SOL_SOCKET, any: the timeouts) and setsockopt(IPPROTO_TCP, TCP_NODELAY) only: a
/// migration's connection, its waits bounded, and on TCP its small last writes not held back.
fn socket_settings(rules: &mut Rules) -> Result<(), BackendError> {
    rules.insert(
        libc::SYS_setsockopt,
        vec![
            rule(1, SeccompCmpOp::Eq, libc::SOL_SOCKET as u64)?,
            SeccompRule::new(vec![
                condition(1, SeccompCmpOp::Eq, libc::IPPROTO_TCP as u64)?,
                condition(2, SeccompCmpOp::Eq, libc::TCP_NODELAY as u64)?,
            ])?,
        ],
    );
    Ok(())
}

/// getsockopt(SO_PEERCRED) only: a peer's uid (checked) and pid (for the log).
fn peer_credentials(rules: &mut Rules) -> Result<(), BackendError> {
    rules.insert(
        libc::SYS_getsockopt,
        vec![SeccompRule::new(vec![
            condition(1, SeccompCmpOp::Eq, libc::SOL_SOCKET as u64)?,
            condition(2, SeccompCmpOp::Eq, libc::SO_PEERCRED as u64)?,
        ])?],
    );
    Ok(())
}

/// Allow `calls` whatever their arguments.
fn allow(rules: &mut Rules, calls: &[i64]) {
    for &call in calls {
        rules.insert(call, Vec::new());
    }
}

/// An IOCore moves itself between the idle and batch scheduling classes (pid 0: itself only).
fn own_scheduling_class(rules: &mut Rules) -> Result<(), BackendError> {
    one_of(rules, libc::SYS_sched_setscheduler, 0, &[0])
}

/// Allow `call` when argument `arg` is one of `values`.
fn one_of(rules: &mut Rules, call: i64, arg: u8, values: &[u64]) -> Result<(), BackendError> {
    let alternatives =
        values.iter().map(|&value| rule(arg, SeccompCmpOp::Eq, value)).collect::<Result<_, _>>()?;
    rules.insert(call, alternatives);
    Ok(())
}

/// Allow mmap or mprotect unless the protection (argument 2) asks for PROT_EXEC.
fn not_executable(rules: &mut Rules, call: i64) -> Result<(), BackendError> {
    rules.insert(call, vec![rule(2, SeccompCmpOp::MaskedEq(libc::PROT_EXEC as u64), 0)?]);
    Ok(())
}

fn rule(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompRule, BackendError> {
    SeccompRule::new(vec![condition(arg, op, value)?])
}

/// Arguments compared here (ioctl requests, fcntl commands, prctl options, flags) are C `int`s
/// or fit in 32 bits, so only the low 32 bits are looked at, as the kernel does.
fn condition(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, BackendError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)
}
