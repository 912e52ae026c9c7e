//! What the block and network workloads share about their device: finding it among the
//! `virtio_mmio.device=` entries, and the error line when it cannot be driven.

use crate::json::Str;
use crate::virtio::mmio::{self, Transport};
use crate::virtio::Error;
use crate::{bad_parameter, println, x86, Env};
use probe_abi::status;

/// A device type as the error lines name it.
pub struct Kind {
    pub device_id: u32,
    /// In `"no <name> device with this index"`.
    pub name: &'static str,
    /// The field counting the devices of this type that were found.
    pub count_field: &'static str,
}

/// The transport of the `dev`-th device of type `kind` (from 0, in command-line order), or
/// report what there is and stop.
pub fn find(env: &Env, probe: &str, kind: &Kind, dev: u64) -> Transport {
    let mut transports = 0;
    let mut found = 0;
    let mut legacy = 0;
    for entry in mmio::entries(env.cmdline) {
        let transport = entry.unwrap_or_else(|_| bad_parameter("virtio_mmio.device"));
        transports += 1;
        match transport.device_id() {
            Ok(id) if id == kind.device_id => {}
            Err(Error::UnsupportedVersion(1)) => {
                legacy += 1;
                continue;
            }
            _ => continue, // empty transports (QEMU microvm lists them), other devices, bad magic
        }
        found += 1;
        if found - 1 == dev {
            return transport;
        }
    }
    // QEMU microvm lists its transports on the command line only with acpi=off, and offers
    // the version 2 register layout only with -global virtio-mmio.force-legacy=false.
    println!(
        "{{\"probe\":{},\"error\":\"no {} device with this index\",\"dev\":{},\"transports\":{},\"{}\":{},\"legacy_transports\":{}}}",
        Str(probe),
        kind.name,
        dev,
        transports,
        kind.count_field,
        found,
        legacy
    );
    x86::exit(status::FAILED)
}

/// Report a driver error and stop with FAILED.
pub fn fail(probe: &str, error: Error, transport: &Transport) -> ! {
    let device_status = transport.status();
    let detail = match error {
        Error::UnsupportedVersion(v) => v,
        Error::BadUsedId(n) | Error::QueueTooSmall(n) | Error::TooFewQueues(n) => n,
        _ => 0,
    };
    println!(
        "{{\"probe\":{},\"error\":{},\"detail\":{},\"device_status\":{}}}",
        Str(probe),
        Str(error.message()),
        detail,
        device_status
    );
    x86::exit(status::FAILED)
}
