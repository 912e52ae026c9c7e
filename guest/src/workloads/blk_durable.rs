//! `probe.workload=blk-durable`: generation after generation, write a random run of 4 KiB blocks
//! with that generation's pattern (`probe_abi::pattern::generation_seed`), FLUSH, and say so, so
//! a host that kills the VMM at any moment can check that every write acknowledged before a
//! completed FLUSH is in the file.
//!
//! Lines, each printed whole before the probe goes on (so a host that saw a line knows the state
//! it names was reached):
//! - `{"probe":"blk-durable","writing":G,"first":F,"blocks":N}` before generation G's writes;
//! - `{"probe":"blk-durable","durable":G,"first":F,"blocks":N}` once they all completed OK and a
//!   FLUSH after them completed OK.
//!
//! Parameters: `probe.seed=`, `probe.qd=` (default 8), `probe.window=` most blocks per
//! generation (default 64), `probe.gens=` generations, then status OK (default 0: until stopped).
//! A failed write or FLUSH, or a disk without FLUSH, ends the workload FAILED.

use super::blkdev::{self, XorShift};
use super::blocks::{Blocks, Op, BLOCK_BYTES};
use super::pipeline::{self, Limit};
use crate::{bad_parameter, cmdline, println, Env};
use probe_abi::pattern::generation_seed;
use probe_abi::status;

const PROBE: &str = "blk-durable";
const TIMEOUT_MS: u64 = 5000;

pub fn run(env: &Env) -> u8 {
    let common = blkdev::common_params(env, TIMEOUT_MS);
    let number =
        |key, default| cmdline::get_u64(env.cmdline, key, default).unwrap_or_else(|k| bad_parameter(k));
    let qd = number("probe.qd", 8);
    if !(1..=64).contains(&qd) {
        bad_parameter("probe.qd");
    }
    let window = number("probe.window", 64).max(1);
    let generations = number("probe.gens", 0);
    let mut dev = blkdev::open(env, PROBE, &common, BLOCK_BYTES, qd as usize);
    let blocks = dev.disk.capacity_bytes() / BLOCK_BYTES as u64;
    if blocks == 0 || !dev.disk.flush {
        println!(
            "{{\"probe\":\"blk-durable\",\"error\":\"needs a disk of one block or more with FLUSH\",\"flush\":{}}}",
            dev.disk.flush
        );
        return status::FAILED;
    }
    let mut rng = XorShift::new(common.seed);
    let mut generation = 0;
    while generations == 0 || generation < generations {
        generation += 1;
        let first = rng.below(blocks);
        let count = 1 + rng.below(window.min(blocks - first));
        let range = |what| {
            println!(
                "{{\"probe\":\"blk-durable\",\"{}\":{},\"first\":{},\"blocks\":{}}}",
                what, generation, first, count
            )
        };
        range("writing");
        let seed = generation_seed(common.seed, generation);
        let mut writes = Blocks::new(Op::Write, first, seed);
        let mut flush = Blocks::new(Op::Flush, 0, seed);
        for (job, requests) in [(&mut writes, count), (&mut flush, 1)] {
            let run =
                pipeline::run(&mut dev, job, Limit::Requests(requests), None, env.tsc_khz, common.timeout_ms);
            if let Err(error) = run {
                blkdev::fail(PROBE, error, &dev);
            }
            let o = job.outcomes;
            if o.ok != requests {
                println!(
                    "{{\"probe\":\"blk-durable\",\"error\":\"a request failed\",\"generation\":{},\"ok\":{},\"ioerr\":{},\"other\":{}}}",
                    generation, o.ok, o.ioerr, o.other
                );
                return status::FAILED;
            }
        }
        range("durable");
    }
    println!("{{\"probe\":\"blk-durable\",\"generations\":{}}}", generation);
    status::OK
}
