//! Which port each source address was last seen on: a fixed table, so learning allocates
//! nothing and a guest that sends from many addresses only evicts entries, never grows it. A
//! NIC's own address is pinned to its port: no other port learns it (a frame from it elsewhere
//! is spoofed), and learning never evicts it.

use crate::ethernet::MacAddr;

/// Entries in the table (a power of two).
const SLOTS: usize = 4096;
/// Slots an address may sit in, from its hash on: the longest probe of a lookup.
const PROBE: usize = 8;

#[derive(Clone, Copy)]
struct Entry {
    /// The address as a number; `u64::MAX` (no MAC address is that wide) for a free slot.
    mac: u64,
    port: usize,
    /// A NIC's own address: only its port may send from it.
    pinned: bool,
}

const FREE: Entry = Entry { mac: u64::MAX, port: 0, pinned: false };

/// MAC address to port.
pub struct MacTable {
    entries: Box<[Entry]>,
}

impl Default for MacTable {
    fn default() -> Self {
        MacTable { entries: vec![FREE; SLOTS].into_boxed_slice() }
    }
}

impl MacTable {
    fn home(mac: u64) -> usize {
        // Fibonacci hashing: the multiply spreads addresses that differ only in low bytes.
        (mac.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) as usize & (SLOTS - 1)
    }

    fn slots(mac: u64) -> impl Iterator<Item = usize> {
        let home = Self::home(mac);
        (0..PROBE).map(move |i| (home + i) & (SLOTS - 1))
    }

    /// The port `mac` was last seen on.
    #[inline]
    pub fn lookup(&self, mac: MacAddr) -> Option<usize> {
        let mac = mac.to_u64();
        Self::slots(mac).map(|slot| self.entries[slot]).find(|e| e.mac == mac).map(|e| e.port)
    }

    /// `mac` sent from `port`: frames to it go there from now on. A group address is never
    /// learnt. When every slot of its probe is taken by other addresses, the first one not
    /// pinned is evicted. `false`: the address is pinned to another port (the frame is
    /// spoofed), or every slot of its probe is pinned; nothing is learnt.
    #[inline]
    pub fn learn(&mut self, mac: MacAddr, port: usize) -> bool {
        self.insert(mac, port, false)
    }

    /// Pin `mac` to `port` (a NIC's own address, as it attaches); `false` if every slot of its
    /// probe is pinned to other addresses.
    pub fn pin(&mut self, mac: MacAddr, port: usize) -> bool {
        self.insert(mac, port, true)
    }

    fn insert(&mut self, mac: MacAddr, port: usize, pinned: bool) -> bool {
        if mac.is_group() {
            return true;
        }
        let mac = mac.to_u64();
        let mut free = None;
        for slot in Self::slots(mac) {
            let entry = &mut self.entries[slot];
            if entry.mac == mac {
                if entry.pinned && entry.port != port && !pinned {
                    return false;
                }
                *entry = Entry { mac, port, pinned: pinned || entry.pinned };
                return true;
            }
            if entry.mac == FREE.mac && free.is_none() {
                free = Some(slot);
            }
        }
        let evictable = Self::slots(mac).find(|&slot| !self.entries[slot].pinned);
        match free.or(evictable) {
            Some(slot) => {
                self.entries[slot] = Entry { mac, port, pinned };
                true
            }
            None => false,
        }
    }

    /// Forget every address learnt on `port` (it is gone).
    pub fn forget_port(&mut self, port: usize) {
        for entry in self.entries.iter_mut().filter(|e| e.mac != FREE.mac && e.port == port) {
            *entry = FREE;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(n: u32) -> MacAddr {
        let [a, b, c, d] = n.to_be_bytes();
        MacAddr([0x52, 0x54, a, b, c, d])
    }

    #[test]
    fn an_address_is_found_on_the_port_it_was_last_seen_on() {
        let mut table = MacTable::default();
        assert_eq!(table.lookup(mac(1)), None);
        table.learn(mac(1), 3);
        table.learn(mac(2), 4);
        assert_eq!(table.lookup(mac(1)), Some(3));
        table.learn(mac(1), 5);
        assert_eq!(table.lookup(mac(1)), Some(5));
        assert_eq!(table.lookup(mac(2)), Some(4));
        table.forget_port(5);
        assert_eq!(table.lookup(mac(1)), None);
        assert_eq!(table.lookup(mac(2)), Some(4));
    }

    #[test]
    fn a_pinned_address_is_no_other_ports_and_never_evicted() {
        let mut table = MacTable::default();
        assert!(table.pin(mac(1), 3));
        assert!(!table.learn(mac(1), 4), "another port sent from a pinned address");
        assert_eq!(table.lookup(mac(1)), Some(3));
        assert!(table.learn(mac(1), 3), "its own port");
        for n in 2..100_000 {
            table.learn(mac(n), 5);
        }
        assert_eq!(table.lookup(mac(1)), Some(3), "evicted by a flood of addresses");
        table.forget_port(3);
        assert!(table.learn(mac(1), 4), "unpinned once its port is gone");
    }

    #[test]
    fn group_addresses_are_not_learnt() {
        let mut table = MacTable::default();
        table.learn(MacAddr::BROADCAST, 1);
        assert_eq!(table.lookup(MacAddr::BROADCAST), None);
    }

    #[test]
    fn a_flood_of_source_addresses_evicts_entries_but_never_grows_the_table() {
        let mut table = MacTable::default();
        for n in 0..100_000 {
            table.learn(mac(n), (n % 7) as usize);
        }
        assert_eq!(table.entries.len(), SLOTS);
        // The last address learnt is always found.
        assert_eq!(table.lookup(mac(99_999)), Some(99_999 % 7));
    }
}
