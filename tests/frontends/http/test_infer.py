"""Inference over KServe v2 HTTP with the unmodified tritonclient.http, JSON and binary."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests.server import ROOT, RunningServer


@pytest.fixture
def client(examples_server: RunningServer):
    with httpclient.InferenceServerClient(examples_server.url) as c:
        yield c


def _inputs(a: np.ndarray, b: np.ndarray, binary: bool) -> list[httpclient.InferInput]:
    inputs = []
    for name, data in (("INPUT0", a), ("INPUT1", b)):
        tensor = httpclient.InferInput(name, list(data.shape), np_to_triton_dtype(data.dtype))
        tensor.set_data_from_numpy(data, binary_data=binary)
        inputs.append(tensor)
    return inputs


@pytest.mark.parametrize("binary_in", [False, True])
@pytest.mark.parametrize("binary_out", [False, True])
def test_add_sub(client: httpclient.InferenceServerClient, binary_in: bool, binary_out: bool) -> None:
    a = np.random.rand(4).astype(np.float32)
    b = np.random.rand(4).astype(np.float32)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary_out) for n in ("OUTPUT0", "OUTPUT1")]
    result = client.infer("add_sub", _inputs(a, b, binary_in), request_id="7", outputs=outputs)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
    response = result.get_response()
    assert response["id"] == "7"
    assert response["model_name"] == "add_sub"
    assert response["model_version"] == "1"


def test_requested_output_subset(client: httpclient.InferenceServerClient) -> None:
    a = np.arange(4, dtype=np.float32)
    b = np.ones(4, dtype=np.float32)
    result = client.infer("add_sub", _inputs(a, b, True), outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0") is None
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]


def test_explicit_version(client: httpclient.InferenceServerClient) -> None:
    a = np.arange(4, dtype=np.float32)
    result = client.infer("add_sub", _inputs(a, a, False), model_version="1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)


@pytest.mark.parametrize("binary", [False, True])
def test_bytes_identity_batched(client: httpclient.InferenceServerClient, binary: bool) -> None:
    data = np.array([[b"hello", b"", "caf\u00e9".encode()], [b"a", b"bb", b"ccc"]], dtype=np.object_)
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data, binary_data=binary)
    result = client.infer("identity_bytes", [tensor],
                          outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)])
    out = result.as_numpy("OUTPUT0")
    assert out.shape == (2, 3)
    assert [x if isinstance(x, bytes) else x.encode() for x in out.ravel()] == list(data.ravel())


def test_unknown_model_raises(client: httpclient.InferenceServerClient) -> None:
    a = np.zeros(4, dtype=np.float32)
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found"):
        client.infer("nope", _inputs(a, a, False))


def test_health_and_metadata(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("add_sub")
    assert not client.is_model_ready("nope")
    meta = client.get_model_metadata("identity_bytes")
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "BYTES", "shape": [-1, -1]}]
    config = client.get_model_config("add_sub")
    assert config["max_batch_size"] == 0 and config["input"][0]["dims"] == [4]
    server = client.get_server_metadata()
    assert server["name"] == "triton"  # --id's default, as Triton's
    # Triton's list and order, less CUDA shared memory, which naiad can't serve
    golden = json.loads((ROOT / "tests/golden/triton-2.51/good/server/server_metadata.json").read_text())
    triton = golden["body"]["extensions"]
    assert server["extensions"] == [e for e in triton if e != "cuda_shared_memory"]


def test_statistics_count_requests(examples_server: RunningServer) -> None:
    with httpclient.InferenceServerClient(examples_server.url) as client:
        before = client.get_inference_statistics("add_sub")["model_stats"][0]
        a = np.ones(4, dtype=np.float32)
        for _ in range(3):
            client.infer("add_sub", _inputs(a, a, True))
        after = client.get_inference_statistics("add_sub", "1")["model_stats"][0]
    assert after["inference_count"] - before["inference_count"] == 3
    assert after["execution_count"] - before["execution_count"] == 3
    stats = after["inference_stats"]
    assert stats["success"]["count"] - before["inference_stats"]["success"]["count"] == 3
    for key in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert stats[key]["count"] >= 3 and stats[key]["ns"] > 0
    assert after["last_inference"] > 0
