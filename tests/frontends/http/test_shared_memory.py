"""The shared-memory extension over HTTP, driven by tritonclient.http and tritonclient.utils.shared_memory the way
tritonclient's simple_http_shm_client.py and simple_http_shm_string_client.py drive Triton, plus Triton 2.51's
answers (codes and words, checked against the real server) to what it refuses, and a server that keeps serving."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient import utils
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

SYSTEM = "/v2/systemsharedmemory"
CUDA = "/v2/cudasharedmemory"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("shm_models")
    write_shm_models(repo)
    running = RunningServer([repo], "--allow-grpc=false")
    yield running
    running.stop()


@pytest.fixture
def region(server: RunningServer) -> Iterator[object]:
    """A 256-byte region registered as "r": INPUT0 (0..15) at 0, INPUT1 (ones) at 64, room for outputs from 128."""
    handle = shm.create_shared_memory_region("r", key("r"), 256)
    shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.int32)])
    shm.set_shared_memory_region(handle, [np.ones(16, dtype=np.int32)], offset=64)
    assert _call(server, "POST", f"{SYSTEM}/region/r/register", {"key": key("r"), "byte_size": 256}) == (200, None)
    yield handle
    _call(server, "POST", f"{SYSTEM}/unregister")
    shm.destroy_shared_memory_region(handle)


def _call(server: RunningServer, method: str, path: str, body: object = None) -> tuple[int, object]:
    data = body if isinstance(body, (str, type(None))) else json.dumps(body)
    status, _, reply = server.request(method, path, data)
    return status, json.loads(reply) if reply else None


def _infer(server: RunningServer, inputs: list[dict], outputs: list[dict] | None = None,
           model: str = "simple") -> tuple[int, object]:
    body: dict = {"inputs": inputs}
    if outputs is not None:
        body["outputs"] = outputs
    return _call(server, "POST", f"/v2/models/{model}/infer", body)


def _tensor(name: str, region: object = "r", size: object = 64, offset: object = None, **fields: object) -> dict:
    params = {"shared_memory_region": region, "shared_memory_byte_size": size}
    if offset is not None:
        params["shared_memory_offset"] = offset
    params.update(fields.pop("parameters", {}))  # type: ignore[arg-type]
    return {"name": name, "shape": [1, 16], "datatype": "INT32", "parameters": params, **fields}


def _inputs() -> list[dict]:
    return [_tensor("INPUT0"), _tensor("INPUT1", offset=64)]


# --- tritonclient's examples ---------------------------------------------------------------------------------------

def test_simple_http_shm_client(client: httpclient.InferenceServerClient) -> None:
    status = simple_roundtrip(client, httpclient)
    assert status == [{"name": "input_data", "key": key("input_simple"), "offset": 0, "byte_size": 128},
                      {"name": "output_data", "key": key("output_simple"), "offset": 0, "byte_size": 128}]
    assert client.get_system_shared_memory_status() == []


def test_simple_http_shm_string_client(client: httpclient.InferenceServerClient) -> None:
    status = string_roundtrip(client, httpclient)
    assert [(r["name"], r["byte_size"]) for r in status] == [
        ("input0_data", 86), ("input1_data", 80), ("output0_data", 87), ("output1_data", 86)]


# --- inference ---------------------------------------------------------------------------------------------------

def test_outputs_into_shared_memory_are_described_without_data(server: RunningServer, region: object) -> None:
    status, reply = _infer(server, _inputs(), [_tensor("OUTPUT0", offset=128, parameters={"binary_data": False}),
                                               {"name": "OUTPUT1"}])
    assert status == 200
    assert reply["outputs"] == [  # type: ignore[index]
        {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]},
        {"name": "OUTPUT1", "datatype": "INT32", "shape": [1, 16], "data": [-1] + list(range(15))}]
    np.testing.assert_array_equal(shm.get_contents_as_numpy(region, np.int32, [16], offset=128), np.arange(1, 17))


def test_shared_memory_inputs_with_binary_outputs(client: httpclient.InferenceServerClient, region: object) -> None:
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory("r", 64)
    inputs[1].set_shared_memory("r", 64, offset=64)
    result = client.infer("simple", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT1", binary_data=True)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.arange(-1, 15).reshape(1, 16))


def test_an_offset_registration_reads_its_own_window(client: httpclient.InferenceServerClient) -> None:
    """The region is the key's bytes from its offset on (any offset: Triton 2.51 wants it page aligned)."""
    handle = shm.create_shared_memory_region("w", key("w"), 4096 + 200)
    try:
        shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.int32)], offset=4096 + 72)
        client.register_system_shared_memory("w", key("w"), 128, offset=4096 + 8)
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_shared_memory("w", 64, offset=64)
        inputs[1].set_shared_memory("w", 64, offset=64)
        output = httpclient.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory("w", 64)
        client.infer("simple", inputs, outputs=[output])
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.int32, [16], offset=4096 + 8),
                                      np.arange(16) * 2)
        assert client.get_system_shared_memory_status("w") == [
            {"name": "w", "key": key("w"), "offset": 4096 + 8, "byte_size": 128}]
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(handle)


def test_bytes_output_into_shared_memory(server: RunningServer, region: object) -> None:
    strings = np.array([str(i).encode() for i in range(16)], dtype=np.object_)
    data = utils.serialize_byte_tensor(strings).item()
    shm.set_shared_memory_region(region, [np.frombuffer(data, dtype=np.uint8)])
    inputs = [_tensor(n, size=len(data), datatype="BYTES") for n in ("INPUT0", "INPUT1")]
    status, reply = _infer(server, inputs, [_tensor("OUTPUT0", size=100, offset=128)], model="simple_string")
    assert status == 200
    assert reply["outputs"] == [{"name": "OUTPUT0", "datatype": "BYTES", "shape": [1, 16]}]  # type: ignore[index]
    got = shm.get_contents_as_numpy(region, np.object_, [16], offset=128)
    assert list(got) == [str(2 * i).encode() for i in range(16)]
    # Too small a window for the serialized strings: Triton's words, a 500.
    status, reply = _infer(server, inputs, [_tensor("OUTPUT0", size=20, offset=128)], model="simple_string")
    assert (status, reply) == (500, {"error": "shared memory size specified with the request for output 'OUTPUT0' "
                                              "(20 bytes) should be at least 91 bytes to hold the results"})
    status, reply = _infer(server, [_tensor("INPUT0", size=len(data) - 6, datatype="BYTES"), inputs[1]],
                           model="simple_string")
    assert (status, reply) == (400, {"error": "[request id: <id_unknown>] expected 16 string elements for inference "
                                              "input 'INPUT0' for model 'simple_string', got 15"})


@pytest.mark.parametrize(("inputs", "outputs", "status", "message"), [
    ([_tensor("INPUT0", region="nope"), _tensor("INPUT1", offset=64)], None, 404,
     "Unable to find shared memory region: 'nope'"),
    ([_tensor("INPUT0", offset=256), _tensor("INPUT1", offset=64)], None, 400,
     "Invalid offset for shared memory region: 'r'"),
    ([_tensor("INPUT0", offset=224), _tensor("INPUT1", offset=64)], None, 400,
     "Invalid offset + byte size for shared memory region: 'r'"),
    ([_tensor("INPUT0", size=60), _tensor("INPUT1", offset=64)], None, 400,
     "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 60"),
    ([_tensor("INPUT0", region=3), _tensor("INPUT1", offset=64)], None, 500,
     "Unable to parse 'shared_memory_region': attempt to access JSON non-string as string"),
    ([_tensor("INPUT0", offset="1"), _tensor("INPUT1", offset=64)], None, 500,
     "Unable to parse 'shared_memory_offset': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ([_tensor("INPUT0", data=[0] * 16), _tensor("INPUT1", offset=64)], None, 400,
     "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
     "'shared_memory_region' in 'parameters'. But set 'data' 'shared_memory_region'"),
    (_inputs(), [_tensor("OUTPUT0", size=32, offset=128)], 500,
     "shared memory size specified with the request for output 'OUTPUT0' (32 bytes) should be at least 64 bytes to "
     "hold the results"),
    (_inputs(), [_tensor("OUTPUT0", region="nope")], 404, "Unable to find shared memory region: 'nope'"),
    (_inputs(), [_tensor("OUTPUT0", size=0)], 400, "Invalid offset + byte size for shared memory region: 'r'"),
    (_inputs(), [_tensor("OUTPUT0", parameters={"binary_data": True})], 400,
     "Output can't set both 'shared_memory_region' and 'binary_data'"),
    (_inputs(), [_tensor("OUTPUT0", parameters={"classification": 2})], 400,
     "Output can't set both 'shared_memory_region' and 'classification'"),
])
def test_infer_errors(server: RunningServer, region: object, inputs: list[dict], outputs: list[dict] | None,
                      status: int, message: str) -> None:
    assert _infer(server, inputs, outputs) == (status, {"error": message})
    assert _infer(server, _inputs())[0] == 200  # and it keeps serving


# --- control: register, status, unregister -------------------------------------------------------------------------

@pytest.mark.parametrize(("method", "path", "body", "status", "message"), [
    ("POST", "/region/r/register", {"key": key("r"), "byte_size": 64}, 400,
     "shared memory region 'r' already in manager"),
    ("POST", "/region/x/register", {"key": key("absent"), "byte_size": 64}, 500,
     f"Unable to open shared memory region: '{key('absent')}'"),
    ("POST", "/region/x/register", {"key": key("r"), "offset": 200, "byte_size": 64}, 400,
     "failed to register shared memory region 'x': invalid args"),
    ("POST", "/region/x/register", {"key": key("r"), "byte_size": 0}, 400,
     "failed to register shared memory region 'x': unable to process address spaceInvalid argument"),
    ("POST", "/region/x/register", {"byte_size": 64}, 400, "Shared memory register request has no 'key' field"),
    ("POST", "/region/x/register", {"key": key("r")}, 400, "Shared memory register request has no 'byte_size' field"),
    ("POST", "/region/x/register", {"key": 3, "byte_size": 64}, 500, "attempt to access JSON non-string as string"),
    ("POST", "/region/x/register", {"key": key("r"), "byte_size": -1}, 500,
     "attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ("POST", "/region/x/register", "", 500, "failed to parse the request JSON buffer: The document is empty. at 0"),
    ("POST", "/register", {"key": key("r"), "byte_size": 64}, 400,
     "'region name' is necessary to register system shared memory region"),
    ("GET", "/region/x/status", None, 404, "Unable to find system shared memory region: 'x'"),
    ("POST", "/status", None, 405, "Method Not Allowed"),
    ("GET", "/region/r/register", None, 405, "Method Not Allowed"),
    ("GET", "/unregister", None, 405, "Method Not Allowed"),
    ("GET", "/region/r/statuses", None, 404, "Not Found"),
    ("GET", "/region/r", None, 404, "Not Found"),
])
def test_control_errors(server: RunningServer, region: object, method: str, path: str, body: object, status: int,
                        message: str) -> None:
    assert _call(server, method, SYSTEM + path, body) == (status, {"error": message})
    assert _call(server, "GET", f"{SYSTEM}/status")[1] == [
        {"name": "r", "key": key("r"), "offset": 0, "byte_size": 256}]


def test_same_key_twice_and_unknown_names(server: RunningServer, region: object) -> None:
    # Two windows of one object (Triton 2.51 trips over its reused descriptor here; later Tritons allow it).
    assert _call(server, "POST", f"{SYSTEM}/region/r2/register", {"key": key("r"), "offset": 64, "byte_size": 64})[0] \
        == 200
    assert [r["name"] for r in _call(server, "GET", f"{SYSTEM}/status")[1]] == ["r", "r2"]  # type: ignore[union-attr]
    assert _call(server, "POST", f"{SYSTEM}/region/nope/unregister") == (200, None)
    assert _call(server, "POST", f"{SYSTEM}/region/r2/unregister") == (200, None)
    assert _call(server, "GET", f"{SYSTEM}/region/r/status")[1] == [
        {"name": "r", "key": key("r"), "offset": 0, "byte_size": 256}]


def test_unregister_releases_the_mapping(server: RunningServer, region: object) -> None:
    assert mapped(server.proc.pid, key("r"))
    assert _call(server, "POST", f"{SYSTEM}/region/r/unregister") == (200, None)
    assert not mapped(server.proc.pid, key("r"))


def test_cuda_shared_memory_answers_as_triton_without_gpus(server: RunningServer, region: object) -> None:
    assert _call(server, "GET", f"{CUDA}/status") == (200, [])
    assert _call(server, "GET", f"{CUDA}/region/x/status") == (
        404, {"error": "Unable to find cuda shared memory region: 'x'"})
    assert _call(server, "GET", f"{CUDA}/region/r/status") == (
        404, {"error": "The region named 'r' is registered as system shared memory, not CUDA shared memory"})
    handle = base64.b64encode(bytes(64)).decode()  # a cudaIpcMemHandle_t's size: no GPU can open it here
    assert _call(server, "POST", f"{CUDA}/region/x/register", {"raw_handle": {"b64": handle}, "device_id": 0,
                                                                "byte_size": 64}) == (
        400, {"error": "failed to register shared memory region: invalid args"})
    # tritonclient.http's own call, whose error clients match on as Triton's QA tests do.
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException, match="failed to register shared memory region.*invalid args"):
        client.register_cuda_shared_memory("x", handle.encode(), 0, 64)  # cudashm.get_raw_handle's base64
    assert _call(server, "POST", f"{CUDA}/region/x/register", {"raw_handle": {"b64": "aGFuZGxl"}, "device_id": 0,
                                                                "byte_size": 64}) == (
        400, {"error": "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"})
    assert _call(server, "POST", f"{CUDA}/region/x/register", {"device_id": 0, "byte_size": 64}) == (
        400, {"error": "Shared memory register request has no 'raw_handle' field"})
    assert _call(server, "POST", f"{CUDA}/region/r/register", {"raw_handle": {"b64": handle}, "device_id": 0,
                                                                "byte_size": 64}) == (
        400, {"error": "shared memory region 'r' already in manager"})
    assert _call(server, "POST", f"{CUDA}/register", "") == (
        400, {"error": "'region name' is necessary to register cuda shared memory region"})
    assert _call(server, "POST", f"{CUDA}/unregister") == (200, None)
    assert _call(server, "POST", f"{CUDA}/region/r/unregister") == (200, None)  # leaves the system region alone
    assert _call(server, "GET", f"{SYSTEM}/region/r/status")[0] == 200


def test_unregister_while_in_use(server: RunningServer, region: object, tmp_path: Path) -> None:
    """Refused while a request holds the region (Triton 2.51's answer), done once it has finished."""
    started, release = tmp_path / "started", tmp_path / "release"
    body = {"inputs": [_tensor("INPUT0", shape=[16])], "parameters": {"started": str(started),
                                                                     "release": str(release)}}
    replies: list = []
    thread = threading.Thread(target=lambda: replies.append(_call(server, "POST", "/v2/models/gate/infer", body)))
    thread.start()
    try:
        wait_for_file(started)
        assert _call(server, "POST", f"{SYSTEM}/region/r/unregister") == (
            500, {"error": "Cannot unregister shared memory region 'r', it is currently in use."})
        assert _call(server, "POST", f"{SYSTEM}/unregister") == (
            500, {"error": "Failed to unregister the following system shared memory regions: r ,"})
    finally:
        release.touch()
        thread.join(30)
    assert replies[0][0] == 200 and replies[0][1]["outputs"][0]["data"] == list(range(16))
    assert _call(server, "POST", f"{SYSTEM}/region/r/unregister") == (200, None)
    assert _call(server, "GET", f"{SYSTEM}/status") == (200, [])


def test_client_helpers_raise_triton_errors(client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.register_system_shared_memory("x", key("absent"), 64)
    assert info.value.message() == f"Unable to open shared memory region: '{key('absent')}'"
    with pytest.raises(InferenceServerException) as info:
        client.get_system_shared_memory_status("x")
    assert info.value.message() == "Unable to find system shared memory region: 'x'"
    assert client.get_cuda_shared_memory_status() == []
    client.unregister_cuda_shared_memory()
    assert client.is_server_live()


def test_shutdown_with_regions_registered(tmp_path: Path) -> None:
    """Regions a client never unregistered are released at shutdown; the server stops cleanly."""
    write_shm_models(tmp_path)
    running = RunningServer([tmp_path], "--allow-grpc=false")
    handle = shm.create_shared_memory_region("left", key("left"), 64)
    try:
        assert _call(running, "POST", f"{SYSTEM}/region/left/register", {"key": key("left"), "byte_size": 64})[0] \
            == 200
        assert mapped(running.proc.pid, key("left"))
        assert running.stop() == 0
        assert "Traceback" not in running.log_path.read_text()
    finally:
        running.stop()
        shm.destroy_shared_memory_region(handle)
