//! Two "hosts" simulated on one machine, for live migrations over TCP: two network namespaces
//! of our own (the source's and the destination's) joined by a veth pair, with the addresses
//! of a private /30 ([`SOURCE_IP`], [`DESTINATION_IP`]). Each exitless runs in its namespace
//! (`ip netns exec`); their API sockets are paths in the file system, reachable from any
//! namespace. The traffic stays on the veth pair: neither namespace has another link or a route.
//!
//! The namespaces' names are unique per process and per pair (the tests run pairs in parallel
//! threads); they are removed when the pair is dropped, a panic's unwinding included, and pairs
//! left by a process that died are removed by the next one made.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use thiserror::Error;

/// The source host's address, on its end of the veth pair.
pub const SOURCE_IP: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 1);
/// The destination host's address, on the other end.
pub const DESTINATION_IP: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 2);
/// Where the namespaces' names start (then the process id and a count).
const PREFIX: &str = "exl-hosts-";
/// The veth ends' names, each inside its own namespace.
const LINK: &str = "exlhost0";

/// Two simulated hosts: network namespaces joined by a veth pair. Removed when dropped.
pub struct HostPair {
    /// The source host's network namespace (`ip netns exec SOURCE ...`).
    pub source: String,
    /// The destination host's.
    pub destination: String,
}

/// Why an `ip` command failed.
#[derive(Debug, Error)]
pub enum IpError {
    /// `ip` could not be run.
    #[error("cannot run ip (iproute2, which scripts/setup.sh installs): {0}")]
    Spawn(#[source] std::io::Error),
    /// `ip` ran and failed.
    #[error("ip {args} failed: {stderr}")]
    Failed {
        /// Its arguments, joined with spaces.
        args: String,
        /// What it wrote to standard error.
        stderr: String,
    },
}

/// Why two simulated hosts or their certificates could not be made.
#[derive(Debug, Error)]
pub enum HostsError {
    /// The namespaces, the veth pair or the addresses could not be set up.
    #[error("cannot set up two simulated hosts (network namespaces): {0}")]
    SetUp(#[source] IpError),
    /// bash could not be run for `scripts/tls-certs.sh`.
    #[error("cannot run bash for scripts/tls-certs.sh: {0}")]
    Bash(#[source] std::io::Error),
    /// `scripts/tls-certs.sh` failed.
    #[error("scripts/tls-certs.sh {} {hosts}: {stderr}", .out.display())]
    Certificates {
        /// The directory it was to write to.
        out: std::path::PathBuf,
        /// The hosts it was to make certificates for, joined with spaces.
        hosts: String,
        /// What it wrote to standard error.
        stderr: String,
    },
}

/// Run `ip ARGS`; its error output if it fails.
pub(crate) fn ip(args: &[&str]) -> Result<(), IpError> {
    let output = Command::new("ip").args(args).output().map_err(IpError::Spawn)?;
    if !output.status.success() {
        return Err(IpError::Failed {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    Ok(())
}

impl HostPair {
    /// Make the two namespaces, the veth pair between them and their addresses. Fails, saying
    /// why, where namespaces cannot be made (not root, no iproute2).
    pub fn new() -> Result<HostPair, HostsError> {
        static PAIRS: AtomicU32 = AtomicU32::new(0);
        remove_stale();
        let id = format!("{PREFIX}{}-{}", std::process::id(), PAIRS.fetch_add(1, Ordering::Relaxed));
        let pair = HostPair { source: format!("{id}-src"), destination: format!("{id}-dst") };
        pair.set_up().map_err(HostsError::SetUp)?;
        Ok(pair)
    }

    fn set_up(&self) -> Result<(), IpError> {
        let (src, dst) = (self.source.as_str(), self.destination.as_str());
        ip(&["netns", "add", src])?;
        ip(&["netns", "add", dst])?;
        ip(&["link", "add", LINK, "netns", src, "type", "veth", "peer", "name", LINK, "netns", dst])?;
        for (ns, address) in [(src, SOURCE_IP), (dst, DESTINATION_IP)] {
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "addr", "add", &format!("{address}/30"), "dev", LINK])?;
            ip(&["-n", ns, "link", "set", LINK, "up"])?;
        }
        Ok(())
    }

    /// A command that runs `program` in the source host's namespace.
    pub fn on_source(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        in_namespace(&self.source, program)
    }

    /// A command that runs `program` in the destination host's namespace.
    pub fn on_destination(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        in_namespace(&self.destination, program)
    }
}

/// `ip netns exec NS PROGRAM` (which becomes PROGRAM: the child's id is the program's).
fn in_namespace(ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = Command::new("ip");
    command.args(["netns", "exec", ns]).arg(program);
    command
}

/// Run `f` on a new thread that has joined the network namespace `ns`: the sockets it makes are
/// that namespace's (a test's stranger, a proxy). The thread panics, before `f`, if it cannot
/// join it.
pub fn thread_in<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    use std::os::fd::AsRawFd;
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        // SAFETY: setns on a descriptor of a network namespace file, open for the call; it
        // moves only this thread, which makes its sockets there.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            panic!("setns into {path}: {}", std::io::Error::last_os_error());
        }
        f()
    })
}

/// Remove the namespaces of pairs whose process is gone (killed before it could).
fn remove_stale() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(PREFIX).and_then(|rest| rest.split('-').next()) else { continue };
        if pid.parse::<u32>().is_ok_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists()) {
            let _ = ip(&["netns", "del", &name]);
        }
    }
}

impl Drop for HostPair {
    fn drop(&mut self) {
        // The veth pair goes with its namespaces.
        for ns in [&self.source, &self.destination] {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// `scripts/tls-certs.sh`, built in so that the bench needs no checkout.
const TLS_CERTS: &str = include_str!("../../../scripts/tls-certs.sh");

/// Make a CA in `out/ca` (or reuse the one there) and, for each of `hosts` (an IP address), a
/// directory `out/HOST` for `--migration-tls-dir` (ca.pem, cert.pem, key.pem), with
/// `scripts/tls-certs.sh`.
pub fn make_certificates(out: &std::path::Path, hosts: &[&str]) -> Result<(), HostsError> {
    let output = Command::new("bash")
        .arg("-c")
        .arg(TLS_CERTS)
        .arg("tls-certs.sh")
        .arg(out)
        .args(hosts)
        .output()
        .map_err(HostsError::Bash)?;
    match output.status.success() {
        true => Ok(()),
        false => Err(HostsError::Certificates {
            out: out.to_owned(),
            hosts: hosts.join(" "),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        }),
    }
}
