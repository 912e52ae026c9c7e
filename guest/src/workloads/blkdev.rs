//! What the block workloads share: their common parameters, opening the device, the PRNG and
//! the verification pattern.

use super::device::{self, Kind};
use crate::deadline::Deadline;
use crate::virtio::blk::{BlockDevice, Completion, Options, DEVICE_ID, MAX_QUEUES};
use crate::virtio::Error;
use crate::{bad_parameter, cmdline, Env};

/// Parameters every block workload takes.
pub struct Common {
    pub completion: Completion,
    /// Accept EVENT_IDX when offered (`probe.event_idx=on|off`, default on).
    pub event_idx: bool,
    /// Put each request in an indirect descriptor table when the device offers
    /// VIRTIO_F_INDIRECT_DESC (`probe.indirect=on|off`, default on), so the queue holds as many
    /// requests as it has entries; off: direct chains, several ring descriptors per request.
    pub indirect: bool,
    /// How long any one wait on the device may take (`probe.timeout_ms=`).
    pub timeout_ms: u64,
    /// Which virtio-blk device, counting in command-line order (`probe.dev=`, default 0).
    pub dev: u64,
    pub seed: u64,
    /// At most this many descriptors in the request queue (`probe.queue_size=`, 1..=256; by
    /// default as many as the device allows).
    pub queue_size: Option<u16>,
    /// Request queues to spread the requests over, in turn (`probe.queues=`, 1..=MAX_QUEUES, default
    /// 1; above 1 the device must offer VIRTIO_BLK_F_MQ and as many).
    pub queues: usize,
}

/// `default_timeout_ms` is the workload's default for `probe.timeout_ms=`.
pub fn common_params(env: &Env, default_timeout_ms: u64) -> Common {
    let completion = match cmdline::get(env.cmdline, "probe.completion").unwrap_or("poll") {
        "poll" => Completion::Poll,
        "interrupt" => Completion::Interrupt,
        _ => bad_parameter("probe.completion"),
    };
    let switch = |key| match cmdline::get(env.cmdline, key).unwrap_or("on") {
        "on" | "1" => true,
        "off" | "0" => false,
        _ => bad_parameter(key),
    };
    let number =
        |key, default| cmdline::get_u64(env.cmdline, key, default).unwrap_or_else(|k| bad_parameter(k));
    Common {
        completion,
        event_idx: switch("probe.event_idx"),
        indirect: switch("probe.indirect"),
        timeout_ms: number("probe.timeout_ms", default_timeout_ms),
        dev: number("probe.dev", 0),
        seed: number("probe.seed", 1),
        queue_size: match cmdline::get(env.cmdline, "probe.queue_size") {
            None => None,
            Some(v) => match cmdline::parse_u64(v) {
                Some(n @ 1..=256) => Some(n as u16),
                _ => bad_parameter("probe.queue_size"),
            },
        },
        queues: match usize::try_from(number("probe.queues", 1)) {
            Ok(n @ 1..=MAX_QUEUES) => n,
            _ => bad_parameter("probe.queues"),
        },
    }
}

impl Common {
    pub fn deadline(&self, env: &Env) -> Deadline {
        Deadline::after_ms(env.tsc_khz, self.timeout_ms)
    }
}

/// Open the `common.dev`-th virtio-blk device on the command line, or report why not and stop.
pub fn open(
    env: &Env,
    probe: &str,
    common: &Common,
    max_request_bytes: u32,
    queue_depth: usize,
) -> BlockDevice {
    let kind = Kind { device_id: DEVICE_ID, name: "virtio-blk", count_field: "block_devices" };
    let transport = device::find(env, probe, &kind, common.dev);
    let options = Options {
        completion: common.completion,
        event_idx: common.event_idx,
        indirect: common.indirect,
        max_request_bytes,
        queue_depth,
        queue_size: common.queue_size,
        queues: common.queues,
    };
    BlockDevice::open(transport, options, common.deadline(env))
        .unwrap_or_else(|error| device::fail(probe, error, &transport))
}

/// Report a driver error and stop with FAILED.
pub fn fail(probe: &str, error: Error, dev: &BlockDevice) -> ! {
    device::fail(probe, error, dev.transport())
}

/// xorshift64*: small, fast, good enough to spread offsets.
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> XorShift {
        XorShift(splitmix64(seed) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

use probe_abi::pattern::splitmix64;

/// Fill `buffer` (whole sectors) with the pattern of the sectors starting at `first_sector`
/// (`probe_abi::pattern`, which the host's tests check disks with).
pub fn fill_pattern(seed: u64, first_sector: u64, buffer: &mut [u8]) {
    probe_abi::pattern::fill(seed, first_sector, buffer)
}

/// Does `buffer` hold the pattern of the sectors starting at `first_sector`?
pub fn check_pattern(seed: u64, first_sector: u64, buffer: &[u8]) -> bool {
    probe_abi::pattern::check(seed, first_sector, buffer)
}
