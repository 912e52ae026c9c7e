//! `--disk` on the command line.
//!
//! - `path=FILE[,readonly][,direct]`: a raw file or block device, served through io_uring
//!   (`direct`: O_DIRECT, bypassing the host page cache, where the file system allows it).
//! - `ram=SIZE`: a new RAM disk of SIZE bytes (e.g. 1G), gone when the VM ends.
//! - `ram,path=FILE[,readonly]`: an existing file on a memory file system (/dev/shm), mapped
//!   and shared with the host, so host tools read the very same bytes.

use std::path::PathBuf;

use storage::DiskSpec as DiskBackend;

pub fn parse(text: &str) -> Result<DiskBackend, String> {
    let mut path = None;
    let mut ram = None;
    let (mut read_only, mut direct) = (false, false);
    for option in text.split(',') {
        match option.split_once('=') {
            Some(("path", value)) if !value.is_empty() => path = Some(PathBuf::from(value)),
            Some(("ram", size)) => ram = Some(Some(crate::size::parse(size)?)),
            None if option == "ram" => ram = Some(None),
            None if option == "readonly" => read_only = true,
            None if option == "direct" => direct = true,
            _ => return Err(format!("unknown disk option `{option}`; see `exitless run --help`")),
        }
    }
    if ram.is_some() && direct {
        return Err("`direct` applies to `path=FILE` disks, not RAM disks".into());
    }
    match (ram, path) {
        (None, Some(path)) => Ok(DiskBackend::File { path, read_only, direct }),
        (Some(None), Some(path)) => Ok(DiskBackend::RamFile { path, read_only }),
        (Some(Some(size)), None) if !read_only => {
            if size == 0 || !size.is_multiple_of(512) {
                return Err(format!("RAM disk size {size} is not a non-zero multiple of 512 bytes"));
            }
            Ok(DiskBackend::Ram { size })
        }
        (Some(Some(_)), Some(_)) => {
            Err("give `ram=SIZE` for a new RAM disk or `ram,path=FILE` for an existing one, not both".into())
        }
        (Some(Some(_)), None) => Err("a new RAM disk cannot be read-only (it would be all zeros)".into()),
        (Some(None), None) => {
            Err("`ram` needs a size (`ram=1G`) or a file (`ram,path=/dev/shm/disk`)".into())
        }
        (None, None) => Err("a disk needs `path=FILE` or `ram=SIZE`".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_forms() {
        assert_eq!(
            parse("path=/tmp/d.img,readonly,direct").unwrap(),
            DiskBackend::File { path: "/tmp/d.img".into(), read_only: true, direct: true }
        );
        assert_eq!(parse("ram=1G").unwrap(), DiskBackend::Ram { size: 1 << 30 });
        assert_eq!(
            parse("ram,path=/dev/shm/x").unwrap(),
            DiskBackend::RamFile { path: "/dev/shm/x".into(), read_only: false }
        );
    }

    #[test]
    fn refuses_what_makes_no_sense() {
        for bad in [
            "",
            "ram",
            "ram=0",
            "ram=1000",
            "ram=1G,readonly",
            "ram=1G,path=/x",
            "path=",
            "size=1G",
            "path=/x,fast",
            "ram,path=/x,direct",
        ] {
            assert!(parse(bad).is_err(), "{bad} accepted");
        }
    }
}
