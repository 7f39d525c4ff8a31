"""A model whose initialize() hangs: loads run on a pool of their own, so the other models load at once, and the hung
load fails at --model-load-timeout-secs with a clear reason, its worker process killed, the server serving on."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import psutil

from tests.models import IDENTITY_FP32, write_model
from tests.server import RunningServer

TIMEOUT = 3.0

_HANG_PY = """
    import time

    class TritonPythonModel:
        def initialize(self, args):
            time.sleep({seconds})

        def execute(self, requests):
            return []
"""

_ECHO_PY = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                    for r in requests]
"""


def _repo(root: Path, hang_seconds: int, good: int = 3) -> Path:
    repo = root / "repo"
    write_model(repo, "hang", IDENTITY_FP32.format(name="hang"), _HANG_PY.format(seconds=hang_seconds))
    for index in range(good):
        write_model(repo, f"good{index}", IDENTITY_FP32.format(name=f"good{index}"), _ECHO_PY)
    return repo


def _load(server: RunningServer, model: str, out: dict[str, tuple[int, str, float]]) -> None:
    started = time.monotonic()
    status, _, body = server.request("POST", f"/v2/repository/models/{model}/load")
    out[model] = (status, body.decode(errors="replace"), time.monotonic() - started)


def _infer(server: RunningServer, model: str) -> int:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [2.0]}]}
    status, _, _ = server.request("POST", f"/v2/models/{model}/infer", json.dumps(body))
    return status


def _workers(server: RunningServer) -> list[str]:
    """The command lines of the server's child processes (Python backend workers)."""
    return [" ".join(p.cmdline()) for p in psutil.Process(server.proc.pid).children(recursive=True)]


def test_a_hung_initialize_delays_no_other_load_and_fails_at_the_timeout(tmp_path: Path) -> None:
    server = RunningServer([_repo(tmp_path, 3600)], "--model-control-mode=explicit",
                           f"--model-load-timeout-secs={TIMEOUT}")
    try:
        results: dict[str, tuple[int, str, float]] = {}
        hung = threading.Thread(target=_load, args=(server, "hang", results))
        hung.start()
        time.sleep(0.5)  # the hung load holds a load thread now
        others = [threading.Thread(target=_load, args=(server, f"good{i}", results)) for i in range(3)]
        for thread in others:
            thread.start()
        for thread in others:
            thread.join(30)
        for index in range(3):
            status, body, seconds = results[f"good{index}"]
            assert status == 200, body
            assert seconds < TIMEOUT, f"good{index} waited {seconds:.1f} s behind the hung load"
            assert _infer(server, f"good{index}") == 200
        hung.join(TIMEOUT + 30)
        status, body, seconds = results["hang"]
        assert status == 400, body
        assert "did not become ready within 3 s (--model-load-timeout-secs)" in body, body
        assert TIMEOUT <= seconds < TIMEOUT + 3, f"the hung load failed after {seconds:.1f} s"
        # Its worker is gone; the three good ones serve on.
        deadline = time.monotonic() + 5
        while len(_workers(server)) != 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_workers(server)) == 3, _workers(server)
        status, _, index = server.request("POST", "/v2/repository/index", "{}")
        rows = {row["name"]: row for row in json.loads(index)}
        assert rows["hang"]["state"] == "UNAVAILABLE" and "--model-load-timeout-secs" in rows["hang"]["reason"]
        assert server.request("GET", "/v2/health/live")[0] == 200
    finally:
        server.stop()


def test_start_up_gives_up_on_a_hung_model_and_serves_the_others(tmp_path: Path) -> None:
    started = time.monotonic()
    server = RunningServer([_repo(tmp_path, 3600, good=1)], f"--model-load-timeout-secs={TIMEOUT}",
                           wait_ready=False)  # not ready: one model failed (strict readiness)
    try:
        assert time.monotonic() - started < TIMEOUT + 15
        assert _infer(server, "good0") == 200
        status, _, index = server.request("POST", "/v2/repository/index", "{}")
        rows = {row["name"]: row for row in json.loads(index)}
        assert rows["hang"]["state"] == "UNAVAILABLE" and "--model-load-timeout-secs" in rows["hang"]["reason"]
        assert len(_workers(server)) == 1, _workers(server)
    finally:
        server.stop()


def test_an_in_process_initialize_that_cannot_be_killed_is_given_up_and_unloaded_when_it_returns(
        tmp_path: Path) -> None:
    # In the server's own process nothing can stop initialize(): the load is given up a grace after the timeout,
    # and what it loads once initialize() returns is unloaded again.
    server = RunningServer([_repo(tmp_path, 7, good=1)], "--model-control-mode=explicit",
                           f"--model-load-timeout-secs={TIMEOUT}", "--backend-config=python,in-process=true")
    try:
        results: dict[str, tuple[int, str, float]] = {}
        hung = threading.Thread(target=_load, args=(server, "hang", results))
        hung.start()
        time.sleep(0.5)
        _load(server, "good0", results)
        assert results["good0"][0] == 200 and results["good0"][2] < TIMEOUT, results["good0"]
        hung.join(30)
        status, body, seconds = results["hang"]
        assert status == 400 and "did not finish within 3 s (--model-load-timeout-secs)" in body, body
        assert seconds < TIMEOUT + 4, seconds
        deadline = time.monotonic() + 10
        while "finished after its timeout; unloading it" not in server.log() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "finished after its timeout; unloading it" in server.log()
        assert _infer(server, "hang") != 200
        assert _infer(server, "good0") == 200
    finally:
        server.stop()
