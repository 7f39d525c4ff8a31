"""File descriptors and fairness (issue 19, item 6), attacked with raw sockets and real clients:

- under a low open-file limit, connections past what the limit affords are answered 503, never reset (before:
  the 1,024 cap never engaged, accept() failed and libuv reset the clients);
- sockets that never send the HTTP/2 preface are closed by --grpc-preface-timeout (before: all stayed open);
- one address can't take every slot: past --http-max-connections-per-address / --grpc-max-connections-per-address
  it gets 503 / UNAVAILABLE while another address is served, and its silent sockets are closed by
  --http-first-request-timeout.
"""

from __future__ import annotations

import http.client
import resource
import socket
import time

import grpc
import psutil
from hpack import Encoder

from tests.http2_frames import PREFACE, frame
from tests.server import EXAMPLES, RunningServer

HEADERS, SETTINGS = 1, 4
END_STREAM, END_HEADERS = 0x1, 0x4


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(5)
    sock.connect(("127.0.0.1", port))
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    """The server closed it: EOF (after whatever it sent), or a reset."""
    sock.setblocking(False)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def _status(port: int, source: str = "127.0.0.1") -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5, source_address=(source, 0))
    try:
        connection.request("GET", "/v2/health/live")
        return connection.getresponse().status
    finally:
        connection.close()


def _low_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


def test_under_a_low_open_file_limit_the_excess_is_answered_503_not_reset() -> None:
    # 256 descriptors, 64 kept for the rest: 96 connections for each of the HTTP and gRPC ports.
    server = RunningServer([EXAMPLES], "--http-first-request-timeout=0", preexec_fn=_low_nofile)
    sockets = []
    try:
        assert "connections per port lowered to fit it: HTTP 96, GRPC 96" in server.log()
        sockets = [_connect(server.http_port) for _ in range(150)]  # idle: 96 held, the rest refused
        time.sleep(0.5)
        refused = sum(_closed_by_server(sock) for sock in sockets)
        assert refused == 150 - 96
        statuses = [_status(server.http_port) for _ in range(10)]  # a reset would raise here
        assert statuses == [503] * 10
        for sock in sockets:
            sock.close()
        sockets = []
        deadline = time.monotonic() + 5
        while _status(server.http_port) != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert server.proc.poll() is None
    finally:
        for sock in sockets:
            sock.close()
        server.stop()


def _fds(process: psutil.Process) -> int:
    """The server's descriptors: its own and its children's (with --frontend-processes N, the front ends hold the
    connections)."""
    return sum(p.num_fds() for p in (process, *process.children()))


def test_grpc_sockets_that_never_send_the_preface_are_closed() -> None:
    server = RunningServer([EXAMPLES], "--grpc-preface-timeout=1", "--grpc-engine=lean")
    process = psutil.Process(server.proc.pid)
    try:
        before = _fds(process)
        sockets = [_connect(server.grpc_port) for _ in range(200)]  # 200 of them: under the per-address cap
        time.sleep(0.5)
        assert _fds(process) >= before + 190  # held open meanwhile
        time.sleep(1.5)
        assert all(_closed_by_server(sock) for sock in sockets)
        assert _fds(process) < before + 10
        for sock in sockets:
            sock.close()
    finally:
        server.stop()


def test_one_address_cannot_take_every_http_slot() -> None:
    server = RunningServer([EXAMPLES], "--http-max-connections-per-address=20", "--http-first-request-timeout=1")
    sockets = []
    try:
        sockets = [_connect(server.http_port, "127.0.0.2") for _ in range(25)]
        time.sleep(0.3)
        refused = [sock for sock in sockets if _closed_by_server(sock)]
        assert len(refused) == 5
        connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=5,
                                                source_address=("127.0.0.2", 0))
        connection.request("GET", "/v2/health/live")
        response = connection.getresponse()
        assert response.status == 503 and b"--http-max-connections-per-address" in response.read()
        assert _status(server.http_port, "127.0.0.3") == 200  # another address is served
        time.sleep(1.5)  # the 20 silent ones are closed by the first-request timeout
        assert all(_closed_by_server(sock) for sock in sockets)
        assert _status(server.http_port, "127.0.0.2") == 200
    finally:
        for sock in sockets:
            sock.close()
        server.stop()


def test_one_address_cannot_take_every_grpc_slot() -> None:
    server = RunningServer([EXAMPLES], "--grpc-max-connections-per-address=5", "--grpc-engine=lean")
    sockets = []
    try:
        for _ in range(5):  # five connections from 127.0.0.2 that did send the preface: admitted and held
            sock = _connect(server.grpc_port, "127.0.0.2")
            sock.sendall(PREFACE + frame(SETTINGS, 0, 0, b""))
            # Its SETTINGS back: taken and counted. (Front-end processes accept from queues of their own, so a
            # later connection could otherwise be counted first and take this one's slot.)
            assert sock.recv(65536)
            sockets.append(sock)
        extra = _connect(server.grpc_port, "127.0.0.2")
        sockets.append(extra)
        block = Encoder().encode([(":method", "POST"), (":scheme", "http"), (":authority", "x"),
                                  (":path", "/inference.GRPCInferenceService/ServerLive"),
                                  ("content-type", "application/grpc"), ("te", "trailers")])
        extra.sendall(PREFACE + frame(SETTINGS, 0, 0, b"") + frame(HEADERS, END_HEADERS, 1, block)
                      + frame(0, END_STREAM, 1, b"\0\0\0\0\0"))
        answer = b""
        while True:  # the refusal is an answer, then the connection closes
            chunk = extra.recv(65536)
            if not chunk:
                break
            answer += chunk
        assert b"--grpc-max-connections-per-address" in answer  # in grpc-message, UNAVAILABLE's trailers
        with grpc.insecure_channel(server.grpc_url) as channel:  # 127.0.0.1 is another address
            live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")
            assert live(b"", timeout=10) is not None
        assert not any(_closed_by_server(sock) for sock in sockets[:5])
    finally:
        for sock in sockets:
            sock.close()
        server.stop()


def test_a_grpc_connection_without_calls_gets_goaway_after_the_idle_timeout() -> None:
    server = RunningServer([EXAMPLES], "--grpc-idle-timeout=1", "--grpc-engine=lean")
    try:
        sock = _connect(server.grpc_port)
        sock.sendall(PREFACE + frame(SETTINGS, 0, 0, b""))
        start = time.monotonic()
        received = b""
        while chunk := sock.recv(65536):  # SETTINGS, its ack, then GOAWAY and the close
            received += chunk
        waited = time.monotonic() - start
        assert 0.9 < waited < 3 and frame(7, 0, 0, b"")[3:5] in received  # a GOAWAY frame (type 7) came
        sock.close()
        with grpc.insecure_channel(server.grpc_url) as channel:  # clients reconnect on their next call
            live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")
            assert live(b"", timeout=10) is not None
            time.sleep(2)
            assert live(b"", timeout=10) is not None
    finally:
        server.stop()
