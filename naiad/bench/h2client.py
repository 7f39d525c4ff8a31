"""A lean gRPC client for unary calls: HTTP/2 spoken directly on an asyncio connection, each call one write of a
prepared HEADERS block (after the first, the same indexed bytes every time) and its DATA frame. grpc's Python
client costs ~100 us of Python per call here; this does a fraction of that, so one core of load generator keeps
up with faster servers. Flow control is honoured both ways; responses' trailers are HPACK-decoded (the server's
table must be followed) and grpc-status checked."""

from __future__ import annotations

import asyncio
import struct
import time
from typing import Any

from hpack import Decoder, Encoder, NeverIndexedHeaderTuple

from naiad.bench.transport import Outcome
from naiad.frontends.http2.frames import (  # the wire's constants and framing, shared with naiad's server core
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PADDED,
    PING,
    PREFACE,
    PRIORITY_FLAG,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
)
from naiad.frontends.http2.frames import MAX_WINDOW as BIG_WINDOW


class H2GrpcConnection(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop, authority: str, path: str) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.sent_ns = 0
        headers = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", authority),
                   ("content-type", "application/grpc"), ("te", "trailers"), ("user-agent", "naiad-bench")]
        # As grpc's and nghttp2's clients do: the first request adds its headers to the server's HPACK table,
        # every later one names them by index (7 bytes), which the server decodes for next to nothing.
        encoder = Encoder()
        self.first_block = encoder.encode(headers, huffman=True)
        self.block = encoder.encode(headers, huffman=True)
        self.literal_block = Encoder().encode([NeverIndexedHeaderTuple(k, v) for k, v in headers], huffman=True)
        self.started = False
        self.decoder = Decoder()
        self.buffer = bytearray()
        self.next_stream = 1
        self.waiters: dict[int, asyncio.Future[Outcome]] = {}
        self.first_byte: dict[int, int] = {}
        self.header_stream = 0           # a header block continued in CONTINUATION frames
        self.header_flags = 0
        self.header_parts: list[bytes] = []
        self.send_window = 65535         # connection-level, granted by the server
        self.stream_initial = 65535      # the server's SETTINGS_INITIAL_WINDOW_SIZE
        self.max_frame = 16384
        self.max_streams = 2 ** 31
        self.stream_windows: dict[int, int] = {}
        self.blocked: list[tuple[int, bytes, asyncio.Future[None]]] = []
        self.received = 0
        self.queue: list[asyncio.Future[None]] = []   # calls waiting for the server's stream limit
        self.lost = False
        self.error: str | None = None

    @classmethod
    async def open(cls, host: str, port: int, path: str) -> "H2GrpcConnection":
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_connection(lambda: cls(loop, f"{host}:{port}", path), host, port)
        return protocol

    # --- connection ----------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        settings = struct.pack(">HI", 0x2, 0) + struct.pack(">HI", 0x4, BIG_WINDOW)   # no push; big stream windows
        writer: Any = transport
        writer.write(PREFACE + frame(SETTINGS, 0, 0, settings)
                             + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", BIG_WINDOW - 65535)))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_all(f"connection lost: {exc or 'closed by the server'}")

    def _fail_all(self, message: str, above: int = 0) -> None:
        self.lost = True
        for stream, waiter in list(self.waiters.items()):
            if stream > above and not waiter.done():
                waiter.set_result((False, 0, 0, message))
                self.waiters.pop(stream, None)
        self._next_turn(all_=True)
        self._wake_blocked()

    def _next_turn(self, all_: bool = False) -> None:
        while self.queue:
            turn = self.queue.pop(0)
            if not turn.done():
                turn.set_result(None)
                if not all_:
                    return

    @property
    def usable(self) -> bool:
        return not self.lost and self.next_stream < 2 ** 30

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # --- calls ---------------------------------------------------------------------------------------------

    async def call(self, message: bytes) -> Outcome:
        """``message`` is a serialized request; the 5-byte gRPC prefix is added here."""
        if self.lost or self.transport is None:
            return False, 0, 0, self.error or "connection closed"
        while len(self.waiters) >= self.max_streams and not self.lost:
            turn: asyncio.Future[None] = self.loop.create_future()
            self.queue.append(turn)
            await turn
        if self.lost:
            return False, 0, 0, self.error or "connection closed"
        stream = self.next_stream
        self.next_stream += 2
        waiter: asyncio.Future[Outcome] = self.loop.create_future()
        self.waiters[stream] = waiter
        body = b"\0" + len(message).to_bytes(4, "big") + message
        block = self.block if self.started else self.first_block
        self.started = True
        out = frame(HEADERS, END_HEADERS, stream, block)
        if len(body) <= min(self.send_window, self.stream_initial, self.max_frame):
            self.send_window -= len(body)
            self.transport.write(out + frame(DATA, END_STREAM, stream, body))
        else:
            self.transport.write(out)
            self.stream_windows[stream] = self.stream_initial
            await self._send_data(stream, body)
        sent = time.monotonic_ns()
        outcome = await waiter
        self.sent_ns = sent   # read by the caller right after this returns, before any other call resumes
        return outcome

    async def _send_data(self, stream: int, body: bytes) -> None:
        """A body larger than a frame or than the windows: sent as the server grants room."""
        view = memoryview(body)
        while view:
            if stream not in self.stream_windows:
                return  # the server answered (or reset) the call before it had it all: the rest is not wanted
            room = min(self.send_window, self.stream_windows[stream], self.max_frame)
            if room <= 0:
                ready: asyncio.Future[None] = self.loop.create_future()
                self.blocked.append((stream, b"", ready))
                await ready
                if self.lost:
                    return
                continue
            chunk = bytes(view[:room])
            view = view[room:]
            self.send_window -= len(chunk)
            self.stream_windows[stream] -= len(chunk)
            assert self.transport is not None
            self.transport.write(frame(DATA, 0 if view else END_STREAM, stream, chunk))
        self.stream_windows.pop(stream, None)

    def _wake_blocked(self) -> None:
        blocked, self.blocked = self.blocked, []
        for _, _, ready in blocked:
            if not ready.done():
                ready.set_result(None)

    # --- frames in -----------------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        offset = 0
        size = len(buffer)
        while size - offset >= 9:
            length = int.from_bytes(buffer[offset:offset + 3], "big")
            if size - offset < 9 + length:
                break
            kind = buffer[offset + 3]
            flags = buffer[offset + 4]
            stream = int.from_bytes(buffer[offset + 5:offset + 9], "big") & 0x7FFFFFFF
            payload = bytes(buffer[offset + 9:offset + 9 + length])
            offset += 9 + length
            self._frame(kind, flags, stream, payload)
        del buffer[:offset]

    def _frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if kind == DATA:
            if stream not in self.first_byte:
                self.first_byte[stream] = time.monotonic_ns()
            self.received += len(payload)
            if self.received > 1 << 24:   # keep the connection window open (stream windows are huge)
                assert self.transport is not None
                self.transport.write(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self.received)))
                self.received = 0
            if flags & END_STREAM:
                self._finish(stream, "response ended without trailers")
        elif kind == HEADERS:
            if flags & PADDED:
                payload = payload[1:len(payload) - payload[0]]
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            self.header_parts = [payload]
            self.header_stream, self.header_flags = stream, flags
            if flags & END_HEADERS:
                self._headers()
        elif kind == CONTINUATION:
            self.header_parts.append(payload)
            if flags & END_HEADERS:
                self._headers()
        elif kind == SETTINGS:
            if not flags & ACK:
                for at in range(0, len(payload) - 5, 6):
                    key, value = struct.unpack_from(">HI", payload, at)
                    if key == 0x4:
                        delta = value - self.stream_initial
                        self.stream_initial = value
                        for s in self.stream_windows:
                            self.stream_windows[s] += delta
                    elif key == 0x5:
                        self.max_frame = value
                    elif key == 0x3:
                        self.max_streams = value
                    elif key == 0x1 and value < 4096 and self.block is not self.literal_block:
                        # A server with a smaller table: empty ours there (a size update), then literals only.
                        self.block = b"\x20" + self.literal_block
                        self.literal_block = self.block
                assert self.transport is not None
                self.transport.write(frame(SETTINGS, ACK, 0, b""))
                self._wake_blocked()
        elif kind == WINDOW_UPDATE:
            increment = struct.unpack(">I", payload[:4])[0] & 0x7FFFFFFF
            if stream == 0:
                self.send_window += increment
            elif stream in self.stream_windows:
                self.stream_windows[stream] += increment
            self._wake_blocked()
        elif kind == PING:
            if not flags & ACK:
                assert self.transport is not None
                self.transport.write(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            code = struct.unpack(">I", payload[:4])[0]
            self._finish(stream, f"stream reset by the server (HTTP/2 error {code})")
        elif kind == GOAWAY:
            last = struct.unpack(">I", payload[:4])[0] & 0x7FFFFFFF
            self.error = f"server sent GOAWAY: {payload[8:].decode(errors='replace')}"
            self._fail_all(self.error, above=last)
            self.lost = True

    def _headers(self) -> None:
        stream, flags = self.header_stream, self.header_flags
        headers = self.decoder.decode(b"".join(self.header_parts), raw=True)
        self.header_parts = []
        if not flags & END_STREAM:
            return   # response headers; the trailers come after the message
        status = message = None
        for key, value in headers:
            if key == b"grpc-status":
                status = value
            elif key == b"grpc-message":
                message = value
            elif key == b":status" and value != b"200":
                status = status or b"http " + value
        if status == b"0":
            self._finish(stream, None)
        else:
            text = (message or b"").decode(errors="replace")
            self._finish(stream, f"grpc-status {(status or b'missing').decode()}: {text}")

    def _finish(self, stream: int, error: str | None) -> None:
        waiter = self.waiters.pop(stream, None)
        first = self.first_byte.pop(stream, 0)
        self.stream_windows.pop(stream, None)
        if waiter is not None and not waiter.done():
            waiter.set_result((error is None, time.monotonic_ns() - first if first else 0, 1, error))
        if self.queue:
            self._next_turn()
