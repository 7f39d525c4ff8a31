"""HTTP/1.1 on asyncio with httptools: keep-alive, pipelining in order, body limits, 100-continue.

One protocol object per connection. Handlers answer inline (``Reply``) or later (``Deferred``);
replies leave in request order whatever order the models finish in.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from http import HTTPStatus

import httptools
import orjson

from naiad.frontends.http.routes import Deferred, Reply, Router, Streamed

log = logging.getLogger("naiad.http")

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


def _encode(reply: Reply, keep_alive: bool) -> list[bytes]:
    body = reply.body
    if isinstance(body, list):
        length = sum(len(c) for c in body)
    else:
        length = len(body)
    if reply.content_type:
        head = [b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n" % (
            reply.status, _REASONS.get(reply.status, b"Unknown"), reply.content_type, length)]
    else:  # a bare status, as Triton's SageMaker server sends some of them
        head = [b"HTTP/1.1 %d %s\r\nContent-Length: %d\r\n" % (
            reply.status, _REASONS.get(reply.status, b"Unknown"), length)]
    if reply.headers:
        for name, value in reply.headers:
            head.append(b"%s: %s\r\n" % (name, value))
    if not keep_alive:
        head.append(b"Connection: close\r\n")
    head.append(b"\r\n")
    if isinstance(body, list):
        return [b"".join(head), *body]
    return [b"".join(head), body] if body else [b"".join(head)]


class _Slot:
    """One request's place in the connection's response order. ``data`` waits until the slot reaches the
    head; a streamed reply keeps adding to it until ``finished``."""

    __slots__ = ("data", "keep_alive", "finished", "pending")

    def __init__(self, keep_alive: bool) -> None:
        self.data: list[bytes] = []
        self.keep_alive = keep_alive
        self.finished = False
        self.pending: asyncio.Future | None = None  # the work behind it, cancelled if the client goes away


class HttpProtocol(asyncio.Protocol):
    def __init__(self, router: Router, max_body: int) -> None:
        self.router = router
        self.max_body = max_body
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: bytearray = bytearray()
        self.too_large = False
        self.slots: deque[_Slot] = deque()
        self.closing = False

    # --- asyncio.Protocol ------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        for slot in self.slots:
            if slot.pending is not None and not slot.pending.done():
                slot.pending.cancel()  # the model sees is_cancelled()
        self.slots.clear()

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, "protocol upgrade is not supported")
        except httptools.HttpParserError as exc:
            self._fail(400, f"malformed HTTP request: {exc}")

    # --- httptools callbacks -------------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = {}
        self.body = bytearray()
        self.too_large = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        length = self.headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            self.too_large = True
        elif self.headers.get(b"expect", b"").lower() == b"100-continue" and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self.too_large:
            return
        self.body += body
        if len(self.body) > self.max_body:
            self.too_large = True
            self.body = bytearray()

    def on_message_complete(self) -> None:
        if self.closing:
            return
        keep_alive = self.parser.should_keep_alive()
        slot = _Slot(keep_alive)
        self.slots.append(slot)
        if self.too_large:
            # The body was not kept, so the connection can't be trusted to be in sync: answer and close.
            slot.keep_alive = False
            self._complete(slot, Reply(400, orjson.dumps(
                {"error": f"request body size exceeds the maximum allowed of {self.max_body} bytes "
                          "(--http-max-input-size)"})))
            return
        url = self.url
        q = url.find(b"?")
        path = (url[:q] if q >= 0 else url).decode("latin-1")
        method = self.parser.get_method()
        if log.isEnabledFor(logging.DEBUG):  # --log-verbose 1, as Triton's "HTTP request:" lines
            log.debug("HTTP request: %s %s", method.decode("latin-1"), path)
        try:
            result = self.router.handle(method, path, self.headers, self.body)
        except Exception:
            log.exception("unhandled error for %s", path)
            result = Reply(500, orjson.dumps({"error": "internal server error"}))
        if isinstance(result, Deferred):
            slot.pending = result.future
            result.future.add_done_callback(lambda f, s=slot, d=result: self._deferred_done(s, d))
        elif isinstance(result, Streamed):
            slot.pending = asyncio.ensure_future(self._stream(slot, result))
        else:
            self._complete(slot, result)

    # --- responses -----------------------------------------------------------------------------------------------

    async def _stream(self, slot: _Slot, streamed: Streamed) -> None:
        """A chunked reply written as its parts arrive (server-sent events)."""
        head = [b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n" % streamed.content_type]
        for name, value in streamed.headers or ():
            head.append(b"%s: %s\r\n" % (name, value))
        if not slot.keep_alive:
            head.append(b"Connection: close\r\n")
        head.append(b"\r\n")
        self._write(slot, b"".join(head), False)
        try:
            async for chunk in streamed.chunks:
                if chunk:
                    self._write(slot, b"%x\r\n%s\r\n" % (len(chunk), chunk), False)
        except Exception:
            log.exception("a streamed reply failed")
        self._write(slot, b"0\r\n\r\n", True)

    def _write(self, slot: _Slot, data: bytes, finished: bool) -> None:
        slot.data.append(data)
        slot.finished = finished
        self._flush()

    def _deferred_done(self, slot: _Slot, deferred: Deferred) -> None:
        if deferred.future.cancelled():
            return
        try:
            reply = deferred.finish(deferred.future)
        except Exception:
            log.exception("failed to encode a response")
            reply = Reply(500, orjson.dumps({"error": "failed to encode the response"}))
        if isinstance(reply, Streamed):  # known only once the work behind it finished (an on-demand load)
            slot.pending = asyncio.ensure_future(self._stream(slot, reply))
            return
        self._complete(slot, reply)

    def _complete(self, slot: _Slot, reply: Reply) -> None:
        slot.data = _encode(reply, slot.keep_alive)
        slot.finished = True
        self._flush()

    def _flush(self) -> None:
        slots = self.slots
        transport = self.transport
        while slots and slots[0].data:
            head = slots[0]
            if transport is None or self.closing:
                return
            data, head.data = head.data, []
            if len(data) == 1:
                transport.write(data[0])
            else:
                transport.writelines(data)
            if not head.finished:
                return
            slots.popleft()
            if not head.keep_alive:
                self.closing = True
                transport.close()
                return

    def _fail(self, status: int, message: str) -> None:
        if self.transport is not None and not self.closing:
            self.transport.writelines(_encode(Reply(status, orjson.dumps({"error": message})), False))
            self.closing = True
            self.transport.close()
