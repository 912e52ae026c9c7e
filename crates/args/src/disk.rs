//! `--disk` on the command line.
//!
//! - `path=FILE[,readonly][,direct]`: a raw file or block device, served through io_uring
//!   (`direct`: O_DIRECT, bypassing the host page cache, where the file system allows it).
//! - `ram=SIZE`: a new RAM disk of SIZE bytes (e.g. 1G), gone when the VM ends.
//! - `ram,path=FILE[,readonly]`: an existing file on a memory file system (/dev/shm), mapped
//!   and shared with the host, so host tools read the very same bytes.
//! - `null=SIZE[,readonly]`: a null disk of SIZE bytes that holds nothing: reads return zeros,
//!   writes (and flushes, discards, write-zeroes) are accepted and dropped. Every request is
//!   checked (range, read-only) and completes at once, with no system call: the I/O path's own
//!   cost, the peer of QEMU's `null-co,read-zeroes=on`.
//! - `rbd=POOL/IMAGE[,conf=FILE][,id=USER][,readonly]`: an image in a Ceph cluster, through
//!   librbd (loaded when the first such disk opens). `conf=`: the cluster's configuration file
//!   (default: librados' usual places, /etc/ceph/ceph.conf); `id=`: the cephx user, without
//!   `client.` (default `admin`). librbd's cache is off: a write is answered once the cluster
//!   has it.
//! - `vhost-user=SOCKET[,reconnect=SECS][,daemon-uid=UID]` (`exitless run` only): a disk a
//!   vhost-user daemon serves; when the daemon goes away, the VM waits up to SECS seconds
//!   (default 10, 0: not at all) for the next daemon on the socket and carries on with it. The
//!   daemon must run as the VMM's user or root, or as UID if given: the connection carries the
//!   guest's memory.
//! - `serial=TEXT` with any of the first four: the serial number the guest reads (virtio-blk
//!   GET_ID, Linux's /sys/block/vdX/serial): 1 to 20 printable ASCII characters, no comma.
//! - `queues=N` with any of the first four: N virtqueues (1 to 16; VIRTIO_BLK_F_MQ above 1),
//!   each with a backend and a worker of its own, as the vhost-user daemon's `queues=`.

use std::path::PathBuf;

use storage::DiskSpec as DiskBackend;
use vmm::{DiskOptions, VhostUserDisk};

use crate::size::SizeError;

/// One `exitless run --disk`: served by the VMM (with its serial number and queue count), or by
/// a vhost-user daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunDisk {
    /// A disk the VMM serves itself: what it is, and its serial number and queue count.
    Local(DiskBackend, DiskOptions),
    /// A disk a vhost-user daemon serves: its socket and how the VM waits for a new daemon.
    VhostUser(VhostUserDisk),
}

/// Why a `--disk` value was refused: each message says what to give instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiskArgError {
    /// `queues=` that is not a number.
    #[error("queues={0}: not a number")]
    QueuesNotANumber(String),
    /// `queues=` out of range.
    #[error("queues={0}: choose 1 to {MAX_QUEUES}")]
    QueuesOutOfRange(u16),
    /// `serial=` empty or too long.
    #[error("serial={0}: give 1 to {MAX_SERIAL_LEN} characters")]
    SerialLength(String),
    /// `serial=` with a character a guest cannot show.
    #[error("serial={0}: only printable ASCII characters")]
    SerialCharacters(String),
    /// A key given twice.
    #[error("give `{0}=` once")]
    Repeated(&'static str),
    /// `vhost-user=` with options of a local disk.
    #[error("give `vhost-user=SOCKET` on its own, without other disk options")]
    VhostUserMixed,
    /// `vhost-user=` without a path.
    #[error("`vhost-user=` needs the daemon's socket path")]
    VhostUserNoSocket,
    /// `reconnect=` out of range.
    #[error("reconnect={0}: give whole seconds, 0 (fail at once) to {MAX_RECONNECT_SECS}")]
    Reconnect(String),
    /// `daemon-uid=` that is not a number.
    #[error("daemon-uid={0}: give a numeric user id")]
    DaemonUid(String),
    /// An option `vhost-user=` does not take.
    #[error("`vhost-user={socket}` takes only `reconnect=SECS` and `daemon-uid=UID`, not `{option}` (the daemon's --disk sets the rest)")]
    VhostUserOption {
        /// The socket named.
        socket: String,
        /// The option refused.
        option: String,
    },
    /// An option no local disk takes.
    #[error("unknown disk option `{0}`; see `exitless run --help`")]
    UnknownOption(String),
    /// A size that does not parse.
    #[error(transparent)]
    Size(#[from] SizeError),
    /// `null=` with options that give it data.
    #[error("a null disk (`null=SIZE`) holds no data: give it no `path=`, `ram` or `direct` (it takes `readonly`, `serial=` and `queues=`)")]
    NullWithData,
    /// A null or RAM disk size that is not a non-zero multiple of 512.
    #[error("{kind} disk size {size} is not a non-zero multiple of 512 bytes")]
    SizeNotSectors {
        /// "null" or "RAM".
        kind: &'static str,
        /// The size given.
        size: u64,
    },
    /// `direct` on a RAM disk.
    #[error("`direct` applies to `path=FILE` disks, not RAM disks")]
    DirectRam,
    /// `ram=SIZE` and `path=` together.
    #[error("give `ram=SIZE` for a new RAM disk or `ram,path=FILE` for an existing one, not both")]
    RamSizeAndPath,
    /// A new RAM disk marked read-only.
    #[error("a new RAM disk cannot be read-only (it would be all zeros)")]
    ReadOnlyNewRam,
    /// `ram` with neither size nor file.
    #[error("`ram` needs a size (`ram=1G`) or a file (`ram,path=/dev/shm/disk`)")]
    RamWithoutSize,
    /// No kind of disk named.
    #[error("a disk needs `path=FILE`, `ram=SIZE`, `null=SIZE` or `rbd=POOL/IMAGE`")]
    NoBackend,
    /// `rbd=` that is not POOL/IMAGE.
    #[error("{0}")]
    RbdTarget(String),
    /// An option an RBD disk does not take.
    #[error("an RBD disk takes `rbd=POOL/IMAGE`, `conf=FILE`, `id=USER` and `readonly`, not `{0}`")]
    RbdOption(String),
    /// RBD options without `rbd=`.
    #[error("an RBD disk needs `rbd=POOL/IMAGE`")]
    RbdNoTarget,
    /// A cephx user name that is not one.
    #[error("id={0}: give the cephx user without `client.` (letters, digits, '.', '_', '-')")]
    RbdUser(String),
}

/// The most queues a disk may offer (virtio-blk's `num_queues` as exitless serves it).
pub const MAX_QUEUES: u16 = 16;

/// Check `queues=N`'s N: 1 to [`MAX_QUEUES`].
pub fn parse_queues(text: &str) -> Result<u16, DiskArgError> {
    let n: u16 = text.parse().map_err(|_| DiskArgError::QueuesNotANumber(text.into()))?;
    if !(1..=MAX_QUEUES).contains(&n) {
        return Err(DiskArgError::QueuesOutOfRange(n));
    }
    Ok(n)
}

/// The most bytes of a serial number (virtio-blk's GET_ID answer is 20 bytes).
pub const MAX_SERIAL_LEN: usize = 20;

/// Check `serial=TEXT`'s TEXT: 1 to 20 printable ASCII characters (a guest shows it as text).
pub fn parse_serial(text: &str) -> Result<String, DiskArgError> {
    if text.is_empty() || text.len() > MAX_SERIAL_LEN {
        return Err(DiskArgError::SerialLength(text.into()));
    }
    if !text.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
        return Err(DiskArgError::SerialCharacters(text.into()));
    }
    Ok(text.to_owned())
}

/// Take `serial=TEXT` and `queues=N` out of a disk's options: the other options, and those.
pub fn take_options(text: &str) -> Result<(String, DiskOptions), DiskArgError> {
    let mut options = DiskOptions::default();
    let (mut serial_given, mut queues_given) = (false, false);
    let mut rest = Vec::new();
    for option in text.split(',') {
        match option.split_once('=') {
            Some(("serial", _)) if serial_given => return Err(DiskArgError::Repeated("serial")),
            Some(("serial", value)) => {
                options.serial = Some(parse_serial(value)?);
                serial_given = true;
            }
            Some(("queues", _)) if queues_given => return Err(DiskArgError::Repeated("queues")),
            Some(("queues", value)) => {
                options.queues = parse_queues(value)?;
                queues_given = true;
            }
            _ => rest.push(option),
        }
    }
    Ok((rest.join(","), options))
}

/// The longest `reconnect=` a vhost-user disk takes, in seconds.
const MAX_RECONNECT_SECS: u64 = 3600;

/// `exitless run --disk`: what [`parse`] takes, or `vhost-user=SOCKET[,reconnect=SECS]`.
pub fn parse_run(text: &str) -> Result<RunDisk, DiskArgError> {
    match text.strip_prefix("vhost-user=") {
        Some(rest) => parse_vhost_user(rest).map(RunDisk::VhostUser),
        None if text.split(',').any(|o| o.starts_with("vhost-user")) => Err(DiskArgError::VhostUserMixed),
        None => {
            let (rest, options) = take_options(text)?;
            parse(&rest).map(|disk| RunDisk::Local(disk, options))
        }
    }
}

/// `SOCKET[,reconnect=SECS][,daemon-uid=UID]`, what follows `vhost-user=`.
pub(crate) fn parse_vhost_user(text: &str) -> Result<VhostUserDisk, DiskArgError> {
    let mut options = text.split(',');
    let socket = options.next().unwrap_or_default();
    if socket.is_empty() {
        return Err(DiskArgError::VhostUserNoSocket);
    }
    let (mut reconnect, mut daemon_uid) = (None, None);
    for option in options {
        if let Some(secs) = option.strip_prefix("reconnect=") {
            let secs = secs
                .parse::<u64>()
                .ok()
                .filter(|s| *s <= MAX_RECONNECT_SECS)
                .ok_or_else(|| DiskArgError::Reconnect(secs.into()))?;
            if reconnect.replace(std::time::Duration::from_secs(secs)).is_some() {
                return Err(DiskArgError::Repeated("reconnect"));
            }
        } else if let Some(uid) = option.strip_prefix("daemon-uid=") {
            let uid = uid.parse::<u32>().map_err(|_| DiskArgError::DaemonUid(uid.into()))?;
            if daemon_uid.replace(uid).is_some() {
                return Err(DiskArgError::Repeated("daemon-uid"));
            }
        } else {
            return Err(DiskArgError::VhostUserOption { socket: socket.into(), option: option.into() });
        }
    }
    let reconnect = reconnect.unwrap_or(VhostUserDisk::DEFAULT_RECONNECT);
    Ok(VhostUserDisk { socket: PathBuf::from(socket), reconnect, daemon_uid })
}

/// A disk the VMM serves itself: `path=FILE[,readonly][,direct]`, `ram=SIZE`,
/// `ram,path=FILE[,readonly]`, `null=SIZE[,readonly]` or
/// `rbd=POOL/IMAGE[,conf=FILE][,id=USER][,readonly]`.
pub fn parse(text: &str) -> Result<DiskBackend, DiskArgError> {
    if text.split(',').any(|o| o.starts_with("rbd=")) {
        return parse_rbd(text);
    }
    let mut path = None;
    let mut ram = None;
    let mut null = None;
    let (mut read_only, mut direct) = (false, false);
    for option in text.split(',') {
        match option.split_once('=') {
            Some(("path", value)) if !value.is_empty() => path = Some(PathBuf::from(value)),
            Some(("ram", size)) => ram = Some(Some(crate::size::parse(size)?)),
            Some(("null", size)) => null = Some(crate::size::parse(size)?),
            None if option == "ram" => ram = Some(None),
            None if option == "readonly" => read_only = true,
            None if option == "direct" => direct = true,
            _ => return Err(DiskArgError::UnknownOption(option.into())),
        }
    }
    if let Some(size) = null {
        if path.is_some() || ram.is_some() || direct {
            return Err(DiskArgError::NullWithData);
        }
        if size == 0 || !size.is_multiple_of(512) {
            return Err(DiskArgError::SizeNotSectors { kind: "null", size });
        }
        return Ok(DiskBackend::Null { size, read_only });
    }
    if ram.is_some() && direct {
        return Err(DiskArgError::DirectRam);
    }
    match (ram, path) {
        (None, Some(path)) => Ok(DiskBackend::File { path, read_only, direct }),
        (Some(None), Some(path)) => Ok(DiskBackend::RamFile { path, read_only }),
        (Some(Some(size)), None) if !read_only => {
            if size == 0 || !size.is_multiple_of(512) {
                return Err(DiskArgError::SizeNotSectors { kind: "RAM", size });
            }
            Ok(DiskBackend::Ram { size })
        }
        (Some(Some(_)), Some(_)) => Err(DiskArgError::RamSizeAndPath),
        (Some(Some(_)), None) => Err(DiskArgError::ReadOnlyNewRam),
        (Some(None), None) => Err(DiskArgError::RamWithoutSize),
        (None, None) => Err(DiskArgError::NoBackend),
    }
}

/// `rbd=POOL/IMAGE[,conf=FILE][,id=USER][,readonly]`.
fn parse_rbd(text: &str) -> Result<DiskBackend, DiskArgError> {
    let mut spec = storage::RbdSpec {
        pool: String::new(),
        image: String::new(),
        conf: None,
        user: None,
        read_only: false,
    };
    let mut target = None;
    for option in text.split(',') {
        let repeated = |key: &'static str| Err(DiskArgError::Repeated(key));
        match option.split_once('=') {
            Some(("rbd", _)) if target.is_some() => return repeated("rbd"),
            Some(("rbd", value)) => {
                target = Some(storage::RbdSpec::parse_target(value).map_err(DiskArgError::RbdTarget)?)
            }
            Some(("conf", _)) if spec.conf.is_some() => return repeated("conf"),
            Some(("conf", value)) if !value.is_empty() => spec.conf = Some(PathBuf::from(value)),
            Some(("id", _)) if spec.user.is_some() => return repeated("id"),
            Some(("id", value)) => spec.user = Some(parse_rbd_user(value)?),
            None if option == "readonly" => spec.read_only = true,
            _ => return Err(DiskArgError::RbdOption(option.into())),
        }
    }
    (spec.pool, spec.image) = target.ok_or(DiskArgError::RbdNoTarget)?;
    Ok(DiskBackend::Rbd(spec))
}

/// A cephx user name without `client.`: letters, digits, `.`, `_` and `-`.
fn parse_rbd_user(user: &str) -> Result<String, DiskArgError> {
    let fits = !user.is_empty()
        && user.len() <= 64
        && user.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if fits && !user.starts_with("client.") {
        Ok(user.to_owned())
    } else {
        Err(DiskArgError::RbdUser(user.into()))
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
    fn a_null_disk_takes_a_size_and_readonly() {
        assert_eq!(parse("null=64M").unwrap(), DiskBackend::Null { size: 64 << 20, read_only: false });
        assert_eq!(parse("readonly,null=1G").unwrap(), DiskBackend::Null { size: 1 << 30, read_only: true });
        let options = DiskOptions { serial: Some("n0".into()), queues: 4 };
        assert_eq!(
            parse_run("null=512,queues=4,serial=n0").unwrap(),
            RunDisk::Local(DiskBackend::Null { size: 512, read_only: false }, options)
        );
        for bad in [
            "null",
            "null=",
            "null=0",
            "null=1000",
            "null=1G,path=/x",
            "null=1G,ram",
            "null=1G,ram=1G",
            "null=1G,direct",
            "null=1G,fast",
            "null=1G,queues=0",
        ] {
            assert!(parse_run(bad).is_err(), "{bad} accepted");
        }
        let mixed = parse("null=1G,path=/x").unwrap_err().to_string();
        assert!(mixed.contains("give it no `path=`, `ram` or `direct`") && !mixed.contains('\n'), "{mixed}");
    }

    #[test]
    fn an_rbd_disk_names_its_image_and_how_to_reach_it() {
        let spec = |conf: Option<&str>, user: Option<&str>, read_only| {
            DiskBackend::Rbd(storage::RbdSpec {
                pool: "rbd".into(),
                image: "vm1".into(),
                conf: conf.map(PathBuf::from),
                user: user.map(String::from),
                read_only,
            })
        };
        assert_eq!(parse("rbd=rbd/vm1").unwrap(), spec(None, None, false));
        assert_eq!(
            parse("rbd=rbd/vm1,conf=/etc/c.conf,id=vm,readonly").unwrap(),
            spec(Some("/etc/c.conf"), Some("vm"), true)
        );
        let options = DiskOptions { serial: None, queues: 2 };
        assert_eq!(
            parse_run("queues=2,rbd=rbd/vm1").unwrap(),
            RunDisk::Local(spec(None, None, false), options)
        );
        for bad in [
            "rbd=",
            "rbd=vm1",
            "rbd=/vm1",
            "rbd=rbd/",
            "rbd=rbd/ns/vm1",
            "rbd=rbd/vm1@snap",
            "rbd=rbd/vm1,path=/x",
            "rbd=rbd/vm1,direct",
            "rbd=rbd/vm1,ram=1G",
            "rbd=rbd/vm1,id=client.admin",
            "rbd=rbd/vm1,id=",
            "rbd=rbd/vm1,conf=",
            "rbd=rbd/vm1,rbd=rbd/vm2",
        ] {
            let error = parse_run(bad).expect_err(bad).to_string();
            assert!(!error.contains('\n'), "{error}");
        }
    }

    #[test]
    fn vhost_user_disks_are_a_socket_alone() {
        let socket = PathBuf::from("/tmp/a.sock");
        assert_eq!(
            parse_run("vhost-user=/tmp/a.sock").unwrap(),
            RunDisk::VhostUser(VhostUserDisk {
                socket: socket.clone(),
                reconnect: VhostUserDisk::DEFAULT_RECONNECT,
                daemon_uid: None,
            })
        );
        assert_eq!(
            parse_run("vhost-user=/tmp/a.sock,reconnect=0,daemon-uid=107").unwrap(),
            RunDisk::VhostUser(VhostUserDisk {
                socket,
                reconnect: std::time::Duration::ZERO,
                daemon_uid: Some(107)
            })
        );
        assert_eq!(
            parse_run("ram=1G").unwrap(),
            RunDisk::Local(DiskBackend::Ram { size: 1 << 30 }, DiskOptions::default())
        );
        for bad in [
            "vhost-user=",
            "vhost-user=,reconnect=1",
            "vhost-user=/a,readonly",
            "vhost-user=/a,reconnect=",
            "vhost-user=/a,reconnect=-1",
            "vhost-user=/a,reconnect=3601",
            "vhost-user=/a,reconnect=1,reconnect=2",
            "vhost-user=/a,daemon-uid=qemu",
            "vhost-user=/a,daemon-uid=1,daemon-uid=2",
            "path=/x,vhost-user=/a",
            "vhost-user",
        ] {
            assert!(parse_run(bad).is_err(), "{bad} accepted");
        }
        // The daemon's own --disk does not chain to another daemon.
        assert!(parse("vhost-user=/a").is_err());
    }

    #[test]
    fn a_serial_number_is_checked_and_kept() {
        assert_eq!(
            parse_run("serial=disk-01 A,ram=1M").unwrap(),
            RunDisk::Local(
                DiskBackend::Ram { size: 1 << 20 },
                DiskOptions { serial: Some("disk-01 A".into()), queues: 1 }
            )
        );
        let twenty = "x".repeat(20);
        let disk = parse_run(&format!("path=/a,serial={twenty},readonly")).unwrap();
        assert!(
            matches!(disk, RunDisk::Local(DiskBackend::File { read_only: true, .. }, DiskOptions { serial: Some(s), .. }) if s == twenty)
        );
        for bad in [
            "ram=1M,serial=",
            "ram=1M,serial=123456789012345678901",
            "ram=1M,serial=a\tb",
            "ram=1M,serial=é",
            "ram=1M,serial=a,serial=b",
            "vhost-user=/s,serial=a",
        ] {
            let bad = bad.replace("\\t", "\t");
            assert!(parse_run(&bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn a_queue_count_is_checked_and_kept() {
        let disk = parse_run("ram=1M,queues=4,serial=q").unwrap();
        let options = DiskOptions { serial: Some("q".into()), queues: 4 };
        assert_eq!(disk, RunDisk::Local(DiskBackend::Ram { size: 1 << 20 }, options));
        for bad in [
            "ram=1M,queues=0",
            "ram=1M,queues=17",
            "ram=1M,queues=x",
            "ram=1M,queues=",
            "ram=1M,queues=2,queues=2",
        ] {
            assert!(parse_run(bad).is_err(), "{bad} accepted");
        }
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
