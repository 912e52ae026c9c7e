//! A loop block device over a file, for the backend matrix's `loop` disk.

use std::path::{Path, PathBuf};
use std::process::Command;

use thiserror::Error;

/// Why a loop device could not be attached.
#[derive(Debug, Error)]
pub enum LoopError {
    /// losetup could not be run.
    #[error("cannot run losetup ({0}): install mount (scripts/setup.sh does)")]
    Spawn(#[source] std::io::Error),
    /// losetup ran and failed.
    #[error(
        "losetup --find --show --direct-io=on {}: {stderr} (it needs root and the loop module)",
        .file.display()
    )]
    Failed { file: PathBuf, stderr: String },
}

/// A loop device (`losetup --find --direct-io=on`) over a file; detached when dropped.
pub struct LoopDevice {
    /// `/dev/loopN`.
    pub path: PathBuf,
}

impl LoopDevice {
    /// Attach `file` (on a file system that takes O_DIRECT) to a free loop device that does
    /// direct I/O on it.
    pub fn attach(file: &Path) -> Result<LoopDevice, LoopError> {
        let out = Command::new("losetup")
            .args(["--find", "--show", "--direct-io=on"])
            .arg(file)
            .output()
            .map_err(LoopError::Spawn)?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
            return Err(LoopError::Failed { file: file.to_owned(), stderr });
        }
        Ok(LoopDevice { path: PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()) })
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("--detach").arg(&self.path).status();
    }
}
