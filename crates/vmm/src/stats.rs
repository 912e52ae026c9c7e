//! Exit accounting from KVM's binary statistics file descriptor (KVM_GET_STATS_FD): snapshots of
//! a vCPU's counters and deltas between them.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use kvm_bindings::{KVM_STATS_TYPE_CUMULATIVE, KVM_STATS_TYPE_MASK};
use kvm_ioctls::VcpuFd;
use serde::ser::{Serialize, SerializeMap, Serializer};
use thiserror::Error;

/// The counters shown first, always, because they tell where exits come from.
pub const MAIN_COUNTERS: [&str; 7] =
    ["exits", "mmio_exits", "io_exits", "halt_exits", "irq_exits", "irq_injections", "insn_emulation"];

const KVMIO: u32 = 0xae;
vmm_sys_util::ioctl_io_nr!(KVM_GET_STATS_FD, KVMIO, 0xce);
const HEADER_LEN: usize = 24;
const DESC_FIXED_LEN: usize = 16;

#[derive(Debug, Error)]
pub enum StatsError {
    #[error("KVM_GET_STATS_FD failed (the host kernel needs KVM binary statistics, Linux 5.14+): {0}")]
    Open(std::io::Error),
    #[error("cannot read the KVM statistics: {0}")]
    Read(std::io::Error),
    #[error("the KVM statistics header is malformed")]
    Malformed,
}

/// Names and kinds of a statistics fd's counters, shared by its snapshots.
#[derive(Debug)]
struct Layout {
    names: Vec<String>,
    /// Byte offset of each counter's first value inside the data block.
    offsets: Vec<usize>,
    cumulative: Vec<bool>,
    data_offset: u64,
    data_len: usize,
}

/// One vCPU's statistics file descriptor.
#[derive(Debug)]
pub struct VcpuStats {
    file: File,
    layout: Arc<Layout>,
    buffer: Vec<u8>,
}

/// The values of every counter at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    layout: Arc<Layout>,
    values: Vec<u64>,
}

/// How much each cumulative counter grew between two snapshots, in KVM's order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters(pub Vec<(String, u64)>);

impl VcpuStats {
    pub fn open(vcpu: &VcpuFd) -> Result<Self, StatsError> {
        // SAFETY: KVM_GET_STATS_FD takes no argument and returns a new file descriptor or -1.
        let fd = unsafe { vmm_sys_util::ioctl::ioctl(vcpu, KVM_GET_STATS_FD()) };
        if fd < 0 {
            return Err(StatsError::Open(std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a new descriptor that nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        let layout = Arc::new(read_layout(&file)?);
        let buffer = vec![0; layout.data_len];
        Ok(VcpuStats { file, layout, buffer })
    }

    pub fn snapshot(&mut self) -> Result<Snapshot, StatsError> {
        self.file.read_exact_at(&mut self.buffer, self.layout.data_offset).map_err(StatsError::Read)?;
        let values = self
            .layout
            .offsets
            .iter()
            .map(|&o| u64::from_ne_bytes(self.buffer[o..o + 8].try_into().unwrap()))
            .collect();
        Ok(Snapshot { layout: self.layout.clone(), values })
    }
}

impl AsRawFd for VcpuStats {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.file.as_raw_fd()
    }
}

fn read_layout(file: &File) -> Result<Layout, StatsError> {
    let mut header = [0u8; HEADER_LEN];
    file.read_exact_at(&mut header, 0).map_err(StatsError::Read)?;
    let field = |i: usize| u32::from_ne_bytes(header[i * 4..i * 4 + 4].try_into().unwrap()) as usize;
    let (name_size, num_desc, desc_offset, data_offset) = (field(1), field(2), field(4), field(5));
    if num_desc > 4096 || name_size > 1024 {
        return Err(StatsError::Malformed);
    }
    let desc_len = DESC_FIXED_LEN + name_size;
    let mut descs = vec![0u8; desc_len * num_desc];
    file.read_exact_at(&mut descs, desc_offset as u64).map_err(StatsError::Read)?;
    let mut layout = Layout {
        names: Vec::new(),
        offsets: Vec::new(),
        cumulative: Vec::new(),
        data_offset: data_offset as u64,
        data_len: 0,
    };
    for desc in descs.chunks_exact(desc_len) {
        let flags = u32::from_ne_bytes(desc[0..4].try_into().unwrap());
        let size = u16::from_ne_bytes(desc[6..8].try_into().unwrap()) as usize;
        let offset = u32::from_ne_bytes(desc[8..12].try_into().unwrap()) as usize;
        if size == 0 {
            continue;
        }
        let name = &desc[DESC_FIXED_LEN..];
        let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
        layout.names.push(String::from_utf8_lossy(name).into_owned());
        layout.offsets.push(offset);
        layout.cumulative.push(flags & KVM_STATS_TYPE_MASK == KVM_STATS_TYPE_CUMULATIVE);
        layout.data_len = layout.data_len.max(offset + size * 8);
    }
    Ok(layout)
}

impl Snapshot {
    /// The value of counter `name`, if KVM has it.
    pub fn get(&self, name: &str) -> Option<u64> {
        let index = self.layout.names.iter().position(|n| n == name)?;
        Some(self.values[index])
    }

    /// Growth of every cumulative counter since `earlier` (a snapshot of the same vCPU).
    pub fn since(&self, earlier: &Snapshot) -> Counters {
        let layout = &self.layout;
        Counters(
            (0..layout.names.len())
                .filter(|&i| layout.cumulative[i])
                .map(|i| (layout.names[i].clone(), self.values[i].wrapping_sub(earlier.values[i])))
                .collect(),
        )
    }
}

impl Counters {
    /// The growth of counter `name` (0 when KVM has no such counter).
    pub fn get(&self, name: &str) -> u64 {
        self.0.iter().find(|(n, _)| n == name).map_or(0, |(_, v)| *v)
    }

    /// Several runs' counters added up, name by name (in the order the names first come).
    pub fn sum<'a>(all: impl IntoIterator<Item = &'a Counters>) -> Counters {
        let mut total: Vec<(String, u64)> = Vec::new();
        for (name, value) in all.into_iter().flat_map(|counters| &counters.0) {
            match total.iter_mut().find(|(n, _)| n == name) {
                Some((_, sum)) => *sum += value,
                None => total.push((name.clone(), *value)),
            }
        }
        Counters(total)
    }

    /// The counters worth showing: the main ones always, the rest when non-zero.
    pub fn notable(&self) -> Vec<(&str, u64)> {
        let mut shown: Vec<(&str, u64)> = MAIN_COUNTERS.iter().map(|&n| (n, self.get(n))).collect();
        shown.extend(
            self.0
                .iter()
                .filter(|(n, v)| *v != 0 && !MAIN_COUNTERS.contains(&n.as_str()))
                .map(|(n, v)| (n.as_str(), *v)),
        );
        shown
    }
}

impl Serialize for Counters {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let shown = self.notable();
        let mut map = serializer.serialize_map(Some(shown.len()))?;
        for (name, value) in shown {
            map.serialize_entry(name, &value)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::Counters;

    #[test]
    fn counters_add_up_name_by_name() {
        let counters =
            |pairs: &[(&str, u64)]| Counters(pairs.iter().map(|&(n, v)| (n.to_string(), v)).collect());
        let a = counters(&[("exits", 3), ("mmio_exits", 1)]);
        let b = counters(&[("halt_exits", 2), ("exits", 4)]);
        assert_eq!(Counters::sum([&a, &b]), counters(&[("exits", 7), ("mmio_exits", 1), ("halt_exits", 2)]));
        assert_eq!(Counters::sum([]), Counters::default());
    }
}
