"""Triton's ensemble scheduler: a request flows through the composing models' steps as a data-flow graph.

Each step runs as soon as every ensemble tensor its ``input_map`` names exists, so independent steps run at
the same time. Steps are submitted to the composing models' own schedulers (each keeps its own statistics);
completions arrive as future callbacks, so an ensemble request costs no task of its own.

A failed step fails the request with Triton's ``in ensemble '<name>', ...`` prefix; the response goes out
once the steps already running have finished, as Triton waits for them too.

An ensemble request whose client goes away starts no further step (Triton passes the cancellation on to the
next steps, which then don't run) and cancels the steps in flight: a step still queued in its model is dropped
unrun, a running one sees ``is_cancelled()``. It is counted as a failure for the CANCELED reason.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import numpy as np

from naiad.backends.base import LoadedVersion
from naiad.config import ModelConfig
from naiad.core.errors import Code, InferError, internal, invalid
from naiad.core.request import InferRequest, InferResponse, log_prefix
from naiad.core.stats import ModelStats
from naiad.core.tracing import Trace
from naiad.scheduling.execution import Done


class Composing(Protocol):
    """What a step needs of a composing model version (``naiad.repository.model.ModelVersion``)."""

    name: str
    version_str: str

    def submit(self, request: InferRequest) -> asyncio.Future[InferResponse]: ...


# (model name, version: "" = newest ready) -> the version that runs the step; raises InferError.
Resolve = Callable[[str, str], Composing]


class EnsembleVersion(LoadedVersion):
    """An ensemble has no instances of its own; its composing models do the work."""

    def __init__(self) -> None:
        self.instances = []
        self.scheduler: EnsembleScheduler | None = None  # set by the scheduler made for this version

    def cancel(self, request: InferRequest) -> None:
        if self.scheduler is not None:
            self.scheduler.cancel(request)


class _Step:
    __slots__ = ("index", "inputs", "model_name", "needs", "outputs", "version")

    def __init__(self, index: int, step: Any) -> None:
        self.index = index
        self.model_name: str = step.model_name
        self.version = "" if step.model_version < 0 else str(step.model_version)
        self.inputs: dict[str, str] = dict(step.input_map)  # model input -> ensemble tensor
        self.outputs: dict[str, str] = dict(step.output_map)  # model output -> ensemble tensor
        self.needs = frozenset(self.inputs.values())


class EnsembleScheduler:
    def __init__(self, config: ModelConfig, resolve: Resolve, stats: ModelStats,
                 loaded: LoadedVersion | None = None) -> None:
        if isinstance(loaded, EnsembleVersion):
            loaded.scheduler = self  # its cancel() reaches the requests in flight here
        self.name = config.name
        self.steps = [_Step(i, s) for i, s in enumerate(config.ensemble_scheduling.step)]
        self.output_names = [o.name for o in config.output]
        self.input_names = frozenset(i.name for i in config.input)
        self._resolve = resolve
        self._stats = stats
        self._running = 0
        self._contexts: dict[InferRequest, _Context] = {}  # the requests in flight (by identity)
        # Which steps may start once a tensor appears.
        self._consumers: dict[str, list[_Step]] = {}
        for step in self.steps:
            for tensor in step.needs:
                self._consumers.setdefault(tensor, []).append(step)

    @property
    def pending(self) -> int:
        return self._running

    def stop(self) -> None:
        """Nothing to cancel: steps in flight belong to the composing models' schedulers."""

    def enqueue(self, request: InferRequest, done: Done) -> None:
        self._running += 1
        context = self._contexts[request] = _Context(self, request, done)
        context.start()

    def cancel(self, request: InferRequest) -> None:
        """The client of ``request`` went away."""
        context = self._contexts.get(request)
        if context is not None:
            context.cancel()

    def finished(self, request: InferRequest, response: InferResponse, failed: bool | str, started_ns: int,
                 done: Done) -> None:
        self._running -= 1
        self._contexts.pop(request, None)
        if not failed:
            # The ensemble has no compute phases of its own: Triton sums its steps'; the wall time the steps
            # took stands in for that sum here.
            elapsed = time.perf_counter_ns() - started_ns
            self._stats.record_execution(request.batch_size or 1, 0, elapsed, 0)
            self._stats.queue.add(0)
            self._stats.compute_input.add(0)
            self._stats.compute_infer.add(elapsed)
            self._stats.compute_output.add(0)
        done(request, response, failed)


class _Context:
    """One ensemble request on its way through the steps."""

    __slots__ = (
        "done",
        "error",
        "failed_step",
        "futures",
        "in_flight",
        "request",
        "scheduler",
        "started",
        "started_ns",
        "tensors",
    )

    def __init__(self, scheduler: EnsembleScheduler, request: InferRequest, done: Done) -> None:
        self.scheduler = scheduler
        self.request = request
        self.done = done
        self.tensors: dict[str, np.ndarray] = {}
        self.started: set[int] = set()
        self.in_flight = 0
        self.futures: set[asyncio.Future[InferResponse]] = set()  # the steps in flight
        self.error: InferError | None = None
        self.failed_step: _Step | None = None
        self.started_ns = time.perf_counter_ns()

    def start(self) -> None:
        request = self.request
        for name, array in request.inputs.items():
            if name not in self.scheduler.input_names:
                self.error = invalid(
                    f"{log_prefix(request)}unexpected input '{name}' in request header that does not map to any "
                    "ensemble inputs"
                )
                break
            self.tensors[name] = array
        if self.error is None:
            self._launch([s for s in self.scheduler.steps if s.needs <= self.tensors.keys()])
        self._maybe_finish()

    def _launch(self, steps: list[_Step]) -> None:
        for step in steps:
            if self.error is not None:
                return
            if step.index in self.started or not step.needs <= self.tensors.keys():
                continue
            self.started.add(step.index)
            self._submit(step)

    def _submit(self, step: _Step) -> None:
        parent = self.request
        inputs = {model_input: self.tensors[tensor] for model_input, tensor in step.inputs.items()}
        request = InferRequest(step.model_name, step.version, parent.id, inputs, list(step.outputs),
                               parent.parameters)
        request.correlation_id = parent.correlation_id
        request.flags = parent.flags
        request.priority = parent.priority
        request.timeout_us = parent.timeout_us
        try:
            model = self.scheduler._resolve(step.model_name, step.version)
            if parent.trace is not None:  # a traced ensemble traces its steps, as Triton's child traces
                request.trace = parent.trace.child(model.name, model.version_str, parent.id)
            future = model.submit(request)
        except InferError as exc:
            self._fail(step, exc)
            return
        except Exception as exc:  # a bug in a step must fail the request, not strand it
            self._fail(step, internal(f"{type(exc).__name__}: {exc}"))
            return
        self.in_flight += 1
        self.futures.add(future)
        future.add_done_callback(partial(self._step_done, step))
        if request.trace is not None:
            future.add_done_callback(partial(_trace_end, request.trace))

    def cancel(self) -> None:
        """No step starts from now on; those in flight are cancelled (their models drop or stop them)."""
        if self.error is None:
            self.error = InferError("Request was cancelled", Code.CANCELLED)
        for future in list(self.futures):
            future.cancel()  # its done-callback (_step_done) follows on the loop

    def _step_done(self, step: _Step, future: asyncio.Future[InferResponse]) -> None:
        self.in_flight -= 1
        self.futures.discard(future)
        if self.error is None:
            if future.cancelled():
                self._fail(step, internal("the step was cancelled"))
            elif future.exception() is not None:
                exc = future.exception()
                self._fail(step, exc if isinstance(exc, InferError) else internal(f"{type(exc).__name__}: {exc}"))
            else:
                response = future.result()
                if response.error is not None:
                    self._fail(step, response.error)
                else:
                    produced: list[str] = []
                    for model_output, tensor in step.outputs.items():
                        array = response.outputs.get(model_output)
                        if array is not None:
                            self.tensors[tensor] = array
                            produced.append(tensor)
                    ready: list[_Step] = []
                    for tensor in produced:
                        ready.extend(self.scheduler._consumers.get(tensor, ()))
                    self._launch(ready)
        self._maybe_finish()

    def _fail(self, step: _Step, error: InferError) -> None:
        self.error = error
        self.failed_step = step

    def _maybe_finish(self) -> None:
        if self.in_flight:
            return
        scheduler = self.scheduler
        request = self.request
        if self.error is None and any(n not in self.tensors for n in scheduler.output_names):
            self.error = invalid(
                f"{log_prefix(request)}unexpected deadlock, at least one output is not set while no more ensemble "
                "steps can be made"
            )
        if self.error is not None:
            message = self.error.message
            step = self.failed_step
            # Triton prefixes the step's own message; most already name the model, the others get it added.
            if step is not None and step.model_name not in message:
                message = f"step {step.index} (model '{step.model_name}'): {message}"
            error = InferError(f"in ensemble '{scheduler.name}', {message}", self.error.code)
            response = InferResponse(request.model_name, "", request.id, error=error)
            failed = "CANCELED" if request.cancelled else True
            scheduler.finished(request, response, failed, self.started_ns, self.done)
            return
        outputs = {n: self.tensors[n] for n in scheduler.output_names}
        response = InferResponse(request.model_name, "", request.id, outputs)
        scheduler.finished(request, response, False, self.started_ns, self.done)


def _trace_end(trace: Trace, _: asyncio.Future) -> None:
    trace.add("REQUEST_END")
