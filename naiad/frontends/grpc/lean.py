"""A lean gRPC server: naiad's sans-IO HTTP/2 core (``naiad.frontends.http2``) on an asyncio ``Protocol``, serving
the same handler table as grpc.aio.

Why: grpc.aio's per-call machinery (completion-queue poller thread, a call object and several tasks per RPC)
costs more than all of naiad's own work on a small ModelInfer. Here a unary ModelInfer is decoded, queued and
answered from the model future's done-callback: no task, no thread hop. Other unary RPCs and
ModelStreamInfer run their (async) grpc handlers in a task, as grpc.aio would.

This module is gRPC over the core's events: length-prefixed messages, ``grpc-status`` trailers, compression,
metadata. HTTP/2 itself (framing, flow control, HPACK, limits and their errors) is the core's. Response header
blocks use only the static table and literals without indexing, so they need no encoder state and the common
ones are prebuilt bytes. A call whose stream the client resets, or whose connection closes, is cancelled: a
queued ModelInfer's future (the model sees ``is_cancelled()``), a handler's task. Request messages may be
gzip/deflate compressed, expanding to at most --grpc-max-decompressed-size; ModelInfer / ModelStreamInfer answers
are when --grpc-infer-response-compression-level asks, with grpc's choice of algorithm. TLS is asyncio's
(``ssl``), offering ALPN "h2" as grpc clients require. Not handled: deadlines (grpc-timeout).

What a connection may hold and for how long: request bytes within --grpc-max-connection-buffer (``budget.py``:
stream windows open only for what the server has room for); connections per port and per client address
(``naiad/frontends/connections.py``: past a cap, calls are answered UNAVAILABLE and the connection closed); and
one timer per connection closes it when the HTTP/2 preface hasn't come within --grpc-preface-timeout, or when it
has had no call for --grpc-idle-timeout (GOAWAY; clients reconnect on their next call).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import zlib
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np

from naiad.core.answer import Answer
from naiad.core.errors import InferError
from naiad.core.inflate import DEFLATE, GZIP, TooLarge, inflate
from naiad.core.model_view import ModelView
from naiad.frontends.connections import PORT_FULL, Gate, peer_address
from naiad.frontends.grpc.budget import PREFIX, Budget, message_need, stream_window
from naiad.frontends.grpc.inference import UNPARSABLE_MESSAGE, Inference
from naiad.frontends.grpc.options import MAX_DECOMPRESSED_SIZE, GrpcOptions, compression_for
from naiad.frontends.grpc.raw_contents import SPLIT, response_tail, split_request
from naiad.frontends.grpc.status import GRPC_STATUS
from naiad.frontends.http2.connection import H2Connection
from naiad.frontends.http2.events import (
    ConnectionTerminated,
    DataReceived,
    GoAwayReceived,
    RequestReceived,
    StreamReset,
    TrailersReceived,
)
from naiad.frontends.http2.frames import NO_ERROR, literal, literal_indexed_name
from naiad.frontends.http2.limits import Limits
from naiad.frontends.poll import POLL
from naiad.frontends.ports import Port

log = logging.getLogger("naiad.grpc")

_INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"
_COMPRESSED_PATHS = (_INFER_PATH, "/inference.GRPCInferenceService/ModelStreamInfer")  # as in Triton
# grpc's deflate is the zlib format; both at zlib's default level, as grpc compresses.
_COMPRESSORS = {"gzip": lambda data: zlib.compress(data, wbits=31), "deflate": zlib.compress}
INF = float("inf")
REFUSAL = 2.0  # seconds a refused connection stays open for its calls' UNAVAILABLE answers
# What a read takes when it doesn't go to a call's message: a payload that can't be placed (a streaming call's) up
# to SCRATCH at a time, as uvloop reads; new frames up to FRAMES, enough for many small requests and little of a big
# one's first frame (copied twice: as bytes, then to the message's memory).
SCRATCH = 256 * 1024
FRAMES = 16 * 1024
PLACED = 64 * 1024  # a unary call's message from this size on is read to memory of its own (Call.into)


def _percent_encode(message: str) -> bytes:
    # grpc-message is percent-encoded UTF-8 (gRPC over HTTP/2 spec): printable ASCII except '%' stays.
    return b"".join(bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b
                    for b in message.encode("utf-8"))


# :status 200 (static index 8); content-type (static name index 31) as a literal without indexing.
RESPONSE_HEADERS = b"\x88" + literal_indexed_name(31, b"application/grpc")
OK_TRAILERS = literal(b"grpc-status", b"0")
ENCODED_RESPONSE_HEADERS = {name: RESPONSE_HEADERS + literal(b"grpc-encoding", name.encode()) for name in _COMPRESSORS}


def status_trailers(code: grpc.StatusCode, message: str) -> bytes:
    block = literal(b"grpc-status", str(code.value[0]).encode())
    return block + literal(b"grpc-message", _percent_encode(message)) if message else block


def limits_for(options: GrpcOptions) -> Limits:
    """The HTTP/2 limits, with grpc-core's ping abuse policy set by Triton's flags."""
    return Limits(max_concurrent_streams=options.max_concurrent_streams,
                  stream_window=stream_window(options.max_connection_buffer, options.max_concurrent_streams),
                  min_ping_interval=options.http2_min_recv_ping_interval_without_data_ms / 1000,
                  max_ping_strikes=options.http2_max_ping_strikes,
                  ping_without_calls=options.keepalive_permit_without_calls)


class Context:
    """The part of grpc.aio's ServicerContext naiad's handlers use: the call's status."""

    __slots__ = ("code", "details", "metadata")

    def __init__(self, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self.code = grpc.StatusCode.OK
        self.details = ""
        self.metadata = metadata

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata


class Call:
    """One RPC: the gRPC side of one HTTP/2 stream."""

    __slots__ = ("sid", "headers", "body", "parts", "later", "into", "handler", "inbox", "task", "future",
                 "started", "closed", "encoding", "compress", "reserved", "need", "sizes", "queued")

    def __init__(self, sid: int, headers: dict[str, str]) -> None:
        self.sid = sid
        self.headers = headers
        self.body: bytes | bytearray | memoryview | None = None  # request bytes not yet made into messages
        self.parts: list[bytes | bytearray | memoryview] | None = None  # a unary call's bytes after ``body``
        self.later = 0  # their length (with ``into``: the bytes of it filled)
        # A unary call's big message, whole size known: where the rest of it is read to, straight from the socket
        # (Connection.get_buffer), its first ``later`` bytes filled.
        self.into: memoryview | None = None
        self.handler: Any = None
        self.inbox: asyncio.Queue | None = None  # request messages of a streaming call
        self.task: asyncio.Future | None = None  # a handler running for the call
        self.future: asyncio.Future | Answer | None = None  # a queued ModelInfer
        self.started = False  # response HEADERS sent
        self.closed = False  # trailers sent
        self.encoding = "identity"
        self.compress: str | None = None  # the algorithm for this call's answers
        # The connection's budget (budget.py): room reserved / waited for, messages queued for a stream handler.
        self.reserved = 0
        self.need = 0
        self.sizes: deque[tuple[int, int]] | None = None
        self.queued = 0


class Connection(asyncio.BufferedProtocol):
    """One client connection. It reads into buffers it hands the transport (``get_buffer``): a unary call's big
    message goes straight from the socket to memory of its own, where its tensors are read from (no copy from the
    transport's buffer, and none to join the pieces); everything else through ``scratch``, copied to bytes once."""

    def __init__(self, server: LeanServer) -> None:
        self.server = server
        self.paths = server.paths
        self.inference = server.inference
        self.infer_path = server.infer_path
        self.compress_level = server.compress_level
        self.max_decompressed = server.max_decompressed
        self.h2 = H2Connection(server.limits)
        self.calls: dict[int, Call] = {}
        self.receiving = False  # inside data_received: writes wait for its end, to go out as one
        self.scratch = memoryview(bytearray(SCRATCH))
        self.frames = self.scratch[:FRAMES]
        self.placing: memoryview | None = None  # the part of a call's ``into`` handed to the transport to read to
        self.placed = False  # the bytes data_received has are already in their call's ``into``
        self.filling: set[Call] = set()  # calls whose ``into`` has more to come (some may have ended: get_buffer)
        self.transport: asyncio.Transport | None = None
        self.budget = Budget(self.h2, server.buffer_limit, self.h2.limits.stream_window or 0)
        self.address: str | None = None
        self.admitted = False
        self.refused: str | None = None  # why the port refused it: its calls are answered UNAVAILABLE
        self.timer: asyncio.TimerHandle | None = None  # the preface, then the idle timeout
        self.active = True  # a call began since the timer last looked
        self.quiet = 0  # idle-timer ticks in a row with no call
        self.loop: asyncio.AbstractEventLoop | None = None

    # -- connection ---------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        server = self.server
        gate = server.gate
        self.address = address = peer_address(transport)
        self.refused = refused = gate.admit(address)
        self.loop = loop = asyncio.get_running_loop()
        self.opened = loop.time()
        delay = min(server.preface_timeout or INF, server.idle_timeout / 2 or INF)
        if refused is not None:
            if gate.refusing >= gate.max_refusing:  # a flood: no descriptor is held to answer it
                transport.close()
                return
            gate.refusing += 1  # answered UNAVAILABLE (on_request) and closed, within REFUSAL seconds
            delay = REFUSAL
        else:
            self.admitted = True
        server.connections.add(self)
        if delay < INF:
            self.timer = loop.call_later(delay, self.on_timer)
        self.h2.initiate()
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        server = self.server
        if self.admitted:
            self.admitted = False
            server.gate.release(self.address)
        elif self.refused is not None and self in server.connections:
            server.gate.refusing -= 1
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        server.connections.discard(self)
        self.transport = None
        calls, self.calls = self.calls, {}
        for call in calls.values():
            self.abandon(call)

    def pause_writing(self) -> None:
        # A peer that does not read what we write gets nothing more read either: answers and control-frame
        # acks can't pile up without bound.
        self.h2.pause_writing()
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.h2.resume_writing()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def flush(self) -> None:
        data = self.h2.buffers_to_send()
        if data and self.transport is not None:
            if len(data) == 1:
                self.transport.write(data[0])
            else:
                self.transport.writelines(data)  # big DATA payloads go out as they are, not joined into a copy
            if not self.calls:
                POLL.answered(self.loop)  # (poll.py)

    def wrote(self) -> None:
        """After an answer was queued: write it now, unless data_received will at its end."""
        if not self.receiving:
            self.flush()

    def on_timer(self) -> None:
        """Close a connection that never sent the preface, or a refused one, or one without calls for the idle
        timeout (two ticks in a row of half of it)."""
        self.timer = None
        transport, server = self.transport, self.server
        if transport is None or transport.is_closing():
            return
        loop = asyncio.get_running_loop()
        now = loop.time() + 0.001  # timers may fire a hair early on the loop's clock
        started = self.h2.started
        preface_due = self.opened + server.preface_timeout if server.preface_timeout and not started else INF
        if now >= preface_due:
            log.debug("gRPC connection closed: no HTTP/2 preface within %g s (--grpc-preface-timeout)",
                      server.preface_timeout)
            transport.close()
            return
        if self.refused is not None:
            self.goaway(NO_ERROR, close=True)
            return
        if server.idle_timeout:
            if self.calls or self.active:
                self.active, self.quiet = False, 0
            else:
                self.quiet += 1
                if self.quiet >= 2:
                    log.debug("gRPC connection closed: no call for %g s (--grpc-idle-timeout)",
                              server.idle_timeout)
                    self.goaway(NO_ERROR, close=True)
                    return
        delay = min(server.idle_timeout / 2 or INF, preface_due - now)
        if delay < INF:
            self.timer = loop.call_later(max(delay, 0.001), self.on_timer)

    def goaway(self, error: int, close: bool) -> None:
        self.h2.close(error)
        self.flush()
        if close and self.transport is not None:
            self.transport.close()

    def get_buffer(self, sizehint: int) -> memoryview:
        h2 = self.h2
        self.placing = None
        sid, due = h2.payload_due()
        if due:
            call = self.calls.get(sid)
            if call is not None and call.into is not None and call.later < len(call.into):
                # (a slice past the message's end stops at it: what is due beyond is read the ordinary way)
                placing = self.placing = call.into[call.later:call.later + due]
                return placing
            return self.scratch
        if self.filling and self._still_filling():
            # A placed message has more to come, likely in the next frame: read its header alone, so that the
            # payload after it goes in place too, not through the scratch (two copies).
            header = h2.header_due()
            if header:
                return self.scratch[:header]
        return self.frames

    def _still_filling(self) -> bool:
        filling = self.filling
        for call in list(filling):
            if call.into is None or call.closed:
                filling.discard(call)
        return bool(filling)

    def buffer_updated(self, nbytes: int) -> None:
        placing = self.placing
        if placing is None:
            self.data_received(self.scratch[:nbytes].tobytes())
            return
        self.placing = None
        self.placed = True
        try:
            self.data_received(placing[:nbytes])  # type: ignore[arg-type]
        finally:
            self.placed = False

    def data_received(self, data: bytes) -> None:
        POLL.arrived()
        self.receiving = True
        try:
            for event in self.h2.receive(data):
                kind = event.__class__
                # One call's failure must cost that call, not the connection (an exception leaving
                # data_received makes asyncio drop the transport, and every call on it); the try costs nothing
                # until something raises.
                try:
                    if kind is RequestReceived:
                        self.on_request(event)  # type: ignore[arg-type]
                    elif kind is DataReceived:
                        self.on_data(event)  # type: ignore[arg-type]
                    elif kind is StreamReset:
                        call = self.calls.pop(event.stream_id, None)  # type: ignore[union-attr]
                        if call is not None:
                            self.abandon(call)
                            self.budget.release(call)
                    elif kind is TrailersReceived:
                        call = self.calls.get(event.stream_id)  # type: ignore[union-attr]
                        if call is not None:
                            self.end_of_request(call)
                    elif kind is GoAwayReceived:
                        if not self.calls and self.transport is not None:
                            # The client is leaving with nothing in flight; otherwise it closes once its calls are
                            # answered.
                            self.transport.close()
                    elif kind is ConnectionTerminated:
                        self.flush()
                        if self.transport is not None:
                            self.transport.close()  # connection_lost abandons the calls
                        return
                except Exception as exc:  # noqa: BLE001 - a bug's cost is bounded to its call
                    self.failed(getattr(event, "stream_id", 0), exc)
        finally:
            self.receiving = False
        self.flush()

    def failed(self, sid: int, exc: Exception) -> None:
        """An unexpected error while handling stream ``sid``: that call ends INTERNAL, the connection serves on."""
        log.error("gRPC call failed on stream %d", sid, exc_info=exc)
        if not sid:
            return  # not a call's event: logged, and the connection goes on
        call = self.calls.get(sid)
        if call is None:  # it failed before it was registered: answered all the same
            call = Call(sid, {})
        elif call.closed:
            return
        try:
            self.trailers_only(call, grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
        except Exception:  # noqa: BLE001 - the stream may already be gone: nothing to answer
            self.calls.pop(sid, None)

    @staticmethod
    def abandon(call: Call) -> None:
        """The client no longer wants the call: cancel what runs for it (the model sees ``is_cancelled()``)."""
        call.closed = True
        if call.future is not None and not call.future.done():
            call.future.cancel()
        if call.task is not None and not call.task.done():
            call.task.cancel()

    # -- requests -----------------------------------------------------------------------------------------

    def on_request(self, event: RequestReceived) -> None:
        call = Call(event.stream_id, dict(event.headers))
        headers = call.headers
        path = headers.get(":path", "")
        if log.isEnabledFor(logging.DEBUG):  # --log-verbose 1: one line per call, like the HTTP front end's
            log.debug("GRPC request: %s", path)
        self.active = True
        if self.refused is not None:
            self.refuse(call)
            return
        if event.oversize:  # grpc-core's answer and wording
            self.trailers_only(call, grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"received metadata size exceeds hard limit ({event.oversize} vs. "
                               f"{self.h2.limits.max_header_list_size})")
            return
        handler = self.paths.get(path)
        if handler is None:
            self.trailers_only(call, grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
            return
        call.handler = handler
        call.encoding = headers.get("grpc-encoding", "identity")
        if self.compress_level is not None and path in _COMPRESSED_PATHS:
            call.compress = compression_for(self.compress_level, headers.get("grpc-accept-encoding", ""))
        self.calls[call.sid] = call
        self.budget.windows.opened()  # (the windows follow how many streams are open)
        if handler.request_streaming:
            refusal = getattr(handler.stream_stream, "refusal", None)  # a restricted protocol: refused at once
            if refusal is not None and (message := refusal(tuple(headers.items()))) is not None:
                self.trailers_only(call, grpc.StatusCode.UNAVAILABLE, message)
                return
            call.inbox = asyncio.Queue()  # its handler starts with the first message (``feed``)
            call.sizes = deque()
        if event.end_stream:
            self.end_of_request(call)

    def on_data(self, event: DataReceived) -> None:
        call = self.calls.get(event.stream_id)
        if call is None:
            return  # answered already (e.g. an unknown method): the rest of its request does not matter
        body = call.body
        data = event.data
        into = call.into
        if into is not None:
            self.fill(call, into, data)
        elif body is None:
            call.body = data
        elif call.parts is not None:
            call.parts.append(data)
            call.later += len(data)
        elif call.inbox is None and type(data) is memoryview:
            # A unary call's big message, arriving in views of the transport's (immutable) bytes: kept as they
            # are and joined once when whole (one copy, instead of a growing bytearray's copies).
            call.parts = [data]
            call.later = len(data)
        else:
            if type(body) is not bytearray:
                body = call.body = bytearray(body)
            body += data
        if call.inbox is not None:
            self.feed(call, event.end_stream)
        elif event.end_stream:
            self.unary(call)
        elif call.into is None:
            self.make_room(call)
            if not call.closed:
                self.place(call)

    def place(self, call: Call) -> None:
        """A unary call's message big enough to be worth it, with its size known and the room for it granted
        (reserved from the budget, or within the stream's window): memory of its own for it, where what has come
        is copied and the rest is read to (``get_buffer``). Uninitialized (NumPy's empty: no pages written before
        the socket's bytes), and what it holds of the message's end is never read: ``unary`` checks the size."""
        body = call.body
        if body is None or len(body) < PREFIX:
            return
        need = message_need(body)
        have = len(body) + call.later
        if need < PLACED or have >= need or not (call.reserved or need <= self.h2.stream_window):
            return
        into = memoryview(np.empty(need, np.uint8))  # type: ignore[arg-type]
        into[:len(body)] = body
        at = len(body)
        for part in call.parts or ():
            into[at:at + len(part)] = part
            at += len(part)
        call.into, call.later, call.body, call.parts = into, at, None, None
        self.filling.add(call)

    def fill(self, call: Call, into: memoryview, data: bytes | bytearray | memoryview) -> None:
        """More of a placed message (``into``, the call's): already in place when read there (``placed``), else
        copied there. Bytes past the message's size (a second message in a unary call) make it ordinary again, for
        ``unary`` to refuse."""
        at = call.later
        end = at + len(data)
        if end > len(into):
            call.into, call.body, call.parts, call.later = None, into[:at], [data], len(data)
        else:
            if not self.placed:
                into[at:end] = data
            call.later = end
            if end == len(into):
                self.filling.discard(call)

    def make_room(self, call: Call) -> None:
        """A message still arriving: reserve the connection's room for it (budget.py), or refuse it as grpc
        refuses a message above its max_receive_message_length."""
        size = self.budget.reserve(call)
        if size:
            self.trailers_only(call, grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"Received message larger than max ({size} vs. {self.budget.limit})")

    def end_of_request(self, call: Call) -> None:
        if call.inbox is not None:
            self.feed(call, True)
        else:
            self.unary(call)

    def message(self, call: Call, data: memoryview) -> Any:
        """One length-prefixed message's bytes, decompressed; None (and the call ended) if it can't be read."""
        if data[0]:
            # Bounded: a small compressed message can't make the server hold more than the limit.
            try:
                if call.encoding == "gzip":
                    return inflate(data[5:], GZIP, self.max_decompressed)
                if call.encoding == "deflate":
                    return inflate(data[5:], DEFLATE, self.max_decompressed)
            except TooLarge:
                self.trailers_only(call, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                   f"Decompressed message larger than max ({self.max_decompressed} bytes, "
                                   "--grpc-max-decompressed-size)")
                return None
            except zlib.error as exc:
                self.trailers_only(call, grpc.StatusCode.INTERNAL, f"Failed to decompress the message: {exc}")
                return None
            self.trailers_only(call, grpc.StatusCode.UNIMPLEMENTED,
                               f"Compression algorithm '{call.encoding}' is not supported")
            return None
        return data[5:]

    def unary(self, call: Call) -> None:
        body = call.body or b""
        call.body = None
        if call.into is not None:
            body, call.into, call.later = call.into[:call.later], None, 0
        elif call.parts is not None:
            body = b"".join((body, *call.parts))
            call.parts, call.later = None, 0
        with memoryview(body) as view:
            if len(body) < PREFIX or len(body) != message_need(view):
                self.trailers_only(call, grpc.StatusCode.UNIMPLEMENTED if len(body) > PREFIX else
                                   grpc.StatusCode.INTERNAL, "Expected exactly one request message")
                return
            data = self.message(call, view)
            if data is None:
                return
            handler = call.handler
            infer = call.headers.get(":path") == self.infer_path
            raw = None
            try:
                if infer and len(data) >= SPLIT:
                    rest, raw = split_request(memoryview(data))
                    request = handler.request_deserializer(rest)
                else:
                    request = handler.request_deserializer(data)
            except Exception:  # noqa: BLE001 - any parse failure is this call's INTERNAL, as Triton answers it
                self.trailers_only(call, grpc.StatusCode.INTERNAL, UNPARSABLE_MESSAGE)
                return
            data = None
        if infer:
            self.model_infer(call, request, raw=raw)
            return
        call.task = asyncio.ensure_future(self.run_unary(call, request))

    def model_infer(self, call: Call, request: Any, model: ModelView | None = None,
                    raw: list[memoryview] | None = None) -> None:
        """The hot path: queue the request and answer from the future's callback, no task in between (a task only
        where the model's view must be asked for first: ``model_infer_later``). ``raw``: a big request's tensors,
        kept out of the message (raw_contents.py)."""
        inference = self.inference
        try:
            if model is None:
                model = inference.view(request)
                if model is None:
                    call.task = asyncio.ensure_future(self.model_infer_later(call, request, raw))
                    return
            future, model, options = inference.begin(request, model, call.headers, raw, answer=True)
        except InferError as exc:
            self.trailers_only(call, GRPC_STATUS[exc.code], exc.message)
            return
        except Exception as exc:  # noqa: BLE001 - a bug in decoding costs this call only
            self.failed(call.sid, exc)
            return

        def done(future: Any) -> None:  # (an asyncio future or a core.answer.Answer)
            if future.cancelled() or call.closed:
                return  # the client reset the stream or went away meanwhile
            raw: list[bytes | memoryview] = []
            try:
                reply = inference.finish(future.result(), model, options, raw)
                data = reply.SerializeToString()
            except InferError as exc:
                self.trailers_only(call, GRPC_STATUS[exc.code], exc.message)
                return
            except Exception as exc:
                log.exception("ModelInfer failed")
                self.trailers_only(call, grpc.StatusCode.UNKNOWN, f"{type(exc).__name__}: {exc}")
                return
            self.send_message(call, data, last=True, tail=response_tail(raw) if raw else None)

        if future.done():
            done(future)
        else:
            call.future = future
            future.add_done_callback(done)

    async def model_infer_later(self, call: Call, request: Any, raw: list[memoryview] | None) -> None:
        try:
            model = await self.inference.model(request)
        except InferError as exc:
            self.trailers_only(call, GRPC_STATUS[exc.code], exc.message)
            return
        if not call.closed:
            self.model_infer(call, request, model, raw)

    async def run_unary(self, call: Call, request: Any) -> None:
        context = Context(tuple(call.headers.items()))
        try:
            reply = await call.handler.unary_unary(request, context)
        except Exception as exc:
            log.exception("gRPC handler failed")
            self.trailers_only(call, grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc).__name__}: {exc}")
            return
        if context.code is not grpc.StatusCode.OK or reply is None:
            self.trailers_only(call, context.code, context.details)
            return
        self.send_message(call, call.handler.response_serializer(reply), last=True)

    def feed(self, call: Call, end: bool) -> None:
        """Queue every complete message of a streaming call for its handler; None marks the end."""
        body = call.body or b""
        inbox = call.inbox
        assert inbox is not None
        pos, n = 0, len(body)
        with memoryview(body) as view:
            while n - pos >= 5:
                size = int.from_bytes(view[pos + 1:pos + 5], "big")
                if n - pos - 5 < size:
                    break
                data = self.message(call, view[pos:pos + 5 + size])
                if data is None:
                    return
                try:
                    inbox.put_nowait(call.handler.request_deserializer(bytes(data)))
                    self.budget.queue(call, 5 + size)
                except Exception:  # noqa: BLE001 - as in unary(): the stream ends with it
                    self.trailers_only(call, grpc.StatusCode.INTERNAL, UNPARSABLE_MESSAGE)
                    return
                pos += 5 + size
            data = None  # a live slice would keep the view exported
        if pos:  # else the body stays as it is: a message still arriving is not copied again
            call.body = body[pos:] if pos < n else None
        if end:
            inbox.put_nowait(None)
        elif call.body is not None:
            self.make_room(call)
        if call.task is None and not inbox.empty():
            # Started only now: a stream that is opened and left idle holds no task (~10 KiB each, for up to
            # --grpc-max-concurrent-streams streams per connection).
            call.task = asyncio.ensure_future(self.run_streaming(call))

    async def run_streaming(self, call: Call) -> None:
        inbox = call.inbox
        assert inbox is not None

        budget = self.budget

        async def requests() -> AsyncIterator[Any]:
            while (item := await inbox.get()) is not None:
                budget.handed(call)  # its room comes back, and the client may send the next
                self.wrote()
                yield item

        context = Context(tuple(call.headers.items()))
        serialize = call.handler.response_serializer
        try:
            async for reply in call.handler.stream_stream(requests(), context):
                if call.closed:
                    return
                self.send_message(call, serialize(reply), last=False)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("gRPC stream handler failed")
            context.code, context.details = grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc).__name__}: {exc}"
        if not call.closed:
            self.end_call(call, context.code, context.details)

    # -- answers ------------------------------------------------------------------------------------------

    def refuse(self, call: Call) -> None:
        """A call on a connection the port refused: UNAVAILABLE (clients retry it elsewhere or later), then close."""
        gate = self.server.gate
        if self.refused == PORT_FULL:
            message = f"too many open connections: at most {gate.limit} are served at once (--grpc-max-connections)"
        else:
            message = (f"too many open connections from {self.address}: at most {gate.per_address} are served at "
                       "once (--grpc-max-connections-per-address)")
        self.trailers_only(call, grpc.StatusCode.UNAVAILABLE, message)
        self.goaway(NO_ERROR, close=True)

    def trailers_only(self, call: Call, code: grpc.StatusCode, message: str) -> None:
        if call.started:
            self.end_call(call, code, message)
            return
        call.closed = True
        self.calls.pop(call.sid, None)
        if call.reserved or call.need or call.sizes:
            self.budget.release(call)
        self.h2.send_headers(call.sid, RESPONSE_HEADERS + status_trailers(code, message), end_stream=True)
        if call.inbox is not None and call.task is not None and not call.task.done():
            call.task.cancel()  # nothing more will be read for it
        self.wrote()

    def end_call(self, call: Call, code: grpc.StatusCode, message: str) -> None:
        if not call.started:
            self.trailers_only(call, code, message)
            return
        call.closed = True
        self.calls.pop(call.sid, None)
        if call.reserved or call.need or call.sizes:
            self.budget.release(call)
        self.h2.send_headers(call.sid, status_trailers(code, message) if code is not grpc.StatusCode.OK
                             else OK_TRAILERS, end_stream=True)
        self.wrote()

    def send_message(self, call: Call, data: bytes, last: bool,
                     tail: list[bytes | memoryview] | None = None) -> None:
        """One response message: ``data``, then the buffers of ``tail`` (a big answer's tensors, raw_contents.py),
        which go out as they are, without being joined."""
        if tail is not None and call.compress is not None:
            data, tail = b"".join((data, *tail)), None
        flag = b"\0"
        if call.compress is not None:
            packed = _COMPRESSORS[call.compress](data)
            if len(packed) < len(data):  # else sent as it is, as grpc does
                data, flag = packed, b"\1"
        size = len(data)
        if tail is not None:
            size += sum(len(buffer) for buffer in tail)
        head = flag + size.to_bytes(4, "big")
        headers = None
        if not call.started:
            call.started = True
            headers = RESPONSE_HEADERS if call.compress is None else ENCODED_RESPONSE_HEADERS[call.compress]
        h2 = self.h2
        if last:
            call.closed = True
            self.calls.pop(call.sid, None)
            if call.reserved:
                self.budget.release(call)
            if size < SPLIT:
                h2.respond(call.sid, headers, head + data, OK_TRAILERS)  # one write: HEADERS, DATA, trailers
            else:
                if headers is not None:
                    h2.send_headers(call.sid, headers)
                self.send_body(call.sid, head, data, tail)
                h2.send_headers(call.sid, OK_TRAILERS, end_stream=True)
        else:
            if headers is not None:
                h2.send_headers(call.sid, headers)
            if size < SPLIT:
                h2.send_data(call.sid, head + data)
            else:
                self.send_body(call.sid, head, data, tail)
        self.wrote()

    def send_body(self, sid: int, head: bytes, data: bytes, tail: list[bytes | memoryview] | None) -> None:
        """A big message: its small leading parts joined, each large buffer in frames of its own (not copied)."""
        h2 = self.h2
        small = [head]
        for buffer in (data, *(tail or ())):
            if len(buffer) < SPLIT:
                small.append(buffer)  # type: ignore[arg-type]
                continue
            h2.send_data(sid, b"".join(small))
            small = []
            h2.send_data(sid, buffer)
        if small:
            h2.send_data(sid, b"".join(small))


class LeanServer:
    """Listens and keeps its connections, to send them GOAWAY when stopping."""

    def __init__(self, paths: dict[str, grpc.RpcMethodHandler], inference: Inference,
                 infer_path: str | None = _INFER_PATH, compress_level: str | None = None,
                 limits: Limits | None = None, gate: Gate | None = None, options: GrpcOptions | None = None) -> None:
        options = options or GrpcOptions()
        self.gate = gate or Gate(options.max_connections, options.max_connections_per_address)
        self.buffer_limit = options.max_connection_buffer
        self.preface_timeout = options.preface_timeout
        self.idle_timeout = options.idle_timeout
        self.paths = paths
        self.inference = inference
        self.compress_level = compress_level  # None: answers are never compressed
        self.max_decompressed = options.max_decompressed_size  # what a compressed request message may expand to
        # ModelInfer's fast path; None sends it through its (restriction-checking) handler like any other RPC.
        self.infer_path = infer_path
        self.limits = limits or Limits()
        self.connections: set[Connection] = set()
        self.closing = False
        self.servers: list[Any] = []  # asyncio servers, or acceptors (ports.Port.serve)

    async def start(self, options: GrpcOptions, port: Port) -> None:
        """Serve from the port's listening sockets (naiad/frontends/ports.py: bound by this process, or by the
        model host and shared by its front-end processes)."""
        self.servers = await port.serve(lambda: Connection(self), tls_context(options) if options.use_ssl else None)

    async def stop(self, grace: float | None = None) -> None:
        """GOAWAY to every connection; one with calls still open closes once they have ended, or after ``grace``
        seconds. After the drain a stream may still be writing its last answers: the service counts a request done
        once its answer exists, and the stream's handler sends it a turn or two of the loop later."""
        self.closing = True
        for server in self.servers:
            server.close()
        connections = list(self.connections)
        for connection in connections:
            connection.goaway(NO_ERROR, close=not connection.calls)
        if grace:
            loop = asyncio.get_running_loop()
            end = loop.time() + grace
            while loop.time() < end and any(c.calls and c.transport is not None for c in connections):
                await asyncio.sleep(0.005)
        for connection in connections:
            if connection.transport is not None:
                connection.flush()
                connection.transport.close()


def tls_context(options: GrpcOptions) -> ssl.SSLContext:
    """Triton's TLS: the server's certificate; with mutual TLS, a client certificate the root signed is required."""
    root = options.tls_files()[2]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2  # HTTP/2 forbids older versions (RFC 9113 9.2)
    try:
        context.load_cert_chain(options.server_cert, options.server_key)
        if root is not None:
            context.load_verify_locations(cadata=root.decode("ascii"))
    except (ssl.SSLError, ValueError) as exc:
        raise SystemExit(f"error: failed to start GRPC service: Unavailable - invalid TLS certificate or key: "
                         f"{exc}") from None
    if options.use_ssl_mutual:
        context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["h2"])  # grpc clients refuse a server that selects no ALPN protocol
    return context


async def start(paths: dict[str, grpc.RpcMethodHandler], inference: Inference, options: GrpcOptions,
                gate: Gate | None, port: Port) -> LeanServer:
    restricted = options.restricted.rule("inference") is not None
    level = options.infer_compression_level
    server = LeanServer(paths, inference, None if restricted else _INFER_PATH, None if level == "none" else level,
                        limits_for(options), gate, options)
    await server.start(options, port)
    return server
