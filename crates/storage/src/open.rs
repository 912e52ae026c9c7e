//! Opening a file the user named (a kernel, a disk image) without blocking on it.
//!
//! A plain `open` of a FIFO for reading waits for a writer, and opening a device node can have
//! side effects (a tape rewinds). So the path is first opened with O_PATH, which opens nothing,
//! and its type checked; only a path of the wanted type is then opened for I/O, with O_NONBLOCK
//! (a path swapped for a FIFO in between fails the second check instead of blocking), and
//! O_NONBLOCK is cleared again: io_uring answers EAGAIN instead of waiting on a file that has it.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use thiserror::Error;

/// What the path must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    /// A regular file (a kernel image, a file to map).
    RegularFile,
    /// A regular file or a block device (a disk image served through io_uring).
    Disk,
}

impl Wanted {
    fn accepts(self, kind: FileKind) -> bool {
        match self {
            Wanted::RegularFile => kind == FileKind::Regular,
            Wanted::Disk => matches!(kind, FileKind::Regular | FileKind::BlockDevice),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Wanted::RegularFile => "a regular file",
            Wanted::Disk => "a regular file or block device",
        }
    }
}

/// The type of a file system object, as `fstat` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A regular file.
    Regular,
    /// A block device node.
    BlockDevice,
    /// A character device node (a terminal, /dev/null...).
    CharacterDevice,
    /// A directory.
    Directory,
    /// A named pipe.
    Fifo,
    /// A Unix socket.
    Socket,
    /// Anything else.
    Other,
}

impl FileKind {
    /// The type of the object `file` is open on.
    pub fn of(file: &File) -> std::io::Result<FileKind> {
        let kind = file.metadata()?.file_type();
        Ok(if kind.is_file() {
            FileKind::Regular
        } else if kind.is_block_device() {
            FileKind::BlockDevice
        } else if kind.is_char_device() {
            FileKind::CharacterDevice
        } else if kind.is_dir() {
            FileKind::Directory
        } else if kind.is_fifo() {
            FileKind::Fifo
        } else if kind.is_socket() {
            FileKind::Socket
        } else {
            FileKind::Other
        })
    }

    fn name(self) -> &'static str {
        match self {
            FileKind::Regular => "a regular file",
            FileKind::BlockDevice => "a block device",
            FileKind::CharacterDevice => "a character device",
            FileKind::Directory => "a directory",
            FileKind::Fifo => "a FIFO",
            FileKind::Socket => "a socket",
            FileKind::Other => "not a file",
        }
    }
}

/// Why a path could not be opened.
#[derive(Debug, Error)]
pub enum OpenError {
    /// The system refused to open or inspect it.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// It is there, but of the wrong type.
    #[error("is {}, not {}", .found.name(), .wanted.name())]
    WrongKind {
        /// What the path is.
        found: FileKind,
        /// What it should have been.
        wanted: Wanted,
    },
}

/// Open `path` for reading (and writing unless `read_only`) with the extra `flags` (such as
/// O_DIRECT), refusing anything that is not `wanted`, without blocking on it.
pub fn open_without_blocking(
    path: &Path,
    read_only: bool,
    flags: i32,
    wanted: Wanted,
) -> Result<File, OpenError> {
    let check = |file: &File| match FileKind::of(file)? {
        found if wanted.accepts(found) => Ok(()),
        found => Err(OpenError::WrongKind { found, wanted }),
    };
    check(&OpenOptions::new().read(true).custom_flags(libc::O_PATH).open(path)?)?;
    let file =
        OpenOptions::new().read(true).write(!read_only).custom_flags(flags | libc::O_NONBLOCK).open(path)?;
    check(&file)?;
    // SAFETY: F_GETFL and F_SETFL on a descriptor `file` owns; no memory is involved.
    let cleared = unsafe {
        let status = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
        status >= 0 && libc::fcntl(file.as_raw_fd(), libc::F_SETFL, status & !libc::O_NONBLOCK) == 0
    };
    if !cleared {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fifo(dir: &Path) -> std::path::PathBuf {
        let path = dir.join("fifo");
        let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path that lives across the call.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        path
    }

    fn refusal(path: &Path, read_only: bool, wanted: Wanted) -> String {
        open_without_blocking(path, read_only, 0, wanted).unwrap_err().to_string()
    }

    #[test]
    fn refuses_what_is_not_wanted_with_its_type_and_never_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = fifo(dir.path());
        // Read-only is the case that would wait for a writer.
        assert_eq!(refusal(&fifo, true, Wanted::Disk), "is a FIFO, not a regular file or block device");
        assert_eq!(refusal(&fifo, false, Wanted::RegularFile), "is a FIFO, not a regular file");
        assert_eq!(
            refusal(Path::new("/dev/zero"), true, Wanted::Disk),
            "is a character device, not a regular file or block device"
        );
        assert_eq!(
            refusal(dir.path(), false, Wanted::Disk),
            "is a directory, not a regular file or block device"
        );
    }

    #[test]
    fn opens_a_regular_file_blocking_again_and_says_why_a_missing_one_fails() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk");
        std::fs::write(&path, [0u8; 512]).unwrap();
        let file = open_without_blocking(&path, false, 0, Wanted::Disk).unwrap();
        // SAFETY: F_GETFL on a descriptor `file` owns.
        let status = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        assert_eq!(status & libc::O_NONBLOCK, 0, "O_NONBLOCK cleared");
        assert_eq!(status & libc::O_ACCMODE, libc::O_RDWR);
        let missing = refusal(&dir.path().join("missing"), true, Wanted::RegularFile);
        assert!(missing.contains("No such file"), "{missing}");
    }
}
