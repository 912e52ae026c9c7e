//! `exitless bench migrate`: live migration of a probe guest during its verify workload on a
//! file disk, between two `exitless run` processes started from this executable: the source
//! (`--api-socket`, `PUT /api/v1/vm.send-migration`) and the destination
//! (`--receive-migration`), over a Unix socket on this host or over TCP with mutual TLS between
//! two simulated hosts (network namespaces joined by a veth pair, [`crate::hosts`]). Per
//! transport, load (idle, or under I/O) and I/O mode: the downtime (source pause to the
//! destination's word that it resumed the guest), of which the pause (drain and park), the
//! total time, the pre-copy rounds and the pages each sent, the pages the devices' workers and
//! KVM reported dirty, and whether the verify then passed on the destination.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use exitless_args::fail;
use serde::Serialize;
use serde_json::Value;
use thiserror::Error;

use super::machine::About;
use super::progress;
use super::table::Table;
use crate::args::{MigrateBenchArgs, MigrateLoad, MigrateTransport};
use crate::hosts::{HostPair, HostsError, DESTINATION_IP, SOURCE_IP};

/// The verify's blocks of 4 KiB. The disk has one more, the verify's gate (`probe.gate_block`):
/// the guest reads back only once the migration has ended, so it lands mid-run on any disk.
const BLOCKS: u64 = 16384;
/// Far beyond what a run takes.
const LIMIT: Duration = Duration::from_secs(180);

/// The TCP port the destination listens on, in its own namespace.
const PORT: u16 = 7070;
/// How often the idle guest reads its gate.
const IDLE_GATE_POLL_MS: u64 = 50;

/// Why a migration was not measured.
#[derive(Debug, Error)]
enum MigrateError {
    /// A file (the disk, a process's output) could not be made or opened.
    #[error("{}: {source}", .path.display())]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The two simulated hosts or their certificates could not be made.
    #[error(transparent)]
    Hosts(#[from] HostsError),
    /// A process could not be started.
    #[error("cannot start {program:?}: {source}")]
    Spawn {
        program: OsString,
        #[source]
        source: std::io::Error,
    },
    /// A process exited, or took too long, before it was ready (`last`: its last line of
    /// standard error).
    #[error("{what}: {last}")]
    NotReady { what: &'static str, last: String },
    /// A process could not be waited for.
    #[error("cannot wait for {what}: {source}")]
    Wait {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A process did not end in time.
    #[error("{what} did not end")]
    DidNotEnd { what: &'static str },
    /// The source's API socket could not be reached, written or read.
    #[error("{}: {source}", .path.display())]
    Api {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The API's answer is not HTTP.
    #[error("no HTTP answer")]
    NoHttpAnswer,
    /// The API's answer has no status code.
    #[error("no HTTP status")]
    NoHttpStatus,
    /// The verify's gate could not be opened on the disk.
    #[error("open the verify's gate in {}: {source}", .path.display())]
    Gate {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The source refused or failed the migration.
    #[error("send-migration answered {status}: {answer}")]
    SendMigration { status: u16, answer: String },
    /// The source's migration report is not JSON.
    #[error("{source}: {answer}")]
    Report {
        answer: String,
        #[source]
        source: serde_json::Error,
    },
}

#[derive(Serialize)]
struct Row {
    /// `unix` or `tcp+tls`.
    transport: String,
    /// `idle` or `io`.
    load: String,
    mode: String,
    downtime_ms: Option<f64>,
    pause_ms: Option<f64>,
    /// Of the downtime: the last pages and the state written to the connection.
    final_send_ms: Option<f64>,
    /// Of the downtime: the destination taking the state and answering.
    destination_ms: Option<f64>,
    /// Of that, the destination's own work: the state checked and applied (its log).
    apply_ms: Option<f64>,
    total_ms: Option<f64>,
    rounds: Option<u64>,
    pages_per_round: Vec<u64>,
    device_dirty_pages: Option<u64>,
    kvm_dirty_pages: Option<u64>,
    bytes: Option<u64>,
    /// "passed", or why not.
    verify: String,
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    about: About,
    mem: String,
    blocks: u64,
    results: Vec<Row>,
}

pub fn main(args: MigrateBenchArgs) -> i32 {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return fail(format_args!("cannot find this executable: {e}")),
    };
    let mut results = Vec::new();
    for &transport in &args.transports {
        for &load in &args.loads {
            for mode in &args.modes {
                let mode = vmm::IoMode::from(*mode).name().to_string();
                let case = Case { transport, load, mode: &mode };
                progress(format_args!(
                    "migrate: {}, {}, {mode}, {} guest, verify of {BLOCKS} blocks",
                    transport.name(),
                    load.name(),
                    args.mem
                ));
                let dir = args.scratch.join(format!(
                    "exitless-bench-migrate-{}-{}-{}-{mode}",
                    std::process::id(),
                    transport.name(),
                    load.name()
                ));
                if let Err(e) = std::fs::create_dir_all(&dir) {
                    return fail(format_args!("cannot make {}: {e}", dir.display()));
                }
                let row = run(&exe, &dir, &case, &args);
                let _ = std::fs::remove_dir_all(&dir);
                let row = row.unwrap_or_else(|why| Row {
                    transport: transport.name().into(),
                    load: load.name().into(),
                    mode: mode.clone(),
                    downtime_ms: None,
                    pause_ms: None,
                    final_send_ms: None,
                    destination_ms: None,
                    apply_ms: None,
                    total_ms: None,
                    rounds: None,
                    pages_per_round: Vec::new(),
                    device_dirty_pages: None,
                    kvm_dirty_pages: None,
                    bytes: None,
                    verify: why.to_string(),
                });
                results.push(row);
            }
        }
    }
    let report = Report { about: About::now("migrate"), mem: args.mem.clone(), blocks: BLOCKS, results };
    super::print_report(&report, args.output, |markdown| report.table(markdown))
}

/// A child process killed if still running when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One migration to measure.
struct Case<'a> {
    transport: MigrateTransport,
    load: MigrateLoad,
    mode: &'a str,
}

fn spawn(mut command: Command, args: &[&str], out: &Path, err: &Path) -> Result<Running, MigrateError> {
    let file = |p: &Path| {
        std::fs::File::create(p).map_err(|source| MigrateError::File { path: p.to_owned(), source })
    };
    let program = command.get_program().to_owned();
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(file(out)?)
        .stderr(file(err)?)
        .spawn()
        .map(Running)
        .map_err(|source| MigrateError::Spawn { program, source })
}

fn wait_for(
    what: &'static str,
    ready: impl Fn() -> bool,
    child: &mut Running,
    err: &Path,
) -> Result<(), MigrateError> {
    let started = Instant::now();
    while !ready() {
        if child.0.try_wait().ok().flatten().is_some() || started.elapsed() > LIMIT {
            return Err(MigrateError::NotReady { what, last: last_line(err) });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

fn last_line(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().last().unwrap_or("no output").to_string()
}

/// `child`'s exit code once it has ended (`what` names it in errors).
fn wait_exit(what: &'static str, child: &mut Running) -> Result<Option<i32>, MigrateError> {
    let started = Instant::now();
    loop {
        if let Some(status) = child.0.try_wait().map_err(|source| MigrateError::Wait { what, source })? {
            return Ok(status.code());
        }
        if started.elapsed() > LIMIT {
            return Err(MigrateError::DidNotEnd { what });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `PUT path` with `body` on the API socket `api`: the status and body.
fn put(api: &Path, path: &str, body: &str) -> Result<(u16, String), MigrateError> {
    let error = |source| MigrateError::Api { path: api.to_owned(), source };
    let mut stream = UnixStream::connect(api).map_err(error)?;
    stream.set_read_timeout(Some(LIMIT)).map_err(error)?;
    let request =
        format!("PUT {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    stream.write_all(request.as_bytes()).map_err(error)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).map_err(error)?;
    let (head, body) = answer.split_once("\r\n\r\n").ok_or(MigrateError::NoHttpAnswer)?;
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).ok_or(MigrateError::NoHttpStatus)?;
    Ok((status, body.to_string()))
}

/// Lets the verify read back, on whichever side runs it.
fn open_gate(disk: &Path) -> Result<(), MigrateError> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(disk)
        .map_err(|source| MigrateError::File { path: disk.to_owned(), source })?;
    file.write_all_at(&probe_abi::verify_gate::OPEN.to_le_bytes(), BLOCKS * 4096)
        .and_then(|()| file.sync_all())
        .map_err(|source| MigrateError::Gate { path: disk.to_owned(), source })
}

/// How long the destination took to check and apply the state, from its log line ("state
/// applied in X ms").
fn applied_ms(log: &Path) -> Option<f64> {
    let text = std::fs::read_to_string(log).ok()?;
    let (_, rest) = text.split_once("state applied in ")?;
    rest.split_whitespace().next()?.parse().ok()
}

/// Is block `block` of `disk` written (not all zero)?
fn written(disk: &Path, block: u64) -> bool {
    use std::os::unix::fs::FileExt;
    let mut data = [0u8; 4096];
    std::fs::File::open(disk).and_then(|f| f.read_exact_at(&mut data, block * 4096)).is_ok()
        && data.iter().any(|&b| b != 0)
}

fn run(exe: &Path, dir: &Path, case: &Case, args: &MigrateBenchArgs) -> Result<Row, MigrateError> {
    let Case { transport, load, mode } = *case;
    let disk = dir.join("disk");
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len((BLOCKS + 1) * 4096))
        .map_err(|source| MigrateError::File { path: disk.clone(), source })?;
    let api = dir.join("source.api");
    let seccomp = clap::ValueEnum::to_possible_value(&args.seccomp.seccomp)
        .map_or("kill".to_string(), |v| v.get_name().to_string());
    let seccomp = seccomp.as_str();
    // Over TCP: two simulated hosts, each exitless in its own network namespace, with its own
    // certificate (one CA) for TLS; the pair is removed after its processes (dropped last).
    let hosts = match transport {
        MigrateTransport::Unix => None,
        MigrateTransport::TcpTls | MigrateTransport::TcpPlain => Some(HostPair::new()?),
    };
    let tls = transport == MigrateTransport::TcpTls;
    let (source_ip, destination_ip) = (SOURCE_IP.to_string(), DESTINATION_IP.to_string());
    let tls_dir = dir.join("tls");
    if tls {
        crate::hosts::make_certificates(&tls_dir, &[&source_ip, &destination_ip])?;
    }
    let (source_tls, destination_tls) =
        (tls_dir.join(&source_ip).display().to_string(), tls_dir.join(&destination_ip).display().to_string());
    let socket = dir.join("migration.sock");
    let url = match transport {
        MigrateTransport::Unix => format!("unix:{}", socket.display()),
        MigrateTransport::TcpTls => format!("tcp:{destination_ip}:{PORT}"),
        MigrateTransport::TcpPlain => format!("tcp+plain:{destination_ip}:{PORT}"),
    };
    let command = |on_destination: bool| match &hosts {
        None => Command::new(exe),
        Some(hosts) if on_destination => hosts.on_destination(exe),
        Some(hosts) => hosts.on_source(exe),
    };
    let (dst_out, dst_err) = (dir.join("destination.out"), dir.join("destination.err"));
    // The destination names the VM's disk (the same file: shared storage) and gives it the
    // probe's test device.
    let disk_arg = format!("path={},direct", disk.display());
    let mut destination_args = vec![
        "run",
        "--receive-migration",
        &url,
        "--disk",
        &disk_arg,
        "--testdev",
        "--seccomp",
        seccomp,
        "--timeout",
        "170",
    ];
    if tls {
        destination_args.extend(["--migration-tls-dir", &destination_tls]);
    }
    let mut destination = spawn(command(true), &destination_args, &dst_out, &dst_err)?;
    let listening = || match transport {
        MigrateTransport::Unix => socket.exists(),
        MigrateTransport::TcpTls | MigrateTransport::TcpPlain => {
            std::fs::read_to_string(&dst_err).is_ok_and(|err| err.contains("waiting for a live migration"))
        }
    };
    wait_for("the destination", listening, &mut destination, &dst_err)?;
    let poll = match load {
        MigrateLoad::Idle => format!(" probe.gate_poll_ms={IDLE_GATE_POLL_MS}"),
        MigrateLoad::Io => String::new(),
    };
    let cmdline = format!(
        "{} probe.gate_block={BLOCKS} probe.timeout_ms=60000{poll}",
        super::verify_cmdline(BLOCKS, 8, super::fresh_seed())
    );
    let (src_out, src_err) = (dir.join("source.out"), dir.join("source.err"));
    let mut source_args = vec![
        "run",
        "--probe",
        "--mem",
        &args.mem,
        "--disk",
        &disk_arg,
        "--io-mode",
        mode,
        "--cmdline",
        &cmdline,
        "--api-socket",
        api.to_str().unwrap_or_default(),
        "--seccomp",
        seccomp,
        "--timeout",
        "170",
    ];
    if tls {
        source_args.extend(["--migration-tls-dir", &source_tls]);
    }
    let mut source = spawn(command(false), &source_args, &src_out, &src_err)?;
    wait_for("the source", || api.exists(), &mut source, &src_err)?;
    match load {
        // Mid-verify: once the guest has written its first block.
        MigrateLoad::Io => wait_for("the source's verify", || written(&disk, 0), &mut source, &src_err)?,
        // Once it has written its last block, flushed and gone to wait at its gate.
        MigrateLoad::Idle => {
            wait_for("the source's verify", || written(&disk, BLOCKS - 1), &mut source, &src_err)?;
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    let body = format!(r#"{{"destination_url": "{url}"}}"#);
    let (status, answer) = put(&api, "/api/v1/vm.send-migration", &body)?;
    open_gate(&disk)?;
    if status != 200 {
        return Err(MigrateError::SendMigration { status, answer });
    }
    let report: Value = serde_json::from_str(&answer)
        .map_err(|source| MigrateError::Report { answer: answer.clone(), source })?;
    let source_code = wait_exit("the source", &mut source)?;
    let dest_code = wait_exit("the destination", &mut destination)?;
    let stdout = std::fs::read_to_string(&dst_out).unwrap_or_default();
    let result = super::blk_result(&stdout);
    let verify = match (source_code, dest_code, result) {
        (Some(0), Some(0), Some(r)) if r["mismatches"] == 0 && r["errors"] == 0 => "passed".to_string(),
        (Some(0), Some(0), Some(r)) => {
            format!("FAILED: {} mismatches, {} errors", r["mismatches"], r["errors"])
        }
        (s, d, _) => {
            format!("FAILED: source status {s:?}, destination status {d:?}: {}", last_line(&dst_err))
        }
    };
    drop((source, destination, hosts));
    Ok(Row {
        transport: transport.name().into(),
        load: load.name().into(),
        mode: mode.to_string(),
        downtime_ms: report["downtime_ms"].as_f64(),
        pause_ms: report["pause_ms"].as_f64(),
        final_send_ms: report["final_send_ms"].as_f64(),
        destination_ms: report["destination_ms"].as_f64(),
        apply_ms: applied_ms(&dst_err),
        total_ms: report["total_ms"].as_f64(),
        rounds: report["rounds"].as_u64(),
        pages_per_round: report["pages_per_round"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default(),
        device_dirty_pages: report["device_dirty_pages"].as_u64(),
        kvm_dirty_pages: report["kvm_dirty_pages"].as_u64(),
        bytes: report["bytes"].as_u64(),
        verify,
    })
}

impl Report {
    fn table(&self, markdown: bool) -> String {
        let header = vec![
            "transport",
            "load",
            "I/O mode",
            "downtime ms",
            "of which pause ms",
            "last send ms",
            "destination ms",
            "of which apply ms",
            "total ms",
            "pre-copy rounds",
            "pages per round (last: stop-and-copy)",
            "IOCore dirty pages",
            "KVM dirty pages",
            "MiB sent",
            "verify on the destination",
        ];
        let ms = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.1}"));
        let count = |v: Option<u64>| v.map_or("n/a".into(), |v| v.to_string());
        let rows = self
            .results
            .iter()
            .map(|r| {
                let pages: Vec<String> = r.pages_per_round.iter().map(u64::to_string).collect();
                vec![
                    r.transport.clone(),
                    r.load.clone(),
                    r.mode.clone(),
                    ms(r.downtime_ms),
                    ms(r.pause_ms),
                    ms(r.final_send_ms),
                    ms(r.destination_ms),
                    ms(r.apply_ms),
                    ms(r.total_ms),
                    count(r.rounds),
                    if pages.is_empty() { "n/a".into() } else { pages.join(" / ") },
                    count(r.device_dirty_pages),
                    count(r.kvm_dirty_pages),
                    r.bytes.map_or("n/a".into(), |b| format!("{:.2}", b as f64 / f64::from(1u32 << 20))),
                    r.verify.clone(),
                ]
            })
            .collect();
        let title = format!(
            "migrate: live migration of a {} probe guest mid-verify ({} blocks, qd 8, O_DIRECT file disk) between two exitless processes: on one host (unix), or between two simulated hosts (network namespaces joined by a veth pair) over TCP with mutual TLS 1.3 (tcp+tls)",
            self.mem, self.blocks
        );
        let mut context = self.about.context();
        if !markdown {
            context.retain(|(k, _)| k == "machine");
        }
        let notes = vec![
            "downtime: from the source's pause (devices drained, vCPUs parked) to the destination's word that the VM is ready to run; the pause waits for the disk requests in flight; last send: the last dirty pages and the state written to the connection; destination: from then to its answer; apply: of that, the destination checking and applying the state (its log)".into(),
            "load io: migrated once the guest has written its first block (writes in flight); idle: once it has written and flushed them all and waits at its gate, reading it every 50 ms".into(),
            "round 1 sends all guest memory but pages that read as zero; IOCore dirty pages are those the devices' workers wrote (KVM's log does not see them)".into(),
        ];
        Table { title, context, header, rows, notes }.render(markdown)
    }
}
