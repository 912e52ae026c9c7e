//! Builds the probe guest (`guest/`, target x86_64-unknown-none) and puts its ELF in OUT_DIR for
//! `include_bytes!`, so `exitless run --probe` needs no other file.

use std::path::PathBuf;
use std::process::Command;

const GUEST_TARGET: &str = "x86_64-unknown-none";

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let guest_dir = manifest_dir.join("../../guest");
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").unwrap());
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    for path in ["src", "Cargo.toml", "link.ld", "build.rs", ".cargo/config.toml"] {
        println!("cargo:rerun-if-changed={}", guest_dir.join(path).display());
    }
    println!("cargo:rerun-if-changed={}", manifest_dir.join("../probe-abi/src").display());

    let target_dir = out_dir.join("guest-target");
    let mut build = Command::new(cargo);
    build
        .current_dir(&guest_dir)
        .args(["build", "--release", "--target", GUEST_TARGET, "--target-dir"])
        .arg(&target_dir);
    // The outer build's flags and wrappers are for the host target, not the guest's.
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_MAKEFLAGS",
        "MAKEFLAGS",
    ] {
        build.env_remove(var);
    }
    let status = build.status().expect("cannot run cargo to build the probe guest");
    if !status.success() {
        panic!(
            "building the probe guest failed; is the Rust target installed? \
             `rustup target add {GUEST_TARGET}`"
        );
    }
    let elf = target_dir.join(GUEST_TARGET).join("release/exitless-probe");
    std::fs::copy(&elf, out_dir.join("exitless-probe.elf")).expect("copy the probe guest ELF");
}
