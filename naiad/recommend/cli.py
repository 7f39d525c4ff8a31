"""``naiad recommend MODEL_DIR``: the arguments and the run. Only argparse at import time: ``naiad serve`` imports
this module to build its parser and must not pay for matplotlib or the load generator."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

# Inference Recommender's traffic, short: 4 steps of 5 s adding 2 users each (2, 4, 6, 8 concurrent requests).
DEFAULT_TRAFFIC: dict[str, Any] = {"TrafficType": "STAIRS",
                                   "Stairs": {"DurationInSeconds": 5, "NumberOfSteps": 4, "UsersPerStep": 2}}


def _cpus(value: str) -> set[int]:
    """taskset's list: '0', '0-2', '0,3'."""
    cpus: set[int] = set()
    try:
        for part in value.split(","):
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a CPU list such as 0 or 0-1,3, got '{value}'") from None
    if not cpus:
        raise argparse.ArgumentTypeError(f"expected a CPU list such as 0 or 0-1,3, got '{value}'")
    return cpus


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", metavar="MODEL_DIR", type=Path,
                        help="one model folder of a Triton repository (<repo>/<model>, with config.pbtxt and versions)")
    parser.add_argument("-o", "--output-dir", type=Path, default=None,
                        help="where the report, the variants, the recommended config.pbtxt and its scaling_policy.json go "
                             "(default: ./naiad-recommend-<model>, or ~/naiad-recommend-<model> when the current "
                             "folder is inside a git work tree, so a clone is left clean)")
    parser.add_argument("--traffic", type=Path, default=None, metavar="FILE.json",
                        help="CreateInferenceRecommendationsJob's TrafficPattern (PHASES or STAIRS), alone or inside "
                             "the job's InputConfig; default: " + json.dumps(DEFAULT_TRAFFIC))
    parser.add_argument("--stopping", type=Path, default=None, metavar="FILE.json",
                        help="CreateInferenceRecommendationsJob's StoppingConditions (MaxInvocations, "
                             "ModelLatencyThresholds, FlatInvocations)")
    parser.add_argument("--sla-p95-ms", type=float, default=None, metavar="MS",
                        help="latency SLA: the winner is the highest throughput whose p95 is at most this")
    parser.add_argument("--price-per-hour", type=float, default=None, metavar="USD",
                        help="the instance's price, for cost per hour and per million inferences")
    parser.add_argument("--server-cmd", default=None, metavar="COMMAND",
                        help="serve each variant with this command instead of naiad, with placeholders {repo} "
                             "{model} {http_port} {grpc_port} {metrics_port}, e.g. real Triton: "
                             "\"tritonserver --model-repository {repo} --http-port {http_port} --grpc-port "
                             "{grpc_port} --metrics-port {metrics_port}\"")
    parser.add_argument("-i", "--protocol", choices=["http", "grpc"], default="http",
                        help="protocol of the load")
    parser.add_argument("--input-data", default="random", metavar="zero|random|FILE.json",
                        help="request data, as naiad bench / perf_analyzer take it")
    parser.add_argument("--shape", action="append", default=[], metavar="NAME:D1,D2",
                        help="the shape of an input with variable dimensions (repeatable)")
    parser.add_argument("--max-queue-delay-us", type=int, default=None, metavar="US",
                        help="max_queue_delay_microseconds of the dynamic batching variants (default: Triton's 0)")
    parser.add_argument("--bench-processes", type=int, default=None, metavar="N",
                        help="load generator processes (default: naiad bench's choice)")
    parser.add_argument("--server-cpus", type=_cpus, default=None, metavar="LIST",
                        help="pin each variant's server (model processes included) to these cores, as taskset -c "
                             "LIST would, e.g. 1 or 2-3")
    parser.add_argument("--bench-cpus", type=_cpus, default=None, metavar="LIST",
                        help="pin the load generator to these cores, e.g. 0, so it does not compete with the server")
    parser.add_argument("--ready-timeout", type=float, default=180.0, metavar="SECONDS",
                        help="how long a variant's server may take to become ready")
    parser.add_argument("--repeats", type=int, default=3, metavar="N",
                        help="run the traffic pattern N times on each variant (default: %(default)s): the report "
                             "shows the spread, and says when it is too wide to choose")


def _pattern(path: Path | None, key: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the object under ``key``, the whole document) from a JSON file shaped like the job's request, its
    InputConfig, or the object itself."""
    if path is None:
        return None, None
    document = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(document, dict):
        raise ValueError(f"{path}: expected a JSON object")
    for holder in (document, document.get("InputConfig") or {}):
        if key in holder:
            return holder[key], document
    return document, document


def _shapes(values: list[str]) -> dict[str, list[int]]:
    shapes = {}
    for value in values:
        name, sep, dims = value.rpartition(":")
        if not sep or not name:
            raise ValueError(f"--shape expects NAME:D1,D2, got '{value}'")
        shapes[name] = [int(d) for d in dims.split(",") if d.strip()]
    return shapes


def run(args: argparse.Namespace) -> int:
    import platform

    from naiad.recommend import report, scaling, select, serving, variants
    from naiad.recommend.sweep import SweepOptions, sweep

    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:   # before minutes of measuring, not after
        print("error: the report's figures need matplotlib: pip install 'naiad[bench]'", file=sys.stderr)
        return 2
    model_dir: Path = args.model_dir.resolve()
    try:
        plan = variants.plan(model_dir, available=None if args.server_cmd else variants.installed,
                             queue_delay_us=args.max_queue_delay_us)
        traffic, document = _pattern(args.traffic, "TrafficPattern")
        stopping, _ = _pattern(args.stopping, "StoppingConditions")
        if stopping is None and document is not None:
            # a whole job request given as --traffic carries its stopping conditions too
            stopping = document.get("StoppingConditions") or (document.get("InputConfig") or {}).get(
                "StoppingConditions")
        shapes = _shapes(args.shape)
        from naiad.bench.traffic import Stopping, plan as traffic_levels

        # checked before any server starts; the levels' length bounds how long a load test may take
        expected_s = sum(level.duration_s for level in traffic_levels(traffic or DEFAULT_TRAFFIC))
        Stopping.parse(stopping)
        if args.repeats < 1:
            raise ValueError(f"--repeats must be at least 1, got {args.repeats}")
        from naiad.bench.traffic import aws_limits

        traffic_notes = aws_limits(traffic or DEFAULT_TRAFFIC, stopping)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = (args.output_dir or default_output(plan.model)).resolve()
    out.mkdir(parents=True, exist_ok=True)
    options = SweepOptions(traffic=traffic or DEFAULT_TRAFFIC, stopping=stopping,
                           command=args.server_cmd or serving.naiad_command(), protocol=args.protocol,
                           input_data=args.input_data, shapes=shapes, processes=args.bench_processes,
                           ready_timeout_s=args.ready_timeout, server_cpus=args.server_cpus,
                           traffic_timeout_s=args.repeats * 2 * expected_s + 60, repeats=args.repeats)
    if args.bench_cpus:
        # the generator's processes start after this and inherit it
        os.sched_setaffinity(0, args.bench_cpus)
    for line in traffic_notes:
        print(f"note: {line}", flush=True)
    for label, why in plan.skipped:
        print(f"skipping {label}: {why}", flush=True)
    if not plan.variants:
        print("error: no variant can be served here", file=sys.stderr)
        return 1
    from naiad.bench.inputs import InputError

    def terminated(signum: int, frame: object) -> None:
        raise KeyboardInterrupt   # unwinds through the sweep, which stops the server it started

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        results = sweep(plan, out, options, progress=lambda line: print(line, flush=True))
    except InputError as exc:
        print(f"error: {exc} (--shape NAME:D1,D2 gives an input's shape, --input-data a perf_analyzer JSON file)",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: the variant being measured was stopped; no report written", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    rows = [select.row(m, args.sla_p95_ms, args.price_per_hour) for m in results]
    winner, reason = select.choose(rows, args.sla_p95_ms)
    generator_ceiling = next((m.generator_ceiling for m in results if m.generator_ceiling), None)
    generator_limited, limit_notes = select.limits(rows, args.server_cpus)
    decided, why = select.verdict(rows, winner, args.sla_p95_ms, generator_limited)
    best_median = winner
    if winner is not None and not decided:
        # No mark, config or scaling policy: the numbers do not choose (the verdict says what would).
        reason = f"none: the verdict is undecided. Best median run, which noise may have put first: {reason}"
        winner = None
    warnings = traffic_notes + limit_notes + select.notes(rows, generator_ceiling, args.server_cpus)
    winner_config = ""
    best = out / "config.pbtxt"
    if winner is not None:
        winner_config = next(m.variant.text() for m in results if m.variant.slug == winner.slug)
        best.write_text(winner_config, encoding="utf-8")
    elif best.exists():
        best.unlink()   # a previous run's winner must not look like this run's
    policy = scaling.policy_for(winner, plan.model) if winner is not None else None
    policy_file = out / "scaling_policy.json"
    if policy is not None:
        policy_file.write_text(json.dumps(policy, indent=2) + "\n", encoding="utf-8")
    elif policy_file.exists():
        policy_file.unlink()
    summary = {
        "model": plan.model, "model_dir": str(model_dir), "winner": winner.variant if winner else None,
        "best_median": best_median.variant if best_median else None, "scaling_policy": policy,
        "scaling_policy_basis": scaling.describe(winner) if policy is not None and winner is not None else "",
        "winner_slug": winner.slug if winner else None, "reason": reason, "winner_config": winner_config,
        "sla_p95_ms": args.sla_p95_ms, "price_per_hour": args.price_per_hour, "protocol": args.protocol,
        "server_cpus": sorted(args.server_cpus or []), "bench_cpus": sorted(args.bench_cpus or []),
        "server": options.command, "traffic": options.traffic, "stopping": options.stopping,
        "skipped": plan.skipped, "generator_ceiling": generator_ceiling, "notes": warnings,
        "repeats": args.repeats, "verdict": {"decided": decided if best_median is not None else False, "why": why},
        "InferenceRecommendations": [
            {"RecommendationId": r.slug, "Metrics": r.metrics,
             "EndpointConfiguration": {"InstanceType": "local", "InitialInstanceCount": 1},
             "naiad_variant": r.variant}
            for r in rows if r.metrics],
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
    }
    report.write(out, summary, rows, results, args.sla_p95_ms, args.price_per_hour)
    print()
    print(report.text_table(rows, args.sla_p95_ms is not None, args.price_per_hour is not None))
    print()
    for line in warnings:
        print(f"note: {line}")
    print(f"recommendation: {reason}")
    if best_median is not None:
        print(f"verdict: {'decided' if decided else 'undecided'}: {why}")
    if winner is not None:
        print(f"config: {best}")
    if policy is not None:
        assert winner is not None
        print(f"scaling policy: {policy_file}: {scaling.describe(winner)}")
    print(f"report: {out / 'report.html'}")
    return 0 if best_median is not None else 1


def default_output(model: str) -> Path:
    """./naiad-recommend-<model>, unless the current folder is in a git work tree (a clone, whose status the report
    would clutter): then the same name in the home folder."""
    name = f"naiad-recommend-{model}"
    here = Path.cwd()
    if any((folder / ".git").exists() for folder in (here, *here.parents)):
        return Path.home() / name
    return Path(name)
