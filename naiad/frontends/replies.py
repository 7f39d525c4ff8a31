"""What an HTTP-style front end hands its connection to send: a ``Reply`` (status, body, headers), a ``Deferred``
(a reply that waits on the model's future) or ``Streamed`` (a body sent in parts). The HTTP, SageMaker, metrics,
dashboard and Ray routers all answer with these; they depend on nothing but the core's errors.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Awaitable, Callable

import orjson

from naiad.core.answer import Answer
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


class Streamed:
    """A reply sent in parts as ``chunks`` yields them (chunked transfer encoding)."""

    __slots__ = ("chunks", "content_type", "headers", "status")

    def __init__(self, chunks: AsyncIterator[bytes], content_type: bytes = b"text/event-stream",
                 headers: list[tuple[bytes, bytes]] | None = None, status: int = 200) -> None:
        self.chunks = chunks
        self.content_type = content_type
        self.headers = headers
        self.status = status


def later(answer: Awaitable[Any]) -> Deferred:
    """A reply that waits for the service (a coroutine of the face: across processes, the model host's answer), with
    the loop serving everything else meanwhile. ``answer`` gives a ``Reply``, ``Streamed`` or ``Deferred``; an
    ``InferError`` it raises is the reply."""
    return Deferred(asyncio.ensure_future(_answered(answer)), _result)


def _result(future: asyncio.Future) -> Any:
    return future.result()


async def _answered(answer: Awaitable[Any]) -> Any:
    try:
        reply = await answer
    except InferError as exc:
        return error_reply(exc)
    return await settle(reply) if isinstance(reply, Deferred) else reply


async def settle(deferred: Deferred) -> Any:
    """A ``Deferred``'s reply once its future is done; the caller going away cancels the request too."""
    future = deferred.future
    if not future.done():
        try:
            await asyncio.wait([asyncio.ensure_future(future)])  # (an Answer is wrapped in a task)
        except asyncio.CancelledError:
            future.cancel()  # the client went away: so does its request
            raise
    return deferred.finish(future)


async def json_later(answer: Awaitable[Any]) -> Reply:
    """``answer``'s value as a JSON reply."""
    return json_reply(await answer)


def json_reply(value: Any, status: int = 200) -> Reply:
    return Reply(status, orjson.dumps(value))


def error_reply(error: InferError) -> Reply:
    return Reply(error.http_status, orjson.dumps({"error": error.message}))


def not_found() -> Reply:
    return Reply(404, orjson.dumps({"error": "Not Found"}))


def method_not_allowed() -> Reply:
    return Reply(405, orjson.dumps({"error": "Method Not Allowed"}))
