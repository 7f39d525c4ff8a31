"""The metrics endpoint's settings and their ``tritonserver`` flag names (imported by the CLI, so light)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field

# prometheus-cpp's quantile:allowed-error pairs Triton summarizes with unless told otherwise.
DEFAULT_QUANTILES = "0.5:0.05,0.9:0.01,0.95:0.001,0.99:0.001,0.999:0.000001"


@dataclass
class MetricsOptions:
    enabled: bool = True
    address: str = "0.0.0.0"
    port: int = 8002
    interval_ms: float = 2000.0
    cpu: bool = True
    gpu: bool = True  # nv_gpu_* and nv_energy_consumption, where NVML finds a GPU
    counter_latencies: bool = True  # nv_inference_*_duration_us
    summary_latencies: bool = False  # nv_inference_*_summary_us
    summary_quantiles: list[float] = field(default_factory=lambda: parse_quantiles(DEFAULT_QUANTILES))


def parse_quantiles(text: str) -> list[float]:
    """``0.5:0.05,0.9:0.01``: the quantiles; the allowed errors only tune prometheus-cpp's estimator, while
    naiad keeps the window's observations and computes the quantiles exactly."""
    quantiles = []
    for pair in text.strip().strip('"').split(","):
        quantile, _, error = pair.partition(":")
        try:
            value = float(quantile)
            float(error or "0")
        except ValueError:
            raise ValueError(f"invalid summary_quantiles '{text}': expected <quantile>:<error>,...") from None
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"invalid summary_quantiles '{text}': a quantile must be within [0, 1]")
        quantiles.append(value)
    return quantiles


def _parse_bool(key: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"invalid value '{value}' for metrics setting '{key}': expected true or false")


def add_arguments(parser: argparse.ArgumentParser, flag: Callable[..., None]) -> None:
    defaults = MetricsOptions()
    flag(parser, "--allow-metrics", True, "serve Prometheus metrics on the metrics port")
    flag(parser, "--allow-cpu-metrics", True, "report CPU utilization and memory")
    flag(parser, "--allow-gpu-metrics", True, "report each GPU's utilization, memory, power and energy (read through "
                                              "NVML, where a GPU exists)")
    parser.add_argument("--metrics-address", default=defaults.address, help="address the metrics server binds")
    parser.add_argument("--metrics-port", type=int, default=defaults.port, help="Prometheus metrics port")
    parser.add_argument("--metrics-interval-ms", type=float, default=defaults.interval_ms,
                        help="how often CPU and GPU figures are sampled")
    parser.add_argument("--metrics-config", action="append", default=[], metavar="<setting>=<value>",
                        help="counter_latencies=false drops the nv_inference_*_duration_us counters; "
                             "summary_latencies=true adds nv_inference_*_summary_us summaries over the last 60 s, "
                             f"with summary_quantiles (default {DEFAULT_QUANTILES}); repeatable")


def from_args(args: argparse.Namespace) -> MetricsOptions:
    """Raises ``ValueError`` for a malformed ``--metrics-config``; settings naiad does not know are ignored,
    as Triton ignores them."""
    options = MetricsOptions(enabled=args.allow_metrics, address=args.metrics_address, port=args.metrics_port,
                             interval_ms=args.metrics_interval_ms, cpu=args.allow_cpu_metrics,
                             gpu=args.allow_gpu_metrics)
    for setting in args.metrics_config:
        key, sep, value = setting.partition("=")
        if not sep:
            raise ValueError(f"--metrics-config option format is <setting>=<value>. Got {setting}")
        if key == "counter_latencies":
            options.counter_latencies = _parse_bool(key, value)
        elif key == "summary_latencies":
            options.summary_latencies = _parse_bool(key, value)
        elif key == "summary_quantiles":
            options.summary_quantiles = parse_quantiles(value)
    return options
