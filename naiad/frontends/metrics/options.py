"""The metrics endpoint's settings and their ``tritonserver`` flag names (imported by the CLI, so light)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class MetricsOptions:
    enabled: bool = True
    address: str = "0.0.0.0"
    port: int = 8002
    interval_ms: float = 2000.0
    cpu: bool = True


def add_arguments(parser: argparse.ArgumentParser, flag: Callable[..., None]) -> None:
    defaults = MetricsOptions()
    flag(parser, "--allow-metrics", True, "serve Prometheus metrics on the metrics port")
    flag(parser, "--allow-cpu-metrics", True, "report CPU utilization and memory")
    flag(parser, "--allow-gpu-metrics", False, "accepted for Triton compatibility; naiad reports no GPU metrics")
    parser.add_argument("--metrics-address", default=defaults.address)
    parser.add_argument("--metrics-port", type=int, default=defaults.port)
    parser.add_argument("--metrics-interval-ms", type=float, default=defaults.interval_ms,
                        help="how often CPU utilization is sampled")


def from_args(args: argparse.Namespace) -> MetricsOptions:
    return MetricsOptions(enabled=args.allow_metrics, address=args.metrics_address, port=args.metrics_port,
                          interval_ms=args.metrics_interval_ms, cpu=args.allow_cpu_metrics)
