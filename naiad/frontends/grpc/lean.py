"""A lean gRPC server: HTTP/2 on an asyncio ``Protocol``, serving the same handler table as grpc.aio.

Why: grpc.aio's per-call machinery (completion-queue poller thread, a call object and several tasks per RPC)
costs more than all of naiad's own work on a small ModelInfer. Here a unary ModelInfer is decoded, queued and
answered from the model future's done-callback: no task, no thread hop. Other unary RPCs and
ModelStreamInfer run their (async) grpc handlers in a task, as grpc.aio would.

HTTP/2 as a C-core client (tritonclient.grpc) or h2load speaks it: preface, SETTINGS (+ACK), PING (+ACK),
WINDOW_UPDATE (send-side flow control per stream and connection), HEADERS + CONTINUATION, padding, DATA,
RST_STREAM, GOAWAY both ways. Request header blocks go through the ``hpack`` package's decoder (its dynamic
table is connection state); response header blocks use only the static table and literals without indexing,
so they need no encoder state and the common ones are prebuilt bytes. Receive windows are opened wide and
topped up as data is consumed. Request messages may be gzip/deflate compressed; ModelInfer / ModelStreamInfer
answers are when --grpc-infer-response-compression-level asks, with grpc's choice of algorithm. TLS is
asyncio's (``ssl``), offering ALPN "h2" as grpc clients require. Not handled: deadlines (grpc-timeout).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
import zlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
from hpack import Decoder
from hpack.exceptions import HPACKError

from naiad.core.errors import InferError
from naiad.frontends.grpc.inference import Inference
from naiad.frontends.grpc.options import GrpcOptions, compression_for
from naiad.frontends.grpc.status import GRPC_STATUS

log = logging.getLogger("naiad.grpc")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x4, 0x5
NO_ERROR, PROTOCOL_ERROR, FRAME_SIZE_ERROR, COMPRESSION_ERROR = 0x0, 0x1, 0x6, 0x9
MAX_WINDOW = 2**31 - 1
OUR_MAX_FRAME = 1 << 20  # fewer, larger frames for big tensors (the protocol's default is 16 KiB)
_FRAME = struct.Struct(">BHBBI")
_INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"
_COMPRESSED_PATHS = (_INFER_PATH, "/inference.GRPCInferenceService/ModelStreamInfer")  # as in Triton
# grpc's deflate is the zlib format; both at zlib's default level, as grpc compresses.
_COMPRESSORS = {"gzip": lambda data: zlib.compress(data, wbits=31), "deflate": zlib.compress}


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    n = len(payload)
    return _FRAME.pack(n >> 16, n & 0xFFFF, kind, flags, stream) + payload


def _integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer (RFC 7541 5.1) whose first byte carries ``first`` above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal without indexing, new name, no Huffman: needs no encoder state."""
    return b"\x00" + _integer(len(name), 7) + name + _integer(len(value), 7) + value


def _percent_encode(message: str) -> bytes:
    # grpc-message is percent-encoded UTF-8 (gRPC over HTTP/2 spec): printable ASCII except '%' stays.
    return b"".join(bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b
                    for b in message.encode("utf-8"))


# :status 200 (static index 8); content-type (static name index 31) as a literal without indexing.
RESPONSE_HEADERS = b"\x88" + b"\x0f\x10" + _integer(16, 7) + b"application/grpc"
OK_TRAILERS = _literal(b"grpc-status", b"0")
ENCODED_RESPONSE_HEADERS = {name: RESPONSE_HEADERS + _literal(b"grpc-encoding", name.encode()) for name in _COMPRESSORS}


def status_trailers(code: grpc.StatusCode, message: str) -> bytes:
    block = _literal(b"grpc-status", str(code.value[0]).encode())
    return block + _literal(b"grpc-message", _percent_encode(message)) if message else block


def _grpc_error(code: grpc.StatusCode, message: str) -> bytes:
    return status_trailers(code, message)


def _only_indexed(block: bytes) -> bool:
    """Whether an HPACK block holds only indexed fields (RFC 7541 6.1), which leave the dynamic table as it is."""
    i, n = 0, len(block)
    while i < n:
        first = block[i]
        i += 1
        if not first & 0x80:
            return False
        if first & 0x7F == 0x7F:  # the index continues in 7-bit groups
            while i < n and block[i] & 0x80:
                i += 1
            i += 1
    return True


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


class Stream:
    """One HTTP/2 stream, i.e. one call."""

    __slots__ = (
        "block",
        "body",
        "closed",
        "compress",
        "encoding",
        "handler",
        "headers",
        "inbox",
        "pending",
        "received",
        "sid",
        "started",
        "task",
        "window",
    )

    def __init__(self, sid: int, window: int) -> None:
        self.sid = sid
        self.block = bytearray()
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.window = window
        self.pending: list[bytes] = []  # DATA payloads waiting for send window, then maybe trailers
        self.handler: Any = None
        self.inbox: asyncio.Queue | None = None  # request messages of a streaming call
        self.task: asyncio.Task | None = None
        self.received = 0  # bytes consumed since the last stream WINDOW_UPDATE
        self.started = False  # response HEADERS sent
        self.closed = False  # trailers queued
        self.encoding = ""
        self.compress: str | None = None  # the algorithm for this call's answers


class Connection(asyncio.Protocol):
    def __init__(self, server: LeanServer) -> None:
        self.server = server
        self.paths = server.paths
        self.inference = server.inference
        self.infer_path = server.infer_path
        self.compress_level = server.compress_level
        self.buf = bytearray()
        self.preface = False
        self.decoder = Decoder()
        # A client repeating a call sends the same block of table references each time: decode it once.
        self.blocks: dict[bytes, list[tuple[str, str]]] = {}
        self.streams: dict[int, Stream] = {}
        self.blocked: dict[int, Stream] = {}
        self.send_window = 65535
        self.initial_window = 65535
        self.max_frame = 16384
        self.unacked = 0
        self.continuing = 0
        self.end_stream = 0
        self.last_sid = 0
        self.transport: asyncio.Transport | None = None

    # -- connection ---------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections.add(self)
        settings = struct.pack(">HIHI", SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW, SETTINGS_MAX_FRAME_SIZE,
                               OUR_MAX_FRAME)
        self.write(frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - 65535)))

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.transport = None
        for stream in self.streams.values():
            if stream.task is not None:
                stream.task.cancel()
        self.streams.clear()
        self.blocked.clear()

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def goaway(self, error: int, close: bool) -> None:
        self.write(frame(GOAWAY, 0, 0, struct.pack(">II", self.last_sid, error)))
        if close and self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if not self.preface:
            if len(buf) < 24:
                return
            if buf[:24] != PREFACE:
                self.goaway(PROTOCOL_ERROR, close=True)
                return
            del buf[:24]
            self.preface = True
        pos, end = 0, len(buf)
        while end - pos >= 9 and self.transport is not None:
            hi, lo, kind, flags, sid = _FRAME.unpack_from(buf, pos)
            length = (hi << 16) | lo
            if length > OUR_MAX_FRAME:
                self.goaway(FRAME_SIZE_ERROR, close=True)
                return
            if end - pos - 9 < length:
                break
            start = pos + 9
            pos = start + length
            sid &= MAX_WINDOW
            if kind == DATA:
                self.on_data(flags, sid, buf, start, pos)
            else:
                self.on_frame(kind, flags, sid, bytes(buf[start:pos]))
        del buf[:pos]

    # -- frames -------------------------------------------------------------------------------------------

    def on_data(self, flags: int, sid: int, buf: bytearray, start: int, end: int) -> None:
        self.unacked += end - start
        if self.unacked > MAX_WINDOW // 2:
            self.write(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self.unacked)))
            self.unacked = 0
        stream = self.streams.get(sid)
        if stream is None or stream.handler is None:
            return
        if flags & PADDED:
            pad = buf[start]
            start, end = start + 1, end - pad
        stream.body += memoryview(buf)[start:end]
        if stream.inbox is not None:
            stream.received += end - start
            if stream.received > MAX_WINDOW // 2:
                self.write(frame(WINDOW_UPDATE, 0, sid, struct.pack(">I", stream.received)))
                stream.received = 0
            self.feed(stream, flags & END_STREAM)
        elif flags & END_STREAM:
            self.unary(stream)

    def on_frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if self.continuing and kind != CONTINUATION:
            self.goaway(PROTOCOL_ERROR, close=True)
            return
        if kind == HEADERS:
            stream = self.streams.get(sid)
            if stream is None:
                if sid <= self.last_sid or sid % 2 == 0 or self.server.closing:
                    # A new stream after GOAWAY, or a trailers block for a call that is gone: refuse it.
                    self.write(frame(RST_STREAM, 0, sid, struct.pack(">I", 0x7 if self.server.closing else 0x5)))
                    return
                self.last_sid = sid
                stream = self.streams[sid] = Stream(sid, self.initial_window)
            if flags & PADDED:
                payload = payload[1:len(payload) - payload[0]]
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            stream.block += payload
            self.end_stream = flags & END_STREAM
            if flags & END_HEADERS:
                self.headers_done(stream)
            else:
                self.continuing = sid
        elif kind == CONTINUATION:
            stream = self.streams.get(sid)
            if stream is None or sid != self.continuing:
                self.goaway(PROTOCOL_ERROR, close=True)
                return
            stream.block += payload
            if flags & END_HEADERS:
                self.continuing = 0
                self.headers_done(stream)
        elif kind == SETTINGS:
            if not flags & ACK:
                self.on_settings(payload)
        elif kind == WINDOW_UPDATE:
            increment = struct.unpack(">I", payload)[0] & MAX_WINDOW
            if sid == 0:
                self.send_window += increment
            elif sid in self.streams:
                self.streams[sid].window += increment
            self.flush()
        elif kind == PING:
            if not flags & ACK:
                self.write(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            stream = self.streams.pop(sid, None)
            self.blocked.pop(sid, None)
            if stream is not None and stream.task is not None:
                stream.task.cancel()
        elif kind == GOAWAY and not self.streams and self.transport is not None:
            # The client is leaving with nothing in flight; otherwise it closes once its calls are answered.
            self.transport.close()
        # PRIORITY, PUSH_PROMISE (never sent to a server) and unknown types are ignored, as the spec says.

    def on_settings(self, payload: bytes) -> None:
        for offset in range(0, len(payload) - 5, 6):
            key, value = struct.unpack_from(">HI", payload, offset)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                delta = value - self.initial_window
                self.initial_window = value
                for stream in self.streams.values():
                    stream.window += delta
            elif key == SETTINGS_MAX_FRAME_SIZE:
                self.max_frame = value
            # HEADER_TABLE_SIZE: our blocks never index, so the peer's table size does not concern us.
        self.write(frame(SETTINGS, ACK, 0, b""))
        self.flush()

    def headers_done(self, stream: Stream) -> None:
        block = bytes(stream.block)
        stream.block = bytearray()
        fields = self.blocks.get(block)
        if fields is None:
            try:
                fields = self.decoder.decode(block)
            except HPACKError:
                self.goaway(COMPRESSION_ERROR, close=True)
                return
            if _only_indexed(block):
                if len(self.blocks) < 64:
                    self.blocks[block] = fields
            else:
                self.blocks.clear()  # the block may have changed the dynamic table the cached ones refer to
        if stream.handler is not None:  # request trailers: only their END_STREAM matters
            if self.end_stream:
                if stream.inbox is not None:
                    self.feed(stream, True)
                else:
                    self.unary(stream)
            return
        headers = stream.headers = dict(fields)
        stream.encoding = headers.get("grpc-encoding", "identity")
        handler = self.paths.get(headers.get(":path", ""))
        if log.isEnabledFor(logging.DEBUG):  # --log-verbose 1: one line per call, like the HTTP front end's
            log.debug("GRPC request: %s", headers.get(":path", ""))
        if handler is None:
            self.trailers_only(stream, grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
            return
        stream.handler = handler
        if self.compress_level is not None and headers[":path"] in _COMPRESSED_PATHS:
            stream.compress = compression_for(self.compress_level, headers.get("grpc-accept-encoding", ""))
        if handler.request_streaming:
            stream.inbox = asyncio.Queue()
            stream.task = asyncio.ensure_future(self.run_streaming(stream))
            if self.end_stream:
                self.feed(stream, True)
        elif self.end_stream:
            self.unary(stream)

    # -- calls --------------------------------------------------------------------------------------------

    def message(self, stream: Stream, data: memoryview) -> bytes | None:
        """One length-prefixed message's bytes, decompressed; None (and the call ended) if it can't be read."""
        if data[0]:
            try:
                if stream.encoding == "gzip":
                    return zlib.decompress(data[5:], 31)
                if stream.encoding == "deflate":
                    return zlib.decompress(data[5:])
            except zlib.error as exc:
                self.trailers_only(stream, grpc.StatusCode.INTERNAL, f"Failed to decompress the message: {exc}")
                return None
            self.trailers_only(stream, grpc.StatusCode.UNIMPLEMENTED,
                               f"Compression algorithm '{stream.encoding}' is not supported")
            return None
        return data[5:]  # type: ignore[return-value]

    def unary(self, stream: Stream) -> None:
        body = stream.body
        with memoryview(body) as view:
            if len(body) < 5 or len(body) != 5 + int.from_bytes(view[1:5], "big"):
                self.trailers_only(stream, grpc.StatusCode.UNIMPLEMENTED if len(body) > 5 else
                                   grpc.StatusCode.INTERNAL, "Expected exactly one request message")
                return
            data = self.message(stream, view)
            if data is None:
                return
            handler = stream.handler
            try:
                request = handler.request_deserializer(data)
            except Exception:  # noqa: BLE001 - any parse failure is this call's INTERNAL, as grpcio answers it
                self.trailers_only(stream, grpc.StatusCode.INTERNAL, "Exception deserializing request!")
                return
        stream.body = bytearray()
        if stream.headers.get(":path") == self.infer_path:
            self.model_infer(stream, request)
            return
        stream.task = asyncio.ensure_future(self.run_unary(stream, request))

    def model_infer(self, stream: Stream, request: Any) -> None:
        """The hot path: queue the request and answer from the future's callback, no task in between."""
        inference = self.inference
        try:
            future, model, options = inference.begin(request, stream.headers)
        except InferError as exc:
            self.trailers_only(stream, GRPC_STATUS[exc.code], exc.message)
            return

        def done(future: asyncio.Future) -> None:
            if stream.sid not in self.streams:
                return  # reset by the client meanwhile
            try:
                reply = inference.finish(future.result(), model, options)
                data = reply.SerializeToString()
            except InferError as exc:
                self.trailers_only(stream, GRPC_STATUS[exc.code], exc.message)
                return
            except Exception as exc:
                log.exception("ModelInfer failed")
                self.trailers_only(stream, grpc.StatusCode.UNKNOWN, f"{type(exc).__name__}: {exc}")
                return
            self.send_message(stream, data, last=True)

        if future.done():
            done(future)
        else:
            future.add_done_callback(done)

    async def run_unary(self, stream: Stream, request: Any) -> None:
        context = Context(tuple(stream.headers.items()))
        try:
            reply = await stream.handler.unary_unary(request, context)
        except Exception as exc:
            log.exception("gRPC handler failed")
            self.trailers_only(stream, grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc).__name__}: {exc}")
            return
        if context.code is not grpc.StatusCode.OK or reply is None:
            self.trailers_only(stream, context.code, context.details)
            return
        self.send_message(stream, stream.handler.response_serializer(reply), last=True)

    def feed(self, stream: Stream, end: bool) -> None:
        """Queue every complete message of a streaming call for its handler; None marks the end."""
        body = stream.body
        inbox = stream.inbox
        pos = 0
        with memoryview(body) as view:
            while len(body) - pos >= 5:
                size = int.from_bytes(view[pos + 1:pos + 5], "big")
                if len(body) - pos - 5 < size:
                    break
                data = self.message(stream, view[pos:pos + 5 + size])
                if data is None:
                    return
                try:
                    inbox.put_nowait(stream.handler.request_deserializer(bytes(data)))  # type: ignore[union-attr]
                except Exception:  # noqa: BLE001 - as in unary()
                    self.trailers_only(stream, grpc.StatusCode.INTERNAL, "Exception deserializing request!")
                    return
                pos += 5 + size
            data = None  # type: ignore[assignment]  # a live slice would forbid resizing the body
        del body[:pos]
        if end:
            inbox.put_nowait(None)  # type: ignore[union-attr]

    async def run_streaming(self, stream: Stream) -> None:
        inbox = stream.inbox
        assert inbox is not None

        async def requests() -> AsyncIterator[Any]:
            while (item := await inbox.get()) is not None:
                yield item

        context = Context(tuple(stream.headers.items()))
        serialize = stream.handler.response_serializer
        try:
            async for reply in stream.handler.stream_stream(requests(), context):
                if stream.closed:
                    return
                self.send_message(stream, serialize(reply), last=False)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("gRPC stream handler failed")
            context.code, context.details = grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc).__name__}: {exc}"
        if not stream.closed:
            self.end_call(stream, context.code, context.details)

    # -- answers ------------------------------------------------------------------------------------------

    def trailers_only(self, stream: Stream, code: grpc.StatusCode, message: str) -> None:
        if stream.started:
            self.end_call(stream, code, message)
            return
        stream.closed = True
        self.streams.pop(stream.sid, None)
        self.write(frame(HEADERS, END_HEADERS | END_STREAM, stream.sid,
                         RESPONSE_HEADERS + status_trailers(code, message)))
        self.cancel_reading(stream)

    def end_call(self, stream: Stream, code: grpc.StatusCode, message: str) -> None:
        if not stream.started:
            self.trailers_only(stream, code, message)
            return
        stream.closed = True
        stream.pending.append(status_trailers(code, message) if code is not grpc.StatusCode.OK else OK_TRAILERS)
        self.send(stream)

    def cancel_reading(self, stream: Stream) -> None:
        if stream.inbox is not None and stream.task is not None and not stream.task.done():
            stream.task.cancel()

    def send_message(self, stream: Stream, data: bytes, last: bool) -> None:
        flag = b"\0"
        if stream.compress is not None:
            packed = _COMPRESSORS[stream.compress](data)
            if len(packed) < len(data):  # else sent as it is, as grpc does
                data, flag = packed, b"\1"
        head = flag + len(data).to_bytes(4, "big")
        first = b""
        if not stream.started:
            stream.started = True
            first = frame(HEADERS, END_HEADERS, stream.sid,  # goes out in the same write
                          RESPONSE_HEADERS if stream.compress is None else ENCODED_RESPONSE_HEADERS[stream.compress])
        stream.pending.append(head + data if len(data) < 65536 else head)
        if len(data) >= 65536:
            stream.pending.append(data)
        if last:
            stream.closed = True
            stream.pending.append(OK_TRAILERS)
        self.send(stream, first)

    def send(self, stream: Stream, first: bytes = b"") -> None:
        """Write what the windows allow of the stream's pending data (the last item may be its trailers)."""
        out = [first]
        pending = stream.pending
        sid = stream.sid
        while pending:
            data = pending[0]
            if stream.closed and len(pending) == 1:  # only the trailers are left
                out.append(frame(HEADERS, END_HEADERS | END_STREAM, sid, data))
                pending.clear()
                self.streams.pop(sid, None)
                break
            n = min(len(data), self.max_frame, self.send_window, stream.window)
            if n <= 0:
                break
            if n == len(data):
                out.append(frame(DATA, 0, sid, data))
                pending.pop(0)
            else:
                out.append(frame(DATA, 0, sid, data[:n]))
                pending[0] = data[n:]
            self.send_window -= n
            stream.window -= n
        if pending:
            self.blocked[sid] = stream
        data = b"".join(out)
        if data:
            self.write(data)

    def flush(self) -> None:
        for sid in list(self.blocked):
            stream = self.blocked.pop(sid)
            if sid in self.streams:
                self.send(stream)
            if self.send_window <= 0:
                break


class LeanServer:
    """Listens and keeps its connections, to send them GOAWAY when stopping."""

    def __init__(self, paths: dict[str, grpc.RpcMethodHandler], inference: Inference,
                 infer_path: str | None = _INFER_PATH, compress_level: str | None = None) -> None:
        self.paths = paths
        self.inference = inference
        self.compress_level = compress_level  # None: answers are never compressed
        # ModelInfer's fast path; None sends it through its (restriction-checking) handler like any other RPC.
        self.infer_path = infer_path
        self.connections: set[Connection] = set()
        self.closing = False
        self.server: asyncio.base_events.Server | None = None

    async def start(self, options: GrpcOptions) -> None:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: Connection(self), options.address, options.port,
                                               reuse_address=True, reuse_port=options.reuse_port or None,
                                               backlog=2048, ssl=tls_context(options) if options.use_ssl else None)

    async def stop(self, grace: float | None = None) -> None:
        self.closing = True
        if self.server is not None:
            self.server.close()
        for connection in list(self.connections):
            connection.goaway(NO_ERROR, close=True)


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


async def start(paths: dict[str, grpc.RpcMethodHandler], inference: Inference, options: GrpcOptions) -> LeanServer:
    restricted = options.restricted.rule("inference") is not None
    level = options.infer_compression_level
    server = LeanServer(paths, inference, None if restricted else _INFER_PATH, None if level == "none" else level)
    await server.start(options)
    return server
