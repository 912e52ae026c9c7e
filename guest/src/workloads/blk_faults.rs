//! `probe.workload=blk-faults`: rounds of I/O on a disk whose backing file the host breaks and
//! mends while the guest runs, steered by the host through a second, control disk.
//!
//! Between rounds the probe reads sector 0 of the control disk (`probe.control_dev=`, default 1;
//! the disk under test is `probe.dev=`, default 0): `probe_abi::fault_control` words. Each round
//! writes the pattern (`probe.seed=`) over the step's write range, then reads back and checks its
//! read range, `probe.qd=` requests at a time (default 4), in 4 KiB blocks. A new step number
//! starts a new step once the current one has run `probe.min_rounds=` rounds (default 3), so
//! every step the host asks for gets at least that many (a plan counts once two reads in a row
//! agree). Lines:
//! - `{"probe":"blk-faults","capacity_bytes":..,"control_capacity_bytes":..}` once both devices
//!   are set up;
//! - `{"probe":"blk-faults","ready":S}` once step S has run its minimum rounds (the host may
//!   then change the backing file or ask for the next step);
//! - `{"probe":"blk-faults","step":S,"rounds":..,"writes":{"ok":..,"ioerr":..,"other":..},
//!   "reads":{..,"mismatches":..},"control":{..}}` when step S ends: what the guest saw.
//!
//! Step `STOP` ends the workload with status OK: I/O errors are the expected outcome here, and
//! the host judges the counts. A driver error (a timeout, DEVICE_NEEDS_RESET) ends it FAILED.
//! The two devices share the driver's static request buffers, so they are used in turn, never
//! both at once.

use super::blkdev::{self, Common};
use super::blocks::{Blocks, Op, Outcomes, BLOCK_BYTES};
use super::pipeline::{self, Job, Limit};
use crate::virtio::blk::{BlockDevice, SECTOR_SIZE, S_OK, T_IN};
use crate::virtio::Error;
use crate::{bad_parameter, cmdline, print, println, Env};
use probe_abi::fault_control as control;
use probe_abi::status;

const PROBE: &str = "blk-faults";
const TIMEOUT_MS: u64 = 5000;

/// What the control disk asks for.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Plan {
    step: u64,
    write: (u64, u64),
    read: (u64, u64),
}

/// Reads the control sector.
struct ControlRead {
    words: [u64; control::WORDS],
    status: u8,
}

impl Job for ControlRead {
    fn prepare(&mut self, _index: u64, buffer: &mut [u8]) -> (u32, u64, u32) {
        buffer[..SECTOR_SIZE as usize].fill(0);
        (T_IN, 0, SECTOR_SIZE as u32)
    }

    fn complete(&mut self, _index: u64, status: u8, buffer: &[u8]) {
        self.status = status;
        for (word, bytes) in self.words.iter_mut().zip(buffer.chunks_exact(8)) {
            *word = u64::from_le_bytes(bytes.try_into().unwrap_or([0; 8]));
        }
    }
}

/// One step's plan and what the guest saw during it.
struct Step {
    plan: Plan,
    rounds: u64,
    writes: Outcomes,
    reads: Outcomes,
    control: Outcomes,
}

impl Step {
    fn new(plan: Plan) -> Step {
        Step {
            plan,
            rounds: 0,
            writes: Outcomes::default(),
            reads: Outcomes::default(),
            control: Outcomes::default(),
        }
    }

    fn print(&self) {
        print!("{{\"probe\":\"blk-faults\",\"step\":{},\"rounds\":{}", self.plan.step, self.rounds);
        for (name, o) in [("writes", &self.writes), ("reads", &self.reads), ("control", &self.control)] {
            print!(",\"{}\":{{\"ok\":{},\"ioerr\":{},\"other\":{}", name, o.ok, o.ioerr, o.other);
            print!(",\"mismatches\":{}}}", o.mismatches);
        }
        println!("}}");
    }
}

pub fn run(env: &Env) -> u8 {
    let common = blkdev::common_params(env, TIMEOUT_MS);
    let number =
        |key, default| cmdline::get_u64(env.cmdline, key, default).unwrap_or_else(|k| bad_parameter(k));
    let qd = number("probe.qd", 4);
    if !(1..=64).contains(&qd) {
        bad_parameter("probe.qd");
    }
    let min_rounds = number("probe.min_rounds", 3).max(1);
    let control_common = Common { dev: number("probe.control_dev", 1), ..common };
    let mut disk = blkdev::open(env, PROBE, &common, BLOCK_BYTES, qd as usize);
    let mut control_disk = blkdev::open(env, PROBE, &control_common, SECTOR_SIZE as u32, 1);
    println!(
        "{{\"probe\":\"blk-faults\",\"capacity_bytes\":{},\"control_capacity_bytes\":{}}}",
        disk.disk.capacity_bytes(),
        control_disk.disk.capacity_bytes()
    );
    let timeout_ms = common.timeout_ms;
    let fail = |dev: &BlockDevice, error: Error| -> ! { blkdev::fail(PROBE, error, dev) };

    let mut step: Option<Step> = None;
    let mut previous: Option<Plan> = None;
    loop {
        let mut read = ControlRead { words: [0; control::WORDS], status: 0 };
        pipeline::run(&mut control_disk, &mut read, Limit::Requests(1), None, env.tsc_khz, timeout_ms)
            .unwrap_or_else(|e| fail(&control_disk, e));
        let plan = (read.status == S_OK && read.words[0] == control::MAGIC).then(|| Plan {
            step: read.words[control::STEP],
            write: (read.words[control::WRITE_FIRST], read.words[control::WRITE_BLOCKS]),
            read: (read.words[control::READ_FIRST], read.words[control::READ_BLOCKS]),
        });
        if let Some(current) = step.as_mut() {
            current.control.count(read.status);
        }
        // The host rewrites the sector while the device may be copying it: a plan counts once
        // two reads in a row agree, so a torn read never starts a step.
        let stable = plan.filter(|_| plan == previous);
        previous = plan;
        if let Some(plan) = stable {
            let finished = step.as_ref().is_none_or(|s| s.rounds >= min_rounds);
            if finished && step.as_ref().is_none_or(|s| s.plan.step != plan.step) {
                if let Some(done) = step.take() {
                    done.print();
                }
                if plan.step == control::STOP {
                    return status::OK;
                }
                step = Some(Step::new(plan));
            }
        }
        let Some(current) = step.as_mut() else { continue };
        let (tsc_khz, seed) = (env.tsc_khz, common.seed);
        for (op, (first, blocks)) in [(Op::Write, current.plan.write), (Op::Check, current.plan.read)] {
            if blocks == 0 {
                continue;
            }
            let mut job = Blocks::new(op, first, seed);
            pipeline::run(&mut disk, &mut job, Limit::Requests(blocks), None, tsc_khz, timeout_ms)
                .unwrap_or_else(|e| fail(&disk, e));
            let total = if op == Op::Write { &mut current.writes } else { &mut current.reads };
            total.add(&job.outcomes);
        }
        current.rounds += 1;
        if current.rounds == min_rounds {
            println!("{{\"probe\":\"blk-faults\",\"ready\":{}}}", current.plan.step);
        }
    }
}
