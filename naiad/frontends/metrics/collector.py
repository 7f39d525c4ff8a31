"""Triton's metrics as ``prometheus_client`` collectors, read at scrape time.

Per model version the numbers come straight from ``ModelStats`` (what ``/v2/models/<m>/stats`` serves), read
through ``Models.model_metrics``, so the two agree by construction; durations are its nanoseconds in whole
microseconds. Server CPU and memory, and each GPU's figures (``naiad.core.devices``), are sampled every
``--metrics-interval-ms`` like Triton's, since utilization is a rate over an interval.

Other collectors join the same default ``REGISTRY``: the response cache's ``nv_cache_*`` families and the
``pb_utils.MetricFamily`` custom metrics register themselves there (see ``register``).
"""

from __future__ import annotations

from collections.abc import Iterator

import psutil
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from naiad.core.devices import Devices, Reading
from naiad.core.stats import FAILURE_REASONS
from naiad.frontends.metrics.options import MetricsOptions
from naiad.service import Models

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
    def __init__(self, service: Models, options: MetricsOptions | None = None) -> None:
        self.service = service
        self.options = options or MetricsOptions()

    def collect(self) -> Iterator[Metric]:
        yield from self._counters()
        if self.options.summary_latencies:
            yield from self._summaries()

    def _summaries(self) -> Iterator[Metric]:
        quantiles = self.options.summary_quantiles
        rows = self.service.model_metrics(quantiles)
        for key, (family, help) in _SUMMARIES.items():
            metric = Metric(family, help, "summary")
            for row in rows:
                summary = row["summaries"].get(key)
                if summary is None:
                    continue
                count, total_ns, values = summary
                labels = {"model": row["model"], "version": row["version"]}
                metric.add_sample(family + "_count", labels, count)
                metric.add_sample(family + "_sum", labels, total_ns / 1000)
                for q, value in zip(quantiles, values):
                    metric.add_sample(family, {**labels, "quantile": str(q)}, value / 1000)
            yield metric

    def _counters(self) -> Iterator[Metric]:
        families = {name: _counter(name, help) for name, help in _COUNTERS.items()}
        failure = _counter("nv_inference_request_failure", "Number of failed inference requests, all batch sizes")
        pending = GaugeMetricFamily("nv_inference_pending_request_count",
                                    "Instantaneous number of pending requests awaiting execution per-model.",
                                    labels=_LABELS)
        load = GaugeMetricFamily("nv_model_load_duration_secs", "Model load time in seconds", labels=_LABELS)
        for row in self.service.model_metrics():
            name, version = row["model"], row["version"]
            labels = {"model": name, "version": version}
            values = {
                "nv_inference_request_success": row["success"],
                "nv_inference_count": row["inferences"],
                "nv_inference_exec_count": row["executions"],
                "nv_inference_request_duration_us": row["success_ns"] // 1000,
                "nv_inference_queue_duration_us": row["queue_ns"] // 1000,
                "nv_inference_compute_input_duration_us": row["compute_input_ns"] // 1000,
                "nv_inference_compute_infer_duration_us": row["compute_infer_ns"] // 1000,
                "nv_inference_compute_output_duration_us": row["compute_output_ns"] // 1000,
            }
            for metric, value in values.items():
                families[metric].add_sample(metric, labels, value)
            for reason in FAILURE_REASONS:
                failure.add_sample("nv_inference_request_failure", {**labels, "reason": reason},
                                   row["fail_reasons"][reason])
            pending.add_metric([name, version], row["pending"])
            load.add_metric([name, version], row["load_seconds"])
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


# Triton 2.51's GPU families (metrics.cc), each labelled gpu_uuid: name -> (help, Reading field).
_GPU_GAUGES = {
    "nv_gpu_utilization": ("GPU utilization rate [0.0 - 1.0)", "utilization"),
    "nv_gpu_memory_total_bytes": ("GPU total memory, in bytes", "memory_total"),
    "nv_gpu_memory_used_bytes": ("GPU used memory, in bytes", "memory_used"),
    "nv_gpu_power_usage": ("GPU power usage in watts", "power_usage"),
    "nv_gpu_power_limit": ("GPU power management limit in watts", "power_limit"),
}
_ENERGY = ("nv_energy_consumption", "GPU energy consumption in joules since the Triton Server started")


class GpuCollector(Collector):
    """Each GPU's figures as of the last sample; energy counts from the first sample, as Triton's does. A figure
    the device does not report has no sample."""

    def __init__(self, devices: Devices) -> None:
        self.devices = devices
        self.readings: list[Reading] = []
        self._energy_start: dict[str, float] = {}

    def sample(self) -> None:
        """Reads NVML (a few calls per device): the metrics service runs it off the event loop."""
        readings = self.devices.readings()
        for reading in readings:
            if reading.energy is not None:
                self._energy_start.setdefault(reading.uuid, reading.energy)
        self.readings = readings

    def collect(self) -> Iterator[Metric]:
        readings = self.readings
        for name, (help, field) in _GPU_GAUGES.items():
            family = GaugeMetricFamily(name, help, labels=["gpu_uuid"])
            for reading in readings:
                value = getattr(reading, field)
                if value is not None:
                    family.add_metric([reading.uuid], value)
            yield family
        energy = _counter(*_ENERGY)
        for reading in readings:
            if reading.energy is not None:
                start = self._energy_start.get(reading.uuid, reading.energy)
                energy.add_sample(_ENERGY[0], {"gpu_uuid": reading.uuid}, max(0.0, reading.energy - start))
        yield energy
