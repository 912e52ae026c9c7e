//! `exitless vhost-user-blk` as a child process, for the tests that serve disks through it.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A daemon that has not listened on its sockets by then is stuck.
const LISTEN_LIMIT: Duration = Duration::from_secs(20);

/// A running `exitless vhost-user-blk`, its standard error in a log file. Killed and reaped when
/// dropped, so a failed test leaves no daemon behind.
pub struct Daemon {
    child: Child,
    sockets: Vec<PathBuf>,
    log: PathBuf,
    /// Where its standard output goes; `None`: discarded.
    stdout: Option<PathBuf>,
}

impl Daemon {
    /// `exitless vhost-user-blk ARGS`, its standard error in `log`, its standard output
    /// discarded; returns once every one of `sockets` exists.
    pub fn start(args: &[impl AsRef<OsStr>], sockets: &[&Path], log: &Path) -> Daemon {
        Daemon::spawn(args, sockets, log, None)
    }

    /// As `start`, with its standard output in the file `stdout` (read with `stdout` and
    /// `stop_with_stdout`).
    pub fn start_with_stdout(
        args: &[impl AsRef<OsStr>],
        sockets: &[&Path],
        log: &Path,
        stdout: &Path,
    ) -> Daemon {
        Daemon::spawn(args, sockets, log, Some(stdout))
    }

    fn spawn(args: &[impl AsRef<OsStr>], sockets: &[&Path], log: &Path, stdout: Option<&Path>) -> Daemon {
        let output = stdout.map_or_else(Stdio::null, |path| std::fs::File::create(path).unwrap().into());
        let child = Command::new(env!("CARGO_BIN_EXE_exitless"))
            .arg("vhost-user-blk")
            .args(args)
            .stdin(Stdio::null())
            .stdout(output)
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .expect("run exitless vhost-user-blk");
        let mut daemon = Daemon {
            child,
            sockets: sockets.iter().map(|s| s.to_path_buf()).collect(),
            log: log.to_owned(),
            stdout: stdout.map(Path::to_owned),
        };
        let deadline = Instant::now() + LISTEN_LIMIT;
        while !sockets.iter().all(|s| s.exists()) {
            daemon.assert_alive();
            assert!(
                Instant::now() < deadline,
                "the daemon did not listen within {LISTEN_LIMIT:?}: {}",
                daemon.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        daemon
    }

    /// The first socket it was started with: a one-disk daemon's only one.
    pub fn socket(&self) -> &Path {
        &self.sockets[0]
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The process itself, for what the tests do to it beyond this (a SIGKILL mid-run).
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Its standard error so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its standard output so far; empty when it was started without `start_with_stdout`.
    pub fn stdout(&self) -> String {
        self.stdout.as_ref().and_then(|path| std::fs::read_to_string(path).ok()).unwrap_or_default()
    }

    pub fn assert_alive(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("the daemon died ({status}); its log: {}", self.log());
        }
    }

    /// SIGTERM; the daemon must exit with status 0. Returns its log.
    pub fn stop(mut self) -> String {
        self.terminate(None);
        self.log()
    }

    /// As `stop`, and the daemon must exit within `limit` of the signal.
    pub fn stop_within(mut self, limit: Duration) -> String {
        self.terminate(Some(limit));
        self.log()
    }

    /// As `stop`; returns its log and its standard output, with what it printed as it stopped.
    pub fn stop_with_stdout(mut self) -> (String, String) {
        self.terminate(None);
        (self.log(), self.stdout())
    }

    fn terminate(&mut self, limit: Option<Duration>) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = match limit {
            None => self.child.wait().unwrap(),
            Some(limit) => {
                let sent = Instant::now();
                loop {
                    if let Some(status) = self.child.try_wait().unwrap() {
                        break status;
                    }
                    assert!(
                        sent.elapsed() < limit,
                        "SIGTERM did not stop the daemon within {limit:?}: {}",
                        self.log()
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        };
        let log = self.log();
        assert_eq!(status.code(), Some(0), "the daemon's exit status; its log: {log}");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
