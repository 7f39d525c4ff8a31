"""The one seam every backend implements.

A ``Backend`` auto-completes a config and loads a model version into ``Instance`` objects. An
instance's ``execute`` takes the requests of one execution and returns an ``Execution`` either
directly (work done inline) or as an awaitable (work done elsewhere: a thread, a worker process).
"""

from __future__ import annotations

import abc
import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Protocol, Union

from naiad.config import ModelConfig
from naiad.core.request import InferRequest, InferResponse


@dataclass
class Execution:
    """Responses for one execute call, one per request, plus the time spent in each phase.

    ``failed`` marks an execution that raised: Triton counts its requests as failures, while a
    response that merely carries the model's own error still counts as a completed inference.
    ``failed="CANCELED"``: the backend did not run it, every request in it having been cancelled
    before it started (counted as a scheduler counts the requests it drops unrun).
    """

    responses: list[InferResponse]
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0
    failed: bool | str = False
    # When the instance started it (perf_counter_ns; 0: when the scheduler handed it over). A worker that takes
    # executions while busy (pipelined) starts them later, and the wait is queue time, as in Triton; an execution
    # the scheduler ran with ``execute_now`` has no hand-over time but this one.
    started_ns: int = 0
    # Indexes of requests the model released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE: the scheduler runs them
    # again (their responses here are placeholders). Only a sequence batcher with iterative_sequence gets these.
    rescheduled: list[int] | None = None


ExecuteResult = Union[Execution, Awaitable[Execution]]


class Core(Protocol):
    """The part of the server core a model may call back into (BLS, ensembles): ``naiad.service.Service``.
    Backends sit below the service, so they see it only through this protocol."""

    def infer(self, request: InferRequest) -> Any: ...  # asyncio.Future[InferResponse]; raises InferError

    def stream(self, request: InferRequest) -> Any: ...  # AsyncIterator[InferResponse]

    def model_ready(self, name: str, version: str = "") -> bool: ...

    # pb_utils.load_model / unload_model: coroutines (a load runs off the loop); raise InferError as Triton would
    def load_model(self, name: str, config: str | None = None, files: dict[str, bytes] | None = None) -> Any: ...

    def unload_model(self, name: str, unload_dependents: bool = False) -> Any: ...


@dataclass
class VersionContext:
    """Everything a backend needs to load one version of a model."""

    name: str
    version: int
    config: ModelConfig
    config_json: str  # Triton's JSON rendering, as handed to Python models
    model_dir: Path
    version_dir: Path
    options: dict[str, str] = field(default_factory=dict)  # --backend-config values for this backend
    core: Core | None = None  # set once the server is wired; None in unit tests that load a backend alone
    # The server's event loop, for backends that watch file descriptors: a load may run on a worker thread
    # (model control), where there is no running loop to attach to.
    loop: asyncio.AbstractEventLoop | None = None
    # --model-load-timeout-secs: time.monotonic() past which the load gives up (None: never). A backend that can
    # stop what it waits on (a worker process) does so and raises; the repository gives up on the others.
    deadline: float | None = None
    timeout: float = 0.0  # the flag's value, for messages and for a restarted worker's own deadline


class Instance(abc.ABC):
    name: str
    # An instance that answers later may also offer ``submit(requests, done)``, calling ``done(Execution)`` once
    # on the event loop: the scheduler then completes from the backend's own callback, with no future and no
    # extra trip through the loop per execution.
    submit: Callable[[list[InferRequest], Callable[[Execution], None]], None] | None = None
    # An instance that may run a request on the event loop itself (a fast model) may also offer
    # ``execute_now(request)``: the execution of that one request, run to its end right now, or None when it can't
    # run it now (the scheduler then submits it as usual). The default scheduler's path for an idle fast model:
    # no list, callback or completion through the backend around the one request.
    execute_now: Callable[[InferRequest], Execution | None] | None = None
    # Executions the instance may hold at once: one running, the others waiting to start the moment it ends
    # (on the instance's own thread or process, with no trip through the event loop between them). The dynamic
    # batcher hands a busy instance a batch only when that batch can no longer grow.
    depth: int = 1

    @abc.abstractmethod
    def execute(self, requests: list[InferRequest]) -> ExecuteResult: ...

    def finalize(self) -> None:
        """Release what the instance holds; called once on unload and shutdown."""


class LoadedVersion(abc.ABC):
    instances: list[Instance]

    @property
    def ready(self) -> bool:
        """False while the version can't serve as configured (e.g. a worker process is being restarted)."""
        return True

    def cancel(self, request: InferRequest) -> None:
        """The client no longer wants ``request``: let a model that checks ``is_cancelled()`` stop early."""

    def pids(self) -> list[int]:
        """The processes the version runs in besides the server's own (their memory is the model's)."""
        return []

    def begin_unload(self) -> None:
        """The server is stopping: let instances start winding down now, so that every version's finalize runs
        side by side before ``unload`` waits for each."""

    def unload(self, deadline: float | None = None) -> None:
        """Finalize every instance; a backend whose instances run apart stops them by force at ``deadline``
        (``time.monotonic()``)."""
        for instance in self.instances:
            instance.finalize()


class Backend(abc.ABC):
    name: str

    def auto_complete(self, config: ModelConfig, model_dir: Path, version_dirs: list[Path]) -> ModelConfig:
        """Fill what the model itself can tell (Triton's backend auto-complete); default: nothing."""
        return config

    @abc.abstractmethod
    def load(self, ctx: VersionContext) -> LoadedVersion: ...
