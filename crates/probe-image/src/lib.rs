//! The probe guest (`guest/`), built by `build.rs` and embedded here, so `exitless run --probe`
//! and the bench need no other file; and the command line it gets.

#![deny(missing_docs)]

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
    with_default(cmdline, probe_abi::param::TSC_KHZ, &tsc_khz.to_string())
}

/// `cmdline` with the guest half of `mode` (completion by interrupt or by polling, PV EOI)
/// appended, where the command line does not choose otherwise.
pub fn with_io_mode(cmdline: &str, mode: vmm::IoMode) -> String {
    let completion = if mode.interrupt_completion() { "interrupt" } else { "poll" };
    let cmdline = with_default(cmdline, "probe.completion", completion);
    with_default(&cmdline, "probe.pv_eoi", if mode.uses_pv_eoi() { "on" } else { "off" })
}

fn with_default(cmdline: &str, key: &str, value: &str) -> String {
    if cmdline.split_whitespace().any(|w| w.strip_prefix(key).is_some_and(|rest| rest.starts_with('='))) {
        cmdline.to_string()
    } else {
        format!("{cmdline} {key}={value}").trim().to_string()
    }
}
