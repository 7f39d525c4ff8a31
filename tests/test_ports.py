"""Each port naiad serves is its own (naiad/frontends/ports.py), driven by real servers and clients: a second server started on it fails with Triton's
one line and exit code 1, whatever ``--frontend-processes`` says, and the first keeps every new connection; with
``--reuse-http-port`` / ``--reuse-grpc-port`` on both, both serve, as documented. With front-end processes the
HTTP, SageMaker and lean gRPC ports are one listening socket that the host binds and its front ends share, so
the connections a stopped front end would have taken go to the others."""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient

from tests.server import EXAMPLES, ROOT, RunningServer, free_port

CONNECTIONS = 20
ADD_SUB = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                      {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 1, 1, 1]}]}
# Each port: its flag, the name in Triton's line, and how the first server's RunningServer names the port.
PORTS = {"http": ("--http-port", "HTTP", "http_port"),
         "sagemaker": ("--sagemaker-port", "Sagemaker", "sagemaker_port"),
         "grpc": ("--grpc-port", "GRPC", "grpc_port"),
         "metrics": ("--metrics-port", "Metrics", "metrics_port")}


def _first(engine: str, *extra: str) -> RunningServer:
    """add_sub on every port, its HTTP, SageMaker and gRPC ones served by two front-end processes."""
    return RunningServer([EXAMPLES], "--frontend-processes", "2", f"--grpc-engine={engine}",
                         "--allow-sagemaker=true", *extra, env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "add_sub"})


@pytest.fixture(scope="module")
def first(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    """The first server, its gRPC engine the test's (the engine changes only the gRPC port)."""
    server = _first(request.param)
    server.engine = request.param  # type: ignore[attr-defined]
    yield server
    server.stop()


def _ok(status: int, body: bytes) -> bool:
    return status == 200 and {o["name"]: o["data"] for o in json.loads(body)["outputs"]}["OUTPUT0"] == [2, 3, 4, 5]


def _http(port: int, path: str) -> Callable[[], bool]:
    def once() -> bool:  # a connection of its own each time: the port's accept decides who answers
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            if path == "/metrics":
                conn.request("GET", path)
                response = conn.getresponse()
                return response.status == 200 and b'nv_inference_request_success{model="add_sub"' in response.read()
            conn.request("POST", path, json.dumps(ADD_SUB), {"Content-Type": "application/json"})
            response = conn.getresponse()
            return _ok(response.status, response.read())
        except (OSError, http.client.HTTPException, ValueError, KeyError):
            return False
        finally:
            conn.close()
    return once


def _grpc(port: int) -> Callable[[], bool]:
    def once() -> bool:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            inputs = [grpcclient.InferInput("INPUT0", [4], "FP32"), grpcclient.InferInput("INPUT1", [4], "FP32")]
            inputs[0].set_data_from_numpy(np.array([1, 2, 3, 4], np.float32))
            inputs[1].set_data_from_numpy(np.ones(4, np.float32))
            result = client.infer("add_sub", inputs, client_timeout=5)
            return result.as_numpy("OUTPUT0").tolist() == [2, 3, 4, 5]
        except Exception:  # noqa: BLE001 - an error from the other server or none at all: not the first's answer
            return False
        finally:
            client.close()
    return once


def _traffic(server: RunningServer, kind: str) -> Callable[[], bool]:
    port = getattr(server, PORTS[kind][2])
    return {"http": lambda: _http(port, "/v2/models/add_sub/infer"), "sagemaker": lambda: _http(port, "/invocations"),
            "grpc": lambda: _grpc(port), "metrics": lambda: _http(port, "/metrics")}[kind]()


def _second(tmp_path: Path, flag: str, port: int, *extra: str) -> subprocess.Popen:
    """A server of no models with one port the first's (the others free), as a user would start it by mistake."""
    (tmp_path / "empty").mkdir(exist_ok=True)
    ports = {"--http-port": free_port(), "--grpc-port": free_port(), "--metrics-port": free_port(),
             "--sagemaker-port": free_port(), flag: port}
    args = [sys.executable, "-m", "naiad", "serve", "--model-repository", str(tmp_path / "empty"),
            "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1",
            "--allow-sagemaker=true", *(str(a) for pair in ports.items() for a in pair), *extra]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def _settle(proc: subprocess.Popen, processes: str, timeout: float = 60) -> str:
    """Until the second server exits or says it serves (its last port open; with front-end processes, once they
    all listen); what it wrote meanwhile."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if not line or ("front-end processes:" if processes != "1" else "Started Metrics Service") in line:
            break
    return "".join(lines)


def _stop(proc: subprocess.Popen) -> str:
    """The second server stopped (whatever it started with it), and what it wrote since ``_settle``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


@pytest.mark.parametrize("processes", ["2", "1"])  # the second server's
@pytest.mark.parametrize(("first", "kind"), [("lean", "http"), ("lean", "sagemaker"), ("lean", "grpc"),
                                             ("lean", "metrics"), ("grpcio", "grpc")], indirect=["first"])
def test_a_second_server_on_a_served_port_fails_and_the_first_keeps_every_connection(
        first: RunningServer, kind: str, processes: str, tmp_path: Path) -> None:
    flag, name, attribute = PORTS[kind]
    port = getattr(first, attribute)
    second = _second(tmp_path, flag, port, "--frontend-processes", processes,
                     f"--grpc-engine={first.engine}")  # type: ignore[attr-defined]
    try:
        said = _settle(second, processes)
        once = _traffic(first, kind)
        answered = sum(once() for _ in range(CONNECTIONS))
        children = [p.pid for p in psutil.Process(second.pid).children(recursive=True)] if second.poll() is None else []
    finally:
        out = said + _stop(second)
    assert answered == CONNECTIONS, f"{CONNECTIONS - answered} of {CONNECTIONS} not answered by the first:\n{out}"
    assert second.returncode == 1, out
    assert out.strip().splitlines()[-1] == \
        f"error: failed to start {name} service: Unavailable - Socket '127.0.0.1:{port}' already in use", out
    assert "front-end process" not in out and "Traceback" not in out, out  # the host refused before any started
    assert not children
    assert first.proc.poll() is None


def test_both_serve_when_both_opt_in_to_sharing_the_ports(tmp_path: Path) -> None:
    """--reuse-http-port / --reuse-grpc-port: several servers on one port, as documented (SO_REUSEPORT), whatever
    --frontend-processes; the kernel spreads the connections among them."""
    server = _first("lean", "--reuse-http-port=true", "--reuse-grpc-port=true")
    try:
        second = _second(tmp_path, "--http-port", server.http_port, "--frontend-processes", "2",
                         "--reuse-http-port=true", "--reuse-grpc-port=true", "--grpc-port", str(server.grpc_port))
        try:
            said = _settle(second, "2")
            assert second.poll() is None, said
            answers = [_traffic(server, "http")() for _ in range(40)] + [_traffic(server, "grpc")() for _ in range(40)]
        finally:
            out = _stop(second)
        # Some connections went to the second, whose repository is empty.
        assert 0 < sum(answers[:40]) < 40 and 0 < sum(answers[40:]) < 40, (answers, out)
    finally:
        server.stop()


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_a_stopped_front_end_leaves_its_new_connections_to_the_other(kind: str) -> None:
    """SIGSTOP one front end: every new connection is still answered (the other accepts from the shared socket;
    with a socket each, the kernel would keep queueing the stopped one's share, and those clients would hang)."""
    server = _first("lean")
    front_ends = [p for p in psutil.Process(server.proc.pid).children() if "naiad.processes" in p.cmdline()]
    try:
        front_ends[0].suspend()
        once = _traffic(server, kind)
        answered = sum(once() for _ in range(CONNECTIONS))
        assert answered == CONNECTIONS
    finally:
        front_ends[0].resume()
        server.stop()
