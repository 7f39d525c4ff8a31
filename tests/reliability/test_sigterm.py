"""SIGTERM with many requests in flight, over HTTP, gRPC unary and a gRPC stream, some executing and some still
queued behind them: every one gets its answer before the server exits, and the server exits cleanly. Requests that
outlast --exit-timeout-secs are answered UNAVAILABLE (HTTP and SageMaker 503) and the process exits within it."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import signal
import time
from pathlib import Path

import grpc
import numpy as np
import psutil
from tritonclient.grpc import service_pb2 as pb

from naiad.server import CUT_MESSAGE
from tests.reliability import procs
from tests.reliability.fuzz_grpc import SERVICE
from tests.reliability.repo import write_slow
from tests.server import RunningServer

HTTP_REQUESTS = 10
GRPC_REQUESTS = 6
STREAM_REQUESTS = 3


def _http(port: int, value: float, path: str = "/v2/models/slow/infer") -> tuple[int, object]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [value]}]})
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        doc = json.loads(response.read())
        return response.status, doc["outputs"][0]["data"] if response.status == 200 else doc
    finally:
        conn.close()


def _message(value: float) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="slow")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
    message.raw_input_contents.append(np.array([value], dtype=np.float32).tobytes())
    return message


def _answer(response: pb.ModelInferResponse) -> list[float]:
    return np.frombuffer(response.raw_output_contents[0], dtype=np.float32).tolist()


def test_sigterm_answers_everything_in_flight(tmp_path: Path) -> None:
    # 0.4 s per execution, batches of up to 4: 19 requests need 5 executions, so most wait in the queue at SIGTERM.
    write_slow(tmp_path / "repo", "slow", delay=0.4)
    server = RunningServer([tmp_path / "repo"])
    pid = server.proc.pid
    children = [p.pid for p in procs.descendants(pid)]
    with grpc.insecure_channel(server.grpc_url) as channel, \
            concurrent.futures.ThreadPoolExecutor(HTTP_REQUESTS + GRPC_REQUESTS + 1) as pool:
        unary = channel.unary_unary(SERVICE + "ModelInfer", request_serializer=pb.ModelInferRequest.SerializeToString,
                                    response_deserializer=pb.ModelInferResponse.FromString)
        stream = channel.stream_stream(SERVICE + "ModelStreamInfer",
                                       request_serializer=pb.ModelInferRequest.SerializeToString,
                                       response_deserializer=pb.ModelStreamInferResponse.FromString)
        http_calls = {i: pool.submit(_http, server.http_port, float(i)) for i in range(HTTP_REQUESTS)}
        grpc_calls = {i: unary.future(_message(100.0 + i), timeout=30) for i in range(GRPC_REQUESTS)}
        streamed = pool.submit(lambda: [_answer(r.infer_response) for r in stream(
            iter([_message(200.0 + i) for i in range(STREAM_REQUESTS)]), timeout=30)])
        time.sleep(0.6)  # the first batch executes, the rest wait in the batcher's queue
        server.proc.send_signal(signal.SIGTERM)
        answers = {i: f.result(30) for i, f in http_calls.items()}
        grpc_answers = {i: _answer(f.result(30)) for i, f in grpc_calls.items()}
        stream_answers = streamed.result(30)
    assert answers == {i: (200, [float(i)]) for i in range(HTTP_REQUESTS)}  # JSON data is flat
    assert grpc_answers == {i: [100.0 + i] for i in range(GRPC_REQUESTS)}
    assert stream_answers == [[200.0 + i] for i in range(STREAM_REQUESTS)]
    assert server.proc.wait(30) == 0, server.log()[-3000:]
    server.stop()
    assert children and not any(_running(c) for c in children), "worker processes outlived the server"


def _running(pid: int) -> bool:
    """Alive and not just a zombie (an orphan's exit status waits for whoever adopted it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_sigterm_past_the_exit_timeout_answers_unavailable_and_exits_in_time(tmp_path: Path) -> None:
    """A model that takes 30 s and a 2 s exit timeout: the server once waited for finalize() another 10 s after
    it (39.5 s against 30 s) and answered what it cut with 500. Now every front end answers UNAVAILABLE and the
    busy worker is killed at the deadline."""
    timeout = 2.0
    write_slow(tmp_path / "repo", "slow", delay=30)
    server = RunningServer([tmp_path / "repo"], "--exit-timeout-secs", str(int(timeout)), "--allow-sagemaker=true",
                           env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "slow"})
    children = [p.pid for p in procs.descendants(server.proc.pid)]
    with grpc.insecure_channel(server.grpc_url) as channel, concurrent.futures.ThreadPoolExecutor(8) as pool:
        unary = channel.unary_unary(SERVICE + "ModelInfer", request_serializer=pb.ModelInferRequest.SerializeToString,
                                    response_deserializer=pb.ModelInferResponse.FromString)
        stream = channel.stream_stream(SERVICE + "ModelStreamInfer",
                                       request_serializer=pb.ModelInferRequest.SerializeToString,
                                       response_deserializer=pb.ModelStreamInferResponse.FromString)
        # One batch of 4 executes; the rest wait in the queue behind it.
        http_calls = [pool.submit(_http, server.http_port, float(i)) for i in range(4)]
        sagemaker = pool.submit(_http, server.sagemaker_port, 0.0, "/invocations")
        grpc_calls = [unary.future(_message(float(i)), timeout=30) for i in range(2)]
        streamed = pool.submit(lambda: [r.error_message for r in stream(iter([_message(9.0)]), timeout=30)])
        time.sleep(0.8)
        server.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert server.proc.wait(timeout + 10) == 0, server.log()[-3000:]
        took = time.monotonic() - signalled
        answers = [f.result(5) for f in http_calls] + [sagemaker.result(5)]
        outcomes = []
        for call in grpc_calls:
            try:
                call.result(5)
                outcomes.append((grpc.StatusCode.OK, ""))
            except grpc.RpcError as exc:
                outcomes.append((exc.code(), exc.details()))
        stream_errors = streamed.result(5)
    assert took < timeout + 1.5, (took, server.log()[-3000:])
    assert answers == [(503, {"error": CUT_MESSAGE})] * 5
    assert outcomes == [(grpc.StatusCode.UNAVAILABLE, CUT_MESSAGE)] * 2
    assert stream_errors == [CUT_MESSAGE]  # ModelStreamInfer carries errors in its messages, as Triton's does
    server.stop()
    assert children and not any(_running(c) for c in children), "worker processes outlived the server"
