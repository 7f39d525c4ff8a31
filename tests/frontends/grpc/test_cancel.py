"""A ModelInfer the client gives up on while it waits in the queue never runs, on both gRPC engines: cancelled by
the client (RST_STREAM CANCEL) or by its connection closing; so does an HTTP request whose connection closes. It
counts as a failure for the CANCELED reason. With the Python backend's default pipeline depth the waiting request
has already left naiad's scheduler for the worker process, which drops it there; with depth 1 the scheduler does."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from hpack import Encoder
from tritonclient.grpc import service_pb2 as pb

from tests.http2_frames import frame
from tests.models import write_model
from tests.server import RunningServer

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@pytest.fixture(scope="module", params=[("grpcio", 1), ("lean", 1), ("grpcio", None), ("lean", None)],
                ids=["grpcio-depth1", "lean-depth1", "grpcio-default", "lean-default"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    engine, depth = request.param
    repo = tmp_path_factory.mktemp("cancel_models")
    # One instance: while one request sleeps, the next waits in the queue. Each execution leaves a line.
    write_model(repo, "slow", """
        name: "slow"
        backend: "python"
        instance_group [ { count: 1, kind: KIND_CPU } ]
        input [ { name: "IN", data_type: TYPE_INT32, dims: [ 1 ] } ]
        output [ { name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
    """, """
        import time
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def initialize(self, args):
                self.log = args["model_repository"] + "/executed"

            def execute(self, requests):
                out = []
                for r in requests:
                    value = r.inputs()[0].as_numpy()
                    with open(self.log, "a") as f:
                        f.write(f"{int(value[0])}\\n")
                    time.sleep(1.0 if value[0] < 100 else 0)
                    out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
                return out
    """)
    # Pipeline depth 1: the next request waits in naiad's scheduler; by default, in the worker process's socket.
    flags = [] if depth is None else [f"--backend-config=python,pipeline-depth={depth}"]
    running = RunningServer([repo], "--grpc-engine", engine, *flags)
    running.repo = repo  # type: ignore[attr-defined]
    yield running
    running.stop()


def _inputs(value: int) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
    return [tensor]


def _executed(server: RunningServer) -> list[int]:
    log = Path(server.repo) / "slow" / "executed"  # type: ignore[attr-defined]
    return [int(line) for line in log.read_text().split()] if log.exists() else []


def _metric(server: RunningServer, name: str, label: str = "") -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    for line in text.splitlines():
        if line.startswith(name + "{") and 'model="slow"' in line and label in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _canceled(server: RunningServer) -> float:
    return _metric(server, "nv_inference_request_failure", 'reason="CANCELED"')


def _wait_pending(server: RunningServer, count: int) -> None:
    """Until the model holds ``count`` requests (queued or running): timing-proof on a busy machine."""
    deadline = time.monotonic() + 10
    while _metric(server, "nv_inference_pending_request_count") != count:
        assert time.monotonic() < deadline, f"never {count} pending"
        time.sleep(0.02)


def _settle(server: RunningServer, client: grpcclient.InferenceServerClient, done: threading.Event,
            expected_failures: int) -> pb.ModelStatistics:
    """After the running request answered, the queue moves on: wait for the statistics to say so."""
    assert done.wait(10), "the running request never answered"
    deadline = time.monotonic() + 10
    while True:
        stats = client.get_inference_statistics("slow", as_json=False).model_stats[0]
        if stats.inference_stats.fail.count >= expected_failures or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def test_cancelled_queued_request_never_runs(server: RunningServer) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        before = client.get_inference_statistics("slow", as_json=False).model_stats[0].inference_stats
        ran_before = _executed(server)
        done = threading.Event()
        client.async_infer("slow", _inputs(1), lambda result, error: done.set())  # runs for 1 s
        _wait_pending(server, 1)
        queued = client.async_infer("slow", _inputs(2), lambda result, error: None)
        _wait_pending(server, 2)
        queued.cancel()  # RST_STREAM CANCEL while the first still runs
        stats = _settle(server, client, done, before.fail.count + 1)
        time.sleep(0.3)  # had the cancelled one run, it would have by now
        assert _executed(server)[len(ran_before):] == [1]
        assert stats.inference_stats.success.count == before.success.count + 1
        assert stats.inference_stats.fail.count == before.fail.count + 1
    assert _canceled(server) >= 1


def test_closed_connection_cancels_its_queued_request(server: RunningServer) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        before = client.get_inference_statistics("slow", as_json=False).model_stats[0].inference_stats
        canceled_before = _canceled(server)
        ran_before = _executed(server)
        done = threading.Event()
        client.async_infer("slow", _inputs(3), lambda result, error: done.set())
        _wait_pending(server, 1)
        # Another connection queues a request, then goes away without a word.
        message = pb.ModelInferRequest(model_name="slow", inputs=[pb.ModelInferRequest.InferInputTensor(
            name="IN", datatype="INT32", shape=[1])], raw_input_contents=[np.array([4], np.int32).tobytes()])
        body = message.SerializeToString()
        headers = Encoder().encode([(":method", "POST"), (":scheme", "http"),
                                    (":path", "/inference.GRPCInferenceService/ModelInfer"),
                                    (":authority", "localhost"), ("content-type", "application/grpc"),
                                    ("te", "trailers")])
        host, port = server.grpc_url.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(PREFACE + frame(4, 0, 0, b"") + frame(1, 0x4, 1, headers) +
                         frame(0, 0x1, 1, b"\0" + struct.pack(">I", len(body)) + body))
            _wait_pending(server, 2)
        stats = _settle(server, client, done, before.fail.count + 1)
        time.sleep(0.3)
        assert _executed(server)[len(ran_before):] == [3]
        assert stats.inference_stats.fail.count == before.fail.count + 1
    assert _canceled(server) == canceled_before + 1


def test_closed_http_connection_cancels_its_queued_request(server: RunningServer) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        before = client.get_inference_statistics("slow", as_json=False).model_stats[0].inference_stats
        canceled_before = _canceled(server)
        ran_before = _executed(server)
        done = threading.Event()
        client.async_infer("slow", _inputs(5), lambda result, error: done.set())
        _wait_pending(server, 1)
        body = json.dumps({"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [6]}]}).encode()
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
            sock.sendall(b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json"
                         b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            _wait_pending(server, 2)
        stats = _settle(server, client, done, before.fail.count + 1)
        time.sleep(0.3)
        assert _executed(server)[len(ran_before):] == [5]
        assert stats.inference_stats.success.count == before.success.count + 1
        assert stats.inference_stats.fail.count == before.fail.count + 1
    assert _canceled(server) == canceled_before + 1
