#!/usr/bin/env python3
"""How close does naiad keep a simulated accelerator to its bound? Triton's identity backend with
``execute_delay_ms = T`` takes T per execution whatever its batch size, on its instance's thread with the GIL
free, as a GPU model does; its bound is ``instances * max_batch_size / T`` items/s. This drives it over gRPC
(tritonclient's asyncio client, one item per request, 4 batches' worth of requests in flight per instance) for
1 and 2 instances at max_batch_size 8 and 32, and prints throughput against that bound, with the mean batch the
server formed and its executions per second per instance (at most 1000 / T).

    python benchmarks/simulated_accelerator.py [--delay-ms 20] [--seconds 5] [--rounds 1]
    python benchmarks/simulated_accelerator.py --roots /tmp/before,.      # A/B: alternate two checkouts

``--roots`` serves each listed checkout (its ``naiad`` package) in turn, round after round, so a before/after
comparison sees the same load on a shared box. ``--busy N`` runs N spinning processes meanwhile, as a loaded CI
box has (there every thread wake-up waits for a core, which is what overlap hides). Run it under
``flock /tmp/naiad-bench.lock``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.server import free_port
from tests.simulated import bound, throughput, write_simulated

from http_add_sub import wait_ready  # noqa: E402 - a sibling script (this folder is not a package)


def _stats(port: int, model: str) -> tuple[int, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}/stats") as response:
        stats = json.load(response)["model_stats"][0]
    return int(stats["execution_count"]), int(stats["inference_count"])


def _serve(root: Path, repo: Path) -> tuple[subprocess.Popen, int, int]:
    http_port, grpc_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "naiad", "serve", "--model-repository", str(repo), "--http-port", str(http_port),
         "--http-address", "127.0.0.1", "--grpc-port", str(grpc_port), "--grpc-address", "127.0.0.1",
         "--allow-metrics=false"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    try:
        wait_ready(f"http://127.0.0.1:{http_port}", proc, 60)
    except RuntimeError as exc:
        proc.kill()
        raise RuntimeError(f"naiad from {root}: {exc}") from None
    return proc, http_port, grpc_port


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delay-ms", type=int, default=20, help="execute_delay_ms: T per execution (default 20)")
    parser.add_argument("--batch-sizes", default="8,32", help="max_batch_size values (default 8,32)")
    parser.add_argument("--instances", default="1,2", help="instance counts (default 1,2)")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured time per case (default 5)")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured time before it (default 1)")
    parser.add_argument("--in-flight", type=int, default=4, help="requests in flight per instance, in batches")
    parser.add_argument("--rounds", type=int, default=1, help="rounds; the table shows each case's median")
    parser.add_argument("--roots", default=str(ROOT), help="comma-separated checkouts to serve (default: this one)")
    parser.add_argument("--busy", type=int, default=0, help="spinning processes to run meanwhile (default 0)")
    parser.add_argument("--backend", default="identity",
                        help="identity (a framework model's path) or python (a model.py that sleeps in its worker)")
    args = parser.parse_args(argv)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        return _run(args)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def _run(args: argparse.Namespace) -> int:
    roots = [Path(r).resolve() for r in args.roots.split(",")]
    cases = [(b, n) for b in map(int, args.batch_sizes.split(",")) for n in map(int, args.instances.split(","))]
    results: dict[tuple[Path, int, int], list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        for b, n in cases:
            write_simulated(repo, f"sim_b{b}_i{n}", b, n, args.delay_ms, backend=args.backend)
        for round_ in range(args.rounds):
            for root in roots:
                proc, http_port, grpc_port = _serve(root, repo)
                try:
                    for b, n in cases:
                        model = f"sim_b{b}_i{n}"
                        before = _stats(http_port, model)
                        started = time.monotonic()
                        items = throughput(f"127.0.0.1:{grpc_port}", model, args.in_flight * b * n, args.seconds,
                                           args.warmup)
                        elapsed = time.monotonic() - started
                        after = _stats(http_port, model)
                        executions, inferences = after[0] - before[0], after[1] - before[1]
                        results.setdefault((root, b, n), []).append(
                            (items, inferences / max(executions, 1), executions / elapsed / n))
                        print(f"round {round_ + 1} {root.name or root}: batch {b} x{n}: {items:.0f} items/s "
                              f"({items / bound(b, n, args.delay_ms):.3f} of the bound)", file=sys.stderr, flush=True)
                finally:
                    proc.terminate()
                    proc.wait(30)
    print(f"{args.backend} backend; T = {args.delay_ms} ms per execution; {args.in_flight} batches in flight per "
          "instance; gRPC; "
          f"{args.busy} spinning processes; median of {args.rounds} round(s)")
    print(f"{'checkout':<24} {'max_batch':>9} {'inst':>4} {'items/s':>9} {'bound':>7} {'ratio':>6} "
          f"{'mean batch':>10} {'exec/s/inst':>11}")
    for root in roots:
        for b, n in cases:
            runs = results[(root, b, n)]
            items = statistics.median(r[0] for r in runs)
            limit = bound(b, n, args.delay_ms)
            batch = statistics.median(r[1] for r in runs)
            rate = statistics.median(r[2] for r in runs)
            print(f"{str(root)[-24:]:<24} {b:>9} {n:>4} {items:>9.0f} {limit:>7.0f} {items / limit:>6.3f} "
                  f"{batch:>10.1f} {rate:>11.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
