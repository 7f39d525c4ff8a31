"""Triton's example models (``simple``, ``simple_int8``, ``simple_string`` as ONNX graphs built here with the
same names, datatypes, dims and arithmetic; ``simple_identity`` in Python), driven the way Triton's own example
clients drive them: simple_http_infer_client, simple_http_string_infer_client, grpc_explicit_int8_content_client
and their gRPC twins; the health/metadata and model-control examples too."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests import onnx_graphs as g
from tests.server import RunningServer
from tests.triton_examples import write_simple

@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("examples")
    write_simple(repo)
    running = RunningServer([repo])
    yield running
    running.stop()


@pytest.fixture
def http(server: RunningServer) -> Iterator[httpclient.InferenceServerClient]:
    with httpclient.InferenceServerClient(server.url) as c:
        yield c


@pytest.fixture
def grpc(server: RunningServer):
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        yield c


@pytest.mark.parametrize(("model", "dtype", "wire"), [("simple", np.int32, "INT32"), ("simple_int8", np.int8, "INT8")])
@pytest.mark.parametrize("binary", [True, False])
def test_simple_http_infer_client(http: httpclient.InferenceServerClient, model: str, dtype: type, wire: str,
                                  binary: bool) -> None:
    input0 = np.expand_dims(np.arange(16, dtype=dtype), 0)
    input1 = np.ones((1, 16), dtype=dtype)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], wire), httpclient.InferInput("INPUT1", [1, 16], wire)]
    inputs[0].set_data_from_numpy(input0, binary_data=binary)
    inputs[1].set_data_from_numpy(input1, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary)]
    result = http.infer(model, inputs, outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), input0 + input1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), input0 - input1)
    assert result.as_numpy("OUTPUT0").dtype == dtype


def test_simple_http_string_infer_client(http: httpclient.InferenceServerClient) -> None:
    in0 = np.expand_dims(np.arange(16, dtype=np.int32), 0)
    in1 = np.ones((1, 16), dtype=np.int32)
    input0 = np.array([str(x).encode() for x in in0.ravel()], dtype=np.object_).reshape(in0.shape)
    input1 = np.array([str(x).encode() for x in in1.ravel()], dtype=np.object_).reshape(in1.shape)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "BYTES"), httpclient.InferInput("INPUT1", [1, 16], "BYTES")]
    inputs[0].set_data_from_numpy(input0, binary_data=True)
    inputs[1].set_data_from_numpy(input1, binary_data=False)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
    result = http.infer("simple_string", inputs, outputs=outputs)
    assert [int(x) for x in result.as_numpy("OUTPUT0")[0]] == (in0 + in1)[0].tolist()
    assert [int(x) for x in result.as_numpy("OUTPUT1")[0]] == (in0 - in1)[0].tolist()


@pytest.mark.parametrize("binary", [True, False])
def test_simple_identity_http(http: httpclient.InferenceServerClient, binary: bool) -> None:
    data = np.array([str(x).encode() for x in range(16)], dtype=np.object_).reshape(1, 16)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "BYTES")]
    inputs[0].set_data_from_numpy(data, binary_data=binary)
    result = http.infer("simple_identity", inputs,
                        outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)])
    out = result.as_numpy("OUTPUT0")
    # JSON carries text; the example client compares it as text, as here.
    expected = data if binary else np.array([x.decode() for x in data.ravel()], dtype=np.object_).reshape(1, 16)
    np.testing.assert_array_equal(out, expected)


def test_simple_grpc_infer_client(grpc) -> None:
    import tritonclient.grpc as grpcclient

    for model, dtype, wire in (("simple", np.int32, "INT32"), ("simple_int8", np.int8, "INT8")):
        input0 = np.expand_dims(np.arange(16, dtype=dtype), 0)
        input1 = np.ones((1, 16), dtype=dtype)
        inputs = [grpcclient.InferInput("INPUT0", [1, 16], wire), grpcclient.InferInput("INPUT1", [1, 16], wire)]
        inputs[0].set_data_from_numpy(input0)
        inputs[1].set_data_from_numpy(input1)
        result = grpc.infer(model, inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), input0 + input1)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), input0 - input1)


def test_grpc_explicit_int8_content_client(server: RunningServer, grpc) -> None:
    import grpc as grpclib
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    with grpclib.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="simple_int8")
        for name, values in (("INPUT0", list(range(16))), ("INPUT1", [1] * 16)):
            tensor = service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype="INT8", shape=[1, 16])
            tensor.contents.int_contents[:] = values
            request.inputs.append(tensor)
        response = stub.ModelInfer(request)
        out = [np.frombuffer(raw, dtype=np.int8) for raw in response.raw_output_contents]
        np.testing.assert_array_equal(out[0], np.arange(16) + 1)
        np.testing.assert_array_equal(out[1], np.arange(16) - 1)


def test_simple_grpc_string_and_identity(grpc) -> None:
    import tritonclient.grpc as grpcclient

    data = np.array([str(x).encode() for x in range(16)], dtype=np.object_).reshape(1, 16)
    ones = np.array([b"1"] * 16, dtype=np.object_).reshape(1, 16)
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "BYTES"), grpcclient.InferInput("INPUT1", [1, 16], "BYTES")]
    inputs[0].set_data_from_numpy(data)
    inputs[1].set_data_from_numpy(ones)
    result = grpc.infer("simple_string", inputs)
    assert [int(x) for x in result.as_numpy("OUTPUT0")[0]] == list(range(1, 17))
    identity = [grpcclient.InferInput("INPUT0", [1, 16], "BYTES")]
    identity[0].set_data_from_numpy(data)
    np.testing.assert_array_equal(grpc.infer("simple_identity", identity).as_numpy("OUTPUT0"), data)


def test_model_metadata_matches_tritons_examples(http: httpclient.InferenceServerClient) -> None:
    metadata = http.get_model_metadata("simple_string")
    assert metadata["platform"] == "onnxruntime_onnx"
    assert metadata["inputs"] == [{"name": "INPUT0", "datatype": "BYTES", "shape": [-1, 16]},
                                  {"name": "INPUT1", "datatype": "BYTES", "shape": [-1, 16]}]
    assert http.get_model_metadata("simple_int8")["outputs"][1] == {"name": "OUTPUT1", "datatype": "INT8",
                                                                    "shape": [-1, 16]}


def test_health_metadata_as_the_examples_check_it(server: RunningServer) -> None:
    """simple_http_health_metadata / simple_grpc_health_metadata: the server is named "triton" (``--id``),
    query parameters and extra headers are accepted, an unknown model is "Request for unknown model"."""
    import tritonclient.grpc as grpcclient

    with httpclient.InferenceServerClient(server.url) as http:
        assert http.is_server_live(query_params={"test_1": 1, "test_2": 2}) and http.is_server_ready()
        assert http.is_model_ready("simple") and http.get_server_metadata()["name"] == "triton"
        assert http.get_model_metadata("simple", query_params={"test_1": 1})["name"] == "simple"
        with pytest.raises(InferenceServerException, match="Request for unknown model"):
            http.get_model_metadata("wrong_model_name")
        assert http.get_model_config("simple")["name"] == "simple"
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc:
        assert grpc.is_server_live(headers={"test": "1", "dummy": "2"}) and grpc.is_server_ready()
        assert grpc.get_server_metadata().name == "triton"
        assert grpc.get_model_metadata("simple", headers={"test": "1"}).name == "simple"
        with pytest.raises(InferenceServerException, match="Request for unknown model"):
            grpc.get_model_metadata("wrong_model_name")
        assert grpc.get_model_config("simple").config.name == "simple"


def test_model_control_as_the_examples_drive_it(tmp_path_factory: pytest.TempPathFactory) -> None:
    """simple_http_model_control / simple_grpc_model_control, in explicit mode."""
    import tritonclient.grpc as grpcclient

    repo = tmp_path_factory.mktemp("control")
    write_simple(repo, ("simple", "simple_int8"))
    # The gRPC example uploads a file: naiad needs the operator's consent for that (Triton takes it from anyone).
    server = RunningServer([repo], "--model-control-mode=explicit", "--allow-model-code-upload")
    try:
        with httpclient.InferenceServerClient(server.url) as http:
            assert len(http.get_model_repository_index()) == 2
            http.load_model("simple")
            assert http.is_model_ready("simple")
            with pytest.raises(InferenceServerException, match="failed to load"):
                http.load_model("simple", config='"parameters": {"config": {{"max_batch_size": "16"}}}')
            http.load_model("simple", config='{"max_batch_size":"16"}')
            assert http.get_model_config("simple")["max_batch_size"] == 16
            http.unload_model("simple")
            assert not http.is_model_ready("simple")
            with pytest.raises(InferenceServerException, match="failed to load"):
                http.load_model("wrong_model_name")
        with grpcclient.InferenceServerClient(server.grpc_url) as grpc:
            grpc.load_model("simple", config='{"max_batch_size":"16"}')
            assert grpc.get_model_config("simple").config.max_batch_size == 16
            grpc.unload_model("simple")
            assert not grpc.is_model_ready("simple")
            with pytest.raises(InferenceServerException) as info:
                grpc.load_model("simple", config="{}", files={"file:" + "A" * 256: b"a"})
            assert info.value.status() == "StatusCode.INTERNAL"
            assert "failed to poll from model repository" in info.value.message()
    finally:
        server.stop()


INCEPTION = """
    name: "inception_graphdef"
    platform: "onnxruntime_onnx"
    max_batch_size: 128
    input [{ name: "input", data_type: TYPE_FP32, format: FORMAT_NHWC, dims: [ 8, 8, 3 ] }]
    output [{ name: "InceptionV3/Predictions/Softmax", data_type: TYPE_FP32, dims: [ 1001 ],
              label_filename: "inception_labels.txt" }]
"""


def _inception_graph():
    """inception_graphdef's names and layout (NHWC in, a softmax out under a name with slashes), small images
    and random weights: the example clients check shapes and labels only."""
    from onnx import TensorProto, helper

    weights = np.random.default_rng(0).standard_normal((3, 1001)).astype(np.float32)
    nodes = [helper.make_node("ReduceMean", ["input"], ["pooled"], axes=[1, 2], keepdims=0),
             helper.make_node("MatMul", ["pooled", "W"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["InceptionV3/Predictions/Softmax"], axis=1)]
    return g.model(nodes, [g.tensor("input", "TYPE_FP32", ["batch", 8, 8, 3])],
                   [g.tensor("InceptionV3/Predictions/Softmax", "TYPE_FP32", ["batch", 1001])],
                   [helper.make_tensor("W", TensorProto.FLOAT, [3, 1001], weights.ravel().tolist())]), weights


@pytest.fixture(scope="module")
def inception(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, np.ndarray]]:
    repo = tmp_path_factory.mktemp("inception")
    proto, weights = _inception_graph()
    folder = g.write(repo, "inception_graphdef", proto, INCEPTION)
    (folder / "inception_labels.txt").write_text("".join(f"LABEL_{i}\n" for i in range(1001)))
    running = RunningServer([repo])
    yield running, weights
    running.stop()


def _top(images: np.ndarray, weights: np.ndarray, k: int) -> list[list[int]]:
    logits = images.mean(axis=(1, 2)) @ weights
    return [list(np.argsort(-row, kind="stable")[:k]) for row in logits]


def test_image_client_classification(inception: tuple[RunningServer, np.ndarray]) -> None:
    """image_client.py / grpc_image_client.py on inception_graphdef: metadata read for the NHWC layout, a batch
    sent with class_count (HTTP sync and async, gRPC sync and streaming), "score:index:label" rows back."""
    import queue

    import tritonclient.grpc as grpcclient

    server, weights = inception
    images = np.random.default_rng(3).random((2, 8, 8, 3), dtype=np.float32)
    expected = _top(images, weights, 3)
    with httpclient.InferenceServerClient(server.url) as http:
        meta = http.get_model_metadata("inception_graphdef")
        config = http.get_model_config("inception_graphdef")
        assert meta["inputs"][0]["shape"] == [-1, 8, 8, 3] and config["input"][0]["format"] == "FORMAT_NHWC"
        assert meta["outputs"][0]["name"] == "InceptionV3/Predictions/Softmax"
        inp = httpclient.InferInput("input", list(images.shape), "FP32")
        inp.set_data_from_numpy(images, binary_data=True)
        out = httpclient.InferRequestedOutput("InceptionV3/Predictions/Softmax", binary_data=True, class_count=3)
        answers = [http.infer("inception_graphdef", [inp], outputs=[out], request_id="7"),
                   http.async_infer("inception_graphdef", [inp], outputs=[out], request_id="8").get_result()]
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc:
        assert grpc.get_model_metadata("inception_graphdef").outputs[0].name == "InceptionV3/Predictions/Softmax"
        ginp = grpcclient.InferInput("input", list(images.shape), "FP32")
        ginp.set_data_from_numpy(images)
        gout = grpcclient.InferRequestedOutput("InceptionV3/Predictions/Softmax", class_count=3)
        answers.append(grpc.infer("inception_graphdef", [ginp], outputs=[gout]))
        results: queue.Queue = queue.Queue()
        grpc.start_stream(callback=lambda result, error: results.put((result, error)))
        grpc.async_stream_infer("inception_graphdef", [ginp], outputs=[gout], request_id="9")
        result, error = results.get(timeout=30)
        grpc.stop_stream()
        assert error is None
        answers.append(result)
    for answer in answers:
        rows = answer.as_numpy("InceptionV3/Predictions/Softmax")
        assert rows.shape == (2, 3)
        for row, best in zip(rows, expected):
            fields = [r.decode().split(":") for r in row]
            assert [int(f[1]) for f in fields] == best
            assert [f[2] for f in fields] == [f"LABEL_{i}" for i in best]
            assert 0.0 < float(fields[0][0]) <= 1.0


def test_grpc_client_raw_stub(inception: tuple[RunningServer, np.ndarray]) -> None:
    """grpc_client.py: the generated stub alone, a raw input of the right byte size, the request id echoed and
    the output named with slashes."""
    import grpc as grpclib
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    server, _ = inception
    with grpclib.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ModelReady(service_pb2.ModelReadyRequest(name="inception_graphdef", version="")).ready
        request = service_pb2.ModelInferRequest(model_name="inception_graphdef", id="my request id")
        request.inputs.append(service_pb2.ModelInferRequest.InferInputTensor(name="input", datatype="FP32",
                                                                             shape=[1, 8, 8, 3]))
        request.outputs.append(service_pb2.ModelInferRequest.InferRequestedOutputTensor(
            name="InceptionV3/Predictions/Softmax"))
        request.raw_input_contents.append(b"a" * (8 * 8 * 3 * 4))
        response = stub.ModelInfer(request)
        assert response.id == "my request id"
        assert response.outputs[0].name == "InceptionV3/Predictions/Softmax"
        assert list(response.outputs[0].shape) == [1, 1001]
        scores = np.frombuffer(response.raw_output_contents[0], dtype=np.float32)
        assert scores.shape == (1001,) and abs(float(scores.sum()) - 1.0) < 1e-3
