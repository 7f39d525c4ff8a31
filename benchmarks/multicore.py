#!/usr/bin/env python3
"""Where the CPU goes with ``--frontend-processes N``, and what more cores would give (Amdahl).

For each model (``add_sub``: the Python backend, its own worker process; ``identity``: an ONNX FP32 [-1,16]
identity, run by onnxruntime inline on the host's loop), each protocol (HTTP, gRPC) and each N (1, 2), it starts
naiad, drives the model (one item per request) with ``naiad bench`` at a fixed concurrency, and reads from the
operating system how much CPU each kind of process spent per request: the model host (with N = 1, the one process
that does everything), the front ends (summed), and the Python backend's worker (the model itself). Requests are
counted by the server's own statistics.

The prediction for C cores: every request costs ``host + front + worker`` µs of CPU in all, the host's part runs
on one core (serial), the worker's on one instance; so throughput <= min(C * 1e6 / total, 1e6 / host,
1e6 / worker). The load generator shares the box: on 2 cores the measured figures are below what the server alone
could do.

    python benchmarks/multicore.py [--seconds 5] [--concurrency 16] [--models add_sub,identity]
                                   [--protocols http,grpc] [--processes 1,2] [--root TREE ...] [--rounds 1]
                                   [--pin-host [--warm-host]] [--capacity]

With several ``--root`` trees (naiad checkouts; default: this one), each round measures every tree in turn, so an
A/B comparison alternates on the same noisy box. ``--pin-host`` gives the host (N > 1) a core of its own, as it
has on a many-core machine; on a shared core its figure also carries the cost of being switched in and out.
``--warm-host`` also runs a spinner at the idle priority (SCHED_IDLE) on the host's core: it never delays the
host, but keeps the core from halting between the host's wakes. On this VM (no guest halt-polling) a wake from a
halted core costs the host several µs per request that a saturated host, which never halts, does not pay.
``--capacity`` also measures each model's host at saturation (``host_capacity.py``: driver processes keep its
channels full) and prints a second prediction with that figure as the serial part: what the host costs when it is
the bottleneck, which is when it matters.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.onnx_graphs import identity  # noqa: E402
from tests.server import EXAMPLES, free_port  # noqa: E402

from http_add_sub import wait_ready  # noqa: E402 - a sibling script (this folder is not a package)
from interpreter import describe  # noqa: E402

IDENTITY_CONFIG = """name: "identity"
backend: "onnxruntime"
max_batch_size: 8
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 16 ] }]
output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 16 ] }]
instance_group [{ kind: KIND_CPU, count: 1 }]
# One onnxruntime thread: an identity has nothing to spread, and idle spinning threads would count as the host's.
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
parameters { key: "inter_op_thread_count" value: { string_value: "1" } }
"""


def repository(into: Path) -> Path:
    """add_sub from the bundled examples, and the ONNX identity."""
    import onnx

    shutil.copytree(EXAMPLES / "add_sub", into / "add_sub")
    (into / "identity" / "1").mkdir(parents=True)
    (into / "identity" / "config.pbtxt").write_text(IDENTITY_CONFIG)
    onnx.save(identity("TYPE_FP32", ["batch", 16]), str(into / "identity" / "1" / "model.onnx"))
    return into


def _cpu(proc: psutil.Process) -> float:
    try:
        t = proc.cpu_times()
        return t.user + t.system
    except psutil.NoSuchProcess:
        return 0.0


def _success(port: int, model: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}/stats") as response:
        return json.load(response)["model_stats"][0]["inference_stats"]["success"]["count"]


def _pin(proc: psutil.Process, cpus: set[int]) -> None:
    try:
        for thread in proc.threads():
            os.sched_setaffinity(thread.id, cpus)
    except (psutil.NoSuchProcess, OSError):
        pass


def measure(tree: Path, repo: Path, model: str, protocol: str, processes: int, seconds: float,
            concurrency: int, pin_host: bool = False, warm_host: bool = False) -> dict[str, float]:
    http_port, grpc_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(tree)}
    server = subprocess.Popen(
        [sys.executable, "-m", "naiad", "serve", "--model-repository", str(repo), "--http-port", str(http_port),
         "--http-address", "127.0.0.1", "--grpc-port", str(grpc_port), "--grpc-address", "127.0.0.1",
         "--allow-metrics=false", "--frontend-processes", str(processes)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=tree)
    spinner = None
    try:
        wait_ready(f"http://127.0.0.1:{http_port}", server, 60)
        host = psutil.Process(server.pid)
        children = host.children()
        fronts = [p for p in children if "naiad.processes" in " ".join(p.cmdline())]
        workers = [p for p in children if p not in fronts]
        others: set[int] = set()
        if pin_host:  # the host alone on the last core, as it would be on a many-core machine
            cpus = sorted(os.sched_getaffinity(0))
            others = set(cpus[:-1])
            _pin(host, {cpus[-1]})
            for child in children:
                _pin(child, others)
            if warm_host:
                spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                os.sched_setaffinity(spinner.pid, {cpus[-1]})
                os.sched_setscheduler(spinner.pid, os.SCHED_IDLE, os.sched_param(0))
        url = f"127.0.0.1:{grpc_port if protocol == 'grpc' else http_port}"
        # The load generator is this tree's, whichever tree serves.
        bench_env = {**os.environ, "PYTHONPATH": str(ROOT)}
        bench = (["taskset", "-c", ",".join(map(str, sorted(others)))] if others else []) + [
                 sys.executable, "-m", "naiad", "bench", "-m", model, "-u", url, "-i", protocol,
                 "--concurrency-range", str(concurrency), "--no-progress", "-p"]
        subprocess.run(bench + ["500"], capture_output=True, env=bench_env)  # warm-up
        before = (_success(http_port, model), time.monotonic(), _cpu(host), sum(map(_cpu, fronts)),
                  sum(map(_cpu, workers)))
        subprocess.run(bench + [str(int(seconds * 1000))], capture_output=True, env=bench_env)
        after = (_success(http_port, model), time.monotonic(), _cpu(host), sum(map(_cpu, fronts)),
                 sum(map(_cpu, workers)))
        requests = max(after[0] - before[0], 1)
        return {"rps": requests / (after[1] - before[1]),
                "host_us": (after[2] - before[2]) * 1e6 / requests,
                "front_us": (after[3] - before[3]) * 1e6 / requests,
                "worker_us": (after[4] - before[4]) * 1e6 / requests}
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()


def predict(row: dict[str, float], cores: int, serial_us: float | None = None) -> float:
    """Amdahl: the whole request's CPU spread over ``cores``, capped by the host's serial part (``serial_us``:
    the host's figure at saturation, where measured; else this row's) and by one worker instance."""
    host = row["host_us"] if serial_us is None else serial_us
    total = host + row["front_us"] + row["worker_us"]
    return min(cores * 1e6 / total, 1e6 / host, 1e6 / max(row["worker_us"], 1e-9))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--models", default="add_sub,identity")
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument("--processes", default="1,2", help="front-end process counts to measure")
    parser.add_argument("--root", action="append", type=Path, help="a naiad tree to serve (repeatable)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--pin-host", action="store_true",
                        help="run the model host alone on the last core, and the front ends, workers and load "
                             "generator on the others (as on a many-core machine, where the host's core is its own)")
    parser.add_argument("--warm-host", action="store_true",
                        help="with --pin-host: keep the host's core from halting between its wakes (an idle-priority "
                             "spinner there), as a saturated host's core never halts")
    parser.add_argument("--capacity", action="store_true",
                        help="also measure each model's host at saturation (host_capacity.py) and predict with it")
    args = parser.parse_args()
    print(f"naiad runs on {describe(sys.executable)}", file=sys.stderr, flush=True)
    trees = [t.resolve() for t in args.root] if args.root else [ROOT]
    label = len(trees) > 1
    print(f"{'tree ' * label}{'model':9} {'protocol':8} {'N':>2} {'req/s':>8} {'host µs':>8} {'front µs':>9} "
          f"{'worker µs':>9}   predicted req/s at 4 / 8 / 16 cores"
          + ("   (with the saturated host's µs)" if args.capacity else ""), flush=True)
    with tempfile.TemporaryDirectory(prefix="naiad-multicore-") as tmp:
        repo = repository(Path(tmp))
        for _ in range(args.rounds):
            for model in args.models.split(","):
                saturated: dict[int, dict[str, float]] = {}
                if args.capacity:
                    from host_capacity import measure as capacity

                    for index, tree in enumerate(trees):
                        saturated[index] = row = capacity(tree, model, 2, 64, args.seconds, repo)
                        print(f"{'AB'[index] if index < 2 else index:4} " * label
                              + f"{model:9} saturated host: {row['rps']:,.0f} req/s, busy {row['busy']:.2f}, "
                              f"{row['host_us']:.1f} µs per request", flush=True)
                for protocol in args.protocols.split(","):
                    for processes in map(int, args.processes.split(",")):
                        for index, tree in enumerate(trees):
                            row = measure(tree, repo, model, protocol, processes, args.seconds, args.concurrency,
                                          args.pin_host and processes > 1, args.warm_host)
                            # From one process's figures the host's share can't be told from the front end's.
                            prediction = (" / ".join(f"{predict(row, c):,.0f}" for c in (4, 8, 16))
                                          if processes > 1 else "-")
                            if index in saturated and processes > 1:
                                serial = saturated[index]["host_us"]
                                prediction += "   (" + " / ".join(f"{predict(row, c, serial):,.0f}"
                                                                  for c in (4, 8, 16)) + ")"
                            print(f"{'AB'[index] if index < 2 else index:4} " * label
                                  + f"{model:9} {protocol:8} {processes:>2} {row['rps']:>8,.0f} "
                                  f"{row['host_us']:>8.1f} {row['front_us']:>9.1f} {row['worker_us']:>9.1f}   "
                                  f"{prediction}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
