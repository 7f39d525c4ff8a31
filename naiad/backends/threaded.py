"""An instance that runs a framework model (onnxruntime, torch, TensorRT) on its own thread.

The frameworks release the GIL while they compute, so each instance gets one worker thread and the event
loop only hands it the requests of an execution: several instances run in parallel, and the loop keeps
serving while a model computes. Schedulers ``submit``: the thread calls the scheduler back on the loop when
done, with no future or task in between (``execute`` returns a future, for other callers).

A model that computes faster than the hop to its thread and back costs (measured here: ~70 us of latency and
most of the throughput on one core) runs inline on the event loop instead: each instance keeps a moving
average of its inference time and runs inline while that stays under ``INLINE_BELOW_NS``, on its thread
otherwise. A slow call raises the average and sends the next ones back to the thread, so a long inference
blocks the loop at most once in a row.

For a model with a batch dimension the requests of an execution run as one batch: inputs are joined along
dimension 0 and outputs split back by each request's batch size (views, not copies).

Overlap: an instance holds up to ``depth`` (2) executions, one running and one waiting on its thread, so the
next batch starts the moment the previous one returns, with no trip through the event loop in between (on a busy
2-core box that trip, two thread wake-ups and the replies cost ~5 ms per execution: a fifth of a 20 ms batch).
Meanwhile the loop sends the finished batch's replies and the dynamic batcher forms the one after. The dynamic
batcher hands a busy instance only a batch that can no longer grow (``naiad.scheduling.dynamic``).
"""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from naiad.backends.base import ExecuteResult, Execution, Instance
from naiad.config import ModelConfig
from naiad.core.errors import Code, InferError, internal
from naiad.core.request import InferRequest, InferResponse

# Inference shorter than this (moving average) runs inline; the thread hop costs more than it saves.
INLINE_BELOW_NS = 100_000
# Executions on the thread before the average is trusted enough to go inline.
_WARMUP_RUNS = 8

class ThreadedInstance(Instance):
    depth = 2  # one execution running on the thread, one waiting behind it

    def __init__(self, name: str, model_name: str, version: int, config: ModelConfig) -> None:
        self.name = name
        self.model_name = model_name
        self.version_str = str(version)
        self.batching = config.max_batch_size > 0
        self.output_names = [o.name for o in config.output]
        # A scalar the framework returns for an output the config gives dims (e.g. [1]) takes those dims.
        self.output_dims = {o.name: tuple(o.dims) for o in config.output}
        # Whether ``_shaped`` can change anything: without, a request's outputs are taken as the model made them.
        self._shapes_scalars = not self.batching and any(self.output_dims.values())
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"naiad-{name}")
        # Executions run one at a time, on the thread or (while none is held there) inline: these need no lock.
        self._runs = 0
        self._average_ns = float(INLINE_BELOW_NS)
        self.inline = False
        self._held = 0  # executions handed to the thread and not yet completed on the loop

    @abc.abstractmethod
    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model once on a full batch; called on the instance's thread. Raise InferError to fail it."""

    def execute(self, requests: list[InferRequest]) -> ExecuteResult:
        if self.inline and not self._held:
            return self._execute(requests)
        self._held += 1
        future = asyncio.get_running_loop().run_in_executor(self._executor, self._started, requests)
        future.add_done_callback(self._release)
        return future

    def execute_now(self, request: InferRequest) -> Execution | None:
        """``request`` alone, run right now on the loop while the instance runs inline and holds nothing on its
        thread; else None (the scheduler then submits it)."""
        if not self.inline or self._held:
            return None
        return self._learn(self._each((request,)))

    def _release(self, _: object) -> None:
        self._held -= 1

    def submit(self, requests: list[InferRequest], done: Callable[[Execution], None]) -> None:
        """Run ``requests`` and call ``done`` with the outcome on the loop, straight from the thread's callback
        (no future); several may be submitted at once: they queue on the thread and run back to back."""
        if self.inline and not self._held:  # never beside a run on the thread: the model runs one at a time
            done(self._execute(requests))
            return
        self._executor.submit(self._run_and_reply, requests, done, asyncio.get_running_loop())
        self._held += 1  # (its completion comes through the loop, so after this line)

    def _run_and_reply(self, requests: list[InferRequest], done: Callable[[Execution], None],
                       loop: asyncio.AbstractEventLoop) -> None:
        try:
            execution = self._started(requests)
        except BaseException as exc:  # noqa: BLE001  (a bug here must not strand the requests)
            execution = Execution([self._error(r, exc) for r in requests], failed=True)
        try:
            loop.call_soon_threadsafe(self._complete, done, execution)
        except RuntimeError:
            pass  # the loop is closed: the server is gone, and nobody waits for the answer

    def _complete(self, done: Callable[[Execution], None], execution: Execution) -> None:
        self._held -= 1
        done(execution)

    def _started(self, requests: list[InferRequest]) -> Execution:
        """An execution on the thread, which may have waited there behind another: that wait is queue time, and
        requests whose clients all left meanwhile don't run."""
        started = time.perf_counter_ns()
        if all(r.cancelled for r in requests):
            error = InferError("Request was cancelled", Code.CANCELLED)
            return Execution([self._error(r, error) for r in requests], failed="CANCELED")
        execution = self._execute(requests)
        execution.started_ns = started
        return execution

    def _execute(self, requests: Sequence[InferRequest]) -> Execution:
        return self._learn(self._execute_batch(requests) if self.batching and len(requests) > 1
                           else self._each(requests))

    def _learn(self, execution: Execution) -> Execution:
        """Whether the next executions run inline, from this one's inference time."""
        self._runs += 1
        self._average_ns = 0.8 * self._average_ns + 0.2 * execution.infer_ns
        self.inline = self._runs >= _WARMUP_RUNS and self._average_ns < INLINE_BELOW_NS
        return execution

    def _each(self, requests: Sequence[InferRequest]) -> Execution:
        responses: list[InferResponse] = []
        infer_ns = output_ns = 0
        failed = False
        run, clock, shaped = self.run, time.perf_counter_ns, self._shapes_scalars
        # One clock reading ends a request's outputs and starts the next one's inference.
        started = t0 = clock()
        # Without a batch dimension requests can't be joined: each runs alone.
        for request in requests:
            t1 = t0
            try:
                outputs = run(request.inputs)
                t1 = clock()
                if shaped:
                    outputs = {n: self._shaped(n, a) for n, a in outputs.items()}
                responses.append(InferResponse(self.model_name, self.version_str, request.id, outputs))
            except Exception as exc:
                responses.append(self._error(request, exc))
                failed = True
            t2 = clock()
            # Inputs are handed over as they are (no gathering), so all time before the outputs is inference.
            infer_ns += t1 - t0
            output_ns += t2 - t1
            t0 = t2
        return Execution(responses, 0, infer_ns, output_ns, failed, started)

    def _execute_batch(self, requests: Sequence[InferRequest]) -> Execution:
        t0 = time.perf_counter_ns()
        try:
            first = requests[0].inputs
            inputs = {name: np.concatenate([r.inputs[name] for r in requests]) for name in first}
            t1 = time.perf_counter_ns()
            outputs = self.run(inputs)
            t2 = time.perf_counter_ns()
            total = sum(r.batch_size for r in requests)
            responses = []
            per_request: list[dict[str, np.ndarray]] = [{} for _ in requests]
            for name, array in outputs.items():
                array = self._shaped(name, array)
                if array.ndim == 0 or array.shape[0] != total:
                    raise internal(
                        f"output '{name}' of model '{self.model_name}' has shape {list(array.shape)}, which does "
                        f"not start with the batch size {total} of the {len(requests)} requests batched together"
                    )
                start = 0
                for slot, request in zip(per_request, requests):
                    slot[name] = array[start : start + request.batch_size]
                    start += request.batch_size
            responses = [
                InferResponse(self.model_name, self.version_str, r.id, outs) for r, outs in zip(requests, per_request)
            ]
            t3 = time.perf_counter_ns()
            return Execution(responses, t1 - t0, t2 - t1, t3 - t2, started_ns=t0)
        except Exception as exc:
            return Execution([self._error(r, exc) for r in requests], time.perf_counter_ns() - t0, failed=True)

    def _shaped(self, name: str, array: np.ndarray) -> np.ndarray:
        if array.ndim == 0 and not self.batching:
            dims = self.output_dims.get(name)
            if dims:
                return array.reshape(dims)
        return array

    def _error(self, request: InferRequest, exc: BaseException) -> InferResponse:
        error = exc if isinstance(exc, InferError) else internal(f"{type(exc).__name__}: {exc}")
        return InferResponse(self.model_name, self.version_str, request.id, error=error)

    def finalize(self) -> None:
        self._executor.shutdown(wait=True)
