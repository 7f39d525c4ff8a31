"""What an HTTP-style front end hands its connection to send: a ``Reply`` (status, body, headers), a ``Deferred``
(a reply that waits on the model's future) or ``Streamed`` (a body sent in parts). The HTTP, SageMaker, metrics,
dashboard and Ray routers all answer with these; they depend on nothing but the core's errors.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Callable, Generator

import orjson

from naiad.core.errors import InferError

JSON = b"application/json"
OCTET = b"application/octet-stream"
SSE = b"text/event-stream; charset=utf-8"  # Triton's generate_stream content type


class Reply:
    __slots__ = ("status", "body", "content_type", "headers")

    def __init__(self, status: int, body: bytes | list = b"", content_type: bytes = JSON,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.status = status
        self.body = body  # bytes, or a list of chunks written back to back
        self.content_type = content_type
        self.headers = headers


class Deferred:
    __slots__ = ("future", "finish")

    def __init__(self, future: asyncio.Future | Answer, finish: Callable[[Any], Reply]) -> None:
        self.future = future
        self.finish = finish


class Answer:
    """A unary request's future, resolved synchronously: its callbacks (the connection's, which encodes and sends
    the reply) run within ``set_result``, where an asyncio future would schedule them for a later turn of the loop.
    At one connection that turn is a wake of the loop of its own, and the future's creation, callbacks and
    handles cost more than the rest of the reply. It has what the service face, the model and the scheduler use of
    a future; awaiting it (Ray's ASGI bridge, a SageMaker invocation waiting on a load) waits on a loop future."""

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


def _call(callback: Callable[[Answer], object], answer: Answer) -> None:
    # A callback's error is logged, as the event loop logs an asyncio future's: it must not reach the model's
    # completion, within which it runs.
    try:
        callback(answer)
    except Exception:
        logging.getLogger("naiad.frontends").exception("a reply's completion failed")


class Streamed:
    """A reply sent in parts as ``chunks`` yields them (chunked transfer encoding)."""

    __slots__ = ("chunks", "content_type", "headers", "status")

    def __init__(self, chunks: AsyncIterator[bytes], content_type: bytes = b"text/event-stream",
                 headers: list[tuple[bytes, bytes]] | None = None, status: int = 200) -> None:
        self.chunks = chunks
        self.content_type = content_type
        self.headers = headers
        self.status = status


def json_reply(value: Any, status: int = 200) -> Reply:
    return Reply(status, orjson.dumps(value))


def error_reply(error: InferError) -> Reply:
    return Reply(error.http_status, orjson.dumps({"error": error.message}))


def not_found() -> Reply:
    return Reply(404, orjson.dumps({"error": "Not Found"}))


def method_not_allowed() -> Reply:
    return Reply(405, orjson.dumps({"error": "Method Not Allowed"}))
