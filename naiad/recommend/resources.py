"""CPU and memory of a server's process tree (its model processes included), sampled with psutil during a run."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import psutil


@dataclass
class Usage:
    cpu_cores_avg: float = 0.0    # CPU seconds per wall second over the run: 1.0 is one core busy
    cpu_cores_peak: float = 0.0   # the busiest sampling interval
    cpu_percent: float = 0.0      # cpu_cores_avg as a share of the machine's cores
    memory_mb_avg: float = 0.0    # proportional set size (shared pages split, so the sum over processes is fair)
    memory_mb_peak: float = 0.0
    processes: int = 0            # most processes seen in the tree at once
    samples: list[tuple[float, float, float]] = field(default_factory=list)   # (seconds, cores, MB)
    began_ns: int = 0             # CLOCK_MONOTONIC at the start: samples' seconds count from here
    memory_percent_peak: float = 0.0   # memory_mb_peak as a share of the machine's memory
    machine_cores_avg: float = 0.0     # every process on the machine (psutil's system-wide CPU times)

    def between(self, start_ns: int, end_ns: int) -> tuple[float | None, float | None]:
        """(cores, MB) averaged over the samples taken between two CLOCK_MONOTONIC instants (a load level)."""
        inside = [s for s in self.samples if start_ns <= self.began_ns + s[0] * 1e9 <= end_ns + 0.3e9]
        if not inside:
            return None, None
        return sum(s[1] for s in inside) / len(inside), sum(s[2] for s in inside) / len(inside)


def _tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _cpu_seconds(proc: psutil.Process) -> float | None:
    try:
        times = proc.cpu_times()
        return float(times.user + times.system)
    except psutil.Error:
        return None


def _memory(proc: psutil.Process) -> float:
    try:
        try:
            return float(proc.memory_full_info().pss)
        except (psutil.AccessDenied, AttributeError):
            return float(proc.memory_info().rss)   # where PSS is not readable
    except psutil.Error:
        return 0.0


def _busy_seconds() -> float:
    """CPU seconds every core of the machine spent on anything but idling."""
    times = psutil.cpu_times()
    return float(sum(getattr(times, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq")))


class Sampler:
    """``with Sampler(pid) as s: ...`` then ``s.usage``. CPU is counted per process from the start of the run
    (processes that appear later count from when first seen), so work done before the run is not counted."""

    def __init__(self, pid: int, interval_s: float = 0.25, exclude: int | None = None) -> None:
        self.root = psutil.Process(pid)
        self.exclude = exclude   # a child whose tree is not counted (the generator's sampler leaves the server out)
        self.interval_s = interval_s
        self.usage = Usage()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="recommend-sampler", daemon=True)
        self._base: dict[int, float] = {}
        self._last: dict[int, float] = {}

    def __enter__(self) -> Sampler:
        for proc in _tree(self.root):
            seconds = _cpu_seconds(proc)
            if seconds is not None:
                self._base[proc.pid] = self._last[proc.pid] = seconds
        self._began = time.monotonic()
        self.usage.began_ns = int(self._began * 1e9)
        self._machine = _busy_seconds()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample(time.monotonic())   # the tail since the last sample
        wall = time.monotonic() - self._began
        used = sum(self._last[pid] - self._base[pid] for pid in self._last)
        u = self.usage
        u.cpu_cores_avg = used / wall if wall > 0 else 0.0
        u.cpu_percent = 100.0 * u.cpu_cores_avg / (psutil.cpu_count() or 1)
        u.machine_cores_avg = (_busy_seconds() - self._machine) / wall if wall > 0 else 0.0
        if u.samples:
            u.cpu_cores_peak = max(s[1] for s in u.samples)
            u.memory_mb_avg = sum(s[2] for s in u.samples) / len(u.samples)
            u.memory_mb_peak = max(s[2] for s in u.samples)
            u.memory_percent_peak = 100.0 * u.memory_mb_peak * 2**20 / psutil.virtual_memory().total

    def _run(self) -> None:
        previous = self._began
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            self._sample(now, now - previous)
            previous = now

    def _sample(self, now: float, elapsed: float | None = None) -> None:
        procs = _tree(self.root)
        if self.exclude is not None:
            try:
                left_out = {p.pid for p in _tree(psutil.Process(self.exclude))}
            except psutil.Error:
                left_out = set()
            left_out.add(self.exclude)
            procs = [p for p in procs if p.pid not in left_out]
        delta = 0.0
        memory = 0.0
        for proc in procs:
            seconds = _cpu_seconds(proc)
            if seconds is None:
                continue
            self._base.setdefault(proc.pid, seconds)
            delta += seconds - self._last.get(proc.pid, seconds)
            self._last[proc.pid] = seconds
            memory += _memory(proc)
        self.usage.processes = max(self.usage.processes, len(procs))
        if elapsed:
            self.usage.samples.append((now - self._began, delta / elapsed, memory / 2**20))
