//! A backend process the bench starts (`exitless vhost-user-blk`, qemu-storage-daemon): its
//! messages in a log file, ready once it listens on its sockets, killed and reaped when dropped
//! or when it is stopped on purpose.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use thiserror::Error;

/// How long a backend may take to listen on its sockets.
const LISTEN_LIMIT: Duration = Duration::from_secs(10);

/// Why a backend could not be started, stopped or waited for.
#[derive(Debug, Error)]
pub enum DaemonError {
    /// Its log file could not be created.
    #[error("{}: {source}", .path.display())]
    Log {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The process could not be started.
    #[error("cannot start {name}: {source}")]
    Spawn {
        name: String,
        #[source]
        source: std::io::Error,
    },
    /// It exited, or took too long, before all its sockets existed.
    #[error("{name} did not create its sockets: {log}")]
    NoSockets { name: String, log: String },
    /// Its process id is not a `pid_t`, so it cannot be signalled.
    #[error("cannot signal {name}: its process id is out of range: {source}")]
    Pid {
        name: String,
        #[source]
        source: std::num::TryFromIntError,
    },
    /// It exited with a failure status after SIGTERM.
    #[error("{name} ended with {status} after SIGTERM: {log}")]
    FailedAfterSigterm { name: String, status: ExitStatus, log: String },
    /// It exited by itself with a failure status.
    #[error("{name} ended with {status}: {log}")]
    Failed { name: String, status: ExitStatus, log: String },
    /// SIGKILL could not be sent to it.
    #[error("cannot kill {name}: {source}")]
    Kill {
        name: String,
        #[source]
        source: std::io::Error,
    },
    /// It could not be reaped after SIGKILL.
    #[error("cannot reap {name}: {source}")]
    Reap {
        name: String,
        #[source]
        source: std::io::Error,
    },
    /// It did not exit in time (it was killed then).
    #[error("{name} did not exit within {limit:?} (killed): {log}")]
    Timeout { name: String, limit: Duration, log: String },
    /// Its exit could not be waited for.
    #[error("cannot wait for {name}: {source}")]
    Wait {
        name: String,
        #[source]
        source: std::io::Error,
    },
}

/// A backend process, killed and reaped when dropped.
pub struct Backend {
    child: Child,
    log: PathBuf,
    name: String,
}

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Backend {
    /// Starts `command` with its messages in `log`, and waits until every socket exists (10 s
    /// at most; it is killed if they do not).
    pub fn start(
        mut command: Command,
        sockets: &[PathBuf],
        log: &Path,
        name: &str,
    ) -> Result<Backend, DaemonError> {
        let file =
            std::fs::File::create(log).map_err(|source| DaemonError::Log { path: log.to_owned(), source })?;
        command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(file);
        dies_with_parent(&mut command);
        let child =
            command.spawn().map_err(|source| DaemonError::Spawn { name: name.to_string(), source })?;
        let mut backend = Backend { child, log: log.to_owned(), name: name.to_string() };
        let deadline = Instant::now() + LISTEN_LIMIT;
        while !sockets.iter().all(|s| s.exists()) {
            if Instant::now() > deadline || backend.child.try_wait().ok().flatten().is_some() {
                let log = backend.log().trim().to_string();
                return Err(DaemonError::NoSockets { name: name.to_string(), log });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(backend)
    }

    /// Process id, for CPU accounting.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// What it has written to its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, and wait for it to exit (killed if it has not within `limit`): how long it took
    /// and its log. It must exit with status 0.
    pub fn terminate(mut self, limit: Duration) -> Result<(Duration, String), DaemonError> {
        let sent = Instant::now();
        let pid = libc::pid_t::try_from(self.child.id())
            .map_err(|source| DaemonError::Pid { name: self.name.clone(), source })?;
        // SAFETY: kill(2) has no memory effects; `pid` is our child, not yet reaped (only
        // `Child::wait` below and the drop reap it).
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let status = self.wait_within(limit, sent)?;
        let took = sent.elapsed();
        if !status.success() {
            let log = self.log().trim().to_string();
            return Err(DaemonError::FailedAfterSigterm { name: self.name.clone(), status, log });
        }
        Ok((took, self.log()))
    }

    /// Wait for it to exit by itself with status 0 (within `limit` of `since`): how long after
    /// `since` it did, and its log.
    pub fn exited(mut self, limit: Duration, since: Instant) -> Result<(Duration, String), DaemonError> {
        let status = self.wait_within(limit, since)?;
        if !status.success() {
            let log = self.log().trim().to_string();
            return Err(DaemonError::Failed { name: self.name.clone(), status, log });
        }
        Ok((since.elapsed(), self.log()))
    }

    /// SIGKILL (kill -9), and reap it: its log.
    pub fn kill(mut self) -> Result<String, DaemonError> {
        self.child.kill().map_err(|source| DaemonError::Kill { name: self.name.clone(), source })?;
        self.child.wait().map_err(|source| DaemonError::Reap { name: self.name.clone(), source })?;
        Ok(self.log())
    }

    /// Its exit status once it has exited, waiting at most `limit` from `since`.
    fn wait_within(&mut self, limit: Duration, since: Instant) -> Result<ExitStatus, DaemonError> {
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if since.elapsed() < limit => std::thread::sleep(Duration::from_millis(1)),
                Ok(None) => {
                    let log = self.log().trim().to_string();
                    return Err(DaemonError::Timeout { name: self.name.clone(), limit, log });
                }
                Err(source) => return Err(DaemonError::Wait { name: self.name.clone(), source }),
            }
        }
    }
}

/// Makes `command`'s child get SIGKILL when the thread that started it ends (the bench stopped
/// by Ctrl-C or killed: no drop runs then), so that no daemon or VM outlives the bench. Start it
/// from a thread that lives as long as the child should (the bench's main thread).
pub fn dies_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the child between fork and exec and only calls prctl, which
    // is async-signal-safe, with plain integer arguments; it allocates nothing.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
}
