//! The part of an Ethernet frame the switch reads: its destination and source addresses.

/// The bytes of an Ethernet header the switch needs: destination, then source.
pub const ADDRESSES_LEN: usize = 12;

/// A MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The broadcast address, ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);

    /// Group addresses (multicast, broadcast) have the low bit of the first byte set: they go to
    /// every port, never into the learning table.
    pub fn is_group(&self) -> bool {
        self.0[0] & 1 != 0
    }

    /// The address as a number, for hashing.
    pub(crate) fn to_u64(self) -> u64 {
        let [a, b, c, d, e, f] = self.0;
        u64::from_be_bytes([0, 0, a, b, c, d, e, f])
    }
}

impl std::fmt::Display for MacAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl std::str::FromStr for MacAddr {
    type Err = String;

    /// `aa:bb:cc:dd:ee:ff`, six hexadecimal bytes.
    fn from_str(text: &str) -> Result<MacAddr, String> {
        let mut mac = [0u8; 6];
        let mut parts = text.split(':');
        for byte in &mut mac {
            let part = parts.next().filter(|p| p.len() == 2);
            *byte = part.and_then(|p| u8::from_str_radix(p, 16).ok()).ok_or_else(|| {
                format!("{text}: give a MAC address as six hexadecimal bytes, aa:bb:cc:dd:ee:ff")
            })?;
        }
        if parts.next().is_some() {
            return Err(format!("{text}: a MAC address has six bytes"));
        }
        Ok(MacAddr(mac))
    }
}

/// Where a frame goes and where it came from, read from its first [`ADDRESSES_LEN`] bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addresses {
    /// The destination.
    pub destination: MacAddr,
    /// The sender.
    pub source: MacAddr,
}

impl Addresses {
    /// The addresses at the start of a frame.
    pub fn parse(start: &[u8; ADDRESSES_LEN]) -> Addresses {
        let mut destination = [0u8; 6];
        let mut source = [0u8; 6];
        destination.copy_from_slice(&start[..6]);
        source.copy_from_slice(&start[6..]);
        Addresses { destination: MacAddr(destination), source: MacAddr(source) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_addresses_are_told_from_unicast_ones() {
        assert!(MacAddr::BROADCAST.is_group());
        assert!("01:00:5e:00:00:01".parse::<MacAddr>().unwrap().is_group());
        assert!(!"52:54:00:12:34:56".parse::<MacAddr>().unwrap().is_group());
    }

    #[test]
    fn a_mac_address_parses_and_prints_alike_and_bad_ones_are_refused() {
        let mac: MacAddr = "52:54:00:ab:cd:ef".parse().unwrap();
        assert_eq!(mac.to_string(), "52:54:00:ab:cd:ef");
        for bad in ["", "52:54:00:ab:cd", "52:54:00:ab:cd:ef:01", "52:54:00:ab:cd:gg", "5:54:00:ab:cd:ef"] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad:?} parsed");
        }
    }
}
