//! `exitless vhost-user-blk --disk`: which disk, on which socket, with which limits.
//!
//! `socket=PATH,` followed by a disk as `exitless run --disk` takes it (`path=FILE[,readonly]
//! [,direct]`, `ram=SIZE`, `ram,path=FILE[,readonly]`, `null=SIZE[,readonly]`,
//! `rbd=POOL/IMAGE[,conf=FILE][,id=USER][,readonly]`), and optionally
//! `queues=N`, `iops=N` (requests per second), `bw=BYTES` (bytes per second, with K/M/G
//! suffixes), `serial=TEXT` (the serial number the guest reads, 1 to 20 printable ASCII
//! characters), `name=NAME` (how the control API and the metrics call it) and
//! `reset-timeout=SECS` (how long a reset waits for the requests the disk holds before it
//! cancels them; default 5). Without `socket=` the disk is served on `--socket` (the single-disk
//! form). The control API's disk bodies are JSON objects with the same keys ([`from_json`]),
//! checked by the same rules.

use std::path::PathBuf;
use std::time::Duration;

use exitless_args::disk::DiskArgError;
use exitless_args::size::SizeError;
use rate_limiter::Limits;
use serde_json::Value;
use storage::DiskSpec;
use thiserror::Error;

/// The most queues a disk may offer (as `exitless run --disk` allows).
pub use exitless_args::disk::MAX_QUEUES;
/// The longest `reset-timeout=`: a frontend waits that long (and up to 1 s more for the cancels)
/// to be served after one that left requests on a disk that does not answer.
const MAX_RESET_TIMEOUT_S: f64 = 3600.0;

/// Why a disk's spec (`--disk`, or the control API's JSON) was refused: each message says what
/// to give instead.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[allow(missing_docs)] // Each variant's message says what it is.
pub enum SpecError {
    #[error("`socket=` needs a path")]
    SocketWithoutPath,
    #[error(transparent)]
    Disk(#[from] DiskArgError),
    #[error(transparent)]
    Size(#[from] SizeError),
    #[error("iops={0}: not a number of requests per second")]
    Iops(String),
    #[error("iops=0 would serve nothing: leave `iops` out for no limit")]
    IopsZero,
    #[error("bw={0}: at least 512 bytes per second")]
    BandwidthTooLow(String),
    #[error("reset-timeout={0}: give the seconds a reset waits for the disk's requests before it cancels them, above 0 and at most {MAX_RESET_TIMEOUT_S} (default 5)")]
    ResetTimeout(String),
    #[error("disk name {0:?}: use 1 to {max} letters, digits, '.', '_' or '-', not starting with '.'", max = api_http::server::MAX_NAME)]
    Name(String),
    #[error("the body must be a JSON object of --disk keys")]
    DiskNotAnObject,
    #[error("the body must be a JSON object with `iops` and/or `bw`")]
    LimitsNotAnObject,
    #[error("`{0}` must be true or false")]
    NotAFlag(&'static str),
    #[error("`{key}`: {value:?} holds a comma, which --disk cannot express")]
    Comma { key: &'static str, value: String },
    #[error("`{key}`: {value} is not a value it takes")]
    BadValue { key: &'static str, value: Value },
    #[error("unknown key `{0}`: a disk takes {keys}", keys = JSON_KEYS.join(", "))]
    UnknownKey(String),
    #[error("`socket` is missing: the path of the disk's vhost-user socket")]
    NoSocket,
    #[error("unknown key `{0}`: a disk's limits are `iops` and `bw`")]
    UnknownLimit(String),
    #[error("`{key}`: {value} is not a limit (a number, or null for none)")]
    BadLimit { key: String, value: Value },
}

/// One `--disk` of the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VhostDisk {
    /// Its name; `None`: `diskN`, N counting the disks from 0.
    pub name: Option<String>,
    /// Where frontends connect; `None`: on `--socket`.
    pub socket: Option<PathBuf>,
    pub disk: DiskSpec,
    /// Virtqueues offered; `None`: `--queues`.
    pub queues: Option<u16>,
    pub limits: Limits,
    /// The serial number (GET_ID) given with `serial=`; `None`: `vhost-user-disk<index>`,
    /// unique per disk (20 bytes at most for indices below 100000).
    pub serial: Option<String>,
    /// `reset-timeout=`: how long a reset waits for the disk's requests before it cancels them
    /// (and, if the cancels do not end them, quarantines them); `None`: 5 s.
    pub reset_timeout: Option<Duration>,
}

/// Parse one `--disk`.
pub fn parse(text: &str) -> Result<VhostDisk, SpecError> {
    let mut name = None;
    let mut socket = None;
    let mut queues = None;
    let mut limits = Limits::default();
    let mut rest = Vec::new();
    let mut serial = None;
    let mut reset_timeout = None;
    for option in text.split(',') {
        match option.split_once('=') {
            Some(("socket", path)) if !path.is_empty() => socket = Some(PathBuf::from(path)),
            Some(("socket", _)) => return Err(SpecError::SocketWithoutPath),
            Some(("name", n)) => name = Some(check_name(n)?.to_owned()),
            Some(("queues", n)) => queues = Some(exitless_args::disk::parse_queues(n)?),
            Some(("iops", n)) => {
                let n: u64 = n.parse().map_err(|_| SpecError::Iops(n.into()))?;
                if n == 0 {
                    return Err(SpecError::IopsZero);
                }
                limits.iops = Some(n);
            }
            Some(("serial", text)) => {
                if serial.is_some() {
                    return Err(DiskArgError::Repeated("serial").into());
                }
                serial = Some(exitless_args::disk::parse_serial(text)?);
            }
            Some(("reset-timeout", secs)) => reset_timeout = Some(parse_reset_timeout(secs)?),
            Some(("bw", size)) => {
                let n = exitless_args::size::parse(size)?;
                if n < 512 {
                    return Err(SpecError::BandwidthTooLow(size.into()));
                }
                limits.bandwidth = Some(n);
            }
            _ => rest.push(option),
        }
    }
    let disk = exitless_args::disk::parse(&rest.join(","))?;
    Ok(VhostDisk { name, socket, disk, queues, limits, serial, reset_timeout })
}

/// `reset-timeout=SECS`: seconds, fractions allowed, above 0 and at most an hour.
fn parse_reset_timeout(secs: &str) -> Result<Duration, SpecError> {
    match secs.parse::<f64>() {
        Ok(s) if s > 0.0 && s <= MAX_RESET_TIMEOUT_S => Ok(Duration::from_secs_f64(s)),
        _ => Err(SpecError::ResetTimeout(secs.into())),
    }
}

/// A disk's name, if it is one: 1 to 64 letters, digits, `.`, `_` or `-`, not starting with a
/// dot (it appears in URLs and metric labels).
pub fn check_name(name: &str) -> Result<&str, SpecError> {
    match api_http::server::is_resource_name(name) {
        true => Ok(name),
        false => Err(SpecError::Name(name.into())),
    }
}

/// The keys a disk's JSON body may have, as `--disk` keys; `readonly` and `direct` are flags
/// (`true` or `false`), `ram` a size or `true` (with `path`: an existing /dev/shm file), `null`
/// a size (a null disk).
const JSON_KEYS: &[&str] = &[
    "socket",
    "path",
    "ram",
    "null",
    "rbd",
    "conf",
    "id",
    "readonly",
    "direct",
    "queues",
    "iops",
    "bw",
    "serial",
    "reset-timeout",
];

/// A disk of the control API: the JSON object `body` turned into the `--disk` it stands for and
/// parsed as that, so the same rules give the same errors.
pub fn from_json(name: &str, body: &Value) -> Result<VhostDisk, SpecError> {
    let object = body.as_object().ok_or(SpecError::DiskNotAnObject)?;
    let mut options = vec![format!("name={}", check_name(name)?)];
    // In the order `--disk` reads best; the parser does not depend on it.
    for &key in JSON_KEYS {
        let Some(value) = object.get(key) else { continue };
        let text = match (key, value) {
            ("readonly" | "direct", Value::Bool(true)) => Some(key.to_owned()),
            ("readonly" | "direct", Value::Bool(false)) => None,
            ("readonly" | "direct", _) => return Err(SpecError::NotAFlag(key)),
            ("ram", Value::Bool(true)) => Some("ram".to_owned()),
            (_, Value::String(s)) if s.contains(',') => {
                return Err(SpecError::Comma { key, value: s.clone() })
            }
            (_, Value::String(s)) => Some(format!("{key}={s}")),
            (_, Value::Number(n)) if n.is_u64() || key == "reset-timeout" => Some(format!("{key}={n}")),
            _ => return Err(SpecError::BadValue { key, value: value.clone() }),
        };
        options.extend(text);
    }
    if let Some(unknown) = object.keys().find(|k| !JSON_KEYS.contains(&k.as_str())) {
        return Err(SpecError::UnknownKey(unknown.clone()));
    }
    if !object.contains_key("socket") {
        return Err(SpecError::NoSocket);
    }
    parse(&options.join(","))
}

/// The limits of a PATCH body `{"iops": N or null, "bw": BYTES or null}`: a key left out keeps
/// its limit, `null` removes it; the values follow `--disk`'s rules.
pub fn patch_limits(current: Limits, body: &Value) -> Result<Limits, SpecError> {
    let object = body.as_object().ok_or(SpecError::LimitsNotAnObject)?;
    if let Some(unknown) = object.keys().find(|k| *k != "iops" && *k != "bw") {
        return Err(SpecError::UnknownLimit(unknown.clone()));
    }
    let mut limits = current;
    for (key, value) in object {
        let given = match value {
            Value::Null => None,
            Value::Number(n) if n.is_u64() => Some(n.to_string()),
            Value::String(s) if key == "bw" && !s.contains(',') => Some(s.clone()),
            _ => return Err(SpecError::BadLimit { key: key.clone(), value: value.clone() }),
        };
        let parsed = match given {
            None => Limits::default(),
            Some(text) => parse(&format!("ram=1M,{key}={text}"))?.limits,
        };
        if key == "iops" {
            limits.iops = parsed.iops;
        } else {
            limits.bandwidth = parsed.bandwidth;
        }
    }
    Ok(limits)
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
        assert_eq!(parse("ram=1M,name=db-0.a_b").unwrap().name.as_deref(), Some("db-0.a_b"));
        let d = parse("ram=1M,reset-timeout=1").unwrap();
        assert_eq!(d.reset_timeout, Some(Duration::from_secs(1)));
        assert_eq!(
            parse("ram=1M,reset-timeout=0.25").unwrap().reset_timeout,
            Some(Duration::from_millis(250))
        );
        let d = parse("ram=64M").unwrap();
        assert_eq!(d.reset_timeout, None);
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
            "ram=1M,name=",
            "ram=1M,name=.hidden",
            "ram=1M,name=a/b",
            "ram=1M,name=a b",
            "ram=1M,reset-timeout=0",
            "ram=1M,reset-timeout=-1",
            "ram=1M,reset-timeout=soon",
            "ram=1M,reset-timeout=NaN",
            "ram=1M,reset-timeout=3601",
        ] {
            assert!(parse(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn a_json_disk_is_the_disk_spec_it_stands_for() {
        let body = serde_json::json!({"socket": "/tmp/a.sock", "path": "/tmp/a.img", "direct": true,
            "readonly": false, "iops": 5000, "bw": "8M", "queues": 2});
        let d = from_json("a", &body).unwrap();
        assert_eq!(
            d,
            parse("name=a,socket=/tmp/a.sock,path=/tmp/a.img,direct,iops=5000,bw=8M,queues=2").unwrap()
        );
        let d = from_json("r", &serde_json::json!({"socket": "/s", "ram": 1048576})).unwrap();
        assert_eq!(d.disk, DiskSpec::Ram { size: 1 << 20 });
        let d =
            from_json("n", &serde_json::json!({"socket": "/s", "null": "64M", "readonly": true})).unwrap();
        assert_eq!(d.disk, DiskSpec::Null { size: 64 << 20, read_only: true });
        let d = from_json("n", &serde_json::json!({"socket": "/s", "null": 4096, "queues": 2})).unwrap();
        assert_eq!((d.disk, d.queues), (DiskSpec::Null { size: 4096, read_only: false }, Some(2)));
        let body = serde_json::json!({"socket": "/s", "ram": "1M", "reset-timeout": 1.5});
        assert_eq!(from_json("r", &body).unwrap().reset_timeout, Some(Duration::from_millis(1500)));
        for (name, bad) in [
            ("a", serde_json::json!([])),
            ("a", serde_json::json!({"path": "/x"})),
            ("a", serde_json::json!({"socket": "/s", "ram": "1M", "colour": "red"})),
            ("a", serde_json::json!({"socket": "/s", "ram": "1M", "direct": "yes"})),
            ("a", serde_json::json!({"socket": "/s", "path": "/x,readonly"})),
            ("a", serde_json::json!({"socket": "/s", "ram": -1})),
            ("a", serde_json::json!({"socket": "/s", "ram": "1M", "iops": 0})),
            ("a", serde_json::json!({"socket": "/s", "ram": "1M", "queues": 99})),
            ("a", serde_json::json!({"socket": "/s", "ram": "1M", "reset-timeout": 0})),
            ("a", serde_json::json!({"socket": "/s", "ram": "1M", "reset-timeout": -2})),
            ("a", serde_json::json!({"socket": "/s"})),
            ("a", serde_json::json!({"socket": "/s", "null": "1M", "path": "/x"})),
            ("a", serde_json::json!({"socket": "/s", "null": "1M", "direct": true})),
            ("a", serde_json::json!({"socket": "/s", "null": true})),
            ("a b", serde_json::json!({"socket": "/s", "ram": "1M"})),
        ] {
            assert!(from_json(name, &bad).is_err(), "{name} {bad} accepted");
        }
    }

    #[test]
    fn a_patch_sets_or_removes_each_limit_it_names() {
        let start = Limits { iops: Some(100), bandwidth: Some(1 << 20) };
        let patch = |v| patch_limits(start, &v);
        assert_eq!(patch(serde_json::json!({"iops": 50})).unwrap(), Limits { iops: Some(50), ..start });
        assert_eq!(patch(serde_json::json!({"bw": null})).unwrap(), Limits { bandwidth: None, ..start });
        assert_eq!(patch(serde_json::json!({"bw": "2M"})).unwrap().bandwidth, Some(2 << 20));
        for bad in [
            serde_json::json!({"iops": 0}),
            serde_json::json!({"bw": 10}),
            serde_json::json!({"iops": "fast"}),
            serde_json::json!({"queues": 2}),
            serde_json::json!(7),
        ] {
            assert!(patch(bad.clone()).is_err(), "{bad} accepted");
        }
    }
}
