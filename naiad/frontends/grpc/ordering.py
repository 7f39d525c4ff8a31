"""The response order of one ModelStreamInfer stream, shared by ``naiad serve``'s gRPC front end and Ray's gRPC
ingress: each non-decoupled request holds a slot, and its items leave only once every earlier slot is complete,
as Triton sends them; a decoupled request's items (slot ``None``) leave as they come. ``None`` in ``outbox`` ends
the stream, once reading has stopped and every request's task and slot are done."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Coroutine
from typing import Any


class Slot:
    """A request's place in the stream's response order."""

    __slots__ = ("complete", "items")

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.complete = False


class OrderedStream:
    def __init__(self) -> None:
        self.outbox: asyncio.Queue[Any] = asyncio.Queue()
        self.ordered: deque[Slot] = deque()
        self.tasks: set[asyncio.Task] = set()
        self.reading = True

    def slot(self) -> Slot:
        slot = Slot()
        self.ordered.append(slot)
        return slot

    def start(self, run: Coroutine[Any, Any, None]) -> None:
        """Run one request's coroutine as a task the stream waits for (and cancels when the client goes)."""
        task = asyncio.ensure_future(run)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    def emit(self, item: Any, slot: Slot | None) -> None:
        if slot is None:
            self.outbox.put_nowait(item)
        else:
            slot.items.append(item)

    def complete(self, slot: Slot) -> None:
        slot.complete = True
        ordered = self.ordered
        while ordered and ordered[0].complete:
            for item in ordered.popleft().items:
                self.outbox.put_nowait(item)
        self._maybe_end()

    def done_reading(self) -> None:
        self.reading = False
        self._maybe_end()

    def _task_done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        self._maybe_end()

    def _maybe_end(self) -> None:
        if not self.reading and not self.tasks and not self.ordered:
            self.outbox.put_nowait(None)
