"""SageMaker Inference Recommender's load tests, locally: a TrafficPattern (PHASES or STAIRS of concurrent users,
each user sending its next request as soon as the previous one answers) run until it completes or one of the
StoppingConditions holds. The JSON shapes are CreateInferenceRecommendationsJob's, so a job's
``InputConfig.TrafficPattern`` and ``StoppingConditions`` can be passed as they are.

Stopping conditions are judged every tick (1 s, or less for short steps) on that tick's requests:
  MaxInvocations          the observed rate reached this many requests per minute
  ModelLatencyThresholds  the tick's latency at the given percentile ("P95") exceeded ValueInMilliseconds
  FlatInvocations "Stop"  (the default) users grew twice in a row without throughput growing 5 %: capacity
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from naiad.bench.load import Records

FLAT_GAIN = 0.05      # a user increase that buys less than this much throughput is "flat"
FLAT_STREAK = 2       # that many flat increases in a row: the instance has reached capacity


class TrafficError(ValueError):
    pass


@dataclass
class Level:
    name: str
    duration_s: float
    initial_users: int
    spawn_per_minute: float = 0.0

    def users_at(self, elapsed_s: float) -> int:
        return max(1, self.initial_users + int(math.floor(self.spawn_per_minute * elapsed_s / 60.0)))


def _int(block: dict[str, Any], key: str, default: int | None = None, minimum: int = 0) -> int:
    if key not in block:
        if default is None:
            raise TrafficError(f"TrafficPattern: {key} is required")
        return default
    value = block[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise TrafficError(f"TrafficPattern: {key} must be an integer >= {minimum}, got {value!r}")
    return value


def plan(traffic: dict[str, Any]) -> list[Level]:
    """The load levels a TrafficPattern describes (one per phase, one per stair step)."""
    traffic = traffic.get("TrafficPattern", traffic)   # a whole InputConfig-style document is accepted too
    kind = str(traffic.get("TrafficType", "STAIRS" if "Stairs" in traffic else "PHASES")).upper()
    if kind == "PHASES":
        phases = traffic.get("Phases") or []
        if not phases:
            raise TrafficError("TrafficPattern: TrafficType PHASES needs a non-empty Phases list")
        return [Level(f"phase {i + 1}", _int(p, "DurationInSeconds", minimum=1),
                      _int(p, "InitialNumberOfUsers", 1, minimum=1), _int(p, "SpawnRate", 0))
                for i, p in enumerate(phases)]
    if kind == "STAIRS":
        stairs = traffic.get("Stairs") or {}
        steps = _int(stairs, "NumberOfSteps", minimum=1)
        per = _int(stairs, "UsersPerStep", minimum=1)
        duration = _int(stairs, "DurationInSeconds", minimum=1)
        return [Level(f"step {i + 1}", duration, per * (i + 1)) for i in range(steps)]
    raise TrafficError(f"TrafficPattern: unknown TrafficType '{kind}' (PHASES or STAIRS)")


@dataclass
class Stopping:
    max_invocations: float | None = None      # per minute
    latency_percentile: float | None = None
    latency_ms: float | None = None
    flat_stop: bool = True

    @classmethod
    def parse(cls, stopping: dict[str, Any] | None) -> "Stopping":
        stopping = (stopping or {}).get("StoppingConditions", stopping or {})
        out = cls()
        if stopping.get("MaxInvocations") is not None:
            out.max_invocations = float(stopping["MaxInvocations"])
        thresholds = stopping.get("ModelLatencyThresholds") or []
        if thresholds:
            first = thresholds[0]
            text = str(first.get("Percentile", "P95")).strip().upper().lstrip("P")
            try:
                out.latency_percentile = float(text)
            except ValueError:
                raise TrafficError(f"ModelLatencyThresholds: bad Percentile {first.get('Percentile')!r}") from None
            out.latency_ms = float(first["ValueInMilliseconds"])
        flat = str(stopping.get("FlatInvocations", "Stop"))
        if flat not in ("Stop", "Continue"):
            raise TrafficError(f"FlatInvocations must be Continue or Stop, got '{flat}'")
        out.flat_stop = flat == "Stop"
        return out


class FlatDetector:
    """Throughput by user count, in the order user counts appear; flat after FLAT_STREAK increases that each
    gained less than FLAT_GAIN."""

    def __init__(self) -> None:
        self.levels: list[tuple[int, list[float]]] = []

    def add(self, users: int, throughput: float) -> None:
        if self.levels and self.levels[-1][0] == users:
            self.levels[-1][1].append(throughput)
        else:
            self.levels.append((users, [throughput]))

    def flat(self) -> bool:
        if len(self.levels) < FLAT_STREAK + 1:
            return False
        recent = self.levels[-(FLAT_STREAK + 1):]
        if any(b[0] <= a[0] for a, b in zip(recent, recent[1:])):
            return False   # users did not grow at each change
        means = [sum(v) / len(v) for _, v in recent]
        base = means[0]
        return base > 0 and all(m < base * (1 + FLAT_GAIN) for m in means[1:])


def latency_at(latencies_ns: list[int], percentile: float) -> float:
    """Milliseconds at the percentile (perf_analyzer's index rule) of sorted latencies."""
    if not latencies_ns:
        return 0.0
    index = int((percentile / 100.0) * (len(latencies_ns) - 1) + 0.5)
    return latencies_ns[index] / 1e6


def window_latencies(records: Records, start_ns: int, end_ns: int) -> list[int]:
    return sorted(e - s for s, e in zip(records.starts, records.ends) if start_ns <= e <= end_ns)


def tick_length(level: Level) -> float:
    return max(0.25, min(1.0, level.duration_s / 4))


Check = Callable[[Records, int, int, int], str | None]


def check_stop(stopping: Stopping, flat: FlatDetector) -> Check:
    """A function of one tick's records -> the stopping condition that holds, if any."""

    def check(records: Records, start_ns: int, end_ns: int, users: int) -> str | None:
        seconds = (end_ns - start_ns) / 1e9
        done = sum(1 for e in records.ends if start_ns <= e <= end_ns)
        per_minute = done / seconds * 60 if seconds > 0 else 0.0
        if stopping.max_invocations is not None and per_minute >= stopping.max_invocations:
            return "MaxInvocations"
        if stopping.latency_ms is not None and stopping.latency_percentile is not None and done:
            observed = latency_at(window_latencies(records, start_ns, end_ns), stopping.latency_percentile)
            if observed > stopping.latency_ms:
                return "ModelLatencyThresholds"
        flat.add(users, per_minute)
        if stopping.flat_stop and flat.flat():
            return "FlatInvocations"
        return None

    return check


def now_ns() -> int:
    return time.monotonic_ns()


def aws_limits(traffic: dict[str, Any], stopping: dict[str, Any] | None = None) -> list[str]:
    """Where a pattern goes beyond what CreateInferenceRecommendationsJob accepts (its API reference: Phase,
    Stairs, RecommendationJobStoppingConditions), each as a sentence. A local run may (short steps are what make
    it quick); the same file would be refused by SageMaker."""
    traffic = traffic.get("TrafficPattern", traffic)
    kind = str(traffic.get("TrafficType", "STAIRS" if "Stairs" in traffic else "PHASES")).upper()
    out = []
    if kind == "PHASES":
        for i, phase in enumerate(traffic.get("Phases") or [], 1):
            duration = phase.get("DurationInSeconds")
            if isinstance(duration, int) and not 120 <= duration <= 3600:
                out.append(f"Phases[{i}].DurationInSeconds is {duration}: SageMaker takes 120 to 3600 for a "
                           "custom load test")
            users = phase.get("InitialNumberOfUsers", 1)
            if isinstance(users, int) and not 1 <= users <= 3:
                out.append(f"Phases[{i}].InitialNumberOfUsers is {users}: SageMaker takes 1 to 3")
    elif kind == "STAIRS":
        per = (traffic.get("Stairs") or {}).get("UsersPerStep")
        if isinstance(per, int) and not 1 <= per <= 3:
            out.append(f"Stairs.UsersPerStep is {per}: SageMaker takes 1 to 3")
    stopping = (stopping or {}).get("StoppingConditions", stopping or {})
    thresholds = stopping.get("ModelLatencyThresholds") or []
    if len(thresholds) > 1:
        out.append(f"ModelLatencyThresholds holds {len(thresholds)} entries: SageMaker takes one (naiad uses the "
                   "first)")
    for threshold in thresholds[:1]:
        percentile = str(threshold.get("Percentile", "P95")).upper()
        if percentile not in ("P95", "P99"):
            out.append(f"ModelLatencyThresholds Percentile is {threshold.get('Percentile')!r}: SageMaker takes P95 "
                       "or P99 (P95 for custom load tests)")
    return [f"{line}; this local run goes on, but SageMaker would refuse the job as written" for line in out]
