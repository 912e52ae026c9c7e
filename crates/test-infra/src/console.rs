//! A process whose standard output (a guest's console) is read line by line as it comes, for
//! tests that act on the host when the guest says so.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// A process whose standard output is read line by line as it comes (a guest's console).
pub struct Console {
    child: Child,
    lines: Receiver<String>,
    /// Every line read so far.
    pub seen: Vec<String>,
    stderr: std::path::PathBuf,
}

impl Console {
    /// Start `command` with its standard error in the file `stderr`.
    pub fn spawn(command: &mut Command, stderr: &Path) -> Console {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(stderr).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line.trim_end().to_owned()).is_err() {
                    break;
                }
            }
        });
        Console { child, lines, seen: Vec::new(), stderr: stderr.to_owned() }
    }

    /// Its process id.
    pub fn pid(&self) -> i32 {
        libc::pid_t::try_from(self.child.id()).unwrap()
    }

    /// Panics, naming it `what`, with its output so far, if the process has ended.
    pub fn assert_running(&mut self, what: &str) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("{what} ended ({status}): {}", self.report());
        }
    }

    /// Standard error so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Wait for a line that `wanted` accepts and return it; panics, with the output so far, if
    /// the output ends or `timeout` passes first.
    pub fn wait_for(&mut self, timeout: Duration, wanted: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if wanted(&line) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("no such line within {timeout:?}: {}", self.report())
                }
                Err(RecvTimeoutError::Disconnected) => panic!("the output ended: {}", self.report()),
            }
        }
    }

    /// Read the rest of the output and wait for the process (ended, or killed, by now or within
    /// `timeout`: it is killed then).
    pub fn finish(mut self, timeout: Duration) -> (ExitStatus, Vec<String>) {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    panic!("still running after {timeout:?}: {}", self.report());
                }
            }
        }
        let status = self.child.wait().unwrap();
        (status, std::mem::take(&mut self.seen))
    }

    /// Read lines until none came for `quiet` (or `limit` passed), for output a guest may still
    /// have buffered.
    pub fn settle(&mut self, quiet: Duration, limit: Duration) {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            match self.lines.recv_timeout(quiet) {
                Ok(line) => self.seen.push(line),
                Err(_) => return,
            }
        }
    }

    /// SIGKILL the process; then as `finish`.
    pub fn kill(self, timeout: Duration) -> (ExitStatus, Vec<String>) {
        // SAFETY: kill(2) on our own child, which has not been waited for yet.
        unsafe { libc::kill(self.pid(), libc::SIGKILL) };
        self.finish(timeout)
    }

    fn report(&self) -> String {
        format!("stdout: {}\nstderr: {}", self.seen.join("\n"), self.stderr())
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
