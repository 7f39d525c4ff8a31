"""Runs ``TritonPythonModel`` classes. By default each instance runs in its own worker process
(``process.py``) with tensors in shared memory; ``--backend-config=python,in-process=true`` runs them
inside the server instead (``inprocess.py``).

Backend settings (``--backend-config=python,<key>=<value>``): ``shm-default-byte-size`` and
``shm-growth-byte-size`` (Triton's, also read from ``SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE`` /
``SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE``), ``in-process``, ``max-async-executions`` (how many
``async def execute`` calls one instance runs at once; default 64) and ``pipeline-depth`` (how many
requests a synchronous instance may have queued in its socket; default 16; it still runs them one by one,
but a deep queue lets a busy worker take several per wake-up and answer them together; with several
instances a request may wait behind a slow one in its instance's queue, so set it to 1 for Triton's strict
"idle instance only" dispatch) and ``restart-wait-seconds`` (how long requests that a crashed worker never
began wait for its replacement before they fail UNAVAILABLE; default 5, shortened by a request's own timeout).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

from naiad.backends.base import Backend, Instance, LoadedVersion, VersionContext
from naiad.backends.python import metrics
from naiad.backends.python.autocomplete import defines_hook, run_isolated
from naiad.backends.python.environment import auto_complete_in_environment, resolve_environment
from naiad.backends.python.inprocess import InProcessInstance
from naiad.backends.python.process import NAIAD_ROOT, WorkerProcess, WorkerSpec
from naiad.backends.python.runner import import_model
from naiad.backends.python.shm import DEFAULT_GROWTH, DEFAULT_SIZE, note_dev_shm
from naiad.backends.registry import python_based
from naiad.config import ModelConfig, pb
from naiad.config.render import config_to_dict, dict_to_config
from naiad.core.errors import invalid

log = logging.getLogger("naiad.python")
_KIND_NAMES = {pb.ModelInstanceGroup.KIND_CPU: "CPU", pb.ModelInstanceGroup.KIND_GPU: "GPU",
               pb.ModelInstanceGroup.KIND_MODEL: "MODEL", pb.ModelInstanceGroup.KIND_AUTO: "AUTO"}
_ENV_SIZES = {"shm-default-byte-size": "SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE",
              "shm-growth-byte-size": "SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE"}


def _model_file(config: ModelConfig, version_dir: Path) -> Path:
    based = python_based(config.backend) if config.backend != "python" else None
    return based if based is not None else version_dir / (config.default_model_filename or "model.py")


def _size_option(options: dict[str, str], key: str, default: int) -> int:
    raw = options.get(key) or os.environ.get(_ENV_SIZES[key]) or ""
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise invalid(f"python backend setting {key} must be a number of bytes, got '{raw}'") from None
    if value <= 0:
        raise invalid(f"python backend setting {key} must be positive, got {value}")
    return value


def _flag(options: dict[str, str], key: str) -> bool:
    return options.get(key, "").strip().lower() in ("1", "true", "yes", "on")


class PythonBackend(Backend):
    name = "python"

    def __init__(self) -> None:
        # Made with the first Python model: the first moment this server needs shared memory of its own, so the
        # moment to say whether /dev/shm's size will matter (once per process; a debug line where it won't).
        note_dev_shm()

    def auto_complete(self, config: ModelConfig, model_dir: Path, version_dirs: list[Path]) -> ModelConfig:
        # Triton asks the newest version's model.py.
        candidates = [d for d in version_dirs if _model_file(config, d).is_file()]
        if not candidates:
            return config
        model_file = _model_file(config, candidates[-1])
        if _has_environment(config):
            # The model's packages live in its environment: its hook runs there, as in Triton's stub.
            result = auto_complete_in_environment(config.parameters["EXECUTION_ENV_PATH"].string_value, model_dir,
                                                  model_file, config.name, config_to_dict(config))
        elif defines_hook(model_file):
            result = run_isolated(sys.executable, _own_env(), model_file, config.name, config_to_dict(config))
        else:
            return config
        if result is None:
            return config
        try:
            return dict_to_config(result)
        except Exception as exc:
            raise invalid(f"auto_complete_config of model '{config.name}' returned an invalid config: {exc}") from None

    def load(self, ctx: VersionContext) -> LoadedVersion:
        if _flag(ctx.options, "in-process"):
            if not _has_environment(ctx.config):
                return InProcessVersion(ctx)
            # Another interpreter can't run inside the server: this model keeps its worker processes.
            log.info("model '%s' has an EXECUTION_ENV_PATH: it runs in worker processes despite in-process=true",
                     ctx.name)
        return WorkerVersion(ctx)


def _own_env() -> dict[str, str]:
    """The server's environment for a process on its own interpreter, naiad importable as workers find it."""
    inherited = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    return {**os.environ, "PYTHONPATH": os.pathsep.join([NAIAD_ROOT, *inherited])}


def _has_environment(config: ModelConfig) -> bool:
    return "EXECUTION_ENV_PATH" in config.parameters and bool(config.parameters["EXECUTION_ENV_PATH"].string_value)


def _instance_args(ctx: VersionContext) -> list[dict[str, str]]:
    out = []
    for group in ctx.config.instance_group:
        for index in range(group.count):
            device = group.gpus[index % len(group.gpus)] if group.gpus else 0
            out.append({
                "model_config": ctx.config_json,
                "model_instance_kind": _KIND_NAMES.get(group.kind, "CPU"),
                "model_instance_name": f"{group.name}_{index}",
                "model_instance_device_id": str(device),
                "model_repository": str(ctx.model_dir),
                "model_version": str(ctx.version),
                "model_name": ctx.name,
            })
    return out


def _plain_scheduling(config: ModelConfig) -> bool:
    if config.HasField("dynamic_batching") or config.HasField("sequence_batching") or len(config.model_warmup):
        return False
    return not any(g.HasField("rate_limiter") for g in config.instance_group)


def _overlapped(config: ModelConfig) -> bool:
    """Only the dynamic batcher lends a busy instance work, and not under the rate limiter."""
    return (config.HasField("dynamic_batching") and not config.HasField("sequence_batching")
            and not any(g.HasField("rate_limiter") for g in config.instance_group))


class InProcessVersion(LoadedVersion):
    def __init__(self, ctx: VersionContext) -> None:
        module = import_model(_model_file(ctx.config, ctx.version_dir), ctx.name)
        self.instances = []
        try:
            for args in _instance_args(ctx):
                self.instances.append(InProcessInstance(ctx, module.TritonPythonModel(), args))
        except BaseException:
            self.unload()
            raise


class WorkerSlot(Instance):
    """What the scheduler sees of a worker: one slot per execution the worker takes at a time (several for
    an ``async def execute``, so awaiting models overlap)."""

    def __init__(self, process: WorkerProcess) -> None:
        self.name = process.name
        self.execute = process.execute  # type: ignore[method-assign]
        self.submit = process.router.submit  # (what process.submit does, one call less per request)

    def execute(self, requests: list) -> Any:  # replaced per instance by the process's own method
        raise NotImplementedError


class WorkerVersion(LoadedVersion):
    answers_early = True  # a non-decoupled request's response may arrive through its sender before DONE (router.py)

    def __init__(self, ctx: VersionContext, model_file: str | None = None,
                 extra_args: dict[str, str] | None = None) -> None:
        """``model_file`` and ``extra_args``: another model.py than the model's own, and what its initialize()
        gets besides Triton's args (naiad's framework adapter, backends/isolated)."""
        options = ctx.options
        shm_default = _size_option(options, "shm-default-byte-size", DEFAULT_SIZE)
        shm_growth = _size_option(options, "shm-growth-byte-size", DEFAULT_GROWTH)
        try:
            concurrency = max(1, int(options.get("max-async-executions", "64")))
        except ValueError:
            raise invalid("python backend setting max-async-executions must be a number") from None
        try:
            # A sync worker still runs one execution at a time, but the next requests are already waiting
            # when it finishes: under load, one wake-up per batch instead of per request (measured on one core
            # at 64 connections: ~25% less CPU per request at 16 than at 4; 32 gained nothing more).
            depth = max(1, int(options.get("pipeline-depth", "16")))
        except ValueError:
            raise invalid("python backend setting pipeline-depth must be a number") from None
        try:
            restart_wait = max(0.0, float(options.get("restart-wait-seconds", "5")))
        except ValueError:
            raise invalid("python backend setting restart-wait-seconds must be a number") from None
        if not _plain_scheduling(ctx.config):
            # Batchers, sequence slots, warmup and the rate limiter count instances: one slot each.
            depth = concurrency = 1
        environment = resolve_environment(ctx)
        self.owner = f"{ctx.name}/{ctx.version}"
        decoupled = ctx.config.model_transaction_policy.decoupled
        model_file = model_file or str(_model_file(ctx.config, ctx.version_dir))
        if not Path(model_file).is_file():
            raise invalid(f"unable to find '{model_file}' for model '{ctx.name}'")
        self.processes: list[WorkerProcess] = []
        for args in _instance_args(ctx):
            args.update(extra_args or {})
            spec = WorkerSpec(ctx.name, ctx.version, args["model_instance_name"], model_file, args, decoupled,
                              [o.name for o in ctx.config.output], shm_default, shm_growth, restart_wait,
                              load_timeout=ctx.timeout)
            spec.iterative = ctx.config.sequence_batching.iterative_sequence
            if environment is not None:
                environment.apply(spec)
            self.processes.append(WorkerProcess(spec, ctx.core))
        try:
            for process in self.processes:  # start them all, then wait: instances initialize in parallel
                process.start()
            for process in self.processes:
                process.wait_ready(ctx.deadline)
        except BaseException:
            for process in self.processes:
                if not process.ready:
                    process.abort()  # still in (or never reached) initialize(): nothing to finalize
            self.unload()
            raise
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        self.instances = []
        for process in self.processes:
            if running is not None:
                process.attach(running)
            elif ctx.loop is not None and not ctx.loop.is_closed():
                # Loaded on a worker thread (model control): watch the worker from the server's loop now, so a
                # crash is seen before the first request, not at it.
                ctx.loop.call_soon_threadsafe(process.attach, ctx.loop)
        # Slots interleave across processes, so the scheduler's round robin spreads work over all of them.
        for round_ in range(max(concurrency if p.is_async else depth for p in self.processes)):
            for process in self.processes:
                if round_ < (concurrency if process.is_async else depth):
                    self.instances.append(WorkerSlot(process))
        if _overlapped(ctx.config):
            # The dynamic batcher may hand a synchronous worker its next full batch while it runs one: the worker
            # starts it the moment the running one returns (it reads it meanwhile), with no trip through the
            # server in between. An async worker would run the two at once, so it keeps one.
            for slot, process in zip(self.instances, self.processes):
                if not process.is_async:
                    slot.depth = 2

    @property
    def ready(self) -> bool:
        return all(p.ready for p in self.processes)

    def pids(self) -> list[int]:
        return [p.proc.pid for p in self.processes if p.proc is not None and p.proc.poll() is None]

    def cancel(self, request: Any) -> None:
        for process in self.processes:
            if process.cancel(request):
                return

    def begin_unload(self) -> None:
        for process in self.processes:
            process.closing = True
        for process in self.processes:
            process.finalize()

    def unload(self, deadline: float | None = None) -> None:
        self.begin_unload()
        for process in self.processes:
            process.stop(deadline)
        metrics.REGISTRY.release(self.owner)
