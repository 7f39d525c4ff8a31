"""Model control against a live server: explicit mode over HTTP and gRPC (tritonclient), config and file
overrides, reloads under load, ensembles, Python models that load other models, and poll mode."""

from __future__ import annotations

import json
import os
import shutil
import signal
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.models import IDENTITY_FP32, IDENTITY_PY, write_model
from tests.server import RunningServer

SLOW_PY = """
    import os
    import time
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.marker = os.path.join(args["model_repository"], "..", "finalized")

        def execute(self, requests):
            time.sleep(1.0)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                    for r in requests]

        def finalize(self):
            with open(self.marker, "a") as f:
                f.write("x")
"""

SLOW_START_PY = IDENTITY_PY.replace("class TritonPythonModel:", """class TritonPythonModel:
        def initialize(self, args):
            import time
            time.sleep(1.5)
""")

CONTROLLER_CONFIG = """
    name: "controller"
    backend: "python"
    input [{ name: "COMMAND", data_type: TYPE_STRING, dims: [ 1 ] }]
    output [{ name: "RESULT", data_type: TYPE_STRING, dims: [ 1 ] }]
"""

# Loads, unloads and checks other models from inside a model, the way python_backend's docs show.
CONTROLLER_PY = """
    import json
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                command = json.loads(pb_utils.get_input_tensor_by_name(request, "COMMAND").as_numpy()[0])
                try:
                    if command["op"] == "load":
                        pb_utils.load_model(command["name"], config=command.get("config", ""))
                    elif command["op"] == "unload":
                        pb_utils.unload_model(command["name"])
                    result = "ready" if pb_utils.is_model_ready(command["name"]) else "not ready"
                except pb_utils.TritonModelException as exc:
                    result = "error: " + str(exc)
                responses.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("RESULT", np.array([result.encode()], dtype=np.object_))]))
            return responses
"""

ENSEMBLE = """
    name: "ens"
    platform: "ensemble"
    input [{ name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }]
    output [{ name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] }]
    ensemble_scheduling { step [{
        model_name: "ident" model_version: -1
        input_map { key: "INPUT0" value: "IN" }
        output_map { key: "OUTPUT0" value: "OUT" }
    }] }
"""

BROKEN = "name: \"broken\"\nbackend: [python"

# The override a load request may carry, as Triton's JSON rendering of ModelConfig.
FIXED_CONFIG = json.dumps({
    "backend": "python", "max_batch_size": 0,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
})


def wait_for(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def infer_http(client: httpclient.InferenceServerClient, model: str, data: np.ndarray,
               inputs: tuple[str, str] = ("INPUT0", "OUTPUT0")) -> np.ndarray:
    tensor = httpclient.InferInput(inputs[0], list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return client.infer(model, [tensor]).as_numpy(inputs[1])


def index(client: httpclient.InferenceServerClient) -> dict[str, dict]:
    return {row["name"] + "/" + row.get("version", ""): row for row in client.get_model_repository_index()}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("control")
    repo = root / "models"
    write_model(repo, "ident", IDENTITY_FP32.format(name="ident"), IDENTITY_PY)
    write_model(repo, "slow", IDENTITY_FP32.format(name="slow"), SLOW_PY)
    write_model(repo, "controller", CONTROLLER_CONFIG, CONTROLLER_PY)
    write_model(repo, "slow_start", IDENTITY_FP32.format(name="slow_start"), SLOW_START_PY)
    write_model(repo, "target", IDENTITY_FP32.format(name="target"), IDENTITY_PY)
    (repo / "ens" / "1").mkdir(parents=True)
    (repo / "ens" / "config.pbtxt").write_text(ENSEMBLE)
    write_model(repo, "broken", BROKEN, IDENTITY_PY)
    return repo


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[RunningServer]:
    # Consent to model files from the network: test_files_override uploads model.py (tests/reliability/test_consent.py
    # covers the refusal).
    server = RunningServer([repo], "--model-control-mode=explicit", "--load-model=controller",
                           "--allow-model-code-upload")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http(server: RunningServer) -> Iterator[httpclient.InferenceServerClient]:
    with httpclient.InferenceServerClient(server.url, network_timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def grpc(server: RunningServer) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        yield client


def test_startup_loads_only_the_listed_models(server: RunningServer, http: httpclient.InferenceServerClient,
                                              grpc: grpcclient.InferenceServerClient) -> None:
    rows = index(http)
    assert rows["controller/1"]["state"] == "READY"
    # Never-loaded models are listed by name only, as Triton lists them.
    for name in ("ident", "slow", "ens", "broken", "target"):
        assert rows[name + "/"] == {"name": name}
    assert http.is_server_ready() and not http.is_model_ready("ident")
    assert {m.name for m in grpc.get_model_repository_index().models} >= {"ident", "controller"}


def test_unknown_or_unparsable_models_fail_to_load_as_in_triton(http: httpclient.InferenceServerClient,
                                                                grpc: grpcclient.InferenceServerClient,
                                                                server: RunningServer, repo: Path) -> None:
    with pytest.raises(InferenceServerException) as err:
        http.load_model("nosuch")
    assert err.value.status() == "500"
    # Triton's words, then where naiad looked.
    assert err.value.message() == ("failed to load 'nosuch', failed to poll from model repository (no model folder "
                                   f"'nosuch' in the model repository {repo})")
    with pytest.raises(InferenceServerException) as err:
        grpc.load_model("broken")
    assert err.value.status() == "StatusCode.INTERNAL"
    assert "failed to load 'broken', failed to poll from model repository" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        http.load_model("ident", config="{not json")
    assert err.value.message() == "failed to load 'ident', failed to poll from model repository"
    status, _, body = server.request("POST", "/v2/repository/models/ident/load", '{"parameters":{"config":5}}')
    assert (status, json.loads(body)) == (500, {"error": "attempt to access JSON non-string as string"})
    http.unload_model("nosuch")  # unloading what isn't loaded succeeds
    assert http.is_server_live()


def test_load_infer_unload_over_http_and_grpc(http: httpclient.InferenceServerClient,
                                             grpc: grpcclient.InferenceServerClient) -> None:
    http.load_model("ident")
    assert http.is_model_ready("ident") and grpc.is_model_ready("ident")
    data = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(infer_http(http, "ident", data), data)
    grpc.unload_model("ident")
    with pytest.raises(InferenceServerException, match="has no available versions"):
        infer_http(http, "ident", data)
    wait_for(lambda: index(http)["ident/1"].get("reason") == "unloaded")
    assert index(http)["ident/1"]["state"] == "UNAVAILABLE"
    assert not grpc.is_model_ready("ident")
    grpc.load_model("ident")
    np.testing.assert_array_equal(infer_http(http, "ident", data), data)


def test_requests_naming_no_version_follow_the_versions_loaded(http: httpclient.InferenceServerClient,
                                                               grpc: grpcclient.InferenceServerClient,
                                                               repo: Path) -> None:
    write_model(repo, "versioned", IDENTITY_FP32.format(name="versioned"), IDENTITY_PY, versions=(1, 2))
    data = np.arange(4, dtype=np.float32)

    def served() -> str:
        tensor = httpclient.InferInput("INPUT0", [4], "FP32")
        tensor.set_data_from_numpy(data)
        return http.infer("versioned", [tensor]).get_response()["model_version"]

    http.load_model("versioned")  # the config's policy: the latest version only
    assert served() == "2"
    grpc.load_model("versioned", config=json.dumps({**json.loads(FIXED_CONFIG),
                                                    "version_policy": {"specific": {"versions": [1]}}}))
    assert served() == "1"
    http.unload_model("versioned")
    with pytest.raises(InferenceServerException, match="has no available versions"):
        served()


def test_config_override_and_failed_reload_keeps_serving(http: httpclient.InferenceServerClient,
                                                         grpc: grpcclient.InferenceServerClient) -> None:
    http.load_model("ident")
    http.load_model("ident", config=FIXED_CONFIG)
    assert http.get_model_config("ident")["input"][0]["dims"] == [4]
    with pytest.raises(InferenceServerException, match="unexpected shape"):
        infer_http(http, "ident", np.arange(3, dtype=np.float32))
    bad = json.dumps({**json.loads(FIXED_CONFIG), "backend": "nonexist"})
    with pytest.raises(InferenceServerException) as err:
        grpc.load_model("ident", config=bad)
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert err.value.message().startswith("load failed for model 'ident': version 1 is at UNAVAILABLE state: ")
    # The previous version still serves, with its config.
    assert index(http)["ident/1"]["state"] == "READY"
    data = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(infer_http(http, "ident", data), data)
    http.load_model("ident")  # back to config.pbtxt
    assert http.get_model_config("ident")["input"][0]["dims"] == [-1]


def test_files_override(http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient) -> None:
    model_py = IDENTITY_PY.replace("r.inputs()[0].as_numpy()", "r.inputs()[0].as_numpy() * 2")
    files = {"file:1/model.py": textwrap.dedent(model_py).encode()}
    http.load_model("doubler", config=FIXED_CONFIG, files=files)
    np.testing.assert_array_equal(infer_http(http, "doubler", np.ones(4, np.float32)), np.full(4, 2, np.float32))
    grpc.load_model("doubler", config=FIXED_CONFIG.replace("[4]", "[2]"), files=files)
    np.testing.assert_array_equal(infer_http(http, "doubler", np.ones(2, np.float32)), np.full(2, 2, np.float32))
    with pytest.raises(InferenceServerException, match="failed to poll"):
        http.load_model("doubler2", files=files)  # files need the config they belong to
    http.unload_model("doubler")
    # A file name the file system refuses (longer than NAME_MAX) fails the load, as Triton answers it.
    with pytest.raises(InferenceServerException) as info:
        grpc.load_model("doubler", config="{}", files={"file:" + "A" * 256: b"a"})
    assert info.value.status() == "StatusCode.INTERNAL" and "failed to poll from model repository" in str(info.value)
    assert http.is_server_live()


def test_reload_lets_in_flight_requests_finish_on_the_old_version(http: httpclient.InferenceServerClient,
                                                                   server: RunningServer, repo: Path) -> None:
    marker = repo / "finalized"
    http.load_model("slow")
    data = np.arange(2, dtype=np.float32)
    result: dict[str, np.ndarray] = {}

    def infer() -> None:  # a client of its own: tritonclient's HTTP client belongs to one thread
        with httpclient.InferenceServerClient(server.url) as client:
            result["out"] = infer_http(client, "slow", data)

    worker = threading.Thread(target=infer)
    worker.start()
    time.sleep(0.3)  # the request is executing (it takes 1 s): reload underneath it
    http.load_model("slow")  # unchanged files: Triton keeps the loaded version, and so do we
    assert not marker.exists()
    with open(repo / "slow" / "1" / "model.py", "a") as f:
        f.write("# changed\n")
    http.load_model("slow")
    worker.join(30)
    np.testing.assert_array_equal(result["out"], data)
    wait_for(lambda: marker.exists())  # the old version was finalized once its request finished
    http.unload_model("slow")
    wait_for(lambda: marker.read_text() == "xx")


def test_a_slow_load_is_listed_as_loading_while_others_serve(http: httpclient.InferenceServerClient,
                                                           server: RunningServer) -> None:
    http.load_model("ident")
    errors: list[Exception] = []

    def load() -> None:
        with httpclient.InferenceServerClient(server.url, network_timeout=60) as client:
            try:
                client.load_model("slow_start")
            except InferenceServerException as exc:  # reported below, in the test's thread
                errors.append(exc)

    loader = threading.Thread(target=load)
    loader.start()
    wait_for(lambda: index(http).get("slow_start/1", {}).get("state") == "LOADING")
    data = np.arange(3, dtype=np.float32)
    started = time.monotonic()
    np.testing.assert_array_equal(infer_http(http, "ident", data), data)  # initialize() blocks no one else
    assert time.monotonic() - started < 1.0
    loader.join(30)
    assert not errors
    assert index(http)["slow_start/1"]["state"] == "READY"
    http.unload_model("slow_start")


def test_loading_an_ensemble_loads_its_models_and_unload_dependents(http: httpclient.InferenceServerClient) -> None:
    http.unload_model("ident")
    wait_for(lambda: index(http)["ident/1"].get("reason") == "unloaded")
    http.load_model("ens")
    assert http.is_model_ready("ens") and http.is_model_ready("ident")
    data = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(infer_http(http, "ens", data, ("IN", "OUT")), data)
    http.unload_model("ens", unload_dependents=True)
    wait_for(lambda: not http.is_model_ready("ident") and not http.is_model_ready("ens"))
    # Unloading a composing model takes the ensembles using it down too (Triton 2.51 does).
    http.load_model("ens")
    http.unload_model("ident")
    assert not http.is_model_ready("ens")
    wait_for(lambda: index(http)["ens/1"].get("reason") == "unloaded")


def test_python_model_loads_and_unloads_another(http: httpclient.InferenceServerClient, repo: Path) -> None:
    def command(**doc: str) -> str:
        tensor = httpclient.InferInput("COMMAND", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([json.dumps(doc).encode()], dtype=np.object_))
        return http.infer("controller", [tensor]).as_numpy("RESULT")[0].decode()

    assert command(op="ready", name="target") == "not ready"
    assert command(op="load", name="target") == "ready"
    assert http.is_model_ready("target")
    assert command(op="load", name="target", config=FIXED_CONFIG) == "ready"
    assert http.get_model_config("target")["input"][0]["dims"] == [4]
    assert command(op="unload", name="target") == "not ready"
    # python_backend's wording around the server's message.
    assert command(op="load", name="nosuch") == (
        "error: Failed to load model: Failed to process the request for model 'controller_0', message: failed to "
        f"load 'nosuch', failed to poll from model repository (no model folder 'nosuch' in the model repository "
        f"{repo})")


def test_none_mode_refuses_control(tmp_path: Path) -> None:
    write_model(tmp_path, "ident", IDENTITY_FP32.format(name="ident"), IDENTITY_PY)
    server = RunningServer([tmp_path], "--backend-config=python,in-process=true")
    try:
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            with pytest.raises(InferenceServerException) as err:
                client.load_model("ident")
            assert err.value.status() == "StatusCode.UNAVAILABLE"
            assert err.value.message() == "explicit model load / unload is not allowed if polling is enabled"
    finally:
        server.stop()


def test_poll_mode_follows_the_repository(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "first", IDENTITY_FP32.format(name="first"), IDENTITY_PY)
    server = RunningServer([repo], "--model-control-mode=poll", "--repository-poll-secs=0.2",
                           "--backend-config=python,in-process=true")
    try:
        with httpclient.InferenceServerClient(server.url) as client:
            assert client.is_model_ready("first")
            with pytest.raises(InferenceServerException, match="not allowed if polling is enabled"):
                client.load_model("first")
            # A model folder appears whole (written aside, then moved in), as deployments should do it.
            staged = write_model(tmp_path / "staging", "second", IDENTITY_FP32.format(name="second"), IDENTITY_PY)
            shutil.move(str(staged), repo / "second")
            wait_for(lambda: client.is_model_ready("second"))
            # A changed config reloads the model.
            config = repo / "first" / "config.pbtxt"
            config.write_text(config.read_text().replace("[ -1 ]", "[ 4 ]"))
            os.utime(config, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
            wait_for(lambda: client.get_model_config("first")["input"][0]["dims"] == [4])
            shutil.rmtree(repo / "second")
            wait_for(lambda: not client.is_model_ready("second"))
            assert client.is_model_ready("first")
    finally:
        server.stop()


def test_load_model_star_loads_everything_and_needs_explicit_mode(tmp_path: Path) -> None:
    for name in ("one", "two"):
        write_model(tmp_path, name, IDENTITY_FP32.format(name=name), IDENTITY_PY)
    server = RunningServer([tmp_path], "--model-control-mode=explicit", "--load-model=*",
                           "--backend-config=python,in-process=true")
    try:
        with httpclient.InferenceServerClient(server.url) as client:
            assert client.is_model_ready("one") and client.is_model_ready("two")
    finally:
        server.stop()
    with pytest.raises(RuntimeError, match="--load-model requires --model-control-mode=explicit"):
        RunningServer([tmp_path], "--load-model=one")


def test_a_worker_loaded_on_request_is_watched_before_its_first_request(repo: Path) -> None:
    import psutil

    server = RunningServer([repo], "--model-control-mode=explicit")
    try:
        parent = psutil.Process(server.proc.pid)
        with httpclient.InferenceServerClient(server.url) as client:
            before = {p.pid for p in parent.children()}
            client.load_model("target")
            (worker,) = {p.pid for p in parent.children()} - before
            os.kill(worker, signal.SIGKILL)
            # No request reaches the model: the server has to notice the death on its own, then restart it. Its
            # not-ready spell (0.2 s) isn't waited for: a front-end process's view of readiness can miss it under
            # load (with front-end processes and both cores busy). The server's own word and the new worker are.
            wait_for(lambda: f"(pid {worker}) was killed by SIGKILL; restarting it" in server.log(), timeout=30)
            wait_for(lambda: bool({p.pid for p in parent.children()} - before - {worker}), timeout=30)
            wait_for(lambda: client.is_model_ready("target"), timeout=30)
            assert worker not in {p.pid for p in parent.children()}
            assert infer_http(client, "target", np.ones(4, np.float32)).tolist() == [1, 1, 1, 1]
    finally:
        server.stop()


# A second ensemble that shares sm_scale with the golden pipeline's sm_ensemble (sm_offset(sm_scale(x))).
SCALE_ONLY = """
    name: "scale_only"
    platform: "ensemble"
    input [{ name: "INPUT", data_type: TYPE_FP32, dims: [ 4 ] }]
    output [{ name: "OUTPUT", data_type: TYPE_FP32, dims: [ 4 ] }]
    ensemble_scheduling { step [{
        model_name: "sm_scale" model_version: -1
        input_map { key: "INPUT" value: "INPUT" }
        output_map { key: "OUTPUT" value: "OUTPUT" }
    }] }
"""


def test_ensembles_bring_and_take_their_composing_models(tmp_path: Path) -> None:
    """As real Triton 2.51 does it (checked side by side): --load-model of an ensemble loads its models; an unload
    with unload_dependents takes along only the composing models that were loaded for an ensemble and that no
    loaded model uses any more; a model loaded by name stays."""
    repo = tmp_path / "models"
    shutil.copytree(Path(__file__).resolve().parents[1] / "golden_sagemaker_models" / "sm_ensemble_repo", repo)
    (repo / "scale_only" / "1").mkdir(parents=True)
    (repo / "scale_only" / "config.pbtxt").write_text(textwrap.dedent(SCALE_ONLY))
    server = RunningServer([repo], "--model-control-mode=explicit", "--load-model=sm_ensemble",
                           "--backend-config=python,in-process=true")

    def ready() -> set[str]:
        return {name for name in ("sm_ensemble", "scale_only", "sm_scale", "sm_offset") if client.is_model_ready(name)}

    try:
        with httpclient.InferenceServerClient(server.url) as client:
            # It failed to start before: "ensemble sm_ensemble contains models that are not available or ambiguous".
            assert ready() == {"sm_ensemble", "sm_scale", "sm_offset"}
            data = np.arange(4, dtype=np.float32)
            np.testing.assert_array_equal(infer_http(client, "sm_ensemble", data, ("INPUT", "OUTPUT")), data * 2 + 1)
            # A plain unload leaves the composing models loaded (Triton's default).
            client.unload_model("sm_ensemble")
            wait_for(lambda: ready() == {"sm_scale", "sm_offset"})
            client.load_model("sm_ensemble")
            client.load_model("scale_only")
            assert ready() == {"sm_ensemble", "scale_only", "sm_scale", "sm_offset"}
            # sm_offset goes with sm_ensemble; sm_scale stays, as scale_only uses it.
            client.unload_model("sm_ensemble", unload_dependents=True)
            wait_for(lambda: ready() == {"scale_only", "sm_scale"})
            np.testing.assert_array_equal(infer_http(client, "scale_only", data, ("INPUT", "OUTPUT")), data * 2)
            # These composing models were loaded at start-up for the ensemble, not by name: now they go.
            client.unload_model("scale_only", unload_dependents=True)
            wait_for(lambda: ready() == set())
            # Loaded by name first, a composing model outlives the ensemble that used it.
            client.load_model("sm_scale")
            client.load_model("scale_only")
            client.unload_model("scale_only", unload_dependents=True)
            wait_for(lambda: not client.is_model_ready("scale_only"))
            assert ready() == {"sm_scale"}
    finally:
        server.stop()
