#!/usr/bin/env python3
"""What adding and removing disks through the control API costs the other disks' guests.

One `exitless vhost-user-blk --api-socket` serves a RAM disk to an exitless VM (the probe,
reading 4 KiB blocks at depth 1 for DURATION seconds, polling). Three runs, one after another:
  quiet: nothing else happens;
  get:   an API client sends GET /disks twice every 20 ms;
  churn: the client adds a second disk (an O_DIRECT file) and removes it, every 20 ms.
The get run shows what any API client's CPU costs on a small host; the churn run what adding
and removing costs beyond that. Prints one Markdown row per run: the guest's IOPS and latency
percentiles, and the client's pairs and slowest pair.

    scripts/api-churn.py [--binary target/release/exitless] [--seconds 4] [--rounds 1]
"""

import argparse
import json
import os
import socket
import subprocess
import tempfile
import threading
import time


def call(api, method, path, body=""):
    s = socket.socket(socket.AF_UNIX)
    s.connect(api)
    s.sendall(f"{method} {path} HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode())
    answer = b""
    while chunk := s.recv(65536):
        answer += chunk
    s.close()
    return int(answer.split(b" ")[1])


def client(api, mode, stop, directory, out):
    pairs, slowest = 0, 0.0
    disk = json.dumps({"socket": f"{directory}/b.sock", "path": f"{directory}/b.img", "direct": True})
    while not stop.is_set():
        start = time.monotonic()
        if mode == "churn":
            assert call(api, "PUT", "/disks/b", disk) == 201
            assert call(api, "DELETE", "/disks/b") == 204
        else:
            call(api, "GET", "/disks")
            call(api, "GET", "/disks")
        slowest = max(slowest, time.monotonic() - start)
        pairs += 1
        time.sleep(0.02)
    out.update(pairs=pairs, slowest_ms=slowest * 1e3)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", default="target/release/exitless")
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        api = f"{d}/api.sock"
        with open(f"{d}/b.img", "wb") as f:
            f.truncate(64 << 20)
        # The churned disk's file is in d: the API opens files only in an --api-disk-dir.
        daemon = subprocess.Popen([args.binary, "vhost-user-blk", "--api-socket", api, "--api-disk-dir", d],
                                  stderr=subprocess.DEVNULL)
        try:
            while not os.path.exists(api):
                time.sleep(0.01)
            assert call(api, "PUT", "/disks/a", json.dumps({"socket": f"{d}/a.sock", "ram": "64M"})) == 201
            print("| run | client pairs | slowest pair (ms) | guest IOPS | p50 (us) | p99 (us) | p99.9 (us) | max (us) |")
            print("|---|---|---|---|---|---|---|---|")
            for _ in range(args.rounds):
                for mode in ["quiet", "get", "churn"]:
                    stop, figures = threading.Event(), {}
                    thread = threading.Thread(target=client, args=(api, mode, stop, d, figures))
                    if mode != "quiet":
                        thread.start()
                    cmdline = ("probe.workload=blk probe.rw=randread probe.qd=1 probe.warmup=1000 "
                               f"probe.duration_ms={int(args.seconds * 1000)}")
                    out = subprocess.run([args.binary, "run", "--probe", "--mem", "128M", "--disk",
                                          f"vhost-user={d}/a.sock", "--io-mode", "exitless", "--cmdline", cmdline],
                                         capture_output=True, text=True, check=True).stdout
                    stop.set()
                    if mode != "quiet":
                        thread.join()
                    r = next(json.loads(l) for l in out.splitlines() if '"probe":"blk"' in l)
                    assert r["errors"] == 0, f"the guest saw {r['errors']} I/O errors in the {mode} run"
                    us = lambda key: f"{r[key] / 1e3:.1f}"
                    print(f"| {mode} | {figures.get('pairs', '-')} | "
                          f"{figures['slowest_ms']:.1f} |" if figures else f"| {mode} | - | - |", end="")
                    print(f" {r['iops']:.0f} | {us('p50_ns')} | {us('p99_ns')} | {us('p999_ns')} | {us('max_ns')} |")
        finally:
            daemon.terminate()
            daemon.wait()


if __name__ == "__main__":
    main()
