//! The destination's side: wait on a Unix socket for one source, build the VM its hello
//! describes, fill guest memory from its records and apply its state. Every record is checked
//! against the VM built (a page run must lie inside one RAM region; the state must describe the
//! same machine); the first bad one ends the migration with an error, which the source is told.

use std::io::BufReader;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Instant;

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use super::wire::{self, Hello, Record, PAGE};
use super::{socket_from_url, MigrationError, PEER_TIMEOUT};
use crate::snapshot::Snapshot;
use crate::vm::{Vm, VmConfig, VmError};

/// What the destination saw of a migration.
#[derive(Debug, Clone, Default)]
pub struct Received {
    /// Page records taken, and the pages in them.
    pub records: u64,
    pub pages: u64,
    /// From the state record's arrival to the VM ready to run.
    pub apply_ms: f64,
}

/// Wait on `url` (`unix:/PATH`; the socket file is created, and removed once a source
/// connected) for a source, and build the VM it sends; `base` gives what is this process's own
/// (console, timeout, seccomp, CPU placement). The source is told whether it worked.
pub fn receive(url: &str, base: VmConfig) -> Result<(Vm, Received), VmError> {
    let path = socket_from_url(url)?;
    let socket = |what| {
        let path = path.clone();
        move |source| MigrationError::Socket { what, path, source }
    };
    let listener = UnixListener::bind(&path).map_err(socket("listen on"))?;
    log::info!("waiting for a live migration on {}", path.display());
    let accepted = listener.accept().map_err(socket("accept a source on"));
    drop(listener);
    let _ = std::fs::remove_file(&path);
    let (conn, _) = accepted?;
    conn.set_read_timeout(Some(PEER_TIMEOUT)).map_err(socket("set a timeout on"))?;
    conn.set_write_timeout(Some(PEER_TIMEOUT)).map_err(socket("set a timeout on"))?;
    let mut reply = conn.try_clone().map_err(socket("use"))?;
    let mut reader = BufReader::with_capacity(1 << 16, conn);
    let outcome = take(&mut reader, &mut reply, base, url);
    let answer = match &outcome {
        Ok(_) => wire::write_reply(&mut reply, Ok(())),
        Err(e) => wire::write_reply(&mut reply, Err(&e.to_string())),
    };
    let received = outcome?;
    // The source ends its VM only on this answer: if it cannot be sent, the source resumes,
    // and this side must not run the guest too.
    answer?;
    Ok(received)
}

fn take(
    reader: &mut BufReader<UnixStream>,
    reply: &mut UnixStream,
    base: VmConfig,
    url: &str,
) -> Result<(Vm, Received), VmError> {
    let hello: Hello = wire::read_hello(reader)?;
    let config = hello.config.to_vm_config(base)?;
    let vm = Vm::build(&config, None)?;
    let mem = vm.memory().clone();
    let total: u64 = mem.iter().map(|r| r.len()).sum();
    if total != hello.memory_bytes {
        return Err(MigrationError::Stream(format!(
            "the hello says {} bytes of guest memory, its configuration {total}",
            hello.memory_bytes
        ))
        .into());
    }
    wire::write_reply(reply, Ok(()))?;
    let mut received = Received::default();
    let mut buffer = Vec::new();
    loop {
        match wire::read_record(reader)? {
            Record::Pages { gpa, pages } => {
                let len = u64::from(pages) * PAGE;
                // Whole inside one region, or refused before a byte is written.
                let inside = gpa.checked_add(len).is_some()
                    && mem
                        .find_region(GuestAddress(gpa))
                        .is_some_and(|r| gpa - r.start_addr().0 + len <= r.len());
                if !inside {
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
                let started = Instant::now();
                let snapshot = Snapshot::parse(&json, std::path::Path::new(url))?;
                if snapshot.config != hello.config || snapshot.memory_bytes != hello.memory_bytes {
                    return Err(MigrationError::Stream(
                        "the state describes another machine than the hello".into(),
                    )
                    .into());
                }
                vm.apply_snapshot(&snapshot)?;
                received.apply_ms = started.elapsed().as_secs_f64() * 1e3;
                return Ok((vm, received));
            }
        }
    }
}
