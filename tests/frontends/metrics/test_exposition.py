"""The page renderer keeps Triton's bare counter names and leaves prometheus_client's own counters alone."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from naiad.frontends.metrics.exposition import render


class _Bare:
    def collect(self):
        metric = Metric("nv_things", "Things done", "counter")
        metric.add_sample("nv_things", {"model": "m"}, 3)
        yield metric


def test_bare_and_total_counters() -> None:
    registry = CollectorRegistry()
    registry.register(_Bare())
    Counter("app_requests", "Requests seen", registry=registry).inc(2)
    text = render(registry).decode()
    assert "# HELP nv_things Things done\n# TYPE nv_things counter\nnv_things{model=\"m\"} 3.0\n" in text
    assert "# TYPE app_requests_total counter\napp_requests_total 2.0\n" in text
    families = {f.name: (f.type, [s.value for s in f.samples if s.name.endswith(("things", "_total"))])
                for f in text_string_to_metric_families(text)}
    assert families["nv_things"] == ("counter", [3.0])
    assert families["app_requests"] == ("counter", [2.0])
