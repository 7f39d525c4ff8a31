#!/usr/bin/env python3
"""naiad bench against real perf_analyzer 2.51 on a busy core: same server, same model, same concurrency, one
after the other, alternating.

The server (naiad serving the example add_sub) is pinned to --server-cpu (default 1). Both generators are pinned to
--load-cpu (default 0), where --hogs busy loops (default 1) compete with them, as other work on a shared machine
does. perf_analyzer keeps one thread per request in flight; the kernel shares a core per thread, so on a busy
core it gets more of it than one generator process would. naiad bench is run with each --processes given.

    python3 benchmarks/bench_busy_core.py                                # c=8, 3 rounds, processes 1 and auto
    python3 benchmarks/bench_busy_core.py --concurrency 16 --hogs 2 --processes 1 4 0

--processes 0 means naiad bench's default. Needs taskset and ../shared/peers/perf_analyzer.sh install.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

from tests.server import EXAMPLES, RunningServer  # noqa: E402

PERF_ANALYZER = Path(os.environ.get("NAIAD_PEERS_DIR", Path.home() / ".cache/naiad-peers")) / \
    "perf_analyzer-2.51.0/perf_analyzer"


def throughput(argv: list[str], csv_path: Path) -> float:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if done.returncode not in (0, 2) or not csv_path.exists():
        raise RuntimeError(f"{argv[:4]} exited {done.returncode}: {done.stderr[-500:]}")
    rows = list(csv.DictReader(csv_path.open()))
    return float(rows[-1]["Inferences/Second"]) if rows else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--hogs", type=int, default=1, help="busy loops on the load core")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--interval-ms", type=int, default=2000)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 0])
    parser.add_argument("--server-cpu", type=int, default=1)
    parser.add_argument("--load-cpu", type=int, default=0)
    args = parser.parse_args()
    server = RunningServer([EXAMPLES], "--model-control-mode", "explicit", "--load-model", "add_sub")
    hogs = []
    try:
        os.sched_setaffinity(server.proc.pid, {args.server_cpu})
        for child in __import__("psutil").Process(server.proc.pid).children(recursive=True):
            os.sched_setaffinity(child.pid, {args.server_cpu})
        hogs = [subprocess.Popen(["taskset", "-c", str(args.load_cpu), sys.executable, "-c", "while True: pass"])
                for _ in range(args.hogs)]
        results: dict[str, list[float]] = {}
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out.csv"
            common = ["-m", "add_sub", "-u", server.url, "--concurrency-range", str(args.concurrency),
                      "-p", str(args.interval_ms), "-s", "1000", "-r", "3", "-f", str(out)]
            for _ in range(args.rounds):
                out.unlink(missing_ok=True)
                results.setdefault("perf_analyzer", []).append(throughput(
                    ["taskset", "-c", str(args.load_cpu), str(PERF_ANALYZER), *common], out))
                for processes in args.processes:
                    out.unlink(missing_ok=True)
                    extra = ["--processes", str(processes)] if processes else []
                    name = f"naiad bench --processes {processes or 'default'}"
                    results.setdefault(name, []).append(throughput(
                        ["taskset", "-c", str(args.load_cpu), sys.executable, "-m", "naiad", "bench", *common,
                         *extra, "--no-progress", "--no-generator-ceiling"], out))
        reference = statistics.median(results["perf_analyzer"])
        print(f"add_sub c={args.concurrency}, load core {args.load_cpu} shared with {args.hogs} busy loop(s), "
              f"server on core {args.server_cpu}; medians of {args.rounds} alternating runs")
        for name, values in results.items():
            median = statistics.median(values)
            print(f"  {name:32s} {median:8.0f} infer/s  ({median / reference:.2f} of perf_analyzer; runs "
                  + ", ".join(f"{v:.0f}" for v in values) + ")")
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        server.stop()
    return 0


if __name__ == "__main__":
    time.sleep(0)
    raise SystemExit(main())
