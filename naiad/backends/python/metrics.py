"""Custom metrics of Python models (``pb_utils.MetricFamily``), kept in the server process and exposed
through a ``prometheus_client`` collector in the default registry, which the /metrics page serves.

Workers send every update here, so instances of a model that use the same family and labels share one
series, as in Triton. A family lives as long as a model that created it is loaded.
"""

from __future__ import annotations

import bisect
import math
import threading
from typing import Any, Iterator

from prometheus_client import REGISTRY as PROMETHEUS
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric

COUNTER, GAUGE, HISTOGRAM = 0, 1, 2


class MetricError(Exception):
    pass


class _Series:
    __slots__ = ("labels", "value", "buckets", "counts", "sum", "count")

    def __init__(self, labels: dict[str, str], buckets: list[float] | None) -> None:
        self.labels = labels
        self.value = 0.0
        self.buckets = list(buckets) if buckets is not None else None
        self.counts = [0] * (len(self.buckets) + 1) if self.buckets is not None else None
        self.sum = 0.0
        self.count = 0


class _Family:
    def __init__(self, name: str, description: str, kind: int) -> None:
        self.name = name
        self.description = description
        self.kind = kind
        self.series: dict[tuple, _Series] = {}
        self.owners: dict[str, int] = {}  # model name -> how many families it opened under this name


class CustomMetrics:
    """The registry behind ``pb_utils.MetricFamily``; one per server process."""

    def __init__(self) -> None:
        self.families: dict[str, _Family] = {}
        self._lock = threading.Lock()
        self._registered = False

    def _register(self) -> None:
        if not self._registered:
            self._registered = True
            PROMETHEUS.register(self)

    def family(self, name: str, description: str, kind: int, owner: str = "") -> None:
        with self._lock:
            family = self.families.get(name)
            if family is None:
                family = self.families[name] = _Family(name, description, kind)
            elif family.kind != kind:
                raise MetricError(f"metric family '{name}' already exists with a different kind")
            family.owners[owner] = family.owners.get(owner, 0) + 1
            self._register()

    def metric(self, family_name: str, labels: dict[str, str], buckets: list[float] | None) -> None:
        with self._lock:
            family = self.families.get(family_name)
            if family is None:
                raise MetricError(f"metric family '{family_name}' does not exist")
            if buckets is not None and any(a >= b for a, b in zip(buckets, buckets[1:])):
                raise MetricError("Bucket Boundaries must be strictly sorted")  # prometheus-cpp's words
            key = tuple(sorted(labels.items()))
            if key not in family.series:
                family.series[key] = _Series(dict(labels), buckets)

    def _series(self, key: Any) -> tuple[_Family, _Series]:
        family_name, labels = key
        family = self.families.get(family_name)
        if family is None:
            raise MetricError(f"metric family '{family_name}' does not exist")
        series = family.series.get(tuple(tuple(p) for p in labels))
        if series is None:
            raise MetricError(f"metric of family '{family_name}' with labels {dict(labels)} does not exist")
        return family, series

    def apply(self, key: Any, op: str, value: float) -> None:
        with self._lock:
            try:
                _, series = self._series(key)
            except MetricError:
                return  # the family went away with its model
            if op == "increment":
                series.value += value
            elif op == "set":
                series.value = value
            elif op == "observe" and series.buckets is not None:
                series.counts[bisect.bisect_left(series.buckets, value)] += 1  # type: ignore[index]
                series.sum += value
                series.count += 1

    def value(self, key: Any) -> float:
        with self._lock:
            return self._series(key)[1].value

    def release(self, owner: str) -> None:
        """A model was unloaded: drop the families only it still uses."""
        with self._lock:
            for name, family in list(self.families.items()):
                if family.owners.pop(owner, 0) and not family.owners:
                    del self.families[name]

    # --- prometheus_client Collector -------------------------------------------------------------------------

    def collect(self) -> Iterator[Any]:
        with self._lock:
            families = [(f.name, f.description, f.kind, [(s.labels, s.value, s.buckets, list(s.counts or []),
                                                          s.sum, s.count) for s in f.series.values()])
                        for f in self.families.values()]
        for name, description, kind, series in families:
            label_names = sorted({k for labels, *_ in series for k in labels})
            if kind == HISTOGRAM:
                out: Any = HistogramMetricFamily(name, description, labels=label_names)
                for labels, _, buckets, counts, total, _count in series:
                    cumulative, running = [], 0
                    for bound, count in zip([*(buckets or []), math.inf], counts):
                        running += count
                        cumulative.append((_bound(bound), running))
                    out.add_metric([labels.get(k, "") for k in label_names], cumulative, total)
            elif kind == COUNTER:
                # Samples keep the family's own name, as Triton exposes them (no "_total" suffix).
                out = Metric(name, description, "counter")
                for labels, value, *_ in series:
                    out.add_sample(name, labels, value)
            else:
                out = GaugeMetricFamily(name, description, labels=label_names)
                for labels, value, *_ in series:
                    out.add_metric([labels.get(k, "") for k in label_names], value)
            yield out

    def describe(self) -> list[Any]:
        return []  # families come and go with models: no fixed description


def _bound(value: float) -> str:
    return "+Inf" if value == math.inf else repr(float(value))


REGISTRY = CustomMetrics()
