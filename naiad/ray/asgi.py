"""naiad's HTTP router results (``Reply`` | ``Deferred`` | ``Streamed``) over ASGI, and the plain tuple a reply
crosses between Ray processes as."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from naiad.frontends.replies import Deferred, Reply, Streamed

# (status, content type, extra headers, body): bytes only, so Ray pickles it as a few buffer copies.
Wire = tuple[int, bytes, list[tuple[bytes, bytes]], bytes]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def resolve(result: Reply | Deferred | Streamed) -> Reply | Streamed:
    """What the router answered, once the work behind a ``Deferred`` is done."""
    while isinstance(result, Deferred):
        try:
            await asyncio.wait([asyncio.ensure_future(result.future)])  # (an Answer is wrapped in a task)
        except asyncio.CancelledError:
            result.future.cancel()  # the caller went away: so does its request
            raise
        result = result.finish(result.future)
    return result


async def to_wire(result: Reply | Deferred | Streamed) -> Wire:
    """A reply as one tuple; a streamed reply (generate_stream) is gathered whole, since a handle call answers once."""
    reply = await resolve(result)
    if isinstance(reply, Streamed):
        chunks = [chunk async for chunk in reply.chunks]
        return 200, reply.content_type, list(reply.headers or ()), b"".join(chunks)
    body = reply.body if isinstance(reply.body, bytes) else b"".join(bytes(c) for c in reply.body)
    return reply.status, reply.content_type, list(reply.headers or ()), body


async def read_request(scope: dict[str, Any], receive: Receive) -> tuple[bytes, str, dict[bytes, bytes], bytes]:
    """Method, path (undecoded, as naiad's HTTP server sees it), lower-cased headers, whole body."""
    raw = scope.get("raw_path")
    if raw:
        q = raw.find(b"?")
        path = (raw[:q] if q >= 0 else raw).decode("latin-1")
    else:
        path = scope["path"]
    root = scope.get("root_path", "")
    if root and root != "/" and path.startswith(root):
        path = path[len(root):] or "/"
    headers = {name.lower(): value for name, value in scope["headers"]}
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    return scope["method"].encode("latin-1"), path, headers, body


async def send_wire(send: Send, wire: Wire) -> None:
    status, content_type, extra, body = wire
    headers = [(b"content-length", b"%d" % len(body))]
    if content_type:
        headers.append((b"content-type", content_type))
    headers.extend((name.lower(), value) for name, value in extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_result(send: Send, result: Reply | Deferred | Streamed) -> None:
    """A locally routed request's answer; a streamed one goes out chunk by chunk."""
    reply = await resolve(result)
    if not isinstance(reply, Streamed):
        await send_wire(send, await to_wire(reply))
        return
    headers = [(b"content-type", reply.content_type), *((n.lower(), v) for n, v in reply.headers or ())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    async for chunk in reply.chunks:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
