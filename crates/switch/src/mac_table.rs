//! Which port each source address was last seen on: a fixed table, so learning allocates
//! nothing and a guest that sends from many addresses only evicts entries, never grows it. A
//! NIC's own address is pinned to its port: no other port learns it (a frame from it elsewhere
//! is spoofed), and learning never evicts it.
//!
//! The switches of one daemon (one per IOCore) share the table: each entry is one atomic word,
//! read with a plain load and changed only by compare-and-swap, so no switch waits for another.
//! Two switches learning at once may each miss the other's change; the table is a cache of
//! where addresses were seen, and the next frame from an address puts it right.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::ethernet::MacAddr;

/// Entries in the table (a power of two).
const SLOTS: usize = 4096;
/// Slots an address may sit in, from its hash on: the longest probe of a lookup.
const PROBE: usize = 8;
/// A free slot: no entry packs to it, as a group address (all ones) is never learnt.
const FREE: u64 = u64::MAX;
const MAC_BITS: u32 = 48;
const PINNED: u64 = 1 << 63;

/// One entry: the address, its port (at most 255) and whether it is pinned, in one word.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Entry {
    mac: u64,
    port: usize,
    /// A NIC's own address: only its port may send from it.
    pinned: bool,
}

impl Entry {
    fn pack(self) -> u64 {
        self.mac | (self.port as u64 & 0xff) << MAC_BITS | if self.pinned { PINNED } else { 0 }
    }

    /// `None` for a free slot.
    fn unpack(word: u64) -> Option<Entry> {
        (word != FREE).then_some(Entry {
            mac: word & ((1 << MAC_BITS) - 1),
            port: (word >> MAC_BITS & 0xff) as usize,
            pinned: word & PINNED != 0,
        })
    }
}

/// MAC address to port, shared by the switches of one daemon.
pub struct MacTable {
    entries: Box<[AtomicU64]>,
}

impl Default for MacTable {
    fn default() -> Self {
        MacTable { entries: (0..SLOTS).map(|_| AtomicU64::new(FREE)).collect() }
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

    fn load(&self, slot: usize) -> u64 {
        self.entries[slot].load(Ordering::Acquire)
    }

    /// The port `mac` was last seen on.
    #[inline]
    pub fn lookup(&self, mac: MacAddr) -> Option<usize> {
        let mac = mac.to_u64();
        Self::slots(mac)
            .filter_map(|slot| Entry::unpack(self.load(slot)))
            .find(|e| e.mac == mac)
            .map(|e| e.port)
    }

    /// `mac` sent from `port`: frames to it go there from now on. A group address is never
    /// learnt. When every slot of its probe is taken by other addresses, the first one not
    /// pinned is evicted. `false`: the address is pinned to another port (the frame is
    /// spoofed), or every slot of its probe is pinned; nothing is learnt.
    #[inline]
    pub fn learn(&self, mac: MacAddr, port: usize) -> bool {
        self.insert(mac, port, false)
    }

    /// Pin `mac` to `port` (a NIC's own address, as it attaches); `false` if every slot of its
    /// probe is pinned to other addresses.
    pub fn pin(&self, mac: MacAddr, port: usize) -> bool {
        self.insert(mac, port, true)
    }

    fn insert(&self, mac: MacAddr, port: usize, pinned: bool) -> bool {
        if mac.is_group() {
            return true;
        }
        let mac = mac.to_u64();
        // A pin must hold against a switch learning beside it: it tries again when it loses.
        loop {
            let mut free = None;
            let mut evictable = None;
            for slot in Self::slots(mac) {
                let word = self.load(slot);
                let Some(entry) = Entry::unpack(word) else {
                    free = free.or(Some((slot, word)));
                    continue;
                };
                if entry.mac == mac {
                    if entry.pinned && entry.port != port && !pinned {
                        return false;
                    }
                    let new = Entry { mac, port, pinned: pinned || entry.pinned }.pack();
                    // Most frames come from where their sender was seen: nothing to write.
                    if new == word || self.swap(slot, word, new) || !pinned {
                        return true;
                    }
                    break;
                }
                if !entry.pinned {
                    evictable = evictable.or(Some((slot, word)));
                }
            }
            let Some((slot, word)) = free.or(evictable) else { return false };
            if self.swap(slot, word, Entry { mac, port, pinned }.pack()) || !pinned {
                return true;
            }
        }
    }

    fn swap(&self, slot: usize, old: u64, new: u64) -> bool {
        self.entries[slot].compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// Forget every address learnt on `port` (it is gone).
    pub fn forget_port(&self, port: usize) {
        for (slot, entry) in self.entries.iter().enumerate() {
            let word = entry.load(Ordering::Acquire);
            if Entry::unpack(word).is_some_and(|e| e.port == port) {
                let _ = self.swap(slot, word, FREE);
            }
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
        let table = MacTable::default();
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
        let table = MacTable::default();
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
        let table = MacTable::default();
        table.learn(MacAddr::BROADCAST, 1);
        assert_eq!(table.lookup(MacAddr::BROADCAST), None);
    }

    #[test]
    fn a_flood_of_source_addresses_evicts_entries_but_never_grows_the_table() {
        let table = MacTable::default();
        for n in 0..100_000 {
            table.learn(mac(n), (n % 7) as usize);
        }
        assert_eq!(table.entries.len(), SLOTS);
        assert!(table
            .entries
            .iter()
            .all(|e| Entry::unpack(e.load(Ordering::Relaxed)).is_none_or(|e| e.port < 7)));
        // The last address learnt is always found.
        assert_eq!(table.lookup(mac(99_999)), Some(99_999 % 7));
    }
}
