//! FLUSH reaches stable storage before the guest sees it complete, shown two ways from the
//! kernel's own tracepoints, in every mode of the VMM and of `exitless vhost-user-blk`:
//! - end to end: io_uring's tracepoints, recorded for the serving process alone, show one fsync
//!   per FLUSH the guest made, each completed with success, and no request of the guest's after
//!   it submitted before that fsync completed (the guest writes and flushes in turn, one request
//!   at a time, so its next write is its answer to the FLUSH's status);
//! - a power loss at every flush point: on a loop device, the block layer's tracepoints are a
//!   write log with flush points, as dm-log-writes keeps one (this host has no device mapper).
//!   Replayed up to each FLUSH the guest saw complete, the device holds every block the guest
//!   wrote before it: each was written to the device, and that write completed, before a device
//!   flush that completed before the FLUSH's fsync did.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use test_infra::daemon::{Daemon, DaemonBuilder};
use test_infra::one_at_a_time;

const TRACEFS: &str = "/sys/kernel/tracing";
/// Write+FLUSH pairs the guest makes: warm-up and measured requests, two per pair.
const WARMUP: u64 = 40;
const OPS: u64 = 160;
const FLUSHES: usize = ((WARMUP + OPS) / 2) as usize;
const RUN_LIMIT: Duration = Duration::from_secs(60);

/// A tracefs instance (its own buffer) recording every io_uring submission and completion, with
/// the process each came from; a run's are those on the rings its own threads submit to
/// (completions may be posted by io_uring's workers, or by any thread in an interrupt).
/// Removed when dropped.
struct IoUringTrace {
    dir: PathBuf,
}

impl IoUringTrace {
    fn new(name: &str) -> IoUringTrace {
        assert!(
            Path::new(TRACEFS).join("instances").is_dir(),
            "{TRACEFS} is not mounted: run scripts/setup.sh (it mounts tracefs)"
        );
        let dir = Path::new(TRACEFS).join("instances").join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("cannot make {}: {e}", dir.display()));
        let trace = IoUringTrace { dir };
        // One clock for every CPU's buffer, so the merged order is the order of events.
        trace.write("trace_clock", "mono");
        trace.write("buffer_size_kb", "4096");
        trace.write("options/record-tgid", "1");
        for event in [
            "io_uring/io_uring_submit_req",
            "io_uring/io_uring_complete",
            "block/block_rq_issue",
            "block/block_rq_complete",
        ] {
            trace.write(&format!("events/{event}/enable"), "1");
        }
        trace
    }

    fn write(&self, file: &str, value: &str) {
        let path = self.dir.join(file);
        std::fs::write(&path, value).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }

    /// Start tracing.
    fn on(&self) {
        self.write("tracing_on", "1");
    }

    /// Start tracing, then `program ARGS`.
    fn spawn(&self, program: &str, args: &[&str]) -> Child {
        self.on();
        Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the traced process")
    }

    /// The events on the rings process `pid` submitted to, in order.
    fn events_of(&self, pid: u32) -> Vec<Event> {
        self.write("tracing_on", "0");
        let lost = self.lost_events();
        assert_eq!(lost, 0, "{lost} events lost in {}: make buffer_size_kb larger", self.dir.display());
        let text = std::fs::read_to_string(self.dir.join("trace")).unwrap();
        let events: Vec<Event> = text.lines().filter_map(Event::parse).collect();
        let rings: Vec<String> = events
            .iter()
            .filter(|e| matches!(e, Event::Submit { tgid, .. } if *tgid == pid))
            .filter_map(|e| e.ring().map(str::to_string))
            .collect();
        // Block events stay: a test looks only at its own device's.
        events.into_iter().filter(|e| e.ring().is_none_or(|ring| rings.iter().any(|r| r == ring))).collect()
    }

    /// Events overwritten or dropped because a CPU's buffer was full, summed over the CPUs: a
    /// trace with any is not the whole story.
    fn lost_events(&self) -> u64 {
        let cpus = std::fs::read_dir(self.dir.join("per_cpu")).unwrap();
        let mut lost = 0;
        for cpu in cpus {
            let stats = std::fs::read_to_string(cpu.unwrap().path().join("stats")).unwrap();
            for line in stats.lines() {
                if let Some(("overrun" | "commit overrun" | "dropped events", n)) = line.split_once(": ") {
                    lost += n.trim().parse::<u64>().unwrap();
                }
            }
        }
        lost
    }
}

impl Drop for IoUringTrace {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("tracing_on"), "0");
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// One io_uring tracepoint hit.
#[derive(Debug)]
enum Event {
    Submit {
        tgid: u32,
        ring: String,
        req: String,
        opcode: String,
    },
    Complete {
        ring: String,
        req: String,
        result: i64,
    },
    /// A block request issued to a device or completed by it: `dev` is `MAJOR,MINOR`, `rwbs`
    /// its kind (`W...` a write, `FF` a flush), `sector` and `sectors` its range.
    Block {
        issued: bool,
        dev: String,
        rwbs: String,
        sector: u64,
        sectors: u64,
    },
}

impl Event {
    /// `COMM-TID (TGID) [CPU] FLAGS TIME: io_uring_submit_req: ring R, req Q, user_data U,
    /// opcode FSYNC, ...` or `... io_uring_complete: ring R, req Q, user_data U, result N, ...`.
    fn parse(line: &str) -> Option<Event> {
        let field = |name: &str| {
            let at = line.find(&format!(" {name} "))? + name.len() + 2;
            Some(line[at..].split([',', ' ']).next()?.to_string())
        };
        if line.contains("io_uring_submit_req:") {
            let tgid = line.split_once('(')?.1.split_once(')')?.0.trim().parse().ok()?;
            Some(Event::Submit { tgid, ring: field("ring")?, req: field("req")?, opcode: field("opcode")? })
        } else if line.contains("io_uring_complete:") {
            let result = field("result")?.parse().ok()?;
            Some(Event::Complete { ring: field("ring")?, req: field("req")?, result })
        } else if let Some((_, rest)) =
            line.split_once("block_rq_issue: ").or_else(|| line.split_once("block_rq_complete: "))
        {
            // issue: `7,0 WS 4096 () 16 + 8 ...`; complete: `7,0 WS () 16 + 8 ...`.
            let words: Vec<&str> = rest.split_whitespace().collect();
            let at = words.iter().position(|w| *w == "+")?;
            Some(Event::Block {
                issued: line.contains("block_rq_issue:"),
                dev: words.first()?.to_string(),
                rwbs: words.get(1)?.to_string(),
                sector: words.get(at - 1)?.parse().ok()?,
                sectors: words.get(at + 1)?.parse().ok()?,
            })
        } else {
            None
        }
    }

    /// The io_uring an io_uring event belongs to.
    fn ring(&self) -> Option<&str> {
        match self {
            Event::Submit { ring, .. } | Event::Complete { ring, .. } => Some(ring),
            Event::Block { .. } => None,
        }
    }
}

/// What went wrong with the FLUSHes of one run, if anything.
fn check_flushes(cell: &str, events: &[Event]) -> Option<String> {
    let fsyncs: Vec<usize> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e, Event::Submit { opcode, .. } if opcode == "FSYNC"))
        .map(|(at, _)| at)
        .collect();
    if fsyncs.len() != FLUSHES {
        return Some(format!("{cell}: {} fsyncs for the guest's {FLUSHES} FLUSHes", fsyncs.len()));
    }
    for at in fsyncs {
        let Event::Submit { ring, req, .. } = &events[at] else { unreachable!() };
        let mut completed = false;
        for later in &events[at + 1..] {
            match later {
                Event::Complete { ring: r, req: done, result } if r == ring && done == req => {
                    if *result != 0 {
                        return Some(format!("{cell}: an fsync failed ({result})"));
                    }
                    completed = true;
                    break;
                }
                Event::Submit { ring: r, opcode, .. } if r == ring => {
                    return Some(format!(
                        "{cell}: a {opcode} was submitted before the FLUSH's fsync completed"
                    ));
                }
                _ => {}
            }
        }
        if !completed {
            return Some(format!("{cell}: an fsync never completed"));
        }
    }
    None
}

/// One line for scripts/reliability.sh once a run's FLUSHes passed the check; never a failure.
fn print_passed(cell: &str, events: &[Event]) -> Option<String> {
    let count = |f: fn(&Event) -> bool| events.iter().filter(|e| f(e)).count();
    let fsyncs = count(|e| matches!(e, Event::Submit { opcode, .. } if opcode == "FSYNC"));
    let submitted = count(|e| matches!(e, Event::Submit { .. }));
    let completed = count(|e| matches!(e, Event::Complete { .. }));
    println!(
        "flush {cell}: {FLUSHES} FLUSHes, {fsyncs} fsyncs each completed with success before the next submission; {submitted} io_uring submissions, {completed} completions traced"
    );
    None
}

/// The daemon `daemon` (one disk, on its own socket), started traced by `trace` with its log in
/// `log`, serving one run of the probe with `cmdline`, then stopped with SIGTERM: the guest's run
/// and the daemon's pid.
fn through_traced_daemon(
    trace: &IoUringTrace,
    daemon: DaemonBuilder,
    log: &Path,
    cmdline: &str,
) -> (std::process::Output, u32) {
    trace.on();
    let daemon = daemon.start(log);
    let socket = daemon.socket().to_owned();
    let vhost_user = format!("vhost-user={}", socket.display());
    let out = test_infra::exitless_within(
        RUN_LIMIT,
        &["run", "--probe", "--mem", "64M", "--disk", &vhost_user, "--cmdline", cmdline],
    );
    let pid = daemon.pid();
    let _ = daemon.stop_status();
    let _ = std::fs::remove_file(socket);
    (out, pid)
}

fn probe_cmdline() -> String {
    format!("probe.workload=blk probe.rw=writeflush probe.qd=1 probe.ops={OPS} probe.warmup={WARMUP}")
}

fn wait_within(mut child: Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the traced run did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A disk image on the file system the tests build in (ext4 here, not tmpfs), with data.
fn image(dir: &Path) -> PathBuf {
    let path = dir.join("disk.img");
    std::fs::write(&path, vec![0x5a; 16 << 20]).unwrap();
    path
}

fn assert_all(failures: Vec<String>) {
    assert!(failures.is_empty(), "{} run(s) failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn every_flush_of_the_vmm_is_an_fsync_finished_before_the_guest_goes_on() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let image = image(dir.path());
    let mut failures = Vec::new();
    for direct in ["", ",direct"] {
        let disk = format!("path={}{direct}", image.display());
        for mode in ["trap", "eventfd", "pv-eoi", "sidecore", "exitless", "adaptive"] {
            let trace = IoUringTrace::new("exitless-flush-vmm");
            let cmdline = probe_cmdline();
            let args =
                ["run", "--probe", "--mem", "64M", "--disk", &disk, "--io-mode", mode, "--cmdline", &cmdline];
            let vmm = trace.spawn(env!("CARGO_BIN_EXE_exitless"), &args);
            let pid = vmm.id();
            let status = wait_within(vmm, RUN_LIMIT);
            let cell = format!("{disk} {mode}");
            if !status.success() {
                failures.push(format!("{cell}: the guest failed ({status})"));
                continue;
            }
            let events = trace.events_of(pid);
            failures.extend(check_flushes(&cell, &events).or_else(|| print_passed(&cell, &events)));
        }
    }
    assert_all(failures);
}

#[test]
fn every_flush_of_the_daemon_is_an_fsync_finished_before_the_guest_goes_on() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let image = image(dir.path());
    let socket = dir.path().join("disk.sock");
    let mut failures = Vec::new();
    for direct in ["", ",direct"] {
        for mode in ["sidecore", "adaptive", "eventfd"] {
            let trace = IoUringTrace::new("exitless-flush-daemon");
            let daemon = Daemon::builder()
                .disk_on(&socket, &format!("path={}{direct}", image.display()))
                .io_mode(mode);
            let log = dir.path().join("daemon.log");
            let (out, pid) = through_traced_daemon(&trace, daemon, &log, &probe_cmdline());
            let cell = format!("daemon {mode} path{direct}");
            if !out.status.success() {
                failures.push(format!("{cell}: the guest failed: {}", test_infra::stderr(&out)));
                continue;
            }
            let events = trace.events_of(pid);
            failures.extend(check_flushes(&cell, &events).or_else(|| print_passed(&cell, &events)));
        }
    }
    assert_all(failures);
}

/// Replays the block layer's write log of device `dev` up to every FLUSH the guest made (its
/// fsync's completion), as a power loss there would leave the device: a block survives if its
/// write completed before a device flush was issued that completed before the fsync did. Every
/// block the guest wrote before that FLUSH (its writes go in order from block 0, a FLUSH after
/// each) must survive. Returns what went wrong, if anything.
fn check_power_loss(cell: &str, dev: &str, events: &[Event], block_sectors: u64) -> Option<String> {
    // Sectors whose write completed; of those, the ones a completed device flush covers.
    let mut written: std::collections::BTreeSet<u64> = Default::default();
    let mut flush_covers: Vec<std::collections::BTreeSet<u64>> = Vec::new();
    let mut pending_flushes = 0usize;
    let mut durable: std::collections::BTreeSet<u64> = Default::default();
    let mut fsync_reqs: Vec<&str> = Vec::new();
    let mut flushes_seen = 0u64;
    for event in events {
        match event {
            Event::Block { issued, dev: d, rwbs, sector, sectors } if d == dev => {
                if rwbs.starts_with('F') {
                    if *issued {
                        flush_covers.push(written.clone());
                        pending_flushes += 1;
                    } else if pending_flushes > 0 {
                        pending_flushes -= 1;
                        durable.extend(flush_covers.remove(0));
                    }
                } else if rwbs.contains('W') && !issued {
                    written.extend(*sector..sector + sectors);
                }
            }
            Event::Submit { req, opcode, .. } if opcode == "FSYNC" => fsync_reqs.push(req),
            Event::Complete { req, .. } if fsync_reqs.contains(&req.as_str()) => {
                fsync_reqs.retain(|r| r != req);
                // The guest's FLUSH number `flushes_seen` follows its write of block
                // `flushes_seen`: blocks 0..=flushes_seen must have survived.
                let needed = (flushes_seen + 1) * block_sectors;
                if let Some(lost) = (0..needed).find(|s| !durable.contains(s)) {
                    return Some(format!(
                        "{cell}: at FLUSH {flushes_seen}, sector {lost} the guest wrote before it would be lost \
                         ({} sectors written, {} durable)",
                        written.len(),
                        durable.len()
                    ));
                }
                flushes_seen += 1;
            }
            _ => {}
        }
    }
    (flushes_seen != FLUSHES as u64).then(|| format!("{cell}: {flushes_seen} fsyncs completed of {FLUSHES}"))
}

#[test]
fn every_write_acknowledged_before_a_flush_survives_a_power_loss_at_that_flush() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let image = dir.path().join("disk.img");
    std::fs::write(&image, vec![0u8; 16 << 20]).unwrap();
    let device = test_infra::LoopDevice::attach(&image);
    let rdev = std::os::unix::fs::MetadataExt::rdev(&std::fs::metadata(&device.path).unwrap());
    let dev = format!("{},{}", libc::major(rdev), libc::minor(rdev));
    let cmdline = format!(
        "probe.workload=blk probe.rw=seqwriteflush probe.qd=1 probe.ops={} probe.warmup=0",
        2 * FLUSHES
    );
    let socket = dir.path().join("disk.sock");
    let mut failures = Vec::new();
    for direct in ["", ",direct"] {
        let disk = format!("path={}{direct}", device.path.display());
        for mode in ["trap", "eventfd", "exitless", "adaptive"] {
            let trace = IoUringTrace::new("exitless-power-loss-vmm");
            let args =
                ["run", "--probe", "--mem", "64M", "--disk", &disk, "--io-mode", mode, "--cmdline", &cmdline];
            let vmm = trace.spawn(env!("CARGO_BIN_EXE_exitless"), &args);
            let pid = vmm.id();
            let cell = format!("{disk} {mode}");
            if !wait_within(vmm, RUN_LIMIT).success() {
                failures.push(format!("{cell}: the guest failed"));
                continue;
            }
            failures.extend(check_power_loss(&cell, &dev, &trace.events_of(pid), 8));
        }
        for mode in ["sidecore", "eventfd"] {
            let trace = IoUringTrace::new("exitless-power-loss-daemon");
            let daemon = Daemon::builder().disk_on(&socket, &disk).io_mode(mode);
            let log = dir.path().join("daemon.log");
            let (out, pid) = through_traced_daemon(&trace, daemon, &log, &cmdline);
            let cell = format!("daemon {mode} {disk}");
            if !out.status.success() {
                failures.push(format!("{cell}: the guest failed: {}", test_infra::stderr(&out)));
                continue;
            }
            failures.extend(check_power_loss(&cell, &dev, &trace.events_of(pid), 8));
        }
    }
    assert_all(failures);
}

/// The replay itself, on hand-made logs: a FLUSH answered before the device flush completed, or
/// before the write reached the device, loses the block; in order, nothing is lost.
#[test]
fn the_power_loss_replay_finds_a_flush_answered_too_early() {
    let _shared = test_infra::alongside_others();
    let write = |issued| Event::Block { issued, dev: "7,0".into(), rwbs: "WS".into(), sector: 0, sectors: 8 };
    let flush = |issued| Event::Block { issued, dev: "7,0".into(), rwbs: "FF".into(), sector: 0, sectors: 0 };
    let fsync = || Event::Submit { tgid: 1, ring: "r".into(), req: "q".into(), opcode: "FSYNC".into() };
    let done = || Event::Complete { ring: "r".into(), req: "q".into(), result: 0 };
    let in_order = [write(true), write(false), fsync(), flush(true), flush(false), done()];
    let check =
        |events: &[Event]| check_power_loss("log", "7,0", events, 8).filter(|e| e.contains("would be lost"));
    assert_eq!(check(&in_order), None);
    let flush_late = [write(true), write(false), fsync(), flush(true), done(), flush(false)];
    assert!(check(&flush_late).is_some(), "answered before the device flush completed");
    let write_late = [fsync(), flush(true), flush(false), done(), write(true), write(false)];
    assert!(check(&write_late).is_some(), "answered before the write reached the device");
}
