"""ModelInfer with the unmodified tritonclient.grpc (sync and asyncio) and the generated stub, as
tritonclient's example clients use it: raw tensors, typed ``contents``, BYTES, parameters, errors."""

from __future__ import annotations

import asyncio
import json

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.frontends.grpc.conftest import DTYPES
from tests.server import RunningServer
from tests.tensors import infer_inputs


@pytest.fixture(scope="module")
def client(grpc_server: RunningServer):
    with grpcclient.InferenceServerClient(grpc_server.grpc_url) as c:
        yield c


@pytest.fixture(scope="module")
def stub(grpc_server: RunningServer):
    with grpc.insecure_channel(grpc_server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _error(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


# --- tritonclient's simple_grpc_infer_client / simple_grpc_aio_infer_client ------------------------------------------

def test_simple_infer(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 0.5, dtype=np.float32)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
    result = client.infer("add_sub", infer_inputs(grpcclient, INPUT0=a, INPUT1=b), outputs=outputs, request_id="42")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    assert (response.id, response.model_name, response.model_version) == ("42", "add_sub", "1")
    # Every output leaves in raw_output_contents, none in typed contents.
    assert len(response.raw_output_contents) == 2
    assert not response.outputs[0].HasField("contents")


def test_requested_output_subset_and_version(client: grpcclient.InferenceServerClient) -> None:
    a = np.ones(4, dtype=np.float32)
    result = client.infer("add_sub", infer_inputs(grpcclient, INPUT0=a, INPUT1=a), model_version="1",
                          outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1"]
    assert result.as_numpy("OUTPUT0") is None


def test_aio_client_concurrent(grpc_server: RunningServer) -> None:
    async def main() -> None:
        async with aioclient.InferenceServerClient(grpc_server.grpc_url) as c:
            assert await c.is_server_live()
            arrays = [np.full(4, i, dtype=np.float32) for i in range(16)]
            results = await asyncio.gather(*(
                c.infer("add_sub", infer_inputs(aioclient, INPUT0=x, INPUT1=x), request_id=str(i))
                for i, x in enumerate(arrays)))
            for i, (x, result) in enumerate(zip(arrays, results)):
                assert result.get_response().id == str(i)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x + x)
            with pytest.raises(InferenceServerException) as info:
                await c.infer("missing", infer_inputs(aioclient, INPUT0=arrays[0]))
            assert info.value.status() == "StatusCode.NOT_FOUND"

    asyncio.run(main())


# --- every datatype, raw and through typed contents (grpc_explicit_*_content_client) --------------------------------

def _sample(datatype: str) -> np.ndarray:
    if datatype == "BYTES":
        return np.array([b"one", b"", b"three"], dtype=np.object_)
    if datatype == "BOOL":
        return np.array([True, False, True])
    dtype = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}.get(datatype) or np.dtype(datatype.lower())
    return np.array([1, 2, 3], dtype=dtype)


@pytest.mark.parametrize("datatype", DTYPES)
def test_raw_roundtrip(client: grpcclient.InferenceServerClient, datatype: str) -> None:
    data = _sample(datatype)
    result = client.infer("dtypes", infer_inputs(grpcclient, **{f"IN_{datatype}": data}))
    output = result.get_response().outputs[0]
    assert (output.name, output.datatype, list(output.shape)) == (f"OUT_{datatype}", datatype, [3])
    np.testing.assert_array_equal(result.as_numpy(f"OUT_{datatype}"), data)


_CONTENTS = {"BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
             "UINT32": "uint_contents", "UINT64": "uint64_contents", "INT8": "int_contents",
             "INT16": "int_contents", "INT32": "int_contents", "INT64": "int64_contents",
             "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}


def _contents_request(model: str, name: str, datatype: str, field: str, values: list) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name=name, datatype=datatype, shape=[len(values)])
    getattr(tensor.contents, field).extend(values)
    return request


@pytest.mark.parametrize("datatype", sorted(_CONTENTS))
def test_explicit_contents(stub, datatype: str) -> None:
    data = _sample(datatype)
    values = list(data) if datatype == "BYTES" else data.tolist()
    response = stub.ModelInfer(_contents_request("dtypes", f"IN_{datatype}", datatype, _CONTENTS[datatype], values))
    result = grpcclient.InferResult(response)
    np.testing.assert_array_equal(result.as_numpy(f"OUT_{datatype}"), data)


def test_explicit_small_ints_truncate_like_triton(stub) -> None:
    # int8/int16 ride in int32 contents; Triton keeps the low bytes.
    response = stub.ModelInfer(_contents_request("dtypes", "IN_INT8", "INT8", "int_contents", [1, -2, 300]))
    np.testing.assert_array_equal(grpcclient.InferResult(response).as_numpy("OUT_INT8"), [1, -2, 44])
    response = stub.ModelInfer(_contents_request("dtypes", "IN_UINT16", "UINT16", "uint_contents", [1, 70000]))
    np.testing.assert_array_equal(grpcclient.InferResult(response).as_numpy("OUT_UINT16"), [1, 4464])


def test_bytes_batch(client: grpcclient.InferenceServerClient) -> None:
    data = np.array([[b"a", b"bc"], [b"\x00\xff", b""]], dtype=np.object_)
    result = client.infer("identity_bytes", infer_inputs(grpcclient, INPUT0=data))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


def test_classification(client: grpcclient.InferenceServerClient) -> None:
    a = np.array([1, 4, 2, 3], dtype=np.float32)
    result = client.infer("add_sub", infer_inputs(grpcclient, INPUT0=a, INPUT1=a),
                          outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)])
    assert result.get_response().outputs[0].datatype == "BYTES"
    assert result.as_numpy("OUTPUT0").tolist() == [b"8.000000:1", b"6.000000:3"]


def test_large_message_both_ways(client: grpcclient.InferenceServerClient) -> None:
    # Past grpc's 4 MB default: the server lifts the limit as Triton does.
    data = np.arange(3_000_000, dtype=np.float32)
    result = client.infer("dtypes", infer_inputs(grpcclient, IN_FP32=data))
    np.testing.assert_array_equal(result.as_numpy("OUT_FP32"), data)


def test_big_tensors_among_small_ones(grpc_server: RunningServer) -> None:
    # Big requests and replies (their tensors kept out of protobuf) with small and empty tensors beside them, in
    # order, several at once on one connection.
    async def scenario() -> None:
        async with aioclient.InferenceServerClient(grpc_server.grpc_url) as client:
            calls = []
            for i in range(4):
                big = np.arange(300_000 + i, dtype=np.float32)
                inputs = {"IN_INT8": np.array([i], dtype=np.int8), "IN_FP32": big,
                          "IN_INT64": np.arange(70_000, dtype=np.int64), "IN_BYTES": np.array([b"", b"x" * 5], object),
                          "IN_UINT8": np.zeros(0, dtype=np.uint8)}
                calls.append((inputs, client.infer("dtypes", infer_inputs(aioclient, **inputs))))
            for inputs, call in calls:
                result = await call
                for name, array in inputs.items():
                    np.testing.assert_array_equal(result.as_numpy("OUT_" + name[3:]), array)

    asyncio.run(scenario())


def test_one_connection_from_big_messages_to_many_calls_and_back(grpc_server: RunningServer) -> None:
    # The lean engine grows the connection's stream window for 1 MiB messages and lowers its stream limit to match
    # (budget.py), then gives the streams back as 96 calls come at once on the same connection, which grpc-core
    # queues at the lowered limit or sees refused past it before it read the SETTINGS (and retries): every call is
    # answered, right.
    async def scenario() -> None:
        async with aioclient.InferenceServerClient(grpc_server.grpc_url) as client:
            big = np.arange(1 << 18, dtype=np.float32)
            for _ in range(2):
                result = await client.infer("dtypes", infer_inputs(aioclient, IN_FP32=big))
                np.testing.assert_array_equal(result.as_numpy("OUT_FP32"), big)
            arrays = [np.full(4, i, dtype=np.float32) for i in range(96)]
            calls = [client.infer("add_sub", infer_inputs(aioclient, INPUT0=x, INPUT1=x)) for x in arrays]
            calls += [client.infer("dtypes", infer_inputs(aioclient, IN_FP32=big + i)) for i in range(4)]
            results = await asyncio.gather(*calls)
            for x, result in zip(arrays, results):
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x + x)
            for i, result in enumerate(results[96:]):
                np.testing.assert_array_equal(result.as_numpy("OUT_FP32"), big + i)

    asyncio.run(scenario())


def test_compressed_request(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(4, dtype=np.float32)
    for algorithm in ("gzip", "deflate"):
        result = client.infer("add_sub", infer_inputs(grpcclient, INPUT0=a, INPUT1=a), compression_algorithm=algorithm)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


def test_parameters_reach_the_model(client: grpcclient.InferenceServerClient) -> None:
    x = np.ones(1, dtype=np.float32)
    result = client.infer("params", infer_inputs(grpcclient, INPUT0=x), request_id="r9", sequence_id=77,
                          sequence_start=True, sequence_end=True, priority=3, timeout=5_000_000,
                          parameters={"flag": True, "count": 5, "name": "x", "ratio": 0.5})
    seen = json.loads(result.as_numpy("SEEN")[0])
    # Reserved keys steer the request; only the others reach the model.
    assert seen == {"parameters": {"flag": True, "count": 5, "name": "x", "ratio": 0.5}, "correlation_id": 77,
                    "flags": 3, "id": "r9"}
    result = client.infer("params", infer_inputs(grpcclient, INPUT0=x), sequence_id="session-a")
    assert json.loads(result.as_numpy("SEEN")[0])["correlation_id"] == "session-a"


# --- errors: Triton's gRPC status codes and messages, and the server keeps serving -----------------------------------

A = np.arange(4, dtype=np.float32)


def _raw_request(**fields) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="add_sub", **fields)
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[4])
    return request


@pytest.mark.parametrize("mutate, code, message", [
    (lambda r: setattr(r, "model_name", "nope"), grpc.StatusCode.NOT_FOUND,
     "Request for unknown model: 'nope' is not found"),
    (lambda r: setattr(r, "model_version", "x"), grpc.StatusCode.INVALID_ARGUMENT,
     "failed to get model version from specified version string 'x' (details: stol), version should be an "
     "integral value > 0"),
    (lambda r: setattr(r, "model_version", "-1"), grpc.StatusCode.INVALID_ARGUMENT,
     "invalid model version specified '-1' , version should be an integral value > 0"),
    (lambda r: setattr(r, "model_version", "9"), grpc.StatusCode.NOT_FOUND,
     "Request for unknown model: 'add_sub' version 9 is not found"),
    (lambda r: r.raw_input_contents.pop(), grpc.StatusCode.INVALID_ARGUMENT,
     "unable to find data for input tensor 'INPUT1' for model 'add_sub' in request."),
    (lambda r: r.inputs[0].contents.fp32_contents.extend([1, 2, 3, 4]), grpc.StatusCode.INVALID_ARGUMENT,
     "contents field must not be specified when using raw_input_contents for 'INPUT0' for model 'add_sub'"),
    (lambda r: r.raw_input_contents.__setitem__(0, b"\0" * 12), grpc.StatusCode.INVALID_ARGUMENT,
     "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model 'add_sub'. "
     "Expected 16, got 12"),
    (lambda r: setattr(r.inputs[0], "datatype", "INT32"), grpc.StatusCode.INVALID_ARGUMENT,
     "[request id: <id_unknown>] inference input 'INPUT0' data-type is 'INT32', but model 'add_sub' expects 'FP32'"),
    (lambda r: setattr(r.inputs[0], "datatype", "FLOAT"), grpc.StatusCode.INVALID_ARGUMENT,
     "[request id: <id_unknown>] inference input 'INPUT0' data-type is '<invalid>', but model 'add_sub' expects "
     "'FP32'"),
    (lambda r: r.inputs[0].shape.__setitem__(slice(None), [2, 2]), grpc.StatusCode.INVALID_ARGUMENT,
     "[request id: <id_unknown>] unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [4], "
     "got [2,2]. "),
    (lambda r: setattr(r.inputs[1], "name", "INPUTX"), grpc.StatusCode.INVALID_ARGUMENT,
     "unexpected inference input 'INPUTX' for model 'add_sub' (the model's inputs: 'INPUT0', 'INPUT1')"),
    (lambda r: r.outputs.add(name="NOPE"), grpc.StatusCode.INVALID_ARGUMENT,
     "unexpected inference output 'NOPE' for model 'add_sub'"),
    (lambda r: setattr(r.parameters["sequence_id"], "bool_param", True), grpc.StatusCode.INVALID_ARGUMENT,
     "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."),
    (lambda r: setattr(r.parameters["priority"], "int64_param", -1), grpc.StatusCode.INVALID_ARGUMENT,
     "invalid value for 'priority', expected value >= 0."),
    (lambda r: setattr(r.parameters["timeout"], "string_param", "1s"), grpc.StatusCode.INVALID_ARGUMENT,
     "invalid value type for 'timeout' parameter, expected int64_param."),
    (lambda r: setattr(r.parameters["triton_x"], "bool_param", True), grpc.StatusCode.INVALID_ARGUMENT,
     "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys starting with "
     "'triton_' are allowed: triton_enable_empty_final_response"),
    (lambda r: setattr(r.parameters["mine"], "uint64_param", 1), grpc.StatusCode.INVALID_ARGUMENT,
     "invalid value type for 'mine' parameter, expected int64_param, bool_param, or string_param."),
    (lambda r: r.inputs[0].parameters["shared_memory_region"].__setattr__("string_param", "r0"),
     grpc.StatusCode.INVALID_ARGUMENT,
     "'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter for tensor 'INPUT0'"),
])
def test_infer_errors(stub, grpc_server: RunningServer, mutate, code, message: str) -> None:
    request = _raw_request()
    request.raw_input_contents.extend([A.tobytes(), A.tobytes()])
    mutate(request)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert (info.value.code(), info.value.details()) == (code, message)
    assert stub.ServerLive(service_pb2.ServerLiveRequest()).live


def test_contents_type_mismatch(stub) -> None:
    request = _contents_request("dtypes", "IN_FP32", "FP32", "int_contents", [1, 2])
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == ("unexpected explicit tensor data for input tensor 'IN_FP32' for model 'dtypes' of "
                                    "type 'INT32', expected datatype 'FP32'")


@pytest.mark.parametrize("raw, message", [
    (b"\x02\0\0\0ab\x01\0", "[request id: <id_unknown>] incomplete string length indicator for inference input "
     "'IN_BYTES' for model 'dtypes', expecting 4 bytes but only 2 bytes available. Please make sure the string "
     "length indicator is in one buffer."),
    (b"\x02\0\0\0ab\x02\0\0\0c", "incomplete string data for inference input 'IN_BYTES', expecting string of "
     "length 2 but only 1 bytes available"),
    (b"\x01\0\0\0a", "[request id: <id_unknown>] expected 2 string elements for inference input 'IN_BYTES' for "
     "model 'dtypes', got 1"),
])
def test_malformed_bytes(stub, raw: bytes, message: str) -> None:
    request = service_pb2.ModelInferRequest(model_name="dtypes", raw_input_contents=[raw])
    request.inputs.add(name="IN_BYTES", datatype="BYTES", shape=[2])
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)


def test_model_errors(client: grpcclient.InferenceServerClient) -> None:
    def run(mode: int):
        return client.infer("fail", infer_inputs(grpcclient, MODE=np.array([mode], dtype=np.int32)))

    assert run(0).as_numpy("OUT").tolist() == [0]
    error = _error(lambda: run(1))
    assert (error.status(), error.message()) == ("StatusCode.INTERNAL", "error on purpose")
    error = _error(lambda: run(2))
    assert error.status() == "StatusCode.INTERNAL"
    assert "raised on purpose" in error.message()
    assert run(0).as_numpy("OUT").tolist() == [0]


def test_decoupled_model_refused_on_model_infer(client: grpcclient.InferenceServerClient) -> None:
    error = _error(lambda: client.infer("decoupled", infer_inputs(grpcclient, INPUT0=A)))
    assert error.status() == "StatusCode.UNIMPLEMENTED"
    assert error.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"
