"""A repository with broken models (tests/golden_bad_models): each failure is reported with a reason that
names the model and the field, the good model serves anyway, and readiness follows --strict-readiness."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.server import ROOT, RunningServer

BAD = ROOT / "tests" / "golden_bad_models"

EXPECTED_REASONS = {
    "name_mismatch": "unexpected directory name 'name_mismatch' for model 'not_the_folder_name'",
    "negative_max_batch_size": "'max_batch_size' must be non-negative value for negative_max_batch_size",
    "syntax_error": "failed to read text proto from",
    "no_version_folder": "at least one version must be available under the version policy of model",
    "input_no_datatype": "model input 'INPUT0' must specify 'data_type' for input_no_datatype",
    "dims_zero": "model input 'INPUT0' dimension must be integer >= 1, or -1 to indicate a variable-size dimension",
    "dims_below_minus_one": "dimension must be integer >= 1, or -1",
    "initialize_raises": "ValueError: golden: initialize failed on purpose",
    "unknown_backend": "unable to find backend library for backend 'nosuch'",
    "output_no_dims": "model output 'OUTPUT0' must specify 'dims' for output_no_dims",
    "missing_model_py": "model.py",
}


@pytest.fixture(scope="module")
def lenient() -> Iterator[RunningServer]:
    server = RunningServer([BAD], "--strict-readiness=false")
    yield server
    server.stop()


def test_every_failure_has_its_reason(lenient: RunningServer) -> None:
    status, _, body = lenient.request("POST", "/v2/repository/index", "{}")
    assert status == 200
    rows = {row["name"]: row for row in json.loads(body)}
    assert rows["good"]["state"] == "READY"
    for name, reason in EXPECTED_REASONS.items():
        assert rows[name]["state"] == "UNAVAILABLE", name
        assert reason in rows[name]["reason"], (name, rows[name]["reason"])


def test_good_model_serves_beside_broken_ones(lenient: RunningServer) -> None:
    with httpclient.InferenceServerClient(lenient.url) as client:
        assert client.is_server_ready()  # --strict-readiness=false
        assert client.is_model_ready("good")
        assert not client.is_model_ready("initialize_raises")
        inputs = [httpclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.arange(4, dtype=np.float32))
        result = client.infer("good", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(4, dtype=np.float32) * 2)


def test_broken_model_endpoints(lenient: RunningServer) -> None:
    status, _, body = lenient.request("GET", "/v2/models/initialize_raises")
    assert status == 404 and b"has no available versions" in body
    # Triton's words first (clients match them), then why: the reason the load failed.
    error = json.loads(body)["error"]
    assert error.startswith("Request for unknown model: 'initialize_raises' has no available versions (version 1 "
                            "failed to load: "), error
    assert EXPECTED_REASONS["initialize_raises"] in error
    status, _, _ = lenient.request("GET", "/v2/models/initialize_raises/ready")
    assert status == 400
    status, _, body = lenient.request("POST", "/v2/models/dims_zero/infer", "{}")
    assert status == 404 and b"'dims_zero'" in body


def test_strict_readiness_reports_not_ready() -> None:
    server = RunningServer([BAD], wait_ready=False)
    try:
        assert server.request("GET", "/v2/health/live")[0] == 200
        assert server.request("GET", "/v2/health/ready")[0] == 400
        assert server.request("GET", "/v2/models/good/ready")[0] == 200
    finally:
        server.stop()


def test_exit_on_error_stops_startup() -> None:
    with pytest.raises(RuntimeError, match="exited"):
        RunningServer([BAD], "--exit-on-error=true", wait_ready=False)
