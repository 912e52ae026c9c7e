//! `probe.workload=blk`: block I/O through the virtio-blk driver, timed per request.
//!
//! Parameters: `probe.rw=randread|randwrite|read|write|flush|writeflush|seqwriteflush|verify`
//! (default randread; `writeflush`: random writes, each followed by a FLUSH, counted as two
//! requests; `seqwriteflush`: the same with the writes in order from block 0),
//! `probe.bs=` bytes (a multiple of 512 up to 128K, default 4096; not used by `flush`),
//! `probe.qd=` (1..=256, default 1; at most as many requests as the queue has room for: with
//! VIRTIO_F_INDIRECT_DESC (`probe.indirect=on`, the default, and offered by the device) a
//! request takes one ring descriptor, so a 256-entry queue holds 256; in direct chains it takes
//! a header, a status and `bs / size_max` data descriptors, a FLUSH none, so 85 4K requests or
//! 128 FLUSHes; a deeper queue fails with the deepest that fits as the error's `detail`),
//! `probe.ops=` measured requests (default 10000) or `probe.duration_ms=` (needs
//! `probe.tsc_khz=`), `probe.warmup=` unmeasured requests first (default 1000), then
//! `probe.warmup_ms=` milliseconds of unmeasured requests (default 0; needs `probe.tsc_khz=`:
//! several VMs started together all reach their measured phase after the slowest has booted),
//! `probe.pv_eoi=on|off` (default off), `probe.idle_ms=` (default 0), and those of every block
//! workload (`blkdev::Common`): `probe.completion=poll|interrupt`, `probe.dev=`, `probe.seed=`,
//! `probe.event_idx=on|off`, `probe.indirect=on|off`, `probe.timeout_ms=` (default 5000),
//! `probe.queues=` (1..=4, default 1: requests go to that many queues in turn, VIRTIO_BLK_F_MQ).
//! The result line says `"indirect":true|false`: whether requests went in indirect tables, and
//! `"queues"` and `"per_queue"`: the requests each queue completed in the measured phase.
//!
//! Marks for the VMM's exit accounting: 0 and 1 around the measured phase. With
//! `probe.idle_ms=N` (N > 0; needs `probe.tsc_khz=`; not with `verify`), the probe then writes
//! mark 2, spins N ms on the TSC without touching the device, writes mark 3, runs another
//! `probe.ops` requests of the same kind (the post-idle phase: not in the latency histogram
//! nor in `ops`, `notifies`, `interrupts`) and writes mark 4. The result line then has
//! `"idle_ms"`, `"post_idle_ops"`, `"post_idle_errors"` (always present, 0 without idling),
//! `"post_idle_first_ns"` (how long the first request after the idle period took, alone, before
//! the others) and, if a post-idle wait failed, `"post_idle_error"`; any post-idle error makes
//! the status FAILED. The host can thus see what its polling costs while the guest is idle and
//! that the first request after it is served.
//!
//! `probe.writeback=0|1` switches the device's cache to write through (0) or back (1) before
//! any request (VIRTIO_BLK_F_CONFIG_WCE; a device without it fails the run). The result line's
//! `"writeback"` is the mode the device reports (null without CONFIG_WCE).
//!
//! `probe.pv_eoi=on` enables KVM's paravirtual EOI before the device is set up (it matters
//! with `probe.completion=interrupt`); when KVM does not offer it, the probe prints an error
//! line with `"pv_eoi":"unavailable"` and stops with status FAILED (1). The result line says
//! `"pv_eoi":true|false` and `"pv_eois"`: measured-phase interrupts KVM completed itself.
//!
//! `verify` writes a pattern derived from (seed, sector, byte offset) over `probe.ops` blocks
//! (or the whole disk if smaller), flushes if the device can, reads everything back and
//! compares; it also asks for the device ID. With `probe.gate_block=N` (a block past those it
//! checks), it reads block N between the two halves until the host opens the gate by writing
//! `probe_abi::verify_gate::OPEN` there, so the host can act while the verify is surely mid-run
//! (migrate, snapshot); a gate still shut after `probe.timeout_ms` fails the run. With
//! `probe.gate_poll_ms=N` it waits N ms (spinning on the TSC, writing no memory) between two
//! reads of the gate: a guest that is all but idle while the host acts.
//!
//! `zeroes` (needs VIRTIO_BLK_F_WRITE_ZEROES and VIRTIO_BLK_F_DISCARD: FAILED without) writes the
//! pattern over `probe.ops` blocks (or the whole disk if smaller), then WRITE_ZEROES every even
//! block (every second one with the UNMAP flag) and DISCARDs every block 1 mod 4, one range per
//! request, flushes, reads everything back and checks: even blocks zeros, blocks 3 mod 4 the
//! pattern, blocks 1 mod 4 either (a discarded block's contents are unspecified; counted as
//! `discarded_zero`). The result line has `"zeroed"`, `"discarded"`, `"zero_mismatches"`.

use super::blkdev::{self, check_pattern, fill_pattern, Common, XorShift};
use super::latency::Percentiles;
use super::pipeline::{self, Job, Limit, Stats};
use crate::deadline::{Deadline, Spinner};
use crate::histogram::Histogram;
use crate::json::{Nanos, Str};
use crate::pv_eoi::{self, Tally};
use crate::virtio::blk::{
    BlockDevice, Counters, DiskInfo, ID_LEN, MAX_IN_FLIGHT, MAX_REQUEST_BYTES, SECTOR_SIZE, S_OK, T_DISCARD,
    T_FLUSH, T_GET_ID, T_IN, T_OUT, T_WRITE_ZEROES, WRITE_ZEROES_FLAG_UNMAP,
};
use crate::virtio::Error;
use crate::{bad_parameter, cmdline, print, println, x86, Env};
use probe_abi::{status, verify_gate};

const PROBE: &str = "blk";
/// Default bound on any one wait for the device.
const TIMEOUT_MS: u64 = 5000;
/// What a read buffer holds before the device fills it, so a read that writes nothing cannot
/// pass verification with stale data.
const POISON: u8 = 0x5a;

/// Reads or writes of whole blocks, at random or in order.
struct IoJob {
    kind: u32,
    /// Every second request is a FLUSH (`writeflush`).
    flush_after_write: bool,
    random: bool,
    rng: XorShift,
    next_block: u64,
    blocks: u64,
    sectors_per_block: u64,
    bs: u32,
}

impl Job for IoJob {
    fn prepare(&mut self, index: u64, _buffer: &mut [u8]) -> (u32, u64, u32) {
        if self.kind == T_FLUSH || (self.flush_after_write && index % 2 == 1) {
            return (T_FLUSH, 0, 0);
        }
        let block = if self.random {
            self.rng.below(self.blocks)
        } else {
            let block = self.next_block;
            self.next_block = (block + 1) % self.blocks;
            block
        };
        (self.kind, block * self.sectors_per_block, self.bs)
    }

    fn complete(&mut self, _index: u64, _status: u8, _buffer: &[u8]) {}
}

/// Request `index` writes the pattern of block `index`.
struct PatternWrite {
    seed: u64,
    sectors_per_block: u64,
    bs: u32,
}

impl Job for PatternWrite {
    fn prepare(&mut self, index: u64, buffer: &mut [u8]) -> (u32, u64, u32) {
        let sector = index * self.sectors_per_block;
        fill_pattern(self.seed, sector, &mut buffer[..self.bs as usize]);
        (T_OUT, sector, self.bs)
    }

    fn complete(&mut self, _index: u64, _status: u8, _buffer: &[u8]) {}
}

/// A read of `bs` bytes at `sector` into a poisoned buffer, so a read that writes nothing
/// cannot pass a check.
fn poisoned_read(sector: u64, bs: u32, buffer: &mut [u8]) -> (u32, u64, u32) {
    buffer[..bs as usize].fill(POISON);
    (T_IN, sector, bs)
}

/// Reads the gate block (a `Single` read) until the host opens it; false if it stays shut for
/// `timeout_ms`.
fn wait_for_gate(
    dev: &mut BlockDevice,
    gate: &mut Single,
    (tsc_khz, timeout_ms, poll_ms): (u64, u64, u64),
) -> Result<bool, Error> {
    let deadline = Deadline::after_ms(tsc_khz, timeout_ms);
    let open = verify_gate::OPEN.to_le_bytes();
    loop {
        pipeline::run(dev, gate, Limit::Requests(1), None, tsc_khz, timeout_ms)?;
        if gate.status == S_OK && gate.answer[..open.len()] == open {
            return Ok(true);
        }
        if deadline.passed() {
            return Ok(false);
        }
        let mut pause = Spinner::new(Deadline::after_ms(tsc_khz, poll_ms));
        while poll_ms > 0 && pause.spin() {}
    }
}

/// Request `index` reads block `index` back and checks its pattern.
struct PatternCheck {
    seed: u64,
    sectors_per_block: u64,
    bs: u32,
    mismatches: u64,
    first_mismatch: Option<u64>,
}

impl Job for PatternCheck {
    fn prepare(&mut self, index: u64, buffer: &mut [u8]) -> (u32, u64, u32) {
        poisoned_read(index * self.sectors_per_block, self.bs, buffer)
    }

    fn complete(&mut self, index: u64, status: u8, buffer: &[u8]) {
        let sector = index * self.sectors_per_block;
        if status == S_OK && !check_pattern(self.seed, sector, &buffer[..self.bs as usize]) {
            self.mismatches += 1;
            self.first_mismatch.get_or_insert(sector);
        }
    }
}

/// Request `index` is a WRITE_ZEROES of block `2 * index` (UNMAP on every second one) or,
/// for `discard`, a DISCARD of block `4 * index + 1`: one 16-byte range each.
struct RangeJob {
    discard: bool,
    sectors_per_block: u64,
    failed: u64,
}

impl Job for RangeJob {
    fn prepare(&mut self, index: u64, buffer: &mut [u8]) -> (u32, u64, u32) {
        let (kind, block, flags) = if self.discard {
            (T_DISCARD, 4 * index + 1, 0)
        } else {
            let flags = if index % 2 == 1 { WRITE_ZEROES_FLAG_UNMAP } else { 0 };
            (T_WRITE_ZEROES, 2 * index, flags)
        };
        buffer[0..8].copy_from_slice(&(block * self.sectors_per_block).to_le_bytes());
        // Blocks are at most MAX_REQUEST_BYTES (256 sectors).
        buffer[8..12].copy_from_slice(&(self.sectors_per_block as u32).to_le_bytes());
        buffer[12..16].copy_from_slice(&flags.to_le_bytes());
        (kind, 0, 16)
    }

    fn complete(&mut self, _index: u64, status: u8, _buffer: &[u8]) {
        if status != S_OK {
            self.failed += 1;
        }
    }
}

/// Request `index` reads block `index` back after `zeroes`' ranges and checks it.
struct ZeroCheck {
    seed: u64,
    sectors_per_block: u64,
    bs: u32,
    mismatches: u64,
    first_mismatch: Option<u64>,
    discarded_zero: u64,
}

impl Job for ZeroCheck {
    fn prepare(&mut self, index: u64, buffer: &mut [u8]) -> (u32, u64, u32) {
        poisoned_read(index * self.sectors_per_block, self.bs, buffer)
    }

    fn complete(&mut self, index: u64, status: u8, buffer: &[u8]) {
        let sector = index * self.sectors_per_block;
        let data = &buffer[..self.bs as usize];
        let zero = data.iter().all(|&b| b == 0);
        let good = match index % 4 {
            0 | 2 => zero,
            1 => {
                self.discarded_zero += u64::from(zero);
                zero || check_pattern(self.seed, sector, data)
            }
            _ => check_pattern(self.seed, sector, data),
        };
        if status == S_OK && !good {
            self.mismatches += 1;
            self.first_mismatch.get_or_insert(sector);
        }
    }
}

/// One request, for FLUSH, GET_ID and the read of a verify's gate; `answer` keeps the start
/// of what the device wrote (the buffer is zeroed first).
struct Single {
    kind: u32,
    sector: u64,
    len: u32,
    status: u8,
    answer: [u8; ID_LEN as usize],
}

impl Job for Single {
    fn prepare(&mut self, _index: u64, buffer: &mut [u8]) -> (u32, u64, u32) {
        buffer[..self.len as usize].fill(0);
        (self.kind, self.sector, self.len)
    }

    fn complete(&mut self, _index: u64, status: u8, buffer: &[u8]) {
        self.status = status;
        let n = self.answer.len().min(self.len as usize);
        self.answer[..n].copy_from_slice(&buffer[..n]);
    }
}

struct Params {
    rw: &'static str,
    bs: u32,
    qd: usize,
    ops: u64,
    warmup: u64,
    /// Unmeasured time after the warm-up requests; 0: none.
    warmup_ms: u64,
    duration_ms: Option<u64>,
    /// Idle time after the measured phase before the post-idle phase; 0: none.
    idle_ms: u64,
    /// Switch the cache mode first (`probe.writeback`): write back (true) or through.
    writeback: Option<bool>,
    /// The block `verify` waits on between writing and reading back (`probe.gate_block`).
    gate_block: Option<u64>,
    /// Milliseconds between two reads of the gate (`probe.gate_poll_ms`); 0: none.
    gate_poll_ms: u64,
}

/// What the measured phase counted besides the pipeline's statistics.
#[derive(Clone, Copy)]
struct Counts {
    device: Counters,
    /// Interrupts KVM completed by PV EOI.
    pv_eois: u64,
}

/// The requests after the idle period.
#[derive(Default)]
struct PostIdle {
    ops: u64,
    errors: u64,
    /// TSC cycles of the first request (submitted alone).
    first_cycles: Option<u64>,
    error: Option<Error>,
}

fn params(env: &Env) -> Params {
    let number =
        |key, default| cmdline::get_u64(env.cmdline, key, default).unwrap_or_else(|k| bad_parameter(k));
    let rw = cmdline::get(env.cmdline, "probe.rw").unwrap_or("randread");
    if !matches!(
        rw,
        "randread"
            | "randwrite"
            | "read"
            | "write"
            | "flush"
            | "writeflush"
            | "seqwriteflush"
            | "verify"
            | "zeroes"
    ) {
        bad_parameter("probe.rw");
    }
    let bs = number("probe.bs", 4096);
    if bs == 0 || !bs.is_multiple_of(SECTOR_SIZE) || bs > MAX_REQUEST_BYTES as u64 {
        bad_parameter("probe.bs");
    }
    // FLUSH moves no data: no buffer, no data descriptor.
    let bs = if rw == "flush" { 0 } else { bs };
    let qd = number("probe.qd", 1);
    if !(1..=MAX_IN_FLIGHT as u64).contains(&qd) {
        bad_parameter("probe.qd");
    }
    let duration_ms = cmdline::get(env.cmdline, "probe.duration_ms").map(|v| match cmdline::parse_u64(v) {
        Some(ms) if ms > 0 && env.tsc_khz > 0 => ms,
        _ => bad_parameter("probe.duration_ms"),
    });
    let warmup_ms = number("probe.warmup_ms", 0);
    let checks = matches!(rw, "verify" | "zeroes");
    if warmup_ms > 0 && (env.tsc_khz == 0 || checks) {
        bad_parameter("probe.warmup_ms");
    }
    let idle_ms = number("probe.idle_ms", 0);
    if idle_ms > 0 && (env.tsc_khz == 0 || checks) {
        bad_parameter("probe.idle_ms");
    }
    let gate_block = cmdline::get(env.cmdline, "probe.gate_block").map(|v| match cmdline::parse_u64(v) {
        Some(block) if rw == "verify" => block,
        _ => bad_parameter("probe.gate_block"),
    });
    Params {
        rw,
        bs: bs as u32,
        qd: qd as usize,
        ops: number("probe.ops", 10_000),
        warmup: number("probe.warmup", 1000),
        warmup_ms,
        duration_ms,
        idle_ms,
        writeback: cmdline::get(env.cmdline, "probe.writeback").map(|v| match v {
            "0" => false,
            "1" => true,
            _ => bad_parameter("probe.writeback"),
        }),
        gate_block,
        gate_poll_ms: number("probe.gate_poll_ms", 0),
    }
}

pub fn run(env: &Env) -> u8 {
    let common = blkdev::common_params(env, TIMEOUT_MS);
    let p = params(env);
    pv_eoi::from_cmdline(env, PROBE);
    let mut dev = blkdev::open(env, PROBE, &common, p.bs, p.qd);
    if let Some(writeback) = p.writeback {
        if dev.set_writeback(writeback) != Some(u8::from(writeback)) {
            println!(
                "{{\"probe\":\"blk\",\"error\":\"the device does not let the driver switch its cache (CONFIG_WCE)\"}}"
            );
            return status::FAILED;
        }
    }
    let sectors_per_block = (p.bs as u64 / SECTOR_SIZE).max(1);
    let blocks = dev.disk.capacity_sectors / sectors_per_block;
    if blocks == 0 {
        println!(
            "{{\"probe\":\"blk\",\"error\":\"the disk is smaller than one block\",\"capacity_bytes\":{}}}",
            dev.disk.capacity_bytes()
        );
        return status::FAILED;
    }
    let fail = |dev: &BlockDevice, error: Error| -> ! { blkdev::fail(PROBE, error, dev) };
    if p.rw == "verify" {
        let checked = blocks.min(p.ops);
        if p.gate_block.is_some_and(|gate| gate < checked || gate >= blocks) {
            bad_parameter("probe.gate_block");
        }
        return verify(env, &common, &p, &mut dev, checked).unwrap_or_else(|e| fail(&dev, e));
    }
    if p.rw == "zeroes" {
        return zeroes(env, &common, &p, &mut dev, blocks.min(p.ops)).unwrap_or_else(|e| fail(&dev, e));
    }

    let mut job = IoJob {
        kind: match p.rw {
            "flush" => T_FLUSH,
            rw if rw.ends_with("read") => T_IN,
            _ => T_OUT,
        },
        flush_after_write: p.rw.ends_with("writeflush"),
        random: p.rw.starts_with("rand") || p.rw == "writeflush",
        rng: XorShift::new(common.seed),
        next_block: 0,
        blocks,
        sectors_per_block,
        bs: p.bs,
    };
    let run = |dev: &mut BlockDevice, job: &mut IoJob, limit, histogram| {
        pipeline::run(dev, job, limit, histogram, env.tsc_khz, common.timeout_ms)
    };
    if p.warmup > 0 {
        run(&mut dev, &mut job, Limit::Requests(p.warmup), None).unwrap_or_else(|e| fail(&dev, e));
    }
    if p.warmup_ms > 0 {
        let until = x86::rdtsc().saturating_add(p.warmup_ms.saturating_mul(env.tsc_khz));
        run(&mut dev, &mut job, Limit::UntilTsc(until), None).unwrap_or_else(|e| fail(&dev, e));
    }
    let mut latencies = Histogram::new();
    dev.counters = Counters::default();
    env.mark(0);
    // After the mark: under QEMU it idles `probe.mark_linger_ms` while the host samples, which
    // must not eat into the measured time.
    let limit = match p.duration_ms {
        Some(ms) => Limit::UntilTsc(x86::rdtsc() + ms * env.tsc_khz),
        None => Limit::Requests(p.ops),
    };
    let tally = Tally::now();
    let result = run(&mut dev, &mut job, limit, Some(&mut latencies));
    let counts = Counts { device: dev.counters, pv_eois: tally.pv_eois_since() };
    env.mark(1);
    let stats = result.unwrap_or_else(|e| fail(&dev, e));

    let mut post = PostIdle::default();
    if p.idle_ms > 0 {
        env.mark(2);
        let idle = Deadline::after_ms(env.tsc_khz, p.idle_ms);
        while !idle.passed() {
            core::hint::spin_loop();
        }
        env.mark(3);
        let mut post_phase = || -> Result<(), Error> {
            if p.ops == 0 {
                return Ok(());
            }
            let first = run(&mut dev, &mut job, Limit::Requests(1), None)?;
            post.ops += first.ops;
            post.errors += first.errors;
            post.first_cycles = Some(first.cycles);
            let rest = run(&mut dev, &mut job, Limit::Requests(p.ops - 1), None)?;
            post.ops += rest.ops;
            post.errors += rest.errors;
            Ok(())
        };
        post.error = post_phase().err();
        env.mark(4);
    }

    print_result(env, &common, &p, &dev.disk, counts, &stats, &latencies);
    print!(",\"idle_ms\":{},\"post_idle_ops\":{},\"post_idle_errors\":{}", p.idle_ms, post.ops, post.errors);
    if let Some(cycles) = post.first_cycles {
        print!(",\"post_idle_first_ns\":{}", Nanos(env.ps_per_op(cycles, 1)));
    }
    if let Some(error) = post.error {
        print!(",\"post_idle_error\":{}", Str(error.message()));
    }
    println!("}}");
    if stats.errors > 0 || post.errors > 0 || post.error.is_some() {
        status::FAILED
    } else {
        status::OK
    }
}

fn verify(env: &Env, common: &Common, p: &Params, dev: &mut BlockDevice, blocks: u64) -> Result<u8, Error> {
    let sectors_per_block = p.bs as u64 / SECTOR_SIZE;
    let mut latencies = Histogram::new();
    let mut write = PatternWrite { seed: common.seed, sectors_per_block, bs: p.bs };
    let mut check =
        PatternCheck { seed: common.seed, sectors_per_block, bs: p.bs, mismatches: 0, first_mismatch: None };
    let mut flush = Single { kind: T_FLUSH, sector: 0, len: 0, status: 0, answer: [0; ID_LEN as usize] };
    let mut get_id =
        Single { kind: T_GET_ID, sector: 0, len: ID_LEN, status: 0, answer: [0; ID_LEN as usize] };
    let (tsc_khz, timeout_ms) = (env.tsc_khz, common.timeout_ms);

    dev.counters = Counters::default();
    env.mark(0);
    let tally = Tally::now();
    let written =
        pipeline::run(dev, &mut write, Limit::Requests(blocks), Some(&mut latencies), tsc_khz, timeout_ms)?;
    let flushed = if dev.disk.flush {
        pipeline::run(dev, &mut flush, Limit::Requests(1), None, tsc_khz, timeout_ms)?;
        true
    } else {
        false
    };
    if let Some(block) = p.gate_block {
        let sector = block * sectors_per_block;
        let mut gate = Single { kind: T_IN, sector, len: p.bs, status: 0, answer: [0; ID_LEN as usize] };
        if !wait_for_gate(dev, &mut gate, (tsc_khz, timeout_ms, p.gate_poll_ms))? {
            println!(
                "{{\"probe\":\"blk\",\"error\":\"the gate block stayed shut for probe.timeout_ms\",\"gate_block\":{}}}",
                block
            );
            return Ok(status::FAILED);
        }
    }
    let read =
        pipeline::run(dev, &mut check, Limit::Requests(blocks), Some(&mut latencies), tsc_khz, timeout_ms)?;
    let counts = Counts { device: dev.counters, pv_eois: tally.pv_eois_since() };
    env.mark(1);
    pipeline::run(dev, &mut get_id, Limit::Requests(1), None, tsc_khz, timeout_ms)?;

    let flush_errors = u64::from(flushed && flush.status != S_OK);
    let stats = Stats {
        ops: written.ops + read.ops,
        errors: written.errors + read.errors + flush_errors,
        cycles: written.cycles + read.cycles,
    };
    print_result(env, common, p, &dev.disk, counts, &stats, &latencies);
    print!(",\"blocks\":{},\"mismatches\":{},\"flush\":{}", blocks, check.mismatches, flushed);
    if let Some(sector) = check.first_mismatch {
        print!(",\"first_mismatch_sector\":{}", sector);
    }
    let mut id = [0u8; ID_LEN as usize];
    if get_id.status == S_OK {
        let printable =
            get_id.answer.iter().take_while(|&&b| b != 0).filter(|b| b.is_ascii_graphic() || **b == b' ');
        let mut len = 0;
        for &b in printable {
            id[len] = b;
            len += 1;
        }
        print!(",\"id\":{}", Str(core::str::from_utf8(&id[..len]).unwrap_or("")));
    } else {
        print!(",\"id\":null,\"id_status\":{}", get_id.status);
    }
    println!("}}");
    Ok(if stats.errors > 0 || check.mismatches > 0 { status::FAILED } else { status::OK })
}

fn zeroes(env: &Env, common: &Common, p: &Params, dev: &mut BlockDevice, blocks: u64) -> Result<u8, Error> {
    let sectors_per_block = p.bs as u64 / SECTOR_SIZE;
    let disk = dev.disk;
    let fits = |max: u32| max > 0 && u64::from(max) >= sectors_per_block;
    if !fits(disk.max_write_zeroes_sectors) || !fits(disk.max_discard_sectors) {
        println!(
            "{{\"probe\":\"blk\",\"error\":\"the device does not offer WRITE_ZEROES and DISCARD of a block\",\"max_write_zeroes_sectors\":{},\"max_discard_sectors\":{}}}",
            disk.max_write_zeroes_sectors, disk.max_discard_sectors
        );
        return Ok(status::FAILED);
    }
    let mut latencies = Histogram::new();
    let mut write = PatternWrite { seed: common.seed, sectors_per_block, bs: p.bs };
    let mut zero = RangeJob { discard: false, sectors_per_block, failed: 0 };
    let mut discard = RangeJob { discard: true, sectors_per_block, failed: 0 };
    let mut flush = Single { kind: T_FLUSH, sector: 0, len: 0, status: 0, answer: [0; ID_LEN as usize] };
    let mut check = ZeroCheck {
        seed: common.seed,
        sectors_per_block,
        bs: p.bs,
        mismatches: 0,
        first_mismatch: None,
        discarded_zero: 0,
    };
    let (tsc_khz, timeout_ms) = (env.tsc_khz, common.timeout_ms);

    dev.counters = Counters::default();
    env.mark(0);
    let tally = Tally::now();
    let written =
        pipeline::run(dev, &mut write, Limit::Requests(blocks), Some(&mut latencies), tsc_khz, timeout_ms)?;
    let zeroed =
        pipeline::run(dev, &mut zero, Limit::Requests(blocks.div_ceil(2)), None, tsc_khz, timeout_ms)?;
    let discarded = pipeline::run(
        dev,
        &mut discard,
        Limit::Requests(blocks.saturating_sub(1).div_ceil(4)),
        None,
        tsc_khz,
        timeout_ms,
    )?;
    if disk.flush {
        pipeline::run(dev, &mut flush, Limit::Requests(1), None, tsc_khz, timeout_ms)?;
    }
    let read =
        pipeline::run(dev, &mut check, Limit::Requests(blocks), Some(&mut latencies), tsc_khz, timeout_ms)?;
    let counts = Counts { device: dev.counters, pv_eois: tally.pv_eois_since() };
    env.mark(1);

    let flush_errors = u64::from(disk.flush && flush.status != S_OK);
    let range_errors = zero.failed + discard.failed;
    let stats = Stats {
        ops: written.ops + zeroed.ops + discarded.ops + read.ops,
        errors: written.errors + zeroed.errors + discarded.errors + read.errors + flush_errors + range_errors,
        cycles: written.cycles + zeroed.cycles + discarded.cycles + read.cycles,
    };
    print_result(env, common, p, &dev.disk, counts, &stats, &latencies);
    print!(
        ",\"blocks\":{},\"zeroed\":{},\"discarded\":{},\"discarded_zero\":{},\"zero_mismatches\":{}",
        blocks, zeroed.ops, discarded.ops, check.discarded_zero, check.mismatches
    );
    if let Some(sector) = check.first_mismatch {
        print!(",\"first_mismatch_sector\":{}", sector);
    }
    println!("}}");
    Ok(if stats.errors > 0 || check.mismatches > 0 { status::FAILED } else { status::OK })
}

/// The result line up to (not including) its closing brace.
fn print_result(
    env: &Env,
    common: &Common,
    p: &Params,
    disk: &DiskInfo,
    counts: Counts,
    stats: &Stats,
    latencies: &Histogram,
) {
    print!(
        "{{\"probe\":\"blk\",\"rw\":{},\"bs\":{},\"qd\":{},\"completion\":{},\"ops\":{},\"errors\":{},\"cycles\":{},\"iops\":{}",
        Str(p.rw),
        p.bs,
        p.qd,
        Str(common.completion.name()),
        stats.ops,
        stats.errors,
        stats.cycles,
        env.ops_per_second(stats.ops, stats.cycles)
    );
    let percentiles = Percentiles::of(latencies);
    percentiles.print_ns(env);
    percentiles.print_cycles();
    print!(
        ",\"capacity_bytes\":{},\"blk_size\":{},\"read_only\":{},\"event_idx\":{},\"indirect\":{},\"notifies\":{},\"interrupts\":{}",
        disk.capacity_bytes(),
        disk.blk_size,
        disk.read_only,
        disk.event_idx,
        disk.indirect,
        counts.device.notifies,
        counts.device.interrupts
    );
    print!(",\"pv_eoi\":{},\"pv_eois\":{}", pv_eoi::enabled(), counts.pv_eois);
    print!(",\"queues\":{},\"per_queue\":[", common.queues);
    for (index, completed) in counts.device.per_queue.iter().take(common.queues).enumerate() {
        print!("{}{}", if index == 0 { "" } else { "," }, completed);
    }
    print!("]");
    match disk.writeback {
        Some(mode) => print!(",\"writeback\":{}", mode),
        None => print!(",\"writeback\":null"),
    }
}
