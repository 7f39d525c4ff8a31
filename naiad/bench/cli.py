"""``naiad bench``: perf_analyzer's command line (flag names, defaults and meanings as in its
command_line_parser.cc), plus ``--traffic`` for Inference Recommender's traffic patterns and ``--processes`` for
the generator's worker processes."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

STABILITY_ERROR = 2
# perf_analyzer exits 99 on every error, option errors included (2 is its "unstable" code, which scripts retry).
OPTION_ERROR = 99
GENERIC_ERROR = 99
# The perf_analyzer whose command line this follows (its --version, and the profile export's "version").
PERF_ANALYZER_VERSION = "2.51.0"


class Parser(argparse.ArgumentParser):
    """argparse, but a bad option exits 99 as perf_analyzer's parser does (argparse's own code is 2)."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(OPTION_ERROR, f"Error: {message}\n")


def _range(text: str, kind: type, flag: str) -> list[Any]:
    parts = text.split(":")
    if len(parts) > 3:
        raise argparse.ArgumentTypeError(f"Failed to parse {flag}. The value does not match <start:end:step>.")
    try:
        return [kind(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"Failed to parse {flag}. Invalid value provided: {text}") from None


def _shape(text: str) -> tuple[str, list[int]]:
    name, sep, dims = text.rpartition(":")
    if not sep:
        raise argparse.ArgumentTypeError("Failed to parse --shape. There must be a colon after input name.")
    shape = [int(d) for d in dims.split(",")]
    if any(d <= 0 for d in shape):
        raise argparse.ArgumentTypeError("Failed to parse --shape. The dimensions of input tensor must be > 0.")
    return name, shape


def _positive(flag: str) -> Any:
    def parse(text: str) -> int:
        if int(text) <= 0:
            raise argparse.ArgumentTypeError(f"Failed to parse {flag}. The value must be > 0.")
        return int(text)
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-m", dest="model", required=True, help="model name")
    parser.add_argument("-x", dest="version", default="", help="model version (default: the server's choice)")
    parser.add_argument("-u", dest="url", default=None,
                        help='server URL; default "localhost:8000" with HTTP, "localhost:8001" with gRPC')
    parser.add_argument("-i", dest="protocol", default="http", type=str.lower, choices=["http", "grpc"],
                        help="protocol (default HTTP)")
    parser.add_argument("-b", dest="batch_size", type=_positive("-b (batch size)"), default=1,
                        help="batch size for each request sent")
    parser.add_argument("-v", dest="verbose", action="count", default=0, help="verbose mode (-v -v: extra verbose)")
    parser.add_argument("-H", dest="headers", action="append", default=[], metavar="HEADER:VALUE",
                        help="an HTTP header added to every request (repeatable)")
    parser.add_argument("--service-kind", default="triton", choices=["triton"],
                        help="only Triton's protocols (naiad and tritonserver both speak them)")
    parser.add_argument("--version", action="version",
                        version=f"naiad bench {_naiad_version()}: perf_analyzer {PERF_ANALYZER_VERSION}'s command line")
    m = parser.add_argument_group("I. measurement parameters")
    m.add_argument("-a", "--async", dest="async_mode", action="store_true",
                   help="asynchronous mode: requests in flight from few threads (stability judged on throughput)")
    m.add_argument("--sync", action="store_true", help="force synchronous mode")
    m.add_argument("-p", "--measurement-interval", dest="measurement_interval", type=_positive(
        "--measurement-interval (-p)"), default=5000, metavar="MSEC",
                   help="time window of each measurement (default: %(default)s)")
    m.add_argument("--measurement-mode", choices=["time_windows", "count_windows"], default="time_windows")
    m.add_argument("--measurement-request-count", type=_positive("--measurement-request-count"), default=50,
                   help="minimum requests per window in count_windows mode")
    m.add_argument("--concurrency-range", type=lambda t: _range(t, int, "--concurrency-range"), default=None,
                   metavar="START:END:STEP", help="concurrency levels (end 0: until the latency threshold)")
    m.add_argument("--request-rate-range", type=lambda t: _range(t, float, "--request-rate-range"), default=None,
                   metavar="START:END:STEP", help="request rates, requests/s (instead of concurrency)")
    m.add_argument("--request-distribution", choices=["constant", "poisson"], default="constant",
                   help="time between requests in request-rate mode")
    m.add_argument("--request-intervals", default=None, metavar="FILE",
                   help="send requests at these intervals (microseconds, one per line, repeated) instead of a "
                        "concurrency or a rate")
    m.add_argument("--binary-search", action="store_true",
                   help="binary search of the range for the highest level under --latency-threshold")
    m.add_argument("-l", "--latency-threshold", dest="latency_threshold", type=int, default=0, metavar="MSEC",
                   help="stop the search once latency exceeds this (0: no limit)")
    m.add_argument("--max-threads", type=int, default=None, help="accepted; workers are processes (--processes)")
    m.add_argument("-s", "--stability-percentage", dest="stability_percentage", type=float, default=10.0,
                   help="allowed max/min spread of the last 3 windows' throughput and latency, in percent "
                        "(default: %(default)s)")
    m.add_argument("-r", "--max-trials", dest="max_trials", type=_positive("--max-trials (-r)"), default=10,
                   help="maximum windows per level (default: %(default)s); a level not stable by then is written to "
                        "-f's CSV anyway, marked unstable")
    m.add_argument("--percentile", type=int, default=-1,
                   help="stabilize on (and report) this latency percentile instead of the average")
    m.add_argument("--request-count", type=int, default=0, help="measure exactly one window of this many requests")
    m.add_argument("--warmup-request-count", type=int, default=0, help="requests answered before measuring")
    d = parser.add_argument_group("II. input data")
    d.add_argument("--input-data", action="append", default=[], metavar="zero|random|FILE.json",
                   help="input data: zero, random (default) or perf_analyzer's JSON data file")
    d.add_argument("--shape", action="append", type=_shape, default=[], metavar="NAME:D1,D2",
                   help="shape of an input with variable dimensions (repeatable)")
    d.add_argument("--string-length", type=_positive("--string-length"), default=128,
                   help="length of random strings for BYTES inputs")
    d.add_argument("--string-data", default=None, help="use this string for every BYTES element")
    d.add_argument("--shared-memory", choices=["none", "system", "cuda"], default="none",
                   help="pass tensors through system shared memory (cuda: not on this build)")
    d.add_argument("--output-shared-memory-size", type=int, default=100 * 1024,
                   help="bytes per output region for BYTES / variable-shape outputs")
    d.add_argument("--input-tensor-format", choices=["binary", "json"], default="binary",
                   help="HTTP request tensor format (naiad bench always sends binary)")
    d.add_argument("--output-tensor-format", choices=["binary", "json"], default="binary",
                   help="HTTP response tensor format (naiad bench always asks for binary)")
    o = parser.add_argument_group("IV. other options")
    o.add_argument("-f", dest="filename", default="", metavar="FILE.csv", help="write the latency report as CSV")
    o.add_argument("--verbose-csv", action="store_true", help="extra CSV columns")
    o.add_argument("--streaming", action="store_true", help="gRPC streaming API (decoupled models)")
    o.add_argument("--collect-metrics", action="store_true", help="scrape the server's metrics during windows")
    o.add_argument("--metrics-url", default="localhost:8002/metrics")
    o.add_argument("--metrics-interval", type=_positive("--metrics-interval"), default=1000, metavar="MSEC")
    o.add_argument("--profile-export-file", default=None, metavar="FILE.json",
                   help="every request's timestamps per experiment, as perf_analyzer's profile export")
    o.add_argument("--grpc-compression-algorithm", choices=["none", "gzip", "deflate"], default="none",
                   help="compress gRPC requests (gzip or deflate: sent through grpcio's client)")
    q = parser.add_argument_group("III. sequence models (accepted; naiad bench refuses a model with sequence_batching)")
    for flag, kind, default in (("--sequence-length", int, 20), ("--sequence-length-variation", float, 20.0),
                                ("--sequence-id-range", str, None), ("--num-of-sequences", int, 4)):
        q.add_argument(flag, type=kind, default=default, help=argparse.SUPPRESS)
    q.add_argument("--serial-sequences", action="store_true", help=argparse.SUPPRESS)
    t = parser.add_argument_group("V. TLS (accepted; naiad bench speaks plain HTTP and gRPC and refuses to use TLS)")
    t.add_argument("--ssl-grpc-use-ssl", action="store_true", help=argparse.SUPPRESS)
    for flag in ("--ssl-grpc-root-certifications-file", "--ssl-grpc-private-key-file",
                 "--ssl-grpc-certificate-chain-file", "--ssl-https-ca-certificates-file",
                 "--ssl-https-client-certificate-file", "--ssl-https-client-certificate-type",
                 "--ssl-https-private-key-file", "--ssl-https-private-key-type"):
        t.add_argument(flag, default=None, help=argparse.SUPPRESS)
    t.add_argument("--ssl-https-verify-peer", type=int, default=1, help=argparse.SUPPRESS)
    t.add_argument("--ssl-https-verify-host", type=int, default=2, help=argparse.SUPPRESS)
    n = parser.add_argument_group("naiad bench")
    n.add_argument("--traffic", default=None, metavar="FILE.json",
                   help="run an Inference Recommender TrafficPattern (PHASES or STAIRS) instead of a sweep; the "
                        "file may also hold StoppingConditions")
    n.add_argument("--stopping", default=None, metavar="FILE.json|JSON",
                   help="Inference Recommender StoppingConditions (MaxInvocations, ModelLatencyThresholds, "
                        "FlatInvocations)")
    n.add_argument("--processes", type=int, default=None,
                   help="load-generator worker processes (default: one per core available)")
    n.add_argument("--cpus", default=None, metavar="0,1", help="pin the worker processes to these cores")
    n.add_argument("--grpc-client", choices=["lean", "grpcio"], default="lean",
                   help="unary gRPC calls: naiad's lean HTTP/2 client (default, ~2x the calls per core) or grpcio's "
                        "(--streaming always uses grpcio)")
    n.add_argument("--grpc-connections", type=int, default=1, metavar="N",
                   help="gRPC connections per worker process; concurrent requests share them as HTTP/2 streams")
    n.add_argument("--no-generator-ceiling", dest="generator_ceiling", action="store_false",
                   help="skip measuring the generator's own ceiling (GET /v2/health/live, gRPC ServerLive)")
    n.add_argument("--no-progress", dest="progress", action="store_false", help="no live progress on stderr")


def _naiad_version() -> str:
    from naiad import __version__

    return __version__


def build_parser(prog: str = "naiad bench") -> argparse.ArgumentParser:
    parser = Parser(prog=prog, description=__doc__)
    add_arguments(parser)
    return parser


def _load_json(text: str) -> Any:
    path = Path(text)
    return json.loads(path.read_text()) if path.is_file() else json.loads(text)


def main(argv: list[str] | None = None, prog: str = "naiad bench") -> int:
    return run(build_parser(prog).parse_args(argv))


def perf_analyzer_main() -> int:
    """``naiad-perf-analyzer``: perf_analyzer's command line as an executable of its own, e.g. Model Analyzer's
    ``--perf-analyzer-path``."""
    return main(sys.argv[1:], prog="naiad-perf-analyzer")


def run(args: argparse.Namespace) -> int:
    from naiad.bench import report
    from naiad.bench.api import Target
    from naiad.bench.inputs import InputError
    from naiad.bench.progress import Progress
    from naiad.bench.session import Options, Session, Settings, ceiling

    def fail(message: str, code: int = OPTION_ERROR) -> int:
        print(message, file=sys.stderr)
        return code

    if args.async_mode and args.sync:
        return fail("Cannot specify --async and --sync simultaneously.")
    if args.concurrency_range and args.request_rate_range:
        return fail("Cannot use both Concurrency and RequestRate inference load modes.")
    if args.shared_memory == "cuda":
        return fail("CUDA shared memory is not supported: naiad bench runs on CPU-only hosts.")
    if args.streaming and args.protocol != "grpc":
        return fail("Streaming is only allowed with gRPC protocol and Triton C API.")
    if args.percentile != -1 and not 1 <= args.percentile <= 99:
        return fail("Failed to parse --percentile. The value must be -1 for not reporting or in range (0, 100).")
    if args.grpc_compression_algorithm != "none" and args.protocol != "grpc":
        return fail("Using compression algorithm is only allowed with gRPC protocol.")
    if args.ssl_grpc_use_ssl or (args.url or "").lower().startswith("https://"):
        return fail("naiad bench speaks plain HTTP and gRPC only, not TLS: measure a TLS endpoint with "
                    "perf_analyzer, or naiad bench against the server's plain port.")
    intervals: list[int] | None = None
    if args.request_intervals is not None:
        if args.concurrency_range or args.request_rate_range:
            return fail("Cannot specify more then one inference load mode. Please choose only one of the following "
                        "modes: --concurrency-range, --periodic-concurrency-range, --request-rate-range, or "
                        "--request-intervals.")
        intervals = _intervals(args.request_intervals)
        if intervals is None:
            return fail("Failed to parse --request-intervals. The value must be a valid file path")
        if not intervals:
            return fail(f"Failed to parse --request-intervals. {args.request_intervals} holds no interval "
                        "(microseconds > 0, one per line).")
        # one level at the file's mean rate, reported as a request rate (as perf_analyzer does)
        args.request_rate_range = [len(intervals) * 1e6 / sum(intervals)] * 2
    rate_mode = args.request_rate_range is not None
    crange = list(args.concurrency_range or [1]) + [1, 1][len(args.concurrency_range or [1]) - 1:]
    rrange = list(args.request_rate_range or [1.0]) + [1.0, 1.0][len(args.request_rate_range or [1.0]) - 1:]
    start, end, step = (rrange if rate_mode else crange)[:3]
    if start <= 0:
        return fail("The start of the search range must be > 0")
    if end == 0 and not args.latency_threshold and not args.traffic:
        return fail("The end of the search range and the latency limit can not be both 0 (or 0.0) simultaneously")
    if args.binary_search:
        if end == 0:
            return fail("The end of the range can not be 0 (or 0.0) for binary search mode.")
        if not args.latency_threshold:
            return fail("The --latency-threshold cannot be 0 for binary search mode.")
        if end < start:
            return fail("The end of the range can not be less than start of the range for binary search mode.")
    if len(args.input_data) > 1:
        return fail("naiad bench takes one --input-data")
    url = args.url or ("localhost:8001" if args.protocol == "grpc" else "localhost:8000")
    target = Target(url=url, model=args.model, protocol=args.protocol, version=args.version,
                    batch_size=args.batch_size, input_data=(args.input_data or ["random"])[0],
                    shapes=dict(args.shape))
    headers = {}
    for header in args.headers:
        key, _, value = header.partition(":")
        headers[key] = value
    cpus = [int(c) for c in args.cpus.split(",")] if args.cpus else None
    options = Options(streaming=args.streaming, shared_memory=args.shared_memory,
                      output_shm_size=args.output_shared_memory_size, string_length=args.string_length,
                      string_data=args.string_data, headers=headers, cpus=cpus,
                      grpc_channels=args.grpc_connections, grpc_client=args.grpc_client,
                      compression=args.grpc_compression_algorithm, intervals_us=intervals)
    settings = Settings(measurement_interval_ms=args.measurement_interval, measurement_mode=args.measurement_mode,
                        measurement_request_count=args.measurement_request_count, request_count=args.request_count,
                        stability_percentage=args.stability_percentage, max_trials=args.max_trials,
                        percentile=args.percentile, latency_threshold_ms=args.latency_threshold,
                        async_mode=args.async_mode, distribution=args.request_distribution,
                        verbose=bool(args.verbose), collect_metrics=args.collect_metrics,
                        metrics_url=args.metrics_url, metrics_interval_ms=args.metrics_interval,
                        keep_requests=bool(args.profile_export_file))
    progress = Progress(args.progress)

    def out(line: str) -> None:
        progress.pause()
        print(line, flush=True)

    def on_event(event: dict[str, Any]) -> None:
        progress(event)
        if args.verbose and "status" in event:   # perf_analyzer -v: one line per measurement window
            status = event["status"]
            if status.error:
                out(f"  Pass [{event['pass']}] cb::Error: {status.error}")
            elif args.percentile != -1:
                out(f"  Pass [{event['pass']}] throughput: {report.g(status.client.infer_per_sec)} infer/sec. "
                    f"p{args.percentile} latency: {status.client.percentile_latency_ns[args.percentile] // 1000} usec")
            else:
                out(f"  Pass [{event['pass']}] throughput: {report.g(status.client.infer_per_sec)} infer/sec. "
                    f"Avg latency: {status.client.avg_latency_ns // 1000} usec (std {status.client.std_us} usec). ")

    try:
        session = Session(target, settings, options, args.processes, on_event)
    except InputError as exc:
        progress.close()
        return fail(str(exc))
    except Exception as exc:  # noqa: BLE001 - unreachable server, unknown model: perf_analyzer's way, one line
        progress.close()
        return fail(f"error: {_message(exc)}", GENERIC_ERROR)
    try:
        if args.traffic:
            return _traffic(args, session, out, progress)
        top = max(start, end) if end else start
        report.preamble(out, batch_size=args.batch_size, measurement_mode=args.measurement_mode,
                        request_count=args.request_count, percentile=args.percentile, async_mode=args.async_mode,
                        interval_ms=args.measurement_interval, window_count=args.measurement_request_count,
                        concurrency_end=int(end) if not rate_mode else 1, rate_end=float(end) if rate_mode else 1.0,
                        rate_mode=rate_mode, latency_ms=args.latency_threshold, concurrency_limit=int(top),
                        rate_limit=float(top), distribution=args.request_distribution, binary=args.binary_search,
                        decoupled=session.model.decoupled)
        limit = 0.0
        if args.generator_ceiling:
            # Enough requests in flight to find the generator's limit, not the round-trip time's.
            probe = max(16, int(top) if not rate_mode else 0)
            limit = ceiling(url, args.protocol, max(1, probe), 1.0, args.processes, cpus)
            print(f"Load generator: {session.generator.count if session.generator else 0} worker processes; own "
                  f"ceiling {limit:.0f} requests/sec ({'GET /v2/health/live' if args.protocol == 'http' else 'ServerLive'}"
                  f" at concurrency {max(1, probe)})", file=sys.stderr)
        statuses, partial, code = _sweep(args, session, out, settings, rate_mode, start, end, step)
        if statuses:
            report.summary(out, statuses, args.percentile, rate_mode)
        if args.filename and (statuses or partial):
            # what was measured is written even when a level was not stable, marked so, with the reason
            _write_csv(args, session, statuses + partial, rate_mode)
            if partial:
                print(f"Partial results written to {args.filename}: {len(partial)} level(s) not stable, marked "
                      f"in its Stable and Note columns ({partial[0].note})", file=sys.stderr)
        if args.profile_export_file:
            _export(args.profile_export_file, statuses + partial, rate_mode, session)
        if limit:
            for status in statuses:
                if status.client.infer_per_sec / max(1, args.batch_size) > 0.8 * limit:
                    print(f"[WARNING] {'Request rate' if rate_mode else 'Concurrency'} "
                          f"{report.g(status.request_rate) if rate_mode else status.concurrency}: "
                          f"{status.client.infer_per_sec / max(1, args.batch_size):.0f} requests/sec is over 80% of "
                          f"the generator's own ceiling ({limit:.0f}); give it more --processes or cores.",
                          file=sys.stderr)
        return code
    except KeyboardInterrupt:
        return GENERIC_ERROR
    finally:
        progress.close()
        session.close()


def _stopped(out: Any, reason: str, searching: bool = False) -> None:
    """Why a level ends the sweep: on stderr, where perf_analyzer writes it, and on stdout too, so that the report
    a script or a reader keeps of stdout ends with the reason rather than at the level it stopped on (a binary
    search goes on past a level over the limit: there it is that level's result)."""
    print(reason, file=sys.stderr)
    out(f"{'  ' if searching else 'Stopped: '}{reason.strip()}")


def _profile(session: Any, args: argparse.Namespace, out: Any, value: float, rate_mode: bool) -> tuple[Any, bool]:
    from naiad.bench import report

    label = f"Request rate {report.g(value)}" if rate_mode else f"Concurrency {int(value)}"
    if rate_mode:
        out(f"Request Rate: {report.g(value)} inference requests per second")
        status = session.profile(request_rate=float(value), label=label, warmup=args.warmup_request_count)
    else:
        out(f"Request concurrency: {int(value)}")
        status = session.profile(concurrency=int(value), label=label, warmup=args.warmup_request_count)
    meets = True
    if status.error and not status.stable:
        if session.first_error:   # perf_analyzer stops at a failed request, with the server's message
            _stopped(out, f"Thread [0] had error: {session.first_error}", args.binary_search)
        else:
            _stopped(out, status.error, args.binary_search)
        return status, False
    if args.latency_threshold and status.stabilizing_latency_ns / 1e6 >= args.latency_threshold:
        _stopped(out, f"Measured latency went over the set limit of {args.latency_threshold} msec. ", args.binary_search)
        meets = False
    elif not status.stable:
        if rate_mode:
            _stopped(out, "Failed to obtain stable measurement.", args.binary_search)
        else:
            more = "--measurement-interval" if args.measurement_mode == "time_windows" else "--measurement-request-count"
            _stopped(out, f"Failed to obtain stable measurement within {args.max_trials} measurement windows for "
                          f"concurrency {int(value)}. Please try to increase the {more}.", args.binary_search)
        meets = False
    else:
        report.client_block(out, status, percentile=args.percentile, protocol=args.protocol,
                            verbose=bool(args.verbose), decoupled=session.model.decoupled)
        if session.include_server_stats:
            report.server_block(out, status, session.model)
        if args.collect_metrics:
            report.metrics_block(out, status.metrics)
        if status.client.errors:
            print(f"{status.client.errors} requests failed: {session.first_error or status.error}", file=sys.stderr)
    return status, meets


def _sweep(args: argparse.Namespace, session: Any, out: Any, settings: Any, rate_mode: bool, start: float,
           end: float, step: float) -> tuple[list[Any], list[Any], int]:
    """perf_analyzer's linear or binary search over the range (inference_profiler.h Profile<T>). Returns the
    stable levels, the levels measured but not stable (each with its note), and the exit code."""
    statuses: list[Any] = []
    partial: list[Any] = []

    def level(value: float) -> tuple[Any, bool]:
        status, meets = _profile(session, args, out, value, rate_mode)
        if status.stable and not status.error:
            statuses.append(status)
        elif status.note and status.client.request_count:
            partial.append(status)
        return status, meets

    if not args.binary_search:
        value = start
        levels = 0
        while True:
            status, meets = level(value)
            levels += 1
            value += step
            if not (((value <= end) or end == 0) and meets):
                break
        if levels == 1 and not status.stable:
            print("Failed to obtain stable measurement.", file=sys.stderr)
            return statuses, partial, STABILITY_ERROR
        return statuses, partial, 0
    _, meets = level(start)
    if not meets:
        return statuses, partial, 0
    _, meets = level(end)
    if meets:
        return statuses, partial, 0
    low, high = start, end
    while high - low > step:
        mid = (high + low) / 2 if rate_mode else (int(high) + int(low)) // 2
        _, meets = level(mid)
        if meets:
            low = mid
        else:
            high = mid
    return statuses, partial, 0


def _write_csv(args: argparse.Namespace, session: Any, statuses: list[Any], rate_mode: bool) -> None:
    from naiad.bench import report

    path = Path(args.filename)
    metrics = args.collect_metrics and args.verbose_csv
    with path.open("w") as stream:
        report.write_csv(stream, statuses, concurrency_mode=not rate_mode, model=session.model,
                         server_stats=session.include_server_stats, verbose_csv=args.verbose_csv,
                         percentile=args.percentile, metrics=metrics)
    if session.include_server_stats:
        ordered = sorted(statuses, key=lambda s: s.client.infer_per_sec)
        for name in session.model.composing:
            with (path.parent / f"{name}_v{session.control.versions.get(name, '1')}.{path.name}").open("w") as stream:
                report.write_composing_csv(stream, name, ordered, concurrency_mode=not rate_mode,
                                           cache=session.model.response_cache)


def _export(path: str, statuses: list[Any], rate_mode: bool, session: Any) -> None:
    """perf_analyzer's --profile-export-file: per experiment (load level), every request's send and response
    timestamps (ns, the monotonic clock) and the measurement windows' boundaries."""
    experiments = []
    for status in statuses:
        experiments.append({
            "experiment": {"mode": "request_rate" if rate_mode else "concurrency",
                           "value": status.request_rate if rate_mode else status.concurrency},
            "requests": [{"timestamp": start, "request_inputs": {}, "response_timestamps": [end],
                          "response_outputs": []} for start, end in sorted(status.requests)],
            "window_boundaries": status.windows})
    document = {"experiments": experiments, "version": PERF_ANALYZER_VERSION, "service_kind": "triton",
                "endpoint": "", "model": session.model.name}
    Path(path).write_text(json.dumps(document) + "\n")


def _intervals(path: str) -> list[int] | None:
    """--request-intervals' file: microseconds, one per line (None: no such file)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    try:
        values = [int(float(line)) for line in text.split() if line.strip()]
    except ValueError:
        return []
    return [v for v in values if v > 0] if all(v > 0 for v in values) else []


def _message(exc: BaseException) -> str:
    """tritonclient's errors carry the server's text in .message()."""
    message = getattr(exc, "message", None)
    return str(message() if callable(message) else exc)


def _traffic(args: argparse.Namespace, session: Any, out: Any, progress: Any) -> int:
    from naiad.bench import api, report
    from naiad.bench.traffic import Stopping, TrafficError, aws_limits, plan

    try:
        document = _load_json(args.traffic)
        stopping_doc = _load_json(args.stopping) if args.stopping else document.get("StoppingConditions")
        levels = plan(document)
        conditions = Stopping.parse(stopping_doc)
    except (OSError, ValueError, TrafficError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return OPTION_ERROR
    for line in aws_limits(document, stopping_doc):
        print(f"note: {line}", file=sys.stderr)
    out("*** Traffic Pattern ***")
    for lv in levels:
        spawn = f", spawning {report.g(lv.spawn_per_minute)} users/minute" if lv.spawn_per_minute else ""
        out(f"  {lv.name}: {lv.initial_users} users{spawn} for {report.g(lv.duration_s)} s")
    conds = []
    if conditions.max_invocations is not None:
        conds.append(f"MaxInvocations {report.g(conditions.max_invocations)}/minute")
    if conditions.latency_ms is not None:
        conds.append(f"ModelLatencyThresholds P{report.g(conditions.latency_percentile or 0)} "
                     f"{report.g(conditions.latency_ms)} ms")
    conds.append(f"FlatInvocations {'Stop' if conditions.flat_stop else 'Continue'}")
    out("  Stopping conditions: " + ", ".join(conds))
    out("")
    result = api._run_levels(session, levels, conditions, progress)
    for lv, r in zip(levels, result.levels):
        out(f"{lv.name}: users {r.concurrency}, {r.requests} requests in {r.duration_s:.2f} s")
        out(f"  Throughput: {report.g(r.throughput)} infer/sec ({r.requests / r.duration_s * 60 if r.duration_s else 0:.0f}"
            " invocations/minute)")
        out(f"  Latency: avg {r.latency_us['avg']:.0f} usec, p50 {r.latency_us['p50']:.0f} usec, p90 "
            f"{r.latency_us['p90']:.0f} usec, p95 {r.latency_us['p95']:.0f} usec, p99 {r.latency_us['p99']:.0f} usec, "
            f"max {r.latency_us['max']:.0f} usec")
        if r.server:
            out(f"  Server: request {r.server['request']:.0f} usec (overhead {r.server['overhead']:.0f} usec + queue "
                f"{r.server['queue']:.0f} usec + compute input {r.server['compute_input']:.0f} usec + compute infer "
                f"{r.server['compute_infer']:.0f} usec + compute output {r.server['compute_output']:.0f} usec)")
    out("")
    out(f"Stop reason: {result.stop_reason}")
    out(f"Max invocations: {result.max_invocations_per_minute:.0f} per minute")
    lat = result.latency_at_max_us
    if lat:
        out(f"Latency at max invocations: p50 {lat['p50']:.0f} usec, p95 {lat['p95']:.0f} usec, p99 {lat['p99']:.0f} usec")
    if args.filename:
        with open(args.filename, "w") as stream:
            stream.write("Level,Users,Requests,Duration (s),Inferences/Second,Invocations/Minute,Avg latency,"
                         "p50 latency,p90 latency,p95 latency,p99 latency,Max latency,Errors\n")
            for lv, r in zip(levels, result.levels):
                stream.write(f"{lv.name},{r.concurrency},{r.requests},{r.duration_s:.3f},{report.g(r.throughput)},"
                             f"{r.requests / r.duration_s * 60 if r.duration_s else 0:.0f},"
                             + ",".join(str(int(r.latency_us[k])) for k in ("avg", "p50", "p90", "p95", "p99", "max"))
                             + f",{r.errors}\n")
    if result.errors_total:
        print(f"{result.errors_total} requests failed", file=sys.stderr)
    return 0
