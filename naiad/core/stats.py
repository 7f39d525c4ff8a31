"""Per model-version statistics in the shape Triton reports them (``/v2/models/{m}/stats``)."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

_DURATIONS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)


FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


class Window:
    """The observations of the last ``max_age`` seconds, for a Prometheus summary's quantiles
    (``--metrics-config summary_latencies=true``; prometheus-cpp's summaries, which Triton uses, keep 60 s)."""

    __slots__ = ("observations", "max_age_ns", "total_ns", "count")

    def __init__(self, max_age_s: float = 60.0, limit: int = 200_000) -> None:
        self.observations: deque[tuple[int, int]] = deque(maxlen=limit)  # (monotonic ns, value ns)
        self.max_age_ns = int(max_age_s * 1e9)
        self.total_ns = 0  # _sum and _count cover every observation, as a summary's do
        self.count = 0

    def observe(self, ns: int) -> None:
        self.observations.append((time.monotonic_ns(), ns))
        self.total_ns += ns
        self.count += 1

    def quantiles(self, qs: list[float]) -> list[float]:
        """Each quantile of the recent observations, in nanoseconds (NaN with none, as prometheus-cpp writes)."""
        horizon = time.monotonic_ns() - self.max_age_ns
        while self.observations and self.observations[0][0] < horizon:
            self.observations.popleft()
        if not self.observations:
            return [float("nan")] * len(qs)
        values = sorted(v for _, v in self.observations)
        last = len(values) - 1
        return [float(values[min(last, int(q * len(values)))]) for q in qs]


class Duration:
    __slots__ = ("count", "ns", "window")

    def __init__(self, window: Window | None = None) -> None:
        self.count = 0
        self.ns = 0
        self.window = window

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns
        if self.window is not None:
            self.window.observe(ns // count if count > 1 else ns)

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


# The durations a summary covers when summaries are on (Triton's nv_inference_*_summary_us families).
SUMMARIZED = ("success", "queue", "compute_input", "compute_infer", "compute_output")


class ModelStats:
    """Counters for one model version. Single-threaded: only the event loop touches them."""

    summaries = False  # --metrics-config summary_latencies=true, set once at start-up

    __slots__ = ("inference_count", "execution_count", "last_inference_ms", "durations", "batch", "success", "fail",
                 "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss",
                 "fail_reasons", "refused", "last_refusal")

    def __init__(self) -> None:
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self.durations = {name: Duration(Window() if self.summaries and name in SUMMARIZED else None)
                          for name in _DURATIONS}
        self.success = self.durations["success"]
        self.fail = self.durations["fail"]
        self.queue = self.durations["queue"]
        self.compute_input = self.durations["compute_input"]
        self.compute_infer = self.durations["compute_infer"]
        self.compute_output = self.durations["compute_output"]
        self.cache_hit = self.durations["cache_hit"]
        self.cache_miss = self.durations["cache_miss"]
        # Why requests failed, as the failure metric's "reason" label: every fail.add goes through
        # record_failure, so the reasons sum to fail.count.
        self.fail_reasons: dict[str, int] = dict.fromkeys(FAILURE_REASONS, 0)
        # Of the OTHER failures, the requests the model's signature refused (a wrong input name, shape, datatype),
        # and the last one's message: the dashboard's reason for them.
        self.refused = 0
        self.last_refusal = ""
        # batch size -> [compute_input, compute_infer, compute_output] durations
        self.batch: dict[int, tuple[Duration, Duration, Duration]] = {}

    def record_failure(self, ns: int, reason: str = "OTHER") -> None:
        """A request that failed after ``ns``: REJECTED (refused by the scheduler, e.g. queue full or timed
        out), CANCELED, BACKEND (the execution failed) or OTHER."""
        self.fail.add(ns)
        self.fail_reasons[reason] += 1

    def record_refusal(self, ns: int, message: str) -> None:
        """A request refused before it reached the model (the signature check): a failure, reason OTHER."""
        self.record_failure(ns, "OTHER")
        self.refused += 1
        self.last_refusal = message

    def record_execution(self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int,
                         failed: bool = False, inferences: int | None = None) -> None:
        """One backend execution covering ``batch_size`` inferences; a failed one infers nothing. ``inferences``
        is less than ``batch_size`` when the batch holds padding (the sequence batcher's not-READY rows)."""
        self.execution_count += 1
        if not failed:
            self.inference_count += batch_size if inferences is None else inferences
            self.last_inference_ms = time.time_ns() // 1_000_000
        per_batch = self.batch.get(batch_size)
        if per_batch is None:
            per_batch = self.batch[batch_size] = (Duration(), Duration(), Duration())
        # Batch durations never keep a window: added in place, three calls fewer per execution.
        d_input, d_infer, d_output = per_batch
        d_input.count += 1
        d_input.ns += input_ns
        d_infer.count += 1
        d_infer.ns += infer_ns
        d_output.count += 1
        d_output.ns += output_ns

    def as_dict(self, name: str, version: str) -> dict[str, Any]:
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {k: d.as_dict() for k, d in self.durations.items()},
            "response_stats": {},
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": durs[0].as_dict(),
                    "compute_infer": durs[1].as_dict(),
                    "compute_output": durs[2].as_dict(),
                }
                for size, durs in sorted(self.batch.items())
            ],
            "memory_usage": [],
        }
