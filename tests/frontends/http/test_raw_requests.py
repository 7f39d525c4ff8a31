"""Requests framed the ways Triton's clients send them beyond the usual: a raw binary request (no JSON header,
the body is the model's one input) and a body framed by both Content-Length and chunked Transfer-Encoding.
Raw sockets and http.client against a running server."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator

import numpy as np
import pytest

from tests import onnx_graphs as g
from tests.server import RunningServer

IDENTITY = """
    name: "identity"
    platform: "onnxruntime_onnx"
    max_batch_size: 0
    input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }]
    output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("raw")
    g.write(repo, "identity", g.identity("TYPE_FP32", [4]), IDENTITY)
    running = RunningServer([repo])
    yield running
    running.stop()


def test_raw_binary_request_is_answered_in_binary(server: RunningServer) -> None:
    data = np.array([1.5, -2, 3, 4.25], dtype=np.float32)
    status, headers, body = server.request("POST", "/v2/models/identity/infer", data.tobytes(),
                                           {"Inference-Header-Content-Length": "0",
                                            "Content-Type": "application/octet-stream"})
    assert status == 200, body
    length = int(headers["inference-header-content-length"])  # binary with a JSON header, as Triton answers
    header = json.loads(body[:length])
    assert header["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [4],
                                  "parameters": {"binary_data_size": 16}}]
    np.testing.assert_array_equal(np.frombuffer(body[length:], dtype=np.float32), data)


def _exchange(server: RunningServer, raw: bytes, timeout: float = 10.0) -> bytes:
    """Send ``raw``; read until the server closes the connection (or the timeout passes)."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=timeout) as sock:
        sock.sendall(raw)
        received = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                return received
            received += chunk
        raise AssertionError(f"the server kept the connection open; got {received!r}")


def _infer_body() -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4],
                                   "data": [1, 2, 3, 4]}]}).encode()


@pytest.mark.parametrize("content_length", ["0", "5", "999999999"])
def test_content_length_beside_chunked_is_framed_by_the_chunks_then_closed(server: RunningServer,
                                                                           content_length: str) -> None:
    body = _infer_body()
    chunked = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (10, body[:10], len(body) - 10, body[10:])
    smuggled = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    raw = (b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: %s\r\nTransfer-Encoding: chunked\r\n\r\n%s%s" % (content_length.encode(), chunked,
                                                                             smuggled))
    received = _exchange(server, raw)
    head, _, rest = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), received
    assert b"\r\nconnection: close" in head.lower()
    assert json.loads(rest)["outputs"][0]["data"] == [1.0, 2.0, 3.0, 4.0]
    assert received.count(b"HTTP/1.1") == 1  # the request behind it was not read: the connection closed
    assert server.request("GET", "/v2/health/ready")[0] == 200


def test_chunked_body_is_still_bounded_by_the_input_limit(tmp_path_factory: pytest.TempPathFactory) -> None:
    repo = tmp_path_factory.mktemp("raw_limit")
    g.write(repo, "identity", g.identity("TYPE_FP32", [4]), IDENTITY)
    server = RunningServer([repo], "--http-max-input-size=1000")
    try:
        piece = b"x" * 600
        raw = (b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n" + (b"%x\r\n%s\r\n" % (len(piece), piece)) * 2 + b"0\r\n\r\n")
        received = _exchange(server, raw)
        assert received.startswith(b"HTTP/1.1 413 "), received  # as soon as the chunks pass the limit
        assert b"exceeds the maximum allowed value of 1000 bytes" in received
        assert server.request("GET", "/v2/health/ready")[0] == 200
    finally:
        server.stop()


def test_http_client_sending_both_headers_gets_its_answer(server: RunningServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    try:
        body = _infer_body()
        conn.putrequest("POST", "/v2/models/identity/infer")
        conn.putheader("Content-Length", str(len(body)))
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        conn.send(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
        resp = conn.getresponse()
        assert resp.status == 200
        assert json.loads(resp.read())["outputs"][0]["data"] == [1.0, 2.0, 3.0, 4.0]
        assert resp.getheader("Connection") == "close"
    finally:
        conn.close()
