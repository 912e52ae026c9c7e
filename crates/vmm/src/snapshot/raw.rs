//! KVM's state structures in a snapshot: the kernel's own layout (stable ABI), as hexadecimal
//! text of exactly the structure's size, so a snapshot reads as JSON and a short or long field
//! is an error rather than a zero-filled structure.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use virtio::mmio::state::{hex, unhex};
use zerocopy::{FromBytes, Immutable, IntoBytes};

/// A KVM structure saved byte for byte.
#[derive(Default)]
pub struct Raw<T>(pub T);

// By bytes: some of KVM's structures (kvm_xsave, with its flexible array) are not `Clone`.
impl<T: FromBytes + IntoBytes + Immutable> Clone for Raw<T> {
    fn clone(&self) -> Self {
        // Same type, same size: the read cannot fail.
        Raw(T::read_from_bytes(self.0.as_bytes()).unwrap_or_else(|_| T::new_zeroed()))
    }
}

impl<T: IntoBytes + Immutable> Serialize for Raw<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&hex(self.0.as_bytes()))
    }
}

impl<'de, T: FromBytes> Deserialize<'de> for Raw<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        let want = std::mem::size_of::<T>();
        if text.len() != want * 2 {
            return Err(serde::de::Error::custom(format!(
                "{} hex digits where {} are {} bytes ({})",
                text.len(),
                std::any::type_name::<T>().rsplit("::").next().unwrap_or("structure"),
                want,
                want * 2
            )));
        }
        let bytes = unhex(&text).map_err(serde::de::Error::custom)?;
        T::read_from_bytes(&bytes).map(Raw).map_err(|_| serde::de::Error::custom("structure size"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::kvm_regs;

    #[test]
    fn a_structure_round_trips_and_a_short_one_is_refused() {
        let regs = kvm_regs { rip: 0x1234, rflags: 2, ..Default::default() };
        let text = serde_json::to_string(&Raw(regs)).unwrap();
        let back: Raw<kvm_regs> = serde_json::from_str(&text).unwrap();
        assert_eq!(back.0.rip, 0x1234);
        let short = format!("\"{}\"", &text[1..text.len() - 3]);
        assert!(serde_json::from_str::<Raw<kvm_regs>>(&short).is_err());
        assert!(serde_json::from_str::<Raw<kvm_regs>>(&text.replace('0', "g")).is_err());
    }
}
