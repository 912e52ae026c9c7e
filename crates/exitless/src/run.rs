//! `exitless run`.

use std::time::Duration;

use serde_json::json;
use vmm::{ConsoleMode, DisableExits, Ending, Kernel, RunOutcome, Vm, VmConfig};

use crate::cli::{ExitKind, RunArgs};
use exitless_args::disk::RunDisk;
use exitless_args::{fail, status, usage_error};
use probe_image as probe;

pub fn main(args: RunArgs) -> i32 {
    if let Err(message) = check_cmdline(args.cmdline.as_deref().unwrap_or_default()) {
        return usage_error(message);
    }
    let config = match config(&args) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    // librbd's threads (an `rbd=` disk's) on the IOCore's CPU, under their own filter.
    let cpus = args.io.iocore_cpu.into_iter().collect();
    match iocore::backend_thread_set_up(sandbox::ThreadKind::RbdClient, config.seccomp, cpus) {
        Ok(set_up) => storage::rbd::set_up_client_threads(Box::new(set_up)),
        Err(e) => return fail(e),
    };
    let tls = match &args.migration_tls_dir {
        Some(dir) => match vmm::migration::MigrationTls::load(dir) {
            Ok(tls) => Some(std::sync::Arc::new(tls)),
            Err(e) => return fail(e),
        },
        None => None,
    };
    let vm = match (&args.restore, &args.receive_migration) {
        (Some(source), _) => restore(source, config.clone()),
        (None, Some(url)) => receive(url, config.clone(), tls.clone()),
        (None, None) => {
            let kernel = match &args.kernel {
                Some(path) => Kernel::File(path.clone()),
                None => Kernel::Image(probe::PROBE_ELF),
            };
            Vm::new(&config, kernel)
        }
    };
    let mut vm = match vm {
        Ok(vm) => vm,
        Err(e) => return fail(e),
    };
    if let Some(tls) = tls {
        vm = vm.with_migration_tls(tls);
    }
    let mut api = None;
    if let Some(path) = &args.api_socket {
        match crate::vm_api::start(path, config.seccomp) {
            Ok((server, hook)) => {
                vm = vm.with_control(hook);
                api = Some(server);
            }
            Err(e) => return fail(e),
        }
    }
    let outcome = vm.run();
    if let Some(api) = api {
        api.stop();
    }
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(e) => return fail(e),
    };
    if args.stats {
        report_stats(&outcome, args.json);
    }
    exit_status(&outcome.ending)
}

/// `--restore source_url=file:///DIR`: the VM in the snapshot, with this run's own settings.
fn restore(source: &str, base: VmConfig) -> Result<Vm, vmm::VmError> {
    let url = source.strip_prefix("source_url=").unwrap_or(source);
    let dir = vmm::snapshot::dir_from_url(url)?;
    let started = std::time::Instant::now();
    let vm = Vm::restore(&dir, base)?;
    log::info!("restored from {} in {:.3} ms", dir.display(), started.elapsed().as_secs_f64() * 1e3);
    Ok(vm)
}

/// `--receive-migration URL`: wait for a source there and build the VM it sends.
fn receive(
    url: &str,
    base: VmConfig,
    tls: Option<std::sync::Arc<vmm::migration::MigrationTls>>,
) -> Result<Vm, vmm::VmError> {
    let (vm, received) = Vm::receive_migration(url, base, tls)?;
    log::info!(
        "live migration received on {url}: {} pages in {} records; state applied in {:.3} ms; \
         {} connections refused (another user's, or no trusted TLS certificate)",
        received.pages,
        received.records,
        received.apply_ms,
        received.refused_peers
    );
    Ok(vm)
}

/// What a kernel command line may hold. Checked here rather than by clap, whose message would
/// quote the whole (maybe 5000-byte) value back.
fn check_cmdline(cmdline: &str) -> Result<(), String> {
    if cmdline.len() > vmm::boot::CMDLINE_MAX {
        return Err(format!("--cmdline is {} bytes; the limit is {}", cmdline.len(), vmm::boot::CMDLINE_MAX));
    }
    match cmdline.char_indices().find(|(_, c)| !matches!(c, ' '..='~')) {
        Some((at, c)) => Err(format!(
            "--cmdline has {c:?} at byte {at}; a kernel command line is printable ASCII and spaces"
        )),
        None => Ok(()),
    }
}

fn config(args: &RunArgs) -> Result<VmConfig, vmm::VmError> {
    let mut cmdline = args.cmdline.clone().unwrap_or_default();
    // A restored guest has its command line in its memory; the rest comes from the snapshot.
    if args.probe && args.restore.is_none() && args.receive_migration.is_none() {
        if args.cmdline.is_none() {
            cmdline = probe::DEFAULT_CMDLINE.to_string();
        }
        cmdline = probe::with_tsc_khz(&cmdline, vmm::tsc_khz()?);
        cmdline = probe::with_io_mode(&cmdline, args.io.io_mode.into());
    }
    Ok(VmConfig {
        mem_bytes: args.mem,
        vcpus: args.vcpus,
        hugepages: args.hugepages,
        pin_vcpus: args.pin_vcpu.clone(),
        disable_exits: DisableExits {
            hlt: args.disable_exits.iter().any(|e| matches!(e, ExitKind::Hlt)),
            pause: args.disable_exits.iter().any(|e| matches!(e, ExitKind::Pause)),
        },
        cmdline,
        testdev: args.probe || args.testdev,
        console: ConsoleMode::Stdout,
        timeout: args.timeout.map(Duration::from_secs_f64),
        disks: args
            .io
            .disks
            .iter()
            .filter_map(|d| match d {
                RunDisk::Local(disk, _) => Some(disk.clone()),
                RunDisk::VhostUser(_) => None,
            })
            .collect(),
        disk_options: args
            .io
            .disks
            .iter()
            .filter_map(|d| match d {
                RunDisk::Local(_, options) => Some(options.clone()),
                RunDisk::VhostUser(_) => None,
            })
            .collect(),
        vhost_user_disks: args
            .io
            .disks
            .iter()
            .filter_map(|d| match d {
                RunDisk::VhostUser(disk) => Some(disk.clone()),
                RunDisk::Local(..) => None,
            })
            .collect(),
        nets: args
            .io
            .nets
            .iter()
            .enumerate()
            .filter_map(|(i, net)| net.tap(args.io.disks.len() + i))
            .collect(),
        vhost_user_nets: args
            .io
            .nets
            .iter()
            .enumerate()
            .filter_map(|(i, net)| net.vhost_user(args.io.disks.len() + i))
            .collect(),
        io_mode: args.io.io_mode.into(),
        iocore_cpu: args.io.iocore_cpu,
        idle_budget: Duration::from_micros(args.io.idle_budget_us),
        seccomp: args.seccomp.mode(),
        // Once the VM runs, this process only waits for it and reports.
        confine_caller: true,
        snapshot_dir: args.snapshot_dir.clone(),
    })
}

/// The process status for how the VM ended; says why on standard error unless the guest simply
/// exited.
pub fn exit_status(ending: &Ending) -> i32 {
    match ending {
        Ending::GuestExit(v) => *v as i32,
        Ending::Migrated(_) => {
            eprintln!("exitless: {ending}");
            0
        }
        Ending::Timeout(_) => {
            eprintln!("exitless: {ending}");
            status::TIMEOUT
        }
        Ending::Shutdown { .. }
        | Ending::Reset { .. }
        | Ending::GuestCrash { .. }
        | Ending::Halted { .. } => {
            eprintln!("exitless: {ending}");
            status::GUEST_STOPPED
        }
        _ => fail(ending),
    }
}

/// What happened between consecutive marks the guest set: exits, wall time, and the CPU time of
/// the vCPU and of the IOCore.
fn phases(marks: &[vmm::Mark]) -> Vec<serde_json::Value> {
    marks
        .windows(2)
        .map(|pair| {
            let (start, end) = (&pair[0], &pair[1]);
            let iocore = start.iocore_cpu.zip(end.iocore_cpu).map(|(a, b)| b.saturating_sub(a).as_secs_f64());
            json!({
                "from": start.label,
                "to": end.label,
                "wall_s": end.at.duration_since(start.at).as_secs_f64(),
                // When the phase began on the host's monotonic clock, so that a harness can
                // place it among its own samples (`exitless bench scale`).
                "from_monotonic_s": clock::monotonic_at(start.at).as_secs_f64(),
                "vcpu_cpu_s": end.vcpu_cpu.saturating_sub(start.vcpu_cpu).as_secs_f64(),
                "iocore_cpu_s": iocore,
                "counters": end.snapshot.since(&start.snapshot),
            })
        })
        .collect()
}

fn report_stats(outcome: &RunOutcome, json: bool) {
    if json {
        let vcpus: Vec<_> = outcome
            .vcpus
            .iter()
            .map(|v| json!({ "vcpu": v.index, "counters": v.counters, "phases": phases(&v.marks) }))
            .collect();
        let summary = json!({
            "exitless": "run",
            "ending": outcome.ending.to_string(),
            "guest_status": match outcome.ending { Ending::GuestExit(v) => Some(v), _ => None },
            "wall_time_s": outcome.wall_time.as_secs_f64(),
            "vcpus": vcpus,
            "devices": outcome.devices.iter().map(device_json).collect::<Vec<_>>(),
            "iocore": outcome.iocore.map(|io| json!({
                "work": io.work,
                "sleeps": io.sleeps,
                "disk_sleeps": io.disk_sleeps,
                "worker_yields": io.worker_yields,
                "yields": io.yields,
                "held_off": io.held_off,
            })),
        });
        println!("{summary}");
        return;
    }
    eprintln!("exitless: KVM exit statistics over the run ({:.3} s):", outcome.wall_time.as_secs_f64());
    for vcpu in &outcome.vcpus {
        let counters: Vec<String> =
            vcpu.counters.notable().iter().map(|(name, value)| format!("{name}={value}")).collect();
        eprintln!("  vcpu{}: {}", vcpu.index, counters.join(" "));
    }
    if let Some(io) = outcome.iocore {
        eprintln!(
            "  iocore: work={} sleeps={} disk_sleeps={} worker_yields={} yields={} held_off={}",
            io.work, io.sleeps, io.disk_sleeps, io.worker_yields, io.yields, io.held_off
        );
    }
    for device in &outcome.devices {
        let (requests, stats) = (&device.stats.requests, &device.stats);
        let reason =
            stats.first_reset_reason.as_deref().map(|why| format!(" (first: {why})")).unwrap_or_default();
        if let Some(vu) = &device.vhost_user {
            eprintln!(
                "  {} {}: socket={} served by the daemon (requests and interrupts are its to count) \
                 activations={} features={:#x} reconnections={} daemon_gone={} needs_reset={}{reason}",
                device.kind,
                device.index,
                vu.socket.display(),
                vu.activations,
                vu.features,
                vu.reconnections,
                vu.daemon_gone,
                stats.needs_reset
            );
            continue;
        }
        let per_queue = match queue_requests(device) {
            many @ [_, _, ..] => {
                let counts: Vec<String> = many.iter().map(u64::to_string).collect();
                format!(" queue_requests={}", counts.join(","))
            }
            _ => String::new(),
        };
        eprintln!(
            "  {} {}: completed={} io_errors={} rejected={} interrupts={}{per_queue} needs_reset={}{reason}",
            device.kind,
            device.index,
            requests.completed,
            requests.io_errors,
            requests.rejected,
            requests.interrupts,
            stats.needs_reset
        );
    }
}

/// Requests answered per queue, for a disk the VMM serves (empty for other devices).
fn queue_requests(device: &vmm::DeviceReport) -> &[u64] {
    &device.stats.per_queue[..device.request_queues.min(virtio::STATS_QUEUES)]
}

/// A device's counts in `--stats --json`. A vhost-user disk's daemon serves its requests and
/// raises its interrupts (KVM injects them from the irqfd), so the request counts are `null`
/// (unknown to the VMM) and `served_by` says where to find them.
fn device_json(device: &vmm::DeviceReport) -> serde_json::Value {
    if let Some(vu) = &device.vhost_user {
        return json!({
            "device": device.kind,
            "index": device.index,
            "served_by": "vhost-user daemon",
            "socket": vu.socket.display().to_string(),
            "completed": null,
            "io_errors": null,
            "rejected": null,
            "interrupts": null,
            "activations": vu.activations,
            "features": vu.features,
            "reconnections": vu.reconnections,
            "daemon_gone": vu.daemon_gone,
            "needs_reset": device.stats.needs_reset,
            "needs_reset_reason": device.stats.first_reset_reason,
        });
    }
    let requests = &device.stats.requests;
    json!({
        "device": device.kind,
        "index": device.index,
        "completed": requests.completed,
        "io_errors": requests.io_errors,
        "rejected": requests.rejected,
        "interrupts": requests.interrupts,
        "queue_requests": queue_requests(device),
        "needs_reset": device.stats.needs_reset,
        "needs_reset_reason": device.stats.first_reset_reason,
    })
}
