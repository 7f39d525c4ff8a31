"""Triton's default scheduler: one request per execution, spread over the free instances.

Each pending request carries a completion callback; nothing here spawns a task per request.
An instance whose ``execute`` answers inline finishes within the call; one that answers with
an awaitable is awaited in a single task per execution.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Callable

from naiad.backends.base import Execution, Instance
from naiad.core.errors import internal
from naiad.core.request import InferRequest, InferResponse
from naiad.core.stats import ModelStats

# (request, response, whether the execution itself failed)
Done = Callable[[InferRequest, InferResponse, bool], None]


class DefaultScheduler:
    def __init__(self, instances: list[Instance], stats: ModelStats) -> None:
        self._idle: deque[Instance] = deque(instances)
        self._queue: deque[tuple[InferRequest, Done, int]] = deque()
        self._stats = stats
        self._running = 0

    @property
    def pending(self) -> int:
        return len(self._queue) + self._running

    def enqueue(self, request: InferRequest, done: Done) -> None:
        self._queue.append((request, done, time.perf_counter_ns()))
        if self._idle:
            self._dispatch()

    def _dispatch(self) -> None:
        while self._idle and self._queue:
            instance = self._idle.popleft()
            request, done, queued_at = self._queue.popleft()
            queue_ns = time.perf_counter_ns() - queued_at
            self._running += 1
            try:
                result = instance.execute([request])
            except Exception as exc:  # a backend bug must not strand the request
                result = Execution([InferResponse(request.model_name, "", request.id, error=internal(str(exc)))],
                                   failed=True)
            if isinstance(result, Execution):
                self._finish(instance, [request], [done], queue_ns, result)
            else:
                task = asyncio.ensure_future(result)
                task.add_done_callback(
                    lambda t, i=instance, r=[request], d=[done], q=queue_ns: self._finish_task(i, r, d, q, t)
                )

    def _finish_task(self, instance: Instance, requests: list[InferRequest], dones: list[Done], queue_ns: int,
                     task: asyncio.Future) -> None:
        exc = task.exception() if not task.cancelled() else None
        if task.cancelled() or exc is not None:
            error = internal(f"execution on instance '{instance.name}' failed: {exc!r}")
            result = Execution([InferResponse(r.model_name, "", r.id, error=error) for r in requests], failed=True)
        else:
            result = task.result()
        self._finish(instance, requests, dones, queue_ns, result)

    def _finish(self, instance: Instance, requests: list[InferRequest], dones: list[Done], queue_ns: int,
                result: Execution) -> None:
        self._running -= 1
        self._idle.append(instance)
        batch = sum(r.batch_size or 1 for r in requests)
        self._stats.record_execution(batch, result.input_ns, result.infer_ns, result.output_ns, result.failed)
        if not result.failed:
            # Like Triton, only requests that completed count toward queue and compute times.
            self._stats.queue.add(queue_ns, len(requests))
            self._stats.compute_input.add(result.input_ns, len(requests))
            self._stats.compute_infer.add(result.infer_ns, len(requests))
            self._stats.compute_output.add(result.output_ns, len(requests))
        for request, done, response in zip(requests, dones, result.responses):
            done(request, response, result.failed)
        if self._queue:
            self._dispatch()
