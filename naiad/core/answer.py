"""A unary request's future, resolved synchronously.

The face, the model and the schedulers use a future's ``done``, ``cancelled``, ``set_result``, ``cancel`` and
``add_done_callback``; an asyncio future would schedule its callbacks for a later turn of the loop. Where nothing
else is in flight that turn is a wake of the loop of its own, and the future's creation, callbacks and handles cost
more than the rest of the reply. An ``Answer`` runs its callbacks within ``set_result`` instead: the HTTP front end's
connection writes the reply there (frontends/http/routes.py), the model host queues it for its front end
(service/hosting.py). Awaiting one (Ray's ASGI bridge, a SageMaker invocation waiting on a load) waits on a loop
future.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Generator

log = logging.getLogger("naiad")


class Answer:
    __slots__ = ("callbacks", "response", "state")

    def __init__(self) -> None:
        self.state = 0  # 1: answered, 2: cancelled
        self.response: Any = None
        self.callbacks: list[Callable[[Answer], object]] = []

    def done(self) -> bool:
        return self.state != 0

    def cancelled(self) -> bool:
        return self.state == 2

    def result(self) -> Any:
        if self.state == 1:
            return self.response
        if self.state == 2:
            raise asyncio.CancelledError()
        raise asyncio.InvalidStateError("Result is not set.")

    def exception(self) -> BaseException | None:
        self.result()
        return None

    def add_done_callback(self, callback: Callable[[Answer], object]) -> None:
        if self.state:
            _call(callback, self)
        else:
            self.callbacks.append(callback)

    def remove_done_callback(self, callback: Callable[[Answer], object]) -> int:
        before = len(self.callbacks)
        self.callbacks = [c for c in self.callbacks if c != callback]
        return before - len(self.callbacks)

    def set_result(self, response: Any) -> None:
        if self.state:
            raise asyncio.InvalidStateError("invalid state")
        self.state = 1
        self.response = response
        if self.callbacks:  # (none for a request an inline run answered within submit)
            self._run_callbacks()

    def cancel(self) -> bool:
        if self.state:
            return False
        self.state = 2
        self._run_callbacks()
        return True

    def _run_callbacks(self) -> None:
        callbacks = self.callbacks
        if callbacks:
            self.callbacks = []
            for callback in callbacks:
                _call(callback, self)

    def __await__(self) -> Generator[Any, None, Any]:
        if not self.state:
            waiter = asyncio.get_running_loop().create_future()

            def wake(_: Answer) -> None:
                if not waiter.done():
                    waiter.set_result(None)
            self.callbacks.append(wake)
            try:
                yield from waiter
            except asyncio.CancelledError:
                self.cancel()
                raise
        return self.result()


def for_reply(in_flight: int) -> Any:
    """The future a front end hands the face (``infer(request, view, future)``) for a unary reply it writes from
    the future's callback: alone (nothing else in flight), an ``Answer``, so the reply leaves within the model's
    completion; under load None, for the face's own loop future, so replies wait for the loop's turn behind the next
    executions' sends."""
    return None if in_flight else Answer()


def _call(callback: Callable[[Answer], object], answer: Answer) -> None:
    # A callback's error is logged, as the event loop logs an asyncio future's: it must not reach the model's
    # completion, within which it runs.
    try:
        callback(answer)
    except Exception:
        log.exception("an answer's callback failed")
