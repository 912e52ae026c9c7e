//! `exitless vhost-user-net`'s command line.

use std::path::PathBuf;

use clap::Args;
use switch::MacAddr;

/// `exitless vhost-user-net`'s options.
#[derive(Args)]
#[command(after_help = AFTER_HELP)]
pub struct VhostUserNetArgs {
    /// A NIC to serve (repeatable): `socket=PATH,mac=MAC`, its vhost-user socket (a stale
    /// socket file there is replaced; made 0600, and only the daemon's user and root may
    /// connect) and the MAC address its driver reads (aa:bb:cc:dd:ee:ff, unicast).
    #[arg(long, value_name = "SPEC", value_parser = parse_nic, required = true)]
    pub nic: Vec<Nic>,
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
}

fn parse_nic(spec: &str) -> Result<Nic, String> {
    let (mut socket, mut mac) = (None, None);
    for part in spec.split(',') {
        match part.split_once('=') {
            Some(("socket", path)) if !path.is_empty() => socket = Some(PathBuf::from(path)),
            Some(("mac", text)) => mac = Some(text.parse::<MacAddr>()?),
            _ => return Err(format!("{part}: a NIC is socket=PATH,mac=MAC")),
        }
    }
    let mac = mac.ok_or("a NIC needs mac=MAC")?;
    if mac.is_group() {
        return Err(format!("mac={mac}: a NIC's address must be unicast (the first byte even)"));
    }
    Ok(Nic { socket: socket.ok_or("a NIC needs socket=PATH")?, mac })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nic_needs_a_socket_and_a_unicast_address() {
        let nic = parse_nic("socket=/run/a.sock,mac=52:54:00:00:00:01").unwrap();
        assert_eq!(nic.socket, PathBuf::from("/run/a.sock"));
        assert_eq!(nic.mac.to_string(), "52:54:00:00:00:01");
        for bad in [
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
