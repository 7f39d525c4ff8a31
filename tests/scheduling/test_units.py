"""Parsers and collectors of the scheduling layer, in-process: --cache-config, --rate-limit-resource, the
nv_cache_* collector (as the metrics endpoint will scrape it), and the cache's byte bound."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from naiad.core.request import InferRequest
from naiad.core.stats import ModelStats
from naiad.scheduling.cache import CacheMetrics, ResponseCache
from naiad.scheduling.rate_limiter import RateLimiter


def test_cache_config_parsing() -> None:
    assert ResponseCache.parse([]) is None
    cache = ResponseCache.parse(["local,size=1048576"])
    assert cache is not None and cache.size == 1048576
    with pytest.raises(ValueError, match="unsupported cache implementation 'redis'"):
        ResponseCache.parse(["redis,host=localhost"])
    with pytest.raises(ValueError, match="expects <cache>,<key>=<value>"):
        ResponseCache.parse(["local"])


def test_rate_limit_resource_parsing() -> None:
    assert RateLimiter.parse_resource("R:3") == (("R", None), 3)
    assert RateLimiter.parse_resource("R:3:1") == (("R", 1), 3)
    with pytest.raises(ValueError):
        RateLimiter.parse_resource("R")


def test_cache_keys_follow_inputs_and_requested_outputs() -> None:
    def request(data: np.ndarray, outputs: list[str] | None = None) -> InferRequest:
        return InferRequest("m", inputs={"X": data}, requested_outputs=outputs)

    a = np.arange(4, dtype=np.float32)
    key = ResponseCache.key(request(a), "m", "1")
    assert key == ResponseCache.key(request(a.copy()), "m", "1")
    assert key != ResponseCache.key(request(a.reshape(2, 2)), "m", "1")
    assert key != ResponseCache.key(request(a.astype(np.float64)), "m", "1")
    assert key != ResponseCache.key(request(a), "m", "2")
    assert key != ResponseCache.key(request(a, ["Y"]), "m", "1")
    strings = np.array([b"ab", b"c"], dtype=object)
    assert ResponseCache.key(request(strings), "m", "1") != ResponseCache.key(
        request(np.array([b"a", b"bc"], dtype=object)), "m", "1")


def test_cache_evicts_least_recently_used() -> None:
    cache = ResponseCache(3 * (400 + 20))
    for i in range(3):
        assert cache.insert(bytes([i]) * 20, {"Y": np.full(100, i, np.float32)})
    assert cache.lookup(bytes([0]) * 20) is not None  # now the most recently used
    assert cache.insert(bytes([3]) * 20, {"Y": np.zeros(100, np.float32)})
    assert cache.lookup(bytes([1]) * 20) is None and cache.evictions == 1
    assert not cache.insert(b"k" * 20, {"Y": np.zeros(1000, np.float32)})  # larger than the whole cache
    assert cache.used <= cache.size


def test_cache_metrics_have_tritons_names() -> None:
    stats = ModelStats()
    stats.cache_hit.add(5000)
    stats.cache_miss.add(7000, 2)
    registry = CollectorRegistry()
    registry.register(CacheMetrics(lambda: [("m", "1", stats, True), ("other", "1", ModelStats(), False)]))
    text = generate_latest(registry).decode()
    samples = {(s.name.removesuffix("_total"), s.labels["model"]): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples == {
        ("nv_cache_num_hits_per_model", "m"): 1,
        ("nv_cache_hit_duration_per_model", "m"): 5,
        ("nv_cache_num_misses_per_model", "m"): 2,
        ("nv_cache_miss_duration_per_model", "m"): 7,
    }
