//! `exitless bench`, the project's main job, end to end on its default scenario (shortened): the
//! three disks (a real disk in --scratch, the RAM disk and the null disk), every I/O mode, the fio
//! baselines and QEMU (with qemu-storage-daemon) as peers, in one JSON document; and the refusal
//! of a bad --scratch. One bench at a time, as in every suite that runs VMs: two at once share
//! this machine's two CPUs and its disk (a migration once took over 10 s while other benches
//! ran beside it).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use test_infra::{args, exitless, stderr, stdout};

#[test]
fn default_block_bench_with_qemu_peers_reports_every_row() {
    let _one = test_infra::one_at_a_time();
    // /tmp is on the root file system (ext4) here, as a scratch directory must be.
    let scratch = tempfile::tempdir_in("/tmp").unwrap();
    let plots = scratch.path().join("plots");
    let line = "bench --json --duration-ms 100 --warmup 200 --disk scratch=64M --disk ram=64M \
                --disk null=64M";
    let more = ["--scratch", scratch.path().to_str().unwrap(), "--plot", plots.to_str().unwrap()];
    let out = exitless(&args(line, &more));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report: Value = serde_json::from_str(&stdout(&out)).expect("one JSON document");
    let results = report["results"].as_array().unwrap();
    assert_eq!(results[0]["disk"], "file", "the real disk comes first");
    let mut files: Vec<String> =
        std::fs::read_dir(&plots).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    files.sort();
    let names = [
        "file-randread-4k-qd1.svg",
        "file-randread-4k-qd32.svg",
        "null-randread-4k-qd1.svg",
        "null-randread-4k-qd32.svg",
        "ram-randread-4k-qd1.svg",
        "ram-randread-4k-qd32.svg",
    ];
    assert_eq!(files, names, "one plot per disk and scenario");
    assert_eq!(report["disks"].as_array().unwrap().len(), 3, "{}", report["disks"]);
    for disk in ["file", "ram", "null"] {
        for qd in [1, 32] {
            let rows: Vec<&Value> =
                results.iter().filter(|r| r["queue_depth"] == qd && r["disk"] == disk).collect();
            let at = format!("{disk} qd {qd}");
            for mode in ["trap", "eventfd", "pv-eoi", "sidecore", "exitless", "adaptive"] {
                let row = rows.iter().find(|r| r["vmm"] == "exitless" && r["mode"] == mode).expect(mode);
                for field in [
                    "iops",
                    "p50_us",
                    "p99_us",
                    "added_latency_us",
                    "exits_per_io",
                    "bare_metal_iops",
                    "ratio_to_bare_metal",
                    "cpu_cores_used",
                    "cpu_round_trip_ns",
                ] {
                    assert!(row[field].is_number(), "{mode} {at}: {field} in {row}");
                }
                // QEMU has no peer of the RAM disk's memory copy; the others have theirs.
                assert_eq!(row["ratio_to_qemu"].is_number(), disk != "ram", "{mode} {at}: {row}");
                assert!(row["exits_by_cause"].is_object());
                let added = row["p50_us"].as_f64().unwrap() - row["added_latency_us"].as_f64().unwrap();
                let host = rows.iter().find(|r| r["vmm"] == "host").expect("the bare-metal baseline");
                assert!((added - host["p50_us"].as_f64().unwrap()).abs() < 1e-6, "{row} against {host}");
                // Only the RAM disk has a device speed (fio mmap) to compare with.
                assert_eq!(row["ratio_to_device"].is_number(), disk == "ram", "{at}: {row}");
            }
            let host = rows.iter().find(|r| r["vmm"] == "host").unwrap();
            assert!(host["mode"].as_str().unwrap().starts_with("bare metal (fio "), "{host}");
            let note = host["note"].as_str().unwrap();
            let engines: &[&str] = if disk == "null" {
                &["null engine"]
            } else {
                &["psync qd 1", "libaio qd", "io_uring qd", "won"]
            };
            for engine in engines {
                assert!(note.contains(engine), "{at}: {engine} in {note}");
            }
            assert!(host["command"].as_str().unwrap().contains("--cpus_allowed=0,1"), "{host}");
            assert_eq!(host["added_latency_us"], 0.0, "{host}");
            // A round trip between the guest set-up's CPUs belongs to the guests' rows only.
            assert!(host["cpu_round_trip_ns"].is_null(), "{host}");
            let device = rows.iter().find(|r| r["mode"] == "device (fio mmap)");
            assert_eq!(device.is_some(), disk == "ram", "{at}: the mmap row");
            if let Some(device) = device {
                assert!(device["iops"].as_f64().unwrap() > 0.0, "{device}");
                assert!(device["command"].as_str().unwrap().contains("--ioengine=mmap"), "{device}");
            }
            let qemu: Vec<&&Value> = rows.iter().filter(|r| r["vmm"] == "qemu").collect();
            assert_eq!(qemu.len(), 4, "{at}: QEMU's own device two ways, with our backend and with qsd");
            for row in &qemu {
                assert!(row["iops"].is_number() && row["exits_per_io"].is_number(), "{row}");
                assert!(row["added_latency_us"].is_number() && row["cpu_cores_used"].is_number(), "{row}");
                assert!(row["cpu_round_trip_ns"].as_f64().unwrap() > 0.0, "{row}");
                assert!(row["command"].as_str().unwrap().contains("qemu-system-x86_64 -M microvm"), "{row}");
            }
            let qsd_mode = match disk {
                "null" => "qemu + qemu-storage-daemon null-co, poll",
                _ => "qemu + qemu-storage-daemon, poll",
            };
            let qsd = qemu.iter().find(|r| r["mode"] == qsd_mode).expect("qsd");
            assert_eq!(qsd["device"], "vhost-user-blk");
            let command = qsd["command"].as_str().unwrap();
            assert!(command.starts_with("taskset -c 1 qemu-storage-daemon --blockdev"), "{command}");
            let block = if disk == "null" { "driver=null-co" } else { "cache.direct=on" };
            assert!(command.contains("iothread=iothread0") && command.contains(block), "{command}");
        }
    }
    x_qemu_pairs_the_same_backend(results);
    assert!(report["qemu_version"].as_str().unwrap().contains("QEMU"));
    assert!(report["qemu_storage_daemon_version"].as_str().unwrap().contains("qemu-storage-daemon"));
    // One progress line per run, each with the time left.
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("] ") && l.ends_with(" left)")).collect();
    let total = lines.len();
    assert!(total > 40, "{err}");
    assert!(
        lines[0].starts_with(&format!("exitless bench: [1/{total}] bare metal, fio psync, file,")),
        "{err}"
    );
}

/// A mount this test made, unmounted when dropped.
struct Mount(PathBuf);

impl Mount {
    fn new(args: &[&str], at: &Path) -> Mount {
        let status = Command::new("mount").args(args).arg(at).status().expect("run mount");
        assert!(status.success(), "mount {args:?} {}", at.display());
        Mount(at.to_path_buf())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// `exitless bench` with `--scratch dir` (a real disk asked for) must stop at once with status 2
/// and one line that names the problem.
fn refused(dir: &Path, wanted: &str) {
    let out = exitless(&["bench", "--json", "--scratch", dir.to_str().unwrap()]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains("--scratch") && err.contains(wanted), "{wanted} in {err}");
    assert!(stdout(&out).is_empty());
}

#[test]
fn a_bad_scratch_directory_is_refused_on_one_line() {
    let _shared = test_infra::alongside_others();
    let base = tempfile::tempdir_in("/tmp").unwrap();
    refused(&base.path().join("missing"), "no such directory");
    let file = base.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    refused(&file, "not a directory");

    // Read-only: root writes through permissions, so a read-only bind mount of an ext4 directory.
    let ro = base.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    let _bind = Mount::new(&["--bind", ro.to_str().unwrap()], &ro);
    let remount = Command::new("mount").args(["-o", "remount,bind,ro"]).arg(&ro).status().unwrap();
    assert!(remount.success(), "remount {} read-only", ro.display());
    refused(&ro, "read-only");

    let memory = base.path().join("tmpfs");
    std::fs::create_dir(&memory).unwrap();
    let _tmpfs = Mount::new(&["-t", "tmpfs", "-o", "size=1M", "tmpfs"], &memory);
    refused(&memory, "tmpfs");
}

/// The scratch directory matters only when a real disk is asked for.
#[test]
fn a_ram_disk_alone_needs_no_scratch_directory() {
    let _one = test_infra::one_at_a_time();
    let line = "bench --json --disk ram=16M --scratch /nonexistent/exitless --modes exitless --qd 1 \
                --peers none --no-baseline --duration-ms 20 --warmup 10";
    let report = bench_report(&args(line, &[]));
    assert_eq!(report["results"][0]["disk"], "ram");
}

/// `--rounds 3`: every guest row, exitless's and QEMU's, ran three times and is reported by its
/// median run, with each round's IOPS; fio's rows ran once.
#[test]
fn rounds_report_every_guest_row_by_its_median_run() {
    let _one = test_infra::one_at_a_time();
    let line = "bench --json --disk null=16M --modes exitless,adaptive --qd 1 --rounds 3 \
                --duration-ms 20 --warmup 10";
    let report = bench_report(&args(line, &[]));
    let results = report["results"].as_array().unwrap();
    let guests: Vec<&Value> = results.iter().filter(|r| r["vmm"] != "host").collect();
    // exitless's two modes and QEMU's four configurations, once each.
    assert_eq!(guests.len(), 6, "{results:#?}");
    assert!(guests.iter().any(|r| r["vmm"] == "qemu"));
    for row in guests {
        let rounds: Vec<f64> =
            row["round_iops"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        assert_eq!(rounds.len(), 3, "{row}");
        let mut sorted = rounds.clone();
        sorted.sort_by(f64::total_cmp);
        assert_eq!(row["iops"].as_f64(), Some(sorted[1]), "{row}: not the median of {rounds:?}");
    }
    let host = results.iter().find(|r| r["vmm"] == "host").expect("fio's row");
    assert!(host.get("round_iops").is_none(), "{host}");
}

/// A block device measures like a file: its size comes from the device (its metadata length is
/// 0), fio's baseline runs on it, and every VMM serves it (qemu-storage-daemon needs its
/// `host_device` driver for it).
#[test]
fn block_bench_measures_a_block_device_in_every_vmm() {
    let _one = test_infra::one_at_a_time();
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let file = test_infra::disk_file(dir.path(), "loop.img", 16 << 20);
    let device = test_infra::LoopDevice::attach(&file);
    let disk = format!("path={},direct", device.path.display());
    let line = "bench --json --modes exitless --qd 1 --duration-ms 100 --warmup 10";
    let report = bench_report(&args(line, &["--disk", &disk]));
    let results = report["results"].as_array().unwrap();
    let mut modes: Vec<&str> = results.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    modes.sort_unstable();
    assert_eq!(modes.len(), 6, "bare metal, exitless and QEMU's four set-ups: {modes:?}");
    assert!(modes.contains(&"qemu + qemu-storage-daemon, poll"), "{modes:?}");
    for row in results {
        assert!(row["iops"].as_f64().is_some_and(|iops| iops > 0.0), "not measured: {row}");
        assert_eq!(row["backend"], "block-device-direct", "{row}");
    }
    x_qemu_pairs_the_same_backend(results);
}

/// At the queue size, 256 requests in flight, every VMM serves the probe: exitless's device and
/// QEMU's virtio-blk and vhost-user-blk (with exitless's backend) all take one indirect table per
/// request, and each row reports that depth.
#[test]
fn block_bench_at_the_queue_size_runs_in_every_vmm() {
    let _one = test_infra::one_at_a_time();
    let line = "bench --json --qd 256 --modes exitless --duration-ms 100 --warmup 200 --disk ram=64M";
    let report = bench_report(&args(line, &[]));
    let results = report["results"].as_array().unwrap();
    let guests: Vec<&Value> = results.iter().filter(|r| r["vmm"] != "host").collect();
    assert_eq!(guests.len(), 5, "exitless and QEMU's four set-ups: {results:?}");
    for row in guests {
        assert_eq!(row["queue_depth"], 256, "{row}");
        assert!(row["iops"].as_f64().unwrap() > 0.0, "{row}");
    }
}

/// `--plot DIR` draws each scenario of a real (short) run: one SVG per scenario, named after it,
/// holding every row's label, the axes and the exit causes the run measured.
#[test]
fn block_bench_plots_one_svg_per_scenario() {
    let _one = test_infra::one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let plots = dir.path().join("plots/new");
    let line = "bench --json --disk ram=64M --qd 1,4 --modes exitless,trap --duration-ms 100 \
                --warmup 200 --peers none";
    let report = bench_report(&args(line, &["--plot", plots.to_str().unwrap()]));
    let results = report["results"].as_array().unwrap();
    let mut files: Vec<String> =
        std::fs::read_dir(&plots).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    files.sort();
    assert_eq!(files, ["randread-4k-qd1.svg", "randread-4k-qd4.svg"]);
    for qd in [1, 4] {
        let svg = std::fs::read_to_string(plots.join(format!("randread-4k-qd{qd}.svg"))).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
        assert!(svg.contains(&format!("queue depth {qd}")), "the scenario in the title");
        for text in ["bare metal (fio", "(bare metal)", "exitless exitless", "exitless trap"] {
            assert!(svg.contains(text), "qd {qd}: `{text}` in the plot");
        }
        for text in ["IOPS", "exits per I/O", "latency (µs)", "p50", "p99"] {
            assert!(svg.contains(text), "qd {qd}: axis or legend `{text}`");
        }
        let rows = results.iter().filter(|r| r["queue_depth"] == qd);
        for row in rows {
            for cause in row["exits_by_cause"].as_object().unwrap().keys() {
                assert!(svg.contains(cause.as_str()), "qd {qd}: cause {cause} in the legend");
            }
        }
    }
    let trap = results.iter().find(|r| r["mode"] == "trap").unwrap();
    assert!(trap["exits_by_cause"].as_object().unwrap().contains_key("mmio_exits"), "{trap}");

    // A path that cannot be a directory: one line of error before anything runs.
    let file = dir.path().join("file");
    std::fs::write(&file, b"").unwrap();
    let bad = file.join("plots");
    let out = exitless(&["bench", "--disk", "ram=64M", "--peers", "none", "--plot", bad.to_str().unwrap()]);
    assert_ne!(out.status.code(), Some(0));
    let message = stderr(&out);
    assert!(
        message.contains("--plot: cannot create the directory") && message.trim().lines().count() == 1,
        "{message}"
    );
}

/// QEMU's own configurations (its virtio-blk, qemu-storage-daemon), the rows "x QEMU" divides
/// by; not QEMU with exitless's vhost-user backend.
fn is_qemu_own(row: &Value) -> bool {
    row["vmm"] == "qemu" && !row["mode"].as_str().unwrap().contains("exitless")
}

/// Every row names its backend, and every "x QEMU" divides the row's IOPS by the best of QEMU's
/// own rows on the same backend in the same scenario; a row with no such QEMU row has none.
fn x_qemu_pairs_the_same_backend(results: &[Value]) {
    let scenario = |r: &Value| {
        [&r["disk"], &r["workload"], &r["block_size"], &r["queue_depth"]].map(|v| v.to_string()).join(" ")
    };
    for row in results {
        let backend = row["backend"].as_str().unwrap_or_else(|| panic!("no backend: {row}"));
        let best = results
            .iter()
            .filter(|r| is_qemu_own(r) && scenario(r) == scenario(row) && r["backend"] == backend)
            .filter_map(|r| r["iops"].as_f64())
            .fold(None, |best: Option<f64>, v| Some(best.map_or(v, |b| b.max(v))));
        match (row["iops"].as_f64(), best) {
            (Some(iops), Some(best)) => {
                let ratio = row["ratio_to_qemu"].as_f64().unwrap_or_else(|| panic!("no x QEMU: {row}"));
                assert!(
                    (ratio - iops / best).abs() <= 1e-9 * ratio.abs(),
                    "{ratio} for {iops} / {best}: {row}"
                );
            }
            _ => assert!(row["ratio_to_qemu"].is_null(), "no {backend} QEMU row to compare with: {row}"),
        }
    }
}

/// Null against null: on the null disk, QEMU's own virtio-blk (both completions) and
/// qemu-storage-daemon run on QEMU's null device (null-co, read-zeroes=on), fio on its null
/// engine, and exitless's "x QEMU" divides by the best null-co row. On the RAM disk (a memory
/// copy, which QEMU has no peer for) exitless's rows and fio mmap have no x QEMU, and QEMU's rows
/// read the file through io_uring (tmpfs-direct) and compare only with each other.
#[test]
fn x_qemu_pairs_rows_on_the_same_backend() {
    let _one = test_infra::one_at_a_time();
    let line = "bench --json --disk ram=64M --disk null=64M --modes exitless --qd 1 --duration-ms 100 \
                --warmup 200";
    let report = bench_report(&args(line, &[]));
    let results = report["results"].as_array().unwrap();
    x_qemu_pairs_the_same_backend(results);
    let row = |disk: &str, mode: &str| {
        results
            .iter()
            .find(|r| r["disk"] == disk && r["mode"] == mode)
            .unwrap_or_else(|| panic!("{disk} {mode} in {results:?}"))
    };
    let iops = |r: &Value| r["iops"].as_f64().filter(|&v| v > 0.0).unwrap_or_else(|| panic!("{r}"));

    let null_co = [
        "qemu virtio-blk null-co, interrupt",
        "qemu virtio-blk null-co, poll",
        "qemu + qemu-storage-daemon null-co, poll",
    ];
    let mut best = 0.0f64;
    for name in null_co {
        let qemu = row("null", name);
        assert_eq!(qemu["backend"], "null", "{qemu}");
        best = best.max(iops(qemu));
        let command = qemu["command"].as_str().unwrap();
        assert!(command.contains("driver=null-co") && command.contains("read-zeroes=on"), "{command}");
        assert!(!command.contains("/dev/shm"), "no file behind a null device: {command}");
    }
    for mode in ["exitless", "qemu + exitless vhost-user-blk, poll"] {
        let ours = row("null", mode);
        assert_eq!(ours["backend"], "null", "exitless's null disk: {ours}");
        let ratio = ours["ratio_to_qemu"].as_f64().unwrap_or_else(|| panic!("no x QEMU: {ours}"));
        assert!((ratio - iops(ours) / best).abs() <= 1e-9 * ratio, "{ratio} is not {} / {best}", iops(ours));
    }
    let host = row("null", "bare metal (fio null)");
    let command = host["command"].as_str().unwrap();
    assert_eq!(host["backend"], "null", "{host}");
    assert!(command.contains("--ioengine=null") && !command.contains("--filename"), "{command}");
    let null_modes: Vec<&str> =
        results.iter().filter(|r| r["disk"] == "null").map(|r| r["mode"].as_str().unwrap()).collect();
    assert_eq!(null_modes.len(), 6, "fio null, exitless, QEMU's four set-ups: {null_modes:?}");
    assert!(!null_modes.iter().any(|m| m.contains("fio psync") || m.contains("mmap")), "{null_modes:?}");

    for mode in ["exitless", "qemu + exitless vhost-user-blk, poll", "device (fio mmap)"] {
        let ram = row("ram", mode);
        assert_eq!(ram["backend"], "ram", "a memory copy: {ram}");
        iops(ram);
        assert!(ram["ratio_to_qemu"].is_null(), "QEMU has no peer of the RAM disk's copy: {ram}");
    }
    for name in ["qemu virtio-blk, interrupt", "qemu virtio-blk, poll", "qemu + qemu-storage-daemon, poll"] {
        let qemu = row("ram", name);
        assert_eq!(qemu["backend"], "tmpfs-direct", "QEMU on the RAM disk's file: {qemu}");
        assert!(qemu["ratio_to_qemu"].as_f64().is_some_and(|r| r > 0.0 && r <= 1.0), "{qemu}");
    }
    assert!(
        !results.iter().any(|r| r["disk"] == "ram" && r["mode"].as_str().unwrap().contains("null-co")),
        "null-co is the null disk's peer, not the RAM disk's"
    );
    let host = results.iter().find(|r| r["disk"] == "ram" && r["vmm"] == "host").unwrap();
    assert_eq!(host["backend"], "tmpfs-direct", "fio reads the file with O_DIRECT: {host}");
}

/// `--backends`: each kind of disk gets its own tables, every row on it names the backend it
/// ended up on, fio runs with the disk's caching (O_DIRECT or not), QEMU with the matching cache
/// mode, and "x QEMU" pairs the same backend; write+FLUSH pairs count both requests.
#[test]
fn the_backend_matrix_runs_every_kind_with_matching_caching() {
    let _one = test_infra::one_at_a_time();
    let (report, _scratch) = backend_matrix_report("all", "50");
    let results = report["results"].as_array().unwrap();
    // (disk, exitless's backend, fio's and QEMU's own --direct / cache mode).
    let kinds = [
        ("direct", "file-direct", true),
        ("buffered", "file-buffered", false),
        ("cold", "file-buffered", false),
        ("tmpfs", "tmpfs-buffered", false),
        ("loop", "block-device-direct", true),
    ];
    for (disk, backend, direct) in kinds {
        for workload in ["randread", "writeflush"] {
            let rows: Vec<&Value> =
                results.iter().filter(|r| r["disk"] == disk && r["workload"] == workload).collect();
            let at = format!("{disk} {workload}");
            let ours = rows.iter().find(|r| r["vmm"] == "exitless").unwrap_or_else(|| panic!("{at}"));
            assert_eq!(ours["backend"], backend, "{at}: {ours}");
            assert!(ours["iops"].as_f64().is_some_and(|v| v > 0.0), "{at}: {ours}");
            let host = rows.iter().find(|r| r["vmm"] == "host").unwrap_or_else(|| panic!("{at}"));
            assert_eq!(host["backend"], backend, "fio with the disk's caching, {at}: {host}");
            let command = host["command"].as_str().unwrap();
            assert!(command.contains(&format!("--direct={}", u8::from(direct))), "{at}: {command}");
            let caching = if direct { "O_DIRECT" } else { "through the page cache" };
            assert!(host["note"].as_str().unwrap().contains(caching), "the note says so, {at}: {host}");
            // The bench, not fio, decides what the page cache holds when a run starts.
            assert!(command.contains("--invalidate=0"), "{at}: {command}");
            if workload == "writeflush" {
                assert!(command.contains("--fdatasync=1") && command.contains("--rw=randwrite"), "{command}");
            }
            let qemu =
                rows.iter().find(|r| r["mode"] == "qemu virtio-blk, poll").unwrap_or_else(|| panic!("{at}"));
            assert_eq!(qemu["backend"], backend, "QEMU on the same backend, {at}: {qemu}");
            let cache = if direct { "cache=none" } else { "cache=writeback" };
            assert!(qemu["command"].as_str().unwrap().contains(cache), "{at}: {}", qemu["command"]);
            assert!(ours["ratio_to_qemu"].as_f64().is_some(), "{at}: x QEMU against the same backend");
        }
    }
    let describe = |label: &str| {
        let disks = report["disks"].as_array().unwrap();
        let disk = disks.iter().find(|d| d["disk"] == label).unwrap_or_else(|| panic!("{label}"));
        disk["describe"].as_str().unwrap().to_owned()
    };
    assert!(describe("buffered").ends_with(", read into the host's page cache before every run"));
    assert!(describe("cold").ends_with(", its pages dropped from the host's page cache before every run"));
    let ram = results.iter().find(|r| r["disk"] == "ram" && r["vmm"] == "exitless").expect("ram");
    assert_eq!(ram["backend"], "ram", "{ram}");
    assert!(ram["ratio_to_qemu"].is_null(), "no QEMU peer of a memory copy: {ram}");
    for workload in ["randread", "writeflush"] {
        let null = |mode: &str| {
            results
                .iter()
                .find(|r| r["disk"] == "null" && r["workload"] == workload && r["mode"] == mode)
                .unwrap_or_else(|| panic!("null {workload} {mode}"))
        };
        let ours = null("exitless");
        assert_eq!(ours["backend"], "null", "{ours}");
        assert!(ours["ratio_to_qemu"].as_f64().is_some(), "x QEMU against null-co: {ours}");
        let host = null("bare metal (fio null)");
        assert!(host["command"].as_str().unwrap().contains("--ioengine=null"), "{host}");
        assert_eq!(null("qemu virtio-blk null-co, poll")["backend"], "null");
    }
}

/// `exitless bench --backends BACKENDS` on 64 MiB disks in exitless mode: random reads and
/// write+FLUSH at depth 1, each run `ms` milliseconds after as long a warm-up, its scratch files
/// in a new directory under /var/tmp. Every "x QEMU" pairs rows on one backend. Returns the
/// report and that directory.
fn backend_matrix_report(backends: &str, ms: &str) -> (Value, tempfile::TempDir) {
    let scratch = tempfile::tempdir_in("/var/tmp").unwrap();
    let line = "bench --json --backend-size 64M --modes exitless --rw randread,writeflush --qd 1";
    let more = ["--backends", backends, "--duration-ms", ms, "--warmup", ms, "--scratch"];
    let report = bench_report(&args(line, &[&more[..], &[scratch.path().to_str().unwrap()]].concat()));
    x_qemu_pairs_the_same_backend(report["results"].as_array().unwrap());
    (report, scratch)
}

/// `exitless ARGS` (a `bench ... --json`), which must succeed: its one JSON document.
fn bench_report(args: &[&str]) -> Value {
    let out = exitless(args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).expect("one JSON document")
}

/// Whether process `pid` still runs.
fn alive(pid: u64) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// `--backends rbd` on a cluster the bench starts: every row is on the image (fio's rbd engine,
/// QEMU's driver=rbd in its virtio-blk and in qemu-storage-daemon, exitless's rbd= disk in the
/// VMM and in its vhost-user daemon), "x QEMU" divides only by QEMU's own rbd rows, the report
/// names the cluster's daemons and where they may run, and the cluster is gone afterwards.
#[test]
fn the_rbd_backend_pairs_only_with_rbd_peers_on_a_cluster_the_bench_starts() {
    let _one = test_infra::one_at_a_time();
    let (report, scratch) = backend_matrix_report("rbd", "100");
    let results = report["results"].as_array().unwrap();
    let ceph = &report["ceph"];
    assert_eq!(ceph["started_by_bench"], true, "{ceph}");
    let daemons = ceph["daemons"].as_array().unwrap();
    let names: Vec<&str> = daemons.iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["mon.a", "osd.0"], "{ceph}");
    let describe = report["disks"][0]["describe"].as_str().unwrap();
    for daemon in daemons {
        let pid = daemon["pid"].as_u64().unwrap();
        assert!(!alive(pid), "the cluster is down after the bench: {daemon}");
        assert!(!daemon["cpus"].as_str().unwrap().is_empty(), "{daemon}");
        let named = format!(
            "{} pid {pid} on CPUs {}",
            daemon["name"].as_str().unwrap(),
            daemon["cpus"].as_str().unwrap()
        );
        assert!(describe.contains(&named), "{named} in {describe}");
    }
    let left: Vec<_> = std::fs::read_dir(scratch.path()).unwrap().collect();
    assert!(left.is_empty(), "the cluster's directory is removed: {left:?}");
    for workload in ["randread", "writeflush"] {
        let rows: Vec<&Value> = results.iter().filter(|r| r["workload"] == workload).collect();
        let mode = |mode: &str| {
            rows.iter().find(|r| r["mode"] == mode).unwrap_or_else(|| panic!("{workload} {mode} in {rows:?}"))
        };
        assert_eq!(rows.len(), 6, "fio, exitless, QEMU's four set-ups: {rows:?}");
        for row in &rows {
            assert_eq!((&row["disk"], &row["backend"]), (&"rbd".into(), &"rbd".into()), "{row}");
            assert!(row["iops"].as_f64().is_some_and(|v| v > 0.0), "{row}");
            let note = row["note"].as_str().unwrap_or_default();
            assert!(note.contains("the cluster's OSD and monitor"), "the cluster's CPU in the note: {row}");
        }
        let host = rows.iter().find(|r| r["vmm"] == "host").unwrap();
        assert!(host["mode"].as_str().unwrap().starts_with("bare metal (fio rbd"), "{host}");
        let command = host["command"].as_str().unwrap();
        assert!(
            command.starts_with("CEPH_CONF=") && command.contains("CEPH_ARGS=--rbd_cache=false fio "),
            "{command}"
        );
        assert!(command.contains("--ioengine=rbd") && command.contains("--cpus_allowed=0,1"), "{command}");
        if workload == "writeflush" {
            assert!(command.contains("--rw=randwrite --fsync=1"), "{command}");
        }
        let note = host["note"].as_str().unwrap();
        assert!(note.contains("rbd qd 1") && note.contains("rbd busy_poll qd 1"), "both ways: {note}");
        for qemu in
            ["qemu virtio-blk, interrupt", "qemu virtio-blk, poll", "qemu + qemu-storage-daemon, poll"]
        {
            let row = mode(qemu);
            let command = row["command"].as_str().unwrap();
            assert!(command.contains("driver=rbd,") && command.contains(",cache.direct=on"), "{command}");
            assert!(!command.contains("aio=io_uring"), "no file behind it: {command}");
        }
        let qsd = mode("qemu + qemu-storage-daemon, poll")["command"].as_str().unwrap();
        assert!(qsd.starts_with("taskset -c 1 qemu-storage-daemon --blockdev driver=rbd,"), "{qsd}");
        let ours = mode("qemu + exitless vhost-user-blk, poll");
        assert_eq!(ours["device"], "vhost-user-blk", "{ours}");
        let ours = mode("exitless");
        assert!(ours["ratio_to_qemu"].as_f64().is_some() && ours["ratio_to_bare_metal"].as_f64().is_some());
    }
}

/// `--backends rbd --ceph-conf FILE`: the image goes into that cluster and is removed at the
/// end; the cluster stays, and the bench reports no daemons of its own. A missing file is a
/// mistake on the command line.
#[test]
fn the_rbd_backend_runs_on_a_given_cluster_and_leaves_it_as_it_was() {
    let _one = test_infra::one_at_a_time();
    let cluster = storage::testing::ceph::TestCluster::get();
    let conf = cluster.conf().to_str().unwrap();
    let images_before = cluster.rbd(&["ls", "rbd"]);
    let line = "bench --json --backends rbd --backend-size 16M --modes exitless --rw randwrite --qd 1 \
                --peers none --duration-ms 50 --warmup 50 --scratch /nonexistent/exitless";
    let report = bench_report(&args(line, &["--ceph-conf", conf]));
    assert_eq!(report["ceph"]["started_by_bench"], false, "{}", report["ceph"]);
    assert_eq!(report["ceph"]["daemons"], serde_json::json!([]));
    let image = report["ceph"]["image"].as_str().unwrap();
    assert!(report["disks"][0]["describe"].as_str().unwrap().contains(&format!("--ceph-conf {conf}")));
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "fio and exitless: {results:?}");
    for row in results {
        assert_eq!(row["backend"], "rbd", "{row}");
        assert!(row["iops"].as_f64().is_some_and(|v| v > 0.0), "{row}");
    }
    assert_eq!(cluster.rbd(&["ls", "rbd"]), images_before, "{image} is removed");

    let out = exitless(&["bench", "--backends", "rbd", "--ceph-conf", "/nonexistent/ceph.conf"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains("--ceph-conf /nonexistent/ceph.conf: No such file"), "{err}");
}

/// `exitless bench migrate` on two modes, over both transports (a Unix socket; TCP with mutual
/// TLS between two simulated hosts) and both loads: its report's fields are sane counts (not
/// speeds), each row names its transport and load, and the verify passed on the destination.
#[test]
fn migrate_bench_reports_rounds_pages_and_downtime() {
    let _one = test_infra::one_at_a_time();
    let report = bench_report(&["bench", "migrate", "--json", "--modes", "eventfd,exitless"]);
    assert_eq!(report["bench"], "migrate");
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 8, "{report}");
    for transport in ["unix", "tcp+tls"] {
        for load in ["idle", "io"] {
            for mode in ["eventfd", "exitless"] {
                let found = results
                    .iter()
                    .any(|r| r["transport"] == transport && r["load"] == load && r["mode"] == mode);
                assert!(found, "no row for {transport}, {load}, {mode}: {report}");
            }
        }
    }
    for row in results {
        assert_eq!(row["verify"], "passed", "{row}");
        let rounds = row["rounds"].as_u64().unwrap();
        // Round 0 and at least one round of dirty pages, the last at most 1024 pages (or 30
        // rounds).
        assert!(rounds >= 2, "{row}");
        let pages: Vec<u64> =
            row["pages_per_round"].as_array().unwrap().iter().map(|p| p.as_u64().unwrap()).collect();
        assert_eq!(pages.len() as u64, rounds + 1, "{row}");
        assert!(pages[0] > 0, "{row}");
        assert!(pages[rounds as usize - 1] <= 1024 || rounds == 30, "pre-copy did not converge: {row}");
        let downtime = row["downtime_ms"].as_f64().unwrap();
        let pause = row["pause_ms"].as_f64().unwrap();
        // A pause drains the disk and parks the vCPUs: it takes time, all of it in the downtime.
        assert!(pause > 0.0 && pause <= downtime, "{row}");
        // Under I/O, the verify's requests go on through pre-copy: device writes only the
        // devices' log sees (the idle guest reads its gate only every 50 ms).
        if row["load"] == "io" {
            assert!(row["device_dirty_pages"].as_u64().unwrap() > 0, "{row}");
        }
        let parts = ["pause_ms", "final_send_ms", "destination_ms"].map(|k| row[k].as_f64().unwrap());
        assert!(parts.iter().sum::<f64>() <= downtime, "the downtime's parts exceed it: {row}");
        assert!(row["total_ms"].as_f64().unwrap() >= downtime, "{row}");
        assert!(row["bytes"].as_u64().unwrap() >= pages.iter().sum::<u64>() * 4096, "{row}");
        println!(
            "{} {} {}: downtime {downtime:.3} ms, {rounds} rounds, pages {pages:?}",
            row["transport"], row["load"], row["mode"]
        );
    }
}
