"""The bench's lean gRPC client (naiad/bench/h2client.py) fed a server's frames as bytes, its writes read back as
frames: flow control as RFC 9113 asks of a sender, and calls the server ends before it has the whole request."""

from __future__ import annotations

import asyncio
import struct

from hpack import Encoder

from naiad.bench.h2client import H2GrpcConnection
from tests.http2_frames import frame, frames_of

DATA, HEADERS, RST_STREAM, SETTINGS, WINDOW_UPDATE = 0, 1, 3, 4, 8
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class Wire:
    """The client's transport: what it writes, kept."""

    def __init__(self) -> None:
        self.out = bytearray()

    def write(self, data: bytes) -> None:
        self.out += data

    def close(self) -> None:
        pass

    def frames(self) -> list[tuple[int, int, int, bytes]]:
        data, self.out = bytes(self.out), bytearray()
        return frames_of(data.removeprefix(PREFACE))


def sent_on(frames: list[tuple[int, int, int, bytes]], sid: int) -> int:
    return sum(len(p) for kind, _, s, p in frames if kind == DATA and s == sid)


async def _client() -> tuple[H2GrpcConnection, Wire]:
    client = H2GrpcConnection(asyncio.get_running_loop(), "x:1", "/p.S/M")
    wire = Wire()
    client.connection_made(wire)  # type: ignore[arg-type]
    wire.frames()
    return client, wire


def test_a_smaller_initial_window_read_after_sending_shrinks_the_stream_and_updates_reopen_it() -> None:
    """The client sends on the default window before it reads the server's SETTINGS; their smaller
    SETTINGS_INITIAL_WINDOW_SIZE takes the difference off the open stream (its window goes negative); a
    WINDOW_UPDATE on the stream, not the connection's, is what lets it send on, exactly as far as granted."""

    async def run() -> None:
        client, wire = await _client()
        size = 200_000
        call = asyncio.ensure_future(client.call(b"z" * size))
        await asyncio.sleep(0)
        first = wire.frames()
        assert sent_on(first, 1) == 65535  # the default windows, in frames of at most 16,384
        assert max(len(p) for kind, _, _, p in first if kind == DATA) == 16384
        client.data_received(frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 33554))
                             + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 30)))
        await asyncio.sleep(0)
        acked = wire.frames()
        assert [(k, f) for k, f, _, _ in acked] == [(SETTINGS, ACK)] and client.stream_windows[1] == 33554 - 65535
        # The server's grant, sized on the window the client will have after the ACK: the rest of the message.
        rest = 5 + size - 65535
        client.data_received(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", rest - (33554 - 65535) - 1)))
        await asyncio.sleep(0)
        assert sent_on(wire.frames(), 1) == rest - 1  # one byte short: it waits for it
        assert client.stream_windows[1] == 0 and not call.done()
        client.data_received(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1)))
        await asyncio.sleep(0)
        last = wire.frames()
        assert sent_on(last, 1) == 1 and last[-1][1] & END_STREAM
        call.cancel()

    asyncio.run(run())


def test_a_call_the_server_answers_before_it_has_the_whole_request_stops_sending_and_returns() -> None:
    """The server refuses a call on its first bytes (trailers, then RST_STREAM NO_ERROR, as grpc-core does): the
    client neither waits for window it will never get nor sends the rest."""

    async def run() -> None:
        client, wire = await _client()
        call = asyncio.ensure_future(client.call(b"z" * 200_000))
        await asyncio.sleep(0)
        assert sent_on(wire.frames(), 1) == 65535
        trailers = Encoder().encode([(":status", "200"), ("content-type", "application/grpc"),
                                     ("grpc-status", "8"), ("grpc-message", "too large")])
        client.data_received(frame(HEADERS, END_HEADERS | END_STREAM, 1, trailers)
                             + frame(RST_STREAM, 0, 1, struct.pack(">I", 0))
                             + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 20)))
        ok, _, _, error = await asyncio.wait_for(call, 5)
        assert not ok and error == "grpc-status 8: too large"
        assert sent_on(wire.frames(), 1) == 0

    asyncio.run(run())
