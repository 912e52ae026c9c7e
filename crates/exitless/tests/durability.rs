//! Durability under kill -9: a guest writes generation after generation of blocks, each closed
//! by a FLUSH, and says on its console which generations' FLUSH completed; the host kills the
//! process that serves the disk with SIGKILL at a random moment, then checks the backing file
//! sector by sector: every block holds the data of the last generation acknowledged as durable
//! that wrote it, or of a generation the guest had begun writing after that one (those writes
//! may or may not have landed), and nothing else.
//!
//! - The probe's `blk-durable` workload under `exitless run` (which is killed), in the
//!   `exitless`, `eventfd` and `adaptive` modes in turn; the data encodes sector and generation
//!   (`probe_abi::pattern::generation_seed`).
//! - A Linux guest (QEMU TCG, busybox) through `exitless vhost-user-blk` (which is killed):
//!   fio is not in the initramfs, so the guest writes with a busybox `dd conv=fsync` loop (fsync
//!   of the block device: the writes, then a FLUSH); each sector holds its generation and block
//!   as text.
//!
//! `EXITLESS_DURABILITY_ROUNDS` rounds of each (default 3; scripts/durability.sh runs 50); each
//! prints a `durability ...` summary line.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use test_infra::console::Console;
use test_infra::daemon::Daemon;
use test_infra::qemu::Qemu;

const BLOCK: usize = 4096;
const SECTOR: usize = 512;
const DISK_BYTES: u64 = 4 << 20;
const WAIT: Duration = Duration::from_secs(120);

fn rounds() -> u64 {
    std::env::var("EXITLESS_DURABILITY_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(3)
}

/// A run of blocks a generation wrote.
#[derive(Clone, Copy, Debug)]
struct Generation {
    number: u64,
    first: u64,
    blocks: u64,
}

impl Generation {
    fn covers(&self, block: u64) -> bool {
        (self.first..self.first + self.blocks).contains(&block)
    }
}

/// What the guest said before it was cut off: generations begun, and generations whose FLUSH
/// completed, in order.
#[derive(Default, Debug)]
struct Said {
    writing: Vec<Generation>,
    durable: Vec<Generation>,
}

/// Totals over the rounds.
#[derive(Default)]
struct Tally {
    rounds: u64,
    /// Block writes acknowledged by a completed FLUSH.
    acknowledged: u64,
    /// Blocks whose last acknowledged generation was checked.
    checked: u64,
    lost: u64,
}

impl Tally {
    /// Check the disk file `disk` after a round (`round` names it) against what the guest `said`
    /// (see `check`): every block must hold what an acknowledged generation wrote.
    fn check_round(
        &mut self,
        round: &str,
        disk: &Path,
        said: &Said,
        sector_data: impl Fn(u64, u64) -> Vec<u8>,
    ) {
        let differences = check(&std::fs::read(disk).unwrap(), said, sector_data, self);
        assert!(
            differences.is_empty(),
            "{round}, {} generations durable: {differences:?}",
            said.durable.len()
        );
        self.rounds += 1;
    }

    /// Print the totals of the runs of `what`, killed by `command`; some block must have been
    /// checked.
    fn finish(&self, what: &str, command: &str) {
        println!(
            "durability {what}: {} rounds, {} block writes acknowledged after a completed FLUSH, {} blocks checked, {} lost ({command})",
            self.rounds, self.acknowledged, self.checked, self.lost
        );
        assert!(self.checked > 0);
    }
}

/// Check `file` against what the guest said; `sector_data(generation, sector)` is what that
/// generation wrote there (generation 0: never written, zeros). Adds to `tally`; returns the
/// first few differences.
fn check(
    file: &[u8],
    said: &Said,
    sector_data: impl Fn(u64, u64) -> Vec<u8>,
    tally: &mut Tally,
) -> Vec<String> {
    let blocks = file.len() / BLOCK;
    let mut acknowledged = vec![0u64; blocks];
    for g in &said.durable {
        for block in g.first..g.first + g.blocks {
            acknowledged[block as usize] = g.number;
        }
        tally.acknowledged += g.blocks;
    }
    let last_durable = said.durable.last().map_or(0, |g| g.number);
    let mut differences = Vec::new();
    for (block, &durable) in acknowledged.iter().enumerate() {
        let block = block as u64;
        let in_flight = said.writing.iter().filter(|g| g.number > last_durable && g.covers(block));
        let candidates: Vec<u64> = std::iter::once(durable).chain(in_flight.map(|g| g.number)).collect();
        let sectors = (BLOCK / SECTOR) as u64;
        let bad = (block * sectors..(block + 1) * sectors).find(|&sector| {
            let at = sector as usize * SECTOR;
            let data = &file[at..at + SECTOR];
            !candidates.iter().any(|&g| sector_data(g, sector) == data)
        });
        if durable > 0 {
            tally.checked += 1;
        }
        if let Some(sector) = bad {
            tally.lost += 1;
            if differences.len() < 5 {
                differences
                    .push(format!("block {block} sector {sector}: none of generations {candidates:?}"));
            }
        }
    }
    differences
}

/// A small PRNG for the moment of the kill.
struct XorShift(u64);

impl XorShift {
    fn from_clock() -> XorShift {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        XorShift(nanos as u64 | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn fresh_disk(path: &Path) {
    let file = std::fs::File::create(path).unwrap();
    file.set_len(DISK_BYTES).unwrap();
}

fn probe_sector(seed: u64) -> impl Fn(u64, u64) -> Vec<u8> {
    move |generation, sector| {
        let mut data = vec![0u8; SECTOR];
        if generation > 0 {
            let seed = probe_abi::pattern::generation_seed(seed, generation);
            probe_abi::pattern::fill(seed, sector, &mut data);
        }
        data
    }
}

fn probe_said(lines: &[String]) -> Said {
    let mut said = Said::default();
    for line in lines.iter().filter_map(|l| serde_json::from_str::<Value>(l).ok()) {
        let at = |key: &str| line[key].as_u64();
        let (Some(first), Some(blocks)) = (at("first"), at("blocks")) else { continue };
        if let Some(number) = at("writing") {
            said.writing.push(Generation { number, first, blocks });
        } else if let Some(number) = at("durable") {
            said.durable.push(Generation { number, first, blocks });
        }
    }
    said
}

#[test]
fn exitless_run_killed_at_random_keeps_every_write_acknowledged_by_a_flush() {
    let _one = test_infra::one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    let mut rng = XorShift::from_clock();
    let mut tally = Tally::default();
    for round in 0..rounds() {
        fresh_disk(&disk);
        let mode = ["exitless", "eventfd", "adaptive"][(round % 3) as usize];
        let seed = 1000 + round;
        let mut command = Command::new(env!("CARGO_BIN_EXE_exitless"));
        command
            .args(["run", "--probe", "--io-mode", mode, "--timeout", "300"])
            .args(["--disk", &format!("path={},direct", disk.display())])
            .args([
                "--cmdline",
                &format!("probe.workload=blk-durable probe.seed={seed} probe.qd=8 probe.window=64"),
            ]);
        let mut vm = Console::spawn(&mut command, &dir.path().join("exitless.err"));
        vm.wait_for(WAIT, |l| l.contains("\"durable\""));
        std::thread::sleep(Duration::from_millis(rng.below(500)));
        let stderr = vm.stderr();
        let (status, lines) = vm.kill(WAIT);
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "round {round}: killed, not ended: {lines:?} {stderr}"
        );
        let said = probe_said(&lines);
        tally.check_round(&format!("round {round} ({mode})"), &disk, &said, probe_sector(seed));
    }
    tally.finish(
        "exitless run (probe blk-durable, modes exitless/eventfd/adaptive)",
        "kill -9 of exitless run",
    );
}

/// The Linux guest's /init: generations of up to 32 blocks written with dd and fsync'd.
const DURABLE_INIT: &str = r#"
blocks=$(( $(blockdev --getsize64 /dev/vda) / 4096 ))
echo "DUR-START blocks=$blocks"
g=0
while true; do
    g=$((g + 1))
    first=$((RANDOM % blocks))
    most=$((blocks - first)); [ $most -gt 32 ] && most=32
    n=$((RANDOM % most + 1))
    : > /w
    b=$first
    while [ $b -lt $((first + n)) ]; do
        s=$(printf '%015d %015d;' $g $b)
        s="$s$s"; s="$s$s"; s="$s$s"; s="$s$s"; s="$s$s"; s="$s$s"; s="$s$s"
        printf '%s' "$s" >> /w
        b=$((b + 1))
    done
    echo "DUR-WRITING $g $first $n"
    dd if=/w of=/dev/vda bs=4096 seek=$first conv=notrunc,fsync 2>/dev/null || { echo "DUR-FAIL $g"; break; }
    echo "DUR-DURABLE $g $first $n"
done
sleep 1000
"#;

/// Sector `sector` of generation `generation`: "<generation> <block>;" (32 bytes) 16 times.
fn linux_sector(generation: u64, sector: u64) -> Vec<u8> {
    if generation == 0 {
        return vec![0; SECTOR];
    }
    format!("{generation:015} {:015};", sector / (BLOCK / SECTOR) as u64).repeat(SECTOR / 32).into_bytes()
}

fn linux_said(lines: &[String]) -> Said {
    let mut said = Said::default();
    for line in lines {
        for (marker, list) in [("DUR-WRITING ", &mut said.writing), ("DUR-DURABLE ", &mut said.durable)] {
            let Some(at) = line.find(marker) else { continue };
            let numbers: Vec<u64> =
                line[at + marker.len()..].split_whitespace().filter_map(|n| n.parse().ok()).collect();
            if let [number, first, blocks] = numbers[..] {
                list.push(Generation { number, first, blocks });
            }
        }
    }
    said
}

#[test]
fn vhost_user_daemon_killed_at_random_keeps_every_write_a_linux_guest_flushed() {
    let _one = test_infra::one_at_a_time();
    let kernel = test_infra::linux::kernel();
    let dir = tempfile::tempdir().unwrap();
    let initramfs = dir.path().join("initramfs.cpio");
    test_infra::linux::initramfs(
        &kernel,
        &format!("{}{DURABLE_INIT}", test_infra::linux::INIT_PRELUDE),
        &initramfs,
    );
    let disk = dir.path().join("disk.img");
    let socket = dir.path().join("vhost.sock");
    let mut rng = XorShift::from_clock();
    let mut tally = Tally::default();
    for round in 0..rounds() {
        fresh_disk(&disk);
        let _ = std::fs::remove_file(&socket);
        let daemon = Daemon::builder()
            .io_mode("adaptive")
            .socket(&socket)
            .disk(&format!("path={},direct", disk.display()))
            .start_console(&dir.path().join("daemon.err"));
        let mut guest = Qemu::linux(&kernel, &initramfs, "256M", 1, "")
            .vhost_user_blk(&socket)
            .spawn_console(&dir.path().join("qemu.err"));
        guest.wait_for(WAIT, |l| l.contains("DUR-DURABLE "));
        std::thread::sleep(Duration::from_millis(rng.below(2000)));
        let (status, _) = daemon.kill(WAIT);
        assert_eq!(status.signal(), Some(libc::SIGKILL), "round {round}: the daemon was killed, not ended");
        // The guest's console lags its writes (the tty buffers): let it catch up. Nothing new
        // can become durable now that the backend is gone.
        guest.settle(Duration::from_secs(2), Duration::from_secs(20));
        let (_, lines) = guest.kill(WAIT);
        let said = linux_said(&lines);
        tally.check_round(&format!("round {round}"), &disk, &said, linux_sector);
    }
    tally.finish(
        "vhost-user-blk (Linux TCG guest, busybox dd conv=fsync)",
        "kill -9 of exitless vhost-user-blk",
    );
}

/// The check itself, on a file built by hand: it accepts the last acknowledged generation and a
/// generation begun after it, and finds a lost write and a write that went back in time.
#[test]
fn the_check_accepts_what_may_be_there_and_finds_lost_writes() {
    let _shared = test_infra::alongside_others();
    let said = Said {
        writing: vec![
            Generation { number: 1, first: 0, blocks: 4 },
            Generation { number: 2, first: 2, blocks: 4 },
            Generation { number: 3, first: 5, blocks: 2 },
        ],
        durable: vec![
            Generation { number: 1, first: 0, blocks: 4 },
            Generation { number: 2, first: 2, blocks: 4 },
        ],
    };
    let build = |generations: [u64; 8]| -> Vec<u8> {
        (0..8u64)
            .flat_map(|block| {
                (block * 8..block * 8 + 8).flat_map(move |s| linux_sector(generations[block as usize], s))
            })
            .collect()
    };
    let lost = |file: &[u8]| {
        let mut tally = Tally::default();
        check(file, &said, linux_sector, &mut tally);
        (tally.lost, tally.checked, tally.acknowledged)
    };
    assert_eq!(lost(&build([1, 1, 2, 2, 2, 2, 0, 0])), (0, 6, 8));
    assert_eq!(lost(&build([1, 1, 2, 2, 2, 3, 3, 0])).0, 0, "generation 3 was begun: it may have landed");
    assert_eq!(lost(&build([1, 1, 2, 0, 2, 2, 0, 0])).0, 1, "block 3 lost generation 2");
    assert_eq!(lost(&build([1, 1, 1, 2, 2, 2, 0, 0])).0, 1, "block 2 went back to generation 1");
    let mut torn = build([1, 1, 2, 2, 2, 2, 0, 0]);
    torn[4 * BLOCK + 3 * SECTOR] ^= 1;
    assert_eq!(lost(&torn).0, 1, "one sector of block 4 differs");
}
