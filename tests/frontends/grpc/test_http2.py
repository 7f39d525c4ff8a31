"""HTTP/2 as a raw client speaks it, against both engines: what tritonclient's C-core rarely sends but any peer
may (PING, padding, CONTINUATION, RST_STREAM mid-call), and GOAWAY when the server stops."""

from __future__ import annotations

import signal
import socket
import struct

import numpy as np
import pytest
from hpack import Decoder, Encoder
from tritonclient.grpc import service_pb2 as pb

from tests.http2_frames import frame
from tests.server import EXAMPLES, RunningServer

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, CONTINUATION = 0, 1, 3, 4, 6, 7, 9
END_STREAM, END_HEADERS, PADDED = 0x1, 0x4, 0x8


class RawClient:
    def __init__(self, url: str) -> None:
        host, port = url.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.buf = b""
        self.encoder, self.decoder = Encoder(), Decoder()
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0, b""))

    def read(self) -> tuple[int, int, int, bytes]:
        while True:
            if len(self.buf) >= 9:
                length = int.from_bytes(self.buf[:3], "big")
                if len(self.buf) >= 9 + length:
                    head, payload = self.buf[:9], self.buf[9:9 + length]
                    self.buf = self.buf[9 + length:]
                    return head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF, payload
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk

    def until(self, kind: int, stream: int | None = None) -> tuple[int, bytes]:
        """The flags and payload of the next frame of this kind (on this stream), acking the server's SETTINGS."""
        while True:
            got, flags, sid, payload = self.read()
            if got == SETTINGS and not flags & 1:
                self.sock.sendall(frame(SETTINGS, 1, 0, b""))
            if got == kind and (stream is None or sid == stream):
                return flags, payload

    def request_headers(self, path: str) -> bytes:
        return self.encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                    (":authority", "localhost"), ("content-type", "application/grpc"),
                                    ("te", "trailers")])

    def trailers(self, stream: int) -> dict[str, str]:
        """The call's closing header block, decoded (the response headers block comes first unless trailers-only)."""
        while True:
            flags, payload = self.until(HEADERS, stream)
            fields = dict(self.decoder.decode(payload))
            if flags & END_STREAM:
                return fields

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw(grpc_server: RunningServer):
    client = RawClient(grpc_server.grpc_url)
    yield client
    client.close()


def test_ping_is_acknowledged_with_its_payload(raw: RawClient) -> None:
    raw.sock.sendall(frame(PING, 0, 0, b"naiad-42"))
    flags, payload = raw.until(PING)
    assert flags & 1 and payload == b"naiad-42"


def _lean(server: RunningServer) -> bool:
    return "lean" in server.proc.args


@pytest.mark.parametrize("padded", [False, True])
def test_headers_split_over_continuation(raw: RawClient, grpc_server: RunningServer, padded: bool) -> None:
    if padded and not _lean(grpc_server):
        pytest.skip("grpcio 1.85's C-core answers a padded HEADERS frame with INTERNAL 'Failed huffman decoding'")
    block = raw.request_headers("/inference.GRPCInferenceService/NoSuchMethod")
    first = b"\x07" + block[:2] + b"\0" * 7 if padded else block[:2]  # :method, :scheme (static indexes)
    raw.sock.sendall(frame(HEADERS, PADDED if padded else 0, 1, first) +
                     frame(CONTINUATION, END_HEADERS, 1, block[2:]) + frame(DATA, END_STREAM, 1, b"\0\0\0\0\0"))
    trailers = raw.trailers(1)
    assert (trailers["grpc-status"], trailers["grpc-message"]) == ("12", "Method not found!")  # UNIMPLEMENTED


@pytest.mark.parametrize("padded", [False, True])
def test_reset_call_leaves_the_connection_serving(raw: RawClient, grpc_server: RunningServer, padded: bool) -> None:
    if padded and not _lean(grpc_server):
        pytest.skip("grpcio 1.85's C-core does not answer a call whose DATA frame is padded")
    path = "/inference.GRPCInferenceService/ServerLive"
    raw.sock.sendall(frame(HEADERS, END_HEADERS, 1, raw.request_headers(path)) +
                     frame(RST_STREAM, 0, 1, struct.pack(">I", 0x8)))  # CANCEL before any message
    # ServerLiveRequest is empty: a zero-length message.
    message = b"\x03" + b"\0" * 5 + b"\0\0\0" if padded else b"\0" * 5
    raw.sock.sendall(frame(HEADERS, END_HEADERS, 3, raw.request_headers(path)) +
                     frame(DATA, END_STREAM | (PADDED if padded else 0), 3, message))
    _, payload = raw.until(DATA, 3)
    assert payload == b"\0\0\0\0\x02\x08\x01"  # ServerLiveResponse(live=True)
    assert raw.trailers(3)["grpc-status"] == "0"


@pytest.mark.parametrize("engine", ["grpcio", "lean"])
def test_stopping_server_sends_goaway(engine: str) -> None:
    server = RunningServer([EXAMPLES], "--grpc-engine", engine)
    try:
        client = RawClient(server.grpc_url)
        client.sock.sendall(frame(PING, 0, 0, b"12345678"))
        client.until(PING)  # the connection is up
        server.stop()
        _, payload = client.until(GOAWAY)
        assert int.from_bytes(payload[4:8], "big") == 0  # NO_ERROR
        client.close()
    finally:
        server.stop()


@pytest.mark.parametrize("engine", ["grpcio", "lean"])
def test_a_call_still_open_when_the_server_stops_may_end(engine: str) -> None:
    """After the drain, the stopping server's GOAWAY leaves the calls still open a moment to end, then closes: here a
    stream whose client half-closes only after the GOAWAY ends OK. The lean engine once closed the connection with
    the GOAWAY, which cut a stream whose last answers were still being written (on Python 3.12 and 3.13, whose
    wait_for returns a turn of the loop sooner, tests/reliability/test_sigterm.py failed that way)."""
    server = RunningServer([EXAMPLES], "--grpc-engine", engine)
    try:
        client = RawClient(server.grpc_url)
        message = pb.ModelInferRequest(model_name="add_sub")
        for name in ("INPUT0", "INPUT1"):
            message.inputs.add(name=name, datatype="FP32", shape=[4])
            message.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes())
        body = message.SerializeToString()
        path = "/inference.GRPCInferenceService/ModelStreamInfer"
        client.sock.sendall(frame(HEADERS, END_HEADERS, 1, client.request_headers(path)) +
                           frame(DATA, 0, 1, b"\0" + len(body).to_bytes(4, "big") + body))
        _, answer = client.until(DATA, 1)  # answered: nothing is in flight, the call stays open
        answered = pb.ModelStreamInferResponse.FromString(answer[5:])
        assert not answered.error_message and answered.infer_response.model_name == "add_sub"
        server.proc.send_signal(signal.SIGTERM)
        _, payload = client.until(GOAWAY)
        assert int.from_bytes(payload[4:8], "big") == 0  # NO_ERROR
        client.sock.sendall(frame(DATA, END_STREAM, 1, b""))
        assert client.trailers(1)["grpc-status"] == "0"
        assert server.proc.wait(10) == 0
        client.close()
    finally:
        server.stop()


# -- limits and malformed frames (the core's unit tests cover each case; these check the wiring, live) ---------

WINDOW_UPDATE = 8
FRAME_SIZE_ERROR, REFUSED_STREAM, ENHANCE_YOUR_CALM = 0x6, 0x7, 0xB


def _goaway_code(raw: RawClient) -> int:
    """The error code of the GOAWAY the server sends before closing."""
    _, payload = raw.until(GOAWAY)
    return int.from_bytes(payload[4:8], "big")


def _goaways_until_closed(raw: RawClient) -> list[int]:
    codes = []
    try:
        while True:
            kind, _, _, payload = raw.read()
            if kind == GOAWAY:
                codes.append(int.from_bytes(payload[4:8], "big"))
    except ConnectionError:
        return codes


def test_three_byte_window_update_is_a_frame_size_error(raw: RawClient, grpc_server: RunningServer) -> None:
    """Once an unhandled struct.error on lean; grpc-core closes the connection without a GOAWAY."""
    raw.sock.sendall(frame(WINDOW_UPDATE, 0, 0, b"\0\0\1"))
    codes = _goaways_until_closed(raw)  # and the server closes the connection
    if _lean(grpc_server):
        assert codes == [FRAME_SIZE_ERROR]


def test_metadata_over_the_header_list_limit_is_resource_exhausted(raw: RawClient) -> None:
    """grpc-core's answer to more than its 16 KiB hard metadata limit, on both engines."""
    block = raw.encoder.encode([(":method", "POST"), (":scheme", "http"), (":authority", "localhost"),
                                (":path", "/inference.GRPCInferenceService/ServerLive"),
                                ("content-type", "application/grpc"), ("te", "trailers"), ("x-big", "a" * 17000)],
                               huffman=False)
    raw.until(SETTINGS)  # acked: grpc-core enforces the limit it announced once the client has acked it
    raw.sock.sendall(frame(HEADERS, 0, 1, block[:16000]) +
                     frame(CONTINUATION, END_HEADERS, 1, block[16000:]) + frame(DATA, END_STREAM, 1, b"\0" * 5))
    trailers = raw.trailers(1)
    assert trailers["grpc-status"] == "8"  # RESOURCE_EXHAUSTED
    assert trailers["grpc-message"].startswith("received metadata size exceeds hard limit (")


def _only_lean(server: RunningServer) -> None:
    if not _lean(server):
        pytest.skip("grpc-core has its own stream refusals and flood defenses")


def test_lean_announces_its_limits(grpc_server: RunningServer) -> None:
    _only_lean(grpc_server)
    client = RawClient(grpc_server.grpc_url)
    try:
        while True:
            kind, flags, _, payload = client.read()
            if kind == SETTINGS and not flags & 1:
                break
        settings = dict(struct.unpack(">HI", payload[i:i + 6]) for i in range(0, len(payload), 6))
        # MAX_CONCURRENT_STREAMS (--grpc-max-concurrent-streams), MAX_HEADER_LIST_SIZE
        assert settings[3] == 1000 and settings[6] == 16384
    finally:
        client.close()


@pytest.mark.parametrize("engine", ["lean", "grpcio"])
def test_max_concurrent_streams_flag_reaches_both_engines(engine: str) -> None:
    server = RunningServer([EXAMPLES], "--grpc-engine", engine, "--grpc-max-concurrent-streams", "7")
    client = RawClient(server.grpc_url)
    try:
        while True:
            kind, flags, _, payload = client.read()
            if kind == SETTINGS and not flags & 1:
                break
        settings = dict(struct.unpack(">HI", payload[i:i + 6]) for i in range(0, len(payload), 6))
        assert settings[3] == 7
    finally:
        client.close()
        server.stop()


def test_lean_refuses_streams_past_the_limit(raw: RawClient, grpc_server: RunningServer) -> None:
    _only_lean(grpc_server)
    path = "/inference.GRPCInferenceService/ModelStreamInfer"  # open until the client ends it
    raw.sock.sendall(b"".join(frame(HEADERS, END_HEADERS, 1 + 2 * i, raw.request_headers(path)) for i in range(1001)))
    flags, payload = raw.until(RST_STREAM, 2001)
    assert int.from_bytes(payload, "big") == REFUSED_STREAM


def test_lean_rapid_reset_is_enhance_your_calm(raw: RawClient, grpc_server: RunningServer) -> None:
    _only_lean(grpc_server)
    path = "/inference.GRPCInferenceService/ModelStreamInfer"
    raw.sock.sendall(b"".join(frame(HEADERS, END_HEADERS, 1 + 2 * i, raw.request_headers(path)) +
                              frame(RST_STREAM, 0, 1 + 2 * i, struct.pack(">I", 0x8)) for i in range(1100)))
    assert _goaway_code(raw) == ENHANCE_YOUR_CALM


def test_lean_continuation_flood_is_enhance_your_calm(raw: RawClient, grpc_server: RunningServer) -> None:
    _only_lean(grpc_server)
    block = raw.request_headers("/inference.GRPCInferenceService/ServerLive")
    # Just past the 64 KiB cap, and nothing after it: the server reads all before it closes (no TCP reset).
    raw.sock.sendall(frame(HEADERS, 0, 1, block) + frame(CONTINUATION, 0, 1, b"\x82" * 16384) * 4)
    assert _goaway_code(raw) == ENHANCE_YOUR_CALM
