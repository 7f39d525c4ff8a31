"""Tracing that any client switches on (POST /v2/trace/setting) must not hold every trace in memory until the
setting changes: the server's memory stays flat under tens of thousands of traced requests, the traces reach the
trace file while the setting is still in force, and none is lost."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import psutil

from tests import onnx_graphs
from tests.server import RunningServer

WARMUP = 5_000
TRACED = 60_000
PIPELINE = 200
_BODY = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}]}).encode()


def _requests(port: int, count: int) -> None:
    """``count`` infer requests, pipelined ``PIPELINE`` at a time on one connection; every answer must be 200."""
    request = (b"POST /v2/models/ident/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(_BODY), _BODY))
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        buffer = b""
        sent = 0
        while sent < count:
            batch = min(PIPELINE, count - sent)
            sock.sendall(request * batch)
            sent += batch
            answered = 0
            while answered < batch:
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    data = sock.recv(1 << 20)
                    assert data, "the server closed the connection"
                    buffer += data
                    continue
                head = buffer[:end].decode("latin-1")
                assert head.startswith("HTTP/1.1 200"), head
                length = next(int(line.split(":", 1)[1]) for line in head.split("\r\n")
                              if line.lower().startswith("content-length:"))
                while len(buffer) < end + 4 + length:
                    data = sock.recv(1 << 20)
                    assert data, "the server closed the connection"
                    buffer += data
                buffer = buffer[end + 4 + length:]
                answered += 1


def _traces(path: Path) -> list[dict]:
    """Every trace header written so far: the file and any numbered files beside it."""
    headers = []
    for file in [path, *sorted(path.parent.glob(path.name + ".*"))]:
        text = file.read_text()
        if file == path and not text.endswith("]"):
            text += "]"  # the array is still open while its setting is in force
        headers += [entry for entry in json.loads(text) if "model_name" in entry]
    return headers


def test_traced_requests_keep_memory_flat_and_reach_the_file(tmp_path: Path) -> None:
    onnx_graphs.write(tmp_path / "repo", "ident", onnx_graphs.identity("TYPE_FP32", [-1]), """
        name: "ident"
        backend: "onnxruntime"
        input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
        output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
    """)
    trace_file = tmp_path / "trace.json"
    # The operator names the file (clients can't); tracing itself stays off until a client switches it on.
    server = RunningServer([tmp_path / "repo"], f"--trace-config=triton,file={trace_file}")
    try:
        setting = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1", "log_frequency": "0"}
        status, _, body = server.request("POST", "/v2/trace/setting", json.dumps(setting),
                                         {"Content-Type": "application/json"})
        assert status == 200, body
        process = psutil.Process(server.proc.pid)
        _requests(server.http_port, WARMUP)
        warm = process.memory_info().rss
        started = time.monotonic()
        _requests(server.http_port, TRACED)
        elapsed = time.monotonic() - started
        grown = process.memory_info().rss - warm
        # Held in memory, 60k traces take ~36 MB (~600 B each); bounded, the growth is the allocator's noise.
        assert grown < 12 << 20, f"RSS grew {grown / 2**20:.1f} MiB over {TRACED} traced requests ({elapsed:.1f} s)"
        # Written while the setting is still in force, not only when it changes.
        assert trace_file.exists() and len(_traces(trace_file)) >= WARMUP + TRACED - 5_000, \
            "the traces stay in memory until the setting changes"
        off = {"trace_level": ["OFF"]}
        status, _, body = server.request("POST", "/v2/trace/setting", json.dumps(off),
                                         {"Content-Type": "application/json"})
        assert status == 200, body
        traces = _traces(trace_file)
        assert len(traces) == WARMUP + TRACED, "a trace was lost"
        assert len({t["id"] for t in traces}) == len(traces)
    finally:
        server.stop()
