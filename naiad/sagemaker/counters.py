"""SageMaker's endpoint metrics (CloudWatch's names, as Prometheus families) next to Triton's ``nv_*`` ones:
invocations and their errors and latencies, and the multi-model residency: loaded models, cache hits, load,
download, wait and unload times, and the memory the loaded models use against ``--model-memory-limit``.
Durations are microseconds, as SageMaker reports them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

from naiad.service import Service


def _summary(name: str, help: str, timing: Any) -> Metric:
    """``timing``: a residency ``Timing`` (count, sum_us)."""
    return SummaryMetricFamily(name, help, count_value=timing.count, sum_value=timing.sum_us)


class SageMakerCollector(Collector):
    def __init__(self, service: Service) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        figures = self.service.sagemaker_metrics()
        stats = figures["stats"]
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
