"""Seeded fuzzing of the SageMaker port (see fuzz_sagemaker): the single-model ``/invocations`` and the multi-model
``/models`` API answer every malformed request cleanly and keep serving."""

from __future__ import annotations

import http.client
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability import fuzz_sagemaker
from tests.reliability.repo import write_fuzz_models
from tests.server import RunningServer

SEED = int(os.environ.get("NAIAD_FUZZ_SEED", "20261125"))
CASES = int(os.environ.get("NAIAD_FUZZ_SAGEMAKER_CASES", "300"))


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = Path(tmp_path_factory.mktemp("sagemaker_models"))
    write_fuzz_models(repo)
    running = RunningServer([repo], "--allow-sagemaker=true", "--allow-grpc=false",
                            env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": fuzz_sagemaker.DEFAULT_MODEL})
    yield running
    running.stop()


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    base = Path(tmp_path_factory.mktemp("sagemaker_mme"))
    root = base / "root"
    fuzz_sagemaker.write_mme_model(root)
    (base / "empty").mkdir()
    running = RunningServer([base / "empty"], "--allow-sagemaker=true", "--allow-grpc=false",
                            "--model-control-mode=explicit", f"--sagemaker-models-root={root}",
                            env={"SAGEMAKER_MULTI_MODEL": "true"})
    fuzz_sagemaker.mme_reset("127.0.0.1", running.sagemaker_port, root)
    yield running, root
    running.stop()


def _check(server: RunningServer, outcomes: list, health: list[str]) -> None:
    problems = [f"{o.problem}\n    {o.case.describe()}" for o in outcomes if o.problem]
    assert not health, "\n".join(health) + "\n" + server.log()[-3000:]
    assert not problems, f"{len(problems)} of {len(outcomes)} cases (seed {SEED}):\n" + "\n".join(problems[:15])


def test_single_model_fuzz(single: RunningServer) -> None:
    outcomes, health = fuzz_sagemaker.run("127.0.0.1", single.sagemaker_port, fuzz_sagemaker.generate(SEED, CASES),
                                          "/invocations", alive=lambda: single.proc.poll() is None)
    _check(single, outcomes, health)
    assert {o.status for o in outcomes} >= {200, 400, 405}


def test_multi_model_fuzz(multi: tuple[RunningServer, Path]) -> None:
    server, root = multi
    cases = fuzz_sagemaker.generate(SEED, CASES // 2, root)
    outcomes, health = fuzz_sagemaker.run(
        "127.0.0.1", server.sagemaker_port, cases, f"/models/{fuzz_sagemaker.MME_KEY}/invoke", batch=25,
        alive=lambda: server.proc.poll() is None,
        between=lambda: fuzz_sagemaker.mme_reset("127.0.0.1", server.sagemaker_port, root))
    _check(server, outcomes, health)
    assert {o.status for o in outcomes} >= {200, 400, 404}


@pytest.mark.parametrize("method, path, expected", [
    ("POST", f"/models/{fuzz_sagemaker.MME_KEY}/invoke", (400, 404)),
    ("POST", "/models", (400, 404)),
    # An unload goes by the key; a header naming another model is refused (later Triton's check, PR #8923).
    ("DELETE", f"/models/{fuzz_sagemaker.MME_KEY}", (400,)),
])
def test_target_model_header_that_is_not_utf8_names_no_model(multi: tuple[RunningServer, Path], method: str,
                                                            path: str, expected: tuple[int, ...]) -> None:
    # It was decoded strictly: a UnicodeDecodeError, answered 500 by the protocol's catch-all.
    server, root = multi
    fuzz_sagemaker.mme_reset("127.0.0.1", server.sagemaker_port, root)
    conn = http.client.HTTPConnection("127.0.0.1", server.sagemaker_port, timeout=30)
    doc = ({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1]}]} if "invoke" in path
           else {"model_name": "other", "url": "/nowhere"})
    body = json.dumps(doc)
    conn.putrequest(method, path)
    conn.putheader(fuzz_sagemaker.TARGET_HEADER, b"caf\xe9")
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body.encode())
    response = conn.getresponse()
    response.read()
    conn.close()
    assert response.status in expected
