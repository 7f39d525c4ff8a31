"""Shapes that lie (issue 19, item 4): negative dimensions, dimensions whose product overflows, shapes whose byte size
doesn't match the data. Before, a ModelInfer with a negative dimension raised ValueError in core/tensors.py and the
lean engine dropped the whole connection (3 of 3 bystander calls lost), and ``[0, 2^63-1]`` was a 500 "internal
server error" over HTTP and SageMaker. Now each is INVALID_ARG for its call alone, on every front end."""

from __future__ import annotations

import http.client
import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from tests.reliability.repo import write_slow
from tests.server import EXAMPLES, RunningServer

BIG = 2**63 - 1
FOUR = np.arange(4, dtype=np.float32).tobytes()  # what add_sub's [4] FP32 inputs hold


@pytest.fixture(scope="module", params=("lean", "grpcio"))
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = Path(tmp_path_factory.mktemp("slow"))
    write_slow(repo, "slow", 0.5)
    running = RunningServer([EXAMPLES, repo], "--grpc-engine", request.param, "--allow-sagemaker=true",
                            "--allow-metrics=false", env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "add_sub"})
    yield running
    running.stop()


HTTP_ONLY = pytest.mark.parametrize("server", ["lean"], indirect=True)  # HTTP and SageMaker don't use gRPC's engine

# (shape, binary bytes of INPUT0) that no tensor can have; INPUT1 is a good [4]. A negative dimension in HTTP's JSON
# header is refused as Triton refuses it, by its JSON parser: 500 "Unable to parse 'shape'" (tests/golden records it).
SHAPE = "unexpected shape for input 'INPUT0' for model 'add_sub'"
TRITON_PARSE = "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"
BAD_BINARY = [([0, BIG], b"", 400, SHAPE), ([2**62, 4], FOUR, 400, SHAPE), ([BIG, BIG, 0], b"", 400, SHAPE),
              ([-1, -4], FOUR, 500, TRITON_PARSE), ([0, -1], b"", 500, TRITON_PARSE)]


def _binary_body(shape: list[int], data: bytes) -> tuple[bytes, int]:
    header = json.dumps({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": shape, "parameters": {"binary_data_size": len(data)}},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4], "parameters": {"binary_data_size": 16}}]}).encode()
    return header + data + FOUR, len(header)


def _http(conn: http.client.HTTPConnection, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    conn.request("POST", path, body, headers)
    response = conn.getresponse()
    return response.status, response.read().decode()


GOOD_JSON = json.dumps({"inputs": [{"name": n, "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}
                                   for n in ("INPUT0", "INPUT1")]}).encode()


@HTTP_ONLY
@pytest.mark.parametrize(("shape", "data", "status", "phrase"), BAD_BINARY, ids=lambda v: str(v)[:24])
def test_http_binary_shapes_are_refused_and_the_connection_serves_on(server: RunningServer, shape: list[int],
                                                                     data: bytes, status: int, phrase: str) -> None:
    body, header_length = _binary_body(shape, data)
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        got, text = _http(conn, "/v2/models/add_sub/infer", body,
                          {"Inference-Header-Content-Length": str(header_length)})
        assert got == status and phrase in json.loads(text)["error"], text
        status, text = _http(conn, "/v2/models/add_sub/infer", GOOD_JSON, {})  # same keep-alive connection
        assert status == 200 and json.loads(text)["outputs"][0]["data"] == [2, 4, 6, 8], text
    finally:
        conn.close()


@HTTP_ONLY
@pytest.mark.parametrize("port", ["http", "sagemaker"])
def test_a_json_shape_numpy_cant_make_is_invalid(server: RunningServer, port: str) -> None:
    """[0, 2^63-1] with no data: the element count (0) matches, the array can't exist. (A negative dimension in JSON
    stays Triton's own 500, "Unable to parse 'shape'", which tests/golden records.)"""
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [0, BIG], "data": []},
                                  {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]})
    if port == "http":
        status, _, reply = server.request("POST", "/v2/models/add_sub/infer", body)
    else:
        status, _, reply = server.sagemaker("POST", "/invocations", body, {"Content-Type": "application/json"})
    assert status == 400, reply
    assert b"unexpected shape for input 'INPUT0'" in reply, reply


@HTTP_ONLY
@pytest.mark.parametrize(("shape", "data"), [([0, BIG], b""), ([2**62, 4], FOUR)])
def test_sagemaker_binary_shapes_are_invalid(server: RunningServer, shape: list[int], data: bytes) -> None:
    body, header_length = _binary_body(shape, data)
    status, _, reply = server.sagemaker(
        "POST", "/invocations", body,
        {"Content-Type": f"application/vnd.sagemaker-triton.binary+json;json-header-size={header_length}"})
    assert status == 400, reply
    assert b"unexpected shape for input 'INPUT0'" in reply, reply


@HTTP_ONLY
def test_a_byte_size_that_does_not_match_is_invalid(server: RunningServer) -> None:
    body, header_length = _binary_body([2, 4], FOUR)
    status, _, reply = server.request("POST", "/v2/models/add_sub/infer", body,
                                      {"Inference-Header-Content-Length": str(header_length)})
    assert status == 400, reply
    assert b"input byte size mismatch for input 'INPUT0' for model 'add_sub'. Expected 32, got 16" in reply, reply


def _message(shape: list[int], data: bytes | None = None, typed: list[float] | None = None,
             datatype: str = "FP32") -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="add_sub")
    tensor = message.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
    other = message.inputs.add(name="INPUT1", datatype="FP32", shape=[4])
    if typed is not None:
        tensor.contents.fp32_contents.extend(typed)
        other.contents.fp32_contents.extend([1, 2, 3, 4])
    else:
        message.raw_input_contents.extend([data or b"", FOUR])
    return message


GRPC_BAD = [
    _message([-1, -4], FOUR), _message([-2, -2], FOUR), _message([-1], FOUR[:4]), _message([0, BIG], b""),
    _message([-(2**63)], b""), _message([-1, -4], typed=[1, 2, 3, 4]), _message([0, BIG], typed=[]),
    _message([-1, -1], struct.pack("<I", 1) + b"a", datatype="BYTES"), _message([0, BIG], b"", datatype="BYTES"),
]


def _call(channel: grpc.Channel, model: str = "add_sub") -> grpc.UnaryUnaryMultiCallable:
    return channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                               request_serializer=pb.ModelInferRequest.SerializeToString,
                               response_deserializer=pb.ModelInferResponse.FromString)


@pytest.mark.parametrize("message", GRPC_BAD, ids=lambda m: f"{m.inputs[0].datatype}{list(m.inputs[0].shape)}"
                         + ("-typed" if m.inputs[0].HasField("contents") else ""))
def test_grpc_shapes_are_invalid_argument(server: RunningServer, message: pb.ModelInferRequest) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as info:
            _call(channel)(message, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert SHAPE in info.value.details()


def test_grpc_byte_size_mismatch_is_invalid_argument(server: RunningServer) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as info:
            _call(channel)(_message([2, 4], FOUR), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input byte size mismatch for input 'INPUT0' for model 'add_sub'. Expected 32, got 16" in \
        info.value.details()


def test_bystanders_on_the_same_connection_are_answered(server: RunningServer) -> None:
    """Three slow calls in flight on one channel (one HTTP/2 connection) when bad shapes arrive on it: the bad calls
    fail alone, the three are answered."""
    slow = pb.ModelInferRequest(model_name="slow")
    slow.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
    slow.raw_input_contents.append(np.float32(7).tobytes())
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = _call(channel)
        bystanders = [call.future(slow, timeout=30) for _ in range(3)]
        time.sleep(0.1)  # they are queued on the server
        bad = [call.future(m, timeout=30) for m in GRPC_BAD[:4]]
        for future in bad:
            with pytest.raises(grpc.RpcError) as info:
                future.result()
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
        answers = [np.frombuffer(f.result().raw_output_contents[0], np.float32).tolist() for f in bystanders]
        assert answers == [[7.0]] * 3
