"""``naiad serve`` with Triton's flag names (``tritonserver --help``)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from naiad import __version__
from naiad.core import trace_config
from naiad.core.cores import auto_frontends
from naiad.core.errors import InferError
from naiad.core.flags import add_flag, parse_bool
from naiad.core.pid1 import become_init
from naiad.core.settings import FORMATS, LogSettings
from naiad.frontends.grpc import options as grpc_options
from naiad.frontends.http import options as http_options
from naiad.frontends.metrics import options as metrics_options
from naiad.sagemaker import options as sagemaker_options


def _verbosity(value: str) -> int:
    """``--log-verbose``: a level, or true / false as Triton's SageMaker serve script passes it."""
    if value.strip().lstrip("-").isdigit():
        return int(value)
    return int(parse_bool(value))


def _repository(spec: str, limits: tuple[int, int]) -> Path:
    """A local folder as given; an ``s3://`` prefix or a ``.tar.gz`` becomes a local copy first (Triton
    downloads s3:// repositories too). ``limits``: an archive's most bytes and members."""
    if not (spec.startswith("s3://") or spec.endswith((".tar.gz", ".tgz", ".tar"))):
        return Path(spec).resolve()
    import tempfile

    from naiad.repository.sources import materialize_repository

    cache = Path(tempfile.gettempdir()) / f"naiad-repositories-{os.getuid()}"
    logging.getLogger("naiad").info("fetching model repository %s", spec)
    return materialize_repository(spec, cache, limits)


def _backend_config(values: list[str]) -> dict[str, dict[str, str]]:
    """``--backend-config=python,shm-default-byte-size=1048576`` -> {"python": {...}}."""
    parsed: dict[str, dict[str, str]] = {}
    for value in values:
        backend, _, setting = value.partition(",")
        if not setting:
            backend, setting = "", value  # a global setting applies to every backend
        key, sep, val = setting.partition("=")
        if not sep:
            raise SystemExit(f"error: --backend-config expects <backend>,<setting>=<value>, got '{value}'")
        parsed.setdefault(backend, {})[key] = val
    return parsed


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="naiad", description="A Triton-compatible inference server.")
    parser.add_argument("--version", action="version", version=f"naiad {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    sagemaker = commands.add_parser(
        "sagemaker", help="run as a SageMaker container: 'naiad sagemaker serve' reads SageMaker's environment "
                          "as Triton's serve script does, then starts 'naiad serve'")
    sagemaker.add_argument("arguments", nargs=argparse.REMAINDER)
    from naiad.bench.cli import add_arguments as bench_arguments

    bench_arguments(commands.add_parser("bench", help="load-test a model as perf_analyzer does (its flag names), "
                                                      "or run an Inference Recommender traffic pattern"))
    serve = commands.add_parser("serve", help="serve a Triton model repository",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    serve.add_argument("--model-repository", "--model-store", action="append", required=True,
                       dest="model_repository",
                       help="model repository: a folder, an s3://bucket/prefix, or a .tar.gz of one (repeatable)")
    from naiad.repository.archive import DEFAULT_MAX_BYTES, DEFAULT_MAX_MEMBERS

    serve.add_argument("--model-archive-max-members", type=int, default=DEFAULT_MAX_MEMBERS, metavar="N",
                       help="naiad only: most members a model archive (SageMaker's on-demand loads, a .tar.gz "
                            "--model-repository) may hold; counted before anything is extracted")
    serve.add_argument("--model-archive-max-bytes", default=f"{DEFAULT_MAX_BYTES >> 30}G", metavar="SIZE",
                       help="naiad only: most bytes a model archive may expand to (bytes, K/M/G/T)")
    serve.add_argument("--model-config-name", default="", help="use configs/<name>.pbtxt where a model has one")
    serve.add_argument("--disable-auto-complete-config", action="store_true",
                       help="never fill a config from the model itself")
    serve.add_argument("--strict-model-config", type=parse_bool, nargs="?", const=True, default=None, metavar="BOOL",
                       help="deprecated Triton spelling: true is --disable-auto-complete-config")
    serve.add_argument("--model-load-thread-count", type=int, default=4, metavar="N",
                       help="models loaded side by side, at start-up and on request (the load pool's threads)")
    serve.add_argument("--model-load-timeout-secs", type=float, default=600.0, metavar="SECONDS",
                       help="naiad only: a model whose load (initialize() included) takes longer fails and its "
                            "Python worker processes are killed; 0: wait forever, as Triton does")
    serve.add_argument("--model-load-gpu-limit", action="append", default=[], metavar="<device_id>:<fraction>",
                       help="refuse a load onto a GPU whose used memory is above this fraction of its total "
                            "(repeatable, one per device)")
    serve.add_argument("--model-load-retry-count", type=int, default=0, metavar="N",
                       help="further attempts to load a model version that failed")
    serve.add_argument("--id", default="triton",
                       help="the server's name in server metadata; Triton's default, which clients check")
    serve.add_argument("--model-control-mode", choices=["none", "explicit", "poll"], default="none",
                       help="none: load every model once; explicit: load / unload on request; poll: follow changes")
    serve.add_argument("--load-model", action="append", default=[], metavar="NAME",
                       help="explicit mode: a model to load at start-up (repeatable; '*' loads all)")
    serve.add_argument("--repository-poll-secs", type=float, default=15.0,
                       help="poll mode: seconds between two scans of the model repositories")
    add_flag(serve, "--allow-model-code-upload", False,
          "naiad only: let any client's load request carry code (file: model files, a config override setting "
          "default_model_filename or EXECUTION_ENV_PATH), which runs as this server's user; without it only front ends "
          "whose restricted API covers model-repository accept such loads")
    add_flag(serve, "--strict-readiness", True, "ready only when every model is ready")
    add_flag(serve, "--exit-on-error", True, "exit (code 1) when a model fails to load or a repository is missing; "
                                          "false: serve the models that loaded")
    serve.add_argument("--exit-timeout-secs", type=float, default=30.0,
                       help="how long shutdown waits for in-flight requests")
    add_flag(serve, "--allow-http", True, "serve KServe v2 over HTTP")
    serve.add_argument("--http-port", type=int, default=8000, help="KServe v2 HTTP port")
    serve.add_argument("--http-address", default="0.0.0.0", help="address the HTTP server binds")
    serve.add_argument("--http-max-input-size", type=int, default=64 * 1024 * 1024,
                       help="largest request body accepted, in bytes, and the most a compressed body may expand "
                            "to; a larger Content-Length is answered 413 before the body is read")
    add_flag(serve, "--reuse-http-port", False, "let several servers listen on the HTTP port (SO_REUSEPORT)")
    serve.add_argument("--frontend-processes", default="auto", metavar="N|auto",
                       help="processes that serve the HTTP, gRPC and SageMaker ports, each calling this one (the model "
                            "host) through shared memory; 1: one process does everything. auto (the default): 1 "
                            "with 2 cores or fewer (one process is faster there), else one per core but one (at "
                            "most 16); cores: the CPUs this process may use, capped by a container's CPU quota")
    serve.add_argument("--idle-poll-us", type=int, default=200, metavar="MICROSECONDS",
                       help="naiad only: after an answer, with no request in flight, the front end keeps polling for "
                            "the next request for up to this long (adapting to the client's pace) rather than "
                            "sleeping at once, which saves the CPU and latency of waking up at low concurrency; not "
                            "while a CPU quota (docker --cpus, a Kubernetes limit) was lately run out of; 0: never")
    serve.add_argument("--shared-memory-max-regions", type=int, default=1024, metavar="N",
                       help="most system shared memory regions registered at once (each keeps a descriptor open)")
    http_options.add_arguments(serve, add_flag)
    grpc_options.add_arguments(serve, add_flag)
    metrics_options.add_arguments(serve, add_flag)
    sagemaker_options.add_arguments(serve, add_flag)
    serve.add_argument("--backend-config", action="append", default=[], metavar="BACKEND,KEY=VALUE",
                       help="a backend setting, e.g. python,shm-default-byte-size=1048576 (repeatable)")
    serve.add_argument("--backend-directory", default="/opt/tritonserver/backends", metavar="DIR",
                       help="Python-based backends: a model whose backend is NAME runs DIR/NAME/model.py with the "
                            "Python backend (naiad's own backends are Python packages)")
    serve.add_argument("--cache-config", action="append", default=[], metavar="CACHE,KEY=VALUE",
                       help="response cache, e.g. local,size=1048576 (models opt in with response_cache)")
    serve.add_argument("--response-cache-byte-size", type=int, default=None, metavar="BYTES",
                       help="deprecated Triton spelling of --cache-config local,size=BYTES")
    serve.add_argument("--rate-limit", choices=["off", "execution_count"], default="off",
                       help="execution_count: instances run only when their rate_limiter resources are free")
    serve.add_argument("--rate-limit-resource", action="append", default=[], metavar="NAME:COUNT[:DEVICE]",
                       help="resources available to the rate limiter (none given: the most any instance asks for)")
    serve.add_argument("--log-verbose", type=_verbosity, default=0, metavar="LEVEL",
                       help="1 and up: debug lines, including a traceback for each failed model execution")
    add_flag(serve, "--log-info", True, "log informational messages")
    add_flag(serve, "--log-warning", True, "log warnings")
    add_flag(serve, "--log-error", True, "log errors")
    serve.add_argument("--log-format", choices=FORMATS, default="default",
                       help="default: Triton's 'IMMDD hh:mm:ss.sss'; ISO8601: 'YYYY-MM-DDThh:mm:ss.sssZ I'")
    serve.add_argument("--log-file", default="", metavar="PATH", help="write the log here instead of stderr")
    trace_config.add_arguments(serve)
    _compatibility_flags(serve)
    from naiad.recommend.cli import add_arguments as recommend_arguments  # argparse only at import

    recommend_arguments(commands.add_parser(
        "recommend", help="sweep a model's configs (base, dynamic batching, instance group x2, both) under a traffic "
                          "pattern and recommend one: Inference Recommender and Model Analyzer, locally"))
    from naiad.ray.cli import add_arguments as ray_arguments  # argparse only; Ray is imported when it runs

    ray_arguments(commands.add_parser("ray", help="scale out on Ray Serve: 'naiad ray serve' runs replicas of naiad "
                                                  "behind Ray's proxy with model-aware routing and autoscaling"))
    return parser


def _compatibility_flags(serve: argparse.ArgumentParser) -> None:
    """Flags that concern GPUs or Triton's C++ internals: accepted, so a tritonserver command line runs
    unchanged, and listed here as having no effect."""
    group = serve.add_argument_group(
        "accepted for Triton compatibility, no effect in naiad",
        "naiad runs on CPUs from Python packages: no backend or repository-agent libraries to load, no pinned or "
        "CUDA memory pools, one event loop for HTTP.")
    text = {
        "--repoagent-directory": ("/opt/tritonserver/repoagents", "no repository agents"),
        "--cache-directory": ("/opt/tritonserver/caches", "the local response cache is built in"),
        "--pinned-memory-pool-byte-size": ("268435456", "no pinned memory without CUDA"),
        "--min-supported-compute-capability": ("6.0", "no GPUs are used"),
        "--buffer-manager-thread-count": ("0", "tensors are not copied by helper threads"),
        "--http-thread-count": ("8", "HTTP is served on the event loop, without a thread pool"),
    }
    for name, (default, why) in text.items():
        group.add_argument(name, default=default, metavar="VALUE", help=why)
    for name, example, why in (
        ("--cuda-memory-pool-byte-size", "<device>:<bytes>", "no CUDA"),
        ("--cuda-virtual-address-size", "<device>:<bytes>", "no CUDA"),
        ("--host-policy", "<name>,<setting>=<value>", "no NUMA or core pinning"),
    ):
        group.add_argument(name, action="append", default=[], metavar=example, help=f"{why} (repeatable)")
    add_flag(group, "--enable-peer-access", True, "no GPUs are used")
    add_flag(group, "--model-namespacing", False, "one model per name across repositories")


def _configure_logging(args: argparse.Namespace) -> LogSettings:
    settings = LogSettings()
    settings.configure(args.log_info, args.log_warning, args.log_error, args.log_verbose, args.log_format,
                       args.log_file)
    return settings


def serve(args: argparse.Namespace) -> int:
    from naiad.server import Server, ServerOptions, run_process

    try:
        log_settings = _configure_logging(args)
    except OSError as exc:
        print(f"error: failed to open log file {args.log_file}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        trace = trace_config.from_args(args)
        sagemaker = sagemaker_options.from_args(args)
        metrics = metrics_options.from_args(args)
        http = http_options.from_args(args)
        grpc = grpc_options.from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        from naiad.repository.devices import parse_gpu_limits
        from naiad.repository.memory import parse_size

        gpu_limits = parse_gpu_limits(args.model_load_gpu_limit)
        archive_limits = (parse_size(args.model_archive_max_bytes), args.model_archive_max_members)
        if args.model_load_timeout_secs < 0 or min(archive_limits) <= 0 or args.model_archive_max_bytes.endswith("%"):
            raise ValueError("--model-load-timeout-secs must be 0 or more, and --model-archive-max-bytes and "
                             "--model-archive-max-members more than 0")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        repositories = [_repository(spec, archive_limits) for spec in args.model_repository]
    except InferError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    options = ServerOptions(
        model_repositories=repositories,
        model_config_name=args.model_config_name,
        # --strict-model-config=true is the old spelling of --disable-auto-complete-config, as in Triton.
        auto_complete=not (args.disable_auto_complete_config or args.strict_model_config),
        load_threads=args.model_load_thread_count,
        load_retries=args.model_load_retry_count,
        load_timeout=args.model_load_timeout_secs,
        gpu_limits=gpu_limits,
        archive_limits=archive_limits,
        server_id=args.id,
        strict_readiness=args.strict_readiness,
        exit_on_error=args.exit_on_error,
        exit_timeout_secs=args.exit_timeout_secs,
        allow_http=args.allow_http,
        http_address=args.http_address,
        http_port=args.http_port,
        http_max_input_size=args.http_max_input_size,
        reuse_http_port=args.reuse_http_port,
        shared_memory_max_regions=args.shared_memory_max_regions,
        backend_config=_backend_config(args.backend_config),
        backend_directory=args.backend_directory,
        cache_config=args.cache_config + ([f"local,size={args.response_cache_byte_size}"]
                                          if args.response_cache_byte_size is not None else []),
        rate_limit=args.rate_limit,
        rate_limit_resources=args.rate_limit_resource,
        model_control_mode=args.model_control_mode,
        load_models=args.load_model,
        repository_poll_secs=args.repository_poll_secs,
        allow_model_code_upload=args.allow_model_code_upload,
        grpc=grpc,
        http=http,
        metrics=metrics,
        sagemaker=sagemaker,
        log_settings=log_settings,
        trace=trace,
        idle_poll_us=args.idle_poll_us,
    )
    try:
        processes = frontend_processes(args.frontend_processes)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1

    def start() -> Coroutine[Any, Any, None]:
        if processes > 1:
            from naiad.processes import host

            return host(options, processes).run()
        return Server(options).run()

    return run_process(start)


def frontend_processes(value: str) -> int:
    """--frontend-processes: a count, or ``auto`` (one on a small host, where one process is faster), which says
    at start what it chose and why."""
    if value == "auto":
        count, why = auto_frontends()
        logging.getLogger("naiad").info("%s", why)
        return count
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"--frontend-processes must be a positive number or auto, not '{value}'")
    return int(value)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    # A container's entry point (PID 1): an init that reaps and forwards signals stays PID 1, naiad runs as its child.
    code = become_init()
    if code is not None:
        return code
    if argv[:1] == ["sagemaker"]:
        # Triton's docker/sagemaker/serve script, reading SageMaker's environment before `naiad serve`.
        from naiad.sagemaker.serve import main as sagemaker_main

        return sagemaker_main(argv[1:], main)
    if argv[:1] == ["bench"]:
        # its own parser: perf_analyzer's exit code 99 for option errors, and its --version
        from naiad.bench.cli import main as bench_main

        return bench_main(argv[1:])
    try:
        args = build_parser().parse_args(argv)
        if args.command == "serve":
            return serve(args)
    except KeyboardInterrupt:
        # Ctrl-C before the server's own handler is set (while it imports): stop without a traceback.
        return 130
    if args.command == "bench":
        from naiad.bench.cli import run as bench

        return bench(args)
    if args.command == "ray":
        from naiad.ray.cli import run as ray_serve

        return ray_serve(args)
    if args.command == "recommend":
        from naiad.recommend.cli import run as recommend

        return recommend(args)
    return 2
