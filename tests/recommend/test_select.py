"""The table's rows and the choice under a p95 SLA, from measured traffic results."""

from __future__ import annotations

from pathlib import Path

import pytest

from naiad.bench.api import LoadResult, TrafficResult
from naiad.config import ModelConfig
from naiad.recommend.resources import Usage
from naiad.recommend.select import choose, row
from naiad.recommend.sweep import Measured
from naiad.recommend.variants import Variant


def _level(users: int, throughput: float, p95_ms: float) -> LoadResult:
    latency = {"avg": p95_ms * 500, "p50": p95_ms * 600, "p90": p95_ms * 900, "p95": p95_ms * 1000,
               "p99": p95_ms * 1200, "max": p95_ms * 1500}
    return LoadResult(concurrency=users, request_rate=None, requests=int(throughput * 5), errors=0, duration_s=5.0,
                      throughput=throughput, latency_us=latency, server={}, stable=True)


def _measured(kind: str, levels: list[tuple[float, float]]) -> Measured:
    loads = [_level(2 * (i + 1), t, p) for i, (t, p) in enumerate(levels)]
    best = max(loads, key=lambda lv: lv.throughput)
    traffic = TrafficResult(levels=loads, stop_reason="completed",
                            max_invocations_per_minute=best.throughput * 60, latency_at_max_us=best.latency_us)
    m = Measured(Variant("onnxruntime", kind, ModelConfig(name="m"), kind), Path("/nonexistent"), setup_s=1.5,
                 load_duration_s=0.2, traffic=traffic)
    m.usage = Usage(cpu_cores_avg=1.5, cpu_percent=75.0, memory_mb_avg=100.0, memory_mb_peak=120.0)
    return m


# base: slow; batching: fastest at its top level but over 10 ms there; x2: best within 10 ms.
SWEEP = [
    _measured("base", [(100, 2.0), (150, 8.0)]),
    _measured("dynamic batching", [(200, 3.0), (400, 25.0)]),
    _measured("instance group x2", [(180, 2.5), (300, 9.0)]),
]


def test_row_figures() -> None:
    r = row(SWEEP[1], sla_p95_ms=10, price_per_hour=0.9)
    assert r.status == "measured" and r.max_invocations_per_minute == 400 * 60 and r.max_throughput == 400
    assert (r.p50_ms, r.p95_ms, r.p99_ms) == pytest.approx((15.0, 25.0, 30.0))
    assert (r.sla_throughput, r.sla_p95_ms, r.min_p95_ms) == (200, 3.0, 3.0)
    assert r.sla_invocations_per_minute == pytest.approx(200 * 60)
    assert r.cost_per_hour == 0.9
    assert r.cost_per_million == pytest.approx(0.9 / (400 * 3600) * 1e6)
    assert r.sla_cost_per_million == pytest.approx(0.9 / (200 * 3600) * 1e6)
    assert (r.cpu_cores, r.memory_mb_peak, r.setup_s, r.load_duration_s) == (1.5, 120.0, 1.5, 0.2)


def test_the_sla_picks_the_highest_throughput_that_meets_it() -> None:
    rows = [row(m, 10, None) for m in SWEEP]
    winner, reason = choose(rows, 10)
    assert winner is not None and winner.variant == "instance group x2"
    assert "300.0 inferences/s at p95 9.00 ms" in reason
    # a looser SLA lets dynamic batching's top level count
    winner, _ = choose([row(m, 30, None) for m in SWEEP], 30)
    assert winner is not None and winner.variant == "dynamic batching"


def test_without_sla_the_highest_throughput_wins() -> None:
    winner, reason = choose([row(m, None, None) for m in SWEEP], None)
    assert winner is not None and winner.variant == "dynamic batching" and "no SLA" in reason
    assert winner.cost_per_million is None and winner.sla_throughput is None


def test_no_variant_meets_the_sla() -> None:
    winner, reason = choose([row(m, 1.0, 1.0) for m in SWEEP], 1.0)
    assert winner is None
    assert reason.startswith("no variant meets the SLA p95 <= 1 ms")
    assert "lowest p95 was 2.00 ms, base" in reason


def test_failed_variants_are_rows_but_never_win() -> None:
    failed = Measured(Variant("pytorch", "base", ModelConfig(), "pytorch: base"), Path("/x"),
                      error="the server exited with code 1")
    rows = [row(failed, None, 1.0), row(SWEEP[0], None, 1.0)]
    assert rows[0].status == "failed" and rows[0].max_throughput is None and rows[0].cost_per_million is None
    winner, _ = choose(rows, None)
    assert winner is not None and winner.variant == "base"
    assert choose(rows[:1], None) == (None, "no variant could be measured")


def test_the_max_is_the_level_the_bench_counted() -> None:
    # with ModelLatencyThresholds the bench's max is the best level within them, not the fastest one
    m = _measured("base", [(100, 2.0), (150, 80.0)])
    assert m.traffic is not None
    first = m.traffic.levels[0]
    m.traffic.max_invocations_per_minute, m.traffic.latency_at_max_us = 100 * 60, first.latency_us
    r = row(m, None, 1.0)
    assert (r.max_invocations_per_minute, r.max_throughput, r.p95_ms) == (6000, 100, 2.0)
    assert r.cost_per_million == pytest.approx(1.0 / (100 * 3600) * 1e6)
