"""The metrics page parsed with prometheus_client's own parser and checked against /stats after a known
number of requests over HTTP and gRPC."""

from __future__ import annotations

import http.client
import json
import re
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.frontends.grpc.conftest import write_grpc_models
from tests.server import EXAMPLES, RunningServer

MODEL_FAMILIES = {
    "nv_inference_request_success": "counter",
    "nv_inference_request_failure": "counter",
    "nv_inference_count": "counter",
    "nv_inference_exec_count": "counter",
    "nv_inference_request_duration_us": "counter",
    "nv_inference_queue_duration_us": "counter",
    "nv_inference_compute_input_duration_us": "counter",
    "nv_inference_compute_infer_duration_us": "counter",
    "nv_inference_compute_output_duration_us": "counter",
    "nv_inference_pending_request_count": "gauge",
    "nv_model_load_duration_secs": "gauge",
}
SERVER_FAMILIES = {"nv_cpu_utilization": "gauge", "nv_cpu_memory_total_bytes": "gauge",
                   "nv_cpu_memory_used_bytes": "gauge"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("metrics_models")
    write_grpc_models(repo)
    server = RunningServer([EXAMPLES, repo], "--metrics-interval-ms", "50")
    yield server
    server.stop()


def _get(server: RunningServer, method: str = "GET", path: str = "/metrics") -> tuple[int, str, str]:
    conn = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=10)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read().decode()
    finally:
        conn.close()


def _scrape(server: RunningServer) -> dict:
    status, _, text = _get(server)
    assert status == 200
    return {family.name: family for family in text_string_to_metric_families(text)}


def _value(families: dict, name: str, **labels: str) -> float:
    for sample in families[name].samples:
        if all(sample.labels.get(k) == v for k, v in labels.items()):
            return sample.value
    raise AssertionError(f"no sample {name} {labels}")


def test_counts_agree_with_stats(server: RunningServer) -> None:
    x = np.arange(4, dtype=np.float32)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        inputs = [grpcclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(x)
        for _ in range(5):
            client.infer("add_sub", inputs)
        for mode in (0, 1, 2, 2):  # echo, error response (still a success, as in Triton), two raises
            mode_input = grpcclient.InferInput("MODE", [1], "INT32")
            mode_input.set_data_from_numpy(np.array([mode], dtype=np.int32))
            try:
                client.infer("fail", [mode_input])
            except InferenceServerException:
                pass
        # Refused before queueing: a failure, reason OTHER (Triton 2.51 counts it nowhere, so no dashboard or
        # alert built on its metrics would see a client sending nothing but refused requests).
        bad = grpcclient.InferInput("MODE", [2], "INT32")
        bad.set_data_from_numpy(np.array([0, 0], dtype=np.int32))
        with pytest.raises(InferenceServerException):
            client.infer("fail", [bad])
    with httpclient.InferenceServerClient(server.url) as client:
        inputs = [httpclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(x)
        for _ in range(2):
            client.infer("add_sub", inputs)

    families = _scrape(server)
    for model, version in (("add_sub", "1"), ("fail", "1")):
        status, _, body = server.request("GET", f"/v2/models/{model}/versions/{version}/stats")
        assert status == 200
        stats = json.loads(body)["model_stats"][0]
        inference = stats["inference_stats"]
        labels = {"model": model, "version": version}
        assert _value(families, "nv_inference_request_success", **labels) == inference["success"]["count"]
        failures = sum(_value(families, "nv_inference_request_failure", reason=r, **labels)
                       for r in ("REJECTED", "CANCELED", "BACKEND", "OTHER"))
        assert failures == inference["fail"]["count"]
        assert _value(families, "nv_inference_count", **labels) == stats["inference_count"]
        assert _value(families, "nv_inference_exec_count", **labels) == stats["execution_count"]
        assert _value(families, "nv_inference_request_duration_us", **labels) == inference["success"]["ns"] // 1000
        for kind in ("queue", "compute_input", "compute_infer", "compute_output"):
            name = "nv_inference_queue_duration_us" if kind == "queue" else f"nv_inference_{kind}_duration_us"
            assert _value(families, name, **labels) == inference[kind]["ns"] // 1000
        assert _value(families, "nv_inference_pending_request_count", **labels) == 0
        assert _value(families, "nv_model_load_duration_secs", **labels) > 0
    # The known counts themselves.
    assert _value(families, "nv_inference_request_success", model="add_sub") == 7
    assert _value(families, "nv_inference_request_success", model="fail") == 2
    assert _value(families, "nv_inference_request_failure", model="fail", reason="BACKEND") == 2
    assert _value(families, "nv_inference_request_failure", model="fail", reason="OTHER") == 1
    assert _value(families, "nv_inference_exec_count", model="fail") == 4


def test_families_as_triton_names_them(server: RunningServer) -> None:
    status, content_type, text = _get(server)
    assert (status, content_type) == (200, "text/plain; charset=utf-8")
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert families == {**MODEL_FAMILIES, **SERVER_FAMILIES}
    # Counters keep Triton's names: no "_total" anywhere on the page.
    assert "# TYPE nv_inference_count counter" in text and not re.search(r"_total[ {]", text)
    failure = [s for s in text.splitlines() if s.startswith('nv_inference_request_failure{model="add_sub"')]
    assert sorted(line.split('reason="')[1].split('"')[0] for line in failure) == [
        "BACKEND", "CANCELED", "OTHER", "REJECTED"]
    # Every loaded model version is listed.
    loaded = {(s.labels["model"], s.labels["version"])
              for f in text_string_to_metric_families(text) if f.name == "nv_inference_count" for s in f.samples}
    assert {("add_sub", "1"), ("identity_bytes", "1"), ("dtypes", "1")} <= loaded


def test_cpu_and_memory(server: RunningServer) -> None:
    families = _scrape(server)
    total = _value(families, "nv_cpu_memory_total_bytes")
    assert 0 < _value(families, "nv_cpu_memory_used_bytes") < total
    # Sampled every 50 ms: busy-wait until the server reports some load, within a bound.
    deadline = time.monotonic() + 5
    utilization = _value(families, "nv_cpu_utilization")
    while utilization == 0 and time.monotonic() < deadline:
        sum(range(200_000))
        utilization = _value(_scrape(server), "nv_cpu_utilization")
    assert 0 < utilization <= 1


def test_other_requests(server: RunningServer) -> None:
    assert _get(server, "POST")[0] == 405
    assert _get(server, "GET", "/nope")[0] == 404
