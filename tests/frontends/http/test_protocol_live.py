"""The HTTP/1.1 limits on a live server, through raw sockets: a pipeline past the in-flight cap is answered in
order, an idle connection is closed, an oversized URL gets 414 and one connection too many gets 503."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest

from tests.frontends.http.test_protocol_limits import parse_responses
from tests.server import EXAMPLES, RunningServer


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    running = RunningServer([EXAMPLES], "--http-keepalive-timeout=1", "--http-max-pipelined-requests=2",
                            "--http-max-connections=3", "--allow-grpc=false", "--allow-metrics=false")
    yield running
    running.stop()


def _connect(server: RunningServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.http_port), timeout=10)


def _read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _infer(i: int) -> bytes:
    body = json.dumps({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [float(i)] * 4},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [1.0] * 4}]}).encode()
    return (b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


def test_a_pipeline_past_the_cap_is_answered_in_order_then_the_idle_connection_closes(server: RunningServer) -> None:
    with _connect(server) as sock:
        sock.sendall(b"".join(_infer(i) for i in range(40)))  # one write; at most two in flight on the server
        started = time.monotonic()
        data = b""
        while len(parse_responses(data)) < 40:
            chunk = sock.recv(65536)
            assert chunk, f"closed after {len(parse_responses(data))} answers"
            data += chunk
        answered = time.monotonic()
        responses = parse_responses(data)
        assert [r[0] for r in responses] == [200] * 40
        sums = [json.loads(r[2])["outputs"][0]["data"][0] for r in responses]
        assert sums == [i + 1.0 for i in range(40)]
        assert _read_until_closed(sock) == b""  # then nothing more: the keep-alive timeout closes it
        idle = time.monotonic() - answered
        assert 0.8 < idle < 8, (started, idle)


def test_a_connection_that_never_sends_is_closed(server: RunningServer) -> None:
    with _connect(server) as sock:
        started = time.monotonic()
        assert _read_until_closed(sock) == b""
        assert 0.8 < time.monotonic() - started < 8


def test_a_long_url_is_answered_414(server: RunningServer) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET /v2/health/ready?" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        [response] = parse_responses(_read_until_closed(sock))
    assert response[0] == 414
    assert json.loads(response[2]) == {
        "error": "request URL exceeds the maximum allowed length of 8192 bytes (--http-max-url-size)"}


def test_one_connection_too_many_is_answered_503(server: RunningServer) -> None:
    held = [_connect(server) for _ in range(3)]
    try:
        for sock in held:  # half a request head: under the header timeout (60 s), not the 1 s keep-alive one
            sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\n")
        time.sleep(0.2)
        with _connect(server) as extra:
            extra.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
            [response] = parse_responses(_read_until_closed(extra))
        assert response[0] == 503 and b"--http-max-connections" in response[2]
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    status, _, _ = server.request("GET", "/v2/health/ready")  # a place frees up once one closes
    assert status == 200
