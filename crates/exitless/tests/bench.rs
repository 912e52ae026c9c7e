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
