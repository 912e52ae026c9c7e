#!/usr/bin/env python3
"""Guest against bare metal on a real file or block device, and one exitless build against another.

usage: scripts/parity.py BIN[@VCPU/IOCORE][,BIN...] TARGET ROUNDS [RW:BS:QD ...]

Runs, ROUNDS times in turn, the probe's block workload in `exitless run` for each binary (so an
old and a new build are measured side by side, under the same load) and fio on TARGET (a file
or a block device such as a `losetup --direct-io=on` loop device) with psync, libaio and
io_uring, O_DIRECT, allowed the CPUs the guest set-up uses (vCPU on 0, IOCore on 1, unless a
binary names others: `BIN@1/0` runs the vCPU on CPU 1 and the IOCore on CPU 0). Prints
medians, the best fio engine, each binary's ratio to it and its added p50 latency.
Workloads default to 4 KiB randread and randwrite at depth 1, 8 and 32 and 128 KiB sequential
reads at depth 4. Environment: MODE (exitless's --io-mode, default exitless), SECS (seconds
per run, default 2), HUGE=1 (guest memory and fio's buffers on 2 MiB huge pages: `--hugepages`
and `--iomem=shmhuge`; the host must have some reserved, /proc/sys/vm/nr_hugepages; without it,
fio's buffers for requests above 4 KiB still go on huge pages where some are free, as
`exitless bench` does, since guest RAM asks for transparent huge pages), BUSY=1 (fio
also runs with an idle-class spinner on each of its CPUs, so they stay busy as the guest set-up's
do but any other thread preempts the spinner at once: on a host that is itself a VM, an idle CPU
halts and leaves its physical core to the outer host, which may speed the disk up; a second line
gives the ratios to that run). It runs at the priority it was given: raising it (a nice -20
autogroup) also starves the kernel workers that finish requests on the IOCore's core, which cost
a loop device's reads at depth 1 a third of their rate. Other work on the machine disturbs the runs, and the
disk's speed drifts, so compare within a run. The guest writes to TARGET.
"""
import json
import os
import random
import statistics
import subprocess
import sys

WORKLOADS = ["randread:4096:1", "randread:4096:8", "randread:4096:32", "randwrite:4096:1",
             "randwrite:4096:8", "randwrite:4096:32", "read:131072:4"]
MODE = os.environ.get("MODE", "exitless")
SECS = float(os.environ.get("SECS", "2"))
HUGE = os.environ.get("HUGE") == "1"
BUSY = os.environ.get("BUSY") == "1"
FIO_CPUS = ["0", "1"]


def guest(spec, target, rw, bs, qd, expected_iops):
    """The probe's IOPS and p50 (µs), about SECS seconds of requests."""
    binary, _, cpus = spec.partition("@")
    vcpu, iocore = cpus.split("/") if cpus else ("0", "1")
    ops = max(2000, int(expected_iops * SECS))
    # A new seed each run, as fio's offsets are new each run: with a fixed one, a run reads the
    # blocks the run before it read, which lower layers may still cache.
    seed = random.getrandbits(63) | 1
    cmdline = f"probe.workload=blk probe.rw={rw} probe.qd={qd} probe.bs={bs} probe.ops={ops} probe.warmup=500 probe.seed={seed}"
    command = [binary, "run", "--probe", "--disk", f"path={target},direct", "--io-mode", MODE,
               "--iocore-cpu", iocore, "--pin-vcpu", vcpu, "--mem", "64M", "--cmdline", cmdline]
    if HUGE:
        command.append("--hugepages")
    out = subprocess.run(command, capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        try:
            result = json.loads(line)
        except ValueError:
            continue
        if result.get("probe") == "blk" and "iops" in result:
            return result["iops"], result["p50_ns"] / 1000
    return 0.0, 0.0


def fio(target, rw, bs, qd, engine):
    """fio's IOPS and total-latency p50 (µs)."""
    depth = 1 if engine == "psync" else qd
    command = ["fio", "--name=parity", f"--filename={target}", "--direct=1", f"--rw={rw}", f"--bs={bs}",
               f"--iodepth={depth}", f"--ioengine={engine}", "--time_based", f"--runtime={SECS}",
               f"--cpus_allowed={','.join(FIO_CPUS)}", "--lat_percentiles=1", "--output-format=json"]
    if HUGE or huge_buffers(bs, depth):
        command.append("--iomem=shmhuge")
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    stats = job["read"] if "read" in rw else job["write"]
    return stats["iops"], stats["lat_ns"]["percentile"]["50.000000"] / 1000


def kept_busy(run):
    """`run()` with an idle-class spinner on each of fio's CPUs."""
    spinners = [subprocess.Popen(["chrt", "-i", "0", "taskset", "-c", cpu, sys.executable, "-c", "while True: pass"])
                for cpu in FIO_CPUS]
    try:
        return run()
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def huge_buffers(bs, depth):
    """fio's buffers go on huge pages as `exitless bench` puts them: for requests larger than a
    page, when the guest's RAM gets transparent huge pages and enough reserved pages are free."""
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as policy:
        if bs <= 4096 or "[never]" in policy.read():
            return False
    with open("/proc/meminfo") as meminfo:
        free = next(int(line.split()[1]) for line in meminfo if line.startswith("HugePages_Free:"))
    return free >= -(-depth * bs // (2 << 20)) + 1


def median(runs, index):
    return statistics.median(run[index] for run in runs)


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    binaries, target, rounds = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3])
    for workload in sys.argv[4:] or WORKLOADS:
        rw, bs, qd = workload.split(":")
        bs, qd = int(bs), int(qd)
        engines = ["psync", "libaio", "io_uring"] if qd == 1 else ["libaio", "io_uring"]
        guests = {binary: [] for binary in binaries}
        hosts = {engine: [] for engine in engines}
        busy_hosts = {engine: [] for engine in engines}
        for _ in range(rounds):
            for binary in binaries:
                # Each binary's runs last about SECS at the rate it reached last time.
                expected = max(guests[binary][-1][0], 500.0) if guests[binary] else 20000.0
                guests[binary].append(guest(binary, target, rw, bs, qd, expected))
            for engine in engines:
                hosts[engine].append(fio(target, rw, bs, qd, engine))
                if BUSY:
                    busy_hosts[engine].append(kept_busy(lambda: fio(target, rw, bs, qd, engine)))
        best = max(engines, key=lambda engine: median(hosts[engine], 0))
        host_iops, host_p50 = median(hosts[best], 0), median(hosts[best], 1)
        every = " ".join(f"{engine} {median(runs, 0):.0f}" for engine, runs in hosts.items())
        print(f"{rw} {bs} B QD {qd}, {MODE}: fio {best} {host_iops:.0f} IOPS p50 {host_p50:.1f} µs ({every})")
        for binary, runs in guests.items():
            iops, p50 = median(runs, 0), median(runs, 1)
            each = ", ".join(f"{run[0]:.0f}" for run in runs)
            print(f"  {binary}: {iops:.0f} IOPS ({each}), p50 {p50:.1f} µs: "
                  f"{iops / host_iops:.3f}x, added {p50 - host_p50:+.1f} µs", flush=True)
        if BUSY:
            busy = max(engines, key=lambda engine: median(busy_hosts[engine], 0))
            busy_iops = median(busy_hosts[busy], 0)
            ratios = ", ".join(f"{binary} {median(runs, 0) / busy_iops:.3f}x" for binary, runs in guests.items())
            print(f"  fio with its CPUs kept busy: {busy} {busy_iops:.0f} IOPS; {ratios}", flush=True)


if __name__ == "__main__":
    main()
