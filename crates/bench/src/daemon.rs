//! A backend process the bench starts (`exitless vhost-user-blk`, qemu-storage-daemon): its
//! messages in a log file, ready once it listens on its sockets, killed and reaped when dropped
//! or when it is stopped on purpose.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long a backend may take to listen on its sockets.
const LISTEN_LIMIT: Duration = Duration::from_secs(10);

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
    ) -> Result<Backend, String> {
        let file = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(file);
        dies_with_parent(&mut command);
        let child = command.spawn().map_err(|e| format!("cannot start {name}: {e}"))?;
        let mut backend = Backend { child, log: log.to_owned(), name: name.to_string() };
        let deadline = Instant::now() + LISTEN_LIMIT;
        while !sockets.iter().all(|s| s.exists()) {
            if Instant::now() > deadline || backend.child.try_wait().ok().flatten().is_some() {
                return Err(format!("{name} did not create its sockets: {}", backend.log().trim()));
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
    pub fn terminate(mut self, limit: Duration) -> Result<(Duration, String), String> {
        let sent = Instant::now();
        let pid = libc::pid_t::try_from(self.child.id()).map_err(|e| e.to_string())?;
        // SAFETY: kill(2) has no memory effects; `pid` is our child, not yet reaped (only
        // `Child::wait` below and the drop reap it).
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let status = self.wait_within(limit, sent)?;
        let took = sent.elapsed();
        if !status.success() {
            return Err(format!("{} ended with {status} after SIGTERM: {}", self.name, self.log().trim()));
        }
        Ok((took, self.log()))
    }

    /// Wait for it to exit by itself with status 0 (within `limit` of `since`): how long after
    /// `since` it did, and its log.
    pub fn exited(mut self, limit: Duration, since: Instant) -> Result<(Duration, String), String> {
        let status = self.wait_within(limit, since)?;
        if !status.success() {
            return Err(format!("{} ended with {status}: {}", self.name, self.log().trim()));
        }
        Ok((since.elapsed(), self.log()))
    }

    /// SIGKILL (kill -9), and reap it: its log.
    pub fn kill(mut self) -> Result<String, String> {
        self.child.kill().map_err(|e| format!("cannot kill {}: {e}", self.name))?;
        self.child.wait().map_err(|e| format!("cannot reap {}: {e}", self.name))?;
        Ok(self.log())
    }

    /// Its exit status once it has exited, waiting at most `limit` from `since`.
    fn wait_within(&mut self, limit: Duration, since: Instant) -> Result<ExitStatus, String> {
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if since.elapsed() < limit => std::thread::sleep(Duration::from_millis(1)),
                Ok(None) => {
                    return Err(format!(
                        "{} did not exit within {limit:?} (killed): {}",
                        self.name,
                        self.log().trim()
                    ))
                }
                Err(e) => return Err(format!("cannot wait for {}: {e}", self.name)),
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

/// A directory of one run's sockets and logs, removed at the end.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Makes `dir` (and its parents).
    pub fn make(dir: &Path) -> Result<TempDir, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        Ok(TempDir(dir.to_path_buf()))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
