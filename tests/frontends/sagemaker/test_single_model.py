"""A single-model endpoint as SageMaker drives it: ``/ping`` and ``/invocations`` on the SageMaker port, with
KServe JSON and Triton's binary+json content type built by tritonclient's own request encoder."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.server import ROOT, RunningServer
from tests.tensors import infer_inputs

MODELS = ROOT / "tests" / "golden_models"
BINARY_JSON = "application/vnd.sagemaker-triton.binary+json;json-header-size="
ADD_SUB = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                      {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 1, 1, 1]}]}


def _sme(default: str, *extra: str, env: dict[str, str] | None = None) -> RunningServer:
    return RunningServer([MODELS], "--allow-sagemaker=true", "--allow-grpc=false", "--model-control-mode=explicit",
                         f"--load-model={default}", "--load-model=execute_error", *extra,
                         env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": default, **(env or {})})


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    running = _sme("add_sub")
    yield running
    running.stop()


def test_ping_answers_200_with_no_body(server: RunningServer) -> None:
    status, headers, body = server.sagemaker("GET", "/ping")
    assert (status, body) == (200, b"")
    assert "content-type" not in headers


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
def test_ping_other_methods_are_405(server: RunningServer, method: str) -> None:
    status, _, body = server.sagemaker(method, "/ping")
    assert status == 405
    assert json.loads(body) == {"error": "Method Not Allowed"}


def test_invocations_json(server: RunningServer) -> None:
    status, headers, body = server.sagemaker("POST", "/invocations", json.dumps(ADD_SUB),
                                             {"Content-Type": "application/json"})
    assert status == 200, body
    assert headers["content-type"] == "application/json"
    outputs = {o["name"]: o["data"] for o in json.loads(body)["outputs"]}
    assert outputs == {"OUTPUT0": [2, 3, 4, 5], "OUTPUT1": [0, 1, 2, 3]}


def test_invocations_binary_json_built_by_tritonclient(server: RunningServer) -> None:
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 0.5, dtype=np.float32)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=True)]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        infer_inputs(httpclient, INPUT0=a, INPUT1=b), outputs=outputs)
    status, headers, reply = server.sagemaker("POST", "/invocations", body,
                                              {"Content-Type": f"{BINARY_JSON}{json_size}"})
    assert status == 200, reply
    content_type = headers["content-type"]
    assert content_type.startswith(BINARY_JSON)
    result = httpclient.InferenceServerClient.parse_response_body(reply, header_length=int(content_type.split("=")[1]))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("content_type, message", [
    (f"{BINARY_JSON}-1", "inference header size should be in range (0, {n}), got: -1"),
    (f"{BINARY_JSON}99999", "inference header size should be in range (0, {n}), got: 99999"),
    (f"text/plain; {BINARY_JSON}10", f"expect MIME type for binary data starts with '{BINARY_JSON}', "
                                     f"got: text/plain; {BINARY_JSON}10"),
])
def test_bad_binary_json_headers_are_400(server: RunningServer, content_type: str, message: str) -> None:
    body = json.dumps(ADD_SUB)
    status, _, reply = server.sagemaker("POST", "/invocations", body, {"Content-Type": content_type})
    assert status == 400
    assert json.loads(reply) == {"error": message.format(n=len(body))}


def test_model_errors_keep_serving(server: RunningServer) -> None:
    # /invocations keeps Triton's HTTP mapping for failures before the model runs: a JSON parse error is INTERNAL.
    status, _, reply = server.sagemaker("POST", "/invocations", b"{not json", {"Content-Type": "application/json"})
    assert status == 500 and json.loads(reply)["error"].startswith("failed to parse the request JSON buffer")
    status, _, reply = server.sagemaker("GET", "/invocations")
    assert (status, json.loads(reply)) == (405, {"error": "Method Not Allowed"})
    assert server.sagemaker("POST", "/invocations", json.dumps(ADD_SUB))[0] == 200


@pytest.mark.parametrize("path", ["/foo", "/ping/", "/invocations/x", "/v2/health/ready", "/"])
def test_unknown_paths_are_a_bare_400(server: RunningServer, path: str) -> None:
    status, headers, body = server.sagemaker("GET", path)
    assert (status, body) == (400, b"")


def test_models_api_on_a_single_model_endpoint_lists_nothing(server: RunningServer) -> None:
    status, _, body = server.sagemaker("GET", "/models")
    assert (status, json.loads(body)) == (200, {"models": []})
    assert server.sagemaker("GET", "/models/add_sub")[0] == 404


def test_raw_body_to_a_single_input_model() -> None:
    running = _sme("identity_int8")
    try:
        data = np.array([1, -2, 3], dtype=np.int8)
        status, headers, reply = running.sagemaker("POST", "/invocations", data.tobytes(),
                                                   {"Content-Type": f"{BINARY_JSON}0"})
        assert status == 200, reply
        # As Triton's golden sme_raw_bytes answers: a raw request is answered in binary.
        assert headers["content-type"].startswith(BINARY_JSON)
        length = int(headers["content-type"][len(BINARY_JSON):])
        assert json.loads(reply[:length])["outputs"][0]["parameters"] == {"binary_data_size": 3}
        assert np.frombuffer(reply[length:], dtype=np.int8).tolist() == [1, -2, 3]
    finally:
        running.stop()


def test_ping_mode_live_and_an_unset_default_model() -> None:
    running = RunningServer([MODELS], "--allow-sagemaker=true", "--allow-grpc=false", "--model-control-mode=explicit",
                            env={"SAGEMAKER_TRITON_PING_MODE": "live"})
    try:
        assert running.sagemaker("GET", "/ping")[0] == 200
        status, _, body = running.sagemaker("POST", "/invocations", json.dumps(ADD_SUB))
        assert status == 400  # Triton 2.51's answer for an unknown default model (not 404)
        assert "unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME" in json.loads(body)["error"]
    finally:
        running.stop()


def test_generate_inference_type() -> None:
    running = _sme("add_sub", env={"SAGEMAKER_TRITON_INFERENCE_TYPE": "generate"})
    try:
        body = {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1]}
        status, _, reply = running.sagemaker("POST", "/invocations", json.dumps(body))
        assert status == 200, reply
        assert json.loads(reply)["OUTPUT0"] == [2, 3, 4, 5]
    finally:
        running.stop()
