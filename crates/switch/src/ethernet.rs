//! The part of an Ethernet frame the switch reads: its destination and source addresses.

/// The bytes of an Ethernet header the switch needs: destination, then source.
pub const ADDRESSES_LEN: usize = 12;

/// The bytes of a frame's start that name its flow: an Ethernet header, an IPv6 header, and the
/// first four bytes after it (TCP's and UDP's ports).
pub const FLOW_BYTES: usize = 58;

/// A number the same for every frame of one flow, to spread flows over a NIC's receive queues
/// as receive-side scaling does (`start`: the frame's first bytes, up to [`FLOW_BYTES`]): an
/// IPv4 or IPv6 packet's addresses and the four bytes after its header (the ports of TCP and
/// UDP, without IPv4 options); any other frame's Ethernet addresses. Not a defence: a guest may
/// put all its flows on one queue of its own receiver, as a driver may steer a real NIC.
pub fn flow_of(start: &[u8]) -> u32 {
    let key = match start.get(12..14) {
        Some([0x08, 0x00]) => start.get(26..38),
        Some([0x86, 0xdd]) => start.get(22..58),
        _ => None,
    };
    // FNV-1a, then MurmurHash3's finalizer: FNV's low bits are the parity of the bytes' low
    // bits, and a flow's ports often change together.
    let key = key.unwrap_or(&start[..start.len().min(ADDRESSES_LEN)]);
    let mut hash =
        key.iter().fold(0x811c_9dc5u32, |hash, &byte| (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193));
    hash ^= hash >> 16;
    hash = hash.wrapping_mul(0x85eb_ca6b);
    hash ^= hash >> 13;
    hash = hash.wrapping_mul(0xc2b2_ae35);
    hash ^ (hash >> 16)
}

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
    /// The addresses at the start of a frame; `None` if `start` is shorter than they are.
    pub fn parse(start: &[u8]) -> Option<Addresses> {
        let destination = start.get(..6)?.try_into().ok()?;
        let source = start.get(6..ADDRESSES_LEN)?.try_into().ok()?;
        Some(Addresses { destination: MacAddr(destination), source: MacAddr(source) })
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
