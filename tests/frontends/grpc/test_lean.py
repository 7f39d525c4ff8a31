"""The lean engine's adapter over the HTTP/2 core, with a recording transport: a call the client abandons cancels
the work queued for it, a peer that stops reading stops being read, a large message sent before the client read
our SETTINGS arrives whole, and a big unary message is read from the socket straight to memory of its own."""

from __future__ import annotations

import asyncio
import struct

import grpc
from hpack import Encoder
from tritonclient.grpc import service_pb2 as pb

from naiad.frontends.grpc.lean import FRAMES, Connection, LeanServer, limits_for
from naiad.frontends.grpc.options import GrpcOptions
from naiad.frontends.http2.frames import literal
from tests.http2_frames import frame

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
PATH = "/inference.GRPCInferenceService/ModelInfer"


class Transport:
    def __init__(self) -> None:
        self.written = b""
        self.reading = True
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


class Inference:
    """Queues every ModelInfer and never answers: the futures show what the engine did with them."""

    def __init__(self) -> None:
        self.futures: list[asyncio.Future] = []

    def view(self, request: pb.ModelInferRequest) -> object:
        return object()  # (known at once: the engine's hot path)

    def begin(self, request: pb.ModelInferRequest, model: object, headers: dict, raw: object = None,
              answer: bool = False) -> tuple[asyncio.Future, None, None]:
        future = asyncio.get_running_loop().create_future()
        self.futures.append(future)
        return future, None, None


def _server(inference: Inference, options: GrpcOptions | None = None) -> LeanServer:
    """A lean server of ModelInfer alone, which ``inference`` serves."""
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: None,
                                                  request_deserializer=pb.ModelInferRequest.FromString)
    if options is None:
        return LeanServer({PATH: handler}, inference)  # type: ignore[arg-type]
    return LeanServer({PATH: handler}, inference, limits=limits_for(options), options=options)  # type: ignore[arg-type]


def _connected(server: LeanServer) -> tuple[Connection, Transport]:
    connection = Connection(server)
    transport = Transport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    return connection, transport


def _block(encoder: Encoder) -> bytes:
    """A ModelInfer call's request headers."""
    return encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", PATH), (":authority", "x"),
                           ("content-type", "application/grpc"), ("te", "trailers")])


def _body(message: pb.ModelInferRequest) -> bytes:
    """``message`` as a gRPC message: its prefix, then its bytes."""
    data = message.SerializeToString()
    return b"\0" + struct.pack(">I", len(data)) + data


def _connection() -> tuple[Connection, Transport, Inference]:
    inference = Inference()
    connection, transport = _connected(_server(inference))
    connection.data_received(PREFACE + frame(4, 0, 0, b""))
    return connection, transport, inference


def _infer(connection: Connection, encoder: Encoder, sid: int) -> None:
    connection.data_received(frame(1, 0x4, sid, _block(encoder)) +
                             frame(0, 0x1, sid, _body(pb.ModelInferRequest(model_name="m"))))


def test_reset_and_closed_connection_cancel_queued_model_infer() -> None:
    async def scenario() -> list[bool]:
        connection, _, inference = _connection()
        encoder = Encoder()
        _infer(connection, encoder, 1)
        _infer(connection, encoder, 3)
        _infer(connection, encoder, 5)
        connection.data_received(frame(3, 0, 3, struct.pack(">I", 0x8)))  # RST_STREAM CANCEL
        states = [f.cancelled() for f in inference.futures]
        connection.connection_lost(None)
        return states + [f.cancelled() for f in inference.futures]

    assert asyncio.run(scenario()) == [False, True, False, True, True, True]


def test_a_peer_that_does_not_read_is_not_read() -> None:
    async def scenario() -> tuple[bool, bool]:
        connection, transport, _ = _connection()
        connection.pause_writing()
        paused = transport.reading
        connection.resume_writing()
        return paused, transport.reading

    assert asyncio.run(scenario()) == (False, True)


class Failing(Inference):
    """Raises what no handler expects for model "boom": a bug in decoding, say."""

    def begin(self, request: pb.ModelInferRequest, model: object, headers: dict, raw: object = None,
              answer: bool = False) -> tuple[asyncio.Future, None, None]:
        if request.model_name == "boom":
            raise RuntimeError("boom")
        return super().begin(request, model, headers, raw, answer)


def test_an_unexpected_error_fails_its_call_not_the_connection() -> None:
    async def scenario() -> tuple[bytes, bool, int]:
        inference = Failing()
        connection, transport = _connected(_server(inference))
        connection.data_received(PREFACE + frame(4, 0, 0, b""))
        encoder = Encoder()
        _infer(connection, encoder, 1)  # a bystander, queued
        connection.data_received(frame(1, 0x4, 3, _block(encoder)) +
                                 frame(0, 0x1, 3, _body(pb.ModelInferRequest(model_name="boom"))))
        _infer(connection, encoder, 5)  # the connection still takes calls
        return transport.written, transport.closed, len(inference.futures)

    written, closed, queued = asyncio.run(scenario())
    assert not closed and queued == 2
    assert literal(b"grpc-status", b"13") + literal(b"grpc-message", b"RuntimeError: boom") in written


def _written(data: bytes) -> list[tuple[int, int, bytes]]:
    out = []
    while data:
        length = int.from_bytes(data[:3], "big")
        out.append((data[3], int.from_bytes(data[5:9], "big"), data[9:9 + length]))
        data = data[9 + length:]
    return out


def test_a_large_message_sent_before_the_client_read_our_settings_arrives_whole() -> None:
    """The wire of the lean bomb test's 60 s stall under front-end processes, with the engine's default options:
    the client sends its first 65,535 bytes on the default window before it reads our SETTINGS (a smaller
    SETTINGS_INITIAL_WINDOW_SIZE), each frame read on its own, then acknowledges them. The windows the server
    opens must let the client send the whole message as the client counts them."""
    async def scenario() -> tuple[int, int, int]:
        inference = Inference()
        connection, transport = _connected(_server(inference, GrpcOptions()))
        body = _body(pb.ModelInferRequest(model_name="m", raw_input_contents=[bytes(900_000)]))
        connection.data_received(PREFACE + frame(4, 0, 0, b"") + frame(1, 0x4, 1, _block(Encoder())))
        sent = 0
        for size in (16384, 16384, 16384, 16383):  # the default window, as the client frames it
            connection.data_received(frame(0, 0, 1, body[sent:sent + size]))
            sent += size
        connection.data_received(frame(4, 0x1, 0, b""))  # SETTINGS ACK
        window = 65535 - sent  # the client's count: the default, our SETTINGS' deltas, the stream's updates
        initial = 65535
        for kind, sid, payload in _written(transport.written):
            if kind == 4 and payload:
                for at in range(0, len(payload), 6):
                    key, value = struct.unpack_from(">HI", payload, at)
                    if key == 4:  # (a second SETTINGS: the window grown for messages this large)
                        window += value - initial
                        initial = value
            elif kind == 8 and sid == 1:
                window += struct.unpack(">I", payload)[0]
        granted = window
        while sent < len(body) and window > 0:
            size = min(window, 16384, len(body) - sent)
            connection.data_received(frame(0, 0x1 if sent + size == len(body) else 0, 1, body[sent:sent + size]))
            sent += size
            window -= size
        return granted, len(body) - 65535, len(inference.futures)

    granted, rest, queued = asyncio.run(scenario())
    assert granted >= rest and queued == 1  # (more when the client also read the window grown for the next)


class Keeping(Inference):
    """Also keeps each ModelInfer's request and raw tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[pb.ModelInferRequest, object]] = []

    def begin(self, request: pb.ModelInferRequest, model: object, headers: dict, raw: object = None,
              answer: bool = False) -> tuple[asyncio.Future, None, None]:
        self.requests.append((request, raw))
        return super().begin(request, model, headers, raw, answer)


def _placing(window: int, options: GrpcOptions | None = None) -> tuple[Connection, Transport, Keeping]:
    """A connection whose client acknowledged our SETTINGS, with stream windows grown to ``window`` (as for big
    messages: ``budget.Windows``)."""
    inference = Keeping()
    connection, transport = _connected(_server(inference, options))
    connection.data_received(PREFACE + frame(4, 0, 0, b"") + frame(4, 0x1, 0, b""))
    connection.h2.settle(window, 16)
    return connection, transport, inference


def _read(connection: Connection, wire: bytes, chunk: int = 1 << 20) -> tuple[int, set[int]]:
    """What the transport does with a BufferedProtocol: read (at most ``chunk`` bytes at a time) into
    ``get_buffer``'s memory, then ``buffer_updated``. Returns how many bytes went elsewhere than the connection's
    scratch, and the ids of the objects they went to."""
    placed, where = 0, set()
    at = 0
    while at < len(wire):
        buffer = connection.get_buffer(65536)
        n = min(len(buffer), len(wire) - at, chunk)
        buffer[:n] = wire[at:at + n]
        if buffer.obj is not connection.scratch.obj:
            placed += n
            where.add(id(buffer.obj))
        connection.buffer_updated(n)
        at += n
    return placed, where


def test_a_big_unary_message_is_read_straight_to_memory_of_its_own() -> None:
    """Past the first read (into the connection's scratch), the rest of a big message goes from the socket to the
    call's own memory, where the tensors are read from: no copy from the transport's buffer, none to join."""
    async def scenario() -> tuple[int, set[int], Keeping, bytes]:
        connection, _, inference = _placing(2 << 20, GrpcOptions())
        tensor = bytes(range(256)) * 4096  # 1 MiB
        body = _body(pb.ModelInferRequest(model_name="m", raw_input_contents=[tensor]))
        # As grpc-core sends it once the window has grown: in DATA frames as large as we allow (1 MiB).
        half = len(body) // 2
        wire = frame(1, 0x4, 1, _block(Encoder())) + frame(0, 0, 1, body[:half]) + frame(0, 0x1, 1, body[half:])
        placed, where = _read(connection, wire, chunk=200_000)
        return placed, where, inference, tensor

    placed, where, inference, tensor = asyncio.run(scenario())
    ((request, raw),) = inference.requests
    assert request.model_name == "m" and bytes(raw[0]) == tensor  # type: ignore[index]
    # All but the first read (into the scratch) went in place, to the memory the tensor is read from: the second
    # frame's header was read alone, and its payload after it.
    assert placed >= len(tensor) - FRAMES
    assert where == {id(raw[0].obj)}  # type: ignore[index]


def test_a_second_message_after_a_placed_one_is_refused_as_before() -> None:
    async def scenario() -> tuple[bytes, int]:
        connection, transport, inference = _placing(1 << 20)
        body = _body(pb.ModelInferRequest(model_name="m", raw_input_contents=[bytes(300_000)]))
        _read(connection, frame(1, 0x4, 1, _block(Encoder())) + frame(0, 0, 1, body) +
              frame(0, 0x1, 1, body[:100_000]))
        return transport.written, len(inference.requests)

    written, queued = asyncio.run(scenario())
    assert queued == 0
    assert literal(b"grpc-status", b"12") in written and b"Expected exactly one request message" in written


def test_a_placed_call_the_client_resets_stops_shaping_the_reads() -> None:
    """While a placed message has more to come, reads stop at the next frame's header; once its call is reset the
    connection reads whole chunks again (a call left in ``filling`` would cost a read per frame for good)."""
    async def scenario() -> tuple[int, int, int]:
        connection, _, _ = _placing(1 << 20)
        body = _body(pb.ModelInferRequest(model_name="m", raw_input_contents=[bytes(500_000)]))
        _read(connection, frame(1, 0x4, 1, _block(Encoder())) + frame(0, 0, 1, body[:200_000]))  # half, one frame
        between = len(connection.get_buffer(65536))
        connection.data_received(frame(3, 0, 1, struct.pack(">I", 0x8)))  # RST_STREAM CANCEL
        return between, len(connection.get_buffer(65536)), len(connection.filling)

    between, after, filling = asyncio.run(scenario())
    assert between == 9 and after == FRAMES and filling == 0
