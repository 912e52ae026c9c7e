//! `exitless vhost-user-net`'s command line.

use std::path::PathBuf;

use clap::Args;
use rate_limiter::Limits;
use switch::{MacAddr, PortPolicy, DEFAULT_MTU, MAX_MTU};

/// `exitless vhost-user-net`'s options.
#[derive(Args)]
#[command(after_help = AFTER_HELP)]
pub struct VhostUserNetArgs {
    /// A NIC to serve (repeatable):
    /// `socket=PATH,mac=MAC[,name=NAME][,mtu=N][,isolated=on][,pps=N][,bw=BYTES]
    /// [,shares-mac-with=NAME]`: its vhost-user socket (a stale socket file there is replaced;
    /// made 0600, and only the daemon's user and root may connect), the MAC address its driver
    /// reads (aa:bb:cc:dd:ee:ff, unicast), its name in the control API and the metrics (default
    /// nicN, N counting from 0), its MTU (1500 to 9000, default 1500: jumbo frames above),
    /// whether it may talk to the uplink only, the frames and bytes per second (K/M/G suffixes)
    /// it may send, and the earlier NIC whose address it shares (a live migration on this host).
    #[arg(long, value_name = "SPEC", value_parser = parse_nic, required_unless_present = "api_socket")]
    pub nic: Vec<Nic>,
    /// Serve a control API on this Unix socket (HTTP, 0600, the daemon's user and root only):
    /// GET /nics, GET /nics/NAME, PUT /nics/NAME (add one; a JSON body of --nic's keys),
    /// DELETE /nics/NAME (remove one no frontend is connected to), GET /metrics (Prometheus).
    #[arg(long, value_name = "PATH")]
    pub api_socket: Option<PathBuf>,
    /// A host interface to carry frames to and from the host and the network beyond: an
    /// AF_PACKET socket on it (put in promiscuous mode), for example one end of a veth pair
    /// whose other end has the host's address, or a physical NIC.
    #[arg(long, value_name = "INTERFACE")]
    pub uplink: Option<String>,
    /// Upgrade without a hang-up: a daemon started with this finds a live one listening on
    /// PATH and takes its NICs over (their sockets, connected frontends and rings), which then
    /// exits; with none there, it listens on PATH itself for its successor. Both must serve the
    /// same NICs (sockets, addresses and names, in the same order). Not with --api-socket (a
    /// successor's command line would not name the API's NICs).
    #[arg(long, value_name = "PATH", conflicts_with = "api_socket")]
    pub handover_socket: Option<PathBuf>,
    /// IOCore threads, each running a switch over some of the NICs: each NIC goes to the one
    /// with the fewest. Frames between NICs of one IOCore go ring to ring (one copy); between
    /// two, through a ring of the daemon's (two copies), in their plain form (a checksum left
    /// is filled in, a TCP super-frame cut into segments, on the way). The uplink is the first
    /// IOCore's.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=switch::MAX_SWITCHES as i64))]
    pub iocores: u16,
    /// Pin the IOCores to these host CPUs (IOCore k to the k-th, round robin).
    #[arg(long, value_name = "CPU[,CPU...]", value_delimiter = ',')]
    pub iocore_cpu: Vec<usize>,
    /// `--io-mode` and `--idle-budget-us`: the switch's IOCore polls every ring (sidecore), polls
    /// under load and sleeps when idle (adaptive), or sleeps between frames (eventfd).
    #[command(flatten)]
    pub io: exitless_args::VhostIoArgs,
    /// `--seccomp`: how strictly each thread is confined.
    #[command(flatten)]
    pub seccomp: exitless_args::SeccompArgs,
}

const AFTER_HELP: &str = "\
Every NIC is a port of one switch, run by one IOCore: a frame from one NIC to another goes from
the sender's transmit ring into the receiver's receive ring, with one copy and no system call.
How the IOCore waits is --io-mode: adaptive (the default) polls every ring while frames come
and, after --idle-budget-us without one, asks the guests to kick and sleeps until a kick, a
frame from the uplink or a NIC added or removed wakes it; sidecore polls for ever (no guest
ever kicks; a core stays busy); eventfd sleeps whenever a pass found nothing.

The switch learns each sender's address; a frame to a group address (broadcast, multicast) or
to an address not seen yet goes to every other NIC. Checksum and TCP segmentation offloads,
merged receive buffers and up to 4 queue pairs are offered; for a driver that did not take an
offload, the switch does its work (fills the checksum, cuts the super-frame). Frames are at
most the NIC's MTU (mtu=, 1500 by default) and 18 bytes, super-frames 64 KiB; a frame longer
than a receiver's MTU is dropped and counted, as a Linux bridge does. A QEMU guest's MTU is
QEMU's (virtio-net-pci,host_mtu=N), which the daemon refuses if it is above the NIC's.

With --uplink, frames to addresses not on a NIC of the daemon (and every broadcast) go to the
host interface too, and the host's frames come in through it: the interface's receive and
transmit rings are shared with the kernel (PACKET_MMAP), polled by the IOCore with no system
call per frame, one send() per pass that put frames on it. Offloads cross it both ways: the
host's TCP super-frames go whole to guests that take them and are cut for the others; a guest's
go to the host whole, for its kernel (or its NIC) to cut; checksums left are filled in. Frames
go both ways up to the interface's MTU (jumbo frames with MTU 9000).

A live migration of a QEMU guest between two QEMUs on this host: give the destination's NIC
the source's address and shares-mac-with=SOURCE-NIC. One of the two runs at a time; the one
running holds the address (a frame from it on the other is dropped as spoofed). Linux guests
announce their address on the new NIC after a migration (VIRTIO_NET_F_GUEST_ANNOUNCE); for
others QEMU asks the daemon, which sends a RARP from it (VHOST_USER_SEND_RARP).

isolated=on: the NIC talks to the uplink only, never to another NIC, and only from its own
address (frames from another are dropped as spoofed). pps=N and bw=BYTES: token buckets on what
it sends, holding one second's budget; a frame over them waits in the NIC's ring.

With --api-socket, NICs can be added and removed while the daemon runs, and GET /metrics
gives each NIC's and the uplink's counters (frames each way, and every drop by cause) and
each IOCore's busy, idle and CPU time.

Upgrades without a hang-up (--handover-socket PATH): start the new daemon with the same
--nic options and --handover-socket while the old one runs. It takes every NIC over, with
its frontend's connection and rings, between two of the frontend's messages; the old daemon
exits. No frame is held across it: what the guests send while neither daemon serves waits in
their rings.

A QEMU guest on a NIC (its memory must be shared with the daemon):
  exitless vhost-user-net --nic socket=/run/vm1.net,mac=52:54:00:00:00:01 \\
                          --nic socket=/run/vm2.net,mac=52:54:00:00:00:02
  qemu-system-x86_64 ... -object memory-backend-memfd,id=mem,size=1G,share=on \\
      -machine memory-backend=mem -chardev socket,id=n0,path=/run/vm1.net \\
      -netdev vhost-user,id=net0,chardev=n0 -device virtio-net-pci,netdev=net0,mac=52:54:00:00:00:01";

/// One `--nic` (or a NIC the control API adds).
#[derive(Debug, Clone)]
pub struct Nic {
    /// Its name; `None`: `nicN`.
    pub name: Option<String>,
    /// Its vhost-user socket.
    pub socket: PathBuf,
    /// The address its driver reads.
    pub mac: MacAddr,
    /// What it may do on the switch.
    pub policy: PortPolicy,
    /// The earlier NIC whose address it shares: the other end of a live migration on this
    /// host, one of the two running at a time.
    pub shares_mac_with: Option<String>,
}

/// `--nic`'s value.
pub fn parse_nic(spec: &str) -> Result<Nic, String> {
    let (mut socket, mut mac, mut isolated, mut limits) = (None, None, false, Limits::default());
    let (mut name, mut mtu, mut shares_mac_with) = (None, None, None);
    for part in spec.split(',') {
        match part.split_once('=') {
            Some(("name", text)) if api_http::server::is_resource_name(text) => name = Some(text.to_owned()),
            Some(("name", text)) => {
                return Err(format!(
                    "name={text}: use 1 to {} letters, digits, '.', '_' or '-', not starting with '.'",
                    api_http::server::MAX_NAME
                ))
            }
            Some(("socket", path)) if !path.is_empty() => socket = Some(PathBuf::from(path)),
            Some(("shares-mac-with", text)) if api_http::server::is_resource_name(text) => {
                shares_mac_with = Some(text.to_owned())
            }
            Some(("mac", text)) => mac = Some(text.parse::<MacAddr>()?),
            Some(("mtu", n)) => match n.parse::<u16>() {
                Ok(n) if (DEFAULT_MTU..=MAX_MTU).contains(&n) => mtu = Some(n),
                _ => return Err(format!("mtu={n}: give {DEFAULT_MTU} to {MAX_MTU} (jumbo frames above {DEFAULT_MTU})")),
            },
            Some(("isolated", "on")) => isolated = true,
            Some(("isolated", "off")) => isolated = false,
            Some(("pps", n)) => match n.parse::<u64>() {
                Ok(0) | Err(_) => return Err(format!("pps={n}: give a number of frames per second above 0")),
                Ok(n) => limits.iops = Some(n),
            },
            Some(("bw", size)) => match exitless_args::size::parse(size) {
                Ok(n) if n >= 1518 => limits.bandwidth = Some(n),
                Ok(_) => return Err(format!("bw={size}: at least 1518 bytes per second (one frame)")),
                Err(e) => return Err(format!("bw={size}: {e}")),
            },
            _ => {
                return Err(format!(
                    "{part}: a NIC is socket=PATH,mac=MAC[,name=NAME][,mtu=N][,isolated=on|off][,pps=N][,bw=BYTES]\
                     [,shares-mac-with=NAME]"
                ))
            }
        }
    }
    let mac = mac.ok_or("a NIC needs mac=MAC")?;
    if mac.is_group() {
        return Err(format!("mac={mac}: a NIC's address must be unicast (the first byte even)"));
    }
    let policy = PortPolicy { mac: Some(mac), isolated_to: isolated.then_some(mac), limits, mtu };
    Ok(Nic { name, socket: socket.ok_or("a NIC needs socket=PATH")?, mac, policy, shares_mac_with })
}

/// The NIC a control API's `PUT /nics/NAME` body describes: a JSON object of `--nic`'s keys
/// (`"isolated"` a boolean, `"pps"` a number, `"bw"` a number or a size like "10M").
pub fn nic_from_json(name: &str, body: &serde_json::Value) -> Result<Nic, String> {
    let object = body.as_object().ok_or("the body must be a JSON object of --nic's keys")?;
    let mut spec = vec![format!("name={name}")];
    for (key, value) in object {
        let text = match (key.as_str(), value) {
            ("socket" | "mac" | "bw" | "shares-mac-with", serde_json::Value::String(text))
                if !text.contains(',') =>
            {
                text.clone()
            }
            ("pps" | "bw" | "mtu", serde_json::Value::Number(n)) => n.to_string(),
            ("isolated", serde_json::Value::Bool(on)) => if *on { "on" } else { "off" }.to_owned(),
            ("socket" | "mac" | "bw" | "pps" | "mtu" | "isolated" | "shares-mac-with", _) => {
                return Err(format!("{key}: {value} is not a value it takes"))
            }
            _ => {
                return Err(format!(
                    "unknown key {key:?}: a NIC takes socket, mac, mtu, isolated, pps, bw and shares-mac-with"
                ))
            }
        };
        spec.push(format!("{key}={text}"));
    }
    parse_nic(&spec.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_control_apis_nics_take_the_same_keys_as_json() {
        let body = serde_json::json!({"socket": "/run/b.sock", "mac": "52:54:00:00:00:02", "isolated": true, "bw": "1M"});
        let nic = nic_from_json("web", &body).unwrap();
        assert_eq!(nic.name.as_deref(), Some("web"));
        assert_eq!(nic.policy.isolated_to, Some(nic.mac));
        assert_eq!(nic.policy.limits.bandwidth, Some(1 << 20));
        for bad in [
            serde_json::json!({"socket": "/a", "mac": "52:54:00:00:00:02", "speed": 1}),
            serde_json::json!({"socket": "/a,mac=52:54:00:00:00:03", "mac": "52:54:00:00:00:02"}),
            serde_json::json!({"socket": "/a", "mac": "52:54:00:00:00:02", "isolated": "yes"}),
            serde_json::json!([1]),
        ] {
            assert!(nic_from_json("web", &bad).is_err(), "{bad} parsed");
        }
        assert!(nic_from_json(".hidden", &body).is_err());
    }

    #[test]
    fn a_nic_needs_a_socket_and_a_unicast_address() {
        let nic = parse_nic("socket=/run/a.sock,mac=52:54:00:00:00:01").unwrap();
        assert_eq!(nic.socket, PathBuf::from("/run/a.sock"));
        assert_eq!(nic.mac.to_string(), "52:54:00:00:00:01");
        assert_eq!(nic.policy, PortPolicy { mac: Some(nic.mac), ..PortPolicy::default() });
        let nic = parse_nic("socket=/a,mac=52:54:00:00:00:01,isolated=on,pps=1000,bw=10M,mtu=9000").unwrap();
        assert_eq!(nic.policy.isolated_to, Some(nic.mac));
        assert_eq!(nic.policy.max_frame_len(), 9018);
        assert_eq!(nic.policy.limits, Limits { iops: Some(1000), bandwidth: Some(10 << 20) });
        for bad in [
            "socket=/a,mac=52:54:00:00:00:01,isolated=yes",
            "socket=/a,mac=52:54:00:00:00:01,pps=0",
            "socket=/a,mac=52:54:00:00:00:01,bw=1K",
            "socket=/a,mac=52:54:00:00:00:01,bw=lots",
            "socket=/a,mac=52:54:00:00:00:01,mtu=1499",
            "socket=/a,mac=52:54:00:00:00:01,mtu=9001",
            "socket=/run/a.sock",
            "mac=52:54:00:00:00:01",
            "socket=/a,mac=01:00:5e:00:00:01",
            "socket=/a,mac=x",
            "path=/a",
        ] {
            assert!(parse_nic(bad).is_err(), "{bad} parsed");
        }
    }
}
