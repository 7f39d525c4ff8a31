#!/usr/bin/env python3
"""Prototype: the same canned ModelInfer answer as ``grpc_echo_server.py``, over a lean HTTP/2 server of our own.

The question it answers: how fast could unary gRPC be in Python without grpc.aio's per-call machinery
(a completion-queue poller thread, several tasks and a call object per RPC)? Frames are parsed on an asyncio
``Protocol``; request header blocks go through the ``hpack`` package's decoder (its dynamic table is per
connection state, so every block must be decoded); response header blocks are constant (static-table and
never-indexed literals, so no encoder state) and are written as prebuilt bytes.

It handles what a C-core client (tritonclient.grpc) and h2load send on a unary call: the preface, SETTINGS
(+ACK), PING (+ACK), WINDOW_UPDATE (send-side flow control per stream and connection), HEADERS+CONTINUATION,
DATA with padding, RST_STREAM, GOAWAY; receive windows are opened wide once and topped up on the connection.
Streaming RPCs, compression and deadlines are not handled: it is a measurement, not a server.

    python benchmarks/grpc_lean_echo.py PORT
"""
from __future__ import annotations

import asyncio
import struct
import sys

import uvloop
from grpc_echo_server import canned_response
from hpack import Decoder

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
SETTINGS_HEADER_TABLE_SIZE, SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x1, 0x4, 0x5
MAX_WINDOW = 2**31 - 1
_HEADER = struct.Struct(">BHBBI")


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    n = len(payload)
    return _HEADER.pack(n >> 16, n & 0xFFFF, kind, flags, stream) + payload


def literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal header field without indexing (no encoder state), lengths under 127."""
    return b"\x00" + bytes((len(name),)) + name + bytes((len(value),)) + value


# :status 200 (static index 8) and content-type (static name 31) as a literal without indexing.
RESPONSE_HEADERS = b"\x88" + b"\x0f\x10" + bytes((16,)) + b"application/grpc"
OK_TRAILERS = literal(b"grpc-status", b"0")
UNIMPLEMENTED = RESPONSE_HEADERS + literal(b"grpc-status", b"12") + literal(b"grpc-message", b"unknown method")
PATH = b"/inference.GRPCInferenceService/ModelInfer"


class Stream:
    __slots__ = ("block", "body", "path", "pending", "window")

    def __init__(self, window: int) -> None:
        self.path = b""
        self.block = bytearray()
        self.body = bytearray()
        self.window = window
        self.pending = b""  # response DATA payload waiting for send window, then its trailers


class Connection(asyncio.Protocol):
    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.buf = bytearray()
        self.preface = False
        self.decoder = Decoder()
        self.streams: dict[int, Stream] = {}
        self.blocked: dict[int, Stream] = {}
        self.send_window = 65535
        self.initial_window = 65535
        self.max_frame = 16384
        self.unacked = 0
        self.continuing = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        settings = struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW)
        transport.write(frame(SETTINGS, 0, 0, settings) +  # type: ignore[attr-defined]
                        frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - 65535)))

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if not self.preface:
            if len(buf) < 24:
                return
            if buf[:24] != PREFACE:
                self.transport.close()
                return
            del buf[:24]
            self.preface = True
        pos, end = 0, len(buf)
        while end - pos >= 9:
            hi, lo, kind, flags, stream = _HEADER.unpack_from(buf, pos)
            length = (hi << 16) | lo
            if end - pos - 9 < length:
                break
            payload = bytes(buf[pos + 9:pos + 9 + length])
            pos += 9 + length
            self.on_frame(kind, flags, stream & MAX_WINDOW, payload)
        del buf[:pos]

    def on_frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if kind == DATA:
            stream = self.streams.get(sid)
            self.unacked += len(payload)
            if self.unacked > MAX_WINDOW // 2:
                self.transport.write(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self.unacked)))
                self.unacked = 0
            if stream is None:
                return
            if flags & PADDED:
                payload = payload[1:len(payload) - payload[0]]
            stream.body += payload
            if flags & END_STREAM:
                self.dispatch(sid, stream)
        elif kind == HEADERS or kind == CONTINUATION:
            if kind == HEADERS:
                stream = self.streams.get(sid)
                if stream is None:
                    stream = self.streams[sid] = Stream(self.initial_window)
                if flags & PADDED:
                    payload = payload[1:len(payload) - payload[0]]
                if flags & PRIORITY_FLAG:
                    payload = payload[5:]
                stream.block += payload
                self.continuing = 0 if flags & END_HEADERS else sid
                self.end_stream = flags & END_STREAM
            else:
                stream = self.streams[sid]
                stream.block += payload
                if flags & END_HEADERS:
                    self.continuing = 0
            if not self.continuing:
                for name, value in self.decoder.decode(bytes(stream.block), raw=True):
                    if name == b":path":
                        stream.path = value
                stream.block = bytearray()
                if self.end_stream:
                    self.dispatch(sid, stream)
        elif kind == SETTINGS:
            if flags & ACK:
                return
            for offset in range(0, len(payload), 6):
                key, value = struct.unpack_from(">HI", payload, offset)
                if key == SETTINGS_INITIAL_WINDOW_SIZE:
                    delta = value - self.initial_window
                    self.initial_window = value
                    for stream in self.streams.values():
                        stream.window += delta
                elif key == SETTINGS_MAX_FRAME_SIZE:
                    self.max_frame = value
                elif key == SETTINGS_HEADER_TABLE_SIZE:
                    pass  # we never index, so the peer's decoder table size does not concern us
            self.transport.write(frame(SETTINGS, ACK, 0, b""))
            self.flush()
        elif kind == WINDOW_UPDATE:
            increment = struct.unpack(">I", payload)[0] & MAX_WINDOW
            if sid == 0:
                self.send_window += increment
            elif sid in self.streams:
                self.streams[sid].window += increment
            self.flush()
        elif kind == PING:
            if not flags & ACK:
                self.transport.write(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            self.streams.pop(sid, None)
            self.blocked.pop(sid, None)
        elif kind == GOAWAY and not self.streams:
            self.transport.close()

    def dispatch(self, sid: int, stream: Stream) -> None:
        if stream.path != PATH:
            del self.streams[sid]
            self.transport.write(frame(HEADERS, END_HEADERS | END_STREAM, sid, UNIMPLEMENTED))
            return
        message = self.answer
        self.respond(sid, stream, b"\0" + len(message).to_bytes(4, "big") + message)

    def respond(self, sid: int, stream: Stream, data: bytes) -> None:
        stream.pending = data
        self.transport.write(frame(HEADERS, END_HEADERS, sid, RESPONSE_HEADERS))
        self.send(sid, stream)

    def send(self, sid: int, stream: Stream) -> bool:
        """Write as much of the stream's answer as the windows allow; True once it is all out."""
        data = stream.pending
        out = []
        while data:
            n = min(len(data), self.max_frame, self.send_window, stream.window)
            if n <= 0:
                break
            out.append(frame(DATA, 0, sid, data[:n]))
            data = data[n:]
            self.send_window -= n
            stream.window -= n
        stream.pending = data
        if not data:
            out.append(frame(HEADERS, END_HEADERS | END_STREAM, sid, OK_TRAILERS))
            del self.streams[sid]
        else:
            self.blocked[sid] = stream
        self.transport.write(b"".join(out))
        return not data

    def flush(self) -> None:
        for sid, stream in list(self.blocked.items()):
            del self.blocked[sid]
            if not self.send(sid, stream):
                break


async def main(port: int) -> None:
    answer = canned_response()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(answer), "127.0.0.1", port)
    await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1])))
