#!/usr/bin/env python3
"""Where the CPU goes with ``--frontend-processes N``, and what more cores would give (Amdahl).

For each protocol (HTTP, gRPC) and each N (1, 2), it starts naiad on the bundled examples, drives ``add_sub`` (one
item per request) with ``naiad bench`` at a fixed concurrency, and reads from the operating system how much CPU each
kind of process spent per request: the model host (with N = 1, the one process that does everything), the front
ends (summed), and the Python backend's worker (the model itself). Requests are counted by the server's own
statistics.

The prediction for C cores: every request costs ``host + front + worker`` µs of CPU in all, the host's part runs
on one core (serial), the worker's on one instance; so throughput <= min(C * 1e6 / total, 1e6 / host,
1e6 / worker). The load generator shares the box: on 2 cores the measured figures are below what the server alone
could do.

    python benchmarks/multicore.py [--seconds 5] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.server import EXAMPLES, free_port  # noqa: E402


def _cpu(proc: psutil.Process) -> float:
    try:
        t = proc.cpu_times()
        return t.user + t.system
    except psutil.NoSuchProcess:
        return 0.0


def _success(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/add_sub/stats") as response:
        return json.load(response)["model_stats"][0]["inference_stats"]["success"]["count"]


def measure(protocol: str, processes: int, seconds: float, concurrency: int) -> dict[str, float]:
    http_port, grpc_port = free_port(), free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "naiad", "serve", "--model-repository", str(EXAMPLES), "--http-port", str(http_port),
         "--http-address", "127.0.0.1", "--grpc-port", str(grpc_port), "--grpc-address", "127.0.0.1",
         "--allow-metrics=false", "--frontend-processes", str(processes)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("naiad did not start")
                time.sleep(0.2)
        host = psutil.Process(server.pid)
        children = host.children()
        fronts = [p for p in children if "naiad.processes" in " ".join(p.cmdline())]
        workers = [p for p in children if p not in fronts]
        url = f"127.0.0.1:{grpc_port if protocol == 'grpc' else http_port}"
        bench = [sys.executable, "-m", "naiad", "bench", "-m", "add_sub", "-u", url, "-i", protocol,
                 "--concurrency-range", str(concurrency), "-p", str(int(seconds * 1000)), "--no-progress"]
        subprocess.run(bench[:-3] + ["-p", "500", "--no-progress"], capture_output=True, env={**os.environ,
                       "PYTHONPATH": str(ROOT)})  # warm-up
        before = (_success(http_port), time.monotonic(), _cpu(host), sum(map(_cpu, fronts)), sum(map(_cpu, workers)))
        subprocess.run(bench, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        after = (_success(http_port), time.monotonic(), _cpu(host), sum(map(_cpu, fronts)), sum(map(_cpu, workers)))
        requests = after[0] - before[0] - 1  # (the stats request itself is not an inference)
        requests = max(requests, 1)
        return {"rps": requests / (after[1] - before[1]),
                "host_us": (after[2] - before[2]) * 1e6 / requests,
                "front_us": (after[3] - before[3]) * 1e6 / requests,
                "worker_us": (after[4] - before[4]) * 1e6 / requests}
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()


def predict(row: dict[str, float], cores: int) -> float:
    total = row["host_us"] + row["front_us"] + row["worker_us"]
    return min(cores * 1e6 / total, 1e6 / row["host_us"], 1e6 / max(row["worker_us"], 1e-9))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    print(f"{'protocol':8} {'N':>2} {'req/s':>8} {'host µs':>8} {'front µs':>9} {'worker µs':>9}   "
          f"predicted req/s at 4 / 8 / 16 cores")
    for protocol in ("http", "grpc"):
        for processes in (1, 2):
            row = measure(protocol, processes, args.seconds, args.concurrency)
            prediction = " / ".join(f"{predict(row, c):,.0f}" for c in (4, 8, 16)) if processes > 1 else "-"
            print(f"{protocol:8} {processes:>2} {row['rps']:>8,.0f} {row['host_us']:>8.1f} {row['front_us']:>9.1f} "
                  f"{row['worker_us']:>9.1f}   {prediction}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
