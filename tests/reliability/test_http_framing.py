"""HTTP framing on a live server, HTTP and SageMaker ports alike (issue 19, item 8): a HEAD answer carries no body
(before, it carried the GET's, which a keep-alive client read as the start of its next answer), and a request that
declares a body past --http-max-input-size (10 GiB, say) is answered 413 at once, before any of it is sent, and the
connection closed (before, nothing was answered until the whole body had arrived)."""

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
    running = RunningServer([EXAMPLES], "--allow-sagemaker=true", "--allow-grpc=false", "--allow-metrics=false",
                            env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "add_sub"})
    yield running
    running.stop()


def _port(server: RunningServer, which: str) -> int:
    return server.http_port if which == "http" else server.sagemaker_port


def _exchange(port: int, data: bytes, until: bytes | None = None, timeout: float = 10) -> bytes:
    """Send, then read until the server closes (or ``until`` has arrived)."""
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        while until is None or until not in received:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    return received


@pytest.mark.parametrize(("which", "path"), [("http", "/v2"), ("http", "/v2/models/add_sub/config"),
                                             ("sagemaker", "/invocations")])  # 405, with a JSON body
def test_head_answers_have_no_body(server: RunningServer, which: str, path: str) -> None:
    """A HEAD and then a GET on one connection: right after the HEAD answer's head comes the GET's answer."""
    head = b"HEAD %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode()
    get = b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path.encode()
    received = _exchange(_port(server, which), head + get)
    first, rest = received.split(b"\r\n\r\n", 1)
    length = int(first.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    assert rest.startswith(b"HTTP/1.1 "), rest[:80]  # not the body the GET will carry
    (status, _, body), = parse_responses(rest)
    assert int(first[9:12]) == status and len(body) == length  # the HEAD's Content-Length is the GET's


@pytest.mark.parametrize("which", ["http", "sagemaker"])
def test_a_huge_declared_body_is_refused_413_before_it_is_sent(server: RunningServer, which: str) -> None:
    path = b"/v2/models/add_sub/infer" if which == "http" else b"/invocations"
    started = time.monotonic()
    received = _exchange(_port(server, which), b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % (path, 10 * 2**30))  # and not a byte of the body
    (status, headers, body), = parse_responses(received)  # one answer, then the server closed the connection
    assert status == 413 and headers[b"connection"] == b"close"
    assert json.loads(body)["error"] == ("request body size of 10737418240 bytes exceeds the maximum allowed value of "
                                         "67108864 bytes. Use --http-max-input-size to increase the limit.")
    assert time.monotonic() - started < 5  # at once, not after a body timeout
    status, _, _ = server.request("GET", "/v2/health/ready")
    assert status == 200
