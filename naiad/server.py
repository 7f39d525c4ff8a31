"""Wiring and lifecycle: load the repository, open the front ends, drain on SIGTERM/SIGINT, finalize."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from naiad.core.errors import STATUS_NAMES, InferError, internal, invalid
from naiad.core.heap import keep_big_buffers
from naiad.core.settings import LogSettings
from naiad.core.stats import ModelStats
from naiad.core.tracing import Tracer
from naiad.frontends import poll, ports, serving
from naiad.frontends.grpc.options import GrpcOptions
from naiad.frontends.http.options import HttpOptions
from naiad.frontends.metrics.options import MetricsOptions
from naiad.repository.consent import FLAG as CODE_FLAG
from naiad.repository.consent import startup_warning as code_upload_warning
from naiad.repository.control import ModelControl
from naiad.repository.eviction import make_policy
from naiad.repository.manager import ModelRepository, RepositoryOptions
from naiad.repository.memory import parse_size
from naiad.sagemaker.options import SageMakerOptions
from naiad.sagemaker.residency import Residency
from naiad.scheduling.cache import ResponseCache, register_cache_metrics
from naiad.scheduling.rate_limiter import RateLimiter
from naiad.service import Service

log = logging.getLogger("naiad")

# What requests still in flight when the exit timeout ends are answered (UNAVAILABLE: HTTP 503, gRPC UNAVAILABLE).
CUT_MESSAGE = "Server is shutting down: the request did not complete within --exit-timeout-secs"


@dataclass
class ServerOptions:
    model_repositories: list[Path]
    model_config_name: str = ""
    auto_complete: bool = True
    load_threads: int = 4
    load_retries: int = 0
    load_timeout: float = 600.0  # --model-load-timeout-secs (0: none)
    gpu_limits: dict[int, float] = field(default_factory=dict)  # --model-load-gpu-limit: device -> fraction
    archive_limits: tuple[int, int] | None = None  # --model-archive-max-bytes / -members (None: archive.py's)
    server_id: str = "triton"
    strict_readiness: bool = True
    exit_on_error: bool = True
    exit_timeout_secs: float = 30.0
    allow_http: bool = True
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    http_max_input_size: int = 64 * 1024 * 1024
    reuse_http_port: bool = False
    shared_memory_max_regions: int = 1024  # registrations at once (each keeps a descriptor)
    backend_config: dict[str, dict[str, str]] = field(default_factory=dict)
    backend_directory: str = "/opt/tritonserver/backends"
    cache_config: list[str] = field(default_factory=list)
    rate_limit: str = "off"
    rate_limit_resources: list[str] = field(default_factory=list)
    model_control_mode: str = "none"
    load_models: list[str] = field(default_factory=list)  # explicit mode: loaded at start-up ("*": all)
    repository_poll_secs: float = 15.0
    allow_model_code_upload: bool = False  # any client may load code (model files, ...): repository/consent.py
    grpc: GrpcOptions = field(default_factory=GrpcOptions)
    metrics: MetricsOptions = field(default_factory=MetricsOptions)
    sagemaker: SageMakerOptions = field(default_factory=SageMakerOptions)
    http: HttpOptions = field(default_factory=HttpOptions)  # restricted APIs, header forwarding
    log_settings: LogSettings | None = None  # as the command line configured logging
    trace: dict[str, Any] = field(default_factory=dict)  # the tracer's start-up values (--trace-config)
    idle_poll_us: int = poll.DEFAULT_US  # --idle-poll-us (naiad/frontends/poll.py)


class Process:
    """A process's life: ``start``, serve until SIGTERM / SIGINT, ``stop`` (the server; a front-end process)."""

    options: ServerOptions
    _stopping: asyncio.Event  # set by SIGTERM / SIGINT (``request_stop``)

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self, drain: bool = True) -> None:
        raise NotImplementedError

    def request_stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        # While models load, the loop may be held by a synchronous load: a plain handler runs anyway (the main
        # thread's waits are interruptible); the loop's own handlers take over once the server is up.
        starting = _StartSignals(self.options.exit_timeout_secs)
        try:
            await self.start()
        except SystemExit:
            # A port in use or a failed load: whatever did start is stopped before the process exits.
            starting.close()
            await self.stop(drain=False)
            raise
        starting.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.request_stop)
            except (NotImplementedError, RuntimeError):
                pass
        if starting.signalled:
            self.request_stop()  # the load finished within the exit timeout: stop as any stop does, finalize()
        await self._stopping.wait()
        await self.stop()



class Frontends(Protocol):
    """The part of a server that serves its ports: here (``InProcess``), or in front-end processes
    (``processes.FrontendProcesses``). The server calls it as it starts and at each step of its stop."""

    async def open(self) -> None:
        """Serve the ports (after the models loaded)."""
        ...

    async def quiesce(self, drain: bool, until: float | None) -> None:
        """The stop begins: take no more connections' work elsewhere, and wait (until ``until``, when draining) for
        what others have in flight to reach the service, which drains next."""
        ...

    async def close(self, deadline: float | None, cut: int) -> None:
        """After the drain: stop listening and close the connections (``cut``: how many answers were just cut)."""
        ...

    async def end(self, deadline: float | None) -> None:
        """After the models are finalized."""
        ...


class InProcess:
    """The ports served by this process, over the in-process face."""

    def __init__(self, server: Server) -> None:
        self.options = server.options
        self.ports = serving.Ports(server.options, server.service)

    async def open(self) -> None:
        await self.ports.open(serving.bind(self.options), serving.admission(self.options))

    async def quiesce(self, drain: bool, until: float | None) -> None:
        pass  # (the service's drain is theirs)

    async def close(self, deadline: float | None, cut: int) -> None:
        await self.ports.close(deadline)

    async def end(self, deadline: float | None) -> None:
        pass


class Server(Process):
    """The model side (repository, service, metrics) and a ``Frontends`` part that serves the ports."""

    def __init__(self, options: ServerOptions, frontends: Callable[[Server], Frontends] | None = None) -> None:
        self.options = options
        # Before any model loads: each version's statistics keep a window only when summaries are on.
        ModelStats.summaries = options.metrics.enabled and options.metrics.summary_latencies
        try:
            cache = ResponseCache.parse(options.cache_config)
            limiter = None
            if options.rate_limit == "execution_count":
                limiter = RateLimiter(dict(RateLimiter.parse_resource(v) for v in options.rate_limit_resources))
            repository = ModelRepository(RepositoryOptions(
                paths=options.model_repositories,
                config_name=options.model_config_name,
                auto_complete=options.auto_complete,
                backend_config=options.backend_config,
                backend_directory=options.backend_directory,
                response_cache=cache,
                rate_limiter=limiter,
                load_threads=options.load_threads,
                load_retries=options.load_retries,
                load_timeout=options.load_timeout,
                gpu_limits=options.gpu_limits,
            ))
            self.control = ModelControl(repository, options.model_control_mode, options.load_models,
                                        options.repository_poll_secs, options.allow_model_code_upload)
            self.residency = self._residency(repository, self.control, options)
        except ValueError as exc:
            raise SystemExit(f"error: {exc}") from None
        except InferError as exc:  # e.g. a malformed --sagemaker-model-data-url
            raise SystemExit(f"error: {exc.message}") from None
        self.repository = repository
        if cache is not None:
            register_cache_metrics(lambda: (
                (m.name, m.version_str, m.stats, m.cache is not None)
                for entry in self.repository.models.values() for m in entry.versions.values()
            ))
        self.service = Service(self.repository, strict_readiness=options.strict_readiness, control=self.control,
                               residency=self.residency)
        self.service.server_id = options.server_id
        if options.log_settings is not None:
            self.service.log_settings = options.log_settings
        self.service.tracer = Tracer(options.trace)
        self.service.shared_memory.max_regions = options.shared_memory_max_regions
        self._metrics: Any = None  # MetricsService (imported only when metrics are served)
        self._stopping = asyncio.Event()
        self.frontends: Frontends = (frontends or InProcess)(self)

    @staticmethod
    def _residency(repository: ModelRepository, control: ModelControl, options: ServerOptions) -> Residency | None:
        sagemaker = options.sagemaker
        if not sagemaker.enabled:
            return None
        ports = {"HTTP": options.http_port} if options.allow_http else {}
        if options.grpc.enabled:
            ports["GRPC"] = options.grpc.port
        if options.metrics.enabled:
            ports["metrics"] = options.metrics.port
        sagemaker.check_ports(ports)
        limit = parse_size(sagemaker.memory_limit) if sagemaker.memory_limit else None
        fetch = None
        if sagemaker.model_data_url:
            from naiad.repository.sources import ModelDataSource, is_s3, require_boto3

            if is_s3(sagemaker.model_data_url):
                require_boto3(f"--sagemaker-model-data-url {sagemaker.model_data_url}")
            fetch = ModelDataSource(sagemaker.model_data_url).fetch
        return Residency(repository, control, sagemaker.models_root, limit, fetch, sagemaker.model_data_url,
                         options.archive_limits, make_policy(sagemaker.eviction_policy))

    def _check_repositories(self) -> InferError | None:
        """Triton refuses to create a server on a repository path that is not a folder."""
        for path in self.options.model_repositories:
            if not path.exists():
                return internal(f"failed to stat file {path}")
            if not path.is_dir():
                return invalid("repository path is not a valid directory")
        return None

    async def start(self) -> None:
        failure = self._check_repositories()
        if failure is not None:
            message = f"{STATUS_NAMES[failure.code]} - {failure.message}"
            if self.options.exit_on_error:
                raise SystemExit(f"error: creating server: {message}")
            # Triton then serves with no models, neither live nor ready: health checks fail, as they should.
            log.error("%s: %s", STATUS_NAMES[failure.code], failure.message)
            self.service.failure = failure
        else:
            await self._load_models()
        self._warn_code_upload()
        await self.frontends.open()
        if self._metrics is None:
            await self.open_metrics()
        if failure is None:
            self.service.live = True
            self.service.accepting = True
            self.control.start_polling()

    async def open_metrics(self) -> None:
        if self.options.metrics.enabled:
            from naiad.frontends.metrics.server import MetricsService

            self._metrics = MetricsService(self.service, self.options.metrics)
            try:
                await self._metrics.start()
            except OSError as exc:
                raise SystemExit(ports.bind_error("Metrics", self.options.metrics.address,
                                                  self.options.metrics.port, exc)) from None

    def _warn_code_upload(self) -> None:
        """Explicit mode: say which front ends refuse model code, and how to allow it; or that any client may."""
        options = self.options
        if options.model_control_mode != "explicit":
            return
        keyed = {"HTTP": (options.allow_http, options.http.restricted.rule("model-repository") is not None),
                 "gRPC": (options.grpc.enabled, options.grpc.restricted.rule("model-repository") is not None)}
        if options.allow_model_code_upload:
            open_to_all = [name for name, (on, key) in keyed.items() if on and not key]
            if open_to_all:
                log.warning("%s: any %s client that reaches the port may load model code, which runs as this "
                            "server's user; restrict model-repository with a key instead where you can", CODE_FLAG,
                            " or ".join(open_to_all))
            return
        unkeyed = [name for name, (on, key) in keyed.items() if on and not key]
        if unkeyed:
            log.warning("%s", code_upload_warning(unkeyed))

    async def _load_models(self) -> None:
        self.control.load_startup()
        await self.repository.warm_up()  # before any front end opens: no version is READY un-warmed
        for row in self.repository.index():
            log.info("model %-24s version %-4s %s%s", row["name"], row.get("version", "-"), row["state"],
                     f" ({row['reason']})" if row.get("reason") else "")
        if self.options.exit_on_error and not self.repository.all_ready():
            # Triton unloads what did load, then exits (code 1) with this line.
            self.repository.unload_all()
            raise SystemExit("error: creating server: Internal - failed to load all models")

    async def stop(self, drain: bool = True) -> None:
        """Refuse new work, let in-flight requests finish, then finalize every model, all within the exit timeout:
        what is still in flight at its end is answered UNAVAILABLE, and workers still busy then are killed."""
        deadline = drain_end = None
        cut = 0
        if drain:
            timeout = self.options.exit_timeout_secs
            deadline = time.monotonic() + timeout
            log.info("Waiting for in-flight requests to complete (timeout %.0fs)", timeout)
            # The last tenth (at most a second) is left for finalize(), so the process exits in time.
            drain_end = deadline - min(1.0, timeout / 10)
        await self.frontends.quiesce(drain, drain_end)
        if drain_end is not None:
            drained = await self.service.drain(max(0.0, drain_end - time.monotonic()))
            if not drained:
                cut = self.service.cut(CUT_MESSAGE)
                log.warning("Timeout: %d in-flight requests did not complete; answered UNAVAILABLE", cut)
                await asyncio.sleep(0.05)  # the front ends write those answers
        await self.frontends.close(deadline, cut)
        if self._metrics is not None:
            self._metrics.stop()
        self.service.live = False
        await self.control.close()
        self.repository.unload_all(deadline)
        self.service.shared_memory.close()  # unmap what clients left registered
        self.service.tracer.close()  # the traces still held, and the trace file's closing bracket
        await self.frontends.end(deadline)
        log.info("All models are stopped, unloading models")


class _StartSignals:
    """SIGTERM / SIGINT before the server is up. The loads under way finish and the server then stops as it
    would later (drain, finalize), unless that takes past --exit-timeout-secs from the signal: then the process
    exits there, as docker stop would kill it at its own grace (its workers end with it, PR_SET_PDEATHSIG)."""

    def __init__(self, exit_timeout: float) -> None:
        self.exit_timeout = exit_timeout
        self.signalled = False
        self._timer: threading.Timer | None = None
        self._previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.signalled:
            return
        self.signalled = True
        log.info("Stopping: models are still loading (at most %.0fs more)", self.exit_timeout)
        self._timer = threading.Timer(self.exit_timeout, self._give_up)
        self._timer.daemon = True
        self._timer.start()

    def _give_up(self) -> None:
        sys.stderr.write(f"error: stopped while models were loading: they did not finish within "
                         f"--exit-timeout-secs ({self.exit_timeout:g}s)\n")
        sys.stderr.flush()
        os._exit(1)

    def close(self) -> None:
        """The server is up (or failed to start): the stop, if any, is the loop's from here."""
        if self._timer is not None:
            self._timer.cancel()
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)


def run_process(main: Callable[[], Coroutine[Any, Any, None]]) -> int:
    """Run the coroutine ``main`` makes on uvloop where it is installed; a ``SystemExit`` with a message (a failed
    start, in making it or running it: Triton's one line) is printed and exits 1."""
    keep_big_buffers()
    try:
        import uvloop

        run: Callable[[Coroutine[Any, Any, None]], None] = uvloop.run
    except ImportError:
        run = asyncio.run
    try:
        run(main())
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            return 1
        raise
    # Stopped: what is left is the interpreter's teardown, whose last collection walks every object the models and
    # libraries made (~0.7 s here, past --exit-timeout-secs). Frozen, it skips them; atexit hooks still run.
    gc.freeze()
    return 0
