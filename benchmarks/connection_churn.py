#!/usr/bin/env python3
"""Connection churn with ``--frontend-processes N``: every request on a new connection (HTTP/1.1, ``Connection:
close``), so what accepting costs shows: throughput, and the front ends' CPU per connection (psutil), side by side
for several naiad trees (``--root``, as multicore.py; each round measures every tree in turn).

With one accept queue that the front ends share (naiad/frontends/acceptor.py) every front end wakes for each new
connection and all but one find it taken; with a socket each (SO_REUSEPORT) only the one the kernel picked wakes.

    python benchmarks/connection_churn.py [--root TREE ...] [--processes 2] [--concurrency 8] [--seconds 5]
                                          [--clients 1] [--rounds 3] [--path /v2/health/live]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.server import free_port  # noqa: E402

from http_add_sub import wait_ready  # noqa: E402 - a sibling script (this folder is not a package)


async def _client(port: int, path: str, concurrency: int, seconds: float) -> int:
    request = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    end = time.monotonic() + seconds
    done = 0

    async def worker() -> None:
        nonlocal done
        while time.monotonic() < end:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            if b" 200 " in await reader.readline():
                done += 1
            await reader.read()  # until the server closes
            writer.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done


def _client_process(port: int, path: str, concurrency: int, seconds: float, results: multiprocessing.Queue) -> None:
    try:
        import uvloop

        results.put(uvloop.run(_client(port, path, concurrency, seconds)))
    except ImportError:
        results.put(asyncio.run(_client(port, path, concurrency, seconds)))


def _cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def measure(tree: Path, repo: Path, processes: int, concurrency: int, clients: int, seconds: float,
            path: str) -> tuple[float, float]:
    """Requests (= connections) per second, and the front ends' CPU µs per connection."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "naiad", "serve", "--model-repository", str(repo), "--http-port", str(port),
         "--http-address", "127.0.0.1", "--allow-grpc=false", "--allow-metrics=false",
         "--frontend-processes", str(processes)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree)
    try:
        wait_ready(f"http://127.0.0.1:{port}", server, 60)
        host = psutil.Process(server.pid)
        fronts = [p for p in host.children() if "naiad.processes" in " ".join(p.cmdline())] or [host]
        results: multiprocessing.Queue = multiprocessing.Queue()
        _client_process(port, path, concurrency, 0.5, results)  # warm-up
        results.get()
        before, started = _cpu(fronts), time.monotonic()
        workers = [multiprocessing.Process(target=_client_process, args=(port, path, concurrency, seconds, results))
                   for _ in range(clients)]
        for worker in workers:
            worker.start()
        done = sum(results.get() for _ in workers)
        for worker in workers:
            worker.join()
        elapsed, cpu = time.monotonic() - started, _cpu(fronts) - before
        return done / elapsed, cpu * 1e6 / max(done, 1)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", action="append", type=Path, help="a naiad tree to serve (repeatable)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8, help="connections open at once, per client process")
    parser.add_argument("--clients", type=int, default=1, help="client processes")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--path", default="/v2/health/live")
    args = parser.parse_args()
    trees = [t.resolve() for t in args.root] if args.root else [ROOT]
    print(f"{'tree':40} {'N':>2} {'conn/s':>8} {'front µs/conn':>14}", flush=True)
    with tempfile.TemporaryDirectory(prefix="naiad-churn-") as repo:
        for _ in range(args.rounds):
            for tree in trees:
                rate, front = measure(tree, Path(repo), args.processes, args.concurrency, args.clients, args.seconds,
                                      args.path)
                print(f"{str(tree):40} {args.processes:>2} {rate:>8,.0f} {front:>14.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
