"""Load / infer / unload cycles of a Python and an ONNX model in explicit mode, with the server's process tree
measured as it goes: RSS, file descriptors, threads, processes, shared-memory mappings and /dev/shm files.

    timeout 900 python benchmarks/reliability/load_cycles.py --cycles 1000 --warmup 20
    python benchmarks/reliability/load_cycles.py --models python --cycles 300   # one model only, to attribute growth

Prints one line every ``--every`` cycles and a summary: RSS growth after warm-up in MiB and %, and whether anything
leaked (workers, fds, shm). Exit status 1 when growth passes ``--max-growth`` (default 5 %) or something leaked.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.reliability import cycles, procs  # noqa: E402
from tests.server import RunningServer  # noqa: E402


def settled(pid: int, timeout: float = 10.0) -> procs.Snapshot:
    deadline = time.monotonic() + timeout
    while True:
        now = procs.snapshot(pid)
        if len(now.pids) == 1 or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--models", choices=("both", "python", "onnx"), default="both")
    parser.add_argument("--max-growth", type=float, default=5.0, help="percent")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds between cycles (be kind to shared CPUs)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cycles.write_models(Path(tmp))
        server = RunningServer([Path(tmp)], "--model-control-mode=explicit")
        pid = server.proc.pid
        only = {"both": None, "python": cycles.PYTHON_MODEL, "onnx": cycles.ONNX_MODEL}[args.models]
        try:
            empty = procs.snapshot(pid)
            print(f"{'cycle':>6} {'rss MiB':>8} {'fds':>4} {'thr':>4} {'procs':>5} {'shm':>4} {'s/cycle':>8}")
            print(f"{0:>6} {empty.rss / 2**20:8.1f} {empty.fds:4d} {empty.threads:4d} {len(empty.pids):5d} "
                  f"{empty.shm_maps:4d}", flush=True)
            warm = None
            started = time.monotonic()
            for i in range(1, args.cycles + 1):
                cycles.cycle(server.http_port, only=only)
                if args.pause:
                    time.sleep(args.pause)
                if i == args.warmup:
                    warm = settled(pid)
                    started = time.monotonic()
                    print(f"{i:>6} {warm.rss / 2**20:8.1f} {warm.fds:4d} {warm.threads:4d} {len(warm.pids):5d} "
                          f"{warm.shm_maps:4d}   (warm)", flush=True)
                elif i % args.every == 0:
                    now = settled(pid)
                    per = (time.monotonic() - started) / max(i - args.warmup, 1)
                    print(f"{i:>6} {now.rss / 2**20:8.1f} {now.fds:4d} {now.threads:4d} {len(now.pids):5d} "
                          f"{now.shm_maps:4d} {per:8.3f}", flush=True)
            end = settled(pid)
            warm = warm or empty
            growth = (end.rss - warm.rss) / warm.rss * 100
            leaks = []
            if len(end.pids) > 1:
                leaks.append(f"{len(end.pids) - 1} processes left")
            if procs.zombies(pid):
                leaks.append("zombies")
            if end.fds > warm.fds + 2:
                leaks.append(f"fds {warm.fds} -> {end.fds}")
            if end.shm_maps > empty.shm_maps or end.shm_files != empty.shm_files:
                leaks.append(f"shm {empty.shm_maps} -> {end.shm_maps} mappings, files {end.shm_files}")
            print(f"\n{args.cycles} cycles ({args.models}): RSS after warm-up {warm.rss / 2**20:.1f} MiB -> "
                  f"{end.rss / 2**20:.1f} MiB ({growth:+.2f} %); leaks: {', '.join(leaks) or 'none'}")
            return 1 if growth > args.max_growth or leaks else 0
        finally:
            server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
