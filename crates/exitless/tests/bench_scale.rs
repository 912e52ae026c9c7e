//! `exitless bench scale`: a short run of every set-up (one and two VMs, the mixed run) on RAM
//! disks, with real KVM, QEMU and qemu-storage-daemon; what each row carries, not how fast.
//! And the refusal of VM counts out of range.

use std::time::Duration;

use serde_json::Value;
use test_infra::{assert_one_line_error, exitless_within, stderr, stdout};

const SETUPS: [&str; 4] = ["shared-iocore", "iocore-per-vm", "qemu-iothread", "qemu-storage-daemon"];

#[test]
fn every_setup_reports_a_row_per_vm_count_and_the_mixed_run() {
    let _shared = test_infra::alongside_others();
    let out = exitless_within(
        Duration::from_secs(120),
        &[
            "bench",
            "scale",
            "--vms",
            "1,2",
            "--duration-ms",
            "200",
            "--warmup-ms",
            "400",
            "--disk-size",
            "64M",
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report: Value = serde_json::from_str(&stdout(&out)).expect("one JSON document");
    assert!(report["pinning"].as_str().unwrap().contains("CPU 0"), "the report says where things run");
    let rows = report["results"].as_array().unwrap();
    for setup in SETUPS {
        let of = |mixed: bool| -> Vec<&Value> {
            rows.iter().filter(|r| r["setup"] == setup && r["mixed"] == mixed).collect()
        };
        let uniform = of(false);
        assert_eq!(uniform.iter().map(|r| r["vms"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2], "{setup}");
        let mixed = of(true);
        assert_eq!(
            mixed.iter().map(|r| r["queue_depth"].as_u64().unwrap()).collect::<Vec<_>>(),
            [1, 32],
            "{setup}: the mixed run's two halves"
        );
        for row in uniform.iter().chain(&mixed) {
            assert!(row["note"].as_str().is_none_or(|n| !n.starts_with("not measured")), "{setup}: {row}");
            let jain = row["jain_fairness"].as_f64().unwrap();
            assert!(jain > 0.0 && jain <= 1.0 + 1e-9, "{setup}: {row}");
            let (min, max) =
                (row["per_vm_min_iops"].as_f64().unwrap(), row["per_vm_max_iops"].as_f64().unwrap());
            assert!(min <= max && row["aggregate_iops"].as_f64().unwrap() >= max, "{setup}: {row}");
            assert!(row["cpu_cores_used"].as_f64().unwrap() > 0.0, "{setup}: {row}");
            assert!(row["iops_per_core"].as_f64().unwrap() > 0.0, "{setup}: {row}");
            assert_eq!(
                row["per_vm_iops"].as_array().unwrap().len() as u64,
                row["group_vms"].as_u64().unwrap()
            );
            if !setup.starts_with("qemu") {
                // The exits the I/O path makes; a busy host adds its own interrupts and, after
                // each preemption of a vCPU, an emulated page fault (test_infra::io_path_exits).
                let causes = &row["exits_by_cause"];
                let on_path: f64 = ["mmio_exits", "io_exits", "halt_exits", "irq_injections"]
                    .iter()
                    .map(|name| causes[name].as_f64().unwrap_or(0.0))
                    .sum();
                assert!(on_path < 0.1, "{setup}: polling guests and an IOCore take no exit per I/O: {row}");
            }
        }
    }
}

#[test]
fn vm_counts_out_of_range_are_refused() {
    let _shared = test_infra::alongside_others();
    for vms in ["0", "100", "x"] {
        assert_one_line_error(&["bench", "scale", "--vms", vms], 2, "--vms");
    }
    assert_one_line_error(&["bench", "scale", "--mixed-qd", "1"], 2, "--mixed-qd");
}
