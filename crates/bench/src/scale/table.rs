//! `bench scale`'s tables: the VM counts per set-up, and the mixed run.

use super::super::table::Table;
use super::{Report, Row};

pub(super) fn render(report: &Report, markdown: bool) -> String {
    let mut context = report.about.context();
    context.push(("disk".into(), report.disk.clone()));
    context.push((
        "workload".into(),
        format!(
            "4 KiB random reads per VM, {} ms measured after {} ms of warm-up, {} MiB of guest memory",
            report.duration_ms, report.warmup_ms, report.mem_mib
        ),
    ));
    context.push(("pinning".into(), report.pinning.clone()));
    for (name, what) in &report.setups {
        context.push((name.to_string(), what.to_string()));
    }
    if let Some(v) = &report.qemu_version {
        context.push(("QEMU".into(), v.clone()));
    }
    if let Some(v) = &report.qemu_storage_daemon_version {
        context.push(("qemu-storage-daemon".into(), v.clone()));
    }
    context.push(("cores".into(), report.cpu_accounting.into()));
    context.push(("exits".into(), report.exits_accounting.into()));
    let uniform: Vec<&Row> = report.results.iter().filter(|r| !r.mixed).collect();
    let qds: Vec<u32> = uniform.iter().map(|r| r.queue_depth).collect();
    let mut out = Table {
        title: format!("bench scale: N VMs at once, each on its own disk, QD {}", qds.first().copied().unwrap_or(1)),
        context,
        header: vec![
            "set-up",
            "VMs",
            "aggregate IOPS",
            "per-VM min",
            "per-VM max",
            "Jain",
            "cores",
            "IOPS/core",
            "exits/IO",
            "exit causes/IO",
            "note",
        ],
        rows: uniform
            .iter()
            .map(|r| {
                vec![
                    r.setup.to_string(),
                    r.vms.to_string(),
                    iops(r.aggregate_iops),
                    iops(r.per_vm_min_iops),
                    iops(r.per_vm_max_iops),
                    fixed(r.jain_fairness, 3),
                    fixed(r.cpu_cores_used, 2),
                    iops(r.iops_per_core),
                    fixed(r.exits_per_io, 4),
                    super::super::format_causes(&r.exits_by_cause),
                    r.note.clone().unwrap_or_default(),
                ]
            })
            .collect(),
        notes: vec![
            "Jain: Jain's fairness index of the VMs' IOPS ((sum x)^2 / (n sum x^2); 1 = all equal). cores: CPU \
             time of every process of the set-up over the VMs' common measured window. \
             irq_exits are host interrupts (the scheduler preempting a vCPU that shares its core), not the \
             I/O path's."
                .into(),
        ],
    }
    .render(markdown);
    let mixed: Vec<&Row> = report.results.iter().filter(|r| r.mixed).collect();
    if !mixed.is_empty() {
        out += &Table {
            title: format!(
                "bench scale, mixed: {} VMs, half at QD {}, half at QD {}",
                mixed[0].vms,
                mixed.first().map_or(0, |r| r.queue_depth),
                mixed.last().map_or(0, |r| r.queue_depth)
            ),
            context: Vec::new(),
            header: vec![
                "set-up",
                "half",
                "VMs",
                "per-VM IOPS",
                "min",
                "max",
                "Jain (half)",
                "half IOPS",
                "cores (run)",
                "IOPS/core (run)",
                "exits/IO",
                "note",
            ],
            rows: mixed
                .iter()
                .map(|r| {
                    vec![
                        r.setup.to_string(),
                        format!("QD {}", r.queue_depth),
                        r.group_vms.to_string(),
                        r.per_vm_iops.iter().map(|&v| iops(Some(v))).collect::<Vec<_>>().join(" "),
                        iops(r.per_vm_min_iops),
                        iops(r.per_vm_max_iops),
                        fixed(r.jain_fairness, 3),
                        iops(r.aggregate_iops),
                        fixed(r.cpu_cores_used, 2),
                        iops(r.iops_per_core),
                        fixed(r.exits_per_io, 4),
                        r.note.clone().unwrap_or_default(),
                    ]
                })
                .collect(),
            notes: vec![
                "Each half's VMs ran together with the other half's; cores and IOPS/core are the whole run's."
                    .into(),
            ],
        }
        .render(markdown);
    }
    out
}

/// `123.4k`, `5.6M`, `950`, or `-`.
fn iops(value: Option<f64>) -> String {
    match value {
        None => "-".into(),
        Some(v) if v >= 1e6 => format!("{:.2}M", v / 1e6),
        Some(v) if v >= 1e4 => format!("{:.1}k", v / 1e3),
        Some(v) => format!("{v:.0}"),
    }
}

fn fixed(value: Option<f64>, places: usize) -> String {
    value.map_or_else(|| "-".into(), |v| format!("{v:.places$}"))
}
