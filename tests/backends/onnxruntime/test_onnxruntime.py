"""The onnxruntime backend on a live server, driven by tritonclient: auto-complete from the graph, every
datatype, models with external data, session options from parameters, execution accelerators, and Triton's
messages for a missing file, a bad graph, a config that disagrees with the graph, and GPUs asked of a CPU host."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper

from tests import onnx_graphs as g
from tests.server import RunningServer
from tests.tensors import infer_inputs

# Every Triton datatype onnxruntime has, with the NumPy type the client sends.
DTYPES = {
    "TYPE_BOOL": np.bool_, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16, "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8, "TYPE_INT16": np.int16, "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64, "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}


def _all_types_model() -> onnx.ModelProto:
    nodes, inputs, outputs = [], [], []
    for dtype in DTYPES:
        short = dtype[5:]
        nodes.append(helper.make_node("Identity", [f"IN_{short}"], [f"OUT_{short}"]))
        inputs.append(g.tensor(f"IN_{short}", dtype, ["batch", 3]))
        outputs.append(g.tensor(f"OUT_{short}", dtype, ["batch", 3]))
    return g.model(nodes, inputs, outputs)


def _external_data_model(folder: Path) -> None:
    """OUTPUT0 = INPUT0 + W with W kept in a separate weights file, in a model.onnx folder."""
    weights = numpy_helper.from_array(np.arange(8, dtype=np.float32), "W")
    proto = g.model([helper.make_node("Add", ["INPUT0", "W"], ["OUTPUT0"])],
                    [g.tensor("INPUT0", "TYPE_FP32", ["batch", 8])], [g.tensor("OUTPUT0", "TYPE_FP32", ["batch", 8])],
                    [weights])
    folder.mkdir(parents=True)
    onnx.save_model(proto, str(folder / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)


def _scalar_sum_model() -> onnx.ModelProto:
    return g.model([helper.make_node("ReduceSum", ["INPUT0"], ["TOTAL"], keepdims=0)],
                   [g.tensor("INPUT0", "TYPE_FP32", [4])], [g.tensor("TOTAL", "TYPE_FP32", [])])


def _simple_config(name: str, extra: str = "", dtype: str = "TYPE_INT32") -> str:
    return f"""
        name: "{name}"
        platform: "onnxruntime_onnx"
        max_batch_size: 8
        input [{{ name: "INPUT0", data_type: {dtype}, dims: [ 16 ] }}, {{ name: "INPUT1", data_type: {dtype}, dims: [ 16 ] }}]
        output [{{ name: "OUTPUT0", data_type: {dtype}, dims: [ 16 ] }}, {{ name: "OUTPUT1", data_type: {dtype}, dims: [ 16 ] }}]
        {extra}
    """


# name -> (what makes it broken, the reason Triton gives)
BROKEN = {
    "missing_file": ("no model.onnx", "Unavailable: unable to find '{repo}/missing_file/1/model.onnx' for model "
                     "instance 'missing_file_0'"),
    "bad_graph": ("bytes that aren't ONNX", "Internal: onnx runtime error 7: "),
    "dtype_mismatch": ("FP32 config for an INT32 graph", "Invalid argument: unable to load model 'dtype_mismatch', "
                       "configuration expects datatype TYPE_FP32 for input 'INPUT0', model provides TYPE_INT32"),
    "shape_mismatch": ("dims [8] for a [16] graph", "Invalid argument: model 'shape_mismatch', tensor 'INPUT0': the "
                       "model expects 2 dimensions (shape [-1,16]) but the model configuration specifies 2 dimensions "
                       "(an initial batch dimension because max_batch_size > 0 followed by the explicit tensor shape, "
                       "making complete shape [-1,8])"),
    "unknown_input": ("an input the graph lacks", "Invalid argument: unexpected inference input 'OTHER', allowed "
                      "inputs are: INPUT0, INPUT1"),
    "gpu_instance": ("KIND_GPU on a CPU host", "Invalid argument: instance group gpu_instance_0 of model gpu_instance "
                     "has kind KIND_GPU but no GPUs are available"),
    "unknown_accelerator": ("a CPU accelerator onnxruntime lacks", "Invalid argument: unknown Execution Accelerator "
                            "'foo' is requested"),
    "bad_thread_count": ("intra_op_thread_count: many", "Invalid argument: failed to convert 'many' to integral "
                         "number"),
    "bad_execution_mode": ("execution_mode: 3", "Invalid argument: Invalid configuration value provided. Expected "
                           "values for  execution_mode are 0 or 1 but got 3 ."),
    "cannot_batch": ("max_batch_size for a graph without a batch dimension", "Invalid argument: autofill failed for "
                     "model 'cannot_batch': model does not support batching while non-zero max_batch_size is "
                     "specified"),
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("onnx")
    g.write(repo, "auto", g.add_sub("TYPE_INT32", [16]))  # no config.pbtxt at all
    g.write(repo, "auto_nobatch", g.add_sub("TYPE_FP32", [4], batch=False))
    g.write(repo, "all_types_auto", _all_types_model())
    all_types = "\n".join(
        f'{{ name: "{kind}_{t[5:]}", data_type: {t}, dims: [ 3 ] }},' for t in DTYPES for kind in ("IN",)
    )
    g.write(repo, "all_types", _all_types_model(), f"""
        name: "all_types"
        backend: "onnxruntime"
        max_batch_size: 4
        input [{all_types.rstrip(',')}]
        output [{all_types.replace('"IN_', '"OUT_').rstrip(',')}]
    """)
    _external_data_model(repo / "external" / "1" / "model.onnx")
    (repo / "external" / "config.pbtxt").write_text('name: "external"\nbackend: "onnxruntime"\nmax_batch_size: 2\n')
    g.write(repo, "scalar", _scalar_sum_model(), """
        name: "scalar"
        backend: "onnxruntime"
        input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }]
        output [{ name: "TOTAL", data_type: TYPE_FP32, dims: [ 1 ] }]
    """)
    # Tuned sessions and an accelerator that only applies to GPU instances: these load and serve on a CPU host.
    g.write(repo, "tuned", g.add_sub("TYPE_INT32", [16]), _simple_config("tuned", """
        parameters [{ key: "intra_op_thread_count" value: { string_value: "1" } },
                    { key: "inter_op_thread_count" value: { string_value: "1" } },
                    { key: "execution_mode" value: { string_value: "1" } },
                    { key: "enable_mem_arena" value: { string_value: "on" } },
                    { key: "enable_mem_pattern" value: { string_value: "true" } },
                    { key: "memory.enable_memory_arena_shrinkage" value: { string_value: "cpu:0" } }]
        optimization { graph { level: 1 }
                       execution_accelerators { gpu_execution_accelerator [{ name: "tensorrt" }, { name: "cuda" }] } }
        instance_group [{ count: 3, kind: KIND_CPU }]
    """))
    g.write(repo, "missing_file", g.add_sub("TYPE_INT32", [16]), _simple_config("missing_file"))
    (repo / "missing_file" / "1" / "model.onnx").unlink()
    g.write(repo, "bad_graph", b"\x00not onnx", _simple_config("bad_graph"))
    g.write(repo, "dtype_mismatch", g.add_sub("TYPE_INT32", [16]), _simple_config("dtype_mismatch", dtype="TYPE_FP32"))
    g.write(repo, "shape_mismatch", g.add_sub("TYPE_INT32", [16]),
            _simple_config("shape_mismatch").replace("dims: [ 16 ]", "dims: [ 8 ]"))
    g.write(repo, "unknown_input", g.add_sub("TYPE_INT32", [16]),
            _simple_config("unknown_input").replace('name: "INPUT1"', 'name: "OTHER"'))
    g.write(repo, "gpu_instance", g.add_sub("TYPE_INT32", [16]),
            _simple_config("gpu_instance", "instance_group [{ kind: KIND_GPU }]"))
    g.write(repo, "unknown_accelerator", g.add_sub("TYPE_INT32", [16]), _simple_config(
        "unknown_accelerator", 'optimization { execution_accelerators { cpu_execution_accelerator [{ name: "foo" }] } }'))
    g.write(repo, "bad_thread_count", g.add_sub("TYPE_INT32", [16]), _simple_config(
        "bad_thread_count", 'parameters { key: "intra_op_thread_count" value: { string_value: "many" } }'))
    g.write(repo, "bad_execution_mode", g.add_sub("TYPE_INT32", [16]), _simple_config(
        "bad_execution_mode", 'parameters { key: "execution_mode" value: { string_value: "3" } }'))
    g.write(repo, "cannot_batch", g.add_sub("TYPE_FP32", [4], batch=False),
            'name: "cannot_batch"\nbackend: "onnxruntime"\nmax_batch_size: 4\n')
    return repo


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[RunningServer]:
    running = RunningServer([repo], "--strict-readiness=false")
    yield running
    running.stop()


def test_auto_complete_from_graph(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("auto")
    assert config["platform"] == "onnxruntime_onnx" and config["backend"] == "onnxruntime"
    assert config["default_model_filename"] == "model.onnx"
    assert config["max_batch_size"] == 4  # Triton's default-max-batch-size for a graph that batches
    assert "dynamic_batching" in config
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
    assert [(o["name"], o["dims"]) for o in config["output"]] == [("OUTPUT0", [16]), ("OUTPUT1", [16])]
    # Triton's default instance count for onnxruntime on CPU is two.
    assert [(g["kind"], g["count"]) for g in config["instance_group"]] == [("KIND_CPU", 2)]
    nobatch = client.get_model_config("auto_nobatch")
    assert nobatch["max_batch_size"] == 0 and nobatch["input"][0]["dims"] == [4]
    assert "dynamic_batching" not in nobatch


def test_auto_complete_every_datatype(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("all_types_auto")
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        (f"IN_{t[5:]}", t, [3]) for t in DTYPES]
    assert [o["data_type"] for o in config["output"]] == list(DTYPES)
    metadata = client.get_model_metadata("all_types_auto")
    assert metadata["inputs"][-1] == {"name": "IN_STRING", "datatype": "BYTES", "shape": [-1, 3]}


def test_infer_auto_completed(client: httpclient.InferenceServerClient) -> None:
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.ones((2, 16), dtype=np.int32)
    result = client.infer("auto", infer_inputs(httpclient, INPUT0=a, INPUT1=b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    a = np.arange(4, dtype=np.float32)
    result = client.infer("auto_nobatch", infer_inputs(httpclient, INPUT0=a, INPUT1=a))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)


def test_every_datatype(client: httpclient.InferenceServerClient) -> None:
    rng = np.random.default_rng(0)
    arrays = {}
    for dtype, np_type in DTYPES.items():
        short = dtype[5:]
        if np_type is np.object_:
            data = np.array([[b"caf\xc3\xa9", b"", b"x" * 50]] * 2, dtype=np.object_)
        elif np_type is np.bool_:
            data = rng.integers(0, 2, (2, 3)).astype(np.bool_)
        else:
            data = (rng.random((2, 3)) * 100).astype(np_type)
        arrays[f"IN_{short}"] = data
    result = client.infer("all_types", infer_inputs(httpclient, **arrays))
    for name, data in arrays.items():
        out = result.as_numpy("OUT_" + name[3:])
        assert out.dtype == data.dtype, name
        np.testing.assert_array_equal(out, data)


def test_external_data_folder(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("external")
    assert config["input"][0]["dims"] == [8]
    x = np.ones((2, 8), dtype=np.float32)
    result = client.infer("external", infer_inputs(httpclient, INPUT0=x))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x + np.arange(8, dtype=np.float32))


def test_scalar_output_takes_configured_dims(client: httpclient.InferenceServerClient) -> None:
    result = client.infer("scalar", infer_inputs(httpclient, INPUT0=np.array([1, 2, 3, 4], dtype=np.float32)))
    np.testing.assert_array_equal(result.as_numpy("TOTAL"), [10.0])


def test_session_options_and_gpu_accelerators_on_cpu_instances(client: httpclient.InferenceServerClient) -> None:
    # GPU accelerators apply only to GPU instances; CPU instances ignore them and serve, as in Triton.
    config = client.get_model_config("tuned")
    assert config["instance_group"][0]["count"] == 3
    a = np.full((1, 16), 7, dtype=np.int32)
    for _ in range(4):
        result = client.infer("tuned", infer_inputs(httpclient, INPUT0=a, INPUT1=a))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)


def test_statistics_count_inferences(client: httpclient.InferenceServerClient) -> None:
    before = client.get_inference_statistics("auto")["model_stats"][0]
    a = np.ones((3, 16), dtype=np.int32)
    client.infer("auto", infer_inputs(httpclient, INPUT0=a, INPUT1=a))
    after = client.get_inference_statistics("auto")["model_stats"][0]
    assert after["inference_count"] - before["inference_count"] == 3
    assert after["execution_count"] - before["execution_count"] == 1
    assert after["inference_stats"]["compute_infer"]["ns"] > before["inference_stats"]["compute_infer"]["ns"]


def test_broken_models_give_tritons_reasons(server: RunningServer, repo: Path) -> None:
    status, _, body = server.request("POST", "/v2/repository/index", "{}")
    assert status == 200
    rows = {row["name"]: row for row in json.loads(body)}
    for name, (_, reason) in BROKEN.items():
        assert rows[name]["state"] == "UNAVAILABLE", name
        assert rows[name]["reason"].startswith(reason.format(repo=repo)), (name, rows[name]["reason"])
    # ... and everything else serves.
    assert all(rows[n]["state"] == "READY" for n in ("auto", "all_types", "external", "tuned", "scalar"))


def test_non_utf8_string_is_refused_and_server_keeps_serving(client: httpclient.InferenceServerClient) -> None:
    arrays = {f"IN_{t[5:]}": np.zeros((1, 3), dtype=n) for t, n in DTYPES.items() if n is not np.object_}
    arrays["IN_STRING"] = np.array([[b"\xff\xfe", b"a", b"b"]], dtype=np.object_)
    with pytest.raises(Exception) as raised:
        client.infer("all_types", infer_inputs(httpclient, **arrays))
    assert "must hold UTF-8 text" in str(raised.value)
    arrays["IN_STRING"] = np.array([[b"ok", b"a", b"b"]], dtype=np.object_)
    result = client.infer("all_types", infer_inputs(httpclient, **arrays))
    assert result.as_numpy("OUT_STRING").tolist() == [[b"ok", b"a", b"b"]]


def test_graph_with_string_cast(tmp_path: Path) -> None:
    """onnxruntime casts strings to numbers and back: the arithmetic of Triton's simple_string example."""
    import onnxruntime as ort

    session = ort.InferenceSession(g.string_add_sub([2]).SerializeToString(), providers=["CPUExecutionProvider"])
    out = session.run(None, {"INPUT0": np.array([["3", "4"]], dtype=object), "INPUT1": np.array([["1", "1"]],
                                                                                                    dtype=object)})
    assert out[0].tolist() == [["4", "5"]] and out[1].tolist() == [["2", "3"]]
    assert TensorProto.STRING == g.ONNX_TYPES["TYPE_STRING"]


def test_concurrent_requests_batch_and_split(server: RunningServer) -> None:
    """Many requests at once to an auto-completed model (dynamic batching): each gets its own rows back."""
    with httpclient.InferenceServerClient(server.url, concurrency=16) as client:
        pending = []
        for i in range(32):
            rows = 1 + i % 3
            a = np.full((rows, 16), i, dtype=np.int32)
            pending.append((a, client.async_infer("auto", infer_inputs(httpclient, INPUT0=a, INPUT1=a))))
        for a, future in pending:
            result = future.get_result()
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros_like(a))
    stats = httpclient.InferenceServerClient(server.url).get_inference_statistics("auto")["model_stats"][0]
    assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in stats["batch_stats"]) >= 64
