"""Server CPU time per add_sub request, naiad tree A against tree B, over HTTP (wrk) and gRPC (h2load).

Why CPU time: on a shared or busy machine, throughput and latency move with whatever else runs, but the CPU
seconds the server process (and its Python workers) spend per request barely do. Rounds alternate A and B, each
with a fresh server, and the table gives the median of the rounds and B's ratio to A. Use it to check that a
change keeps the hot path's cost (``http_add_sub.py`` and ``grpc_add_sub.py`` give throughput against Triton on a
quiet machine).

    python benchmarks/cpu_per_request.py --a /path/to/base/checkout --b . --rounds 5

Needs wrk and h2load (Debian: wrk, nghttp2-client). Stdlib only, plus the gRPC body builder of grpc_add_sub.py.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent / "examples" / "model_repository"
sys.path.insert(0, str(BENCH_DIR))

from grpc_add_sub import PATH, framed_body  # noqa: E402 - the benchmark folder is not a package


def free_port() -> int:
    from naiad.core.free_ports import free_port as pick  # NAIAD_PORT_RANGE confines it

    return pick()


def cpu_seconds(pid: int) -> float:
    """User + system time of ``pid`` and its live children (the Python workers), from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    pids = [pid]
    try:
        pids += [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pass
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


class Server:
    def __init__(self, tree: Path, log: Path) -> None:
        self.http, self.grpc = free_port(), free_port()
        argv = [sys.executable, "-m", "naiad", "serve", "--model-repository", str(REPO), "--http-port", str(self.http),
                "--grpc-port", str(self.grpc), "--metrics-port", str(free_port()), "--http-address", "127.0.0.1",
                "--grpc-address", "127.0.0.1"]
        self.proc = subprocess.Popen(argv, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                                     stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v2/health/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"server from {tree} did not become ready: see {log}")
            time.sleep(0.1)

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(30)


def http_load(port: int, connections: int, duration: int) -> int:
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{duration}s", "-s", str(BENCH_DIR / "wrk_infer.lua"),
                          f"http://127.0.0.1:{port}/v2/models/add_sub/infer"],
                         capture_output=True, text=True, check=True).stdout
    return int(re.search(r'"requests":(\d+)', out).group(1))  # type: ignore[union-attr]


def grpc_load(port: int, body: Path, connections: int, duration: int) -> int:
    out = subprocess.run(["h2load", "-t1", f"-c{connections}", "-m1", f"-D{duration}", "-H",
                          "content-type: application/grpc", "-H", "te: trailers", "-d", str(body),
                          f"http://127.0.0.1:{port}{PATH}"], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"(\d+) succeeded", out).group(1))  # type: ignore[union-attr]


def measure(tree: Path, body: Path, args: argparse.Namespace, log: Path) -> dict[str, float]:
    server = Server(tree, log)
    try:
        out = {}
        for name, run in (("http", lambda: http_load(server.http, args.connections, args.duration)),
                          ("grpc", lambda: grpc_load(server.grpc, body, args.connections, args.duration))):
            run()  # warm-up round at the same level, not counted
            before = cpu_seconds(server.proc.pid)
            done = run()
            out[name] = (cpu_seconds(server.proc.pid) - before) / max(done, 1) * 1e6
        return out
    finally:
        server.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", type=Path, required=True, help="baseline naiad checkout")
    p.add_argument("--b", type=Path, default=BENCH_DIR.parent, help="changed naiad checkout (default: this one)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--duration", type=int, default=5, help="seconds per load run")
    p.add_argument("--connections", type=int, default=8)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        body = Path(tmp) / "body.bin"
        body.write_bytes(framed_body())
        results: dict[str, dict[str, list[float]]] = {"A": {"http": [], "grpc": []}, "B": {"http": [], "grpc": []}}
        for round_ in range(args.rounds):
            for label, tree in (("A", args.a), ("B", args.b)):
                got = measure(tree.resolve(), body, args, Path(tmp) / f"{label}{round_}.log")
                for k, v in got.items():
                    results[label][k].append(v)
                print(f"round {round_ + 1} {label}: http {got['http']:.1f} us, grpc {got['grpc']:.1f} us", flush=True)
    print(f"\nserver CPU per add_sub request, median of {args.rounds} rounds, c={args.connections}")
    print(f"{'':6}{'A (us)':>10}{'B (us)':>10}{'B/A':>8}")
    for k in ("http", "grpc"):
        a, b = statistics.median(results["A"][k]), statistics.median(results["B"][k])
        print(f"{k:6}{a:10.1f}{b:10.1f}{b / a:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
