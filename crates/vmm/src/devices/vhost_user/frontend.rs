//! The VMM's end of a vhost-user connection: the requests a frontend sends, over the message code
//! of the `vhost-user-protocol` crate (which the daemon shares), with a time limit on every wait
//! and a strict check of every reply. The daemon is another trust domain: a reply of the wrong kind, size or
//! shape, descriptors it had no reason to send, or silence past the limit are errors, and after
//! the first error the connection is never used again.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use thiserror::Error;
use vhost_user_protocol::message::{
    code, request_name, Header, InflightInfo, MemoryRegion, VringAddr, Wire, FLAG_NEED_REPLY, FLAG_REPLY,
    INFLIGHT_INFO_LEN, VERSION, VRING_INDEX_MASK,
};

/// How long connecting may take (a daemon whose listen backlog is full).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the daemon has to answer a request (and to read one).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// Why talking to the vhost-user daemon failed.
#[derive(Debug, Error)]
pub enum FrontendError {
    #[error(
        "no vhost-user socket at {0}: start its daemon first (`exitless vhost-user-blk --disk socket={0},...` \
         for a disk, `exitless vhost-user-net --nic socket={0},...` for a NIC)"
    )]
    NoSocket(PathBuf),
    #[error(
        "nothing listens on the vhost-user socket {0} (a daemon that stopped leaves its socket file behind)"
    )]
    NotListening(PathBuf),
    #[error("the vhost-user socket path {0} is longer than a Unix socket address holds (107 bytes)")]
    PathTooLong(PathBuf),
    #[error("cannot connect to the vhost-user socket {path}: {source}")]
    Connect { path: PathBuf, source: io::Error },
    #[error(
        "the process listening on the vhost-user socket {path} runs as uid {peer}, not as this VMM's \
         user ({own}) or root: it is not sent the guest's memory (a daemon of another user is named \
         with `vhost-user=SOCKET,daemon-uid=UID`)"
    )]
    UntrustedDaemon { path: PathBuf, peer: u32, own: u32 },
    #[error("cannot tell who listens on the vhost-user socket {path}: {source}")]
    PeerUnknown { path: PathBuf, source: io::Error },
    #[error("the vhost-user daemon at {0} accepted no connection within {1} s")]
    ConnectTimeout(PathBuf, u64),
    #[error(
        "the vhost-user daemon at {0} closed the connection (it serves each disk to one frontend at a time: \
         is another VM using this disk? did the daemon stop?)"
    )]
    Closed(PathBuf),
    #[error("the vhost-user daemon at {path} did not answer {request} within {} s", REPLY_TIMEOUT.as_secs())]
    Timeout { path: PathBuf, request: &'static str },
    #[error("vhost-user {request} to {path}: {why}")]
    Wire { path: PathBuf, request: &'static str, why: String },
    #[error("the vhost-user daemon at {path} answered {request} with {what}")]
    BadReply { path: PathBuf, request: &'static str, what: String },
    #[error("the vhost-user daemon at {path} refused {request} (status {status})")]
    Refused { path: PathBuf, request: &'static str, status: u64 },
    #[error("the vhost-user daemon at {path} does not offer {what}, which exitless needs")]
    Missing { path: PathBuf, what: &'static str },
    #[error("the connection to the vhost-user daemon at {0} failed earlier and is not used again")]
    Broken(PathBuf),
}

/// The users a disk's daemon may run as: the VMM's own, root, and the one `daemon-uid=` names.
#[derive(Debug, Clone, Copy)]
pub struct DaemonUsers {
    own: u32,
    named: Option<u32>,
}

impl DaemonUsers {
    /// This process's user (read now: a reconnection runs on a thread whose filter has no
    /// geteuid), root and `named`.
    pub fn of_this_process_and(named: Option<u32>) -> DaemonUsers {
        DaemonUsers { own: crate::peer::own_uid(), named }
    }

    fn allows(&self, uid: u32) -> bool {
        crate::peer::trusted_peer(uid, self.own) || self.named == Some(uid)
    }
}

/// One connection to a vhost-user daemon (one disk).
pub struct Frontend {
    stream: UnixStream,
    path: PathBuf,
    /// REPLY_ACK was negotiated: requests without a reply of their own are acknowledged.
    reply_ack: bool,
    /// An earlier exchange failed: the connection's state is unknown, so it is not used.
    broken: bool,
}

impl Frontend {
    /// Connect to the daemon listening at `path`, within [`CONNECT_TIMEOUT`], if it runs as one
    /// of `users`: the connection carries the guest's memory, so whoever else bound the path (in
    /// a shared directory, say) gets not a byte.
    pub fn connect(path: &Path, users: DaemonUsers) -> Result<Frontend, FrontendError> {
        let stream = connect_unix(path)?;
        let peer = crate::peer::peer_uid(&stream)
            .map_err(|source| FrontendError::PeerUnknown { path: path.to_path_buf(), source })?;
        if !users.allows(peer) {
            return Err(FrontendError::UntrustedDaemon { path: path.to_path_buf(), peer, own: users.own });
        }
        Ok(Frontend { stream, path: path.to_path_buf(), reply_ack: false, broken: false })
    }

    /// The connection, for watching it for a hang-up.
    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }

    /// Has an exchange failed (so that nothing more is sent)?
    pub fn broken(&self) -> bool {
        self.broken
    }

    /// From now on, ask for an acknowledgement of every request that has no reply of its own.
    pub fn use_reply_ack(&mut self) {
        self.reply_ack = true;
    }

    pub fn set_owner(&mut self) -> Result<(), FrontendError> {
        self.exchange(code::SET_OWNER, &[], &[], None).map(drop)
    }

    /// GET_FEATURES or GET_PROTOCOL_FEATURES.
    pub fn get_u64(&mut self, request: u32) -> Result<u64, FrontendError> {
        let reply = self.exchange(request, &[], &[], Some(8))?;
        Ok(u64_at(&reply, 0))
    }

    /// SET_FEATURES or SET_PROTOCOL_FEATURES.
    pub fn set_u64(&mut self, request: u32, value: u64) -> Result<(), FrontendError> {
        self.exchange(request, &value.to_le_bytes(), &[], None).map(drop)
    }

    /// SET_VRING_NUM, SET_VRING_BASE or SET_VRING_ENABLE.
    pub fn set_vring_state(&mut self, request: u32, index: u32, num: u32) -> Result<(), FrontendError> {
        self.exchange(request, &state_bytes(index, num), &[], None).map(drop)
    }

    /// GET_VRING_BASE: stops the ring; returns where the daemon stopped in the avail ring.
    pub fn get_vring_base(&mut self, index: u32) -> Result<u32, FrontendError> {
        let request = code::GET_VRING_BASE;
        let reply = self.exchange(request, &state_bytes(index, 0), &[], Some(8))?;
        let (got_index, base) = (u32_at(&reply, 0), u32_at(&reply, 4));
        if got_index != index || base > u32::from(u16::MAX) {
            return Err(
                self.bad_reply(request, format!("vring {got_index} at base {base} for vring {index}"))
            );
        }
        Ok(base)
    }

    pub fn set_vring_addr(&mut self, addr: VringAddr) -> Result<(), FrontendError> {
        self.exchange(code::SET_VRING_ADDR, &addr.to_bytes(), &[], None).map(drop)
    }

    /// SET_VRING_KICK, SET_VRING_CALL or SET_VRING_ERR with `fd`.
    pub fn set_vring_fd(&mut self, request: u32, index: u32, fd: RawFd) -> Result<(), FrontendError> {
        let value = u64::from(index) & VRING_INDEX_MASK;
        self.exchange(request, &value.to_le_bytes(), &[fd], None).map(drop)
    }

    /// SET_MEM_TABLE: every region with the descriptor of the file it is mapped from.
    pub fn set_mem_table(&mut self, regions: &[(MemoryRegion, RawFd)]) -> Result<(), FrontendError> {
        let mut payload = Vec::with_capacity(8 + 32 * regions.len());
        // Fewer than MAX_REGIONS (8): the VMM has at most two.
        payload.extend_from_slice(&(regions.len() as u32).to_le_bytes());
        payload.extend_from_slice(&[0; 4]);
        for (region, _) in regions {
            payload.extend_from_slice(&region.to_bytes());
        }
        let fds: Vec<RawFd> = regions.iter().map(|(_, fd)| *fd).collect();
        self.exchange(code::SET_MEM_TABLE, &payload, &fds, None).map(drop)
    }

    /// GET_INFLIGHT_FD for one queue of `queue_size` descriptors: the daemon's region for
    /// its requests in flight, which outlives the daemon (the reply's descriptor).
    pub fn get_inflight_fd(&mut self, queue_size: u16) -> Result<(InflightInfo, OwnedFd), FrontendError> {
        let request = code::GET_INFLIGHT_FD;
        let asked = InflightInfo { num_queues: 1, queue_size, ..InflightInfo::default() };
        let (reply, fd) = self.exchange_fd(request, &asked.to_bytes(), INFLIGHT_INFO_LEN)?;
        let info = InflightInfo {
            mmap_size: u64_at(&reply, 0),
            mmap_offset: u64_at(&reply, 8),
            num_queues: u16_at(&reply, 16),
            queue_size: u16_at(&reply, 18),
        };
        if info.mmap_size == 0 {
            return Err(self.bad_reply(request, "an empty region".to_string()));
        }
        Ok((info, fd))
    }

    /// SET_INFLIGHT_FD: hand a (new) daemon the region its predecessor kept.
    pub fn set_inflight_fd(&mut self, info: InflightInfo, fd: RawFd) -> Result<(), FrontendError> {
        self.exchange(code::SET_INFLIGHT_FD, &info.to_bytes(), &[fd], None).map(drop)
    }

    /// GET_CONFIG of `size` bytes from offset 0; the reply must be exactly that.
    pub fn get_config(&mut self, size: u32) -> Result<Vec<u8>, FrontendError> {
        let request = code::GET_CONFIG;
        let mut payload = vec![0u8; 12 + size as usize];
        payload[4..8].copy_from_slice(&size.to_le_bytes());
        let reply = self.exchange(request, &payload, &[], Some(12 + size as usize))?;
        let (offset, got) = (u32_at(&reply, 0), u32_at(&reply, 4));
        if offset != 0 || got != size {
            return Err(self.bad_reply(request, format!("{got} bytes at offset {offset} for {size} at 0")));
        }
        Ok(reply[12..].to_vec())
    }

    /// Send `request` and wait for its reply (`reply_len`: a reply of its own of exactly that
    /// many bytes) or, with REPLY_ACK, its acknowledgement. Any failure breaks the connection.
    fn exchange(
        &mut self,
        request: u32,
        payload: &[u8],
        fds: &[RawFd],
        reply_len: Option<usize>,
    ) -> Result<Vec<u8>, FrontendError> {
        let ask = Ask { request, payload, fds, reply_len, reply_fd: false };
        self.checked_exchange(&ask).map(|(body, _)| body)
    }

    /// Send `request` and wait for its reply of `reply_len` bytes with one file descriptor.
    fn exchange_fd(
        &mut self,
        request: u32,
        payload: &[u8],
        reply_len: usize,
    ) -> Result<(Vec<u8>, OwnedFd), FrontendError> {
        let ask = Ask { request, payload, fds: &[], reply_len: Some(reply_len), reply_fd: true };
        match self.checked_exchange(&ask)? {
            (body, Some(fd)) => Ok((body, fd)),
            (_, None) => {
                self.broken = true;
                Err(self.bad_reply(request, "no file descriptor".to_string()))
            }
        }
    }

    fn checked_exchange(&mut self, ask: &Ask) -> Result<(Vec<u8>, Option<OwnedFd>), FrontendError> {
        if self.broken {
            return Err(FrontendError::Broken(self.path.clone()));
        }
        let result = self.try_exchange(ask);
        self.broken = result.is_err();
        result
    }

    /// One exchange; the reply may carry a descriptor only when `ask.reply_fd` says it should.
    fn try_exchange(&mut self, ask: &Ask) -> Result<(Vec<u8>, Option<OwnedFd>), FrontendError> {
        let Ask { request, payload, fds, reply_len, reply_fd } = *ask;
        let name = request_name(request).unwrap_or("request");
        let ack = reply_len.is_none() && self.reply_ack;
        let flags = VERSION | if ack { FLAG_NEED_REPLY } else { 0 };
        // Payloads here are at most 12 + 256 bytes.
        let header = Header { request, flags, size: payload.len() as u32 };
        let wire = Wire::new(&self.stream, REPLY_TIMEOUT).with_idle_limit(REPLY_TIMEOUT);
        wire.send(header, payload, fds).map_err(|e| self.wire_error(name, e))?;
        let expected = match (reply_len, ack) {
            (Some(len), _) => len,
            (None, true) => 8,
            (None, false) => return Ok((Vec::new(), None)),
        };
        let (reply, body, mut reply_fds) = match wire.recv() {
            Ok(Some(message)) => message,
            Ok(None) => return Err(FrontendError::Closed(self.path.clone())),
            Err(e) => return Err(self.wire_error(name, e)),
        };
        if reply.request != request {
            let got = request_name(reply.request).unwrap_or("an unknown request");
            return Err(self.bad_reply(request, format!("a reply to {got}")));
        }
        if reply.flags != VERSION | FLAG_REPLY {
            return Err(self.bad_reply(request, format!("header flags {:#x}", reply.flags)));
        }
        if reply_fds.len() > usize::from(reply_fd) {
            // Dropping them closes them.
            return Err(self.bad_reply(request, format!("{} file descriptors", reply_fds.len())));
        }
        if body.len() != expected {
            return Err(self.bad_reply(request, format!("{} bytes, expected {expected}", body.len())));
        }
        if reply_len.is_none() {
            let status = u64_at(&body, 0);
            if status != 0 {
                return Err(FrontendError::Refused { path: self.path.clone(), request: name, status });
            }
        }
        Ok((body, reply_fds.pop()))
    }

    fn bad_reply(&self, request: u32, what: String) -> FrontendError {
        let request = request_name(request).unwrap_or("request");
        FrontendError::BadReply { path: self.path.clone(), request, what }
    }

    fn wire_error(&self, request: &'static str, error: vhost_user_protocol::Error) -> FrontendError {
        use vhost_user_protocol::Error as E;
        let path = self.path.clone();
        let gone =
            |e: &io::Error| matches!(e.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset);
        let why = match error {
            E::Read(e) if e.kind() == io::ErrorKind::TimedOut => {
                return FrontendError::Timeout { path, request };
            }
            E::Stalled(_) | E::ReplyStalled(_) => return FrontendError::Timeout { path, request },
            E::Read(e) | E::Write(e) if gone(&e) => return FrontendError::Closed(path),
            E::Read(e) => format!("cannot read the reply: {e}"),
            E::Write(e) => format!("cannot send it: {e}"),
            E::Truncated => "the daemon closed the connection in the middle of its reply".to_string(),
            E::TooLarge(n) => format!("a reply of {n} bytes, longer than any reply"),
            E::TooManyFds => "a reply with too many file descriptors".to_string(),
            other => other.to_string(),
        };
        FrontendError::Wire { path, request, why }
    }
}

/// One request to the daemon and the reply it expects.
#[derive(Clone, Copy)]
struct Ask<'a> {
    request: u32,
    payload: &'a [u8],
    fds: &'a [RawFd],
    /// A reply of its own of exactly this many bytes; `None`: an acknowledgement, if negotiated.
    reply_len: Option<usize>,
    /// The reply carries one file descriptor.
    reply_fd: bool,
}

fn state_bytes(index: u32, num: u32) -> [u8; 8] {
    let mut bytes = [0u8; 8];
    bytes[..4].copy_from_slice(&index.to_le_bytes());
    bytes[4..].copy_from_slice(&num.to_le_bytes());
    bytes
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    bytes.get(at..at + 4).and_then(|b| b.try_into().ok()).map_or(0, u32::from_le_bytes)
}

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    bytes.get(at..at + 2).and_then(|b| b.try_into().ok()).map_or(0, u16::from_le_bytes)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    bytes.get(at..at + 8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes)
}

/// Connect a non-blocking stream socket to `path`. A full listen backlog (EAGAIN) is retried
/// until [`CONNECT_TIMEOUT`]; a blocking connect would wait for it without a limit.
fn connect_unix(path: &Path) -> Result<UnixStream, FrontendError> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: sockaddr_un is plain data; all zeros is a valid (empty) address.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(FrontendError::PathTooLong(path.to_path_buf()));
    }
    for (slot, &byte) in addr.sun_path.iter_mut().zip(bytes) {
        *slot = byte as libc::c_char;
    }
    // SAFETY: socket() with constant arguments; the result is checked.
    let fd = unsafe {
        libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0)
    };
    if fd < 0 {
        return Err(FrontendError::Connect { path: path.to_path_buf(), source: io::Error::last_os_error() });
    }
    // SAFETY: `fd` was just created and nobody else owns it.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let started = Instant::now();
    loop {
        // SAFETY: `addr` is a valid sockaddr_un that outlives the call, and its size is given.
        let rc = unsafe {
            libc::connect(
                socket.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            return Ok(UnixStream::from(socket));
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::EINTR) => {}
            Some(libc::EAGAIN) if started.elapsed() < CONNECT_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Some(libc::EAGAIN) => {
                return Err(FrontendError::ConnectTimeout(path.to_path_buf(), CONNECT_TIMEOUT.as_secs()));
            }
            Some(libc::ENOENT) => return Err(FrontendError::NoSocket(path.to_path_buf())),
            Some(libc::ECONNREFUSED) => return Err(FrontendError::NotListening(path.to_path_buf())),
            _ => return Err(FrontendError::Connect { path: path.to_path_buf(), source: error }),
        }
    }
}
