//! A control API's listening thread (`--api-socket`), for the vhost-user daemon and the VMM
//! alike. It speaks HTTP/1.1 on a Unix socket (`curl --unix-socket`), one request per
//! connection, and hands each whole request to the owner's control thread, which answers it.
//!
//! The thread never blocks on a client: connections are non-blocking and polled together, at
//! most [`MAX_CLIENTS`] at once, and each has [`CLIENT_TIME`] to send its request and read the
//! answer, so a client that connects and never sends, or never reads, only loses its own
//! connection. The data plane (the IOCores) never waits for this thread or the control thread.
//! While the control thread works on a request, this thread waits for its answer, however long
//! it takes: an answer given before the work ends could tell a client that something failed
//! which then goes on and succeeds. Each owner bounds its own work instead: the daemon gives up
//! opening a disk after `disks::OPEN_LIMIT` (and then adds nothing), the VMM's verbs bound
//! their waits (a pause gives up after 5 s for the vCPUs and 10 s for a disk's requests, a
//! migration after 30 s without word from its peer), and a migration or a snapshot takes as
//! long as the guest's memory takes to send or write.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use unix_socket::{check_peer, listen, remove_socket, Access, ListenError};

use crate::{Request, Response};

/// Clients served at once; more wait in the listen backlog.
const MAX_CLIENTS: usize = 16;
/// How long a client has to send its request, and again to read the answer.
const CLIENT_TIME: Duration = Duration::from_secs(5);

/// A request for the control thread, with where its answer goes.
pub struct Call {
    /// The whole request, parsed.
    pub request: Request,
    /// Where the answer goes; the client waits for it.
    pub reply: SyncSender<Response>,
}

/// Why the API could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The socket could not be made.
    #[error(transparent)]
    Listen(#[from] ListenError),
    /// The listening socket could not be made non-blocking.
    #[error("cannot make {path} non-blocking: {source}")]
    Nonblocking {
        /// The socket's path.
        path: String,
        /// fcntl's error.
        source: std::io::Error,
    },
    /// The thread could not be spawned.
    #[error("cannot start the control API's thread: {0}")]
    Thread(std::io::Error),
    /// Its eventfd, or its copy of the stop descriptor, could not be made.
    #[error("cannot make the control API's descriptors: {0}")]
    Fds(std::io::Error),
}

/// A daemon's control API as its control thread sees it: the server thread, the calls it hands
/// over, and the eventfd that says there are some (to poll with the control thread's others).
pub struct ControlApi {
    server: ApiServer,
    calls: Receiver<Call>,
    wake: File,
}

impl ControlApi {
    /// Serve the API on `path` from a thread that runs `confine` first and stops when `stop`
    /// fires.
    pub fn start<E: std::fmt::Display>(
        path: &Path,
        stop: &OwnedFd,
        confine: impl FnOnce() -> Result<(), E> + Send + 'static,
    ) -> Result<ControlApi, ServerError> {
        let (wake_writer, wake) = eventfd_pair().map_err(ServerError::Fds)?;
        let (sender, calls) = mpsc::sync_channel(16);
        let stop = stop.try_clone().map_err(ServerError::Fds)?;
        let server = ApiServer::start(path, stop, confine, sender, wake_writer)?;
        log::info!("control API on {}", path.display());
        Ok(ControlApi { server, calls, wake })
    }

    /// The descriptor that becomes readable when calls wait.
    pub fn wake_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.wake)
    }

    /// Answer every call waiting with `handle` (the eventfd drained first).
    pub fn answer(&self, mut handle: impl FnMut(&Request) -> Response) {
        let mut count = [0u8; 8];
        let _ = (&self.wake).read(&mut count);
        while let Ok(call) = self.calls.try_recv() {
            let _ = call.reply.send(handle(&call.request));
        }
    }

    /// Wait for the server thread, once the stop descriptor fired.
    pub fn join(self) {
        self.server.join();
    }
}

/// Is `name` fit to name a resource in an API path (`/disks/NAME`, `/nics/NAME`) and the
/// metrics: 1 to [`MAX_NAME`] letters, digits, `.`, `_` or `-`, not starting with `.`?
pub fn is_resource_name(name: &str) -> bool {
    (1..=MAX_NAME).contains(&name.len())
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// The longest resource name.
pub const MAX_NAME: usize = 64;

/// A JSON error answer: `{"error": "..."}`.
pub fn error(status: u16, message: impl std::fmt::Display) -> Response {
    Response::json(status, serde_json::json!({ "error": message.to_string() }).to_string())
}

/// A non-blocking eventfd as two files: the end to write, and the end to poll and drain. The
/// owner stops the server by writing one (`ApiServer::start`'s `stop`); the server writes the
/// other when it hands over a call (`wake`).
pub fn eventfd_pair() -> std::io::Result<(File, File)> {
    // SAFETY: eventfd takes no pointer; the descriptor it returns is checked, then owned.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok((File::from(fd.try_clone()?), File::from(fd)))
}

/// The API's socket and thread; the socket file is removed when the thread ends.
pub struct ApiServer {
    thread: JoinHandle<()>,
}

impl ApiServer {
    /// Listen on `path` and serve from a new thread until `stop` is readable. The thread calls
    /// `confine` (its seccomp filter) before it reads a byte; when that fails it serves
    /// nothing. Requests go to `calls`, and `wake` is written so the control thread looks.
    pub fn start<E: std::fmt::Display>(
        path: &Path,
        stop: OwnedFd,
        confine: impl FnOnce() -> Result<(), E> + Send + 'static,
        calls: SyncSender<Call>,
        wake: File,
    ) -> Result<ApiServer, ServerError> {
        // Whoever may write to the socket controls every disk, the files in --api-disk-dir and
        // where disks' sockets are bound: the socket is its owner's alone, and only its user and
        // root are served.
        let access = Access::owner_only();
        let listener = listen(path, &access)?;
        listener
            .set_nonblocking(true)
            .map_err(|source| ServerError::Nonblocking { path: path.display().to_string(), source })?;
        let path = path.to_path_buf();
        let thread = std::thread::Builder::new()
            .name("api".into())
            .spawn(move || {
                let _socket = RemoveOnDrop(path, access.clone());
                if let Err(e) = confine() {
                    log::error!("{e}; the control API is not served");
                    return;
                }
                serve(&listener, &stop, &Control { calls, wake }, &access);
            })
            .map_err(ServerError::Thread)?;
        Ok(ApiServer { thread })
    }

    /// Wait for the thread, once the stop descriptor fired.
    pub fn join(self) {
        let _ = self.thread.join();
    }
}

/// The socket's path, removed as the thread ends if it is still our socket.
struct RemoveOnDrop(PathBuf, Access);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        remove_socket(&self.0, &self.1);
    }
}

/// The way to the control thread.
struct Control {
    calls: SyncSender<Call>,
    wake: File,
}

impl Control {
    fn answer(&self, request: Request) -> Response {
        let (reply, answer) = mpsc::sync_channel(1);
        if self.calls.send(Call { request, reply }).is_err() {
            return error(503, "the process is stopping");
        }
        let _ = (&self.wake).write_all(&1u64.to_ne_bytes());
        answer.recv().unwrap_or_else(|_| error(503, "the request was dropped: the process is stopping"))
    }
}

/// One client's connection.
struct Client {
    stream: UnixStream,
    /// Read so far, until the request is whole.
    read: Vec<u8>,
    /// The answer and how much of it is written, once there is one.
    answer: Option<(Vec<u8>, usize)>,
    deadline: Instant,
    done: bool,
}

impl Client {
    fn respond(&mut self, response: &Response) {
        self.answer = Some((response.to_bytes(), 0));
        self.deadline = Instant::now() + CLIENT_TIME;
        self.write();
    }

    /// Read what arrived; answer once the request is whole or cannot be.
    fn read(&mut self, control: &Control) {
        let mut chunk = [0u8; 4096];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    // The client closed its side before its request was whole.
                    self.done = true;
                    return;
                }
                Ok(n) => self.read.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.done = true;
                    return;
                }
            }
            match crate::parse(&self.read) {
                Ok(None) => continue,
                Ok(Some(request)) => return self.respond(&control.answer(request)),
                Err(e) => return self.respond(&error(e.status(), e)),
            }
        }
    }

    fn write(&mut self) {
        let Some((bytes, written)) = &mut self.answer else { return };
        while *written < bytes.len() {
            match self.stream.write(&bytes[*written..]) {
                Ok(n) => *written += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        self.done = true;
    }

    fn expire(&mut self, now: Instant) {
        if now < self.deadline {
            return;
        }
        if self.answer.is_none() {
            // Best effort: a client too slow to send may still read why it is dropped.
            let message = format!("the request did not arrive within {} s", CLIENT_TIME.as_secs());
            let _ = self.stream.write(&error(408, message).to_bytes());
        }
        self.done = true;
    }
}

fn serve(listener: &UnixListener, stop: &OwnedFd, control: &Control, access: &Access) {
    let mut clients: Vec<Client> = Vec::with_capacity(MAX_CLIENTS);
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(MAX_CLIENTS + 2);
    loop {
        fds.clear();
        fds.push(pollfd(stop.as_raw_fd(), libc::POLLIN));
        let accepting = clients.len() < MAX_CLIENTS;
        fds.push(pollfd(if accepting { listener.as_raw_fd() } else { -1 }, libc::POLLIN));
        for client in &clients {
            let events = if client.answer.is_some() { libc::POLLOUT } else { libc::POLLIN };
            fds.push(pollfd(client.stream.as_raw_fd(), events));
        }
        let now = Instant::now();
        let next = clients.iter().map(|c| c.deadline.saturating_duration_since(now)).min();
        let timeout = next.map_or(-1, |d| i32::try_from(d.as_millis() + 1).unwrap_or(i32::MAX));
        let nfds = libc::nfds_t::try_from(fds.len()).unwrap_or(libc::nfds_t::MAX);
        // SAFETY: `fds` holds `nfds` initialised pollfds; poll writes only their `revents`.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), nfds, timeout) };
        if n < 0 {
            continue;
        }
        if fds[0].revents != 0 {
            return;
        }
        for (client, fd) in clients.iter_mut().zip(&fds[2..]) {
            if fd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 && client.answer.is_none() {
                client.read(control);
            } else if fd.revents & (libc::POLLOUT | libc::POLLHUP | libc::POLLERR) != 0 {
                client.write();
            }
            client.expire(Instant::now());
        }
        clients.retain(|c| !c.done);
        if accepting && fds[1].revents != 0 {
            accept(listener, &mut clients, access);
        }
    }
}

fn accept(listener: &UnixListener, clients: &mut Vec<Client>, access: &Access) {
    while clients.len() < MAX_CLIENTS {
        match listener.accept() {
            Ok((stream, _)) => {
                // Another user's client is closed before a byte of its request is read.
                if let Err(refused) = check_peer(&stream, access) {
                    log::warn!("control API: {refused}; connection closed");
                    continue;
                }
                if stream.set_nonblocking(true).is_err() {
                    continue;
                }
                let deadline = Instant::now() + CLIENT_TIME;
                clients.push(Client { stream, read: Vec::new(), answer: None, deadline, done: false });
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            // WouldBlock: none left; anything else (out of descriptors): try on the next wake.
            Err(_) => return,
        }
    }
}

fn pollfd(fd: i32, events: libc::c_short) -> libc::pollfd {
    libc::pollfd { fd, events, revents: 0 }
}
