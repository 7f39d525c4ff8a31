#!/usr/bin/env python3
"""What an open dashboard costs the infer path: the `add_sub` model under wrk, with and without dashboard pages
polling `GET /dashboard/feed` once a second, as a browser does.

One naiad, pinned to one core (`taskset -c 1`); wrk and the pages on the other. Rounds alternate (none, pages,
none, pages, ...) so drift on a shared machine falls on both sides; after a round with pages the script waits
until the server has stopped sampling (naiad stops 10 s after the last poll) before measuring without. Reported
per mode: median req/s, p50 / p99 latency and the server's CPU time per request (its process tree, from /proc,
which the machine's other load disturbs less than req/s), and the ratio to the runs without a page.

    python3 benchmarks/dashboard_overhead.py                       # c=8, 3 rounds of 8 s, 1 page and 10 pages
    python3 benchmarks/dashboard_overhead.py --rounds 5 --duration 10 --pages 1
    python3 benchmarks/dashboard_overhead.py --json-out /tmp/dashboard.json

Stdlib only; external tools: wrk, taskset. Helpers come from http_add_sub.py (same folder).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from http_add_sub import (  # noqa: E402 - the sibling script's helpers
    DEFAULT_REPO,
    INFER_PATH,
    LUA_SCRIPT,
    PROJECT_DIR,
    Server,
    free_port,
    load_body,
    run_wrk,
    start,
    stop,
    to_result,
    tree_cpu_seconds,
    verify,
    wait_ready,
)

IDLE_AFTER_S = 10.0  # naiad/service/watch.py: sampling stops this long after the last poll


class Pages:
    """``count`` dashboard pages, each polling the feed once a second on its own keep-alive connection."""

    def __init__(self, port: int, count: int) -> None:
        self.port = port
        self.count = count
        self.stopping = threading.Event()
        self.polls = 0
        self.failures = 0
        self.threads = [threading.Thread(target=self._page, args=(i,), daemon=True) for i in range(count)]

    def _page(self, index: int) -> None:
        time.sleep(index / max(1, self.count))  # pages opened at different moments
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        while not self.stopping.is_set():
            try:
                conn.request("GET", "/dashboard/feed")
                response = conn.getresponse()
                body = response.read()
                if response.status != 200 or not body.startswith(b"{"):
                    self.failures += 1
                self.polls += 1
            except OSError:
                self.failures += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            self.stopping.wait(1.0)
        conn.close()

    def __enter__(self) -> Pages:
        for thread in self.threads:
            thread.start()
        time.sleep(1.5)  # every page has polled once: the server samples
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join()


def measure(proc_pid: int, base: str, args: argparse.Namespace) -> dict:
    cpu0 = tree_cpu_seconds(proc_pid)
    result = to_result("naiad", args.connections, run_wrk(base + INFER_PATH, args.connections, args.duration,
                                                          args.wrk_cpu))
    cpu = tree_cpu_seconds(proc_pid) - cpu0
    return {"rps": result.rps, "p50_ms": result.p50_ms, "p99_ms": result.p99_ms, "errors": result.errors,
            "cpu_us_per_request": round(cpu * 1e6 / result.requests, 2) if result.requests else None}


def summarize(runs: list[dict]) -> dict:
    return {key: round(statistics.median(r[key] for r in runs), 3)
            for key in ("rps", "p50_ms", "p99_ms", "cpu_us_per_request")} | {"errors": sum(r["errors"] for r in runs)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", type=Path, default=DEFAULT_REPO)
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--duration", type=int, default=8, help="seconds per wrk run")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="runs per mode, alternating")
    p.add_argument("--pages", default="1,10", help="dashboard pages polling in the 'with' modes")
    p.add_argument("--server-cpu", type=int, default=1)
    p.add_argument("--wrk-cpu", type=int, default=0, help="core for wrk and the pages")
    p.add_argument("--naiad-cmd", default=f"{sys.executable} -m naiad serve")
    p.add_argument("--json-out", type=Path)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.sched_setaffinity(0, {args.wrk_cpu})  # the pages' threads stay off the server's core
    body = load_body(LUA_SCRIPT)
    port = free_port()
    argv_ = [*args.naiad_cmd.split(), "--model-repository", str(args.repo), "--http-port", str(port),
             "--http-address", "127.0.0.1", "--allow-grpc=false", "--allow-metrics=false"]
    server = Server("naiad", argv_, port, PROJECT_DIR)
    base = f"http://127.0.0.1:{port}"
    modes = [0] + [int(n) for n in args.pages.split(",") if n]
    runs: dict[int, list[dict]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="naiad-dashboard-bench-") as workdir:
        proc = start(server, args.server_cpu, Path(workdir) / "naiad.log")
        try:
            wait_ready(base, proc, 60)
            verify(base, body)
            if args.warmup:
                run_wrk(base + INFER_PATH, args.connections, args.warmup, args.wrk_cpu)
            for round_ in range(args.rounds):
                for pages in modes if round_ % 2 == 0 else modes[::-1]:  # alternate the order too
                    if pages == 0:
                        run = measure(proc.pid, base, args)
                    else:
                        with Pages(port, pages) as open_pages:
                            run = measure(proc.pid, base, args)
                        run["polls"], run["poll_failures"] = open_pages.polls, open_pages.failures
                        time.sleep(IDLE_AFTER_S + 1)  # the server stops sampling before the next 'none'
                    runs[pages].append(run)
                    print(f"round {round_ + 1} pages={pages:<3} {run['rps']:>9.1f} req/s  p50 {run['p50_ms']:.2f} ms"
                          f"  p99 {run['p99_ms']:.2f} ms  {run['cpu_us_per_request']} us CPU/request"
                          + (f"  ({run['polls']} polls, {run['poll_failures']} failed)" if pages else ""),
                          flush=True)
        finally:
            stop(proc)
    base_line = summarize(runs[0])
    print(f"\nmedians over {args.rounds} rounds, c={args.connections}, {args.duration} s each "
          f"(server on core {args.server_cpu}, wrk and pages on core {args.wrk_cpu})")
    print(f"{'pages':>5} {'req/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'CPU us/req':>11} {'req/s ratio':>12} "
          f"{'CPU ratio':>10}")
    report: dict[str, Any] = {"settings": {k: str(v) for k, v in vars(args).items()}, "modes": {}}
    for pages in modes:
        s = summarize(runs[pages])
        rps_ratio = s["rps"] / base_line["rps"] if base_line["rps"] else float("nan")
        cpu_ratio = s["cpu_us_per_request"] / base_line["cpu_us_per_request"]
        print(f"{pages:>5} {s['rps']:>10.1f} {s['p50_ms']:>8.2f} {s['p99_ms']:>8.2f} {s['cpu_us_per_request']:>11.2f} "
              f"{rps_ratio:>12.3f} {cpu_ratio:>10.3f}")
        report["modes"][str(pages)] = {**s, "rps_ratio": round(rps_ratio, 4), "cpu_ratio": round(cpu_ratio, 4),
                                       "runs": runs[pages]}
    report["in_process"] = in_process_costs()
    print("\nin process (this interpreter, no server): " + ", ".join(f"{k} {v}" for k, v in report["in_process"].items()))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2))
    return 0


def in_process_costs() -> dict[str, float]:
    """The two costs an open page adds, measured directly: per request, the latency window's append; per second,
    one sample of a version whose window is full (rates, means and the p50 / p99 sort)."""
    import timeit

    sys.path.insert(0, str(PROJECT_DIR))
    from naiad.core.stats import Duration, ModelStats
    from naiad.service.watch import Series

    bare, watched = Duration(), Duration()
    stats = ModelStats()
    series = Series(stats, 0.0)
    watched.window = stats.success.window
    n = 1_000_000
    costs = {"add_ns_unwatched": timeit.timeit(lambda: bare.add(1000), number=n) / n * 1e9,
             "add_ns_watched": timeit.timeit(lambda: watched.add(1000), number=n) / n * 1e9}
    costs["sample_us_per_version_per_s"] = timeit.timeit(lambda: series.sample(time.monotonic()), number=200) / 200 * 1e6
    return {k: round(v, 1) for k, v in costs.items()}


if __name__ == "__main__":
    raise SystemExit(main())
