"""Ensembles on a live server, driven by tritonclient: Python -> ONNX -> Python with independent steps running
together, per-step versions, the batch dimension passed through, failing steps named, statistics for the
ensemble and each composing model, and broken ensembles reported with Triton's reasons."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from naiad.config.ensemble import validate_scheduling
from naiad.config.loader import parse_config_text
from naiad.core.errors import InferError
from tests import onnx_graphs
from tests.models import write_model
from tests.server import RunningServer

# Doubles its input; raises for a NaN; waits for a partner step when asked (see _RENDEZVOUS).
PRE_PY = """
    import asyncio, os
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        async def execute(self, requests):
            responses = []
            for request in requests:
                data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                if np.isnan(data).any():
                    raise ValueError("pre refuses NaN")
                params = request.parameters()
                if "rendezvous" in params:
                    # Each of two parallel steps leaves a mark and waits for the other's: run one after the
                    # other, the first would wait forever (bounded here) and fail the request.
                    import json
                    folder = json.loads(params)["rendezvous"]
                    mine = os.path.join(folder, f"{data.ravel()[0]:g}")
                    open(mine, "w").close()
                    for _ in range(200):
                        if len(os.listdir(folder)) >= 2:
                            break
                        await asyncio.sleep(0.01)
                    else:
                        raise TimeoutError("the other step never ran alongside")
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data * 2)]))
            return responses
"""

PRE_CONFIG = """
    name: "pre"
    backend: "python"
    max_batch_size: 8
    input [{ name: "IN", data_type: TYPE_FP32, dims: [ 4 ] }]
    output [{ name: "OUT", data_type: TYPE_FP32, dims: [ 4 ] }]
    instance_group [{ count: 2, kind: KIND_CPU }]
"""

# PRODUCT = A * B; a model error (not an exception) when the product is negative.
POST_PY = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
                b = pb_utils.get_input_tensor_by_name(request, "B").as_numpy()
                product = a * b
                if (product < 0).any():
                    responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative product")))
                    continue
                label = np.array([[b"positive"]] * len(a), dtype=np.object_)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PRODUCT", product),
                                                             pb_utils.Tensor("LABEL", label)]))
            return responses
"""

POST_CONFIG = """
    name: "post"
    backend: "python"
    max_batch_size: 8
    input [{ name: "A", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "B", data_type: TYPE_FP32, dims: [ 4 ] }]
    output [{ name: "PRODUCT", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "LABEL", data_type: TYPE_STRING, dims: [ 1 ] }]
"""

ARITH_CONFIG = """
    name: "arith"
    platform: "onnxruntime_onnx"
    max_batch_size: 8
    version_policy { all {} }
"""


def _pipeline(name: str, version: int = -1, extra_steps: str = "", extra_outputs: str = "") -> str:
    return f"""
    name: "{name}"
    platform: "ensemble"
    max_batch_size: 8
    input [{{ name: "RAW0", data_type: TYPE_FP32, dims: [ 4 ] }}, {{ name: "RAW1", data_type: TYPE_FP32, dims: [ 4 ] }}]
    output [{{ name: "PRODUCT", data_type: TYPE_FP32, dims: [ 4 ] }}, {{ name: "SUM", data_type: TYPE_FP32, dims: [ 4 ] }},
            {{ name: "LABEL", data_type: TYPE_STRING, dims: [ 1 ] }} {extra_outputs}]
    ensemble_scheduling {{
      step [
        {{ model_name: "pre" model_version: -1 input_map {{ key: "IN" value: "RAW0" }} output_map {{ key: "OUT" value: "S0" }} }},
        {{ model_name: "pre" model_version: -1 input_map {{ key: "IN" value: "RAW1" }} output_map {{ key: "OUT" value: "S1" }} }},
        {{ model_name: "arith" model_version: {version}
          input_map [{{ key: "INPUT0" value: "S0" }}, {{ key: "INPUT1" value: "S1" }}]
          output_map [{{ key: "OUTPUT0" value: "SUM" }}, {{ key: "OUTPUT1" value: "DIFF" }}] }},
        {{ model_name: "post" model_version: -1 input_map [{{ key: "A" value: "SUM" }}, {{ key: "B" value: "DIFF" }}]
          output_map [{{ key: "PRODUCT" value: "PRODUCT" }}, {{ key: "LABEL" value: "LABEL" }}] }}
        {extra_steps}
      ]
    }}
    """


BROKEN = {
    "missing_step": (
        _pipeline("missing_step").replace('model_name: "post"', 'model_name: "nosuch"'),
        "ensemble missing_step contains models that are not available or ambiguous: nosuch",
    ),
    "wrong_dtype": (
        _pipeline("wrong_dtype").replace('name: "RAW0", data_type: TYPE_FP32', 'name: "RAW0", data_type: TYPE_INT32'),
        "in ensemble wrong_dtype, ensemble tensor RAW0: inconsistent data type: TYPE_INT32 is inferred from model "
        "wrong_dtype while TYPE_FP32 is inferred from model pre",
    ),
    "bad_input_map": (
        _pipeline("bad_input_map").replace('key: "A" value: "SUM"', 'key: "X" value: "SUM"'),
        "in ensemble bad_input_map, ensemble tensor SUM is mapping to non-existing input X in model post",
    ),
    "missing_version": (
        _pipeline("missing_version", version=7),
        "ensemble 'missing_version' depends on 'arith' whose required version 7 is not loaded.",
    ),
    "depends_on_broken": (
        _pipeline("depends_on_broken").replace('model_name: "post"', 'model_name: "broken_onnx"'),
        "ensemble 'depends_on_broken' depends on 'broken_onnx' which has no loaded version. Model 'broken_onnx' "
        "loading failed with error: Internal: onnx runtime error 7:",
    ),
    # Like Triton, a step without model_version asks for version 0, not the newest.
    "no_version": (
        _pipeline("no_version").replace('model_name: "post" model_version: -1', 'model_name: "post"'),
        "ensemble 'no_version' depends on 'post' whose required version 0 is not loaded.",
    ),
    "cycle_a": (
        """
        name: "cycle_a"
        platform: "ensemble"
        input [{ name: "X", data_type: TYPE_FP32, dims: [ 4 ] }]
        output [{ name: "Y", data_type: TYPE_FP32, dims: [ 4 ] }]
        ensemble_scheduling { step [{ model_name: "cycle_b" model_version: -1 input_map { key: "X" value: "X" }
                                     output_map { key: "Y" value: "Y" } }] }
        """,
        "circular dependency between ensembles: cycle_a -> ... -> cycle_b -> cycle_a",
    ),
    "cycle_b": (
        """
        name: "cycle_b"
        platform: "ensemble"
        input [{ name: "X", data_type: TYPE_FP32, dims: [ 4 ] }]
        output [{ name: "Y", data_type: TYPE_FP32, dims: [ 4 ] }]
        ensemble_scheduling { step [{ model_name: "cycle_a" model_version: -1 input_map { key: "X" value: "X" }
                                     output_map { key: "Y" value: "Y" } }] }
        """,
        "circular dependency between ensembles:",
    ),
}


def _write_ensemble(repo: Path, name: str, config: str) -> None:
    write_model(repo, name, config, "")
    (repo / name / "1" / "model.py").unlink()  # an ensemble's version folder is empty


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("ensembles")
    write_model(repo, "pre", PRE_CONFIG, PRE_PY)
    write_model(repo, "post", POST_CONFIG, POST_PY)
    onnx_graphs.write(repo, "arith", onnx_graphs.add_sub("TYPE_FP32", [4]), ARITH_CONFIG, version=1)
    # Version 2 swaps the operations, so a pinned step shows which version ran.
    swapped = onnx_graphs.add_sub("TYPE_FP32", [4])
    for node in swapped.graph.node:
        node.op_type = "Sub" if node.op_type == "Add" else "Add"
    onnx_graphs.write(repo, "arith", swapped, version=2)
    onnx_graphs.write(repo, "broken_onnx", b"not an onnx graph", 'name: "broken_onnx"\nbackend: "onnxruntime"\n'
                      'max_batch_size: 8\ninput [{ name: "A", data_type: TYPE_FP32, dims: [ 4 ] }]\n'
                      'output [{ name: "PRODUCT", data_type: TYPE_FP32, dims: [ 4 ] }, '
                      '{ name: "LABEL", data_type: TYPE_STRING, dims: [ 1 ] }]\n')
    _write_ensemble(repo, "pipeline", _pipeline("pipeline"))
    _write_ensemble(repo, "pipeline_v1", _pipeline("pipeline_v1", version=1))
    # An ensemble of an ensemble: the batch dimension flows through both.
    _write_ensemble(repo, "outer", """
        name: "outer"
        platform: "ensemble"
        max_batch_size: 8
        input [{ name: "A", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "B", data_type: TYPE_FP32, dims: [ 4 ] }]
        output [{ name: "P", data_type: TYPE_FP32, dims: [ 4 ] }]
        ensemble_scheduling { step [{ model_name: "pipeline" model_version: -1
            input_map [{ key: "RAW0" value: "A" }, { key: "RAW1" value: "B" }]
            output_map { key: "PRODUCT" value: "P" } }] }
    """)
    for name, (config, _) in BROKEN.items():
        _write_ensemble(repo, name, config)
    running = RunningServer([repo], "--strict-readiness=false")
    yield running
    running.stop()



def _infer(client: httpclient.InferenceServerClient, model: str, a: np.ndarray, b: np.ndarray,
           names: tuple[str, str] = ("RAW0", "RAW1"), **kwargs: object) -> httpclient.InferResult:
    inputs = []
    for name, data in zip(names, (a, b)):
        tensor = httpclient.InferInput(name, list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    return client.infer(model, inputs, **kwargs)


def _stats(client: httpclient.InferenceServerClient, model: str, version: str = "") -> dict:
    return client.get_inference_statistics(model, version)["model_stats"][0]


def test_python_onnx_python_with_batch(client: httpclient.InferenceServerClient) -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4) + 5
    b = np.ones((3, 4), dtype=np.float32)
    result = _infer(client, "pipeline", a, b, request_id="42")
    s0, s1 = a * 2, b * 2
    # "pipeline" runs arith's newest version, 2, which subtracts for OUTPUT0 and adds for OUTPUT1.
    np.testing.assert_allclose(result.as_numpy("SUM"), s0 - s1)
    np.testing.assert_allclose(result.as_numpy("PRODUCT"), (s0 - s1) * (s0 + s1))
    assert result.as_numpy("LABEL").tolist() == [[b"positive"]] * 3
    assert result.as_numpy("PRODUCT").shape == (3, 4)
    response = result.get_response()
    assert response["model_name"] == "pipeline" and response["model_version"] == "1" and response["id"] == "42"


def test_requested_output_subset(client: httpclient.InferenceServerClient) -> None:
    a = np.full((1, 4), 3, dtype=np.float32)
    result = _infer(client, "pipeline", a, a / 3, outputs=[httpclient.InferRequestedOutput("SUM")])
    np.testing.assert_allclose(result.as_numpy("SUM"), [[4] * 4])
    assert result.as_numpy("PRODUCT") is None


def test_step_pins_its_version(client: httpclient.InferenceServerClient) -> None:
    a = np.full((1, 4), 5, dtype=np.float32)
    b = np.full((1, 4), 1, dtype=np.float32)
    # Version 1 adds for SUM; version 2 (the newest, used when unpinned) subtracts.
    np.testing.assert_allclose(_infer(client, "pipeline_v1", a, b).as_numpy("SUM"), [[12] * 4])
    np.testing.assert_allclose(_infer(client, "pipeline", a, b).as_numpy("SUM"), [[8] * 4])


def test_nested_ensemble(client: httpclient.InferenceServerClient) -> None:
    a = np.full((2, 4), 3, dtype=np.float32)
    b = np.full((2, 4), 1, dtype=np.float32)
    result = _infer(client, "outer", a, b, names=("A", "B"))
    s0, s1 = a * 2, b * 2
    np.testing.assert_allclose(result.as_numpy("P"), (s0 - s1) * (s0 + s1))


def test_independent_steps_run_together(client: httpclient.InferenceServerClient, tmp_path: Path) -> None:
    # The two "pre" steps only finish if both run at once (each waits for the other's mark).
    a = np.full((1, 4), 2, dtype=np.float32)
    b = np.full((1, 4), 1, dtype=np.float32)
    result = _infer(client, "pipeline", a, b, parameters={"rendezvous": str(tmp_path)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2"]
    np.testing.assert_allclose(result.as_numpy("SUM"), [[2] * 4])


def test_failing_steps_name_themselves(client: httpclient.InferenceServerClient) -> None:
    good = np.ones((1, 4), dtype=np.float32)
    with pytest.raises(InferenceServerException) as raised:
        _infer(client, "pipeline", np.full((1, 4), np.nan, dtype=np.float32), good)
    assert raised.value.status() == "500"
    message = raised.value.message()
    assert message.startswith("in ensemble 'pipeline', Failed to process the request(s) for model 'pre")
    assert "pre refuses NaN" in message
    # A model's own error response carries no model name; the ensemble adds which step it was.
    with pytest.raises(InferenceServerException) as raised:
        _infer(client, "pipeline", good, good * 2)
    assert raised.value.message() == "in ensemble 'pipeline', step 3 (model 'post'): negative product"
    # And the server keeps serving.
    np.testing.assert_allclose(_infer(client, "pipeline", good * 2, good).as_numpy("SUM"), [[2] * 4])


def test_statistics_for_ensemble_and_composing_models(client: httpclient.InferenceServerClient) -> None:
    # "pipeline" runs arith's newest version (2); version 1 must see none of these requests.
    models = [("pipeline", ""), ("pre", ""), ("arith", "1"), ("arith", "2"), ("post", "")]
    before = {m: _stats(client, *m) for m in models}
    a = np.full((2, 4), 3, dtype=np.float32)
    b = np.ones((2, 4), dtype=np.float32)
    for _ in range(3):
        _infer(client, "pipeline", a, b)
    after = {m: _stats(client, *m) for m in models}

    def grew(model: str, field: str, version: str = "") -> int:
        return after[(model, version)][field] - before[(model, version)][field]

    assert grew("pipeline", "inference_count") == 6  # 3 requests of batch 2
    assert grew("pipeline", "execution_count") == 3
    assert grew("pre", "inference_count") == 12  # two steps per request
    assert grew("arith", "inference_count", "2") == 6 and grew("post", "inference_count") == 6
    assert grew("arith", "inference_count", "1") == 0
    success = [after[("pipeline", "")]["inference_stats"]["success"],
               before[("pipeline", "")]["inference_stats"]["success"]]
    assert success[0]["count"] - success[1]["count"] == 3
    assert success[0]["ns"] > success[1]["ns"]


def test_config_and_metadata(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("pipeline")
    assert config["platform"] == "ensemble"
    assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == ["pre", "pre", "arith", "post"]
    assert "instance_group" not in config or config["instance_group"] == []
    metadata = client.get_model_metadata("pipeline")
    assert metadata["platform"] == "ensemble"
    assert [i["shape"] for i in metadata["inputs"]] == [[-1, 4], [-1, 4]]


def test_broken_ensembles_have_reasons(server: RunningServer) -> None:
    status, _, body = server.request("POST", "/v2/repository/index", "{}")
    assert status == 200
    rows = {row["name"]: row for row in json.loads(body)}
    for name, (_, reason) in BROKEN.items():
        assert rows[name]["state"] == "UNAVAILABLE", name
        assert reason in rows[name]["reason"], (name, rows[name]["reason"])
    for name in ("pipeline", "pipeline_v1", "outer", "pre", "post"):
        assert rows[name]["state"] == "READY"


@pytest.mark.parametrize(("change", "message"), [
    (lambda c: c.replace('value: "S1" }', 'value: "S0" }', 1),
     "ensemble tensor 'S0' can appear in an output map only once for ensemble 'p' step 1"),
    (lambda c: c.replace('{ key: "LABEL" value: "LABEL" }', '{ key: "LABEL" value: "SPARE" }'),
     "ensemble output 'LABEL' for ensemble p' is not used"),  # sic: Triton's quoting
    (lambda c: c.replace('key: "B" value: "DIFF"', 'key: "B" value: "NOWHERE"'),
     "output 'PRODUCT' for ensemble 'p' is not written: at least one of its depending tensors, 'NOWHERE', is not "
     "connected"),
    (lambda c: c.replace('platform: "ensemble"', 'platform: "ensemble"\ninstance_group [{ count: 1 }]'),
     "instance group should not be specified for ensemble 'p'"),
])
def test_scheduling_rules(change, message: str) -> None:
    config = parse_config_text(change(_pipeline("p")))
    with pytest.raises(InferError) as raised:
        validate_scheduling(config)
    assert raised.value.message == message


def test_over_grpc(server: RunningServer) -> None:
    import tritonclient.grpc as grpcclient

    a = np.full((2, 4), 3, dtype=np.float32)
    b = np.ones((2, 4), dtype=np.float32)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        inputs = [grpcclient.InferInput("RAW0", [2, 4], "FP32"), grpcclient.InferInput("RAW1", [2, 4], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer("pipeline", inputs)
        np.testing.assert_allclose(result.as_numpy("PRODUCT"), (a * 2 - b * 2) * (a * 2 + b * 2))
        assert result.as_numpy("LABEL").tolist() == [[b"positive"]] * 2
        inputs[0].set_data_from_numpy(b)  # RAW0 < RAW1: the post step answers with an error
        inputs[1].set_data_from_numpy(a)
        with pytest.raises(InferenceServerException) as raised:
            client.infer("pipeline", inputs)
        assert raised.value.message() == "in ensemble 'pipeline', step 3 (model 'post'): negative product"
