//! `exitless vhost-user-net`'s command line.

use std::path::PathBuf;

use clap::Args;
use rate_limiter::Limits;
use switch::{MacAddr, PortPolicy};

/// `exitless vhost-user-net`'s options.
#[derive(Args)]
#[command(after_help = AFTER_HELP)]
pub struct VhostUserNetArgs {
    /// A NIC to serve (repeatable): `socket=PATH,mac=MAC[,isolated=on][,pps=N][,bw=BYTES]`: its
    /// vhost-user socket (a stale socket file there is replaced; made 0600, and only the
    /// daemon's user and root may connect), the MAC address its driver reads
    /// (aa:bb:cc:dd:ee:ff, unicast), whether it may talk to the uplink only, and the frames and
    /// bytes per second (K/M/G suffixes) it may send.
    #[arg(long, value_name = "SPEC", value_parser = parse_nic, required = true)]
    pub nic: Vec<Nic>,
    /// A host interface to carry frames to and from the host and the network beyond: an
    /// AF_PACKET socket on it (put in promiscuous mode), for example one end of a veth pair
    /// whose other end has the host's address, or a physical NIC.
    #[arg(long, value_name = "INTERFACE")]
    pub uplink: Option<String>,
    /// Pin the IOCore that runs the switch to this host CPU.
    #[arg(long, value_name = "CPU")]
    pub iocore_cpu: Option<usize>,
    /// `--seccomp`: how strictly each thread is confined.
    #[command(flatten)]
    pub seccomp: exitless_args::SeccompArgs,
}

const AFTER_HELP: &str = "\
Every NIC is a port of one switch, run by one IOCore that polls every ring: a frame from one
NIC to another goes from the sender's transmit ring into the receiver's receive ring, with one
copy and no system call. The switch learns each sender's address; a frame to a group address
(broadcast, multicast) or to an address not seen yet goes to every other NIC. No offload is
offered: frames are at most 1518 bytes.

With --uplink, frames to addresses not on a NIC of the daemon (and every broadcast) go to the
host interface too, and the host's frames come in through it: the interface's receive and
transmit rings are shared with the kernel (PACKET_MMAP), polled by the IOCore with no system
call per frame, one send() per pass that put frames on it. Frames the host's stack sends with
their checksum left to offload get it filled in; turn segmentation offloads off on the far end
(ethtool -K IF tso off gso off), as frames longer than 1518 bytes are dropped.

isolated=on: the NIC talks to the uplink only, never to another NIC, and only from its own
address (frames from another are dropped as spoofed). pps=N and bw=BYTES: token buckets on what
it sends, holding one second's budget; a frame over them waits in the NIC's ring.

A QEMU guest on a NIC (its memory must be shared with the daemon):
  exitless vhost-user-net --nic socket=/run/vm1.net,mac=52:54:00:00:00:01 \\
                          --nic socket=/run/vm2.net,mac=52:54:00:00:00:02
  qemu-system-x86_64 ... -object memory-backend-memfd,id=mem,size=1G,share=on \\
      -machine memory-backend=mem -chardev socket,id=n0,path=/run/vm1.net \\
      -netdev vhost-user,id=net0,chardev=n0 -device virtio-net-pci,netdev=net0,mac=52:54:00:00:00:01";

/// One `--nic`.
#[derive(Debug, Clone)]
pub struct Nic {
    /// Its vhost-user socket.
    pub socket: PathBuf,
    /// The address its driver reads.
    pub mac: MacAddr,
    /// What it may do on the switch.
    pub policy: PortPolicy,
}

fn parse_nic(spec: &str) -> Result<Nic, String> {
    let (mut socket, mut mac, mut isolated, mut limits) = (None, None, false, Limits::default());
    for part in spec.split(',') {
        match part.split_once('=') {
            Some(("socket", path)) if !path.is_empty() => socket = Some(PathBuf::from(path)),
            Some(("mac", text)) => mac = Some(text.parse::<MacAddr>()?),
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
                    "{part}: a NIC is socket=PATH,mac=MAC[,isolated=on|off][,pps=N][,bw=BYTES]"
                ))
            }
        }
    }
    let mac = mac.ok_or("a NIC needs mac=MAC")?;
    if mac.is_group() {
        return Err(format!("mac={mac}: a NIC's address must be unicast (the first byte even)"));
    }
    let policy = PortPolicy { isolated_to: isolated.then_some(mac), limits };
    Ok(Nic { socket: socket.ok_or("a NIC needs socket=PATH")?, mac, policy })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nic_needs_a_socket_and_a_unicast_address() {
        let nic = parse_nic("socket=/run/a.sock,mac=52:54:00:00:00:01").unwrap();
        assert_eq!(nic.socket, PathBuf::from("/run/a.sock"));
        assert_eq!(nic.mac.to_string(), "52:54:00:00:00:01");
        assert_eq!(nic.policy, PortPolicy::default());
        let nic = parse_nic("socket=/a,mac=52:54:00:00:00:01,isolated=on,pps=1000,bw=10M").unwrap();
        assert_eq!(nic.policy.isolated_to, Some(nic.mac));
        assert_eq!(nic.policy.limits, Limits { iops: Some(1000), bandwidth: Some(10 << 20) });
        for bad in [
            "socket=/a,mac=52:54:00:00:00:01,isolated=yes",
            "socket=/a,mac=52:54:00:00:00:01,pps=0",
            "socket=/a,mac=52:54:00:00:00:01,bw=1K",
            "socket=/a,mac=52:54:00:00:00:01,bw=lots",
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
