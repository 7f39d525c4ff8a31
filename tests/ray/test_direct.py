"""``naiad ray serve`` starting its own Ray, with its defaults: direct ingress (the ingress replica itself listens on
--http-port and --grpc-port, Ray's proxy out of the path) and naiad's replicas under Ray Serve's throughput
settings. Unmodified tritonclient HTTP and gRPC, boto3's routes, summed statistics, the dashboard's text and a
cold start that loads a model on one replica only, as through Ray's proxy (tests/ray/test_serve.py, test_grpc.py).

Its own Ray instance: the module runs before the directory's shared one starts (files run in name order)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import psutil
import pytest

pytest.importorskip("ray.serve")  # every test here runs on Ray Serve

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.ray.conftest import wait_for
from tests.ray.test_serve import ADD_SUB, request
from tests.server import EXAMPLES, ROOT, RunningServer, free_port


@dataclass
class Started:
    http_port: int
    grpc_port: int

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


@pytest.fixture(scope="module")
def started() -> Iterator[Started]:
    http_port, grpc_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # not the tests' Ray, if it ran
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    process = subprocess.Popen(
        [sys.executable, "-m", "naiad", "ray", "serve", "--model-repository", str(EXAMPLES), "--http-port",
         str(http_port), "--grpc-port", str(grpc_port), "--num-replicas", "2", "--replica-num-cpus", "0.5",
         "--default-model", "add_sub"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True)
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith("naiad on Ray Serve"):
                assert line.rstrip().endswith("(direct ingress)")
                break
        else:
            raise AssertionError(f"naiad ray serve exited with {process.wait()}")
        wait_for(lambda: _answers(http_port), 60, "the ingress's own port")
        yield Started(http_port, grpc_port)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            assert process.wait(timeout=90) == 0
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)


def _answers(port: int) -> bool:
    try:
        return request(f"127.0.0.1:{port}", "GET", "/v2/health/ready")[0] == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def naiad_serve() -> Iterator[RunningServer]:
    server = RunningServer([EXAMPLES], "--allow-sagemaker=true", "--allow-grpc=true",
                           env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "add_sub"})
    yield server
    server.stop()


def test_the_ingress_replica_owns_the_clients_ports(started: Started) -> None:
    """Direct ingress: what listens on --http-port and --grpc-port is the ingress replica, not Ray's proxy."""
    owners = {}
    for connection in psutil.net_connections("tcp"):
        if connection.status == psutil.CONN_LISTEN and connection.laddr.port in (started.http_port,
                                                                                 started.grpc_port):
            owners[connection.laddr.port] = " ".join(psutil.Process(connection.pid).cmdline())
    assert set(owners) == {started.http_port, started.grpc_port}
    assert all("NaiadIngress" in owner for owner in owners.values()), owners


def test_cold_start_loads_a_model_on_one_replica(started: Started) -> None:
    """Eight clients' first requests for one model, on two replicas: one load, the others wait and then go where it
    went (the ingress's router now runs on its own event loop)."""
    def infer(_: int) -> bytes:
        status, _body, headers = request(started.url, "POST", "/v2/models/add_sub/infer",
                                         json.dumps(ADD_SUB).encode())
        assert status == 200
        return headers["x-naiad-residency"].encode()

    with ThreadPoolExecutor(8) as pool:
        residencies = list(pool.map(infer, range(8)))
    assert residencies.count(b"load") == 1, residencies


def test_tritonclient_http_and_grpc_answer_as_naiad_serve(started: Started, naiad_serve: RunningServer) -> None:
    a, b = np.array([1, 2, 3, 4], np.float32), np.array([0.5, 1, 1, 1], np.float32)
    answers = []
    for module, url in ((httpclient, started.url), (httpclient, naiad_serve.url),
                        (grpcclient, started.grpc_url), (grpcclient, naiad_serve.grpc_url)):
        client = module.InferenceServerClient(url)
        assert client.is_server_ready() and client.is_model_ready("add_sub")
        inputs = [module.InferInput("INPUT0", [4], "FP32"), module.InferInput("INPUT1", [4], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer("add_sub", inputs)
        metadata = client.get_model_metadata("add_sub", **({"as_json": True} if module is grpcclient else {}))
        answers.append((result.as_numpy("OUTPUT0").tolist(), result.as_numpy("OUTPUT1").tolist(), metadata))
        client.close()
    assert answers[0] == answers[1] and answers[2] == answers[3]
    assert answers[0][0] == [1.5, 3, 4, 5]


def test_grpc_stream_through_the_ingress(started: Started) -> None:
    import queue

    replies: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(started.grpc_url)
    client.start_stream(callback=lambda result, error: replies.put((result, error)))
    for i in range(3):
        inputs = [grpcclient.InferInput("INPUT0", [4], "FP32"), grpcclient.InferInput("INPUT1", [4], "FP32")]
        inputs[0].set_data_from_numpy(np.full(4, i, np.float32))
        inputs[1].set_data_from_numpy(np.ones(4, np.float32))
        client.async_stream_infer("add_sub", inputs, request_id=str(i))
    got = [replies.get(timeout=30) for _ in range(3)]
    client.stop_stream()
    client.close()
    assert [error for _, error in got] == [None] * 3
    assert [result.get_response().id for result, _ in got] == ["0", "1", "2"]
    assert [result.as_numpy("OUTPUT0").tolist() for result, _ in got] == [[i + 1.0] * 4 for i in range(3)]


def test_sagemaker_routes_statistics_and_dashboard(started: Started, naiad_serve: RunningServer) -> None:
    expected = request(naiad_serve.sagemaker_url.removeprefix("http://"), "POST", "/invocations",
                       json.dumps(ADD_SUB).encode(), {"Content-Type": "application/json"})[1]
    assert request(started.url, "GET", "/ping")[0] == 200
    status, body, _ = request(started.url, "POST", "/invocations", json.dumps(ADD_SUB).encode(),
                              {"Content-Type": "application/json"})
    assert (status, body) == (200, expected)
    status, body, _ = request(started.url, "GET", "/dashboard")
    assert status == 404 and b"not served under naiad ray serve" in body

    def counted() -> int:
        stats = json.loads(request(started.url, "GET", "/v2/models/add_sub/stats")[1])
        return int(stats["model_stats"][0]["inference_stats"]["success"]["count"]) if stats.get("model_stats") else 0

    time.sleep(2.5)  # replicas push their figures every second: the earlier tests' requests are all in by now
    before = counted()
    for _ in range(4):
        assert request(started.url, "POST", "/v2/models/add_sub/infer", json.dumps(ADD_SUB).encode())[0] == 200
    deadline = time.monotonic() + 10
    while counted() < before + 4 and time.monotonic() < deadline:
        time.sleep(0.25)
    assert counted() == before + 4 > 4
    grpc_stats = grpcclient.InferenceServerClient(started.grpc_url).get_inference_statistics("add_sub", as_json=True)
    assert int(grpc_stats["model_stats"][0]["inference_stats"]["success"]["count"]) == before + 4
