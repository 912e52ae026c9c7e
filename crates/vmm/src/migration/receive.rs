//! The destination's side: wait on a Unix socket or a TCP port for one source, build the VM its
//! hello describes, fill guest memory from its records and apply its state. Every record is
//! checked against the VM built (a page run must lie inside one RAM region; the state must
//! describe the same machine); the first bad one ends the migration with an error, which the
//! source is told.
//!
//! A Unix socket is 0600 from the moment it exists, and a connection from a process of another
//! user (not root) is closed unread while the destination waits on for its source. On TCP, a
//! connection that does not complete a mutual TLS handshake with a certificate the CA signed is
//! closed unread the same way (`tcp+plain:` takes the first to connect). Every byte of the
//! stream, the handshake's too, is read and parsed by a thread of its own, confined by its
//! seccomp filter (`ThreadKind::StateReader`) before it accepts: the main thread, which builds
//! the VM, only ever sees what that thread has parsed and checked.

use std::io::BufReader;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::Instant;

use sandbox::{Filter, ThreadKind};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use super::transport::{self, Conn, Listener, MigrationTls};
use super::url::MigrationUrl;
use super::wire::{self, Hello, Record, PAGE};
use super::MigrationError;
use crate::snapshot::Snapshot;
use crate::vm::{Vm, VmConfig, VmError};

/// What the destination saw of a migration.
#[derive(Debug, Clone, Default)]
pub struct Received {
    /// Page records taken.
    pub records: u64,
    /// Pages in them (a page sent again in a later round counts again).
    pub pages: u64,
    /// From the state record's arrival to the VM ready to run.
    pub apply_ms: f64,
    /// Connections refused: a process of another user's (Unix socket), or a peer that did not
    /// complete the TLS handshake with a certificate the CA signed (TCP).
    pub refused_peers: u64,
}

/// What the reading thread tells the main thread.
enum FromReader {
    /// The source's hello, parsed and checked.
    Hello(Hello),
    /// The VM's state, parsed and checked against the hello; what came before it.
    State(Box<Snapshot>, Received),
    /// The source was told the VM runs here (`Ok`), or could not be.
    Answered(Result<(), MigrationError>),
    /// The stream (or the thread) failed; the source was told, if it could be.
    Failed(VmError),
}

/// What the main thread tells the reading thread.
enum ToReader {
    /// The VM is built: its guest memory, to fill.
    Built(GuestMemoryMmap),
    /// The state is applied: tell the source.
    Applied,
    /// Building or applying failed: tell the source why.
    Refused(String),
}

/// Wait on `url` for a source, and build the VM it sends: `unix:/PATH` (the socket file is
/// created with mode 0600, and removed once a source connected), `tcp:IP:PORT` (mutual TLS
/// with `tls`, which is then required) or `tcp+plain:IP:PORT` (no TLS: the first to connect is
/// taken). `base` gives what is this process's own (console, timeout, seccomp, CPU placement)
/// and the disks the operator named (`SavedConfig::to_vm_config`). The source is told whether
/// it worked.
pub fn receive(url: &str, base: VmConfig, tls: Option<Arc<MigrationTls>>) -> Result<(Vm, Received), VmError> {
    let parsed = MigrationUrl::parse(url)?;
    let tls = match &parsed {
        MigrationUrl::Tcp { tls: true, .. } => {
            Some(tls.ok_or_else(|| MigrationError::NeedsTls { url: url.to_string() })?)
        }
        _ => None,
    };
    let path = match &parsed {
        MigrationUrl::Unix(path) => Some(path.clone()),
        MigrationUrl::Tcp { .. } => None,
    };
    let filter = Filter::new(ThreadKind::StateReader, base.seccomp)?;
    let listener = Listener::bind(&parsed)?;
    match (&parsed, &tls) {
        (MigrationUrl::Unix(path), _) => log::info!("waiting for a live migration on {}", path.display()),
        (_, Some(tls)) => log::info!(
            "waiting for a live migration on {parsed} (mutual TLS: certificates from {})",
            tls.dir().display()
        ),
        (_, None) => log::warn!(
            "waiting for a live migration on {parsed}, unencrypted and unauthenticated: whoever \
             connects first is taken"
        ),
    }
    let (to_main, from_reader) = mpsc::channel();
    let (to_reader, from_main) = mpsc::channel();
    let own = crate::peer::own_uid();
    let name = url.to_string();
    let reader = std::thread::Builder::new()
        .name("state-reader".into())
        .spawn(move || read_stream(listener, (own, filter, name, tls), &to_main, &from_main))
        .map_err(VmError::Io);
    let reader = match reader {
        Ok(reader) => reader,
        Err(e) => {
            if let Some(path) = &path {
                let _ = std::fs::remove_file(path);
            }
            return Err(e);
        }
    };
    let outcome = build(path.as_ref(), base, &from_reader, &to_reader);
    drop(to_reader);
    let _ = reader.join();
    outcome
}

/// The main thread's part: build the VM the reader's hello describes, hand it guest memory, and
/// apply the state it parsed.
fn build(
    path: Option<&PathBuf>,
    base: VmConfig,
    from_reader: &Receiver<FromReader>,
    to_reader: &Sender<ToReader>,
) -> Result<(Vm, Received), VmError> {
    let next = || from_reader.recv().map_err(|_| VmError::from(MigrationError::ThreadGone));
    let first = next();
    // A source has connected (or the reader gave up): nobody else is to find the socket.
    if let Some(path) = path {
        let _ = std::fs::remove_file(path);
    }
    let hello = match first? {
        FromReader::Hello(hello) => hello,
        FromReader::Failed(e) => return Err(e),
        _ => return Err(MigrationError::ThreadGone.into()),
    };
    let refuse = |e: VmError| {
        let _ = to_reader.send(ToReader::Refused(e.to_string()));
        e
    };
    let vm = hello
        .config
        .to_vm_config(base)
        .map_err(VmError::from)
        .and_then(|config| Vm::build(&config, None))
        .and_then(|vm| {
            vm.check_disk_sizes(&hello.config)?;
            let total: u64 = vm.memory().iter().map(|r| r.len()).sum();
            match total == hello.memory_bytes {
                true => Ok(vm),
                false => Err(MigrationError::Stream(format!(
                    "the hello says {} bytes of guest memory, its configuration {total}",
                    hello.memory_bytes
                ))
                .into()),
            }
        })
        .map_err(refuse)?;
    let _ = to_reader.send(ToReader::Built(vm.memory().clone()));
    let (snapshot, mut received) = match next()? {
        FromReader::State(snapshot, received) => (snapshot, received),
        FromReader::Failed(e) => return Err(e),
        _ => return Err(MigrationError::ThreadGone.into()),
    };
    let started = Instant::now();
    vm.apply_snapshot(&snapshot).map_err(refuse)?;
    received.apply_ms = started.elapsed().as_secs_f64() * 1e3;
    let _ = to_reader.send(ToReader::Applied);
    match next()? {
        // The source ends its VM only on this answer: if it could not be sent, the source
        // resumes, and this side must not run the guest too.
        FromReader::Answered(answered) => answered?,
        FromReader::Failed(e) => return Err(e),
        _ => return Err(MigrationError::ThreadGone.into()),
    }
    Ok((vm, received))
}

/// The reading thread: confine itself, accept the source (on a Unix socket a process of this
/// uid or root; on TCP with TLS a peer whose certificate the CA signed), and read, parse and
/// check its stream, telling the source how it went.
fn read_stream(
    listener: Listener,
    (own, filter, url, tls): (u32, Filter, String, Option<Arc<MigrationTls>>),
    to_main: &Sender<FromReader>,
    from_main: &Receiver<ToReader>,
) {
    let failed = |e: VmError| {
        let _ = to_main.send(FromReader::Failed(e));
    };
    if let Err(e) = filter.install() {
        return failed(e.into());
    }
    let (conn, refused_peers) = match transport::accept(&listener, own, tls.as_deref()) {
        Ok(accepted) => accepted,
        Err(e) => return failed(e.into()),
    };
    drop(listener);
    let mut reader = BufReader::with_capacity(1 << 16, conn);
    let hello = wire::read_hello(&mut reader);
    let mut tell_source = |outcome: Result<(), String>| tell(&mut reader, outcome);
    let hello = match hello {
        Ok(hello) => hello,
        Err(e) => {
            let _ = tell_source(Err(e.to_string()));
            return failed(e.into());
        }
    };
    if let Err(e) = hello.config.check() {
        let _ = tell_source(Err(e.to_string()));
        return failed(e.into());
    }
    let _ = to_main.send(FromReader::Hello(hello.clone()));
    let mem = match from_main.recv() {
        Ok(ToReader::Built(mem)) => mem,
        Ok(ToReader::Refused(why)) => {
            let _ = tell_source(Err(why));
            return;
        }
        _ => return,
    };
    if let Err(e) = tell_source(Ok(())) {
        return failed(e.into());
    }
    let received = Received { refused_peers, ..Received::default() };
    let taken = take(&mut reader, &mem, &hello, &url, received);
    let mut tell_source = |outcome: Result<(), String>| tell(&mut reader, outcome);
    match taken {
        Ok((snapshot, received)) => {
            let _ = to_main.send(FromReader::State(Box::new(snapshot), received));
        }
        Err(e) => {
            let _ = tell_source(Err(e.to_string()));
            return failed(e);
        }
    }
    match from_main.recv() {
        Ok(ToReader::Applied) => {
            let _ = to_main.send(FromReader::Answered(tell_source(Ok(()))));
        }
        Ok(ToReader::Refused(why)) => {
            let _ = tell_source(Err(why));
        }
        _ => {}
    }
}

/// Answer the source on the connection `reader` reads (what it read ahead stays in its buffer).
fn tell(reader: &mut BufReader<Conn>, outcome: Result<(), String>) -> Result<(), MigrationError> {
    wire::write_reply(reader.get_mut(), outcome.as_ref().map(|_| ()).map_err(String::as_str))
}

/// Read the records into `mem` up to the state, and parse and check the state.
fn take(
    reader: &mut BufReader<Conn>,
    mem: &GuestMemoryMmap,
    hello: &Hello,
    url: &str,
    mut received: Received,
) -> Result<(Snapshot, Received), VmError> {
    let mut buffer = Vec::new();
    loop {
        match wire::read_record(reader)? {
            Record::Pages { gpa, pages } => {
                let len = u64::from(pages) * PAGE;
                let regions = mem.iter().map(|r| (r.start_addr().0, r.len()));
                if !wire::inside_one_region(regions, gpa, len) {
                    return Err(MigrationError::Stream(format!(
                        "{pages} pages at {gpa:#x} are not inside guest memory"
                    ))
                    .into());
                }
                buffer.resize(usize::try_from(len).unwrap_or(0), 0);
                std::io::Read::read_exact(reader, &mut buffer)
                    .map_err(|source| MigrationError::Io { what: "reading pages", source })?;
                mem.write_slice(&buffer, GuestAddress(gpa)).map_err(crate::snapshot::SnapshotError::from)?;
                received.records += 1;
                received.pages += u64::from(pages);
            }
            Record::State(json) => {
                let snapshot = Snapshot::parse(&json, std::path::Path::new(url))?;
                if snapshot.config != hello.config || snapshot.memory_bytes != hello.memory_bytes {
                    return Err(MigrationError::Stream(
                        "the state describes another machine than the hello".into(),
                    )
                    .into());
                }
                return Ok((snapshot, received));
            }
        }
    }
}
