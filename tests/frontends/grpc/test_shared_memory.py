"""The shared-memory extension over gRPC (both server engines), driven by tritonclient.grpc and
tritonclient.utils.shared_memory as simple_grpc_shm_client.py and simple_grpc_shm_string_client.py drive Triton,
plus the raw stub for what tritonclient never sends; codes and words as Triton 2.51 answers them."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2 as pb, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.frontends.shared_memory_models import (
    key,
    mapped,
    simple_roundtrip,
    string_roundtrip,
    wait_for_file,
    write_shm_models,
)
from tests.server import RunningServer

StatusCode = grpc.StatusCode


@pytest.fixture(scope="module", params=("grpcio", "lean"))
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("shm_models")
    write_shm_models(repo)
    running = RunningServer([repo], "--grpc-engine", request.param)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        yield c


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture
def region(client: grpcclient.InferenceServerClient) -> Iterator[object]:
    """A 256-byte region registered as "r": INPUT0 (0..15) at 0, INPUT1 (ones) at 64, room for outputs from 128."""
    handle = shm.create_shared_memory_region("r", key("r"), 256)
    shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.int32)])
    shm.set_shared_memory_region(handle, [np.ones(16, dtype=np.int32)], offset=64)
    client.register_system_shared_memory("r", key("r"), 256)
    yield handle
    client.unregister_system_shared_memory()
    shm.destroy_shared_memory_region(handle)


def _error(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def _tensor(kind: type, name: str, region: str | None = "r", size: int | None = 64, offset: int | None = None,
            **params: pb.InferParameter) -> object:
    tensor = kind(name=name, datatype="INT32", shape=[1, 16]) if kind is _INPUT else kind(name=name)
    if region is not None:
        tensor.parameters["shared_memory_region"].string_param = region
    if size is not None:
        tensor.parameters["shared_memory_byte_size"].int64_param = size
    if offset is not None:
        tensor.parameters["shared_memory_offset"].int64_param = offset
    for name_, value in params.items():
        tensor.parameters[name_].CopyFrom(value)
    return tensor


_INPUT = pb.ModelInferRequest.InferInputTensor
_OUTPUT = pb.ModelInferRequest.InferRequestedOutputTensor


def _in(name: str, **kw: object) -> object:
    return _tensor(_INPUT, name, **kw)  # type: ignore[arg-type]


def _out(name: str, **kw: object) -> object:
    return _tensor(_OUTPUT, name, **kw)  # type: ignore[arg-type]


def _inputs() -> list:
    return [_in("INPUT0"), _in("INPUT1", offset=64)]


# --- tritonclient's examples ---------------------------------------------------------------------------------------

def test_simple_grpc_shm_client(client: grpcclient.InferenceServerClient) -> None:
    status = simple_roundtrip(client, grpcclient)
    assert {name: (r.key, r.offset, r.byte_size) for name, r in status.regions.items()} == {
        "input_data": (key("input_simple"), 0, 128), "output_data": (key("output_simple"), 0, 128)}
    assert not client.get_system_shared_memory_status().regions


def test_simple_grpc_shm_string_client(client: grpcclient.InferenceServerClient) -> None:
    status = string_roundtrip(client, grpcclient)
    assert {name: r.byte_size for name, r in status.regions.items()} == {
        "input0_data": 86, "input1_data": 80, "output0_data": 87, "output1_data": 86}


# --- inference ---------------------------------------------------------------------------------------------------

def test_outputs_into_shared_memory_have_empty_contents(stub, region: object) -> None:
    """As Triton answers: the output is described, its raw contents entry is empty; the other output is inline."""
    request = pb.ModelInferRequest(model_name="simple", inputs=_inputs(),
                                   outputs=[_out("OUTPUT0", offset=128), _out("OUTPUT1", region=None, size=None)])
    response = stub.ModelInfer(request)
    assert [(o.name, o.datatype, list(o.shape), dict(o.parameters)) for o in response.outputs] == [
        ("OUTPUT0", "INT32", [1, 16], {}), ("OUTPUT1", "INT32", [1, 16], {})]
    assert response.raw_output_contents[0] == b""
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[1], np.int32), np.arange(-1, 15))
    np.testing.assert_array_equal(shm.get_contents_as_numpy(region, np.int32, [16], offset=128), np.arange(1, 17))
    # An input from shared memory beside one from raw contents: only the latter takes a raw entry.
    request = pb.ModelInferRequest(model_name="simple", inputs=[_in("INPUT0"), _in("INPUT1", region=None, size=None)],
                                   raw_input_contents=[np.full(16, 2, np.int32).tobytes()])
    np.testing.assert_array_equal(np.frombuffer(stub.ModelInfer(request).raw_output_contents[0], np.int32),
                                  np.arange(2, 18))


def test_stream_infer_into_shared_memory(client: grpcclient.InferenceServerClient, region: object) -> None:
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for i in range(2):
            inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
                      grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
            inputs[0].set_shared_memory("r", 64)
            inputs[1].set_shared_memory("r", 64, offset=64)
            output = grpcclient.InferRequestedOutput("OUTPUT1")
            output.set_shared_memory("r", 64, offset=128 + 64 * i)
            client.async_stream_infer("simple", inputs, outputs=[output], request_id=str(i))
            result, error = results.get(timeout=30)
            assert error is None and result.get_response().id == str(i)
        # An error answers that request only; the stream goes on.
        bad = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
        bad.set_shared_memory("nope", 64)
        client.async_stream_infer("simple", [bad, inputs[1]])
        result, error = results.get(timeout=30)
        assert error.message() == "Unable to find shared memory region: 'nope'"
    finally:
        client.stop_stream()
    for i in range(2):
        np.testing.assert_array_equal(shm.get_contents_as_numpy(region, np.int32, [16], offset=128 + 64 * i),
                                      np.arange(-1, 15))


_STR = pb.InferParameter(string_param="1")
_INT = pb.InferParameter(int64_param=1)


@pytest.mark.parametrize(("inputs", "outputs", "code", "message"), [
    ([_in("INPUT0", region="nope"), _in("INPUT1", offset=64)], [], StatusCode.NOT_FOUND,
     "Unable to find shared memory region: 'nope'"),
    ([_in("INPUT0", region=None, size=None, offset=4), _in("INPUT1", offset=64)], [], StatusCode.INVALID_ARGUMENT,
     "'shared_memory_offset' can not be specified without 'shared_memory_region' parameter for tensor 'INPUT0'"),
    ([_in("INPUT0", region=None), _in("INPUT1", offset=64)], [], StatusCode.INVALID_ARGUMENT,
     "'shared_memory_byte_size' can not be specified without 'shared_memory_region' parameter for tensor 'INPUT0'"),
    ([_in("INPUT0", size=None), _in("INPUT1", offset=64)], [], StatusCode.INVALID_ARGUMENT,
     "'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter for tensor 'INPUT0'"),
    ([_in("INPUT0", region=None, shared_memory_region=_INT), _in("INPUT1", offset=64)], [],
     StatusCode.INVALID_ARGUMENT,
     "invalid value type for 'shared_memory_region' parameter for tensor 'INPUT0', expected string_param."),
    ([_in("INPUT0", shared_memory_offset=_STR), _in("INPUT1", offset=64)], [], StatusCode.INVALID_ARGUMENT,
     "invalid value type for 'shared_memory_offset' parameter for tensor 'INPUT0', expected int64_param."),
    ([_in("INPUT0", offset=-4), _in("INPUT1", offset=64)], [], StatusCode.INVALID_ARGUMENT,
     "Invalid offset for shared memory region: 'r'"),
    ([_in("INPUT0", size=-1), _in("INPUT1", offset=64)], [], StatusCode.INVALID_ARGUMENT,
     "Invalid offset + byte size for shared memory region: 'r'"),
    ([_in("INPUT0", size=60), _in("INPUT1", offset=64)], [], StatusCode.INVALID_ARGUMENT,
     "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 60"),
    (_inputs(), [_out("OUTPUT0", size=32, offset=128)], StatusCode.INTERNAL,
     "shared memory size specified with the request for output 'OUTPUT0' (32 bytes) should be at least 64 bytes to "
     "hold the results"),
    (_inputs(), [_out("OUTPUT0", region="nope")], StatusCode.NOT_FOUND, "Unable to find shared memory region: 'nope'"),
    (_inputs(), [_out("OUTPUT0", classification=pb.InferParameter(int64_param=2))], StatusCode.INVALID_ARGUMENT,
     "output can't set both 'shared_memory_region' and 'classification'"),
    (_inputs(), [_out("OUTPUT0", region=None, size=None, offset=4)], StatusCode.INVALID_ARGUMENT,
     "'shared_memory_offset' can not be specified without 'shared_memory_region' parameter for tensor 'OUTPUT0'"),
])
def test_infer_errors(stub, region: object, inputs: list, outputs: list, code: StatusCode, message: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(pb.ModelInferRequest(model_name="simple", inputs=inputs, outputs=outputs))
    assert (info.value.code(), info.value.details()) == (code, message)
    assert len(stub.ModelInfer(pb.ModelInferRequest(model_name="simple", inputs=_inputs())).raw_output_contents) == 2


def test_contents_beside_shared_memory(stub, region: object) -> None:
    tensor = _in("INPUT0")
    tensor.contents.int_contents.extend(range(16))  # type: ignore[attr-defined]
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(pb.ModelInferRequest(model_name="simple", inputs=[tensor, _in("INPUT1", offset=64)]))
    assert (info.value.code(), info.value.details()) == (
        StatusCode.INVALID_ARGUMENT,
        "unexpected 'content' provided when using shared memory for input tensor 'INPUT0' for model 'simple'")


# --- control: register, status, unregister -------------------------------------------------------------------------

def test_control_errors(client: grpcclient.InferenceServerClient, region: object) -> None:
    cases = [
        (lambda: client.register_system_shared_memory("r", key("r"), 64), "StatusCode.ALREADY_EXISTS",
         "shared memory region 'r' already in manager"),
        (lambda: client.register_system_shared_memory("x", key("absent"), 64), "StatusCode.INTERNAL",
         f"Unable to open shared memory region: '{key('absent')}'"),
        (lambda: client.register_system_shared_memory("x", key("r"), 257), "StatusCode.INVALID_ARGUMENT",
         "failed to register shared memory region 'x': invalid args"),
        (lambda: client.get_system_shared_memory_status("x"), "StatusCode.NOT_FOUND",
         "Unable to find system shared memory region: 'x'"),
    ]
    for call, status, message in cases:
        error = _error(call)
        assert (error.status(), error.message()) == (status, message)
    client.unregister_system_shared_memory("nope")
    regions = client.get_system_shared_memory_status("r").regions
    assert {name: (r.name, r.key, r.offset, r.byte_size) for name, r in regions.items()} == {
        "r": ("r", key("r"), 0, 256)}


def test_unregister_releases_the_mapping(server: RunningServer, client: grpcclient.InferenceServerClient,
                                        region: object) -> None:
    assert mapped(server.proc.pid, key("r"))
    client.unregister_system_shared_memory("r")
    assert not mapped(server.proc.pid, key("r"))


def test_cuda_shared_memory_answers_as_triton_without_gpus(client: grpcclient.InferenceServerClient,
                                                          region: object) -> None:
    assert not client.get_cuda_shared_memory_status().regions
    error = _error(lambda: client.get_cuda_shared_memory_status("x"))
    assert (error.status(), error.message()) == (
        "StatusCode.NOT_FOUND", "Unable to find cuda shared memory region: 'x'")
    error = _error(lambda: client.register_cuda_shared_memory("x", b"aGFuZGxl", 0, 64))
    assert (error.status(), error.message()) == (
        "StatusCode.INVALID_ARGUMENT", "failed to register shared memory region: invalid args")
    error = _error(lambda: client.register_cuda_shared_memory("", b"", 0, 0))  # Triton's L0_grpc aio call
    assert (error.status(), error.message()) == (
        "StatusCode.INVALID_ARGUMENT", "failed to register shared memory region: invalid args")
    error = _error(lambda: client.register_cuda_shared_memory("r", b"aGFuZGxl", 0, 64))
    assert (error.status(), error.message()) == (
        "StatusCode.ALREADY_EXISTS", "shared memory region 'r' already in manager")
    client.unregister_cuda_shared_memory()
    client.unregister_cuda_shared_memory("r")  # leaves the system region alone
    assert "r" in client.get_system_shared_memory_status().regions


def test_unregister_while_in_use(client: grpcclient.InferenceServerClient, region: object, tmp_path: Path) -> None:
    """Refused while a request holds the region (Triton 2.51's answer), done once it has finished."""
    started, release = tmp_path / "started", tmp_path / "release"
    tensor = grpcclient.InferInput("INPUT0", [16], "INT32")
    tensor.set_shared_memory("r", 64)
    results: list = []
    thread = threading.Thread(target=lambda: results.append(client.infer(
        "gate", [tensor], parameters={"started": str(started), "release": str(release)})))
    thread.start()
    try:
        wait_for_file(started)
        error = _error(lambda: client.unregister_system_shared_memory("r"))
        assert (error.status(), error.message()) == (
            "StatusCode.INTERNAL", "Cannot unregister shared memory region 'r', it is currently in use.")
        error = _error(lambda: client.unregister_system_shared_memory())
        assert error.message() == "Failed to unregister the following system shared memory regions: r ,"
    finally:
        release.touch()
        thread.join(30)
    np.testing.assert_array_equal(results[0].as_numpy("OUTPUT0"), np.arange(16))
    client.unregister_system_shared_memory("r")
    assert not client.get_system_shared_memory_status().regions
