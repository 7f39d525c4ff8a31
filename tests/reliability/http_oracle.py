"""The oracle and the runner the fuzzers share: an HTTP case, how its answer is judged, a client that sends cases
(kept-alive connections, or raw sockets for malformed HTTP), health checks between batches, and the shared-memory
region the fuzz servers register.

The oracle: every case gets an answer within the timeout; a refusal has a JSON ``{"error": ...}`` that says
something; a 5xx is allowed only where real Triton 2.51 answers a 5xx for the same fault (its JSON parser's
INTERNAL errors, recorded in tests/golden/triton-2.51, an unsupported compression, load/unload outside explicit
mode, and the like) - any other 5xx is a server fault.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.reliability.batches import in_batches

# Triton answers these client faults with a 5xx itself (rapidjson's errors are INTERNAL): parity, not a bug.
TRITON_5XX = {
    500: ("Unable to parse", "Unable to set", "failed to parse the request JSON buffer", "failed to get request params",
          "attempt to access JSON", "Unable to open shared memory region", "Invalid shared memory region",
          "shared memory size specified with the request for output", "failed to load '"),
    501: ("Unsupported compression type", "HTTP end point doesn't support models with decoupled transaction policy"),
    503: ("explicit model load / unload is not allowed if polling is enabled", "Request timeout expired"),
}


def bare(message: str) -> str:
    """A message without Triton's ``[request id: ...] `` prefix."""
    if message.startswith("[request id: "):
        return message.split("] ", 1)[-1]
    return message


def explained(message: str, phrases: tuple[str, ...]) -> bool:
    """Whether the message is one of ``phrases`` (maybe after a request id, or as an ensemble step's error)."""
    return bare(message).startswith(phrases) or message.endswith(phrases)


@dataclass
class HttpCase:
    kind: str
    method: str = "POST"
    path: str = "/"
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    raw: bytes | None = None  # sent as-is over a fresh socket: malformed HTTP
    wait: bool = True  # False: a request cut short, the client leaves without waiting for an answer

    def describe(self) -> str:
        if self.raw is not None:
            return f"[{self.kind}] raw {self.raw[:300]!r}"
        return f"[{self.kind}] {self.method} {self.path} headers={self.headers} body={self.body[:300]!r}"


@dataclass
class Outcome:
    case: HttpCase
    status: int | None  # None: no answer (the server closed the connection, or the timeout passed)
    error: str | None
    seconds: float
    problem: str | None  # None when the answer is acceptable


# A region the fuzz servers register (``registered_region``): shared-memory cases can hit it.
SHM_REGION = "fuzz_region"
SHM_SIZE = 4096


@contextlib.contextmanager
def registered_region(host: str, port: int) -> Iterator[None]:
    """``SHM_REGION``: a /dev/shm file of ``SHM_SIZE`` bytes registered with the server, unlinked afterwards."""
    key = f"/naiad-fuzz-{os.getpid()}-{port}"
    path = Path("/dev/shm") / key[1:]
    path.write_bytes(b"\0" * SHM_SIZE)
    try:
        conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("POST", f"/v2/systemsharedmemory/region/{SHM_REGION}/register",
                     json.dumps({"key": key, "offset": 0, "byte_size": SHM_SIZE}))
        response = conn.getresponse()
        assert response.status == 200, response.read()
        response.read()
        conn.close()
        yield
    finally:
        path.unlink(missing_ok=True)


def judge(case: HttpCase, status: int | None, body: bytes, seconds: float, timeout: float) -> Outcome:
    error = None
    problem = None
    if status is None:
        if case.raw is None or case.kind == "raw-chunked":
            problem = f"no answer (waited {seconds:.1f} s)"
        # Malformed HTTP may rightly go unanswered (the server waits for bytes it was promised): the server only
        # has to survive it, which the health checks between batches see.
        return Outcome(case, status, None, seconds, problem)
    if status >= 400 and case.method != "HEAD":
        try:
            doc = json.loads(body)
            error = doc.get("error") if isinstance(doc, dict) else None
        except ValueError:
            error = None
        if not isinstance(error, str) or not error.strip():
            problem = f"status {status} without a JSON error message: {body[:200]!r}"
    if status >= 500 and problem is None:
        if not explained(error, TRITON_5XX.get(status, ())):  # type: ignore[arg-type]
            problem = f"server error {status}: {error}"
    return Outcome(case, status, error, seconds, problem)


class HttpFuzzer:
    """Sends cases to one server, keeping a connection alive between them as a client would."""

    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def send(self, case: HttpCase) -> Outcome:
        started = time.monotonic()
        if case.raw is not None:
            status, body = self._raw(case.raw, case.wait)
        else:
            status, body = self._http(case)
        return judge(case, status, body, time.monotonic() - started, self.timeout)

    def _http(self, case: HttpCase) -> tuple[int | None, bytes]:
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self.conn.putrequest(case.method, case.path, skip_accept_encoding=True)
                for name, value in case.headers.items():
                    self.conn.putheader(name, value)
                if "Content-Length" not in case.headers:
                    self.conn.putheader("Content-Length", str(len(case.body)))
                self.conn.endheaders(case.body)
                response = self.conn.getresponse()
                body = response.read()
                if response.will_close:
                    self.close()
                return response.status, body
            except socket.timeout:
                self.close()
                return None, b""
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                self.close()
                # A kept-alive connection the server closed after the previous answer: one retry on a new one.
                if attempt == 0 and isinstance(exc, (http.client.RemoteDisconnected, BrokenPipeError)):
                    continue
                return None, b""
            except http.client.HTTPException:
                self.close()
                return None, b""
        return None, b""

    def _raw(self, data: bytes, wait: bool) -> tuple[int | None, bytes]:
        """Send, then read until the server closes, stays quiet for a quarter second after answering, or sends
        nothing for 3 s (it may rightly wait for bytes a malformed request promised). No half-close: to naiad a
        client's FIN means it went away, so its queued and running requests are cancelled (Triton would answer a
        half-closed client; a full close looks the same on the wire, and cancelling is what protects the server
        under load)."""
        received = b""
        started = time.monotonic()
        deadline = started + self.timeout
        with socket.create_connection((self.host, self.port), timeout=self.timeout) as sock:
            try:
                sock.sendall(data)
                while wait and time.monotonic() < deadline:
                    sock.settimeout(0.25 if received else max(min(deadline, started + 3.0) - time.monotonic(), 0.01))
                    try:
                        chunk = sock.recv(65536)
                    except socket.timeout:
                        break
                    if not chunk:
                        break
                    received += chunk
            except OSError:
                pass
        if not received.startswith(b"HTTP/1."):
            return None, received
        # The last answer on the connection is judged (pipelined cases answer more than once).
        heads = received.split(b"HTTP/1.")
        last = heads[-1]
        try:
            status = int(last[2:5])
        except ValueError:
            return None, received
        body = last.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in last else b""
        return status, body


def healthy(host: str, port: int, timeout: float = 10.0) -> str | None:
    """None if live, ready and still echoing a tensor correctly, as tritonclient sees it; else what is wrong."""
    try:
        with httpclient.InferenceServerClient(f"{host}:{port}", connection_timeout=timeout,
                                              network_timeout=timeout) as client:
            if not client.is_server_live():
                return "not live"
            if not client.is_server_ready():
                return "not ready"
            tensor = httpclient.InferInput("INPUT0", [3], "FP32")
            tensor.set_data_from_numpy(np.array([1, 2, 3], dtype=np.float32))
            result = client.infer("echo", [tensor])
            if result.as_numpy("OUTPUT0").tolist() != [1.0, 2.0, 3.0]:
                return f"echo answered {result.get_response()}"
    except (InferenceServerException, OSError, ValueError) as exc:
        return f"health check failed: {exc!r}"
    return None


def run(host: str, port: int, cases: list[HttpCase], batch: int = 50, timeout: float = 10.0,
        alive: Callable[[], bool] = lambda: True, parallel: int = 1) -> tuple[list[Outcome], list[str]]:
    """Every case's outcome, and what went wrong with the server between batches (crash, not live/ready).
    ``parallel`` > 1 sends each batch over that many connections at once (cases meet each other in the server)."""
    return in_batches([HttpFuzzer(host, port, timeout) for _ in range(parallel)], cases, batch, alive,
                      lambda: healthy(host, port, timeout))
