"""Repeated load / infer / unload of a Python and an ONNX model in explicit mode: once warmed up, the process tree's
memory does not grow, and each unload leaves no worker process, file descriptor or shared-memory mapping behind.
benchmarks/reliability/load_cycles.py runs 1,000 cycles."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.reliability import cycles, procs
from tests.server import RunningServer

WARMUP = 3
CYCLES = 25


def _settled(pid: int, baseline: procs.Snapshot, timeout: float = 10.0) -> procs.Snapshot:
    """The tree once the unloaded models' workers have exited and their channels' mappings are gone (both happen
    asynchronously, the mappings a little after the processes)."""
    deadline = time.monotonic() + timeout
    while True:
        now = procs.snapshot(pid)
        settled = len(now.pids) <= len(baseline.pids) and now.shm_maps <= baseline.shm_maps
        if settled or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


# Threads the server may add and keep whatever the cycles do: asyncio's default executor grows to min(32, cores + 4)
# when jobs overlap (a loaded machine makes them overlap) and the load pool to --model-load-thread-count (4). A
# thread leaked per cycle still exceeds this on up to 16 cores (CYCLES = 25).
POOL_THREADS = min(32, (os.cpu_count() or 1) + 4) + 4


def _threads_settled(pid: int, bound: int, timeout: float = 10.0) -> int:
    """The server's thread count once at most ``bound``: an unloaded ONNX session's and a framework instance's
    threads end a little after the unload answers, later still on a busy machine."""
    deadline = time.monotonic() + timeout
    while True:
        threads = procs.snapshot(pid).threads
        if threads <= bound or time.monotonic() > deadline:
            return threads
        time.sleep(0.1)


def test_load_unload_cycles_leak_nothing(tmp_path: Path) -> None:
    cycles.write_models(tmp_path / "repo")
    server = RunningServer([tmp_path / "repo"], "--model-control-mode=explicit")
    try:
        pid = server.proc.pid
        empty = procs.snapshot(pid)
        for _ in range(WARMUP):
            cycles.cycle(server.http_port)
        warm = _settled(pid, empty)
        for _ in range(CYCLES):
            cycles.cycle(server.http_port)
        end = _settled(pid, empty)
        detail = f"empty: {empty.describe()}\nwarm: {warm.describe()}\nend: {end.describe()}"
        assert end.pids == [pid], detail  # no worker outlives its model
        assert procs.zombies(pid) == [], detail
        assert end.shm_maps <= empty.shm_maps and end.shm_files == empty.shm_files, detail
        assert end.fds <= warm.fds + 2, detail
        threads = _threads_settled(pid, warm.threads + 2)
        assert threads <= warm.threads + 2 + POOL_THREADS, f"{threads} threads now\n{detail}"
        assert end.rss < warm.rss * 1.05, detail
    finally:
        server.stop()
