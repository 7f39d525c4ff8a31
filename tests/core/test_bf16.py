"""BF16 end to end: the wire's 2-byte words as ml_dtypes.bfloat16 arrays, through HTTP's binary extension and
gRPC's raw contents, into a Python model and an onnxruntime model and back; JSON refuses it in Triton's words.
tritonclient (HTTP and gRPC) against a running server."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from tests import onnx_graphs as g
from tests.models import write_model
from tests.server import ROOT, RunningServer

PY_CONFIG = """
    name: "bf16_py"
    backend: "python"
    max_batch_size: 8
    input [{ name: "INPUT0", data_type: TYPE_BF16, dims: [ -1 ] }]
    output [{ name: "OUTPUT0", data_type: TYPE_BF16, dims: [ -1 ] }, { name: "DTYPE", data_type: TYPE_STRING, dims: [ 1 ] },
            { name: "REFUSED", data_type: TYPE_STRING, dims: [ 1 ] }]
"""

# As Triton's pb_utils: as_numpy() refuses BF16 (numpy has no such type) and DLPack carries it. Without torch the
# model passes the input through DLPack (kDLBfloat both ways); with torch (TORCH=1) it doubles it in bfloat16,
# as python_backend's identity_bf16 example does.
PY_MODEL = """
    import os
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "INPUT0")
                try:
                    x.as_numpy()
                    refused = b"as_numpy accepted BF16"
                except pb_utils.TritonModelException as e:
                    refused = str(e).encode()
                if os.environ.get("TORCH") == "1":
                    import torch
                    t = torch.utils.dlpack.from_dlpack(x.to_dlpack())
                    y = pb_utils.Tensor.from_dlpack("OUTPUT0", torch.utils.dlpack.to_dlpack(t * 2))
                    seen = str(t.dtype).encode()
                else:
                    y = pb_utils.Tensor.from_dlpack("OUTPUT0", x.to_dlpack())
                    seen = str(pb_utils.Tensor.from_dlpack("X", x).triton_dtype()).encode()
                rows = x.shape()[0]
                out.append(pb_utils.InferenceResponse([y, pb_utils.Tensor("DTYPE", np.array([[seen]] * rows, dtype=np.object_)),
                    pb_utils.Tensor("REFUSED", np.array([[refused]] * rows, dtype=np.object_))]))
            return out
"""

ONNX_CONFIG = """
    name: "bf16_onnx"
    platform: "onnxruntime_onnx"
    max_batch_size: 8
    input [{ name: "INPUT0", data_type: TYPE_BF16, dims: [ -1 ] }]
    output [{ name: "OUTPUT0", data_type: TYPE_BF16, dims: [ -1 ] }, { name: "WIDE", data_type: TYPE_FP32, dims: [ -1 ] }]
"""


def _onnx_model() -> object:
    """OUTPUT0 = INPUT0 doubled (computed in FP32: onnxruntime's CPU kernels for BF16 are few), WIDE = the FP32."""
    nodes = [helper.make_node("Cast", ["INPUT0"], ["WIDE"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["WIDE", "WIDE"], ["DOUBLED"]),
             helper.make_node("Cast", ["DOUBLED"], ["OUTPUT0"], to=TensorProto.BFLOAT16)]
    return g.model(nodes, [g.tensor("INPUT0", "TYPE_BF16", ["batch", "n"])],
                   [g.tensor("OUTPUT0", "TYPE_BF16", ["batch", "n"]), g.tensor("WIDE", "TYPE_FP32", ["batch", "n"])])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("bf16")
    write_model(repo, "bf16_py", PY_CONFIG, PY_MODEL)
    g.write(repo, "bf16_onnx", _onnx_model(), ONNX_CONFIG)  # type: ignore[arg-type]
    running = RunningServer([repo])
    yield running
    running.stop()


# Exactly representable in BF16 (8 bits of mantissa), so doubling is exact too. 20,000 per row: past the
# Python backend's inline limit, through its shared memory.
VALUES = np.array([[1.5, -2.0, 3.25, 1000.0] * 5000, [0.5, 7.0, -0.125, 96.0] * 5000])


def _client(server: RunningServer, protocol: str) -> tuple:
    if protocol == "http":
        return httpclient, httpclient.InferenceServerClient(server.url)
    return grpcclient, grpcclient.InferenceServerClient(server.grpc_url)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["bf16_py", "bf16_onnx"])
def test_bf16_round_trip(server: RunningServer, protocol: str, model: str) -> None:
    module, client = _client(server, protocol)
    data = VALUES.astype(triton_to_np_dtype("BF16"))  # ml_dtypes.bfloat16 (np.float32 in older tritonclients)
    inp = module.InferInput("INPUT0", list(data.shape), "BF16")
    inp.set_data_from_numpy(data)
    names = ["OUTPUT0", *(("DTYPE", "REFUSED") if model == "bf16_py" else ("WIDE",))]
    outputs = [module.InferRequestedOutput(n, binary_data=True) if module is httpclient
               else module.InferRequestedOutput(n) for n in names]
    result = client.infer(model, [inp], outputs=outputs)
    out = result.get_output("OUTPUT0")
    assert (out["datatype"] if module is httpclient else out.datatype) == "BF16"
    expected = VALUES if model == "bf16_py" else VALUES * 2  # the Python model passes it through DLPack
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0").astype(np.float32), expected)
    if model == "bf16_py":
        # the model saw BF16 (Triton's enum: 14) through DLPack, and as_numpy() refused it in Triton's words
        assert set(result.as_numpy("DTYPE").ravel().tolist()) == {b"14"}
        assert set(result.as_numpy("REFUSED").ravel().tolist()) == {
            b"Tensor dtype is BF16 and cannot be converted to NumPy. Use to_dlpack() and from_dlpack() instead."}
    else:
        np.testing.assert_array_equal(result.as_numpy("WIDE"), VALUES.astype(np.float32))


def test_bf16_through_torch_dlpack(tmp_path: Path) -> None:
    """python_backend's identity_bf16 way: torch reads the input's bfloat16 values from to_dlpack() and hands its
    result back through Tensor.from_dlpack; the client gets the doubled BF16 values."""
    torch = pytest.importorskip("torch")
    write_model(tmp_path, "bf16_py", PY_CONFIG, PY_MODEL)
    # the worker imports torch from wherever this process found it
    path = os.pathsep.join([str(Path(torch.__file__).parent.parent), os.environ.get("PYTHONPATH", "")])
    running = RunningServer([tmp_path], env={"TORCH": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{path}"})
    try:
        module, client = _client(running, "grpc")
        data = VALUES.astype(triton_to_np_dtype("BF16"))
        inp = module.InferInput("INPUT0", list(data.shape), "BF16")
        inp.set_data_from_numpy(data)
        result = client.infer("bf16_py", [inp])
        assert result.get_output("OUTPUT0").datatype == "BF16"
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0").astype(np.float32), VALUES * 2)
        assert set(result.as_numpy("DTYPE").ravel().tolist()) == {b"torch.bfloat16"}
    finally:
        running.stop()


def test_bf16_metadata_and_config(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    meta = client.get_model_metadata("bf16_onnx")
    assert [(t["name"], t["datatype"]) for t in meta["inputs"]] == [("INPUT0", "BF16")]
    assert client.get_model_config("bf16_py")["input"][0]["data_type"] == "TYPE_BF16"


def test_bf16_in_json_is_refused_as_triton_does(server: RunningServer) -> None:
    status, _, body = server.request("POST", "/v2/models/bf16_py/infer", (
        '{"inputs":[{"name":"INPUT0","datatype":"BF16","shape":[1,2],"data":[1,2]}]}'))
    assert (status, body) == (400, b'{"error":"receiving BF16 data via JSON is not supported. Please use the '
                                   b'binary data format for input INPUT0"}')
    client = httpclient.InferenceServerClient(server.url)
    inp = httpclient.InferInput("INPUT0", [1, 4], "BF16")
    inp.set_data_from_numpy(VALUES[:1, :4].astype(triton_to_np_dtype("BF16")))
    with pytest.raises(InferenceServerException, match="sending BF16 data via JSON is not supported"):
        client.infer("bf16_py", [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
