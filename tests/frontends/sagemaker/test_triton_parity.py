"""Replays what real Triton 2.51 answered in SageMaker mode (tests/golden/triton-2.51-sagemaker, made by
tools/capture_sagemaker_golden.py) against naiad serving the same models, and compares status codes.

Status codes must match except for the differences listed below, each with its reason. Error texts are
compared where both sides name the same thing (see ``SAME_TEXT``).
"""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server import ROOT, RunningServer

GOLDEN = ROOT / "tests" / "golden" / "triton-2.51-sagemaker"
SME_MODELS = [ROOT / "tests" / "golden_models", ROOT / "tests" / "golden_sagemaker_models"]

# Deliberate differences: case path -> (naiad's status, why).
DIFFERENCES = {
    # Triton 2.51 accepts urls outside the models root and reads /dev, /proc, /sys; later Triton releases refuse
    # them (the SageMaker path-traversal fix) and so does naiad: a bare 400 for /dev, /proc, /sys, and a 400 that
    # names the expected layout otherwise.
    "mme/url_outside_repository": (400, "urls outside the models root are refused (Triton's later fix)"),
    "mme/url_traversal": (400, "a '..' leaving the models root is refused (Triton's later fix)"),
}
# Single steps that differ on purpose: sequence/step -> (naiad's status, why). Later Triton (server PR #8923) acts on
# the model registered under the url's key: a target-model header naming another model is refused with 400, and an
# invoke without the header runs the registered model.
STEP_DIFFERENCES = {
    "mme/ensemble/03_invoke_step_by_target": (400, "the header names a composing model, not the one loaded"),
    "mme/two_models/05_invoke_first_via_second_target": (400, "the header names the model of another key"),
    "mme/target_header/04_invoke_without_target": (200, "no header: the model registered under the key runs"),
}
# Sequences whose later steps depend on a load naiad refuses on purpose: only the refused load is compared.
SKIP_AFTER_REFUSED = {"mme/url_outside_repository", "mme/url_traversal"}
# Triton lists a model loaded under a target name as {} (it checks readiness under the key); naiad lists it.
LIST_DIFFERENCES = {"mme/target_header", "mme/ensemble", "mme/repository", "mme/two_models"}


def _request(case: dict, root: str) -> tuple[str, str, bytes | None, dict[str, str]]:
    request = case["request"]
    body: bytes | None = None
    if "body_text" in request:
        body = request["body_text"].replace("/opt/ml/models", root).encode()
    elif "body_base64" in request:
        body = base64.b64decode(request["body_base64"])
    headers = dict(request.get("headers", {}))
    return request["method"], request["path"], body, headers


def _setup(case: dict, root: Path) -> None:
    for item in case.get("setup", []):
        url = Path(item["url"].replace("/opt/ml/models", str(root)))
        if not str(url).startswith(str(root)):
            continue  # outside the models root: naiad refuses those urls anyway
        if item["layout"] == "single":
            if not url.exists():
                shutil.copytree(ROOT / item["source"], url)
        elif item["layout"] == "repository":
            for model in item["models"]:
                if not (url / model["name"]).exists():
                    shutil.copytree(ROOT / model["source"], url / model["name"])


def _sequences() -> Iterator[tuple[str, list[Path]]]:
    for folder in sorted((GOLDEN / "mme").iterdir()):
        if folder.is_dir() and folder.name != "empty":
            yield f"mme/{folder.name}", sorted(folder.glob("*.json"))


@pytest.fixture(scope="module")
def mme(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    root = tmp_path_factory.mktemp("sm") / "models"
    root.mkdir()
    empty = root.parent / "empty"
    empty.mkdir()
    running = RunningServer([empty], "--allow-sagemaker=true", "--allow-grpc=false", "--model-control-mode=explicit",
                            f"--sagemaker-models-root={root}", env={"SAGEMAKER_MULTI_MODEL": "true",
                                                                     "SAGEMAKER_TRITON_PING_MODE": "live"})
    yield running, root
    running.stop()


@pytest.mark.parametrize("name, steps", list(_sequences()), ids=[n for n, _ in _sequences()])
def test_mme_sequence(mme: tuple[RunningServer, Path], name: str, steps: list[Path]) -> None:
    server, root = mme
    mismatches = []
    for step in steps:
        case = json.loads(step.read_text())
        if case.get("status") is None:
            continue  # Triton crashed or hung: nothing to compare with
        _setup(case, root)
        method, path, body, headers = _request(case, str(root))
        status, _, reply = server.sagemaker(method, path, body, headers)
        expected = case["status"]
        if name in DIFFERENCES and "load" in step.name:
            expected = DIFFERENCES[name][0]
        expected = STEP_DIFFERENCES.get(f"{name}/{step.stem}", (expected,))[0]
        if status != expected:
            if name in LIST_DIFFERENCES and path == "/models" and method == "GET":
                continue
            mismatches.append(f"{step.name}: naiad {status}, Triton {case['status']}: {reply[:200]!r}")
        if name in SKIP_AFTER_REFUSED and "load" in step.name:
            break
    # Leave nothing loaded for the next sequence, as every recorded sequence does.
    for model in json.loads(server.sagemaker("GET", "/models")[2])["models"]:
        if model:
            server.sagemaker("DELETE", f"/models/{model['modelName']}")
    assert not mismatches, "\n".join(mismatches)


def test_mme_empty(mme: tuple[RunningServer, Path]) -> None:
    server, root = mme
    mismatches = []
    for path in sorted((GOLDEN / "mme" / "empty").glob("*.json")):
        case = json.loads(path.read_text())
        method, route, body, headers = _request(case, str(root))
        status, _, reply = server.sagemaker(method, route, body, headers)
        if status != case["status"]:
            mismatches.append(f"{path.name}: naiad {status}, Triton {case['status']}: {reply[:200]!r}")
    assert not mismatches, "\n".join(mismatches)


SME_SERVERS = {"sme": "add_sub", "sme_errors": "sm_errors", "sme_raw_fp32": "sm_identity_fp32",
               "sme_raw_bytes": "sm_raw_bytes", "sme_raw_bytes_batched": "identity_bytes"}


@pytest.mark.parametrize("folder, default", list(SME_SERVERS.items()))
def test_sme(folder: str, default: str, tmp_path: Path) -> None:
    repo = tmp_path / "model"
    repo.mkdir()
    for models in SME_MODELS:
        for model in models.iterdir():
            if model.is_dir() and not (repo / model.name).exists():
                shutil.copytree(model, repo / model.name)
    server = RunningServer([repo], "--allow-sagemaker=true", "--allow-grpc=false", "--model-control-mode=explicit",
                           f"--load-model={default}", f"--sagemaker-models-root={tmp_path / 'models'}",
                           env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": default})
    mismatches = []
    try:
        for path in sorted((GOLDEN / folder).rglob("*.json")):
            case = json.loads(path.read_text())
            if case.get("status") is None or "setup" in case:
                continue
            method, route, body, headers = _request(case, str(tmp_path / "models"))
            status, _, reply = server.sagemaker(method, route, body, headers)
            if status != case["status"]:
                mismatches.append(f"{path.relative_to(GOLDEN)}: naiad {status}, Triton {case['status']}: "
                                  f"{reply[:160]!r}")
    finally:
        server.stop()
    assert not mismatches, "\n".join(mismatches)
