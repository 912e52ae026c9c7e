//! `exitless bench`, the project's main job, end to end on its default scenario (shortened):
//! every I/O mode, the fio baseline and QEMU as a peer, in one JSON document.

mod common;

use common::{exitless, stderr, stdout};
use serde_json::Value;

#[test]
fn default_block_bench_with_qemu_peers_reports_every_row() {
    let out = exitless(&["bench", "--json", "--duration-ms", "100", "--warmup", "200", "--disk", "ram=64M"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report: Value = serde_json::from_str(&stdout(&out)).expect("one JSON document");
    let results = report["results"].as_array().unwrap();
    for qd in [1, 32] {
        let rows: Vec<&Value> = results.iter().filter(|r| r["queue_depth"] == qd).collect();
        for mode in ["trap", "eventfd", "pv-eoi", "sidecore", "exitless", "adaptive"] {
            let row = rows.iter().find(|r| r["vmm"] == "exitless" && r["mode"] == mode).expect(mode);
            for field in [
                "iops",
                "p50_us",
                "p99_us",
                "exits_per_io",
                "bare_metal_iops",
                "ratio_to_bare_metal",
                "cpu_cores_used",
            ] {
                assert!(row[field].is_number(), "{mode} qd {qd}: {field} in {row}");
            }
            assert!(row["exits_by_cause"].is_object());
            assert!(row["ratio_to_qemu"].is_number(), "{row}");
        }
        assert!(rows.iter().any(|r| r["vmm"] == "host"), "the bare-metal baseline");
        let qemu: Vec<&&Value> = rows.iter().filter(|r| r["vmm"] == "qemu").collect();
        assert_eq!(qemu.len(), 3, "QEMU's own device two ways and with our vhost-user backend");
        for row in qemu {
            assert!(row["iops"].is_number() && row["exits_per_io"].is_number(), "{row}");
            assert!(row["command"].as_str().unwrap().contains("qemu-system-x86_64 -M microvm"), "{row}");
        }
    }
    assert!(report["qemu_version"].as_str().unwrap().contains("QEMU"));
}

/// At the queue size, 256 requests in flight, every VMM serves the probe: exitless's device and
/// QEMU's virtio-blk and vhost-user-blk (with exitless's backend) all take one indirect table per
/// request, and each row reports that depth.
#[test]
fn block_bench_at_the_queue_size_runs_in_every_vmm() {
    let out = exitless(&[
        "bench",
        "--json",
        "--qd",
        "256",
        "--modes",
        "exitless",
        "--duration-ms",
        "100",
        "--warmup",
        "200",
        "--disk",
        "ram=64M",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report: Value = serde_json::from_str(&stdout(&out)).expect("one JSON document");
    let results = report["results"].as_array().unwrap();
    let guests: Vec<&Value> = results.iter().filter(|r| r["vmm"] != "host").collect();
    assert_eq!(guests.len(), 4, "exitless and QEMU's three set-ups: {results:?}");
    for row in guests {
        assert_eq!(row["queue_depth"], 256, "{row}");
        assert!(row["iops"].as_f64().unwrap() > 0.0, "{row}");
    }
}

/// `--plot DIR` draws each scenario of a real (short) run: one SVG per scenario, named after it,
/// holding every row's label, the axes and the exit causes the run measured.
#[test]
fn block_bench_plots_one_svg_per_scenario() {
    let dir = tempfile::tempdir().unwrap();
    let plots = dir.path().join("plots/new");
    let out = exitless(&[
        "bench",
        "--json",
        "--disk",
        "ram=64M",
        "--qd",
        "1,4",
        "--modes",
        "exitless,trap",
        "--duration-ms",
        "100",
        "--warmup",
        "200",
        "--peers",
        "none",
        "--plot",
        plots.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report: Value = serde_json::from_str(&stdout(&out)).expect("one JSON document");
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
