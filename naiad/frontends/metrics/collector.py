"""Triton's metrics as ``prometheus_client`` collectors, read at scrape time.

Per model version the numbers come straight from ``ModelStats`` (what ``/v2/models/<m>/stats`` serves), so
the two agree by construction; durations are its nanoseconds in whole microseconds. Server CPU and memory
are sampled every ``--metrics-interval-ms`` like Triton's, since utilization is a rate over an interval.

Other collectors join the same default ``REGISTRY``: the response cache's ``nv_cache_*`` families and the
``pb_utils.MetricFamily`` custom metrics register themselves there (see ``register``).
"""

from __future__ import annotations

from collections.abc import Iterator

import psutil
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from naiad.core.stats import FAILURE_REASONS
from naiad.frontends.metrics.options import MetricsOptions
from naiad.repository.manager import ModelRepository

_LABELS = ["model", "version"]

# name -> (help, ModelStats reader); help texts are Triton 2.51's.
_COUNTERS = {
    "nv_inference_request_success": "Number of successful inference requests, all batch sizes",
    "nv_inference_count": "Number of inferences performed (does not include cached requests)",
    "nv_inference_exec_count": "Number of model executions performed (does not include cached requests)",
    "nv_inference_request_duration_us":
        "Cumulative inference request duration in microseconds (includes cached requests)",
    "nv_inference_queue_duration_us": "Cumulative inference queuing duration in microseconds (includes cached requests)",
    "nv_inference_compute_input_duration_us":
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    "nv_inference_compute_infer_duration_us":
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
    "nv_inference_compute_output_duration_us":
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
}


def _counter(name: str, help: str) -> Metric:
    """A counter family whose samples carry the family's own name, as Triton (prometheus-cpp) writes them;
    prometheus_client's CounterMetricFamily would name them ``<name>_total``. See ``exposition.py``."""
    return Metric(name, help, "counter")


# stats duration -> (summary family, help): Triton 2.51's names and texts.
_SUMMARIES = {
    "success": ("nv_inference_request_summary_us",
                "Summary of inference request duration in microseconds (includes cached requests)"),
    "queue": ("nv_inference_queue_summary_us",
              "Summary of inference queuing duration in microseconds (includes cached requests)"),
    "compute_input": ("nv_inference_compute_input_summary_us",
                      "Summary of compute input duration in microseconds (does not include cached requests)"),
    "compute_infer": ("nv_inference_compute_infer_summary_us",
                      "Summary of compute inference duration in microseconds (does not include cached requests)"),
    "compute_output": ("nv_inference_compute_output_summary_us",
                       "Summary of inference compute output duration in microseconds (does not include cached "
                       "requests)"),
}
_LATENCY_COUNTERS = {name for name in _COUNTERS if name.endswith("_duration_us")}


class ModelCollector(Collector):
    def __init__(self, repository: ModelRepository, options: MetricsOptions | None = None) -> None:
        self.repository = repository
        self.options = options or MetricsOptions()

    def collect(self) -> Iterator[Metric]:
        yield from self._counters()
        if self.options.summary_latencies:
            yield from self._summaries()

    def _summaries(self) -> Iterator[Metric]:
        quantiles = self.options.summary_quantiles
        for key, (family, help) in _SUMMARIES.items():
            metric = Metric(family, help, "summary")
            for name in sorted(self.repository.models):
                for version, model in sorted(self.repository.models[name].versions.items()):
                    window = model.stats.durations[key].window
                    if window is None:
                        continue
                    labels = {"model": name, "version": str(version)}
                    metric.add_sample(family + "_count", labels, window.count)
                    metric.add_sample(family + "_sum", labels, window.total_ns / 1000)
                    for q, value in zip(quantiles, window.quantiles(quantiles)):
                        metric.add_sample(family, {**labels, "quantile": str(q)}, value / 1000)
            yield metric

    def _counters(self) -> Iterator[Metric]:
        families = {name: _counter(name, help) for name, help in _COUNTERS.items()}
        failure = _counter("nv_inference_request_failure", "Number of failed inference requests, all batch sizes")
        pending = GaugeMetricFamily("nv_inference_pending_request_count",
                                    "Instantaneous number of pending requests awaiting execution per-model.",
                                    labels=_LABELS)
        load = GaugeMetricFamily("nv_model_load_duration_secs", "Model load time in seconds", labels=_LABELS)
        for name in sorted(self.repository.models):
            for version, model in sorted(self.repository.models[name].versions.items()):
                labels = {"model": name, "version": str(version)}
                s = model.stats
                values = {
                    "nv_inference_request_success": s.success.count,
                    "nv_inference_count": s.inference_count,
                    "nv_inference_exec_count": s.execution_count,
                    "nv_inference_request_duration_us": s.success.ns // 1000,
                    "nv_inference_queue_duration_us": s.queue.ns // 1000,
                    "nv_inference_compute_input_duration_us": s.compute_input.ns // 1000,
                    "nv_inference_compute_infer_duration_us": s.compute_infer.ns // 1000,
                    "nv_inference_compute_output_duration_us": s.compute_output.ns // 1000,
                }
                for metric, value in values.items():
                    families[metric].add_sample(metric, labels, value)
                for reason in FAILURE_REASONS:
                    failure.add_sample("nv_inference_request_failure", {**labels, "reason": reason},
                                       s.fail_reasons[reason])
                pending.add_metric([name, str(version)], model.scheduler.pending)
                load.add_metric([name, str(version)], model.load_seconds)
        yield families["nv_inference_request_success"]
        yield failure
        for name in list(_COUNTERS)[1:]:
            if self.options.counter_latencies or name not in _LATENCY_COUNTERS:
                yield families[name]
        yield pending
        yield load


class CpuCollector(Collector):
    """``nv_cpu_utilization`` over the last sampling interval and the host's memory, as Triton reports them."""

    def __init__(self) -> None:
        self.utilization = 0.0
        psutil.cpu_percent(interval=None)  # the first call only starts the interval

    def sample(self) -> None:
        self.utilization = psutil.cpu_percent(interval=None) / 100.0

    def collect(self) -> Iterator[Metric]:
        memory = psutil.virtual_memory()
        yield GaugeMetricFamily("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", value=self.utilization)
        yield GaugeMetricFamily("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", value=memory.total)
        # Triton's "used" is MemTotal - MemAvailable.
        yield GaugeMetricFamily("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes",
                                value=memory.total - memory.available)
