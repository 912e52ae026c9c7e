//! QEMU-KVM as a peer VMM: boots the same probe guest with `-M microvm`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum QemuError {
    #[error("cannot start {binary}: {source}")]
    Spawn { binary: PathBuf, source: std::io::Error },
    #[error("QEMU did not finish within {0:?}")]
    Timeout(Duration),
    #[error("QEMU failed (status {status:?}): {stderr}")]
    Failed { status: Option<i32>, stderr: String },
}

pub struct Qemu {
    pub binary: PathBuf,
    /// First line of `--version`.
    pub version: String,
}

/// One finished QEMU run.
pub struct QemuRun {
    pub stdout: String,
    /// The value the guest wrote to isa-debug-exit (QEMU exits with `(V << 1) | 1`).
    pub guest_status: u8,
    pub command_line: String,
}

impl Qemu {
    /// `$EXITLESS_QEMU` or `qemu-system-x86_64` from PATH, if it runs.
    pub fn find() -> Option<Qemu> {
        let binary =
            std::env::var_os("EXITLESS_QEMU").map_or_else(|| "qemu-system-x86_64".into(), PathBuf::from);
        let output = Command::new(&binary).arg("--version").output().ok()?;
        let version = String::from_utf8_lossy(&output.stdout).lines().next()?.trim().to_string();
        output.status.success().then_some(Qemu { binary, version })
    }

    /// The arguments that boot `kernel` the way exitless does: microvm, KVM, COM1 on stdio and
    /// the isa-debug-exit port.
    pub fn probe_args(kernel: &Path, cmdline: &str, mem_mib: u64) -> Vec<String> {
        [
            "-M",
            "microvm",
            "-accel",
            "kvm",
            "-m",
            &format!("{mem_mib}M"),
            "-smp",
            "1",
            "-nographic",
            "-nodefaults",
            "-no-reboot",
            "-serial",
            "stdio",
            "-device",
            "isa-debug-exit,iobase=0xf4,iosize=1",
            "-kernel",
            &kernel.display().to_string(),
            "-append",
            cmdline,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// Boot the probe ELF at `kernel` with `cmdline` and wait for it to exit.
    pub fn run_probe(&self, kernel: &Path, cmdline: &str, timeout: Duration) -> Result<QemuRun, QemuError> {
        let args = Self::probe_args(kernel, cmdline, 256);
        let command_line = format!("{} {}", self.binary.display(), shell_words(&args));
        let mut child = Command::new(&self.binary)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| QemuError::Spawn { binary: self.binary.clone(), source })?;
        // Drain both pipes on their own threads so a chatty guest cannot block QEMU.
        let mut stdout = child.stdout.take().expect("piped stdout");
        let mut stderr = child.stderr.take().expect("piped stderr");
        let out = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stdout.read_to_string(&mut s);
            s
        });
        let err = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        let started = Instant::now();
        let status = loop {
            if let Some(status) =
                child.try_wait().map_err(|source| QemuError::Spawn { binary: self.binary.clone(), source })?
            {
                break status;
            }
            if started.elapsed() > timeout {
                let _ = child.kill();
                let _ = child.wait();
                return Err(QemuError::Timeout(timeout));
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let stdout = out.join().unwrap_or_default();
        let stderr = err.join().unwrap_or_default();
        match status.code() {
            Some(code) if code & 1 == 1 && !stdout.is_empty() => {
                Ok(QemuRun { stdout, guest_status: (code >> 1) as u8, command_line })
            }
            code => Err(QemuError::Failed { status: code, stderr: stderr.trim().to_string() }),
        }
    }
}

/// Arguments joined for display, quoted where they hold spaces.
pub fn shell_words(args: &[String]) -> String {
    args.iter()
        .map(|a| if a.contains(' ') || a.is_empty() { format!("'{a}'") } else { a.clone() })
        .collect::<Vec<_>>()
        .join(" ")
}
