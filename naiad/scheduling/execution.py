"""What every scheduler shares: running one formed batch on an instance, the pool of free instances, and the
statistics of an execution.

A batch runs inline when the instance answers inline, or in one task per *execution* (never per request) when
it answers with an awaitable, so instances run in parallel either way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Callable

from naiad.backends.base import Execution, Instance
from naiad.core.errors import Code, InferError, internal
from naiad.core.request import InferRequest, InferResponse
from naiad.core.stats import ModelStats

if TYPE_CHECKING:
    from naiad.scheduling.rate_limiter import RateLimiter

log = logging.getLogger("naiad.scheduling")

# (request, response, failed): False, True (the execution failed), or the failure reason for the statistics
# when the scheduler refused the request itself ("REJECTED": its queue timeout expired)
Done = Callable[[InferRequest, InferResponse, "bool | str"], None]
# (instance, the requests it ran, their responses and timings)
Finish = Callable[[Instance, list[InferRequest], Execution], None]


def failed_execution(requests: list[InferRequest], message: str) -> Execution:
    error = internal(message)
    return Execution([InferResponse(r.model_name, "", r.id, error=error) for r in requests], failed=True)


def drop_cancelled(request: InferRequest, done: Done) -> None:
    """A request whose client went away while it waited: answered without running, and counted as a failure for
    the CANCELED reason (Triton's label; nothing runs for a client that no longer listens)."""
    error = InferError("Request was cancelled", Code.CANCELLED)
    done(request, InferResponse(request.model_name, "", request.id, error=error), "CANCELED")


def run(instance: Instance, requests: list[InferRequest], finish: Finish) -> None:
    """Execute ``requests`` on ``instance`` and call ``finish`` once with the outcome, now or later."""
    submit = getattr(instance, "submit", None)  # duck-typed instances (tests) may lack it
    if submit is not None:  # the backend calls back itself (worker processes): no future, no task
        try:
            submit(requests, partial(finish, instance, requests))
        except Exception as exc:
            finish(instance, requests, failed_execution(requests, str(exc)))
        return
    try:
        result = instance.execute(requests)
    except Exception as exc:  # a backend bug must not strand the requests
        result = failed_execution(requests, str(exc))
    if isinstance(result, Execution):
        finish(instance, requests, result)
        return
    task = asyncio.ensure_future(result)
    task.add_done_callback(lambda t: finish(instance, requests, _outcome(instance, requests, t)))


def _outcome(instance: Instance, requests: list[InferRequest], task: asyncio.Future) -> Execution:
    if task.cancelled():
        return failed_execution(requests, f"execution on instance '{instance.name}' was cancelled")
    exc = task.exception()
    if exc is not None:
        return failed_execution(requests, f"execution on instance '{instance.name}' failed: {exc!r}")
    return task.result()


def record(stats: ModelStats, requests: Sequence[InferRequest], result: Execution, started_ns: int,
           batch_size: int | None = None) -> None:
    """Triton's accounting for one execution: the batch (``batch_size`` counts padding requests too, as the
    backend reports them), and, for requests that completed, their queue and compute times."""
    if result.failed == "CANCELED":  # the backend dropped it unrun, as drop_cancelled does: no execution
        return
    if result.started_ns > started_ns:  # the instance started it later than it was handed over: queue time
        started_ns = result.started_ns
    inferences = 0
    queue_ns = 0  # (only counted if it did not fail)
    for r in requests:
        inferences += r.batch_size or 1
        queue_ns += started_ns - r.arrival_ns
        if r.trace is not None:
            _trace_compute(r, result, started_ns)
    stats.record_execution(inferences if batch_size is None else batch_size, result.input_ns, result.infer_ns,
                           result.output_ns, bool(result.failed), inferences)
    if result.failed:
        _log_failure(requests, result)
    else:
        n = len(requests)
        if stats.queue.window is None:  # no summaries (the default): the four durations added in place
            stats.queue.count += n
            stats.queue.ns += queue_ns
            stats.compute_input.count += n
            stats.compute_input.ns += result.input_ns
            stats.compute_infer.count += n
            stats.compute_infer.ns += result.infer_ns
            stats.compute_output.count += n
            stats.compute_output.ns += result.output_ns
            return
        stats.queue.add(queue_ns, n)
        stats.compute_input.add(result.input_ns, n)
        stats.compute_infer.add(result.infer_ns, n)
        stats.compute_output.add(result.output_ns, n)


def _trace_compute(request: InferRequest, result: Execution, started_ns: int) -> None:
    """The execution's phases as Triton's COMPUTE_* activities, from the times the backend measured."""
    trace = request.trace
    assert trace is not None
    input_end = started_ns + result.input_ns
    output_start = input_end + result.infer_ns
    trace.add("COMPUTE_START", started_ns)
    trace.add("COMPUTE_INPUT_END", input_end)
    trace.add("COMPUTE_OUTPUT_START", output_start)
    trace.add("COMPUTE_END", output_start + result.output_ns)


def _log_failure(requests: Sequence[InferRequest], result: Execution) -> None:
    """A failed execution is the operator's business too, not only the client's: one line, and the whole
    message (a Python model's traceback) at --log-verbose 1."""
    error = next((r.error for r in result.responses if r.error is not None), None)
    message = error.message if error is not None else "no error message"
    first, _, more = message.partition("\n")
    log.error("execution of model '%s' failed (%d request%s): %s", requests[0].model_name if requests else "?",
              len(requests), "" if len(requests) == 1 else "s", first)
    if more.strip():
        log.debug("model '%s' execution error in full: %s", requests[0].model_name if requests else "?", message)


class InstancePool:
    """The instances free to take work. With a rate limiter an instance is only handed out once its group's
    resources are granted; ``wake`` is called when a refused instance may now be granted.

    With ``overlap`` (and no rate limiter, whose resources an instance holds while it executes), an instance of
    ``depth`` > 1 that is busy may also take more executions: ``room`` lists those, the one handed work longest ago
    (the likeliest to finish first) in front."""

    def __init__(self, instances: list[Instance], limiter: "RateLimiter | None" = None,
                 wake: Callable[[], None] | None = None, overlap: bool = False) -> None:
        self._idle: deque[Instance] = deque(instances)
        self._limiter = limiter
        self._wake = wake
        self.busy = 0  # executions handed out and not given back
        self.room: deque[Instance] = deque()
        self._deep = overlap and limiter is None and any(getattr(i, "depth", 1) > 1 for i in instances)
        self._held: dict[int, int] = {}  # id(instance) -> executions it holds, for deep pools

    def __bool__(self) -> bool:
        return bool(self._idle)

    def take(self) -> Instance | None:
        if not self._idle:
            return None
        if self._limiter is None:
            self.busy += 1
            instance = self._idle.popleft()
            if self._deep:
                self._held[id(instance)] = 1
                if getattr(instance, "depth", 1) > 1:
                    self.room.append(instance)
            return instance
        # Triton's order: the instance with the fewest executions (weighted by priority) first.
        for instance in sorted(self._idle, key=self._limiter.score):
            if self._limiter.acquire(instance, self._wake):
                self._idle.remove(instance)
                self.busy += 1
                return instance
        return None

    def take_busy(self) -> Instance:
        """A busy instance with room for one more execution (``room`` must not be empty)."""
        instance = self.room.popleft()
        self.busy += 1
        held = self._held[id(instance)] = self._held[id(instance)] + 1
        if held < instance.depth:
            self.room.append(instance)
        return instance

    def give(self, instance: Instance) -> None:
        self.busy -= 1
        if self._deep:
            held = self._held[id(instance)] = self._held[id(instance)] - 1
            if held:  # the next one it holds has just started: it has room again, and finishes last
                if instance not in self.room:
                    self.room.append(instance)
                return
            if instance in self.room:
                self.room.remove(instance)
        if self._limiter is not None:
            self._limiter.release(instance)
        self._idle.append(instance)


# The clock itself, not a function around it: one Python frame fewer per execution.
now_ns = time.perf_counter_ns
