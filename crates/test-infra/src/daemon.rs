//! `exitless vhost-user-blk` as a child process, for the tests that serve disks through it: one
//! way to start it (`Daemon::builder`: its disks, sockets, mode and environment), as a `Daemon`,
//! as a `Console` whose standard output is read line by line, or as a bare `Command`.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::console::Console;

/// A daemon that has not listened on its sockets by then is stuck.
const LISTEN_LIMIT: Duration = Duration::from_secs(20);

/// How to start `exitless vhost-user-blk`: its arguments in order, the sockets it must listen on
/// before a test goes on, its environment.
#[derive(Default)]
pub struct DaemonBuilder {
    args: Vec<OsString>,
    sockets: Vec<PathBuf>,
    env: Vec<(OsString, OsString)>,
    /// The daemon's umask, when the test sets one.
    umask: Option<libc::mode_t>,
    /// The network namespace it runs in (a simulated host), if not the test's.
    netns: Option<String>,
}

impl DaemonBuilder {
    /// `--socket SOCKET`: the one socket of a daemon whose disks are given without `socket=`.
    pub fn socket(mut self, socket: &Path) -> Self {
        self.args.extend(["--socket".into(), socket.into()]);
        self.sockets.push(socket.to_owned());
        self
    }

    /// `--disk SPEC` (`path=F[,direct]`, `ram=SIZE`, ...), served on the `--socket`.
    pub fn disk(mut self, spec: &str) -> Self {
        self.args.extend(["--disk".into(), spec.into()]);
        self
    }

    /// `--disk socket=SOCKET,SPEC`: a disk on a socket of its own.
    pub fn disk_on(mut self, socket: &Path, spec: &str) -> Self {
        self.args.extend(["--disk".into(), format!("socket={},{spec}", socket.display()).into()]);
        self.sockets.push(socket.to_owned());
        self
    }

    /// `--api-socket SOCKET`: its control API, which it listens on before a test goes on.
    pub fn api_socket(self, socket: &Path) -> Self {
        self.args(&["--api-socket".as_ref(), socket.as_os_str()], &[socket])
    }

    /// `--handover-socket SOCKET`: where it hands its disks over, which it listens on before a
    /// test goes on.
    pub fn handover_socket(self, socket: &Path) -> Self {
        self.args(&["--handover-socket".as_ref(), socket.as_os_str()], &[socket])
    }

    /// `--io-mode MODE`.
    pub fn io_mode(mut self, mode: &str) -> Self {
        self.args.extend(["--io-mode".into(), mode.into()]);
        self
    }

    /// Arguments as they are, after those given so far; `sockets`: those among them it listens on.
    pub fn args(mut self, args: &[impl AsRef<OsStr>], sockets: &[&Path]) -> Self {
        self.args.extend(args.iter().map(|a| a.as_ref().to_owned()));
        self.sockets.extend(sockets.iter().map(|s| s.to_path_buf()));
        self
    }

    /// An environment variable for the daemon.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env.push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// Run it in network namespace `netns` (a simulated host: its TCP connections, to a Ceph
    /// cluster, leave from there; its Unix sockets are files, reachable from anywhere).
    pub fn netns(mut self, netns: &str) -> Self {
        self.netns = Some(netns.to_owned());
        self
    }

    /// The daemon's umask (the test's own otherwise).
    pub fn umask(mut self, umask: libc::mode_t) -> Self {
        self.umask = Some(umask);
        self
    }

    /// The command, for a test that runs and waits for it its own way (one that must die).
    pub fn command(&self) -> Command {
        let mut command = crate::command_in(self.netns.as_deref(), crate::exitless_bin());
        command.arg("vhost-user-blk").args(&self.args).stdin(Stdio::null());
        for (key, value) in &self.env {
            command.env(key, value);
        }
        if let Some(umask) = self.umask {
            use std::os::unix::process::CommandExt;
            // SAFETY: umask is async-signal-safe and touches no memory; nothing else runs in
            // the child between fork and exec.
            unsafe {
                command.pre_exec(move || {
                    libc::umask(umask);
                    Ok(())
                })
            };
        }
        command
    }

    /// As `start`, its log in DIR/daemon.log.
    pub fn start_in(self, dir: &Path) -> Daemon {
        self.start(&dir.join("daemon.log"))
    }

    /// Start it, its standard error in `log` and its standard output discarded; returns once it
    /// listens on every socket.
    pub fn start(self, log: &Path) -> Daemon {
        self.spawn(log, None)
    }

    /// As `start`, with its standard output in the file `stdout` (read with `Daemon::stdout` and
    /// `Daemon::stop_with_stdout`).
    pub fn start_with_stdout(self, log: &Path, stdout: &Path) -> Daemon {
        self.spawn(log, Some(stdout))
    }

    /// Start it with its standard output read line by line and its standard error in `log`;
    /// returns once it listens on every socket.
    pub fn start_console(self, log: &Path) -> Console {
        let mut console = Console::spawn(&mut self.command(), log);
        let deadline = Instant::now() + LISTEN_LIMIT;
        while !self.sockets.iter().all(|s| s.exists()) {
            assert!(
                Instant::now() < deadline,
                "the daemon did not listen within {LISTEN_LIMIT:?}: {}",
                console.stderr()
            );
            console.assert_running("the daemon");
            std::thread::sleep(Duration::from_millis(20));
        }
        console
    }

    fn spawn(self, log: &Path, stdout: Option<&Path>) -> Daemon {
        let output = stdout.map_or_else(Stdio::null, |path| std::fs::File::create(path).unwrap().into());
        let child = self
            .command()
            .stdout(output)
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .expect("run exitless vhost-user-blk");
        let mut daemon =
            Daemon { child, sockets: self.sockets, log: log.to_owned(), stdout: stdout.map(Path::to_owned) };
        let deadline = Instant::now() + LISTEN_LIMIT;
        while !daemon.sockets.iter().all(|s| s.exists()) {
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
}

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
    /// What to start: add disks, sockets, mode, environment, then `start` it.
    pub fn builder() -> DaemonBuilder {
        DaemonBuilder::default()
    }

    /// The daemon serving `disk` (a `--disk` spec) in `io_mode` on DIR/vhost.sock: add more,
    /// then `start_in(dir)` (its log in DIR/daemon.log).
    pub fn serving(dir: &Path, disk: &str, io_mode: &str) -> DaemonBuilder {
        Daemon::builder().socket(&dir.join("vhost.sock")).disk(disk).io_mode(io_mode)
    }

    /// `exitless vhost-user-blk ARGS`, its standard error in `log`, its standard output
    /// discarded; returns once every one of `sockets` exists.
    pub fn start(args: &[impl AsRef<OsStr>], sockets: &[&Path], log: &Path) -> Daemon {
        Daemon::builder().args(args, sockets).start(log)
    }

    /// As `start`, with its standard output in the file `stdout` (read with `stdout` and
    /// `stop_with_stdout`).
    pub fn start_with_stdout(
        args: &[impl AsRef<OsStr>],
        sockets: &[&Path],
        log: &Path,
        stdout: &Path,
    ) -> Daemon {
        Daemon::builder().args(args, sockets).start_with_stdout(log, stdout)
    }

    /// The first socket it was started with: a one-disk daemon's only one.
    pub fn socket(&self) -> &Path {
        &self.sockets[0]
    }

    /// Its process id.
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

    /// Panics, with its log, if the daemon has ended.
    pub fn assert_alive(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("the daemon died ({status}); its log: {}", self.log());
        }
    }

    /// SIGTERM, and wait: its exit status, whatever it is, and its log.
    pub fn stop_status(mut self) -> (ExitStatus, String) {
        // SAFETY: kill(2) touches no memory of ours; the pid is our child's, reaped only by
        // the wait below (`assert_alive` panics when it finds the daemon ended).
        unsafe { libc::kill(libc::pid_t::try_from(self.child.id()).unwrap(), libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        (status, self.log())
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
        unsafe { libc::kill(libc::pid_t::try_from(self.child.id()).unwrap(), libc::SIGTERM) };
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
