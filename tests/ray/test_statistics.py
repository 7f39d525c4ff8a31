"""Summing replicas' statistics (naiad.ray.statistics.merge): the same model on two replicas counts both."""

from __future__ import annotations

import orjson

from naiad.core.stats import ModelStats
from naiad.ray.statistics import merge


def snapshot(*models: tuple[str, str, ModelStats]) -> bytes:
    return orjson.dumps({"model_stats": [stats.as_dict(name, version) for name, version, stats in models]})


def served(requests: int, batch: int, last_ms: int) -> ModelStats:
    stats = ModelStats()
    for _ in range(requests):
        stats.success.add(1_000)
        stats.record_execution(batch, 100, 200, 300, inferences=1)
    stats.last_inference_ms = last_ms
    return stats


def test_same_model_on_two_replicas_sums() -> None:
    a = snapshot(("m", "1", served(3, 1, 10)), ("z", "2", served(1, 1, 5)))
    b = snapshot(("m", "1", served(2, 4, 20)))
    rows = merge([a, b])["model_stats"]
    assert [(row["name"], row["version"]) for row in rows] == [("m", "1"), ("z", "2")]
    m = rows[0]
    assert m["inference_stats"]["success"]["count"] == 5
    assert m["inference_stats"]["success"]["ns"] == 5 * 1_000
    assert m["execution_count"] == 5 and m["inference_count"] == 5 and m["last_inference"] == 20
    assert [row["batch_size"] for row in m["batch_stats"]] == [1, 4]
    assert merge([a, b], "m", "2")["model_stats"] == []
    assert merge([a, b], "z")["model_stats"] == [orjson.loads(a)["model_stats"][1]]
    assert merge([a, a], "z")["model_stats"][0]["batch_stats"][0]["compute_infer"]["count"] == 2
