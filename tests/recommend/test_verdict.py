"""What limited the numbers, and whether they can choose: the spread over repeated runs, the generator's CPU
beside the server's, and Inference Recommender's metrics where the curve levels off."""

from __future__ import annotations

from pathlib import Path

import pytest

from naiad.bench.api import LoadResult, TrafficResult
from naiad.config import ModelConfig
from naiad.recommend.resources import Usage
from naiad.recommend.select import ir_metrics, limits, plateau, row, verdict
from naiad.recommend.sweep import Measured
from naiad.recommend.variants import Variant


def _level(users: int, throughput: float, p95_ms: float = 2.0) -> LoadResult:
    latency = {"avg": p95_ms * 500, "p50": p95_ms * 600, "p90": p95_ms * 900, "p95": p95_ms * 1000,
               "p99": p95_ms * 1200, "max": p95_ms * 1500}
    return LoadResult(concurrency=users, request_rate=None, requests=int(throughput * 5), errors=0, duration_s=5.0,
                      throughput=throughput, latency_us=latency, server={}, stable=True)


def _run(*throughputs: float) -> TrafficResult:
    levels = [_level(2 * (i + 1), t) for i, t in enumerate(throughputs)]
    best = max(levels, key=lambda lv: lv.throughput)
    return TrafficResult(levels=levels, stop_reason="completed", max_invocations_per_minute=best.throughput * 60,
                         latency_at_max_us=best.latency_us)


def _measured(kind: str, runs: list[TrafficResult], server_cores: float = 1.0, generator_cores: float = 0.5,
              machine_cores: float = 1.6) -> Measured:
    ordered = sorted(runs, key=lambda r: r.max_invocations_per_minute)
    m = Measured(Variant("onnxruntime", kind, ModelConfig(name="m"), kind), Path("/x"), setup_s=1.4,
                 traffic=ordered[len(ordered) // 2], runs=runs, generator_processes=2)
    m.usage = Usage(cpu_cores_avg=server_cores, memory_mb_avg=100.0, memory_mb_peak=120.0)
    m.generator_usage = Usage(cpu_cores_avg=generator_cores, machine_cores_avg=machine_cores)
    return m


def test_spread_over_runs_and_a_clear_winner() -> None:
    a = row(_measured("base", [_run(100, 150), _run(100, 160), _run(90, 140)]), None, None)
    b = row(_measured("x2", [_run(200, 300), _run(190, 280), _run(210, 320)]), None, None)
    assert (a.runs, a.max_throughput, a.max_throughput_low, a.max_throughput_high) == (3, 150, 140, 160)
    assert (b.max_throughput, b.max_throughput_low, b.max_throughput_high) == (300, 280, 320)
    assert a.spread == "140-160"
    decided, why = verdict([a, b], b, None, generator_limited=False)
    assert decided and "its slowest of 3 run(s), 280 inferences/s" in why and "(base, 160)" in why


def test_overlapping_runs_are_too_noisy_to_choose() -> None:
    a = row(_measured("base", [_run(250), _run(310), _run(260)]), None, None)
    b = row(_measured("x2", [_run(300), _run(240), _run(280)]), None, None)
    decided, why = verdict([a, b], b, None, generator_limited=False)
    assert not decided and why.startswith("too noisy to choose: x2 (240-300 inferences/s over 3 run(s)) and base")


def test_within_an_sla_the_spread_is_of_the_sla_throughput() -> None:
    # the second run of x2 never met the SLA: it counts as 0 within it, so the spreads overlap
    x2_runs = [_run(300), TrafficResult([_level(2, 400, p95_ms=50)], "completed", 400 * 60, {}), _run(310)]
    b = row(_measured("x2", x2_runs), 10, None)
    a = row(_measured("base", [_run(200), _run(210), _run(190)]), 10, None)
    assert (b.sla_throughput_low, b.sla_throughput_high) == (0, 310)
    assert not verdict([a, b], b, 10, generator_limited=False)[0]


def test_the_generator_as_the_limit_and_a_busy_machine() -> None:
    starved = row(_measured("base", [_run(100)], server_cores=0.3, generator_cores=1.8, machine_cores=2.1), None,
                  None)
    limited, notes = limits([starved], None)
    assert limited and notes[0].startswith("base: the load generator was the limit, not the server: the server "
                                           "used 0.30 of 1 core(s) while the generator's 2 process(es) used 1.80")
    assert not verdict([starved], starved, None, generator_limited=True)[0]
    busy = row(_measured("base", [_run(100)], server_cores=0.3, generator_cores=0.4, machine_cores=1.9), None, None)
    limited, notes = limits([busy], None)
    assert not limited and "busy with other work (1.20 cores" in notes[0]
    fine = row(_measured("base", [_run(100)], server_cores=0.9, generator_cores=1.8, machine_cores=2.0), None, None)
    assert limits([fine], None) == (False, [])
    # pinned to two cores, 0.9 of a core is idle
    assert limits([fine], {0, 1})[0]


def test_inference_recommender_metrics_where_the_curve_levels_off() -> None:
    # 100 -> 200 -> 205 -> 207: levels off at the second step (within 5 % of the best)
    m = _measured("base", [_run(100, 200, 205, 207)])
    level = plateau(m.traffic.levels)   # type: ignore[union-attr]
    assert level is not None and level.concurrency == 4
    metrics = ir_metrics(m, 0.36)
    assert metrics is not None
    assert metrics["MaxInvocations"] == 200 * 60 and metrics["ModelLatency"] == 1
    assert metrics["CpuUtilization"] == pytest.approx(100.0)   # one core busy: 100 %, as CloudWatch counts
    assert 0 < metrics["MemoryUtilization"] < 100
    assert metrics["CostPerInference"] == pytest.approx(0.36 / (200 * 3600))
    assert metrics["ModelSetupTime"] == 1


def test_a_run_without_a_level_within_the_sla_is_counted_not_drawn_as_zero() -> None:
    slow = TrafficResult(levels=[_level(2, 120, p95_ms=9.0), _level(4, 130, p95_ms=12.0)], stop_reason="completed",
                         max_invocations_per_minute=130 * 60, latency_at_max_us=_level(4, 130, 12.0).latency_us)
    r = row(_measured("base", [_run(100, 150), _run(100, 160), slow]), 5.0, None)
    assert (r.sla_throughput_low, r.sla_throughput_high) == (0.0, 160)   # the verdict's, conservative
    assert (r.sla_runs_met, r.sla_throughput_low_met) == (2, 150)
    assert r.sla_spread == "150-160 (2 of 3 runs)"
