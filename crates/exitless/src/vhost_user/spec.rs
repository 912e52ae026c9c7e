//! `exitless vhost-user-blk --disk`: which disk, on which socket, with which limits.
//!
//! `socket=PATH,` followed by a disk as `exitless run --disk` takes it (`path=FILE[,readonly]
//! [,direct]`, `ram=SIZE`, `ram,path=FILE[,readonly]`), and optionally `queues=N`, `iops=N`
//! (requests per second), `bw=BYTES` (bytes per second, with K/M/G suffixes) and `serial=TEXT`
//! (the serial number the guest reads, 1 to 20 printable ASCII characters). Without
//! `socket=` the disk is served on `--socket` (the single-disk form).

use std::path::PathBuf;

use rate_limiter::Limits;
use storage::DiskSpec;

/// The most queues a disk may offer.
pub const MAX_QUEUES: u16 = 16;

/// One `--disk` of the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VhostDisk {
    /// Where frontends connect; `None`: on `--socket`.
    pub socket: Option<PathBuf>,
    pub disk: DiskSpec,
    /// Virtqueues offered; `None`: `--queues`.
    pub queues: Option<u16>,
    pub limits: Limits,
    /// The serial number (GET_ID) given with `serial=`; `None`: `vhost-user-disk<index>`,
    /// unique per disk (20 bytes at most for indices below 100000).
    pub serial: Option<String>,
}

pub fn parse(text: &str) -> Result<VhostDisk, String> {
    let mut socket = None;
    let mut queues = None;
    let mut limits = Limits::default();
    let mut rest = Vec::new();
    let mut serial = None;
    for option in text.split(',') {
        match option.split_once('=') {
            Some(("socket", path)) if !path.is_empty() => socket = Some(PathBuf::from(path)),
            Some(("socket", _)) => return Err("`socket=` needs a path".into()),
            Some(("queues", n)) => {
                let n: u16 = n.parse().map_err(|_| format!("queues={n}: not a number"))?;
                if !(1..=MAX_QUEUES).contains(&n) {
                    return Err(format!("queues={n}: choose 1 to {MAX_QUEUES}"));
                }
                queues = Some(n);
            }
            Some(("iops", n)) => {
                let n: u64 =
                    n.parse().map_err(|_| format!("iops={n}: not a number of requests per second"))?;
                if n == 0 {
                    return Err("iops=0 would serve nothing: leave `iops` out for no limit".into());
                }
                limits.iops = Some(n);
            }
            Some(("serial", text)) => {
                if serial.is_some() {
                    return Err("give `serial=` once".into());
                }
                serial = Some(exitless_args::disk::parse_serial(text)?);
            }
            Some(("bw", size)) => {
                let n = exitless_args::size::parse(size)?;
                if n < 512 {
                    return Err(format!("bw={size}: at least 512 bytes per second"));
                }
                limits.bandwidth = Some(n);
            }
            _ => rest.push(option),
        }
    }
    let disk = exitless_args::disk::parse(&rest.join(","))?;
    Ok(VhostDisk { socket, disk, queues, limits, serial })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_socket_queues_and_limits_around_a_disk() {
        let d = parse("socket=/tmp/a.sock,path=/tmp/a.img,direct,iops=5000,bw=8M,queues=2").unwrap();
        assert_eq!(d.socket, Some("/tmp/a.sock".into()));
        assert_eq!(d.disk, DiskSpec::File { path: "/tmp/a.img".into(), read_only: false, direct: true });
        assert_eq!(d.queues, Some(2));
        assert_eq!(d.limits, Limits { iops: Some(5000), bandwidth: Some(8 << 20) });
        assert_eq!(d.serial, None);
        let d = parse("ram=64M,serial=db-volume-7").unwrap();
        assert_eq!(d.serial.as_deref(), Some("db-volume-7"));
        let d = parse("ram=64M").unwrap();
        assert_eq!((d.socket, d.disk), (None, DiskSpec::Ram { size: 64 << 20 }));
        assert!(!d.limits.any());
    }

    #[test]
    fn refuses_what_makes_no_sense() {
        for bad in [
            "socket=,ram=1M",
            "socket=/a",
            "ram=1M,iops=0",
            "ram=1M,iops=x",
            "ram=1M,bw=10",
            "ram=1M,queues=0",
            "ram=1M,queues=17",
            "socket=/a,fast",
            "ram=1M,serial=",
            "ram=1M,serial=abcdefghijklmnopqrstu",
            "ram=1M,serial=a,serial=b",
        ] {
            assert!(parse(bad).is_err(), "{bad} accepted");
        }
    }
}
