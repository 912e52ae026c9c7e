//! FLUSH reaches the backing file before the guest sees it complete, in every mode of the VMM
//! and of `exitless vhost-user-blk`: the kernel's own io_uring tracepoints, recorded for the
//! serving process alone, show one fsync per FLUSH the guest made, each completed with success,
//! and no request of the guest's after it submitted before that fsync completed (the guest
//! writes and flushes in turn, one request at a time, so its next write is its answer to the
//! FLUSH's status).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::one_at_a_time;

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
        for event in ["io_uring_submit_req", "io_uring_complete"] {
            trace.write(&format!("events/io_uring/{event}/enable"), "1");
        }
        trace
    }

    fn write(&self, file: &str, value: &str) {
        let path = self.dir.join(file);
        std::fs::write(&path, value).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }

    /// Start tracing, then `program ARGS`.
    fn spawn(&self, program: &str, args: &[&str]) -> Child {
        self.write("tracing_on", "1");
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
        let text = std::fs::read_to_string(self.dir.join("trace")).unwrap();
        let events: Vec<Event> = text.lines().filter_map(Event::parse).collect();
        let rings: Vec<String> = events
            .iter()
            .filter(|e| matches!(e, Event::Submit { tgid, .. } if *tgid == pid))
            .map(|e| e.ring().to_string())
            .collect();
        events.into_iter().filter(|e| rings.iter().any(|r| r == e.ring())).collect()
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
    Submit { tgid: u32, ring: String, req: String, opcode: String },
    Complete { ring: String, req: String, result: i64 },
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
        } else {
            None
        }
    }

    fn ring(&self) -> &str {
        match self {
            Event::Submit { ring, .. } | Event::Complete { ring, .. } => ring,
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
            let spec = format!("socket={},path={}{direct}", socket.display(), image.display());
            let args = ["vhost-user-blk", "--disk", &spec, "--io-mode", mode];
            let mut daemon = trace.spawn(env!("CARGO_BIN_EXE_exitless"), &args);
            let deadline = Instant::now() + Duration::from_secs(20);
            while !socket.exists() {
                assert!(Instant::now() < deadline, "the daemon did not listen");
                std::thread::sleep(Duration::from_millis(10));
            }
            let vhost_user = format!("vhost-user={}", socket.display());
            let out = common::exitless_within(
                RUN_LIMIT,
                &["run", "--probe", "--mem", "64M", "--disk", &vhost_user, "--cmdline", &probe_cmdline()],
            );
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
            let _ = daemon.wait();
            let _ = std::fs::remove_file(&socket);
            let cell = format!("daemon {mode} path{direct}");
            if !out.status.success() {
                failures.push(format!("{cell}: the guest failed: {}", common::stderr(&out)));
                continue;
            }
            let events = trace.events_of(daemon.id());
            failures.extend(check_flushes(&cell, &events).or_else(|| print_passed(&cell, &events)));
        }
    }
    assert_all(failures);
}
