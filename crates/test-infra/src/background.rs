//! An `exitless` process running in the background while a test talks to it (an API socket, a
//! migration socket), its standard output and error going to files.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Far beyond what a run takes; a run that takes longer is stuck, and fails the test.
pub const RUN_LIMIT: Duration = Duration::from_secs(180);

/// When a started `exitless` is ready.
#[derive(Debug, Clone, Copy)]
pub enum Ready<'a> {
    /// This path exists (a socket it listens on).
    Exists(&'a Path),
    /// Its standard error says this.
    Says(&'a str),
}

/// A running `exitless` with its output in `dir/NAME.out` and `dir/NAME.err`; killed when
/// dropped (a failed test leaves no daemon behind).
pub struct Background {
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Background {
    /// Start `exitless ARGS` and wait until `ready` exists (a socket it listens on).
    pub fn start(dir: &Path, name: &str, args: &[&str], ready: &Path) -> Background {
        Background::start_in(None, dir, name, args, Ready::Exists(ready))
    }

    /// Start `exitless ARGS`, in the network namespace `netns` if one is named (`ip netns
    /// exec`, which becomes exitless: the process is exitless's), and wait until it is `ready`.
    pub fn start_in(netns: Option<&str>, dir: &Path, name: &str, args: &[&str], ready: Ready) -> Background {
        let stdout = dir.join(format!("{name}.out"));
        let stderr = dir.join(format!("{name}.err"));
        let mut child = crate::command_in(netns, crate::exitless_bin())
            .args(args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("start exitless");
        let started = Instant::now();
        let is_ready = || match ready {
            Ready::Exists(path) => path.exists(),
            Ready::Says(text) => read(&stderr).contains(text),
        };
        while !is_ready() {
            let ended = child.try_wait().unwrap();
            assert!(
                ended.is_none() && started.elapsed() < RUN_LIMIT,
                "{name}: not ready ({ready:?}); stderr: {}",
                read(&stderr)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        Background { child, stdout, stderr }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it wrote to standard error so far.
    pub fn stderr(&self) -> String {
        read(&self.stderr)
    }

    /// Has it ended?
    pub fn ended(&mut self) -> bool {
        self.child.try_wait().unwrap().is_some()
    }

    /// Wait for the process to end; its status code, standard output and error.
    pub fn wait(mut self) -> (Option<i32>, String, String) {
        let started = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > RUN_LIMIT {
                let _ = self.child.kill();
                panic!("exitless did not end; stderr: {}", read(&self.stderr));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        (status.code(), read(&self.stdout), read(&self.stderr))
    }

    /// Kill it; its standard output and error.
    pub fn kill(mut self) -> (String, String) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        (read(&self.stdout), read(&self.stderr))
    }

    /// Wait until the guest has written the first block of `disk`: its verify is under way.
    pub fn wait_for_first_write(&self, disk: &Path) {
        let started = Instant::now();
        let mut first = [0u8; 4096];
        loop {
            std::fs::File::open(disk).unwrap().read_exact(&mut first).unwrap();
            if first.iter().any(|&b| b != 0) {
                return;
            }
            assert!(started.elapsed() < RUN_LIMIT, "the guest never wrote; stderr: {}", self.stderr());
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn read(path: &Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
}

impl Drop for Background {
    fn drop(&mut self) {
        // After `wait` or `kill` the child is reaped already: both fail harmlessly.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
