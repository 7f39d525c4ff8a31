"""Triton's default scheduler (no ``dynamic_batching``): one request per execution, spread over the free
instances, which run in parallel.

Each pending request carries a completion callback; nothing here spawns a task per request. A request is
dispatched inline when an instance is free, so an idle model answers without a trip through the event loop; an
instance that can run it on the loop right away (``execute_now``: a fast framework model) answers it within
``enqueue``, with nothing around the one request but its completion.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from functools import partial

from naiad.backends.base import Execution, Instance
from naiad.core.request import InferRequest
from naiad.core.stats import ModelStats
from naiad.scheduling.execution import Done, InstancePool, drop_cancelled, now_ns, record, run
from naiad.scheduling.rate_limiter import RateLimiter


class DefaultScheduler:
    def __init__(self, instances: list[Instance], stats: ModelStats, limiter: RateLimiter | None = None) -> None:
        self._pool = InstancePool(instances, limiter, self._dispatch)
        self._queue: deque[tuple[InferRequest, Done]] = deque()
        self._stats = stats
        self._dispatching = False

    @property
    def pending(self) -> int:
        return len(self._queue) + self._pool.busy

    def stop(self) -> None:
        """Nothing to cancel: this scheduler keeps no timers."""

    def enqueue(self, request: InferRequest, done: Done) -> None:
        if self._queue:
            self._queue.append((request, done))
            if self._pool:
                self._dispatch()
            return
        # Nothing waits: straight to a free instance (no trip through the queue).
        instance = self._pool.take()
        if instance is None:  # none is free, or a rate limiter refused it (its wake dispatches the queue)
            self._queue.append((request, done))
            return
        execute_now = getattr(instance, "execute_now", None)  # duck-typed instances (tests) may lack it
        execution = execute_now(request) if execute_now is not None else None
        if execution is None:
            run(instance, [request], partial(self._finish, done, now_ns()))
        else:  # run to its end already: its instance's start is when it was handed over
            self._finish(done, execution.started_ns, instance, (request,), execution)

    def _dispatch(self) -> None:
        # An inline execution finishes inside the loop below (``_finish`` asks for a dispatch), which carries on:
        # a deep queue (a burst after a stall) must not become as deep a recursion, whose RecursionError lost answers.
        if self._dispatching:
            return
        self._dispatching = True
        try:
            while self._queue:
                if self._queue[0][0].cancelled:
                    drop_cancelled(*self._queue.popleft())
                    continue
                instance = self._pool.take()
                if instance is None:
                    return
                request, done = self._queue.popleft()
                # A positional partial: called from C, no frame or keyword dict of its own per request.
                run(instance, [request], partial(self._finish, done, now_ns()))
        finally:
            self._dispatching = False

    def _finish(self, done: Done, started: int, instance: Instance, requests: Sequence[InferRequest],
                result: Execution) -> None:
        self._pool.give(instance)
        record(self._stats, requests, result, started)
        done(requests[0], result.responses[0], result.failed)
        if self._queue:
            self._dispatch()
