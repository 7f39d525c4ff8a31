"""Triton's dynamic batcher on the event loop.

Requests queue by priority level; whenever an instance is free the batcher forms the next batch the way
Triton's ``GetDynamicBatch`` does: take requests in service order while the total batch size stays within
``max_batch_size`` and their non-batch shapes agree (inputs with a variable dimension not marked
``allow_ragged_batch``, shape tensors by value, and the same optional inputs); send at once when a preferred
size is reached, when the batch can't grow, or when the oldest request has waited ``max_queue_delay``;
otherwise wait for more, at most until that delay (or the nearest request timeout).

Batch formation runs once per event-loop turn rather than per request (``call_soon``), so the requests that
arrived together are batched together even when the model answers inline. Each batch runs on a free instance;
instances run in parallel. With ``preserve_ordering`` responses leave in the order their batches were formed.

Overlap, as Triton's batcher prefetches payloads while every instance is busy: an instance that can hold a second
execution (``Instance.depth``, e.g. a framework model on its own thread) is handed the next batch while it runs
one, so that batch starts the moment the running one ends. Triton keeps growing such a payload until an instance
picks it up; a batch handed over here can't grow, so a busy instance gets one only once it is full (the largest
preferred size, or the next request can't join it). Anything less waits for an idle instance, under the usual
rules (queue delay, preferred sizes, priorities, timeouts), and batches are never smaller than without overlap.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from naiad.backends.base import Execution, Instance
from naiad.config import ModelConfig
from naiad.core.datatypes import WILDCARD
from naiad.core.errors import unavailable
from naiad.core.request import InferRequest, InferResponse
from naiad.core.stats import ModelStats
from naiad.scheduling.execution import Done, InstancePool, drop_cancelled, now_ns, record, run
from naiad.scheduling.queue_policy import Entry, PriorityQueue
from naiad.scheduling.rate_limiter import RateLimiter


def shape_rules(config: ModelConfig) -> tuple[tuple[str, ...], tuple[str, ...], bool]:
    """Which inputs must agree within a batch (Triton's ``enforce_equal_shape_tensors``): by shape, by value
    (shape tensors), and whether the model has optional inputs (then the set of inputs must agree too)."""
    by_shape = tuple(i.name for i in config.input
                     if not i.is_shape_tensor and not i.allow_ragged_batch and WILDCARD in i.dims)
    by_value = tuple(i.name for i in config.input if i.is_shape_tensor)
    return by_shape, by_value, any(i.optional for i in config.input)


class BatchKey:
    """Computes the key two requests must share to be batched together; ``None`` when any shapes batch."""

    def __init__(self, config: ModelConfig) -> None:
        self.by_shape, self.by_value, self.optional = shape_rules(config)
        self.active = bool(self.by_shape or self.by_value or self.optional)

    def __call__(self, request: InferRequest) -> Any:
        inputs = request.inputs
        key: list[Any] = []
        for name in self.by_shape:
            array = inputs.get(name)
            key.append(None if array is None else array.shape[1:])
        for name in self.by_value:
            array = inputs.get(name)
            key.append(None if array is None else (array.shape, np.ascontiguousarray(array).tobytes()))
        if self.optional:
            key.append(frozenset(inputs))
        return tuple(key)


class DynamicBatcher:
    def __init__(self, config: ModelConfig, instances: list[Instance], stats: ModelStats,
                 limiter: RateLimiter | None = None) -> None:
        batching = config.dynamic_batching
        self._stats = stats
        self._pool = InstancePool(instances, limiter, self._wake, overlap=True)
        self._queue = PriorityQueue(config)
        self._max_batch = max(config.max_batch_size, 1)
        self._preferred = frozenset(batching.preferred_batch_size)
        self._max_preferred = max(self._preferred, default=0)
        self._delay_ns = batching.max_queue_delay_microseconds * 1000
        self._key = BatchKey(config)
        self._items = 0  # queued batch size in all, so a busy instance's pass skips the scan while it can't fill
        self._loop: asyncio.AbstractEventLoop | None = None
        self._soon = False  # a formation pass is already scheduled for this loop turn
        self._forming = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        # preserve_ordering: batch number -> finished (requests, dones, responses, failed), released in order
        self._ordered = batching.preserve_ordering and len(instances) > 1
        self._next_batch = 0
        self._next_release = 0
        self._finished: dict[int, tuple[list[InferRequest], list[Done], list[InferResponse], bool | str]] = {}

    @property
    def pending(self) -> int:
        return self._queue.size + self._pool.busy

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def enqueue(self, request: InferRequest, done: Done) -> None:
        self._queue.push(request, done, request.arrival_ns)  # raises for a full queue: nothing was queued
        self._items += request.batch_size or 1
        if not self._soon and (self._pool or self._pool.room):
            self._soon = True
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self._loop.call_soon(self._schedule)

    def _wake(self) -> None:
        if not self._soon:
            self._soon = True
            self._loop = self._loop or asyncio.get_running_loop()
            self._loop.call_soon(self._schedule)

    # --- batch formation ----------------------------------------------------------------------------------------

    def _schedule(self) -> None:
        self._soon = False
        if self._forming:  # an inline execution finished inside the loop below, which carries on
            return
        self._forming = True
        pool = self._pool
        try:
            while self._queue.size:
                if pool:
                    entries, wait_ns = self._form()
                    if not entries:
                        if wait_ns:
                            self._arm(wait_ns)
                        return
                    instance = pool.take()
                    if instance is None:  # the rate limiter refused: put the batch back in front, in order
                        self._requeue(entries)
                        return
                elif pool.room and self._items >= self._max_preferred:
                    entries, _ = self._form(full_only=True)
                    if not entries:
                        return
                    instance = pool.take_busy()
                else:
                    return
                self._dispatch(instance, entries)
        finally:
            self._forming = False

    def _form(self, full_only: bool = False) -> tuple[list[Entry], int]:
        """Triton's GetDynamicBatch for a free instance: the entries to run now, or none and how long to wait.
        ``full_only``: for a busy instance, only a batch that can't grow any more (else none, and no wait)."""
        now = now_ns()
        expired: list[Entry] = []
        count = 0
        size = 0
        best = 0  # entries in the best batch found so far (a preferred size, or the last fit under the largest)
        best_size = 0
        cut = False  # the request after the best batch would pass the largest preferred size
        send_now = False
        key_of = self._key if self._key.active else None
        first_key = None
        max_batch = self._max_batch
        max_preferred = self._max_preferred
        preferred = self._preferred
        for entry in self._queue.scan(now, expired):
            batch_size = entry.request.batch_size or 1
            if count == 0:
                if key_of is not None:
                    first_key = key_of(entry.request)
            else:
                if size + batch_size > max_preferred and best == 0:
                    best, best_size, cut = count, size, True
                if size + batch_size > max_batch:
                    send_now = True
                    break
                if key_of is not None and key_of(entry.request) != first_key:
                    send_now = True
                    break
            count += 1
            size += batch_size
            if size in preferred:
                best, best_size = count, size
        if expired:
            self._reject(expired)
        if count == 0:
            return [], 0
        if full_only:
            if best and (cut or best_size >= max_preferred):
                return self._take(best, best_size), 0
            if not best and (send_now or size >= max_preferred):
                return self._take(count, size), 0
            return [], 0
        delay_ns = self._delay_ns
        waited = now - self._queue.oldest_arrival()
        delay_exceeded = delay_ns != 0 and waited >= delay_ns
        if best and not delay_exceeded:
            return self._take(best, best_size), 0
        if send_now or size >= max_preferred or delay_exceeded or delay_ns == 0:
            return self._take(count, size), 0
        wait = delay_ns - waited
        if self._queue.timeouts:
            deadline = self._queue.closest_deadline()
            if deadline:
                wait = min(wait, max(deadline - now, 1000))
        return [], wait

    def _take(self, count: int, size: int) -> list[Entry]:
        self._items -= size
        return self._queue.take(count)

    def _requeue(self, entries: list[Entry]) -> None:
        for entry in reversed(entries):
            queue = self._queue.queues[self._queue.level_of(entry.request)]
            queue.items.appendleft(entry)
            self._items += entry.request.batch_size or 1
        self._queue.size += len(entries)

    def _arm(self, wait_ns: int) -> None:
        loop = self._loop or asyncio.get_running_loop()
        when = loop.time() + wait_ns / 1e9
        if self._timer is not None:
            if self._timer_at <= when:
                return
            self._timer.cancel()
        self._timer_at = when
        self._timer = loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._schedule()

    def _reject(self, expired: list[Entry]) -> None:
        for entry in expired:
            request = entry.request
            self._items -= request.batch_size or 1
            error = unavailable("Request timeout expired")
            entry.done(request, InferResponse(request.model_name, "", request.id, error=error), "REJECTED")

    # --- execution ----------------------------------------------------------------------------------------------

    def _dispatch(self, instance: Instance, entries: list[Entry]) -> None:
        if any(e.request.cancelled for e in entries):  # clients gone while their requests waited
            for entry in entries:
                if entry.request.cancelled:
                    drop_cancelled(entry.request, entry.done)
            entries = [e for e in entries if not e.request.cancelled]
            if not entries:
                self._pool.give(instance)
                return
        requests = [e.request for e in entries]
        dones = [e.done for e in entries]
        started = now_ns()
        number = self._next_batch
        self._next_batch += 1
        run(instance, requests,
            lambda i, reqs, result: self._finish(i, reqs, result, dones, started, number))

    def _finish(self, instance: Instance, requests: list[InferRequest], result: Execution, dones: list[Done],
                started: int, number: int) -> None:
        self._pool.give(instance)
        record(self._stats, requests, result, started)
        if self._ordered:
            self._finished[number] = (requests, dones, result.responses, result.failed)
            while self._next_release in self._finished:
                reqs, ds, responses, failed = self._finished.pop(self._next_release)
                self._next_release += 1
                for request, done, response in zip(reqs, ds, responses):
                    done(request, response, failed)
        else:
            self._next_release = number + 1
            for request, done, response in zip(requests, dones, result.responses):
                done(request, response, result.failed)
        if self._queue.size:
            self._schedule()
