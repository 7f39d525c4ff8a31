"""Inference Recommender's traffic patterns and stopping conditions: the JSON shapes CreateInferenceRecommendationsJob
takes, and live runs that end when they should."""

from __future__ import annotations

import pytest

from naiad.bench.api import Target, run_traffic
from naiad.bench.control import Control
from naiad.bench.traffic import FlatDetector, Stopping, TrafficError, plan
from tests.server import RunningServer


def test_phases_and_stairs_plans() -> None:
    phases = plan({"TrafficType": "PHASES", "Phases": [
        {"InitialNumberOfUsers": 2, "SpawnRate": 60, "DurationInSeconds": 120},
        {"InitialNumberOfUsers": 1, "DurationInSeconds": 10}]})
    assert [(p.initial_users, p.spawn_per_minute, p.duration_s) for p in phases] == [(2, 60, 120), (1, 0, 10)]
    assert [phases[0].users_at(t) for t in (0, 0.9, 1.0, 30)] == [2, 2, 3, 32]   # SpawnRate: new users per minute
    stairs = plan({"TrafficPattern": {"TrafficType": "STAIRS",
                                      "Stairs": {"DurationInSeconds": 30, "NumberOfSteps": 3, "UsersPerStep": 2}}})
    assert [(s.initial_users, s.duration_s) for s in stairs] == [(2, 30), (4, 30), (6, 30)]
    for bad in ({"TrafficType": "PHASES", "Phases": []}, {"TrafficType": "WAVES"},
                {"TrafficType": "STAIRS", "Stairs": {"NumberOfSteps": 0, "UsersPerStep": 1, "DurationInSeconds": 1}},
                {"TrafficType": "PHASES", "Phases": [{"InitialNumberOfUsers": 1}]}):
        with pytest.raises(TrafficError):
            plan(bad)


def test_stopping_conditions_shape() -> None:
    s = Stopping.parse({"MaxInvocations": 300, "FlatInvocations": "Continue",
                        "ModelLatencyThresholds": [{"Percentile": "P95", "ValueInMilliseconds": 100}]})
    assert (s.max_invocations, s.latency_percentile, s.latency_ms, s.flat_stop) == (300, 95, 100, False)
    assert Stopping.parse(None).flat_stop   # FlatInvocations defaults to Stop
    with pytest.raises(TrafficError):
        Stopping.parse({"FlatInvocations": "Maybe"})


def test_flat_means_two_user_increases_without_gain() -> None:
    flat = FlatDetector()
    for users, rate in ((1, 100), (1, 102), (2, 190), (3, 250)):
        flat.add(users, rate)
    assert not flat.flat()
    flat.add(4, 255)
    assert not flat.flat()                 # one flat increase so far
    flat.add(5, 252)
    assert flat.flat()                     # 3 -> 4 -> 5 users, throughput within 5 %
    same = FlatDetector()
    for _ in range(5):
        same.add(2, 100)
    assert not same.flat()                 # constant users never read as flat


def _success(server: RunningServer, model: str) -> int:
    control = Control(server.url, "http")
    try:
        return control.stats(model)[model]["success_count"]
    finally:
        control.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_phases_run_to_completion(bench_server: RunningServer, protocol: str) -> None:
    url = bench_server.grpc_url if protocol == "grpc" else bench_server.url
    before = _success(bench_server, "add_sub")
    result = run_traffic(Target(url, "add_sub", protocol=protocol), {"TrafficType": "PHASES", "Phases": [
        {"InitialNumberOfUsers": 1, "SpawnRate": 120, "DurationInSeconds": 1},
        {"InitialNumberOfUsers": 2, "SpawnRate": 0, "DurationInSeconds": 1}]}, processes=1)
    assert result.stop_reason == "completed"
    assert len(result.levels) == 2 and all(level.stable for level in result.levels)
    assert result.levels[0].concurrency in (2, 3) and result.levels[1].concurrency == 2
    assert result.completed_total == _success(bench_server, "add_sub") - before
    assert result.max_invocations_per_minute > 0
    for level in result.levels:
        lat = level.latency_us
        assert level.requests > 0 and 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]


def test_max_invocations_stops_the_run(bench_server: RunningServer) -> None:
    result = run_traffic(Target(bench_server.url, "add_sub"),
                         {"TrafficType": "PHASES", "Phases": [{"InitialNumberOfUsers": 1, "DurationInSeconds": 3}]},
                         {"MaxInvocations": 600}, processes=1)
    assert result.stop_reason == "MaxInvocations"
    assert len(result.levels) == 1 and not result.levels[0].stable
    assert result.levels[0].duration_s < 2


def test_latency_threshold_stops_the_run(bench_server: RunningServer) -> None:
    # slow: one instance, 5 ms a request; 2 users wait ~10 ms, 4 users ~20 ms.
    result = run_traffic(Target(bench_server.url, "slow"),
                         {"TrafficType": "STAIRS", "Stairs": {"DurationInSeconds": 1, "NumberOfSteps": 4,
                                                               "UsersPerStep": 2}},
                         {"ModelLatencyThresholds": [{"Percentile": "P50", "ValueInMilliseconds": 15}],
                          "FlatInvocations": "Continue"}, processes=1)
    assert result.stop_reason == "ModelLatencyThresholds"
    # The run ends in the step where a tick's p50 crossed 15 ms: 4 users (~20 ms) on a quiet machine, 2 (~10 ms)
    # when a busy machine slows a tick; never later.
    concurrencies = [level.concurrency for level in result.levels]
    assert concurrencies in ([2], [2, 4])
    if len(concurrencies) == 2:  # the best level is one that met the threshold
        assert result.latency_at_max_us["p50"] <= 15_000


@pytest.mark.parametrize("flat", ["Stop", "Continue"])
def test_flat_invocations(bench_server: RunningServer, flat: str) -> None:
    # slow's capacity is fixed (~200/s): more users stop buying throughput.
    steps = 7 if flat == "Stop" else 4
    result = run_traffic(Target(bench_server.url, "slow"),
                         {"TrafficType": "STAIRS", "Stairs": {"DurationInSeconds": 1, "NumberOfSteps": steps,
                                                               "UsersPerStep": 1}},
                         {"FlatInvocations": flat}, processes=1)
    if flat == "Stop":
        assert result.stop_reason == "FlatInvocations"
        assert 3 <= len(result.levels) < steps
    else:
        assert result.stop_reason == "completed"
        assert [level.concurrency for level in result.levels] == [1, 2, 3, 4]


def test_patterns_beyond_sagemakers_limits_are_named() -> None:
    from naiad.bench.traffic import aws_limits

    # Inference Recommender's default-like stairs, within its limits: nothing to say
    assert aws_limits({"TrafficType": "STAIRS", "Stairs": {"DurationInSeconds": 5, "NumberOfSteps": 4,
                                                            "UsersPerStep": 2}}) == []
    notes = aws_limits({"TrafficPattern": {"TrafficType": "PHASES", "Phases": [
        {"InitialNumberOfUsers": 1, "SpawnRate": 1, "DurationInSeconds": 120},
        {"InitialNumberOfUsers": 5, "SpawnRate": 1, "DurationInSeconds": 10}]}},
        {"StoppingConditions": {"ModelLatencyThresholds": [{"Percentile": "P90", "ValueInMilliseconds": 5}]}})
    assert len(notes) == 3
    assert notes[0].startswith("Phases[2].DurationInSeconds is 10: SageMaker takes 120 to 3600")
    assert notes[1].startswith("Phases[2].InitialNumberOfUsers is 5: SageMaker takes 1 to 3")
    assert notes[2].startswith("ModelLatencyThresholds Percentile is 'P90'")
    assert all(n.endswith("SageMaker would refuse the job as written") for n in notes)
    assert aws_limits({"TrafficType": "STAIRS", "Stairs": {"DurationInSeconds": 1, "NumberOfSteps": 1,
                                                            "UsersPerStep": 4}})[0].startswith(
        "Stairs.UsersPerStep is 4: SageMaker takes 1 to 3")
