"""The Python API of ``naiad bench``: one load level measured as perf_analyzer measures it, and Inference
Recommender's traffic patterns with its stopping conditions. ``naiad recommend`` builds on these; the CLI
(``naiad.bench.cli``) is a perf_analyzer-shaped front end over the same session.

    from naiad.bench.api import Target, measure, run_traffic
    r = measure(Target("127.0.0.1:8000", "add_sub"), concurrency=4, measurement_interval_ms=1000)
    r.throughput, r.latency_us["p95"], r.server["compute_infer"]
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from naiad.bench.control import stats_delta
from naiad.bench.load import Records
from naiad.bench.session import Options, Progress, Session, Settings, ceiling
from naiad.bench.stats import PerfStatus, server_breakdown
from naiad.bench.traffic import FlatDetector, Stopping, check_stop, plan, tick_length

__all__ = ["Target", "LoadResult", "TrafficResult", "measure", "run_traffic", "ceiling", "Options", "Settings",
           "Session"]


@dataclass
class Target:
    url: str                 # "127.0.0.1:8000" (HTTP) or "127.0.0.1:8001" (gRPC)
    model: str
    protocol: str = "http"   # "http" | "grpc"
    version: str = ""
    batch_size: int = 1
    input_data: str = "random"   # "zero" | "random" | path to perf_analyzer JSON
    shapes: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class LoadResult:
    concurrency: int | None
    request_rate: float | None
    requests: int            # completed requests counted in the measurement
    errors: int
    duration_s: float
    throughput: float        # inferences/s (requests * batch / s)
    latency_us: dict[str, float]   # "avg", "p50", "p90", "p95", "p99", "max" (and "p<N>" for --percentile N)
    server: dict[str, float]       # per-request server-side averages in us from /stats deltas: "queue",
                                   # "compute_input", "compute_infer", "compute_output", "overhead", "request"
    stable: bool             # measure(): perf_analyzer's stability rule held; traffic levels: ran their full time
    completed_total: int = 0     # every request answered successfully during the call (warm-up and all windows)
    errors_total: int = 0
    error: str | None = None     # the first error seen, if any
    server_requests: int = 0     # the server's successful request count over the measured windows
    send_rate: float = 0.0       # requests/s the generator sent
    delayed: int = 0             # request-rate mode: requests sent late against their schedule
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)   # --collect-metrics, merged
    perf: PerfStatus | None = field(default=None, repr=False, compare=False)
    start_ns: int = 0        # traffic levels: when the level began and ended (CLOCK_MONOTONIC)
    end_ns: int = 0


@dataclass
class TrafficResult:
    levels: list[LoadResult]    # one per phase/stair step measured
    stop_reason: str            # "completed" | "MaxInvocations" | "ModelLatencyThresholds" | "FlatInvocations"
    max_invocations_per_minute: float
    latency_at_max_us: dict[str, float]
    completed_total: int = 0
    errors_total: int = 0
    duration_s: float = 0.0


def _latency_dict(latencies_ns: list[int], avg_ns: int | None = None, extra: int = -1) -> dict[str, float]:
    if not latencies_ns:
        return {"avg": 0.0, "p50": 0.0, "p90": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0}
    n = len(latencies_ns)
    out = {"avg": (avg_ns if avg_ns is not None else sum(latencies_ns) / n) / 1000}
    wanted = [50, 90, 95, 99] + ([extra] if extra not in (-1, 50, 90, 95, 99) else [])
    for p in wanted:
        out[f"p{p}"] = latencies_ns[int((p / 100.0) * (n - 1) + 0.5)] / 1000
    out["max"] = latencies_ns[-1] / 1000
    return out


def _server_dict(server: dict[str, int]) -> dict[str, float]:
    if not server:
        return {}
    b = server_breakdown(server)
    return {key: float(b[key]) for key in ("queue", "compute_input", "compute_infer", "compute_output", "overhead",
                                           "request")}


def to_result(status: PerfStatus, session: Session, percentile: int = -1) -> LoadResult:
    c = status.client
    return LoadResult(
        concurrency=status.concurrency or None, request_rate=status.request_rate or None,
        requests=c.request_count, errors=c.errors, duration_s=c.duration_ns / 1e9, throughput=c.infer_per_sec,
        latency_us=_latency_dict(c.latencies, c.avg_latency_ns if c.latencies else None, percentile),
        server=_server_dict(status.server), stable=status.stable, completed_total=session.completed_total,
        errors_total=session.errors_total, error=session.first_error or status.error,   # the server's words first
        server_requests=status.server.get("success_count", 0), send_rate=status.send_request_rate,
        delayed=c.delayed_request_count, metrics=status.metrics, perf=status)


def measure(target: Target, *, concurrency: int | None = None, request_rate: float | None = None,
            distribution: str = "constant", measurement_interval_ms: int = 5000, stability_percentage: float = 10,
            max_trials: int = 10, processes: int | None = None, measurement_mode: str = "time_windows",
            measurement_request_count: int = 50, percentile: int = -1, latency_threshold_ms: int = 0,
            options: Options | None = None, progress: Progress | None = None) -> LoadResult:
    """One load level (a concurrency, or a request rate) measured until stable (perf_analyzer's rule) or
    ``max_trials`` windows. Workers start, measure, drain (every request in flight answered) and stop."""
    settings = Settings(measurement_interval_ms=measurement_interval_ms, measurement_mode=measurement_mode,
                        measurement_request_count=measurement_request_count,
                        stability_percentage=stability_percentage, max_trials=max_trials, percentile=percentile,
                        latency_threshold_ms=latency_threshold_ms, distribution=distribution)
    session = Session(target, settings, options, processes, progress)
    try:
        status = session.profile(concurrency=None if request_rate else (concurrency or 1), request_rate=request_rate)
        session.stop()
        return to_result(status, session, percentile)
    finally:
        session.close()


def run_traffic(target: Target, traffic: dict, stopping: dict | None = None, processes: int | None = None,
                options: Options | None = None, progress: Progress | None = None) -> TrafficResult:
    """traffic / stopping: the JSON shapes of SageMaker CreateInferenceRecommendationsJob's TrafficPattern and
    StoppingConditions (the bare objects, or documents holding them under those keys)."""
    levels = plan(traffic)
    conditions = Stopping.parse(stopping)
    session = Session(target, Settings(), options, processes)
    try:
        return _run_levels(session, levels, conditions, progress)
    finally:
        session.close()


def _run_levels(session: Session, levels: list[Any], conditions: Stopping, progress: Progress | None) -> TrafficResult:
    assert session.generator is not None
    flat = FlatDetector()
    check = check_stop(conditions, flat)
    results: list[LoadResult] = []
    reason = "completed"
    started = time.monotonic()
    for level in levels:
        tick = tick_length(level)
        level_start = time.monotonic_ns()
        stats_start = session._server_stats()
        users = level.users_at(0)
        session.generator.set_concurrency(users)
        session._collect(session.generator.swap())   # requests of the previous level stay with it
        level_records = Records()
        tick_start = level_start
        finished = True
        while True:
            elapsed = (time.monotonic_ns() - level_start) / 1e9
            left = level.duration_s - elapsed
            if left <= 0:
                break
            time.sleep(min(tick, left))
            tick_end = time.monotonic_ns()
            records = session.generator.swap()
            session._collect(records)
            level_records.extend(records)
            hit = check(level_records, tick_start, tick_end, users) if tick_end - tick_start > 0.2e9 else None
            if progress is not None:
                progress({"label": level.name, "users": users, "elapsed": (tick_end - level_start) / 1e9,
                          "duration": level.duration_s, "records": level_records, "tick": (tick_start, tick_end)})
            tick_start = tick_end
            if hit:
                reason, finished = hit, False
                break
            now_users = level.users_at((time.monotonic_ns() - level_start) / 1e9)
            if now_users != users:
                users = now_users
                session.generator.set_concurrency(users)
        level_end = time.monotonic_ns()
        stats_end = session._server_stats()
        results.append(_level_result(session, level_records, level_start, level_end, users,
                                     stats_delta(stats_start.get(session.model.name),
                                                 stats_end.get(session.model.name)), finished))
        if reason != "completed":
            break
    session.stop()
    ok_levels = results
    if conditions.latency_ms is not None and conditions.latency_percentile is not None:
        key = f"p{int(conditions.latency_percentile)}"
        within = [r for r in results if r.latency_us.get(key, r.latency_us["p99"]) <= conditions.latency_ms * 1000]
        ok_levels = within or results
    best = max(ok_levels, key=lambda r: r.throughput) if ok_levels else None
    per_minute = (best.requests / best.duration_s * 60) if best and best.duration_s else 0.0
    for result in results:
        result.completed_total, result.errors_total = session.completed_total, session.errors_total
    return TrafficResult(levels=results, stop_reason=reason, max_invocations_per_minute=per_minute,
                         latency_at_max_us=dict(best.latency_us) if best else {},
                         completed_total=session.completed_total, errors_total=session.errors_total,
                         duration_s=time.monotonic() - started)


def _level_result(session: Session, records: Records, start_ns: int, end_ns: int, users: int,
                  server: dict[str, int], finished: bool) -> LoadResult:
    latencies = sorted(e - s for s, e in zip(records.starts, records.ends) if start_ns <= e <= end_ns)
    seconds = (end_ns - start_ns) / 1e9
    batch = max(1, session.target.batch_size)
    return LoadResult(concurrency=users, request_rate=None, requests=len(latencies), errors=records.errors,
                      duration_s=seconds, throughput=len(latencies) * batch / seconds if seconds else 0.0,
                      latency_us=_latency_dict(latencies), server=_server_dict(server), stable=finished,
                      error=records.error, server_requests=server.get("success_count", 0),
                      send_rate=records.sent / seconds if seconds else 0.0, start_ns=start_ns, end_ns=end_ns)
