"""Seeded fuzzing of explicit-mode model control (see fuzz_control): odd config overrides, model files, names and
parameters get clean answers, and the ``target`` model still loads and serves after every batch."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.models import IDENTITY_FP32, IDENTITY_PY, write_model
from tests.reliability import fuzz_control
from tests.reliability.fuzz_control import BASE_CONFIG, TARGET
from tests.server import RunningServer

SEED = int(os.environ.get("NAIAD_FUZZ_SEED", "20261125"))
CASES = int(os.environ.get("NAIAD_FUZZ_CONTROL_CASES", "150"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = Path(tmp_path_factory.mktemp("control_models"))
    write_model(repo, TARGET, IDENTITY_FP32.format(name=TARGET), IDENTITY_PY)
    # The fuzzer uploads model files: the operator consents (test_consent.py covers the refusal without).
    running = RunningServer([repo], "--model-control-mode=explicit", f"--load-model={TARGET}",
                            "--allow-model-code-upload")
    yield running
    running.stop()


def test_control_fuzz_answers_every_case_cleanly(server: RunningServer) -> None:
    outcomes, health = fuzz_control.run("127.0.0.1", server.http_port, fuzz_control.generate(SEED, CASES),
                                        alive=lambda: server.proc.poll() is None)
    problems = [f"{o.problem}\n    {o.case.describe()}" for o in outcomes if o.problem]
    assert not health, "\n".join(health) + "\n" + server.log()[-3000:]
    assert not problems, f"{len(problems)} of {len(outcomes)} cases (seed {SEED}):\n" + "\n".join(problems[:15])
    assert {o.status for o in outcomes} >= {200, 400, 404, 500}


@pytest.mark.parametrize("name", ["%00", "x" * 300])
def test_files_for_a_name_no_folder_can_take_fail_the_load_only(server: RunningServer, name: str) -> None:
    # The name labelled the load's temporary folder: a NUL byte or 300 characters raised out of the load (a 500
    # "failed to encode the response" from the protocol's catch-all); now it is the load that fails.
    body = json.dumps({"parameters": {"config": json.dumps(BASE_CONFIG),
                                      "file:1/model.py": base64.b64encode(b"x = 1\n").decode()}})
    status, _, reply = server.request("POST", f"/v2/repository/models/{name}/load", body)
    assert status in (400, 500) and json.loads(reply)["error"].startswith(("failed to load '", "load failed for model"))
    assert "encode" not in reply.decode()


@pytest.mark.parametrize("source", fuzz_control.EXITING_MODEL_FILES)
def test_a_model_that_exits_while_imported_fails_only_its_load(tmp_path: Path, source: str) -> None:
    write_model(tmp_path, TARGET, IDENTITY_FP32.format(name=TARGET), IDENTITY_PY)
    running = RunningServer([tmp_path], "--model-control-mode=explicit", "--allow-model-code-upload")
    try:
        body = json.dumps({"parameters": {"config": json.dumps(BASE_CONFIG),
                                          "file:1/model.py": base64.b64encode(source.encode()).decode()}})
        try:
            status, _, _ = running.request("POST", f"/v2/repository/models/{TARGET}/load", body)
        except OSError:
            status = None  # the server went away mid-request
        assert status == 400
        assert running.proc.poll() is None
        assert running.request("GET", "/v2/health/live")[0] == 200
    finally:
        running.stop()
