"""Outputs as Triton's core hands them to clients: an output ``reshape`` undone to the config's dims,
classification ranked per batch row only on batching models, and a Python model's outputs passed through in
the shape it made them. Driven by tritonclient (HTTP and gRPC) against a running server."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests import onnx_graphs as g
from tests.models import write_model
from tests.server import RunningServer

SIZE = 32  # densenet's 224 works the same; a smaller image keeps the test quick

DENSENET = f"""
    name: "densenet_onnx"
    platform: "onnxruntime_onnx"
    max_batch_size: 0
    input [{{ name: "data_0", data_type: TYPE_FP32, format: FORMAT_NCHW, dims: [ 3, {SIZE}, {SIZE} ],
              reshape {{ shape: [ 1, 3, {SIZE}, {SIZE} ] }} }}]
    output [{{ name: "fc6_1", data_type: TYPE_FP32, dims: [ 1000 ], reshape {{ shape: [ 1, 1000, 1, 1 ] }},
               label_filename: "labels.txt" }}]
"""

RESHAPE_BATCH = """
    name: "reshape_batch"
    platform: "onnxruntime_onnx"
    max_batch_size: 4
    input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ], reshape { shape: [ 2, 2 ] } }]
    output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ], reshape { shape: [ 2, 2 ] },
              label_filename: "labels.txt" }]
"""

PY_SHAPES = """
    name: "py_shapes"
    backend: "python"
    input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }]
    output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }]
"""

PY_SHAPES_MODEL = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            # Not the configured [4] FP32: Triton hands this on as it is.
            return [pb_utils.InferenceResponse([pb_utils.Tensor(
                        "OUTPUT0", np.arange(6, dtype=np.float64).reshape(2, 3) + r.inputs()[0].as_numpy()[0])])
                    for r in requests]
"""

PY_OUTPUTS = """
    name: "py_outputs"
    backend: "python"
    input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }]
    output [{ name: "A", data_type: TYPE_FP32, dims: [ 1 ] }, { name: "B", data_type: TYPE_FP32, dims: [ 1 ] }]
"""

# INPUT0 says which outputs to make: 0 the config's two, 1 only A, 2 A and one the config doesn't declare.
PY_OUTPUTS_MODEL = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for r in requests:
                x = r.inputs()[0].as_numpy()
                names = [["A", "B"], ["A"], ["A", "EXTRA"]][int(x[0])]
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(n, x + i) for i, n in enumerate(names)]))
            return responses
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("outputs")
    folder = g.write(repo, "densenet_onnx", g.image_classifier(size=SIZE), DENSENET)
    (folder / "labels.txt").write_text("".join(f"class_{i}\n" for i in range(1000)))
    folder = g.write(repo, "reshape_batch", g.identity("TYPE_FP32", ["batch", 2, 2]), RESHAPE_BATCH)
    (folder / "labels.txt").write_text("a\nb\nc\nd\n")
    write_model(repo, "py_shapes", PY_SHAPES, PY_SHAPES_MODEL)
    write_model(repo, "py_outputs", PY_OUTPUTS, PY_OUTPUTS_MODEL)
    running = RunningServer([repo])
    yield running
    running.stop()


def _image(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).random((3, SIZE, SIZE), dtype=np.float32)


def _expected_scores(server: RunningServer, image: np.ndarray) -> np.ndarray:
    """The model's scores, recomputed here from its weights (channel means through W)."""
    proto = g.image_classifier(size=SIZE)
    weights = next(t for t in proto.graph.initializer if t.name == "W")
    w = np.array(weights.float_data, dtype=np.float32).reshape(3, 1000)
    return image.mean(axis=(1, 2)) @ w


def test_densenet_output_has_its_config_dims_over_http(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    image = _image()
    inp = httpclient.InferInput("data_0", [3, SIZE, SIZE], "FP32")  # the config dims: the model sees [1,3,S,S]
    inp.set_data_from_numpy(image, binary_data=True)
    result = client.infer("densenet_onnx", [inp])
    scores = result.as_numpy("fc6_1")
    assert scores.shape == (1000,)
    np.testing.assert_allclose(scores, _expected_scores(server, image), rtol=1e-4, atol=1e-4)
    assert result.get_output("fc6_1")["shape"] == [1000]

    ranked = client.infer("densenet_onnx", [inp], outputs=[httpclient.InferRequestedOutput("fc6_1", class_count=2)])
    top = ranked.as_numpy("fc6_1")
    assert top.shape == (2,)  # no batch row on a model without batching, as Triton
    best = np.argsort(-scores, kind="stable")[:2]
    assert [t.decode().split(":")[1:] for t in top] == [[str(i), f"class_{i}"] for i in best]


def test_densenet_output_has_its_config_dims_over_grpc(server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    image = _image(2)
    inp = grpcclient.InferInput("data_0", [3, SIZE, SIZE], "FP32")
    inp.set_data_from_numpy(image)
    result = client.infer("densenet_onnx", [inp])
    assert result.as_numpy("fc6_1").shape == (1000,)
    assert list(result.get_output("fc6_1").shape) == [1000]
    ranked = client.infer("densenet_onnx", [inp], outputs=[grpcclient.InferRequestedOutput("fc6_1", class_count=2)])
    assert ranked.as_numpy("fc6_1").shape == (2,)
    # The metadata image_client reads: the config dims, no batch dimension.
    meta = client.get_model_metadata("densenet_onnx")
    assert [list(t.shape) for t in meta.inputs] == [[3, SIZE, SIZE]]
    assert [list(t.shape) for t in meta.outputs] == [[1000]]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_batching_model_reshape_round_trip_and_per_row_classification(server: RunningServer, protocol: str) -> None:
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.url if protocol == "http" else server.grpc_url)
    data = np.array([[1, 4, 2, 3], [9, 8, 7, 6]], dtype=np.float32)
    inp = module.InferInput("INPUT0", [2, 4], "FP32")
    inp.set_data_from_numpy(data)
    result = client.infer("reshape_batch", [inp])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)  # [2,2,2] from the model, [2,4] out
    ranked = client.infer("reshape_batch", [inp], outputs=[module.InferRequestedOutput("OUTPUT0", class_count=3)])
    top = ranked.as_numpy("OUTPUT0")
    assert top.shape == (2, 3)  # one row per batch entry on a batching model
    assert [[t.decode().split(":", 1)[1] for t in row] for row in top] == [["1:b", "3:d", "2:c"],
                                                                          ["0:a", "1:b", "2:c"]]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_python_model_outputs_pass_through_as_made(server: RunningServer, protocol: str) -> None:
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.url if protocol == "http" else server.grpc_url)
    inp = module.InferInput("INPUT0", [4], "FP32")
    inp.set_data_from_numpy(np.full(4, 10, dtype=np.float32))
    out = client.infer("py_shapes", [inp]).as_numpy("OUTPUT0")
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, np.arange(6, dtype=np.float64).reshape(2, 3) + 10)


def test_the_outputs_a_client_gets_of_those_a_model_made(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.url)

    def infer(which: float, *requested: str) -> httpclient.InferResult:
        inp = httpclient.InferInput("INPUT0", [1], "FP32")
        inp.set_data_from_numpy(np.array([which], dtype=np.float32))
        return client.infer("py_outputs", [inp], outputs=[httpclient.InferRequestedOutput(n) for n in requested]
                            or None)

    def names(result: httpclient.InferResult) -> list[str]:
        return [o["name"] for o in result.get_response()["outputs"]]

    assert names(infer(0)) == ["A", "B"]  # all the config's, none asked for: as made
    assert names(infer(0, "B")) == ["B"]
    assert names(infer(1)) == ["A"]  # fewer than the config's: those
    with pytest.raises(InferenceServerException, match="unexpected inference output 'EXTRA' for model 'py_outputs'"):
        infer(2)
    stats = client.get_inference_statistics("py_outputs")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 3 and stats["inference_stats"]["fail"]["count"] == 1
