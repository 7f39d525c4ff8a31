"""SageMaker's endpoint metrics, CloudWatch's names: the counters the SageMaker front end and the residency keep
(``EndpointStats``), and the Prometheus families the metrics page shows them as, next to Triton's ``nv_*`` ones:
invocations and their errors and latencies, and the multi-model residency: loaded models, cache hits, load,
download, wait and unload times, and the memory the loaded models use against ``--model-memory-limit``.
Durations are microseconds, as SageMaker reports them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

from naiad.core.cache_stats import CacheStats, Timing


@dataclass
class EndpointStats(CacheStats):
    """The model cache's counters, and the invocations' (CloudWatch's names in the comments)."""
    invocations: int = 0  # Invocations
    errors_4xx: int = 0  # Invocation4XXErrors
    errors_5xx: int = 0  # Invocation5XXErrors
    model_latency: Timing = field(default_factory=Timing)  # ModelLatency: in the model
    overhead_latency: Timing = field(default_factory=Timing)  # OverheadLatency: the rest of the request


def _summary(name: str, help: str, timing: Timing) -> Metric:
    return SummaryMetricFamily(name, help, count_value=timing.count, sum_value=timing.sum_us)


class SageMakerCollector(Collector):
    """``figures``: what the service's ``sagemaker_metrics`` returns, read at each scrape."""

    def __init__(self, figures: Callable[[], dict[str, Any]]) -> None:
        self.figures = figures

    def collect(self) -> Iterator[Metric]:
        figures = self.figures()
        stats: EndpointStats = figures["stats"]
        yield CounterMetricFamily("sagemaker_invocations", "Invocations: requests sent to a model", stats.invocations)
        yield CounterMetricFamily("sagemaker_invocation_4xx_errors",
                                  "Invocation4XXErrors: invocations answered with a 4xx status", stats.errors_4xx)
        yield CounterMetricFamily("sagemaker_invocation_5xx_errors",
                                  "Invocation5XXErrors: invocations answered with a 5xx status", stats.errors_5xx)
        yield _summary("sagemaker_model_latency_us", "ModelLatency: time the model took to answer, in microseconds",
                       stats.model_latency)
        yield _summary("sagemaker_overhead_latency_us",
                       "OverheadLatency: time spent outside the model (decoding, encoding, waiting for an on-demand "
                       "load), in microseconds", stats.overhead_latency)
        yield GaugeMetricFamily("sagemaker_loaded_model_count", "LoadedModelCount: models loaded by the multi-model "
                                "API", figures["loaded"])
        yield CounterMetricFamily("sagemaker_model_cache_hit", "ModelCacheHit: invocations whose target model was "
                                  "already loaded", stats.cache_hits)
        yield CounterMetricFamily("sagemaker_model_cache_miss", "Invocations whose target model had to be loaded "
                                  "first", stats.cache_misses)
        yield CounterMetricFamily("sagemaker_model_evictions", "Models unloaded to make room under the memory limit",
                                  stats.evictions)
        yield _summary("sagemaker_model_loading_wait_time_us", "ModelLoadingWaitTime: time invocations waited for "
                       "their target model to be downloaded and loaded, in microseconds", stats.loading_wait)
        yield _summary("sagemaker_model_downloading_time_us", "ModelDownloadingTime: time to fetch and extract a "
                       "model archive, in microseconds", stats.downloading)
        yield _summary("sagemaker_model_loading_time_us", "ModelLoadingTime: time to load a model, in microseconds",
                       stats.loading)
        yield _summary("sagemaker_model_unloading_time_us", "ModelUnloadingTime: time to unload a model until its "
                       "memory is released, in microseconds", stats.unloading)
        per_model = GaugeMetricFamily("sagemaker_model_memory_bytes", "Memory a loaded model uses (its worker "
                                      "processes' PSS plus what it added to the server)", labels=["model"])
        for target, memory in figures["memory"]:
            per_model.add_metric([target], memory)
        yield per_model
        yield GaugeMetricFamily("sagemaker_memory_used_bytes", "Memory the loaded models use", figures["used"])
        if figures["limit"] is not None:
            yield GaugeMetricFamily("sagemaker_memory_limit_bytes", "--model-memory-limit", figures["limit"])
