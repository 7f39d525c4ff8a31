"""Per-second figures for the dashboard, measured only while a page is open.

The infer path already keeps the counters ``/stats`` reports (``ModelStats``). While a dashboard polls, a timer
samples them once a second: rates and mean queue / compute times are differences between two samples, so they
cost the infer path nothing. Percentiles need the latencies themselves: while watched, each version's ``success``
duration gets a ``Window`` (the one ``--metrics-config summary_latencies=true`` keeps, reused when it is on), which
``Duration.add`` already fills when present -- one deque append per request, and only while someone watches. The
windows are removed when the page has not asked for ``IDLE_AFTER_S``; from then on nothing runs at all.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from itertools import islice

from naiad.core.stats import ModelStats, Window
from naiad.repository.manager import ModelRepository
from naiad.repository.model import ModelVersion

HISTORY = 60  # samples the rate chart shows (one a second)
IDLE_AFTER_S = 10.0  # no feed request for this long: every page is closed, sampling stops
PERCENTILE_S = 10.0  # p50 / p99 cover the last this many seconds ...
PERCENTILE_LIMIT = 4096  # ... or the last this many requests, whichever is fewer (a bounded sort per second)


class Series:
    """One model version's samples: the counters at the previous tick and the figures since."""

    __slots__ = ("stats", "window", "own_window", "at", "done", "failed", "queue", "compute", "rate", "error_rate",
                 "queue_ms", "compute_ms", "p50_ms", "p99_ms", "history")

    def __init__(self, stats: ModelStats, now: float) -> None:
        self.stats = stats
        window = stats.success.window
        self.own_window = window is None  # summaries off: this window is ours, removed when watching stops
        if window is None:
            window = stats.success.window = Window(PERCENTILE_S, PERCENTILE_LIMIT)
        self.window = window
        self.at = now
        self.done, self.failed, self.queue, self.compute = _counters(stats)
        self.rate = self.error_rate = 0.0
        self.queue_ms: float | None = None
        self.compute_ms: float | None = None
        self.p50_ms: float | None = None
        self.p99_ms: float | None = None
        self.history: deque[float] = deque(maxlen=HISTORY)

    def sample(self, now: float) -> None:
        elapsed = now - self.at
        if elapsed <= 0:
            return
        done, failed, queue, compute = _counters(self.stats)
        self.rate = (done - self.done) / elapsed
        self.error_rate = (failed - self.failed) / elapsed
        self.queue_ms = _mean_ms(queue, self.queue)
        self.compute_ms = _mean_ms(compute, self.compute)
        self.at, self.done, self.failed, self.queue, self.compute = now, done, failed, queue, compute
        self.history.append(round(self.rate, 2))
        self._percentiles()

    def _percentiles(self) -> None:
        horizon = time.monotonic_ns() - int(PERCENTILE_S * 1e9)
        recent: list[int] = []
        # Newest first, PERCENTILE_LIMIT at most (a summary's window, when reused, may hold many more).
        for at, ns in islice(reversed(self.window.observations), PERCENTILE_LIMIT):
            if at < horizon:
                break
            recent.append(ns)
        recent.sort()
        if not recent:
            self.p50_ms = self.p99_ms = None
            return
        last = len(recent) - 1
        self.p50_ms = recent[min(last, int(0.50 * len(recent)))] / 1e6
        self.p99_ms = recent[min(last, int(0.99 * len(recent)))] / 1e6

    def release(self) -> None:
        """Stop recording latencies (only a window this series added; a summary's stays)."""
        if self.own_window and self.stats.success.window is self.window:
            self.stats.success.window = None


def _counters(stats: ModelStats) -> tuple[int, int, tuple[int, int], tuple[int, int]]:
    """(requests ended, of which failed, (queue count, ns), (compute count, ns))."""
    compute_ns = stats.compute_input.ns + stats.compute_infer.ns + stats.compute_output.ns
    return (stats.success.count + stats.fail.count, stats.fail.count, (stats.queue.count, stats.queue.ns),
            (stats.compute_infer.count, compute_ns))


def _mean_ms(now: tuple[int, int], before: tuple[int, int]) -> float | None:
    count = now[0] - before[0]
    return (now[1] - before[1]) / count / 1e6 if count > 0 else None


class Watcher:
    """Samples every loaded version once a second while feed requests keep coming; one per service."""

    def __init__(self, repository: ModelRepository) -> None:
        self.repository = repository
        self.series: dict[tuple[str, int], Series] = {}
        self.last_seen = 0.0
        self.started = time.time()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def watching(self) -> bool:
        return self._timer is not None

    def touch(self) -> None:
        """A page asked for the feed: keep sampling (start now if it had stopped)."""
        self.last_seen = time.monotonic()
        if self._timer is None:
            self._tick()

    def _tick(self) -> None:
        now = time.monotonic()
        if now - self.last_seen > IDLE_AFTER_S:
            self.stop()
            return
        self.sample(now)
        self._timer = asyncio.get_running_loop().call_later(1.0, self._tick)

    def sample(self, now: float) -> None:
        current: dict[tuple[str, int], ModelVersion] = {
            (name, version): model for name, entry in list(self.repository.models.items())
            for version, model in list(entry.versions.items())}
        for key in [k for k, s in self.series.items() if k not in current or current[k].stats is not s.stats]:
            self.series.pop(key).release()  # unloaded, or reloaded with new statistics
        for key, model in current.items():
            series = self.series.get(key)
            if series is None:
                self.series[key] = Series(model.stats, now)  # its first figures come with the next tick
            else:
                series.sample(now)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for series in self.series.values():
            series.release()
        self.series.clear()

