"""A multi-model endpoint driven as the SageMaker platform drives the container: ``POST /models`` with
``{model_name, url}`` (url under the models root, in SageMaker's ``<root>/<hash>/model`` layout), list, get,
invoke with ``X-Amzn-SageMaker-Target-Model``, delete; and residency under ``--model-memory-limit``."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.models import IDENTITY_FP32, IDENTITY_PY, write_model
from tests.server import ROOT, RunningServer

EXAMPLES = ROOT / "examples" / "model_repository"
TARGET = "X-Amzn-SageMaker-Target-Model"
ADD_SUB = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                      {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 1, 1, 1]}]}
IDENTITY = {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1.5, 2.5]}]}

RAISES_PY = """
    class TritonPythonModel:
        def initialize(self, args):
            raise {error}
"""

# Holds ~{mb} MB of its own, so its worker's memory is mostly this model's.
HEAVY_PY = """
    import time
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.weights = np.ones({mb} * 1024 * 1024 // 8)
            self.delay = {delay}

        def execute(self, requests):
            time.sleep(self.delay)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                    for r in requests]
"""


def mme(root: Path, *extra: str) -> RunningServer:
    empty = root.parent / "empty"
    empty.mkdir(exist_ok=True)
    return RunningServer([empty], "--allow-sagemaker=true", "--allow-grpc=false", "--model-control-mode=explicit",
                         f"--sagemaker-models-root={root}", *extra, env={"SAGEMAKER_MULTI_MODEL": "true"})


def load(server: RunningServer, key: str, url: Path | str, target: str = "") -> tuple[int, bytes]:
    headers = {TARGET: target} if target else {}
    status, _, body = server.sagemaker("POST", "/models", json.dumps({"model_name": key, "url": str(url)}), headers)
    return status, body


def invoke(server: RunningServer, key: str, doc: dict, target: str = "") -> tuple[int, bytes]:
    headers = {TARGET: target} if target else {}
    status, _, body = server.sagemaker("POST", f"/models/{key}/invoke", json.dumps(doc), headers)
    return status, body


def listed(server: RunningServer) -> list[str]:
    return sorted(m["modelName"] for m in json.loads(server.sagemaker("GET", "/models")[2])["models"] if m)


def workers(server: RunningServer) -> set[int]:
    return {p.pid for p in psutil.Process(server.proc.pid).children(recursive=True)}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sagemaker") / "models"
    shutil.copytree(EXAMPLES / "add_sub", root / "single" / "model")  # config.pbtxt at the url
    shutil.copytree(EXAMPLES / "add_sub", root / "repo" / "model" / "add_sub")  # a repository of one
    ensemble = root / "ens" / "model"
    shutil.copytree(EXAMPLES / "add_sub", ensemble / "add_sub")
    (ensemble / "pipeline" / "1").mkdir(parents=True)
    (ensemble / "pipeline" / "config.pbtxt").write_text("""
name: "pipeline"
platform: "ensemble"
input [{ name: "A", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "B", data_type: TYPE_FP32, dims: [ 4 ] }]
output [{ name: "SUM", data_type: TYPE_FP32, dims: [ 4 ] }]
ensemble_scheduling { step [{ model_name: "add_sub", model_version: -1,
  input_map { key: "INPUT0", value: "A" } input_map { key: "INPUT1", value: "B" }
  output_map { key: "OUTPUT0", value: "SUM" } }] }
""")
    write_model(root / "oom" / "model", "oom", IDENTITY_FP32.format(name="oom"),
                RAISES_PY.format(error="MemoryError('cannot allocate the weights')"))
    write_model(root / "broken" / "model", "broken", IDENTITY_FP32.format(name="broken"),
                RAISES_PY.format(error="ValueError('bad weights file')"))
    write_model(root / "ident" / "model", "ident", IDENTITY_FP32.format(name="ident"), IDENTITY_PY)
    return root


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[RunningServer]:
    running = mme(root)
    yield running
    running.stop()


def test_single_model_folder_load_invoke_delete(server: RunningServer, root: Path) -> None:
    assert load(server, "single", root / "single" / "model") == (200, b"")
    assert "single" in listed(server)
    status, _, body = server.sagemaker("GET", "/models/single")
    # Triton reports the repository it registered: the url's parent when the url itself is the model.
    assert (status, json.loads(body)) == (200, {"modelName": "single", "modelUrl": str(root / "single")})
    status, body = invoke(server, "single", ADD_SUB)  # no target header: the key names the model
    assert status == 200, body
    assert json.loads(body)["outputs"][0]["data"] == [2, 3, 4, 5]
    status, body = load(server, "single", root / "single" / "model")
    assert status == 409 and "already" in json.loads(body)["error"]
    assert server.sagemaker("DELETE", "/models/single")[:3:2] == (200, b"")
    assert server.sagemaker("GET", "/models/single")[0] == 404
    assert invoke(server, "single", ADD_SUB) == (404, b"")


def test_repository_layout_and_target_header(server: RunningServer, root: Path) -> None:
    assert load(server, "repo", root / "repo" / "model", target="add_sub.tar.gz") == (200, b"")
    status, body = invoke(server, "repo", ADD_SUB, target="add_sub.tar.gz")
    assert status == 200, body
    assert json.loads(body)["model_name"] == "add_sub.tar.gz"
    # Without the header the model registered under the key runs (later Triton, PR #8923; 2.51 looked for a
    # model named after the key).
    status, body = invoke(server, "repo", ADD_SUB)
    assert status == 200 and json.loads(body)["model_name"] == "add_sub.tar.gz", body
    assert server.sagemaker("DELETE", "/models/repo", headers={TARGET: "add_sub.tar.gz"})[0] == 200


def test_ensemble_repository_serves_the_ensemble(server: RunningServer, root: Path) -> None:
    assert load(server, "ens", root / "ens" / "model", target="pipe") == (200, b"")
    doc = {"inputs": [{"name": "A", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                      {"name": "B", "shape": [4], "datatype": "FP32", "data": [1, 1, 1, 1]}]}
    status, body = invoke(server, "ens", doc, target="pipe")
    assert status == 200, body
    assert json.loads(body)["outputs"][0]["data"] == [2, 3, 4, 5]
    before = workers(server)
    assert server.sagemaker("DELETE", "/models/ens", headers={TARGET: "pipe"})[0] == 200
    # The composing model went with it, and its worker process is gone when DELETE returns.
    assert not workers(server) - before and len(workers(server)) < len(before)
    assert "add_sub" not in json.dumps(server.request("POST", "/v2/repository/index")[2].decode())


@pytest.mark.parametrize("url, status, has_body", [
    ("/tmp/not-under-the-root/model", 400, True),
    ("/proc/self/model", 400, False),
    ("/dev/shm/x/model", 400, False),
])
def test_bad_urls(server: RunningServer, url: str, status: int, has_body: bool) -> None:
    got, body = load(server, "bad", url)
    assert got == status
    assert bool(body) == has_body


def test_out_of_memory_load_is_507_and_other_failures_400(server: RunningServer, root: Path) -> None:
    status, body = load(server, "oom", root / "oom" / "model")
    assert status == 507 and "MemoryError" in json.loads(body)["error"]
    assert "answering 507: host memory (the model's own allocation failed) ran out" in server.log()
    status, body = load(server, "broken", root / "broken" / "model")
    assert status == 400 and "bad weights file" in json.loads(body)["error"]
    assert "oom" not in listed(server) and "broken" not in listed(server)
    # Nothing of them stays registered: the same key loads again (and fails the same way).
    assert load(server, "broken", root / "broken" / "model")[0] == 400


def test_unknown_keys_and_methods(server: RunningServer) -> None:
    assert server.sagemaker("GET", "/models/nope")[:3:2] == (404, b"")
    assert server.sagemaker("DELETE", "/models/nope")[:3:2] == (404, b"")
    assert server.sagemaker("POST", "/models/nope/invoke", "{}")[:3:2] == (404, b"")
    assert server.sagemaker("PUT", "/models")[:3:2] == (400, b"")
    assert server.sagemaker("GET", "/models/a/b")[:3:2] == (400, b"")
    status, _, body = server.sagemaker("POST", "/models", b"{oops")
    assert status == 400 and "error" in json.loads(body)


def _heavy(root: Path, name: str, mb: int, delay: float = 0.0) -> Path:
    folder = root / name / "model"
    write_model(folder.parent, "model", IDENTITY_FP32.format(name=name), HEAVY_PY.format(mb=mb, delay=delay))
    return folder


def test_out_of_memory_load_disturbs_no_resident(server: RunningServer, root: Path) -> None:
    """SageMaker's agent owns what it loaded (it unloads and retries on a 507): a load that fails out of memory
    unloads nothing, here an ensemble and its composing model (Triton doesn't either)."""
    assert load(server, "ens2", root / "ens" / "model", target="pipe") == (200, b"")
    assert load(server, "id2", root / "ident" / "model") == (200, b"")
    before = workers(server)
    status, body = load(server, "oom2", root / "oom" / "model")
    assert status == 507 and "MemoryError" in json.loads(body)["error"]
    assert "evicting" not in server.log()
    assert {"ens2", "id2"} <= set(listed(server)) and before <= workers(server)
    doc = {"inputs": [{"name": "A", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                      {"name": "B", "shape": [4], "datatype": "FP32", "data": [1, 1, 1, 1]}]}
    assert invoke(server, "ens2", doc, target="pipe")[0] == 200
    assert invoke(server, "id2", IDENTITY)[0] == 200
    assert server.sagemaker("DELETE", "/models/ens2", headers={TARGET: "pipe"})[0] == 200
    assert server.sagemaker("DELETE", "/models/id2")[0] == 200


def test_get_answers_for_the_name_a_client_used(server: RunningServer, root: Path) -> None:
    """The agent files a model under a key of its own; GET with the target model's name finds it, and its body
    says the key."""
    assert load(server, "k0123", root / "repo" / "model", target="add_sub.tar.gz") == (200, b"")
    status, _, body = server.sagemaker("GET", "/models/add_sub.tar.gz")
    assert status == 200 and json.loads(body)["modelName"] == "k0123", body
    assert server.sagemaker("DELETE", "/models/k0123", headers={TARGET: "add_sub.tar.gz"})[0] == 200
    assert server.sagemaker("GET", "/models/add_sub.tar.gz")[:3:2] == (404, b"")


def _heavy(root: Path, name: str, mb: int, delay: float = 0.0) -> Path:
    folder = root / name / "model"
    write_model(folder.parent, "model", IDENTITY_FP32.format(name=name), HEAVY_PY.format(mb=mb, delay=delay))
    return folder


def test_memory_limit_refuses_what_does_not_fit_and_unloads_nothing(tmp_path: Path) -> None:
    """Under --model-memory-limit the agent's loads still unload nothing: one that does not fit beside what it
    loaded is answered 507 (the agent unloads a model of its choice and loads again), before it loads where its
    size is known from an earlier load."""
    root = tmp_path / "models"
    urls = {name: _heavy(root, name, 150) for name in ("a", "b", "c")}
    _heavy(root, "huge", 600)
    running = mme(root, "--model-memory-limit=420M", "--sagemaker-eviction-policy=lru")
    try:
        assert load(running, "a", urls["a"]) == (200, b"")
        assert load(running, "b", urls["b"]) == (200, b"")
        status, body = load(running, "c", urls["c"])
        assert status == 507, body
        assert "held by models this load may not unload" in json.loads(body)["error"]
        assert "answering 507: the SageMaker models' memory limit (--model-memory-limit) ran out" in running.log()
        assert listed(running) == ["a", "b"] and "evicting" not in running.log()
        assert running.sagemaker("DELETE", "/models/b")[0] == 200  # what the agent does on a 507
        assert load(running, "c", urls["c"]) == (200, b"")
        assert listed(running) == ["a", "c"]
        status, body = load(running, "huge", root / "huge" / "model")
        assert status == 507 and "Out of memory" in json.loads(body)["error"]
        # Measured once: the second time it is refused before it loads (no worker starts for it).
        status, body = load(running, "huge", root / "huge" / "model")
        assert status == 507 and "Out of memory" in json.loads(body)["error"]
        assert running.log().count("unloaded SageMaker model 'huge'") == 1
        assert listed(running) == ["a", "c"] and "evicting" not in running.log()
        assert invoke(running, "a", IDENTITY)[0] == 200 and invoke(running, "c", IDENTITY)[0] == 200
    finally:
        running.stop()
