//! The probe guest, built by `build.rs` and embedded in the binary.

use std::path::Path;

/// The probe guest's PVH ELF image.
pub static PROBE_ELF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/exitless-probe.elf"));

/// Write the probe ELF to `path` so other VMMs can boot the same guest.
pub fn export(path: &Path) -> std::io::Result<()> {
    std::fs::write(path, PROBE_ELF)
}

/// The command line the probe gets when the user gives none.
pub const DEFAULT_CMDLINE: &str = "probe.workload=hello";

/// `cmdline` with the TSC frequency appended, unless it already has one, so the probe reports
/// nanoseconds.
pub fn with_tsc_khz(cmdline: &str, tsc_khz: u32) -> String {
    let key = probe_abi::param::TSC_KHZ;
    if cmdline.split_whitespace().any(|w| w.starts_with(&format!("{key}="))) {
        cmdline.to_string()
    } else {
        format!("{cmdline} {key}={tsc_khz}").trim().to_string()
    }
}
