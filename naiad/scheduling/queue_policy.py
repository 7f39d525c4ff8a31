"""The dynamic batcher's queue: one FIFO per priority level, each with its ``ModelQueuePolicy``
(``max_queue_size``, ``default_timeout_microseconds``, ``allow_timeout_override``, ``timeout_action``).

As in Triton, a timeout is applied lazily: when the batcher next looks at the queue, an expired request is
rejected (REJECT) or moved behind the unexpired requests of its level (DELAY), where it no longer expires.
"""

from __future__ import annotations

from collections import deque
from typing import Iterator

from naiad.config import ModelConfig, pb
from naiad.core.errors import unavailable
from naiad.core.request import InferRequest, log_prefix
from naiad.scheduling.execution import Done

_REJECT = pb.ModelQueuePolicy.REJECT


class Entry:
    __slots__ = ("request", "done", "deadline_ns")

    def __init__(self, request: InferRequest, done: Done, deadline_ns: int) -> None:
        self.request = request
        self.done = done
        self.deadline_ns = deadline_ns  # 0 = never expires


class LevelQueue:
    __slots__ = ("reject", "timeout_ns", "override", "max_size", "items", "delayed")

    def __init__(self, policy: pb.ModelQueuePolicy) -> None:
        self.reject = policy.timeout_action == _REJECT
        self.timeout_ns = policy.default_timeout_microseconds * 1000
        self.override = policy.allow_timeout_override
        self.max_size = policy.max_queue_size
        self.items: deque[Entry] = deque()
        self.delayed: deque[Entry] = deque()

    def __len__(self) -> int:
        return len(self.items) + len(self.delayed)

    def push(self, request: InferRequest, done: Done, now_ns: int) -> None:
        if self.max_size and len(self) >= self.max_size:
            raise unavailable(f"{log_prefix(request)}Exceeds maximum queue size")
        timeout_ns = self.timeout_ns
        if self.override:
            # A request may shorten the default timeout, never lengthen it (nor set one where there is none).
            requested = request.timeout_us * 1000
            if requested and requested < timeout_ns:
                timeout_ns = requested
        self.items.append(Entry(request, done, now_ns + timeout_ns if timeout_ns else 0))


class PriorityQueue:
    """Levels 1..N (lowest number served first); with ``priority_levels`` unset everything sits in level 0."""

    def __init__(self, config: ModelConfig) -> None:
        batching = config.dynamic_batching
        self.levels = batching.priority_levels
        self.default_level = batching.default_priority_level if self.levels else 0
        self._default_policy = batching.default_queue_policy
        self.queues: dict[int, LevelQueue] = {}
        self._order: list[LevelQueue] = []
        if self.levels:
            for level in range(1, self.levels + 1):
                policy = batching.priority_queue_policy.get(level, self._default_policy)
                self.queues[level] = LevelQueue(policy)
        else:
            self.queues[0] = LevelQueue(self._default_policy)
        self._order = [self.queues[k] for k in sorted(self.queues)]
        self.size = 0
        # Whether any request could ever expire: without timeouts the batcher skips the policy checks.
        self.timeouts = any(q.timeout_ns for q in self._order)

    def level_of(self, request: InferRequest) -> int:
        priority = request.priority
        if priority == 0 or priority > self.levels:
            return self.default_level
        return priority

    def push(self, request: InferRequest, done: Done, now_ns: int) -> None:
        self.queues[self.level_of(request)].push(request, done, now_ns)
        self.size += 1

    def scan(self, now_ns: int, expired: list[Entry]) -> Iterator[Entry]:
        """Entries in service order, applying timeouts on the way (rejected ones go to ``expired``). Entries
        yielded first are at the heads of their deques, so a prefix of this order can be popped with ``take``."""
        for queue in self._order:
            items = queue.items
            i = 0
            while i < len(items):
                entry = items[i]
                if entry.deadline_ns and now_ns > entry.deadline_ns:
                    del items[i]
                    if queue.reject:
                        self.size -= 1
                        expired.append(entry)
                    else:
                        entry.deadline_ns = 0
                        queue.delayed.append(entry)
                    continue
                yield entry
                i += 1
            yield from queue.delayed

    def take(self, count: int) -> list[Entry]:
        """Pop the first ``count`` entries of service order (after ``scan`` removed the expired ones)."""
        taken: list[Entry] = []
        for queue in self._order:
            for items in (queue.items, queue.delayed):
                while items and len(taken) < count:
                    taken.append(items.popleft())
            if len(taken) == count:
                break
        self.size -= len(taken)
        return taken

    def closest_deadline(self) -> int:
        deadlines = [e.deadline_ns for q in self._order for e in q.items if e.deadline_ns]
        return min(deadlines) if deadlines else 0

    def oldest_arrival(self) -> int:
        heads = [q.items[0].request.arrival_ns for q in self._order if q.items]
        heads += [q.delayed[0].request.arrival_ns for q in self._order if q.delayed]
        return min(heads) if heads else 0
