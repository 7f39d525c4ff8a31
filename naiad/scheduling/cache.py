"""Triton's ``local`` response cache (``--cache-config local,size=N`` plus ``response_cache { enable: true }``).

One cache shared by every model, bounded by the bytes of the outputs it holds, evicting least recently used
entries. The key hashes the model name and version, each input's name, datatype, shape and bytes, and the
requested outputs (Triton hashes inputs only; adding the outputs asked for keeps a response computed for a subset
from answering a request for more). Only successful responses are stored.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Callable, Iterable, Iterator

import numpy as np

from naiad.core.datatypes import serialize_bytes
from naiad.core.request import InferRequest
from naiad.core.stats import ModelStats


class ResponseCache:
    def __init__(self, size: int) -> None:
        self.size = size
        self.used = 0
        self._entries: OrderedDict[bytes, tuple[dict[str, np.ndarray], int]] = OrderedDict()
        self.evictions = 0

    @staticmethod
    def parse(values: list[str]) -> "ResponseCache | None":
        """``--cache-config local,size=N`` (repeatable); any other implementation is refused."""
        settings: dict[str, dict[str, str]] = {}
        for value in values:
            name, _, setting = value.partition(",")
            key, sep, val = setting.partition("=")
            if not sep:
                raise ValueError(f"--cache-config expects <cache>,<key>=<value>, got '{value}'")
            settings.setdefault(name, {})[key] = val
        if not settings:
            return None
        if set(settings) != {"local"}:
            unknown = ", ".join(sorted(set(settings) - {"local"}))
            raise ValueError(f"unsupported cache implementation '{unknown}' (naiad provides 'local')")
        try:
            size = int(settings["local"].get("size", "0"))
        except ValueError:
            raise ValueError(f"--cache-config local,size expects bytes, got '{settings['local']['size']}'") from None
        return ResponseCache(size) if size > 0 else None

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def key(request: InferRequest, model: str, version: str) -> bytes:
        h = hashlib.blake2b(digest_size=20)
        h.update(f"{model}\0{version}\0".encode())
        for name, array in request.inputs.items():
            h.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
            if array.dtype == np.object_:
                h.update(serialize_bytes(array))
            else:
                h.update(np.ascontiguousarray(array).data)
        if request.requested_outputs:
            h.update("\0".join(request.requested_outputs).encode())
        return h.digest()

    def lookup(self, key: bytes) -> dict[str, np.ndarray] | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def insert(self, key: bytes, outputs: dict[str, np.ndarray]) -> bool:
        """Store copies of the outputs (they may view buffers the model reuses); False if they can't fit."""
        nbytes = 0
        stored: dict[str, np.ndarray] = {}
        for name, array in outputs.items():
            copy = np.array(array, copy=True)
            stored[name] = copy
            nbytes += len(serialize_bytes(copy)) if copy.dtype == np.object_ else copy.nbytes
        nbytes += len(key)
        if nbytes > self.size or key in self._entries:
            return False
        while self.used + nbytes > self.size:
            _, (_, evicted) = self._entries.popitem(last=False)
            self.used -= evicted
            self.evictions += 1
        self._entries[key] = (stored, nbytes)
        self.used += nbytes
        return True


class CacheMetrics:
    """A prometheus_client collector for Triton's per-model cache counters (models with the cache enabled),
    read from ``ModelStats`` at scrape time so they equal ``/stats`` by construction."""

    def __init__(self, models: Callable[[], Iterable[tuple[str, str, ModelStats, bool]]]) -> None:
        self._models = models

    def collect(self) -> Iterator[object]:
        from prometheus_client.core import Metric

        families = [
            ("nv_cache_num_hits_per_model", "Number of cache hits per model", "cache_hit", True),
            ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds",
             "cache_hit", False),
            ("nv_cache_num_misses_per_model", "Number of cache misses per model", "cache_miss", True),
            ("nv_cache_miss_duration_per_model",
             "Total cache miss (insert+lookup) duration per model, in microseconds", "cache_miss", False),
        ]
        rows = [(n, v, s) for n, v, s, cached in self._models() if cached]
        for metric, help_text, duration, is_count in families:
            # Samples keep Triton's exact names (prometheus_client's CounterMetricFamily would add "_total").
            family = Metric(metric, help_text, "counter")
            for name, version, stats in rows:
                d = stats.durations[duration]
                family.add_sample(metric, {"model": name, "version": version}, d.count if is_count else d.ns // 1000)
            yield family

    def describe(self) -> list[object]:
        return []  # names are fixed, but describing them would make registration collect from a half-built server


def register_cache_metrics(models: Callable[[], Iterable[tuple[str, str, ModelStats, bool]]]) -> CacheMetrics:
    """Put the cache counters in prometheus_client's default registry, which the metrics endpoint serves."""
    from prometheus_client import REGISTRY

    collector = CacheMetrics(models)
    REGISTRY.register(collector)  # type: ignore[arg-type]
    return collector
