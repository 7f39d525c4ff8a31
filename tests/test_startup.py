"""Start-up as tritonserver behaves: a missing repository or a failed model ends the process (code 1, Triton's
last line) unless --exit-on-error=false; a busy port is one clear line; failures of a model's execute reach the
server log; --log-verbose 1 shows naiad's request lines and not libraries' debug output."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.models import IDENTITY_FP32, IDENTITY_PY, write_model
from tests.server import ROOT, RunningServer, free_port

RAISES_PY = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            raise ValueError("boom from execute")
"""

FAILS_INIT_PY = """
    class TritonPythonModel:
        def initialize(self, args):
            raise RuntimeError("initialize refuses")
"""


def _serve(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    ports = ["--http-port", str(free_port()), "--grpc-port", str(free_port()), "--metrics-port", str(free_port()),
             "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1"]
    return subprocess.run([sys.executable, "-m", "naiad", "serve", *ports, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def _last_line(result: subprocess.CompletedProcess) -> str:
    return result.stderr.strip().splitlines()[-1]


def test_missing_repository_exits_with_tritons_line(tmp_path: Path) -> None:
    result = _serve("--model-repository", str(tmp_path / "nowhere"))
    assert result.returncode == 1
    assert _last_line(result) == f"error: creating server: Internal - failed to stat file {tmp_path / 'nowhere'}"


def test_repository_that_is_a_file_exits(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    result = _serve("--model-repository", str(tmp_path / "file"), "--strict-readiness=false")
    assert result.returncode == 1
    assert _last_line(result) == "error: creating server: Invalid argument - repository path is not a valid directory"


def test_missing_repository_without_exit_on_error_serves_neither_live_nor_ready(tmp_path: Path) -> None:
    server = RunningServer([tmp_path / "nowhere"], "--exit-on-error=false", wait_ready=False, wait_port=True)
    try:
        with httpclient.InferenceServerClient(server.url) as client:
            assert not client.is_server_live()
            assert not client.is_server_ready()
            with pytest.raises(InferenceServerException) as info:
                client.get_model_metadata("anything")
            assert info.value.status() == "503" and "Server not ready" in info.value.message()
            with pytest.raises(InferenceServerException) as info:
                client.get_model_repository_index()
            assert info.value.status() == "400"
            assert client.get_server_metadata()["extensions"]  # server metadata still answers, as in Triton
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        assert not grpc.is_server_live() and not grpc.is_server_ready()
        with pytest.raises(InferenceServerException) as info:
            grpc.get_model_config("anything")
        assert "Server not ready" in info.value.message()
        assert "Internal: failed to stat file" in server.log()
    finally:
        server.stop()


def test_failed_model_exits_by_default_and_serves_the_rest_when_told(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "good", IDENTITY_FP32.format(name="good"), IDENTITY_PY)
    write_model(repo, "bad", IDENTITY_FP32.format(name="bad"), FAILS_INIT_PY)
    result = _serve("--model-repository", str(repo))
    assert result.returncode == 1
    assert _last_line(result) == "error: creating server: Internal - failed to load all models"
    assert "initialize refuses" in result.stderr
    server = RunningServer([repo], "--exit-on-error=false", "--strict-readiness=false")
    try:
        with httpclient.InferenceServerClient(server.url) as client:
            assert client.is_server_live() and client.is_model_ready("good")
            assert not client.is_model_ready("bad")
    finally:
        server.stop()


def test_exit_after_a_failed_load_leaves_no_traceback(tmp_path: Path) -> None:
    """A Python model loads while another fails (as L0_parameters' repository does where its C++ backend is not
    built): the server's exit closes the loaded worker before the event loop watched its channel, and said nothing
    else. (naiad has Triton's identity test backend, so the missing one here is named otherwise.)"""
    repo = tmp_path / "repo"
    write_model(repo, "good", IDENTITY_FP32.format(name="good"), IDENTITY_PY)
    (repo / "nobackend" / "1").mkdir(parents=True)
    (repo / "nobackend" / "config.pbtxt").write_text(IDENTITY_FP32.format(name="nobackend").replace(
        'backend: "python"', 'backend: "no_such_backend"'))
    result = _serve("--model-repository", str(repo))
    assert result.returncode == 1
    assert _last_line(result) == "error: creating server: Internal - failed to load all models"
    assert "unable to find backend library for backend 'no_such_backend'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("which", ["http", "metrics"])
def test_busy_port_is_one_clear_line(tmp_path: Path, which: str) -> None:
    (tmp_path / "repo").mkdir()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = _serve("--model-repository", str(tmp_path / "repo"), f"--{which}-port", str(port))
    assert result.returncode == 1
    name = {"http": "HTTP", "metrics": "Metrics"}[which]
    assert _last_line(result) == \
        f"error: failed to start {name} service: Unavailable - Socket '127.0.0.1:{port}' already in use"
    assert "Traceback" not in result.stderr


def test_the_front_end_count_auto_chose_is_logged(tmp_path: Path) -> None:
    """--frontend-processes auto (the default) says at start what it chose and why, before anything else can end
    the start."""
    from naiad.core.cores import auto_frontends

    result = _serve("--model-repository", str(tmp_path / "nowhere"))
    count, line = auto_frontends()
    assert line in result.stdout + result.stderr
    assert (f"{count} front-end processes" if count > 1 else "one process") in line
    explicit = _serve("--model-repository", str(tmp_path / "nowhere"), "--frontend-processes", "1")
    assert "--frontend-processes auto" not in explicit.stdout + explicit.stderr


def test_execute_exception_is_logged_with_traceback_at_verbose(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "raises", IDENTITY_FP32.format(name="raises"), RAISES_PY)
    write_model(repo, "good", IDENTITY_FP32.format(name="good"), IDENTITY_PY)
    server = RunningServer([repo], "--log-verbose", "1")
    try:
        inputs = [httpclient.InferInput("INPUT0", [2], "FP32")]
        inputs[0].set_data_from_numpy(np.ones(2, np.float32))
        with httpclient.InferenceServerClient(server.url) as client:
            with pytest.raises(InferenceServerException, match="boom from execute"):
                client.infer("raises", inputs)
            assert client.infer("good", inputs).as_numpy("OUTPUT0").tolist() == [1.0, 1.0]
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        assert grpc.is_server_ready()
        log = server.log()
        assert ("execution of model 'raises' failed (1 request): Failed to process the request(s) for model "
                "'raises_0', message: ValueError: boom from execute") in log
        assert "model.py" in log and "At:" in log  # the traceback, at --log-verbose 1
        assert "HTTP request: POST /v2/models/good/infer" in log
        assert "GRPC request: /inference.GRPCInferenceService/ServerReady" in log
        assert "hpack" not in log  # HTTP/2 header-table debug lines stay out at level 1
    finally:
        server.stop()


def test_execute_exception_is_one_line_without_verbose(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "raises", IDENTITY_FP32.format(name="raises"), RAISES_PY)
    server = RunningServer([repo])
    try:
        body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]}]})
        status, _, _ = server.request("POST", "/v2/models/raises/infer", body)
        assert status == 500
        log = server.log()
        assert "execution of model 'raises' failed" in log and "At:" not in log
        assert "HTTP request:" not in log
    finally:
        server.stop()
