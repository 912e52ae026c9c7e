//! The block ladder's tables: one per disk and scenario, the real disk's first when the bench ran
//! it first (the default order).

use super::backend::Backend;
use super::blk::Row;
use super::format_causes;
use super::machine::About;
use super::table::Table;

/// What the tables' headings say besides the rows.
pub struct Context<'a> {
    pub about: &'a About,
    /// (label, description) per disk, in run order.
    pub disks: Vec<(&'a str, &'a str)>,
    pub fio_version: Option<&'a str>,
    pub qemu_version: Option<&'a str>,
    pub qemu_storage_daemon_version: Option<&'a str>,
    /// The vCPU's and the IOCore's host CPUs.
    pub cpus: [usize; 2],
    /// The CPUs librbd's threads in the bench's process (exitless's VMM rows) may run on.
    pub librbd_cpus: Option<&'a str>,
}

/// Why a RAM disk's ratio to bare metal can exceed 1, under each RAM-disk table.
const RAM_DISK_NOTE: &str = "RAM disk: a memory copy from a mapping of a /dev/shm file, it shows \
     what the I/O path costs on top of a copy. The guest's request reaches memory without a system \
     call, fio's (the bare-metal baseline: the best of psync, libaio and io_uring) with one, so a \
     polled guest can beat bare metal (% of bare metal over 100). `% of mmap` compares with the \
     device's own speed: fio's mmap engine, the same copy with no system call, which no program \
     that uses a disk through the kernel gets. exitless's rows (and QEMU's with exitless's \
     vhost-user backend) are on the ram backend, which QEMU has no peer for (it cannot map a \
     /dev/shm file as a disk): they have no x QEMU. QEMU's rows on the file through io_uring \
     (tmpfs-direct) compare with each other and with fio's; the null disk's table compares \
     exitless's null disk with QEMU's null-co";

/// What a null disk's table measures, under it (what each side does is the backend's note).
const NULL_DISK_NOTE: &str = "null disk: it holds nothing, so every row measures its I/O path alone; \
     bare metal is fio's null engine (no file, no system call: fio's own cost of an I/O)";

/// Where an RBD image's cluster runs, under each of its tables.
const RBD_NOTE: &str = "rbd: the image's cluster runs on this host when the bench started it \
     (--backends rbd without --ceph-conf: the disk line names its OSD's and monitor's PIDs and the \
     CPUs they may use). They are not pinned: they share the CPUs the vCPU and the IOCore (or \
     QEMU's threads, or fio) run on, so every row's I/O also costs OSD CPU time on those CPUs, and a \
     set-up that keeps a CPU busy polling slows the OSD that serves it; each row's note gives the \
     cores the OSD and the monitor used over its run. cores leaves them out; for exitless's own \
     rows it counts the vCPU and the IOCore, not librbd's threads in the same process, while QEMU's \
     rows count QEMU's and the backend's processes whole, librbd's threads included";

/// What x QEMU is, under each table.
const X_QEMU_NOTE: &str = "added µs/IO: the row's p50 less bare metal's p50; x QEMU: IOPS over the \
     best of QEMU's own configurations (its virtio-blk, qemu-storage-daemon) on the row's backend \
     (null against null, a file against the same file with the same cache mode; n/a where QEMU ran \
     on no such backend)";

/// What the CPU RTT column is, under each table.
const CPU_ROUND_TRIP_NOTE: &str = "CPU RTT ns: one cache line's round trip between the vCPU's CPU and \
     the IOCore's, measured just before the guest's run. A polled request waits on several such \
     crossings in turn, so its latency follows this figure, which on a virtual machine depends on \
     where the hypervisor placed the two CPUs at that moment: compare rows with like figures, and \
     read a gap between rows with unlike ones as the host's, not the modes'";

/// A row's IOPS in each round (`-` for a row measured once, `failed` for a round that failed).
fn per_round(round_iops: &[Option<f64>]) -> String {
    if round_iops.is_empty() {
        return "-".into();
    }
    let each: Vec<String> =
        round_iops.iter().map(|iops| iops.map_or("failed".into(), |iops| format!("{iops:.0}"))).collect();
    each.join(", ")
}

pub fn render(context: &Context, results: &[Row], markdown: bool) -> String {
    let mut out = String::new();
    let mut scenarios: Vec<(&str, &str, u32, u32)> = Vec::new();
    for row in results {
        let key = (row.disk, row.workload, row.block_size, row.queue_depth);
        if !scenarios.contains(&key) {
            scenarios.push(key);
        }
    }
    let number = |v: Option<f64>, digits: usize| v.map_or("n/a".into(), |v| format!("{v:.digits$}"));
    for (disk, rw, bs, qd) in scenarios {
        let rows: Vec<&Row> = results
            .iter()
            .filter(|r| (r.disk, r.workload, r.block_size, r.queue_depth) == (disk, rw, bs, qd))
            .collect();
        let ram = rows.iter().any(|r| r.device_iops.is_some());
        let null = rows.iter().any(|r| r.vmm == "host" && r.backend == Backend::Null);
        let rbd = rows.iter().any(|r| r.backend == Backend::Rbd);
        let rounds = rows.iter().map(|r| r.round_iops.len()).max().unwrap_or(0);
        let mut header = vec!["vmm", "mode", "backend", "IOPS"];
        if rounds > 0 {
            header.push("IOPS per round");
        }
        header.extend([
            "p50 µs",
            "p99 µs",
            "added µs/IO",
            "exits/IO",
            "exit causes per IO",
            "% of bare metal",
        ]);
        if ram {
            header.push("% of mmap");
        }
        header.extend(["x QEMU", "cores", "CPU RTT ns"]);
        let cells = rows
            .iter()
            .map(|r| {
                let mut cells =
                    vec![r.vmm.to_string(), r.mode.clone(), r.backend.name().to_string(), number(r.iops, 0)];
                if rounds > 0 {
                    cells.push(per_round(&r.round_iops));
                }
                cells.extend([
                    number(r.p50_us, 1),
                    number(r.p99_us, 1),
                    r.added_latency_us.map_or("n/a".into(), |v| format!("{v:+.1}")),
                    number(r.exits_per_io, 3),
                    format_causes(&r.exits_by_cause),
                    number(r.ratio_to_bare_metal.map(|x| x * 100.0), 1),
                ]);
                if ram {
                    cells.push(number(r.ratio_to_device.map(|x| x * 100.0), 1));
                }
                cells.extend([
                    number(r.ratio_to_qemu, 2),
                    number(r.cpu_cores_used, 2),
                    number(r.cpu_round_trip_ns, 0),
                ]);
                cells
            })
            .collect();
        let describe = context.disks.iter().find(|(label, _)| *label == disk).map_or(disk, |(_, d)| *d);
        let mut lines = context.about.context();
        lines.push(("disk".to_string(), describe.to_string()));
        let [vcpu, iocore] = context.cpus;
        lines.push(("CPUs".into(), format!("vCPU on {vcpu}, IOCore on {iocore}")));
        if let Some(v) = context.fio_version {
            let how = match (null, rows.iter().find(|r| r.vmm == "host")) {
                (true, _) => "its null engine (no file)",
                (false, host) => host.map_or("O_DIRECT", |host| host.backend.caching()),
            };
            let engines = match (null, rbd) {
                (true, _) => "at the row's queue depth",
                (false, true) => "the best of its rbd engine sleeping for completions and busy-polling them",
                (false, false) => "the best of psync, libaio and io_uring",
            };
            lines.push((
                "baseline".into(),
                format!("{v}, {how}, one job allowed CPUs {vcpu},{iocore} (the guest set-up's), {engines}"),
            ));
        }
        if let Some(v) = context.qemu_version {
            let qsd = context.qemu_storage_daemon_version.map_or(String::new(), |q| format!(", {q}"));
            lines.push(("peer".into(), format!("{v}{qsd}; exits from QMP query-stats at the probe's marks")));
        }
        if !markdown {
            lines.retain(|(k, _)| k == "machine" || k == "disk" || k == "CPUs");
        }
        let mut notes: Vec<String> =
            rows.iter().filter_map(|r| r.note.as_ref().map(|n| format!("{}: {n}", r.mode))).collect();
        if rounds > 0 {
            notes.push(format!(
                "IOPS per round: each guest row ran {rounds} times, every guest row of this table in \
                 turn each round; the row is its run with the median IOPS (its latency, exits and \
                 cores that run's), x QEMU compares those medians. fio ran before the rounds (and on a disk, \
                 once more after them), not in each"
            ));
        }
        notes.push(X_QEMU_NOTE.into());
        notes.push(CPU_ROUND_TRIP_NOTE.into());
        let mut backends: Vec<_> = Vec::new();
        for row in &rows {
            if !backends.contains(&row.backend) {
                backends.push(row.backend);
            }
        }
        notes.extend(backends.iter().map(|b| format!("backend {}", b.describe())));
        if ram {
            notes.push(RAM_DISK_NOTE.into());
        }
        if null {
            notes.push(NULL_DISK_NOTE.into());
        }
        if rbd {
            notes.push(RBD_NOTE.into());
            let ours = context.librbd_cpus.map_or(String::new(), |cpus| format!(": CPUs {cpus} here"));
            notes.push(format!(
                "librbd's threads (its messengers and completion threads, which wake the IOCore): \
                 exitless's VMM rows' in the VMM's process and exitless vhost-user-blk's in the daemon's, \
                 each on its IOCore's CPU {iocore} (they take the CPUs of the RBD client thread, which \
                 exitless places there{ours}); QEMU's \
                 virtio-blk rows' on the IOCore's CPU {iocore} with QEMU's other non-vCPU threads; \
                 qemu-storage-daemon's on CPU {iocore} with the whole process; fio's on CPUs {vcpu},{iocore} \
                 with its job"
            ));
        }
        if markdown {
            notes
                .extend(rows.iter().filter_map(|r| r.command.as_ref().map(|c| format!("{}: `{c}`", r.mode))));
        }
        let title = format!(
            "blk, {disk} disk: {rw} {bs} B, queue depth {qd}, exitless's I/O modes against bare metal"
        );
        out += &Table { title, context: lines, header, rows: cells, notes }.render(markdown);
    }
    out
}
