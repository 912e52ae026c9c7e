//! A loop block device over a file, for the backend matrix's `loop` disk.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A loop device (`losetup --find --direct-io=on`) over a file; detached when dropped.
pub struct LoopDevice {
    /// `/dev/loopN`.
    pub path: PathBuf,
}

impl LoopDevice {
    /// Attach `file` (on a file system that takes O_DIRECT) to a free loop device that does
    /// direct I/O on it.
    pub fn attach(file: &Path) -> Result<LoopDevice, String> {
        let out = Command::new("losetup")
            .args(["--find", "--show", "--direct-io=on"])
            .arg(file)
            .output()
            .map_err(|e| format!("cannot run losetup ({e}): install mount (scripts/setup.sh does)"))?;
        if !out.status.success() {
            return Err(format!(
                "losetup --find --show --direct-io=on {}: {} (it needs root and the loop module)",
                file.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(LoopDevice { path: PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()) })
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("--detach").arg(&self.path).status();
    }
}
