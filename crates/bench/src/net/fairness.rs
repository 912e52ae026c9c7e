//! Many VMs on one NIC daemon in `exitless bench net`: N exitless probe VMs at once, each with a
//! NIC on one `exitless vhost-user-net` (one IOCore, sidecore, on the IOCore's CPU), each doing
//! UDP request-response with the host's responder through the switch's uplink. Their vCPUs
//! share the vCPU's CPU, as the block bench's `scale` VMs do on a host this small, so the
//! scheduler's time slices bound each VM's rate; what the row shows is how evenly one IOCore
//! serves them: per-VM transactions/s and Jain's fairness index over their common window.

use exitless_args::VhostIoMode;
use vmm::Counters;

use super::switch::{exitless_vm_context, start_switch, SwitchError};
use super::{Lab, Row, PORT, SERVER_UPLINK_IP};
use crate::args::NetBenchArgs;
use crate::probe_dir::ProbeDir;
use crate::scale::launch::{common_window, run_exitless, ExitlessVm, LaunchError, VmResult};
use crate::scale::{cpu::Sampler, jain};

/// The row's name for `vms` VMs.
pub fn row_name(vms: usize) -> String {
    format!("{vms} exitless VMs on one exitless vhost-user-net IOCore (uplink), daemon sidecore")
}

/// The row of `vms` VMs at once (`vms` at least 2).
pub fn row(lab: &Lab, args: &NetBenchArgs, tsc_khz: u32, vms: usize) -> Row {
    let mut row = Row::new("exitless", row_name(vms), args.size);
    if let Err(e) = measure(&mut row, lab, args, tsc_khz, vms) {
        row.note = Some(format!("not measured: {}", super::super::one_line(&e.to_string())));
    }
    row
}

/// VM `index`'s address on the uplink's subnet (10.97.0.10 on), and its NIC's MAC.
fn addresses(index: usize) -> (String, String) {
    (format!("10.97.0.{}", 10 + index), format!("52:54:00:65:79:{:02x}", 10 + index))
}

fn measure(
    row: &mut Row,
    lab: &Lab,
    args: &NetBenchArgs,
    tsc_khz: u32,
    vms: usize,
) -> Result<(), FairnessError> {
    let dir = ProbeDir::make("net-fairness").map_err(SwitchError::from)?;
    let sockets: Vec<_> = (0..vms).map(|i| dir.path().join(format!("nic{i}.sock"))).collect();
    let macs: Vec<_> = (0..vms).map(|i| addresses(i).1).collect();
    let nics: Vec<_> = sockets.iter().zip(&macs).map(|(s, m)| (s.as_path(), m.as_str())).collect();
    let sampler = Sampler::start();
    let daemon = start_switch(args, VhostIoMode::Sidecore, dir.path(), &nics, Some(&lab.uplink))?;
    sampler.watch(daemon.id());
    let ctx = exitless_vm_context(args, tsc_khz, &dir, args.vcpu_cpu, args.duration_ms)?;
    let results: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..vms)
            .map(|i| {
                let (ip, mac) = addresses(i);
                let device = format!("vhost-user={},mac={mac}", sockets[i].display());
                let cmdline = format!(
                    "probe.workload=udp-rr probe.ip={ip} probe.dst={SERVER_UPLINK_IP} probe.port={PORT} \
                     probe.size={} probe.duration_ms={} probe.warmup={}",
                    args.size, args.duration_ms, args.warmup
                );
                let (ctx, watcher) = (&ctx, sampler.watcher());
                scope.spawn(move || {
                    let vm =
                        ExitlessVm { device: ["--net", &device], cmdline, result: "udp-rr", rate: "tps" };
                    run_exitless(&vm, false, ctx, &watcher)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().map_err(|_| "its runner panicked".to_string())).collect()
    });
    let samples = sampler.finish();
    let _ = daemon.terminate(std::time::Duration::from_secs(10));
    let mut measured: Vec<VmResult> = Vec::new();
    let mut failed = Vec::new();
    for (i, result) in results.into_iter().enumerate() {
        match result.and_then(|r| r.map_err(|e| e.to_string())) {
            Ok(vm) => measured.push(vm),
            Err(e) => failed.push(format!("VM {i}: {e}")),
        }
    }
    if !failed.is_empty() {
        return Err(FairnessError::Vms(failed.join("; ")));
    }
    let (from, to, overlap) = common_window(&measured).ok_or(FairnessError::Launch(LaunchError::NoVm))?;
    let rates: Vec<f64> = measured.iter().map(|vm| vm.rate).collect();
    let ops: u64 = measured.iter().map(|vm| vm.ops).sum();
    let exits = Counters::sum(measured.iter().map(|vm| &vm.counters));
    row.transactions = ops;
    row.transactions_per_s = Some(rates.iter().sum());
    row.exits_per_transaction = Some(exits.get("exits") as f64 / ops.max(1) as f64);
    row.exits_by_cause = super::super::causes_per(&exits, ops);
    row.cpu_cores_used = samples.cores(from, to);
    row.vms = Some(vms);
    row.jain_fairness = jain(&rates);
    row.note = Some(format!(
        "{vms} VMs at once, their vCPUs all on CPU {}, one IOCore on CPU {}: per VM {:.0} to {:.0} \
         transactions/s, Jain's fairness {:.3}, their measured windows overlapped {:.0}%; \
         transactions/s is their sum",
        args.vcpu_cpu,
        args.iocore_cpu,
        rates.iter().copied().fold(f64::INFINITY, f64::min),
        rates.iter().copied().fold(0.0, f64::max),
        row.jain_fairness.unwrap_or(0.0),
        overlap * 100.0
    ));
    row.per_vm_transactions_per_s = rates;
    row.window_overlap = Some(overlap);
    Ok(())
}

/// Why the row was not measured.
#[derive(Debug, thiserror::Error)]
enum FairnessError {
    #[error(transparent)]
    Switch(#[from] SwitchError),
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error("{0}")]
    Vms(String),
}
