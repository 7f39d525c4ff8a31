"""HTTP/1.1 on asyncio with httptools: keep-alive, pipelining in order, body limits, 100-continue, back-pressure.

One protocol object per connection. Handlers answer inline (``Reply``) or later (``Deferred``);
replies leave in request order whatever order the models finish in.

Limits (``limits.HttpLimits``): at most ``max_pipelined`` requests are dispatched at once; requests parsed beyond
that wait parked, with reading paused, until earlier answers are out. Reading also pauses while the transport's
write buffer is above its high-water mark, and streamed replies stop pulling chunks. One timer per connection
enforces the keep-alive, header, body and send timeouts: the hot path only notes when the parser's phase began,
and the timer, which never sleeps longer than the shortest timeout, checks it when it fires (no timer is created,
cancelled or moved per request).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from functools import partial
from http import HTTPStatus
from typing import cast

import httptools
import orjson

from naiad.core.answer import Answer
from naiad.frontends.connections import PORT_FULL, peer_address
from naiad.frontends.http.limits import INF, Listener
from naiad.frontends.http.routes import Router
from naiad.frontends.poll import POLL
from naiad.frontends.replies import Deferred, Reply, Streamed

log = logging.getLogger("naiad.http")

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


def _encode(reply: Reply, keep_alive: bool, head_only: bool = False) -> list[bytes]:
    """The reply's bytes; ``head_only`` (a HEAD request): no body, Content-Length still the body's (RFC 9110 9.3.2)."""
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
    if head_only:
        return [b"".join(head)]
    if isinstance(body, list):
        return [b"".join(head), *body]
    return [b"".join(head), body] if body else [b"".join(head)]


class _Slot:
    """One request's place in the connection's response order. ``data`` waits until the slot reaches the
    head; a streamed reply keeps adding to it until ``finished``."""

    __slots__ = ("data", "keep_alive", "head_only", "finished", "pending", "size")

    def __init__(self, keep_alive: bool, head_only: bool = False) -> None:
        self.data: list[bytes] = []
        self.size = 0  # bytes of ``data`` counted in the connection's ``held``
        self.keep_alive = keep_alive
        self.head_only = head_only  # a HEAD request: its answer carries no body
        self.finished = False
        self.pending: asyncio.Future | Answer | None = None  # the work behind it, cancelled if the client goes away


_DEFAULT_LISTENER = Listener()  # for protocols made without one (the metrics port)

IDLE, HEAD, BODY = 0, 1, 2  # where the parser is: between requests, in a request's head, in its body
LINGER = 2.0  # seconds an error-closed connection keeps reading (and dropping) input, so the answer isn't reset
# Answers one connection may have built and not yet handed to the transport, in write buffers (--http-write-buffer-
# size): past it the client, which pipelines more than it reads, is disconnected.
HELD_ANSWERS = 256


def _error(status: int, message: str) -> Reply:
    return Reply(status, orjson.dumps({"error": message}))


class _Refusal(Exception):
    """Raised in a parser callback to stop parsing; the request is answered ``status`` and the connection closes."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class HttpProtocol(asyncio.Protocol):
    def __init__(self, router: Router, max_body: int, listener: Listener | None = None,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.router = router
        self.max_body = max_body
        self.listener = listener = listener or _DEFAULT_LISTENER
        limits = listener.limits
        self.max_pipelined = limits.max_pipelined
        # Requests dispatched at once: one until the first answer shows how large answers are, then as many
        # (up to max_pipelined) as answers that large fit the write buffer; and none while answers already wait
        # beyond the buffer's mark. So a pipeline of requests for large answers is served one at a time, as
        # nginx serves every pipeline, and never builds answers the client isn't reading.
        self.depth = 1
        self.mark = limits.write_buffer
        self.largest = 0  # the largest answer on this connection so far
        self.held = 0  # bytes of answers built and not yet handed to the transport
        self.held_limit = HELD_ANSWERS * limits.write_buffer
        self.max_url = limits.max_url_size
        self.max_header_size = limits.max_header_size
        self.max_header_count = limits.max_header_count
        self.keepalive_timeout = limits.seconds("keepalive_timeout")
        self.header_timeout = limits.seconds("header_timeout")
        self.body_timeout = limits.seconds("body_timeout")
        self.send_timeout = limits.seconds("send_timeout")
        self.tick = limits.tick
        self.loop = loop  # the running loop unless given (tests give a clock they drive)
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        # Content-Length beside Transfer-Encoding: chunked is framed by the chunks (RFC 9112 §6.3), as Triton's
        # clients need; the connection then closes after the answer, so nothing can be smuggled behind it.
        self.parser.set_dangerous_leniencies(lenient_chunked_length=True)
        self.framed_twice = False
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: bytearray = bytearray()
        self.head_size = 0  # bytes of header names and values in this request
        self.header_count = 0
        self.spill = 0  # bytes of reads that began and ended inside one request's head (see data_received)
        self.spill_for: object = None
        self.slots: deque[_Slot] = deque()  # dispatched requests, in order, until their answers are written
        self.parked: deque[tuple] = deque()  # parsed beyond max_pipelined, not dispatched yet
        self.closing = False  # the transport is closed or closing: nothing more is written
        self.ending = False  # no more requests are read; the connection closes once the answers so far are out
        self.final: Reply | None = None  # what ending adds after those answers (None: nothing)
        self.final_due = False  # ending, and that last slot isn't appended yet
        self.admitted = False
        self.phase = IDLE
        self.now = 0.0  # loop time at the start of the current read
        self.since = 0.0  # when the current phase began (IDLE: when the last answer went out)
        self.timeouts = (self.keepalive_timeout, self.header_timeout, self.body_timeout)  # by phase
        self.clock = time.monotonic  # the loop's time(), once connected
        self.send_deadline = INF  # while writing is paused
        self.timer: asyncio.TimerHandle | None = None
        self.read_paused = False
        self.write_paused = False
        self.drained: asyncio.Future | None = None  # streamed replies wait on it while writing is paused
        self.refilling = False
        self.answering = False  # completing a deferred reply, maybe within a model's completion (see _flush)
        self.linger_until = INF
        self.address: str | None = None  # the client's, as the port's admission counts it
        self.refusing = False  # refused, the 503 going out
        # Until its first request head is in, a connection is closed this long after it opened (not the
        # keep-alive / header timeouts): idle sockets can't hold slots.
        self.first_timeout = limits.seconds("first_request_timeout")
        self.first_deadline = INF  # None once the first request head is in

    # --- asyncio.Protocol ------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)
        loop = self.loop = self.loop or asyncio.get_running_loop()
        self.clock = loop.time
        limits = self.listener.limits
        gate = self.listener.gate
        self.address = address = peer_address(transport)
        refused = gate.admit(address)
        if refused is not None:
            # Answered rather than dropped: clients and load balancers read 503 as "try again / elsewhere",
            # while a bare close looks like a network fault.
            self.ending = True
            if refused == PORT_FULL:
                message = (f"too many open connections: at most {gate.limit} are served at once "
                           + ("(--http-max-connections)" if gate.limit == limits.max_connections
                              else "(--http-max-connections, lowered to fit the open file limit)"))
            else:
                message = (f"too many open connections from {address}: at most {gate.per_address} are served "
                           "at once (--http-max-connections-per-address)")
            transport.writelines(_encode(_error(503, message), False))
            if gate.refusing >= gate.max_refusing:  # a flood: no descriptor is held to linger
                self.closing = True
                transport.close()
                return
            gate.refusing += 1
            self.refusing = True
            self._linger()
            return
        self.admitted = True
        transport.set_write_buffer_limits(high=limits.write_buffer)
        if self.tick < INF:
            self.since = now = loop.time()  # a new connection is idle until a request begins
            self.first_deadline = now + self.first_timeout
            self.timer = loop.call_at(now + self.tick, self._on_timer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = self.ending = True
        if self.admitted:
            self.admitted = False
            self.listener.gate.release(self.address)
        elif self.refusing:
            self.refusing = False
            self.listener.gate.refusing -= 1
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        for slot in self.slots:
            if slot.pending is not None and not slot.pending.done():
                slot.pending.cancel()  # the model sees is_cancelled()
        self.slots.clear()
        self.parked.clear()
        self._wake_streams()

    def pause_writing(self) -> None:
        """The transport's buffer passed the high-water mark: read no more requests until it drains."""
        self.write_paused = True
        self.send_deadline = self.clock() + self.send_timeout
        self._pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self.send_deadline = INF
        self._wake_streams()
        self._flush()

    def data_received(self, data: bytes) -> None:
        POLL.arrived()
        if self.ending:
            return  # refused or lingering: input is dropped
        self.now = self.clock()
        headers = self.headers
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, _Refusal):
                self._end(_error(cause.status, cause.message))
            else:
                self._end(_error(400, f"malformed HTTP request: {exc}"))
            return
        except httptools.HttpParserUpgrade:
            self._end(_error(400, "protocol upgrade is not supported"))
            return
        except httptools.HttpParserError as exc:
            self._end(_error(400, f"malformed HTTP request: {exc}"))
            return
        if self.phase == HEAD and self.headers is headers:
            # The whole read fell inside one request's head (a request beginning in it would have new headers). httptools holds an unfinished header line itself
            # and calls on_header only once it ends, so these bytes are counted here: an endless header line is
            # refused after one read past the limit rather than held.
            if self.spill_for is not headers:
                self.spill_for, self.spill = headers, 0
            self.spill += len(data)
            if self.spill > self.max_header_size:
                self._end(_error(431, self._header_size_message()))

    # --- httptools callbacks -------------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = {}
        self.body = bytearray()
        self.head_size = self.header_count = 0
        self.framed_twice = False
        self.phase = HEAD
        self.since = self.now

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > self.max_url:
            raise _Refusal(414, f"request URL exceeds the maximum allowed length of {self.max_url} bytes "
                                "(--http-max-url-size)")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value
        self.header_count += 1
        self.head_size += len(name) + len(value)

    def on_headers_complete(self) -> None:
        if self.head_size > self.max_header_size:
            raise _Refusal(431, self._header_size_message())
        if self.header_count > self.max_header_count:
            raise _Refusal(431, f"request has more than the maximum allowed {self.max_header_count} header fields "
                                "(--http-max-header-count)")
        self.phase = BODY
        self.since = self.now
        self.first_deadline = INF
        length = self.headers.get(b"content-length")
        if length is not None and b"transfer-encoding" in self.headers:
            self.framed_twice = True  # the chunks frame the body; the body limit still holds in on_body
        elif length is not None and length.isdigit() and int(length) > self.max_body:
            # Refused before a byte of the body is read (nor a 100 Continue sent); the connection then closes,
            # as the unread body leaves it out of step.
            raise _Refusal(413, self._body_size_message(int(length)))
        elif (self.headers.get(b"expect", b"").lower() == b"100-continue" and self.transport is not None
                and not self.slots and not self.parked):  # never ahead of earlier answers
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self.since = self.now  # the body timeout runs between two reads, as nginx's client_body_timeout
        self.body += body
        if len(self.body) > self.max_body:  # a chunked body that grew past the limit: refused at once
            self.body = bytearray()
            raise _Refusal(413, self._body_size_message())

    def on_message_complete(self) -> None:
        self.phase = IDLE
        if self.ending:
            return
        parser = self.parser
        keep_alive = parser.should_keep_alive() and not self.framed_twice
        if self.parked or len(self.slots) >= self.depth or self.write_paused or self.held >= self.mark:
            self.parked.append((parser.get_method(), self.url, self.headers, self.body, keep_alive))
            self._pause_reading()
        else:
            self._dispatch(parser.get_method(), self.url, self.headers, self.body, keep_alive)
        if self.framed_twice:
            self._end(None)  # read nothing more on this connection: close once this answer is out

    # --- requests ------------------------------------------------------------------------------------------------

    def _dispatch(self, method: bytes, url: bytes, headers: dict[bytes, bytes], body: bytearray,
                  keep_alive: bool) -> None:
        slot = _Slot(keep_alive, method == b"HEAD")
        self.slots.append(slot)
        q = url.find(b"?")
        path = (url[:q] if q >= 0 else url).decode("latin-1")
        if log.isEnabledFor(logging.DEBUG):  # --log-verbose 1, as Triton's "HTTP request:" lines
            log.debug("HTTP request: %s %s", method.decode("latin-1"), path)
        try:
            result = self.router.handle(method, path, headers, body)
        except Exception:
            log.exception("unhandled error for %s", path)
            result = Reply(500, orjson.dumps({"error": "internal server error"}))
        if isinstance(result, Deferred):
            slot.pending = result.future
            result.future.add_done_callback(partial(self._deferred_done, slot, result))
        elif isinstance(result, Streamed):
            slot.pending = asyncio.ensure_future(self._stream(slot, result))
        else:
            self._complete(slot, result)

    def _refill(self) -> None:
        """Dispatch parked requests as room frees up; read again once none wait and there is room."""
        if self.refilling:
            return  # re-entered through an inline answer; the outer call goes on
        self.refilling = True
        try:
            slots, parked = self.slots, self.parked
            while (parked and len(slots) < self.depth and not self.write_paused and self.held < self.mark
                   and not self.closing):
                self._dispatch(*parked.popleft())
            if parked or self.closing:
                return
            if self.ending:
                if self.final_due:
                    self._append_final()
                    self._flush()
            elif (self.read_paused and not self.write_paused and len(slots) < self.depth
                  and self.held < self.mark):
                self.read_paused = False
                self.transport.resume_reading()  # type: ignore[union-attr]
        finally:
            self.refilling = False

    def _pause_reading(self) -> None:
        if not self.read_paused and not self.closing:
            self.read_paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]

    def _end(self, final: Reply | None) -> None:
        """Read no more requests: once the answers to those read so far are out, send ``final`` (if any) and
        close. Used for refusals (the parser's state can't be trusted after them) and timeouts."""
        if self.ending:
            return
        self.ending = True
        self.phase = IDLE
        self.final = final
        self.final_due = True
        self._pause_reading()
        if not self.parked:  # else _refill appends it once the parked requests are dispatched
            self._append_final()
            self._flush()

    def _append_final(self) -> None:
        self.final_due = False
        slot = _Slot(False)
        slot.finished = True
        if self.final is not None:
            slot.data = _encode(self.final, False)
            self.final = None
        self.slots.append(slot)

    # --- timeouts ------------------------------------------------------------------------------------------------

    def _on_timer(self) -> None:
        self.timer = None
        if self.closing:
            return
        loop = self.loop
        now = loop.time()  # type: ignore[union-attr]
        if now >= self.send_deadline:
            log.debug("HTTP connection closed: the client read nothing for %.0f s", self.send_timeout)
            self._abort()
            return
        deadline = INF
        if not self.ending and (self.phase != IDLE or not (self.slots or self.parked)):  # waiting on the client
            deadline = self.since + self.timeouts[self.phase]
            if self.first_deadline < deadline:  # the first request head isn't in yet
                deadline = self.first_deadline
            if now >= deadline:
                self._timed_out()
                return
        due = min(deadline, self.send_deadline, now + self.tick)
        self.timer = loop.call_at(due, self._on_timer)  # type: ignore[union-attr]

    def _timed_out(self) -> None:
        if self.phase == BODY:
            self._end(_error(408, f"request body not received in time: nothing arrived for {self.body_timeout:g} s "
                                  "(--http-body-timeout)"))
        elif self.phase == HEAD:  # slowloris: closed without an answer, as nginx does
            log.debug("HTTP connection closed: request head not received in %g s", self.header_timeout)
            self._end(None)
        else:
            self.closing = True
            self.transport.close()  # type: ignore[union-attr]

    def _linger(self) -> None:
        """Close after an error answer: send it and a FIN, then read and drop what the client still sends for up
        to LINGER seconds, so that unread input doesn't turn the close into a reset that loses the answer."""
        self.closing = True
        transport = self.transport
        if self.timer is not None:
            self.timer.cancel()
        if not transport.can_write_eof():  # type: ignore[union-attr]
            transport.close()  # type: ignore[union-attr]
            return
        transport.write_eof()  # type: ignore[union-attr]
        if self.read_paused:
            self.read_paused = False
            transport.resume_reading()  # type: ignore[union-attr]
        self.linger_until = self.clock() + (self.send_timeout if self.send_timeout < INF else 60.0)
        self.timer = self.loop.call_later(LINGER, self._linger_end)  # type: ignore[union-attr]

    def _linger_end(self) -> None:
        # Answers still queued in the transport (not yet in the kernel) would be lost: wait for them, within
        # the send timeout.
        if self.transport.get_write_buffer_size() and self.clock() < self.linger_until:  # type: ignore[union-attr]
            self.timer = self.loop.call_later(LINGER, self._linger_end)  # type: ignore[union-attr]
            return
        self._abort()

    def _abort(self) -> None:
        self.closing = True
        self.transport.abort()  # type: ignore[union-attr]

    # --- responses -----------------------------------------------------------------------------------------------

    async def _stream(self, slot: _Slot, streamed: Streamed) -> None:
        """A chunked reply written as its parts arrive (server-sent events); no part is pulled while the
        client isn't reading."""
        head = [b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n" % (
            streamed.status, _REASONS.get(streamed.status, b"Unknown"), streamed.content_type)]
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
                    if (self.write_paused or self.held > self.mark) and not self.closing:
                        if self.drained is None:
                            self.drained = self.loop.create_future()  # type: ignore[union-attr]
                        await self.drained
        except Exception:
            log.exception("a streamed reply failed")
        self._write(slot, b"0\r\n\r\n", True)

    def _wake_streams(self) -> None:
        drained, self.drained = self.drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def _write(self, slot: _Slot, data: bytes, finished: bool) -> None:
        slot.data.append(data)
        slot.size += len(data)
        self.held += len(data)
        slot.finished = finished
        self._flush()
        if self.held > self.held_limit:
            self._overheld()

    def _deferred_done(self, slot: _Slot, deferred: Deferred, _: object = None) -> None:
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
        if type(deferred.future) is not Answer:
            self._complete(slot, reply)
            return
        self.answering = True
        try:
            self._complete(slot, reply)
        finally:
            self.answering = False

    def _complete(self, slot: _Slot, reply: Reply) -> None:
        slot.data = data = _encode(reply, slot.keep_alive, slot.head_only)
        n = len(data[0]) + len(data[1]) if len(data) == 2 else sum(map(len, data))
        slot.size = n
        self.held += n
        if n > self.largest:  # large answers: fewer requests in flight, so fewer answers can pile up
            self.largest = n
            self.depth = max(1, min(self.max_pipelined, self.mark // n))
        slot.finished = True
        self._flush()
        if self.held > self.held_limit:
            self._overheld()

    def _overheld(self) -> None:
        """The client pipelines far more than it reads: disconnect it (what is still running for it is
        cancelled), rather than hold its answers."""
        if self.closing:
            return
        log.debug("HTTP connection closed: %d bytes of answers waiting for a client that does not read them "
                  "(%d x --http-write-buffer-size)", self.held, HELD_ANSWERS)
        self.held = 0
        self._abort()

    def _flush(self) -> None:
        slots = self.slots
        transport = self.transport
        while slots:
            head = slots[0]
            data = head.data
            if data:
                if self.closing or self.write_paused:
                    break  # resume_writing flushes again
                head.data = []
                self.held -= head.size
                head.size = 0
                if len(data) == 1:
                    transport.write(data[0])  # type: ignore[union-attr]
                else:
                    transport.writelines(data)  # type: ignore[union-attr]
            if not head.finished:
                break
            slots.popleft()
            if not head.keep_alive:
                if self.ending:
                    self._linger()
                else:
                    self.closing = True
                    transport.close()  # type: ignore[union-attr]
                return
        if self.drained is not None and self.held <= self.mark and not self.write_paused:
            self._wake_streams()  # streamed replies behind the head may pull again
        if self.parked or self.read_paused:
            if self.answering:  # within a model's completion (core.answer.Answer): no new request is queued there
                self.loop.call_soon(self._refill)  # type: ignore[union-attr]
            else:
                self._refill()
        if not slots and self.phase == IDLE:  # nothing pending: the keep-alive timeout starts
            self.since = self.clock()
            POLL.answered(self.loop)  # (poll.py)

    def _body_size_message(self, size: int | None = None) -> str:
        """Newer Triton's words for its --http-max-input-size refusal; ``size``: the declared Content-Length."""
        of = f" of {size} bytes" if size is not None else ""
        return (f"request body size{of} exceeds the maximum allowed value of {self.max_body} bytes. Use "
                "--http-max-input-size to increase the limit.")

    def _header_size_message(self) -> str:
        return (f"request header fields exceed the maximum allowed size of {self.max_header_size} bytes "
                "(--http-max-header-size)")
