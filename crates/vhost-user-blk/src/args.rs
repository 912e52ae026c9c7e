//! `exitless vhost-user-blk`'s command line: what each option means, and the long help.

use std::num::ParseIntError;
use std::path::PathBuf;

use clap::Args;
use thiserror::Error;

use crate::spec::{self, VhostDisk};

/// `exitless vhost-user-blk`'s options; `--help` shows each one's doc and [`AFTER_HELP`].
#[derive(Args)]
#[command(after_help = AFTER_HELP)]
pub struct VhostUserBlkArgs {
    /// The Unix socket of a `--disk` that names none (a stale socket file there is replaced).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// A disk to serve (repeatable): `socket=PATH,` and `path=FILE[,readonly][,direct]` (raw
    /// file through io_uring), `ram=SIZE` (a new RAM disk, kept across frontend connections
    /// while this runs), `ram,path=FILE[,readonly]` (an existing /dev/shm file) or
    /// `null=SIZE[,readonly]` (a null disk: reads return zeros, writes are dropped, no system
    /// call per request; the peer of QEMU's null-co); optionally
    /// `queues=N`, `iops=N` (requests/s), `bw=BYTES` (bytes/s, K/M/G suffixes), `serial=TEXT`
    /// (the serial number the guest reads, 1 to 20 printable ASCII characters; default
    /// `vhost-user-diskN`, N the disk's index) and `name=NAME` (for the control API and metrics;
    /// default diskN) and `reset-timeout=SECS` (how long a reset, such as a frontend leaving,
    /// waits for the requests the disk holds before it cancels them; default 5, see below).
    /// Without `socket=`, the disk is served on `--socket`. Needed unless --api-socket is given.
    #[arg(long, value_name = "SPEC", value_parser = spec::parse, required_unless_present = "api_socket")]
    pub disk: Vec<VhostDisk>,
    /// Give every disk's socket to this user and/or group once it is made (numbers: `UID`,
    /// `UID:GID` or `:GID`; e.g. `$(id -u libvirt-qemu)` for libvirt's QEMU), and serve that
    /// user's processes too. Without it only the daemon's own user and root may connect. Giving
    /// a socket to another user needs root; a group, membership of it. See "Who may connect".
    #[arg(long, value_name = "[UID][:GID]", value_parser = parse_owner)]
    pub socket_owner: Option<SocketOwner>,
    /// The disks' socket files' permission bits, in octal: 600 (the default: the owner's alone)
    /// or 660 (the group may connect too: processes whose group is --socket-owner's GID, or the
    /// daemon's group, are then served). Bits for other users are refused.
    #[arg(long, value_name = "MODE", default_value = "600", value_parser = parse_mode)]
    pub socket_mode: u32,
    /// Serve the control API on this Unix socket: HTTP/1.1 with JSON bodies (`curl
    /// --unix-socket PATH http://localhost/disks`), to list, add, re-limit and remove disks
    /// while the daemon runs, and Prometheus metrics on /metrics. The socket is made 0600 and
    /// only the daemon's user and root are served. A disk it adds opens a file only inside an
    /// --api-disk-dir. See below.
    #[arg(long, value_name = "PATH")]
    pub api_socket: Option<PathBuf>,
    /// A directory in which a disk added through the control API may open its file
    /// (repeatable). PUT /disks with `path` (or `ram` with `path`) opens the file only if it
    /// lies inside one of them: symbolic links and `..` are resolved beneath the directory,
    /// and one that leads out of it is refused (403). Without it the API adds only disks that
    /// open no file (`ram=SIZE`, `null=SIZE`). --disk is not restricted.
    #[arg(long, value_name = "DIR", requires = "api_socket")]
    pub api_disk_dir: Vec<PathBuf>,
    /// Upgrade without a hang-up: if a daemon started with the same option listens on PATH,
    /// take its disks over (sockets, connected frontends and their sessions) instead of opening
    /// sockets anew; then listen on PATH for the next daemon. Give the same disks. See below.
    #[arg(long, value_name = "PATH", conflicts_with = "api_socket")]
    pub handover_socket: Option<PathBuf>,
    /// Virtqueues offered per disk unless its spec says `queues=` (VIRTIO_BLK_F_MQ above 1);
    /// each has its own backend.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=spec::MAX_QUEUES as i64))]
    pub queues: u16,
    /// `--io-mode` and `--idle-budget-us`.
    #[command(flatten)]
    pub io: exitless_args::VhostIoArgs,
    /// IOCore threads serving the queues of all disks; each disk's queues go to the one with the
    /// fewest queues so far.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub iocores: u16,
    /// Pin the IOCores to these host CPUs (IOCore k to the k-th, round robin). A pinned
    /// sidecore or eventfd IOCore owns its CPU: it runs in the idle scheduling class, so the
    /// kernel's work there (a disk's completions) runs at once; another busy thread on that CPU
    /// would hold it off for about a second at a time (a watcher thread moves it, within about
    /// 40 ms, to the batch class, an eventfd one to the normal class, for a while, and the
    /// IOCore says so; it then shares the CPU: give it a CPU of its own).
    #[arg(long, value_name = "CPU[,CPU...]", value_delimiter = ',')]
    pub iocore_cpu: Vec<usize>,
    /// Print each disk's figures on standard output every SECS seconds and when stopping:
    /// requests, bytes, I/O errors, refused requests, IOPS, MB/s and service-time percentiles
    /// (p50, p99, max) over the interval, rate-limit waits.
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub stats_interval: Option<u64>,
    /// With --stats-interval: one JSON object per disk and line.
    #[arg(long)]
    pub json: bool,
    /// `--seccomp`: how strictly each thread is confined.
    #[command(flatten)]
    pub seccomp: exitless_args::SeccompArgs,
}

/// The long help: how the daemon behaves, beyond each option.
pub const AFTER_HELP: &str = "\
Serves each disk on its own socket to one frontend at a time, and keeps serving across
reconnections: the disk stays open, and every write the guest saw completed is in it. Frontends
of different disks connect, disconnect and fail independently; one that misbehaves costs only
its own connection. A frontend that connects to a disk while another is served is refused at
once (\"another frontend is connected to this disk\" in the log). A frontend is dropped, and the
next one accepted, when it sends a malformed or refused message (call, error and kick
descriptors must be eventfds), has not negotiated its features 10 s after connecting, pauses
5 s inside a message or leaves its replies unread for 5 s, or shrinks the memory it shared (its
rings get an error eventfd signal; the daemon survives the SIGBUS). Every reason is logged,
with the disk's socket. SIGINT or SIGTERM stops it within 2 s, whatever the frontends do.

Restarts: the daemon tracks the requests it holds in memory it shares with the frontend
(VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD). Give QEMU a reconnecting chardev (-chardev
socket,...,reconnect=1) and start the next daemon on the same socket and disk: after a kill -9
it resubmits what the old one held; after SIGTERM (which finishes the requests held) there is
nothing to resubmit. QEMU 7.2 retries once a second, so its guest's I/O pauses about 1 s.

Upgrades without a hang-up (--handover-socket PATH): start every daemon with the same
--handover-socket. A daemon started while another listens on PATH takes the disks over
instead of binding their sockets: the old daemon stops taking requests on every ring, lets them
finish what they hold (bounded by reset-timeout), and passes each disk's listening socket, its
frontend's connected socket and the session (features, memory table, in-flight region, rings
with their next avail index and eventfds, cache mode) to the new one over PATH (SCM_RIGHTS).
The new one rebuilds each session by replaying it as vhost-user messages through the checks a
frontend's messages get, then says it is ready; the old one commits, exits with status 0, and
the new one starts the rings and serves on, listening on PATH for its own successor. The
frontend's connection never closes (QEMU sees no reconnection); a hand-over happens only
between two of its messages, and a message it sent meanwhile waits in the socket for the new
daemon. The new daemon must be given the same disks (sockets, files, queues, serial numbers)
in the same order: otherwise it is refused with one line saying why, exits with status 125, and
the old daemon serves on. So does a hand-over while a live migration's dirty logging is on, or
of a new RAM disk (ram=SIZE; serve a /dev/shm file instead). If the new daemon fails or dies
before the commit, the old one starts its rings again where they stopped and logs why; a new
daemon that dies after it leaves the frontend to reconnect as after a crash. Without a
successor, SIGTERM stops the daemon as usual. Not with --api-socket. PATH is made its owner's
alone (mode 0600), and each daemon checks that the other runs as its own user.

Cache mode: writable disks offer VIRTIO_BLK_F_CONFIG_WCE, so the guest switches a disk between
write back (the default: writes complete in the page cache, FLUSH makes them durable) and write
through (each write completes once durable) with SET_CONFIG of the writeback byte, e.g. Linux's
/sys/block/vda/cache_type. The mode is the disk's, not the connection's: it holds for all its
queues and for the next frontend (QEMU does not send it again when it reconnects, and reports
what GET_CONFIG says to a new guest), until the daemon exits; a new daemon starts write back.
Read-only disks do not offer it. Any other SET_CONFIG is refused.

Who may connect: every socket the daemon makes (disks, --api-socket, --handover-socket) is
created mode 0600 whatever the umask (never wider, not for an instant), and each connection's
user (SO_PEERCRED) is checked before a byte of it is read: only the daemon's own user and root
are served unless the operator says otherwise for the disks' sockets. A refused process is
logged with its uid, gid and pid, and its connection closed; the daemon serves on. QEMU run by
another user (libvirt's): --socket-owner UID gives each disk's socket to that user (root
only) and serves it too; or --socket-owner :GID --socket-mode 660 gives the sockets to a group
of the daemon's and serves processes of that group. A path is only replaced when it holds a
stale socket of the daemon's user (or of --socket-owner's): a regular file, a symbolic link, a
directory or another user's socket there is an error, left alone. Put the sockets in a
directory only the daemon's user may write (or a sticky one, such as /tmp).

Shared data plane: the rings of all connected frontends are served by --iocores IOCore threads
(default one). Disks are placed in the order given, each on the IOCore with the fewest queues
so far (so disk i goes to IOCore i mod N when disks have equal queue counts); a ring joins its
IOCore when the frontend starts it and leaves when it stops, while the IOCore keeps serving
the others. Each pass of an IOCore takes at most 16 requests from each ring in turn, so a ring
at queue depth 64 cannot starve one at depth 1.

A disk that does not answer: a reset (the frontend leaving, GET_VRING_BASE, RESET_OWNER)
waits for the requests the disk holds, since they write into the frontend's memory. After
reset-timeout=SECS (default 5) it cancels them (a cancelled request is answered with an I/O
error), waits up to 1 s more, and quarantines what no cancel ended (a FUSE or NFS request its
server never answers): the old guest memory and io_uring stay with those requests until the
disk finishes them (looked at every 0.1 s, connected or not), and the disk is opened again for
the next frontend, which is served at once. A ring whose in-flight region asks for requests
to be resubmitted waits to start until its quarantine is empty, so that no late original can
land over what the resubmitted copy was answered for.
A warning says how many were held, cancelled and quarantined; GET /disks/NAME and /metrics
count them (reset_timeouts, reset_cancelled, quarantined).

QoS: iops=N and bw=BYTES are token buckets per disk (shared by its queues), holding one
second's budget (the burst) and starting full. A request over the limit waits in the ring; it
is not failed. Over t seconds a disk serves at most N*(t+1) requests and BYTES*(t+1) bytes
plus one request.

Control API (--api-socket PATH; made 0600 whatever the umask, and only the daemon's user and
root are served; never loosen it). A disk added through it opens a file (`path`, or `ram`:
true with `path`) only if the file lies inside an --api-disk-dir DIR: the path is resolved
beneath DIR's descriptor (openat2 RESOLVE_BENEATH), so `..` or a symbolic link leading out of
DIR is refused with 403, and the disk is opened through what that lookup found. Without
--api-disk-dir, only ram=SIZE and null=SIZE disks may be added. --disk is the operator's own
and is not restricted.
  GET    /disks            every disk: spec, IOCore, frontend_connected, counts
  GET    /disks/NAME       one disk
  PUT    /disks/NAME       add one; the body holds --disk's keys: {\"socket\": \"/tmp/c.sock\",
                           \"path\": \"/srv/disks/c.img\", \"direct\": true, \"iops\": 5000} (201;
                           409 when the name or socket is taken; 403 for a file outside
                           every --api-disk-dir)
  PATCH  /disks/NAME       new limits, {\"iops\": 1000, \"bw\": null} (null: no limit), in force
                           for the disk's next requests
  DELETE /disks/NAME       stop serving it, close it, remove its socket (204); refused with 409
                           while a frontend is connected: detach the disk from its VM first
  GET    /metrics          Prometheus text format: exitless_disk_requests_total,
                           _bytes_total, _request_duration_seconds, _rate_limit_waits_total,
                           exitless_iocore_busy_seconds_total, _idle_seconds_total, ...
Errors are 4xx with {\"error\": \"...\"}. One request per connection; a client has 5 s to send
it. A request is answered once it is done: an open of a disk that takes over 30 s (a file system
that does not answer) is given up with 504, and that disk is not added. Adding or removing a
disk leaves the other disks' frontends and rings alone.

Examples:
  exitless vhost-user-blk --socket /tmp/vhost.sock --disk path=disk.img &
  exitless vhost-user-blk --disk socket=/tmp/a.sock,path=a.img,direct \\
      --disk socket=/tmp/b.sock,ram=1G,iops=10000 --stats-interval 10 &
  qemu-system-x86_64 -m 1G -object memory-backend-memfd,id=mem,size=1G,share=on \\
      -machine memory-backend=mem -chardev socket,id=vu,path=/tmp/a.sock \\
      -device vhost-user-blk-pci,chardev=vu ...
  exitless vhost-user-blk --api-socket /tmp/api.sock --api-disk-dir /srv/disks &
  curl --unix-socket /tmp/api.sock -X PUT -d '{\"socket\":\"/tmp/d.sock\",\"ram\":\"1G\"}' \\
      http://localhost/disks/d
  curl --unix-socket /tmp/api.sock -X PUT \\
      -d '{\"socket\":\"/tmp/e.sock\",\"path\":\"/srv/disks/e.img\"}' http://localhost/disks/e";

/// `--socket-owner [UID][:GID]`: who the disks' sockets are given to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketOwner {
    /// The user, if named.
    pub uid: Option<u32>,
    /// The group, if named.
    pub gid: Option<u32>,
}

/// Why a `--socket-owner` value is not one.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
enum OwnerError {
    /// The user or the group is not a number.
    #[error("{what} {part:?} is not a number (see `id -u USER`)")]
    NotANumber {
        what: &'static str,
        part: String,
        #[source]
        source: ParseIntError,
    },
    /// Neither a user nor a group.
    #[error("give UID, UID:GID or :GID")]
    Empty,
}

/// Why a `--socket-mode` value is not one.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
enum ModeError {
    /// Not an octal number.
    #[error("{text:?} is not an octal mode such as 600 or 660")]
    NotOctal {
        text: String,
        #[source]
        source: ParseIntError,
    },
    /// It lets other users in.
    #[error("{0}: a socket is never open to every user; give 600 or 660 (and --socket-owner)")]
    OpenToAll(String),
    /// The owner could not read and write.
    #[error("{0}: the owner needs read and write (6 in the first digit)")]
    OwnerLockedOut(String),
}

fn parse_owner(text: &str) -> Result<SocketOwner, OwnerError> {
    let number = |part: &str, what: &'static str| -> Result<Option<u32>, OwnerError> {
        if part.is_empty() {
            return Ok(None);
        }
        part.parse().map(Some).map_err(|source| OwnerError::NotANumber { what, part: part.into(), source })
    };
    let (uid, gid) = text.split_once(':').unwrap_or((text, ""));
    let owner = SocketOwner { uid: number(uid, "the user")?, gid: number(gid, "the group")? };
    if owner.uid.is_none() && owner.gid.is_none() {
        return Err(OwnerError::Empty);
    }
    Ok(owner)
}

fn parse_mode(text: &str) -> Result<u32, ModeError> {
    let mode = u32::from_str_radix(text.trim_start_matches("0o"), 8)
        .map_err(|source| ModeError::NotOctal { text: text.into(), source })?;
    if mode & !0o770 != 0 {
        return Err(ModeError::OpenToAll(text.into()));
    }
    if mode & 0o600 != 0o600 {
        return Err(ModeError::OwnerLockedOut(text.into()));
    }
    Ok(mode)
}

#[cfg(test)]
mod tests {
    use super::{parse_mode, parse_owner, SocketOwner};

    #[test]
    fn socket_owner_and_mode_take_numbers_and_refuse_a_socket_open_to_all() {
        assert_eq!(parse_owner("64055"), Ok(SocketOwner { uid: Some(64055), gid: None }));
        assert_eq!(parse_owner("1:2"), Ok(SocketOwner { uid: Some(1), gid: Some(2) }));
        assert_eq!(parse_owner(":2"), Ok(SocketOwner { uid: None, gid: Some(2) }));
        assert!(parse_owner(":").is_err() && parse_owner("qemu").unwrap_err().to_string().contains("id -u"));
        assert_eq!((parse_mode("600"), parse_mode("0660")), (Ok(0o600), Ok(0o660)));
        assert!(parse_mode("666").unwrap_err().to_string().contains("every user"));
        assert!(parse_mode("060").unwrap_err().to_string().contains("owner"));
        assert!(parse_mode("9").is_err());
    }
}
