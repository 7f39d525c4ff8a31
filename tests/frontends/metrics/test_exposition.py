"""The page renderer keeps Triton's bare counter names and leaves prometheus_client's own counters alone, and
writes numbers as Triton (prometheus-cpp) does; prometheus_client's parser reads the page."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
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
    assert "# HELP nv_things Things done\n# TYPE nv_things counter\nnv_things{model=\"m\"} 3\n" in text
    assert "# TYPE app_requests_total counter\napp_requests_total 2\n" in text
    families = {f.name: (f.type, [s.value for s in f.samples if s.name.endswith(("things", "_total"))])
                for f in text_string_to_metric_families(text)}
    assert families["nv_things"] == ("counter", [3.0])
    assert families["app_requests"] == ("counter", [2.0])


class _Numbers:
    """Values and bounds whose text differs between prometheus_client and prometheus-cpp."""

    def collect(self):
        hist = HistogramMetricFamily("nv_sizes", "Sizes", labels=["model"])
        hist.add_metric(["m"], [("1e-05", 1), ("0.5", 1), ("1.0", 2), ("10.0", 3), ("+Inf", 3)], 7.55)
        yield hist
        gauge = GaugeMetricFamily("nv_levels", "Levels", labels=["kind"])
        for kind, value in (("int", 100000.0), ("half", 0.5), ("tiny", 1e-05), ("huge", 1e20), ("sum", 0.1 + 0.2),
                            ("neg", -2.0), ("inf", math.inf), ("nan", math.nan), ("tricky", 7.0)):
            gauge.add_metric([kind if kind != "tricky" else 'a "}" le="1.0"'], value)
        yield gauge


def test_numbers_are_written_as_triton_writes_them() -> None:
    registry = CollectorRegistry()
    registry.register(_Numbers())
    text = render(registry).decode()
    for line in ('nv_sizes_bucket{le="1e-05",model="m"} 1', 'nv_sizes_bucket{le="0.5",model="m"} 1',
                 'nv_sizes_bucket{le="1",model="m"} 2', 'nv_sizes_bucket{le="10",model="m"} 3',
                 'nv_sizes_bucket{le="+Inf",model="m"} 3', 'nv_sizes_count{model="m"} 3',
                 'nv_sizes_sum{model="m"} 7.55', 'nv_levels{kind="int"} 100000', 'nv_levels{kind="half"} 0.5',
                 'nv_levels{kind="tiny"} 1e-05', 'nv_levels{kind="huge"} 1e+20', 'nv_levels{kind="sum"} 0.3',
                 'nv_levels{kind="neg"} -2', 'nv_levels{kind="inf"} +Inf', 'nv_levels{kind="nan"} Nan',
                 'nv_levels{kind="a \\"}\\" le=\\"1.0\\""} 7'):  # a label value that looks like a bound stays
        assert line + "\n" in text, (line, text)
    assert ".0\n" not in text and '.0"' not in text.replace('le=\\"1.0\\"', "")
    # prometheus_client's parser (what Python scrapers use) reads the same numbers back
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("nv_sizes_bucket", (("le", "1e-05"), ("model", "m")))] == 1.0
    assert samples[("nv_sizes_bucket", (("le", "1"), ("model", "m")))] == 2.0
    assert samples[("nv_levels", (("kind", "huge"),))] == 1e20
    assert math.isnan(samples[("nv_levels", (("kind", "nan"),))])
    assert samples[("nv_levels", (("kind", "inf"),))] == math.inf
