//! The snapshot reader: a snapshot's `state.json` as a restore reads it. `Snapshot::parse`
//! (format, version, the configuration's checks, the vCPU and device counts against it, every
//! KVM structure's exact length), the configuration made into a VM's, and each saved virtio-mmio
//! transport restored into a new transport with a block device of the saved disk's queue count
//! over guest RAM (`MmioTransport::restore`: device type, queue count and sizes, features,
//! configuration space against the device's, rings against guest memory, workers started at
//! the saved avail index), then resumed and notified.
//!
//! An input that starts with `{` is a state file as it is (the seeds are real ones, from
//! `exitless run` and the API's `vm.snapshot`; one has a NIC on a tap, whose configuration is
//! parsed and checked, its transport not restored here). Any other input builds a state that restores
//! here (the seed's vCPU and irqchip state, a disk and a transport state fitting the harness's
//! guest RAM and RAM disk) and bends it: fields set to values from the input, then bytes of the
//! JSON text replaced, inserted or removed.
//!
//! Checks besides "no panic": a state that parses makes a VM configuration and writes back as
//! text that parses to the same text; a transport restored from a saved state saves the same
//! registers, queues and features back; a state built here and not bent parses and restores.
#![no_main]

use std::path::Path;
use std::sync::Arc;

use arbitrary::{Result, Unstructured};
use exitless_fuzz::{guest_memory, ram_disk, MAX_STEPS};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use virtio::block::Block;
use virtio::device::VirtioDevice;
use virtio::mmio::state::{hex, QueueState, TransportState, CONFIG_SAVED};
use virtio::mmio::{status, MmioTransport, Runner, QUEUE_NOTIFY};
use virtio::DeviceStats;
use vmm::snapshot::Snapshot;

/// A real state file (`exitless run --probe`, one vCPU, a file disk of two queues): its vCPU and
/// irqchip state are what the built states carry.
const SEED: &[u8] = include_bytes!("../corpus/snapshot_state/seed-probe-1vcpu-file-disk-2-queues.json");

fuzz_target!(|data: &[u8]| {
    if data.first() == Some(&b'{') {
        check(data, None);
    } else {
        let _ = bent(&mut Unstructured::new(data));
    }
});

/// The harness's block device with `queues` queues on RAM disks.
fn block(queues: u16) -> Option<Block> {
    let backends =
        (0..queues.max(1)).map(|_| Box::new(ram_disk(false)) as Box<dyn storage::Backend>).collect();
    Block::with_queues(backends, "exitless-fuzz-snapshot")
}

/// Build a state that restores into the harness, bend it as the input says, and check it.
fn bent(u: &mut Unstructured) -> Result<()> {
    let mut state: Value = serde_json::from_slice(SEED).expect("the seed state is JSON");
    let disks = u.int_in_range(0..=2)?;
    let mut saved_disks = Vec::new();
    let mut devices = Vec::new();
    for index in 0..disks {
        let queues: u16 = u.int_in_range(1..=2)?;
        let Some(device) = block(queues) else { return Ok(()) };
        let features = device.features() & (u.arbitrary::<u64>()? | 1 << 32);
        let mut config = [0u8; CONFIG_SAVED];
        device.read_config(0, &mut config);
        let running = u.ratio(3, 4)?;
        let saved_queues: Vec<QueueState> = (0..u64::from(queues))
            .map(|q| {
                // The harness's ring areas: descriptors, then avail 4 KiB on, used 8 KiB on.
                let base = 0x3000 * q;
                Ok(QueueState {
                    size: 1 << u.int_in_range(0..=8)?,
                    ready: running,
                    desc: base,
                    avail: base + 0x1000,
                    used: base + 0x2000,
                    next_avail: 0,
                })
            })
            .collect::<Result<_>>()?;
        let transport = TransportState {
            device_id: device.device_id(),
            status: if running {
                status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK
            } else {
                0
            },
            needs_reset: false,
            device_features_sel: 0,
            driver_features_sel: 0,
            driver_features: features,
            queue_sel: 0,
            interrupt_status: 0,
            queues: saved_queues,
            config: hex(&config),
        };
        saved_disks.push(json!({
            "kind": "null", "path": "", "size": exitless_fuzz::DISK_SIZE, "read_only": false,
            "direct": false, "serial": null, "queues": queues,
        }));
        devices.push(json!({"kind": "virtio-blk", "index": index, "transport": transport}));
    }
    state["config"]["disks"] = Value::Array(saved_disks);
    state["devices"] = Value::Array(devices);
    // Fields set to values from the input.
    let mut fields_bent = false;
    for _ in 0..u.int_in_range(0..=3)? {
        fields_bent = true;
        let value = match u.int_in_range(0..=4)? {
            0 => json!(u.arbitrary::<u64>()?),
            1 => json!(u.arbitrary::<i64>()?),
            2 => json!(u.arbitrary::<String>()?),
            3 => json!(u.arbitrary::<bool>()?),
            _ => Value::Null,
        };
        let paths: [&[&str]; 12] = [
            &["version"],
            &["memory_bytes"],
            &["tsc_khz"],
            &["config", "vcpus"],
            &["config", "mem_bytes"],
            &["config", "io_mode"],
            &["config", "cmdline"],
            &["config", "idle_budget_us"],
            &["vm", "clock"],
            &["vcpus", "0", "index"],
            &["vcpus", "0", "msrs"],
            &["devices", "0", "transport"],
        ];
        let path = u.choose(&paths)?;
        if let Some(slot) = path.iter().try_fold(&mut state, |v, key| match key.parse::<usize>() {
            Ok(i) => v.get_mut(i),
            Err(_) => v.get_mut(*key),
        }) {
            *slot = value;
        }
    }
    let mut text = serde_json::to_vec(&state).expect("a JSON value writes");
    // Bytes of the text replaced, inserted or removed.
    let mut text_bent = false;
    for _ in 0..MAX_STEPS {
        if u.is_empty() {
            break;
        }
        text_bent = true;
        let at = u.int_in_range(0..=text.len())?;
        match u.int_in_range(0..=2)? {
            0 if at < text.len() => text[at] = u.arbitrary()?,
            1 => {
                let len = u.int_in_range(0..=16)?;
                let bytes = u.bytes(len.min(u.len()))?;
                text.splice(at..at, bytes.iter().copied());
            }
            _ => {
                let end = at.saturating_add(u.int_in_range(0..=64)?).min(text.len());
                text.drain(at..end);
            }
        }
    }
    let restorable = !fields_bent && !text_bent;
    check(&text, restorable.then_some(()));
    Ok(())
}

/// Parse `text` as a restore does and restore its transports into the harness; `must_restore`:
/// the state was built to restore, so every step must succeed.
fn check(text: &[u8], must_restore: Option<()>) {
    let parsed = Snapshot::parse(text, Path::new("state.json"));
    let snapshot = match parsed {
        Ok(snapshot) => snapshot,
        Err(e) => {
            assert!(must_restore.is_none(), "a state built to restore was refused: {e}");
            return;
        }
    };
    // A state that parses makes a VM configuration, and writes back as itself.
    let config = snapshot.config.to_vm_config(snapshot.config.base_naming_saved_devices());
    assert!(config.is_ok(), "a parsed state's configuration is refused: {:?}", config.err());
    let written = serde_json::to_vec(&snapshot).expect("a parsed state writes");
    let again = Snapshot::parse(&written, Path::new("state.json")).expect("a written state parses");
    assert_eq!(serde_json::to_vec(&again).expect("writes"), written, "a state reads back differently");

    let mem = guest_memory();
    for (saved, disk) in snapshot.devices.iter().zip(&snapshot.config.disks) {
        let Some(device) = block(disk.queues) else { continue };
        let stats = Arc::new(DeviceStats::new("virtio-blk fuzz"));
        let mut transport = MmioTransport::new(Box::new(device), mem.clone(), Runner::OnNotify, None, stats);
        match transport.restore(&saved.transport) {
            Ok(()) => same_state(&transport, &saved.transport),
            Err(e) => {
                assert!(must_restore.is_none(), "a transport state built to restore was refused: {e}");
                continue;
            }
        }
        transport.resume();
        for queue in 0..saved.transport.queues.len() as u32 {
            transport.write(QUEUE_NOTIFY, &queue.to_le_bytes());
        }
        let _ = transport.pause();
    }
}

/// A transport restored from `saved` saves the same registers, features and queues back (the
/// avail index it saves is where the used ring in guest memory stands: not compared).
fn same_state(transport: &MmioTransport, saved: &TransportState) {
    let back = transport.save().expect("a restored transport is paused and saves");
    assert_eq!(back.device_id, saved.device_id);
    assert_eq!(back.status, saved.status & !status::NEEDS_RESET, "status");
    assert_eq!(back.needs_reset, saved.needs_reset, "DEVICE_NEEDS_RESET");
    assert_eq!(back.driver_features, saved.driver_features, "driver features");
    assert_eq!(
        (back.device_features_sel, back.driver_features_sel, back.queue_sel, back.interrupt_status),
        (saved.device_features_sel, saved.driver_features_sel, saved.queue_sel, saved.interrupt_status),
        "selectors and interrupt status"
    );
    assert_eq!(back.config.to_lowercase(), saved.config.to_lowercase(), "configuration space");
    let shape = |q: &QueueState| (q.size, q.ready, q.desc, q.avail, q.used);
    assert_eq!(
        back.queues.iter().map(shape).collect::<Vec<_>>(),
        saved.queues.iter().map(shape).collect::<Vec<_>>(),
        "queues"
    );
}
