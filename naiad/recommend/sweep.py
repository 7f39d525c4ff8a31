"""Measure every variant: serve it fresh, run the traffic pattern through ``naiad.bench.api`` while sampling the
server's process tree, stop it. A variant that fails to load or to answer is recorded as failed; the sweep goes on."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from naiad.bench.api import Target, TrafficResult, ceiling, run_traffic
from naiad.bench.inputs import InputError
from naiad.recommend import serving
from naiad.recommend.resources import Sampler, Usage
from naiad.recommend.variants import Plan, Variant, write_repository


@dataclass
class SweepOptions:
    traffic: dict[str, Any]
    stopping: dict[str, Any] | None = None
    command: str = field(default_factory=serving.naiad_command)
    protocol: str = "http"
    input_data: str = "random"
    shapes: dict[str, list[int]] = field(default_factory=dict)
    processes: int | None = None          # load generator processes (naiad.bench decides when None)
    ready_timeout_s: float = 180.0
    server_cpus: set[int] | None = None   # cores the server is pinned to (None: any)
    traffic_timeout_s: float | None = None  # a load test still running then is given up (None: no limit)
    repeats: int = 1                      # the traffic pattern run this many times on each variant's server


@dataclass
class Measured:
    variant: Variant
    repository: Path
    error: str = ""                        # why it could not be measured ("" when it was)
    setup_s: float | None = None           # spawn to model ready
    load_duration_s: float | None = None   # the server's nv_model_load_duration_secs
    traffic: TrafficResult | None = None    # the run with the median max invocations
    usage: Usage | None = None
    generator_ceiling: float | None = None  # requests/s the generator reached on the server's cheapest route
    runs: list[TrafficResult] = field(default_factory=list)   # every repeat, in order
    generator_usage: Usage | None = None    # this process and the load workers (the server left out)
    generator_processes: int = 0

    @property
    def ok(self) -> bool:
        return self.traffic is not None and not self.error


def measure_variant(variant: Variant, plan: Plan, out_dir: Path, options: SweepOptions,
                    with_ceiling: bool = False) -> Measured:
    repo = write_repository(variant, plan.model_dir, out_dir / "variants")
    result = Measured(variant, repo)
    try:
        server = serving.start(options.command, repo, plan.model, out_dir / "logs" / f"{variant.slug}.log",
                               options.ready_timeout_s, options.server_cpus)
    except serving.ServerFailed as exc:
        result.error = str(exc)
        return result
    try:
        result.setup_s, result.load_duration_s = server.setup_s, server.load_duration_s
        port = server.grpc_port if options.protocol == "grpc" else server.http_port
        target = Target(url=f"127.0.0.1:{port}", model=plan.model, protocol=options.protocol,
                        input_data=options.input_data, shapes=options.shapes)
        with _deadline(options.traffic_timeout_s):
            if with_ceiling:
                # so that a throughput near what the generator itself can do is not taken for the server's
                result.generator_ceiling = ceiling(target.url, options.protocol, processes=options.processes)
            with Sampler(server.pid) as sampler, Sampler(os.getpid(), exclude=server.pid) as generator:
                for _ in range(max(1, options.repeats)):
                    result.runs.append(run_traffic(target, options.traffic, options.stopping,
                                                   processes=options.processes))
        result.usage, result.generator_usage = sampler.usage, generator.usage
        result.generator_processes = options.processes or len(os.sched_getaffinity(0))
        ordered = sorted(result.runs, key=lambda run: run.max_invocations_per_minute)
        result.traffic = ordered[len(ordered) // 2]
        if not any(level.requests for level in result.traffic.levels):
            result.error = "no request completed" + _errors(result.traffic)
    except InputError:
        raise   # the requests cannot be made (e.g. a variable dimension without --shape): the same for every variant
    except Exception as exc:  # a load test that cannot run here (protocol, server errors) fails this variant only
        result.error = f"{type(exc).__name__}: {exc}"
        tail = server.log_tail(10)
        if tail:
            result.error += f"\nserver log:\n{tail}"
    finally:
        server.stop()
    return result


@contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    """TimeoutError in this (main) thread after ``seconds``: a load test that hangs fails its variant, and the
    server is still stopped, instead of the whole sweep waiting forever."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"the load test did not end within {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _errors(traffic: TrafficResult) -> str:
    errors = sum(level.errors for level in traffic.levels)
    first = next((level.error for level in traffic.levels if level.error), None)
    return (f" ({errors} errors" + (f", the first: {first}" if first else "") + ")") if errors or first else ""


def sweep(plan: Plan, out_dir: Path, options: SweepOptions,
          progress: Callable[[str], None] = lambda line: None) -> list[Measured]:
    results: list[Measured] = []
    for index, variant in enumerate(plan.variants, 1):
        progress(f"[{index}/{len(plan.variants)}] {variant.label}: serving {variant.slug}")
        first = not any(m.generator_ceiling for m in results)
        measured = measure_variant(variant, plan, out_dir, options, with_ceiling=first)
        if measured.ok and measured.traffic is not None:
            for level in measured.traffic.levels:
                load = f"{level.concurrency} users" if level.concurrency is not None else f"{level.request_rate}/s"
                progress(f"    {load}: {level.throughput:.1f} inferences/s, p95 "
                         f"{level.latency_us.get('p95', 0.0) / 1000:.2f} ms" + (f", {level.errors} errors"
                                                                               if level.errors else ""))
            spread = ""
            if len(measured.runs) > 1:
                values = sorted(run.max_invocations_per_minute for run in measured.runs)
                spread = f", {len(values)} runs {values[0]:.0f}-{values[-1]:.0f}"
            progress(f"[{index}/{len(plan.variants)}] {variant.label}: "
                     f"{measured.traffic.max_invocations_per_minute:.0f} invocations/min (median"
                     f"{spread}; {measured.traffic.stop_reason})")
        else:
            progress(f"[{index}/{len(plan.variants)}] {variant.label}: failed: {measured.error.splitlines()[0]}")
        results.append(measured)
    return results
