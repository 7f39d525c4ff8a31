"""--model-load-thread-count loads start-up models side by side; --model-load-retry-count tries a failed load
again before giving up."""

from __future__ import annotations

import json
from pathlib import Path

import tritonclient.http as httpclient

from tests.models import IDENTITY_FP32, write_model
from tests.server import RunningServer

SLOW_INIT_PY = """
    import json, os, time
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            start = time.time()
            time.sleep(0.6)
            with open(os.environ["NAIAD_TEST_TIMES"], "a") as f:
                f.write(json.dumps([args["model_name"], start, time.time()]) + "\\n")

        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                    for r in requests]
"""

FLAKY_INIT_PY = """
    import os
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            marker = os.environ["NAIAD_TEST_ATTEMPTS"]
            with open(marker, "a") as f:
                f.write("x")
            if len(open(marker).read()) < 2:
                raise RuntimeError("first attempt fails")

        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                    for r in requests]
"""


def _load_spans(times: Path) -> list[tuple[float, float]]:
    return [(start, end) for _, start, end in map(json.loads, times.read_text().splitlines())]


def test_models_load_side_by_side(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for name in ("a", "b", "c"):
        write_model(repo, name, IDENTITY_FP32.format(name=name), SLOW_INIT_PY)
    times = tmp_path / "times"
    server = RunningServer([repo], "--model-load-thread-count", "3", env={"NAIAD_TEST_TIMES": str(times)})
    server.stop()
    spans = _load_spans(times)
    assert len(spans) == 3
    assert max(s for s, _ in spans) < min(e for _, e in spans)  # all three initialize at the same time


def test_one_load_thread_loads_in_turn(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for name in ("a", "b"):
        write_model(repo, name, IDENTITY_FP32.format(name=name), SLOW_INIT_PY)
    times = tmp_path / "times"
    server = RunningServer([repo], "--model-load-thread-count", "1", env={"NAIAD_TEST_TIMES": str(times)})
    server.stop()
    (s1, e1), (s2, e2) = sorted(_load_spans(times))
    assert e1 <= s2


def test_retry_count_loads_a_flaky_model(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "flaky", IDENTITY_FP32.format(name="flaky"), FLAKY_INIT_PY)
    attempts = tmp_path / "attempts"
    server = RunningServer([repo], "--model-load-retry-count", "1", env={"NAIAD_TEST_ATTEMPTS": str(attempts)})
    try:
        with httpclient.InferenceServerClient(server.url) as client:
            assert client.is_model_ready("flaky")
        assert "attempt 1 of 2" in server.log()
    finally:
        server.stop()
    attempts.unlink()
    server = RunningServer([repo], env={"NAIAD_TEST_ATTEMPTS": str(attempts)}, wait_ready=False)  # no retry
    try:
        with httpclient.InferenceServerClient(server.url) as client:
            assert not client.is_model_ready("flaky")
    finally:
        server.stop()
