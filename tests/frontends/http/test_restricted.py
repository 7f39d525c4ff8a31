"""Restricted HTTP APIs (``--http-restricted-api``) and header forwarding (``--http-header-forward-pattern``) on a
live server, as Triton 2.51 answers them: 403 with ``This API is restricted, expecting header '<key>'`` before the
method is looked at, any case for the header's name, the exact value; SageMaker's routes are never restricted."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from naiad.frontends.http.routes import _category
from tests.frontends.echo_parameters import NAME, write_echo_parameters
from tests.server import RunningServer

ADMIN = {"Admin-Key": "secret"}
INFER = {"infer-key": "let-me-in"}
BODY = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}]})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("restricted")
    write_echo_parameters(repo)
    # Health is restricted too: wait for the port to answer (it opens once the models are loaded).
    running = RunningServer(
        [repo], "--http-restricted-api=health,metadata,model-config,statistics,model-repository:Admin-Key=secret",
        "--http-restricted-api=inference,shared-memory,trace,logging:infer-key=let-me-in",
        "--http-header-forward-pattern", "^x-fw", "--allow-grpc=false", "--allow-sagemaker=true",
        env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": NAME}, wait_port=True)
    # With front-end processes the port answers once the first listens, ready once they all do.
    deadline = time.monotonic() + 60
    while running.request("GET", "/v2/health/ready", headers=ADMIN)[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    yield running
    running.stop()


def _refused(key: str) -> bytes:
    return json.dumps({"error": f"This API is restricted, expecting header '{key}'"}, separators=(",", ":")).encode()


@pytest.mark.parametrize(("method", "path", "key"), [
    ("GET", "/v2/health/live", "Admin-Key"),
    ("GET", "/v2/health/ready", "Admin-Key"),
    ("GET", f"/v2/models/{NAME}/ready", "Admin-Key"),
    ("GET", "/v2", "Admin-Key"),
    ("GET", f"/v2/models/{NAME}", "Admin-Key"),
    ("GET", f"/v2/models/{NAME}/versions/1", "Admin-Key"),
    ("GET", f"/v2/models/{NAME}/config", "Admin-Key"),
    ("GET", "/v2/models/stats", "Admin-Key"),
    ("GET", f"/v2/models/{NAME}/stats", "Admin-Key"),
    ("POST", "/v2/repository/index", "Admin-Key"),
    ("POST", f"/v2/repository/models/{NAME}/load", "Admin-Key"),
    ("POST", f"/v2/models/{NAME}/infer", "infer-key"),
    ("POST", f"/v2/models/{NAME}/generate", "infer-key"),
    ("GET", "/v2/systemsharedmemory/status", "infer-key"),
    ("GET", "/v2/trace/setting", "infer-key"),
    ("GET", "/v2/logging", "infer-key"),
    # Refused before the method is checked, as in Triton (a 405 otherwise).
    ("POST", "/v2/health/live", "Admin-Key"),
    ("GET", f"/v2/models/{NAME}/infer", "infer-key"),
])
def test_restricted_without_the_header_is_403(server: RunningServer, method: str, path: str, key: str) -> None:
    status, headers, body = server.request(method, path, BODY if method == "POST" else None)
    assert (status, body) == (403, _refused(key))
    assert server.request(method, path, BODY if method == "POST" else None, {key: "wrong"})[0] == 403


def test_the_header_name_matches_in_any_case_the_value_exactly(server: RunningServer) -> None:
    assert server.request("GET", "/v2/health/live", headers={"admin-key": "secret"})[0] == 200
    assert server.request("GET", "/v2/health/live", headers={"ADMIN-KEY": "secret"})[0] == 200
    assert server.request("GET", "/v2/health/live", headers={"Admin-Key": "Secret"})[0] == 403
    assert server.request("GET", f"/v2/models/{NAME}/config", headers=ADMIN)[0] == 200
    assert server.request("GET", f"/v2/models/{NAME}/config", headers=INFER)[0] == 403


def test_unknown_paths_stay_404(server: RunningServer) -> None:
    assert server.request("GET", "/v2/nothing")[0] == 404
    assert server.request("GET", f"/v2/models/{NAME}/versions/x")[0] == 404


def test_forwarded_headers_reach_the_model_as_named(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    try:
        inputs = [httpclient.InferInput("INPUT0", [1], "FP32")]
        inputs[0].set_data_from_numpy(np.ones(1, np.float32))
        result = client.infer(NAME, inputs, headers={**INFER, "X-FW-Tag": "a", "x-fw-p": "header", "x-other": "no"},
                              parameters={"x-fw-p": 7, "kept": 1})
        seen = json.loads(result.as_numpy("PARAMETERS")[0])
    finally:
        client.close()
    # Triton: the header replaces a body parameter of the same name; the name keeps the client's spelling.
    assert seen == {"kept": 1, "x-fw-p": "header", "X-FW-Tag": "a"}


def test_generate_forwards_nothing(server: RunningServer) -> None:
    status, _, body = server.request("POST", f"/v2/models/{NAME}/generate", json.dumps({"INPUT0": [1.0]}),
                                     {**INFER, "x-fw-tag": "a"})
    assert status == 200 and json.loads(json.loads(body)["PARAMETERS"]) == {}


def test_sagemaker_routes_are_never_restricted(server: RunningServer) -> None:
    assert server.sagemaker("GET", "/ping")[0] == 200
    status, _, body = server.sagemaker("POST", "/invocations", BODY, {"Content-Type": "application/json"})
    assert status == 200, body
    # Nor forwarded: Triton's SageMaker server has no header pattern.
    status, _, body = server.sagemaker("POST", "/invocations", BODY, {"Content-Type": "application/json",
                                                                       "x-fw-tag": "a"})
    assert json.loads(json.loads(body)["outputs"][0]["data"][0]) == {}


@pytest.mark.parametrize(("path", "category"), [
    ("/v2", "metadata"),
    ("/v2/health/live", "health"),
    ("/v2/health/ready", "health"),
    ("/v2/health/other", None),
    ("/v2/models/m", "metadata"),
    ("/v2/models/m/versions/3", "metadata"),
    ("/v2/models/m/ready", "health"),
    ("/v2/models/m/versions/3/ready", "health"),
    ("/v2/models/m/infer", "inference"),
    ("/v2/models/m/generate", "inference"),
    ("/v2/models/m/generate_stream", "inference"),
    ("/v2/models/m/config", "model-config"),
    ("/v2/models/m/stats", "statistics"),
    ("/v2/models/stats", "statistics"),
    ("/v2/models/m/trace/setting", "trace"),
    ("/v2/models/m/versions/1/trace/setting", None),
    ("/v2/models/m/versions/x", None),
    ("/v2/models/m/other", None),
    ("/v2/models", None),
    ("/v2/trace/setting", "trace"),
    ("/v2/logging", "logging"),
    ("/v2/systemsharedmemory/status", "shared-memory"),
    ("/v2/systemsharedmemory/region/r/register", "shared-memory"),
    ("/v2/systemsharedmemory/region/r/unregister", "shared-memory"),
    ("/v2/cudasharedmemory/region/r/status", "shared-memory"),
    ("/v2/systemsharedmemory/region/r", None),
    ("/v2/repository/index", "model-repository"),
    ("/v2/repository/models/m/load", "model-repository"),
    ("/v2/repository/models/m/unload", "model-repository"),
    ("/v2/repository/repo/index", "model-repository"),
    ("/v2/repository/models/m", None),
])
def test_every_route_has_tritons_category(path: str, category: str | None) -> None:
    assert _category(path.split("/")[1:]) == category
