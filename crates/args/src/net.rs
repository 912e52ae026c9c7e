//! `--net` on the command line: `tap=NAME[,mac=52:54:00:12:34:56][,netns=NAME]`.
//!
//! The tap is opened if it exists and created otherwise (then it lives as long as the VM), in
//! network namespace `netns` (made with `ip netns add NAME`) or in ours.

/// A parsed `--net`; the MAC is exitless's default for the device's position if not given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetArg {
    pub(crate) tap: String,
    pub(crate) netns: Option<String>,
    pub(crate) mac: Option<[u8; 6]>,
}

impl NetArg {
    /// The VMM's configuration of network device `index` (its position among all virtio
    /// devices, which picks the default MAC).
    pub fn config(&self, index: usize) -> vmm::NetConfig {
        vmm::NetConfig {
            tap: self.tap.clone(),
            netns: self.netns.clone(),
            mac: self.mac.unwrap_or_else(|| vmm::NetConfig::default_mac(index)),
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
}

/// Parse a `--net` value; an error names what is missing or wrong.
pub fn parse(text: &str) -> Result<NetArg, NetArgError> {
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
    Ok(NetArg { tap, netns, mac })
}

/// `52:54:00:12:34:56` as six bytes; a unicast address only.
pub fn parse_mac(text: &str) -> Result<[u8; 6], NetArgError> {
    let bad = || NetArgError::BadMac(text.into());
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in mac.iter_mut() {
        let part = parts.next().filter(|p| p.len() == 2).ok_or_else(bad)?;
        *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
    }
    if parts.next().is_some() {
        return Err(bad());
    }
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
        let net = parse("tap=tap0,mac=52:54:00:12:34:56,netns=blue").unwrap();
        assert_eq!(net.tap, "tap0");
        assert_eq!(net.netns.as_deref(), Some("blue"));
        assert_eq!(net.mac, Some([0x52, 0x54, 0, 0x12, 0x34, 0x56]));
        assert_eq!(parse("tap=t").unwrap().config(3).mac, vmm::NetConfig::default_mac(3));
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
        ] {
            assert!(parse(bad).is_err(), "{bad} accepted");
        }
    }
}
