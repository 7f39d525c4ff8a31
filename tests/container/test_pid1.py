"""The container as SageMaker runs it, without Docker: ``naiad sagemaker serve`` (the image's entry point) as PID 1
of its own PID namespace, in a mount namespace with Docker's 64 MiB /dev/shm and the model where SageMaker mounts
it (/opt/ml/model, /opt/ml/models). A single-model and a multi-model endpoint of Python models, a stop with a request
in flight (docker stop: SIGTERM, then SIGKILL 10 s later), orphans reaped, SIGTERM while models load."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.container.namespace import as_pid1, pid1_of, unavailable
from tests.server import EXAMPLES, ROOT, free_port

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")

ADD_SUB = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                      {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 1, 1, 1]}]}
ADD_SUB_OUTPUTS = {"OUTPUT0": [2.0, 3.0, 4.0, 5.0], "OUTPUT1": [0.0, 1.0, 2.0, 3.0]}
DOCKER_STOP_GRACE = 10.0  # docker stop's default -t

# A Python model that takes its time: its execute sleeps, its initialize may too, and it leaves an orphan behind
# (a shell that backgrounds a short sleep and exits: the sleep is reparented to PID 1, which must reap it).
SLOW_PY = """
    import subprocess
    import time
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            subprocess.run(["sh", "-c", "sleep 0.2 & exit 0"], check=True)
            time.sleep({load_seconds})

        def execute(self, requests):
            time.sleep({seconds})
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                    for r in requests]
"""
SLOW_CONFIG = """
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
    output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
"""


def slow_model(folder: Path, name: str, seconds: float, load_seconds: float = 0.0) -> Path:
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(textwrap.dedent(SLOW_CONFIG.format(name=name)))
    (folder / "1" / "model.py").write_text(textwrap.dedent(SLOW_PY.format(seconds=seconds,
                                                                          load_seconds=load_seconds)))
    return folder


class Container:
    """``naiad sagemaker serve`` as ``docker run -v MODEL:/opt/ml/model IMAGE serve`` starts it."""

    def __init__(self, tmp: Path, binds: dict[Path, str], env: dict[str, str] | None = None,
                 wait: bool = True) -> None:
        self.port = free_port()
        self.log_path = tmp / f"container-{self.port}.log"
        self._log = open(self.log_path, "wb")
        environment = {**os.environ, "PYTHONPATH": str(ROOT), "SAGEMAKER_BIND_TO_PORT": str(self.port),
                       **(env or {})}
        self.proc = subprocess.Popen(as_pid1([sys.executable, "-m", "naiad", "sagemaker", "serve"], binds=binds),
                                     stdout=self._log, stderr=subprocess.STDOUT, env=environment, cwd=tmp)
        self.pid1 = pid1_of(self.proc.pid)
        if wait:
            self.wait_ping()

    def wait_ping(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the container exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if self.request("GET", "/ping", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"/ping never answered 200:\n{self.log()}")

    def request(self, method: str, path: str, body: dict | None = None, timeout: float = 60) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=json.dumps(body) if body is not None else None,
                         headers={"Content-Type": "application/json"} if body is not None else {})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def processes(self) -> dict[int, str]:
        """Every process in the container (host pids) with its state letter (Z: a zombie nobody reaped)."""
        found: dict[int, str] = {}
        pending = [self.pid1]
        while pending:
            pid = pending.pop()
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                continue
            found[pid] = stat.rsplit(")", 1)[1].split()[0]
            pending.extend(int(child) for child in children)
        return found

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            os.kill(self.pid1, sig)  # what docker stop does: the signal goes to the container's PID 1
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # --kill-child: the namespace goes with unshare
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")


def outputs(body: bytes) -> dict[str, list[float]]:
    return {out["name"]: out["data"] for out in json.loads(body)["outputs"]}


@pytest.fixture
def single_model(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    shutil.copytree(EXAMPLES / "add_sub", model / "add_sub")
    return model


@pytest.mark.parametrize("processes", ["1", "2"])
def test_single_model_endpoint_serves_a_python_model_as_pid_1(tmp_path: Path, single_model: Path,
                                                              processes: str) -> None:
    container = Container(tmp_path, {single_model: "/opt/ml/model"},
                          {"SAGEMAKER_TRITON_ADDITIONAL_ARGS": f"--frontend-processes={processes}"})
    try:
        status, body = container.request("POST", "/invocations", ADD_SUB)
        assert status == 200, body
        assert outputs(body) == ADD_SUB_OUTPUTS
        # Per-request and per-/ping lines are off by default in the image (SAGEMAKER_TRITON_LOG_VERBOSE turns
        # them on): a thousand health checks leave the log as it was.
        before = container.log().count("\n")
        for _ in range(20):
            container.request("GET", "/ping")
        time.sleep(0.2)
        assert container.log().count("\n") == before
    finally:
        assert container.stop() == 0, container.log()


def test_multi_model_endpoint_loads_python_models_as_pid_1(tmp_path: Path) -> None:
    models = tmp_path / "models"
    for key in ("a1b2", "c3d4", "e5f6"):
        shutil.copytree(EXAMPLES / "add_sub", models / key / "model")
    container = Container(tmp_path, {models: "/opt/ml/models"}, {"SAGEMAKER_MULTI_MODEL": "true"})
    try:
        for key in ("a1b2", "c3d4", "e5f6"):
            status, body = container.request("POST", "/models",
                                             {"model_name": key, "url": f"/opt/ml/models/{key}/model"})
            assert status == 200, body
        for key in ("a1b2", "c3d4", "e5f6"):
            status, body = container.request("POST", f"/models/{key}/invoke", ADD_SUB)
            assert status == 200, body
            assert outputs(body) == ADD_SUB_OUTPUTS
    finally:
        assert container.stop() == 0, container.log()


def test_docker_stop_answers_the_request_in_flight_and_exits_within_its_grace(tmp_path: Path) -> None:
    model = tmp_path / "model"
    slow_model(model / "slow", "slow", seconds=3.0)
    container = Container(tmp_path, {model: "/opt/ml/model"})
    answers: list[tuple[int, bytes]] = []
    client = threading.Thread(target=lambda: answers.append(container.request(
        "POST", "/invocations", {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1, 2]}]})))
    client.start()
    time.sleep(1.0)  # the request is in the model's execute
    started = time.monotonic()
    code = container.stop(signal.SIGTERM, timeout=DOCKER_STOP_GRACE + 5)
    took = time.monotonic() - started
    client.join(10)
    assert code == 0, container.log()
    assert took < DOCKER_STOP_GRACE, f"exit took {took:.1f} s, past docker stop's grace"
    assert answers and answers[0][0] == 200, answers
    assert outputs(answers[0][1]) == {"OUTPUT0": [1.0, 2.0]}


def test_a_request_longer_than_the_grace_is_answered_503_before_docker_would_kill(tmp_path: Path) -> None:
    model = tmp_path / "model"
    slow_model(model / "slow", "slow", seconds=30.0)
    container = Container(tmp_path, {model: "/opt/ml/model"})
    answers: list[tuple[int, bytes]] = []
    client = threading.Thread(target=lambda: answers.append(container.request(
        "POST", "/invocations", {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]}]})))
    client.start()
    time.sleep(1.0)
    started = time.monotonic()
    code = container.stop(signal.SIGTERM, timeout=DOCKER_STOP_GRACE + 5)
    took = time.monotonic() - started
    client.join(10)
    assert took < DOCKER_STOP_GRACE, f"exit took {took:.1f} s, past docker stop's grace:\n{container.log()}"
    assert code == 0, container.log()
    assert answers and answers[0][0] == 503, answers


def test_orphans_are_reaped(tmp_path: Path) -> None:
    # The model's initialize leaves a sleep whose parent exited: it is reparented to PID 1 and, once it exits,
    # would stay a zombie in a container whose PID 1 doesn't reap.
    model = tmp_path / "model"
    slow_model(model / "slow", "slow", seconds=0.0)
    container = Container(tmp_path, {model: "/opt/ml/model"})
    try:
        time.sleep(1.0)  # the orphaned sleep (0.2 s) has ended
        states = container.processes()
        assert "Z" not in states.values(), states
        assert len(states) >= 3  # PID 1, naiad, the model's worker
    finally:
        assert container.stop() == 0, container.log()


def test_sigterm_while_models_load_stops_the_container_within_docker_stops_grace(tmp_path: Path) -> None:
    # Before any handler of the event loop's is set: as PID 1 the kernel would drop the signal, and a load
    # longer than the grace would hold the container until docker stop's SIGKILL.
    model = tmp_path / "model"
    slow_model(model / "slow", "slow", seconds=0.0, load_seconds=60.0)
    container = Container(tmp_path, {model: "/opt/ml/model"}, wait=False)
    time.sleep(3.0)
    started = time.monotonic()
    code = container.stop(signal.SIGTERM, timeout=DOCKER_STOP_GRACE + 5)
    took = time.monotonic() - started
    log = container.log_path.read_text()
    assert took < DOCKER_STOP_GRACE, log
    assert code == 1 and "error: stopped while models were loading" in log, log
