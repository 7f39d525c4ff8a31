"""The parent's handle on the worker processes: start them (one per core given), split the concurrency or the
request rate between them, swap their request records out, stop them cleanly."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

from multiprocessing.connection import Connection


def available_cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:
        return list(range(os.cpu_count() or 1))


_COUNTERS = ("completed", "errors", "sent", "request_ns", "send_ns", "receive_ns")  # summed when records merge


@dataclass
class Records:
    """Completed requests (start/end ns, CLOCK_MONOTONIC) plus the counters that go with them."""

    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    delayed: list[int] = field(default_factory=list)
    responses: list[int] = field(default_factory=list)
    completed: int = 0
    errors: int = 0
    sent: int = 0
    request_ns: int = 0
    send_ns: int = 0
    receive_ns: int = 0
    error: str | None = None

    def add(self, part: dict[str, Any]) -> None:
        self.starts += array("q", part["starts"]).tolist()
        self.ends += array("q", part["ends"]).tolist()
        self.delayed += array("b", part["delayed"]).tolist()
        self.responses += array("i", part["responses"]).tolist()
        for key in _COUNTERS:
            setattr(self, key, getattr(self, key) + part[key])
        self.error = self.error or part["error"]

    def extend(self, other: "Records") -> None:
        """Another batch of records (a worker's report, a tick) appended to these."""
        self.starts += other.starts
        self.ends += other.ends
        self.delayed += other.delayed
        self.responses += other.responses
        for key in _COUNTERS:
            setattr(self, key, getattr(self, key) + getattr(other, key))
        self.error = self.error or other.error


class GeneratorError(RuntimeError):
    pass


class Generator:
    def __init__(self, spec: dict[str, Any], processes: int | None = None, cpus: list[int] | None = None) -> None:
        cores = cpus or available_cores()
        self.count = max(1, processes or len(cores))
        self.pipes: list[Connection] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.closed = False
        # Fresh interpreters (not fork: the parent may hold gRPC threads; not multiprocessing's spawn: that
        # re-imports the caller's __main__), each given one end of a socket pair.
        for index in range(self.count):
            parent, child = socket.socketpair()
            cpu = cores[index % len(cores)] if cpus else None
            proc = subprocess.Popen(
                # -c puts the current folder first, where a clone's naiad/ would shadow this one
                [sys.executable, "-c", "import sys; getattr(sys.flags, 'safe_path', 0) or sys.path.pop(0); "
                 "from naiad.bench.worker import child; child(int(sys.argv[1]))",
                 str(child.fileno())], pass_fds=[child.fileno()], env=_child_env())
            child.close()
            pipe = Connection(parent.detach())
            pipe.send(({**spec, "index": index}, cpu))
            self.pipes.append(pipe)
            self.procs.append(proc)
        for index, pipe in enumerate(self.pipes):
            if not pipe.poll(60):
                self.close()
                raise GeneratorError(f"load worker {index} did not start")
            pipe.recv()
        self.concurrency = 0
        self.rate = 0.0

    def _share(self, total: int) -> list[int]:
        return [total // self.count + (1 if i < total % self.count else 0) for i in range(self.count)]

    def set_concurrency(self, total: int) -> None:
        self.concurrency, self.rate = total, 0.0
        for pipe, share in zip(self.pipes, self._share(total)):
            pipe.send(("concurrency", share))

    def set_rate(self, rate: float, distribution: str = "constant", seed: int = 0) -> None:
        """Each worker runs rate/N on its own schedule, offset so the N schedules interleave evenly."""
        self.concurrency, self.rate = 0, rate
        per = rate / self.count
        for index, pipe in enumerate(self.pipes):
            pipe.send(("rate", per, index / rate if rate > 0 else 0.0, distribution, seed * 1000 + index))

    def set_intervals(self, intervals_us: list[int]) -> None:
        """--request-intervals: request k of the repeated schedule goes to worker k mod N, at its own time."""
        self.concurrency = 0
        self.rate = len(intervals_us) * 1e6 / sum(intervals_us)
        due, cycle = [], 0
        for _ in range(self.count):   # N passes over the file: each worker gets whole passes of its own
            for interval in intervals_us:
                cycle += interval * 1000
                due.append(cycle)
        for index, pipe in enumerate(self.pipes):
            mine = due[index::self.count]
            gaps = [b - a for a, b in zip(mine, mine[1:])] + [cycle - mine[-1] + mine[0]]
            pipe.send(("intervals", mine[0] - due[0], gaps))

    def swap(self) -> Records:
        for pipe in self.pipes:
            pipe.send(("swap",))
        return self._collect()

    def _collect(self) -> Records:
        records = Records()
        for index, pipe in enumerate(self.pipes):
            if not pipe.poll(60):
                raise GeneratorError(f"load worker {index} stopped answering")
            try:
                records.add(pipe.recv())
            except EOFError:
                raise GeneratorError(f"load worker {index} exited") from None
        return records

    def stop(self) -> Records:
        """Stop sending; every request in flight completes and is returned."""
        if self.closed:
            return Records()
        for pipe in self.pipes:
            pipe.send(("stop",))
        try:
            return self._collect()
        finally:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        deadline = time.monotonic() + 5
        for pipe in self.pipes:
            pipe.close()   # a worker still waiting reads EOF and leaves
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _child_env() -> dict[str, str]:
    """The worker imports naiad from wherever this process did."""
    import naiad

    root = os.path.dirname(os.path.dirname(os.path.abspath(naiad.__file__)))
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}
