"""``GET /dashboard`` and its JSON feed on a live server, driven with http.client: the page and its files, every
model and version with its state and reason, figures that move under load, worker processes and restarts,
``--allow-dashboard``, the restricted-API rule, and the SageMaker port (multi-model residency; the dashboard
there when HTTP is off)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import psutil
import pytest

from tests import onnx_graphs
from tests.models import IDENTITY_FP32, IDENTITY_PY, write_model
from tests.server import RunningServer

RAISES_PY = """
    class TritonPythonModel:
        def execute(self, requests):
            raise RuntimeError("boom")
"""
BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1.5, 2.5]}]})


ONNX_CONFIG = """
    name: "onnx_identity"
    platform: "onnxruntime_onnx"
    version_policy: { all: {} }
    input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
    output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
    instance_group [{ count: 2, kind: KIND_CPU }]
"""


def write_repository(repo: Path) -> None:
    """echo (a worker process), raises (fails every execution), broken (no model.py: UNAVAILABLE with a reason),
    onnx_identity (two versions, two instances each, in the server process)."""
    for version in (1, 2):
        onnx_graphs.write(repo, "onnx_identity", onnx_graphs.identity("TYPE_FP32", [-1]), ONNX_CONFIG, version)
    write_model(repo, "echo", IDENTITY_FP32.format(name="echo"), IDENTITY_PY)
    write_model(repo, "raises", IDENTITY_FP32.format(name="raises"), RAISES_PY)
    write_model(repo, "broken", IDENTITY_FP32.format(name="broken"), IDENTITY_PY)
    (repo / "broken" / "1" / "model.py").unlink()


def infer_many(port: int, model: str, count: int) -> list[int]:
    """``count`` requests on one keep-alive connection; their statuses."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    statuses = []
    try:
        for _ in range(count):
            conn.request("POST", f"/v2/models/{model}/infer", BODY)
            response = conn.getresponse()
            response.read()
            statuses.append(response.status)
    finally:
        conn.close()
    return statuses


def feed(server: RunningServer, headers: dict[str, str] | None = None, port: int | None = None) -> dict[str, Any]:
    status, _, body = server.request("GET", "/dashboard/feed", headers=headers, port=port)
    assert status == 200, body
    return json.loads(body)


def wait_for(server: RunningServer, ready: Callable[[dict[str, Any]], bool], timeout: float = 10.0,
             **kwargs: Any) -> dict[str, Any]:
    """Poll the feed as the page does (every ~0.25 s here) until ``ready(feed)``."""
    deadline = time.monotonic() + timeout
    while True:
        document = feed(server, **kwargs)
        if ready(document):
            return document
        if time.monotonic() > deadline:
            raise AssertionError(f"the feed never got there: {json.dumps(document)[:2000]}")
        time.sleep(0.25)


def row(document: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in document["models"] if r["name"] == name)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("dashboard")
    write_repository(repo)
    running = RunningServer([repo], "--model-control-mode=explicit", "--load-model=*", "--allow-grpc=false",
                            "--allow-metrics=false", "--strict-readiness=false")
    yield running
    running.stop()


def test_the_page_and_its_files(server: RunningServer) -> None:
    status, headers, body = server.request("GET", "/dashboard")
    assert status == 200 and headers["content-type"] == "text/html; charset=utf-8"
    assert b'src="dashboard/app.js"' in body and b'href="dashboard/style.css"' in body
    # Nothing from elsewhere: no CDN, and the policy forbids it anyway.
    assert b"http://" not in body.replace(b"http://www.w3.org", b"") and b"https://" not in body
    assert headers["content-security-policy"] == "default-src 'self'; frame-ancestors 'none'"
    status, headers, script = server.request("GET", "/dashboard/app.js")
    assert status == 200 and headers["content-type"] == "text/javascript; charset=utf-8"
    assert b'"dashboard/feed"' in script
    status, headers, _ = server.request("GET", "/dashboard/style.css")
    assert status == 200 and headers["content-type"] == "text/css; charset=utf-8"
    assert server.request("HEAD", "/dashboard")[0] == 200
    assert f"Dashboard at http://127.0.0.1:{server.http_port}/dashboard" in server.log()  # the startup log says where
    assert server.request("POST", "/dashboard")[:3:2] == (405, b'{"error":"Method Not Allowed"}')
    assert server.request("DELETE", "/dashboard/feed")[0] == 405
    for path in ("/dashboard/other", "/dashboardx", "/dashboard//"):
        assert server.request("GET", path)[:3:2] == (404, b'{"error":"Not Found"}')
    # With a trailing slash: sent to the page, by a relative Location (which keeps a proxy's prefix).
    status, headers, _ = server.request("GET", "/dashboard/")
    assert status == 301 and urljoin(f"http://{server.url}/dashboard/", headers["location"]) == \
        f"http://{server.url}/dashboard"
    assert urljoin("http://proxy/naiad/dashboard/", headers["location"]) == "http://proxy/naiad/dashboard"


def test_every_model_and_version_with_its_state_and_reason(server: RunningServer) -> None:
    document = feed(server)
    status, _, index = server.request("POST", "/v2/repository/index")
    assert status == 200
    expected = [{"name": r["name"], "version": r.get("version", ""), "state": r.get("state", ""),
                 "reason": r.get("reason", "")} for r in json.loads(index)]
    assert [{k: r[k] for k in ("name", "version", "state", "reason")} for r in document["models"]] == expected
    broken = row(document, "broken")
    assert broken["state"] == "UNAVAILABLE" and "model.py" in broken["reason"]
    assert "stats" not in broken and "instances" not in broken
    echo = row(document, "echo")
    assert (echo["state"], echo["platform"], echo["ready"]) == ("READY", "python", True)
    server_info = document["server"]
    assert server_info["pid"] == server.proc.pid and server_info["rss"] > 0
    assert (server_info["control_mode"], server_info["port"], server_info["live"]) == ("explicit", "http", True)
    assert document["actions"] == {"repository": True, "residents": False}
    assert document["mme"] is None  # no SageMaker endpoint


def test_rate_latency_and_errors_move_under_load(server: RunningServer) -> None:
    feed(server)  # the first poll starts the sampling
    stop = threading.Event()
    sent: list[int] = []

    def load() -> None:
        while not stop.is_set() and len(sent) < 2000:
            sent.extend(infer_many(server.http_port, "echo", 10))

    thread = threading.Thread(target=load)
    thread.start()
    try:
        assert set(infer_many(server.http_port, "raises", 3)) == {500}
        busy = wait_for(server, lambda d: row(d, "echo")["stats"]["rate"] > 0
                        and row(d, "echo")["stats"]["compute_ms"] is not None
                        and row(d, "echo")["stats"]["p99_ms"] is not None)
    finally:
        stop.set()
        thread.join()
    assert set(sent) == {200}
    echo = row(busy, "echo")["stats"]
    assert echo["queue_ms"] >= 0 and echo["compute_ms"] > 0
    assert 0 < echo["p50_ms"] <= echo["p99_ms"]
    assert max(echo["history"]) > 0
    raises = row(busy, "raises")["stats"]
    assert raises["failed"] == 3 and raises["fail_reasons"] == {"BACKEND": 3} and raises["success"] == 0
    # The totals are /stats' counters.
    done = wait_for(server, lambda d: row(d, "echo")["stats"]["success"] == len(sent))
    status, _, body = server.request("GET", "/v2/models/echo/stats")
    stats = json.loads(body)["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == row(done, "echo")["stats"]["success"]
    assert stats["execution_count"] == row(done, "echo")["stats"]["executions"]


def test_instances_show_worker_processes_and_restarts(server: RunningServer) -> None:
    echo = row(feed(server), "echo")
    [instance] = echo["instances"]
    pid = instance["pid"]
    assert instance["name"] == "echo_0" and not instance["in_server"]
    assert instance["restarts"] == 0 and instance["ready"] and instance["rss"] > 0
    assert psutil.Process(pid).ppid() == server.proc.pid
    for version in ("1", "2"):  # onnxruntime sessions run in the server's own process
        [onnx] = [r for r in feed(server)["models"] if r["name"] == "onnx_identity" and r["version"] == version]
        assert onnx["state"] == "READY" and len(onnx["instances"]) == 2
        assert {(i["pid"], i["in_server"], i["restarts"]) for i in onnx["instances"]} == {(server.proc.pid, True, None)}
    os.kill(pid, signal.SIGKILL)
    document = wait_for(server, lambda d: row(d, "echo")["instances"][0]["restarts"] == 1
                        and row(d, "echo")["instances"][0]["ready"])
    restarted = row(document, "echo")["instances"][0]
    assert restarted["pid"] != pid and psutil.pid_exists(restarted["pid"])


def test_requests_refused_for_a_wrong_input_name_are_failures_with_a_reason(tmp_path: Path) -> None:
    """Refused before the model runs, they still failed for their client: the dashboard, /v2/models/<m>/stats and
    nv_inference_request_failure{reason="OTHER"} count them, and the answer lists the inputs the model takes."""
    write_model(tmp_path, "echo", IDENTITY_FP32.format(name="echo"), IDENTITY_PY)
    server = RunningServer([tmp_path], "--allow-grpc=false")
    try:
        feed(server)
        wrong = BODY.replace('"INPUT0"', '"INPUT_0"')
        statuses, answers = [], []
        for _ in range(3):
            status, _, body = server.request("POST", "/v2/models/echo/infer", wrong)
            statuses.append(status)
            answers.append(json.loads(body)["error"])
        assert statuses == [400] * 3
        assert answers[0] == "unexpected inference input 'INPUT_0' for model 'echo' (the model's inputs: 'INPUT0')"
        assert infer_many(server.http_port, "echo", 2) == [200, 200]
        stats = json.loads(server.request("GET", "/v2/models/echo/stats")[2])["model_stats"][0]["inference_stats"]
        assert (stats["fail"]["count"], stats["success"]["count"]) == (3, 2)
        document = wait_for(server, lambda d: row(d, "echo")["stats"]["failed"] == 3)
        echo = row(document, "echo")["stats"]
        assert echo["fail_reasons"] == {"refused": 3} and echo["success"] == 2
        assert echo["last_refusal"] == answers[-1]
        conn = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=10)
        conn.request("GET", "/metrics")
        metrics = conn.getresponse().read().decode()
        conn.close()
        assert 'nv_inference_request_failure{model="echo",reason="OTHER",version="1"} 3' in metrics, metrics
    finally:
        server.stop()
