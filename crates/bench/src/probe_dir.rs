//! A directory of one bench run's sockets and logs, with the probe ELF exported into it for the
//! VMMs that boot it from a file; removed when dropped.

use std::path::{Path, PathBuf};

use thiserror::Error;

/// Why a run's directory could not be made.
#[derive(Debug, Error)]
pub enum ProbeDirError {
    /// The directory could not be made.
    #[error("cannot make {}: {source}", .path.display())]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The probe ELF could not be written into it.
    #[error("cannot export the probe to {}: {source}", .path.display())]
    Export {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// `exitless-bench-PURPOSE-PID` in the temporary directory, holding `exitless-probe.elf`.
pub struct ProbeDir {
    dir: PathBuf,
    elf: PathBuf,
}

impl ProbeDir {
    /// Makes the directory for `purpose` (a word naming the scenario) and exports the probe.
    pub fn make(purpose: &str) -> Result<ProbeDir, ProbeDirError> {
        let dir = std::env::temp_dir().join(format!("exitless-bench-{purpose}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|source| ProbeDirError::Dir { path: dir.clone(), source })?;
        // Owned from here, so a failed export removes the directory too.
        let made = ProbeDir { elf: dir.join("exitless-probe.elf"), dir };
        probe_image::export(&made.elf)
            .map_err(|source| ProbeDirError::Export { path: made.elf.clone(), source })?;
        Ok(made)
    }

    /// The directory, for sockets and logs.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The probe ELF in it.
    pub fn elf(&self) -> &Path {
        &self.elf
    }
}

impl Drop for ProbeDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
