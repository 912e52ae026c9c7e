//! The live-migration stream as the destination reads it (`vmm::migration::wire::parse_stream`,
//! the checks `receive` makes, without building a VM): the hello (magic, length, the
//! configuration's JSON and checks, its memory size against the RAM it lays out), page records
//! (tag, alignment, count, whole pages inside one RAM region, the pages' bytes), and the state
//! record (a snapshot's state, checked as a restore checks it, and against the hello).
//!
//! An input that starts with the stream's magic is a stream as it is (the seeds are streams
//! written from a real state). Any other input builds a stream the destination takes (the
//! seed's configuration and state, page records inside guest memory) and bends it: records at
//! addresses and counts from the input, lengths that lie, unknown tags, bytes of the hello's or
//! the state's JSON replaced, the stream cut short.
//!
//! Checks besides "no panic": a stream built here and not bent is taken, with the records,
//! pages, vCPU and device states it holds.
#![no_main]

use arbitrary::{Result, Unstructured};
use exitless_fuzz::MAX_STEPS;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use vmm::migration::wire::{self, parse_stream, MAGIC, PAGE, TAG_PAGES, TAG_STATE};

/// A real state (`exitless run --probe`, one vCPU, 64 MiB, a file disk of two queues).
const SEED: &[u8] = include_bytes!("../corpus/snapshot_state/seed-probe-1vcpu-file-disk-2-queues.json");

fuzz_target!(|data: &[u8]| {
    if data.starts_with(&MAGIC) {
        let _ = parse_stream(&mut &data[..]);
    } else {
        let _ = bent(&mut Unstructured::new(data));
    }
});

/// `bytes` with some replaced, inserted or removed, as the input says; `true` if it changed.
fn bend(u: &mut Unstructured, bytes: &mut Vec<u8>) -> Result<bool> {
    let mut changed = false;
    for _ in 0..u.int_in_range(0..=3)? {
        changed = true;
        let at = u.int_in_range(0..=bytes.len())?;
        match u.int_in_range(0..=2)? {
            0 if at < bytes.len() => bytes[at] = u.arbitrary()?,
            1 => {
                let len = u.int_in_range(0..=8)?;
                let insert = u.bytes(len.min(u.len()))?;
                bytes.splice(at..at, insert.iter().copied());
            }
            _ => {
                let end = at.saturating_add(u.int_in_range(0..=32)?).min(bytes.len());
                bytes.drain(at..end);
            }
        }
    }
    Ok(changed)
}

fn bent(u: &mut Unstructured) -> Result<()> {
    let state: Value = serde_json::from_slice(SEED).expect("the seed state is JSON");
    let memory_bytes = state["memory_bytes"].as_u64().expect("the seed's memory size");
    let hello = serde_json::json!({"config": state["config"], "memory_bytes": memory_bytes});
    let mut stream = MAGIC.to_vec();
    let mut hello_json = serde_json::to_vec(&hello).expect("writes");
    let mut well_formed = !bend(u, &mut hello_json)?;
    let lie = |u: &mut Unstructured, len: usize| -> Result<(u32, bool)> {
        Ok(if u.ratio(1, 16)? { (u.arbitrary()?, true) } else { (len as u32, false) })
    };
    let (len, lied) = lie(u, hello_json.len())?;
    well_formed &= !lied;
    stream.extend_from_slice(&len.to_le_bytes());
    stream.extend_from_slice(&hello_json);
    let (mut records, mut pages_sent) = (0u64, 0u64);
    let guest_pages = memory_bytes / PAGE;
    for _ in 0..u.int_in_range(0..=MAX_STEPS / 8)? {
        let pages: u32 = if u.ratio(1, 8)? { u.arbitrary()? } else { u.int_in_range(1..=4)? };
        let gpa: u64 = match u.int_in_range(0..=7)? {
            0 => u.arbitrary()?,
            1 => memory_bytes - PAGE * u64::from(u.int_in_range(0..=4u32)?),
            _ => PAGE * u.int_in_range(0..=guest_pages - 1)?,
        };
        let inside = gpa % PAGE == 0
            && (1..=wire::MAX_RECORD_PAGES).contains(&pages)
            && gpa.checked_add(u64::from(pages) * PAGE).is_some_and(|end| end <= memory_bytes);
        well_formed &= inside;
        let tag = if u.ratio(1, 32)? { u.arbitrary()? } else { TAG_PAGES };
        well_formed &= tag == TAG_PAGES;
        stream.push(tag);
        stream.extend_from_slice(&gpa.to_le_bytes());
        stream.extend_from_slice(&pages.to_le_bytes());
        if inside {
            // The pages' bytes: zeros (they are only read), a few cut short now and then.
            let len = u64::from(pages) * PAGE;
            let short = if u.ratio(1, 32)? { u.int_in_range(1..=len)? } else { 0 };
            well_formed &= short == 0;
            stream.resize(stream.len() + (len - short) as usize, 0);
            records += 1;
            pages_sent += u64::from(pages);
        }
        if !well_formed {
            break;
        }
    }
    let mut state_json = SEED.to_vec();
    well_formed &= !bend(u, &mut state_json)?;
    stream.push(TAG_STATE);
    let (len, lied) = lie(u, state_json.len())?;
    well_formed &= !lied;
    stream.extend_from_slice(&len.to_le_bytes());
    stream.extend_from_slice(&state_json);
    if u.ratio(1, 16)? {
        let keep = u.int_in_range(0..=stream.len())?;
        well_formed &= keep == stream.len();
        stream.truncate(keep);
    }
    match parse_stream(&mut &stream[..]) {
        Ok(parsed) if well_formed => {
            assert_eq!((parsed.records, parsed.pages), (records, pages_sent), "records and pages taken");
            assert_eq!((parsed.vcpus, parsed.devices), (1, 1), "the seed's vCPU and device");
        }
        Ok(_) => {}
        Err(e) => assert!(!well_formed, "a well-formed stream was refused: {e}"),
    }
    Ok(())
}
