//! `--net` on the command line: `tap=NAME[,mac=52:54:00:12:34:56][,netns=NAME]`, or
//! `vhost-user=SOCKET[,mac=...][,reconnect=SECS][,daemon-uid=UID]`.
//!
//! The tap is opened if it exists and created otherwise (then it lives as long as the VM), in
//! network namespace `netns` (made with `ip netns add NAME`) or in ours. A vhost-user NIC is
//! served by the daemon on SOCKET (`exitless vhost-user-net`), whose `--nic mac=` must be the
//! same address; `reconnect` and `daemon-uid` are a vhost-user disk's.

use crate::disk::{parse_vhost_user, DiskArgError};

/// A parsed `--net`; the MAC is exitless's default for the device's position if not given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetArg {
    pub(crate) mac: Option<[u8; 6]>,
    pub(crate) carrier: Carrier,
}

/// What carries a `--net`'s frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Carrier {
    /// A tap, in a network namespace if named.
    Tap { tap: String, netns: Option<String> },
    /// A vhost-user daemon.
    VhostUser(vmm::VhostUserDisk),
}

impl NetArg {
    /// The MAC address of network device `index` (its position among all virtio devices picks
    /// the default).
    fn mac(&self, index: usize) -> [u8; 6] {
        self.mac.unwrap_or_else(|| vmm::NetConfig::default_mac(index))
    }

    /// The VMM's configuration of network device `index`, if it is on a tap.
    pub fn tap(&self, index: usize) -> Option<vmm::NetConfig> {
        match &self.carrier {
            Carrier::Tap { tap, netns } => {
                Some(vmm::NetConfig { tap: tap.clone(), netns: netns.clone(), mac: self.mac(index) })
            }
            Carrier::VhostUser(_) => None,
        }
    }

    /// The VMM's configuration of network device `index`, if a vhost-user daemon serves it.
    pub fn vhost_user(&self, index: usize) -> Option<vmm::VhostUserNic> {
        match &self.carrier {
            Carrier::VhostUser(daemon) => Some(vmm::VhostUserNic {
                socket: daemon.socket.clone(),
                mac: self.mac(index),
                reconnect: daemon.reconnect,
                daemon_uid: daemon.daemon_uid,
            }),
            Carrier::Tap { .. } => None,
        }
    }
}

/// Why a `--net` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetArgError {
    /// An option `--net` does not take.
    #[error("unknown network option `{0}`; see `exitless run --help`")]
    UnknownOption(String),
    /// No `tap=`.
    #[error("a network device needs `tap=NAME`")]
    NoTap,
    /// A MAC address that is not six hexadecimal bytes.
    #[error("`{0}` is not a MAC address like 52:54:00:12:34:56")]
    BadMac(String),
    /// A multicast MAC address.
    #[error("{0} is a multicast address; a device needs a unicast MAC")]
    MulticastMac(String),
    /// `vhost-user=` with a tap's options.
    #[error("`vhost-user=` takes mac=, reconnect= and daemon-uid=, not `{0}`")]
    VhostUserOption(String),
    /// `vhost-user=`'s socket or daemon options.
    #[error(transparent)]
    VhostUser(#[from] DiskArgError),
}

/// Parse a `--net` value; an error names what is missing or wrong.
pub fn parse(text: &str) -> Result<NetArg, NetArgError> {
    if let Some(rest) = text.strip_prefix("vhost-user=") {
        let mut mac = None;
        let mut daemon = Vec::new();
        for (i, option) in rest.split(',').enumerate() {
            match option.split_once('=') {
                Some(("mac", value)) if i > 0 => mac = Some(parse_mac(value)?),
                Some(("reconnect" | "daemon-uid", _)) if i > 0 => daemon.push(option),
                _ if i == 0 => daemon.push(option),
                _ => return Err(NetArgError::VhostUserOption(option.into())),
            }
        }
        let daemon = parse_vhost_user(&daemon.join(","))?;
        return Ok(NetArg { mac, carrier: Carrier::VhostUser(daemon) });
    }
    let (mut tap, mut netns, mut mac) = (None, None, None);
    for option in text.split(',') {
        match option.split_once('=') {
            Some(("tap", name)) if !name.is_empty() => tap = Some(name.to_string()),
            Some(("netns", name)) if !name.is_empty() => netns = Some(name.to_string()),
            Some(("mac", value)) => mac = Some(parse_mac(value)?),
            _ => return Err(NetArgError::UnknownOption(option.into())),
        }
    }
    let tap = tap.ok_or(NetArgError::NoTap)?;
    Ok(NetArg { mac, carrier: Carrier::Tap { tap, netns } })
}

/// `52:54:00:12:34:56` as six bytes; a unicast address only.
pub fn parse_mac(text: &str) -> Result<[u8; 6], NetArgError> {
    let mac = vmm::parse_mac(text).ok_or_else(|| NetArgError::BadMac(text.into()))?;
    if mac[0] & 1 != 0 {
        return Err(NetArgError::MulticastMac(text.into()));
    }
    Ok(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_forms() {
        let net = parse("tap=tap0,mac=52:54:00:12:34:56,netns=blue").unwrap().tap(0).unwrap();
        assert_eq!(net.tap, "tap0");
        assert_eq!(net.netns.as_deref(), Some("blue"));
        assert_eq!(net.mac, [0x52, 0x54, 0, 0x12, 0x34, 0x56]);
        assert_eq!(parse("tap=t").unwrap().tap(3).unwrap().mac, vmm::NetConfig::default_mac(3));
        let nic = parse("vhost-user=/run/a.net,mac=52:54:00:00:00:07,reconnect=0").unwrap();
        assert!(nic.tap(0).is_none());
        let nic = nic.vhost_user(0).unwrap();
        assert_eq!(nic.socket, std::path::PathBuf::from("/run/a.net"));
        assert_eq!(nic.mac, [0x52, 0x54, 0, 0, 0, 7]);
        assert_eq!(nic.reconnect, std::time::Duration::ZERO);
    }

    #[test]
    fn refuses_what_makes_no_sense() {
        for bad in [
            "",
            "tap=",
            "netns=x",
            "tap=t,mac=52:54:00:12:34",
            "tap=t,mac=01:00:00:00:00:00",
            "tap=t,x=1",
            "tap=t,mac=zz:54:00:12:34:56",
            "tap=t,mac=52:54:00:12:34:56:78",
            "vhost-user=",
            "vhost-user=/a,tap=t",
            "vhost-user=/a,netns=x",
            "vhost-user=/a,reconnect=x",
            "vhost-user=/a,mac=01:00:00:00:00:00",
        ] {
            assert!(parse(bad).is_err(), "{bad} accepted");
        }
    }
}
