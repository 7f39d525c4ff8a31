"""SIGTERM with many requests in flight, over HTTP, gRPC unary and a gRPC stream, some executing and some still
queued behind them: every one gets its answer before the server exits, and the server exits cleanly."""

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

from tests.reliability import procs
from tests.reliability.fuzz_grpc import SERVICE
from tests.reliability.repo import write_slow
from tests.server import RunningServer

HTTP_REQUESTS = 10
GRPC_REQUESTS = 6
STREAM_REQUESTS = 3


def _http(port: int, value: float) -> tuple[int, object]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [value]}]})
        conn.request("POST", "/v2/models/slow/infer", body)
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
