"""Issue 19, item 1: no client runs code without the operator's consent, and no web page changes the server's state.

The attacks, as a client of an explicit-mode server without a restricted-API key would make them:
- a load that uploads model.py (``file:1/model.py``), over HTTP and gRPC;
- a config override whose ``default_model_filename`` is an absolute path or leads out with ``../``;
- a config override whose ``EXECUTION_ENV_PATH`` names a folder whose ``bin/python3`` is the attacker's script;
- a browser made to POST a load as a cross-site "simple" request (``Content-Type: text/plain``, foreign Origin);
- DNS rebinding: a state-changing request whose ``Host`` is ``evil.example``.
Each attack's code writes a marker file when it runs: refused means the marker never appears. With consent
(``--allow-model-code-upload``, or model-repository restricted with a key on that front end) uploads load and
run; a model file outside its version folder stays refused even then.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.models import IDENTITY_FP32, IDENTITY_PY, write_model
from tests.server import RunningServer

CONFIG = {"backend": "python", "max_batch_size": 0,
          "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
          "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]}
ADMIN = {"admin-key": "s3cret"}
FOREIGN = {"Origin": "http://evil.example", "Content-Type": "text/plain"}


def _evil_py(marker: Path) -> str:
    """A model that works, and writes ``marker`` as it is imported: the code ran."""
    return f"open({str(marker)!r}, 'a').write('ran\\n')\n" + textwrap.dedent(IDENTITY_PY)


def _evil_env(folder: Path, marker: Path) -> Path:
    """An "environment" a local attacker left in a world-writable folder: its python3 runs the attacker's line,
    then the real interpreter (so the model even loads)."""
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "activate").write_text("")
    python = folder / "bin" / "python3"
    python.write_text(f"#!/bin/sh\necho ran >> '{marker}'\nexec '{sys.executable}' \"$@\"\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return folder


class Attacks:
    """The attacker's files beside a repository with one model, ``ident``."""

    def __init__(self, base: Path) -> None:
        self.repo = base / "repo"
        write_model(self.repo, "ident", IDENTITY_FP32.format(name="ident"), IDENTITY_PY)
        self.markers = base / "markers"
        self.markers.mkdir()
        self.outside = base / "outside"  # where a local attacker may write (think /tmp)
        self.outside.mkdir()
        (self.outside / "evil.py").write_text(_evil_py(self.marker("absolute")))
        (self.repo.parent / "dotdot.py").write_text(_evil_py(self.marker("dotdot")))
        self.env = _evil_env(self.outside / "env", self.marker("env"))

    def marker(self, name: str) -> Path:
        return self.markers / name

    def ran(self) -> list[str]:
        return sorted(p.name for p in self.markers.iterdir())

    def upload(self, name: str) -> dict[str, bytes]:
        return {"file:1/model.py": _evil_py(self.marker(name)).encode()}

    @staticmethod
    def override(**fields: object) -> str:
        return json.dumps({**CONFIG, **fields})


def _start(tmp_path_factory: pytest.TempPathFactory, label: str, *flags: str,
           env: dict[str, str] | None = None) -> tuple[RunningServer, Attacks]:
    attacks = Attacks(tmp_path_factory.mktemp(label))
    return RunningServer([attacks.repo], "--model-control-mode=explicit", "--load-model=ident",
                         "--backend-config=python,in-process=true", *flags, env=env), attacks


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Attacks]]:
    """What every tritonserver command line without --http-restricted-api gives (and a multi-model SageMaker port)."""
    models = tmp_path_factory.mktemp("sagemaker-models")
    server, attacks = _start(tmp_path_factory, "bare", "--allow-sagemaker=true", f"--sagemaker-models-root={models}",
                             env={"SAGEMAKER_MULTI_MODEL": "true"})
    yield server, attacks
    server.stop()


def _error(call) -> InferenceServerException:  # type: ignore[no-untyped-def]
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def _infer(client: httpclient.InferenceServerClient, model: str, data: np.ndarray) -> np.ndarray:
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return client.infer(model, [tensor]).as_numpy("OUTPUT0")


def _refusal(text: str) -> None:
    assert "load request refused" in text and "--allow-model-code-upload" in text and "model-repository" in text


def test_code_from_the_network_is_refused_without_consent(bare: tuple[RunningServer, Attacks]) -> None:
    server, attacks = bare
    with httpclient.InferenceServerClient(server.url) as http, \
            grpcclient.InferenceServerClient(server.grpc_url) as grpc:
        attempts = {
            "HTTP file:1/model.py": lambda: http.load_model("up", config=json.dumps(CONFIG),
                                                           files=attacks.upload("upload")),
            "gRPC file:1/model.py": lambda: grpc.load_model("up", config=json.dumps(CONFIG),
                                                           files=attacks.upload("upload")),
            "absolute default_model_filename": lambda: http.load_model("ident", config=attacks.override(
                default_model_filename=str(attacks.outside / "evil.py"))),
            "../ default_model_filename": lambda: grpc.load_model("ident", config=attacks.override(
                default_model_filename="../../../dotdot.py")),
            "EXECUTION_ENV_PATH": lambda: http.load_model("ident", config=attacks.override(
                parameters={"EXECUTION_ENV_PATH": {"string_value": str(attacks.env)}})),
        }
        for what, attempt in attempts.items():
            error = _error(attempt)
            assert error.status() in ("400", "StatusCode.INVALID_ARGUMENT"), (what, error)
            _refusal(error.message())
        assert attacks.ran() == []
        # Still allowed: loading the repository's own models by name, and overrides that carry no code -- including
        # the config the server shows, read and loaded back with its own default_model_filename.
        http.load_model("ident")
        own = http.get_model_config("ident")
        assert own["default_model_filename"] == "model.py"
        grpc.load_model("ident", config=json.dumps({**own, "max_batch_size": 0}))
        http.load_model("ident", config=attacks.override(input=[{**CONFIG["input"][0], "dims": [2]}],
                                                         output=[{**CONFIG["output"][0], "dims": [2]}]))
        assert http.get_model_config("ident")["input"][0]["dims"] == [2]
        np.testing.assert_array_equal(_infer(http, "ident", np.ones(2, np.float32)), np.ones(2, np.float32))
        http.load_model("ident")
    assert attacks.ran() == []
    # The start-up warning says how to allow uploads.
    log = server.log()
    assert "explicit model control: HTTP and gRPC clients may load models by name, but not upload model code" in log
    assert "--allow-model-code-upload" in log


def test_a_browsers_cross_site_simple_post_is_refused(bare: tuple[RunningServer, Attacks]) -> None:
    server, attacks = bare
    body = json.dumps({"parameters": {"config": json.dumps(CONFIG),
                                      "file:1/model.py": base64.b64encode(attacks.upload("browser")[
                                          "file:1/model.py"]).decode()}})
    status, _, reply = server.request("POST", "/v2/repository/models/web/load", body, FOREIGN)
    assert status == 403, reply
    assert "cross-origin request refused: Origin 'http://evil.example'" in json.loads(reply)["error"]
    # Each state-changing route, even with nothing to load: unload, logging, trace, shared memory.
    for path, payload in (("/v2/repository/models/ident/unload", "{}"), ("/v2/logging", '{"log_verbose_level":1}'),
                          ("/v2/trace/setting", '{"trace_rate":"1"}'),
                          ("/v2/models/ident/trace/setting", '{"trace_rate":"1"}'),
                          ("/v2/systemsharedmemory/region/r/register", '{"key":"/x","offset":0,"byte_size":8}'),
                          ("/v2/systemsharedmemory/unregister", "")):
        assert server.request("POST", path, payload, FOREIGN)[0] == 403, path
    assert server.request("GET", "/v2/logging")[0] == 200
    assert json.loads(server.request("GET", "/v2/logging")[2])["log_verbose_level"] == 0
    # A page of the server's own origin (the dashboard's buttons), and JSON-typed requests (browsers preflight them,
    # and naiad never allows the preflight), are served.
    own = {"Origin": f"http://{server.url}", "Content-Type": "text/plain"}
    assert server.request("POST", "/v2/repository/models/ident/load", "", own)[0] == 200
    as_json = {"Origin": "http://evil.example", "Content-Type": "application/json; charset=utf-8"}
    assert server.request("POST", "/v2/repository/models/ident/load", "", as_json)[0] == 200
    assert attacks.ran() == []


def test_dns_rebinding_host_is_refused_on_state_changing_routes_only(bare: tuple[RunningServer, Attacks]) -> None:
    server, _ = bare
    rebound = {"Host": f"evil.example:{server.http_port}"}
    status, _, reply = server.request("POST", "/v2/repository/models/ident/load", "", rebound)
    assert status == 403
    message = json.loads(reply)["error"]
    assert message.startswith(f"Host 'evil.example:{server.http_port}' is not a name of this server")
    assert "--http-allowed-hosts" in message
    for path in ("/v2/repository/models/ident/unload", "/v2/logging", "/v2/trace/setting",
                 "/v2/systemsharedmemory/unregister"):
        assert server.request("POST", path, "{}", {**rebound, "Content-Type": "application/json"})[0] == 403, path
    # Names the machine answers to, and IP literals, are allowed.
    for host in (f"localhost:{server.http_port}", "127.0.0.1", f"[::1]:{server.http_port}", "app.localhost"):
        assert server.request("POST", "/v2/repository/models/ident/load", "", {"Host": host})[0] == 200, host
    # Inference is not checked at all, whatever the Host and Origin.
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]}]})
    status, _, reply = server.request("POST", "/v2/models/ident/infer", body, {**rebound, **FOREIGN})
    assert status == 200 and json.loads(reply)["outputs"][0]["data"] == [1, 2]
    assert server.request("GET", "/v2/models/ident/config", headers=rebound)[0] == 200  # reads stay open
    # SageMaker's multi-model load and unload: the same checks on its port.
    assert server.sagemaker("POST", "/models", '{"model_name":"k","url":"/nowhere"}', rebound)[0] == 403
    assert server.sagemaker("DELETE", "/models/k", None, {"Origin": "http://evil.example"})[0] == 403
    assert server.sagemaker("DELETE", "/models/k")[0] == 404  # not refused: there is no such model


@pytest.fixture(scope="module")
def flagged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Attacks]]:
    server, attacks = _start(tmp_path_factory, "flagged", "--allow-model-code-upload",
                             "--http-allowed-hosts=Naiad.Example")
    yield server, attacks
    server.stop()


def test_with_the_flag_uploads_load_and_files_stay_in_their_version_folder(
        flagged: tuple[RunningServer, Attacks]) -> None:
    server, attacks = flagged
    with httpclient.InferenceServerClient(server.url) as http, \
            grpcclient.InferenceServerClient(server.grpc_url) as grpc:
        http.load_model("up", config=json.dumps(CONFIG), files=attacks.upload("upload-http"))
        grpc.load_model("up2", config=json.dumps(CONFIG), files=attacks.upload("upload-grpc"))
        assert attacks.ran() == ["upload-grpc", "upload-http"]
        # An uploaded file under another name, in the version folder: default_model_filename may name it.
        http.load_model("named", config=attacks.override(default_model_filename="mine.py"),
                        files={"file:1/mine.py": _evil_py(attacks.marker("named")).encode()})
        np.testing.assert_array_equal(_infer(http, "named", np.ones(3, np.float32)), np.ones(3, np.float32))
        http.load_model("ident", config=attacks.override(
            parameters={"EXECUTION_ENV_PATH": {"string_value": str(attacks.env)}}))
        assert "env" in attacks.ran()
        # Out of the version folder: refused even with consent, for every spelling.
        for name in (str(attacks.outside / "evil.py"), "../../../dotdot.py", "sub/../../x.py"):
            error = _error(lambda: http.load_model("ident", config=attacks.override(default_model_filename=name)))
            assert error.status() == "400"
            assert f"default_model_filename '{name}' of model 'ident' must name a file inside the version folder" \
                in error.message()
        assert "absolute" not in attacks.ran() and "dotdot" not in attacks.ran()
        assert http.is_model_ready("ident")  # a refused reload leaves the version that serves
    rebound = {"Host": "naiad.example."}  # the operator's name, any case, trailing dot
    assert server.request("POST", "/v2/repository/models/ident/unload", "", rebound)[0] == 200
    assert server.request("POST", "/v2/repository/models/ident/load", "", {"Host": "evil.example"})[0] == 403
    assert "--allow-model-code-upload: any HTTP or gRPC client that reaches the port may load model code" \
        in server.log()


def test_a_key_on_model_repository_is_consent_per_front_end(tmp_path_factory: pytest.TempPathFactory) -> None:
    """HTTP restricted with a key: HTTP uploads with the key load; gRPC, unrestricted, still refuses them."""
    server, attacks = _start(tmp_path_factory, "keyed", "--http-restricted-api=model-repository:admin-key=s3cret",
                             "--http-allowed-hosts=*")
    try:
        with httpclient.InferenceServerClient(server.url) as http, \
                grpcclient.InferenceServerClient(server.grpc_url) as grpc:
            assert _error(lambda: http.load_model("up", config=json.dumps(CONFIG),
                                                  files=attacks.upload("nokey"))).status() == "403"
            http.load_model("up", config=json.dumps(CONFIG), files=attacks.upload("key"), headers=ADMIN)
            assert attacks.ran() == ["key"]
            _refusal(_error(lambda: grpc.load_model("up2", config=json.dumps(CONFIG),
                                                    files=attacks.upload("grpc"))).message())
            assert attacks.ran() == ["key"]
        # '*' turns the Host check off; the key still applies.
        assert server.request("POST", "/v2/repository/models/up/unload", "", {"Host": "any.example", **ADMIN})[0] == 200
        log = server.log()
        assert "explicit model control: gRPC clients may load models by name" in log
    finally:
        server.stop()


def test_a_model_file_absolute_or_dotdot_in_config_pbtxt_never_loads(tmp_path: Path) -> None:
    """The operator's own config.pbtxt too: default_model_filename names a file in the version folder, for every
    backend. A symbolic link the operator made is the operator's choice and is followed, as Triton does."""
    marker = tmp_path / "ran"
    (tmp_path / "evil.py").write_text(_evil_py(marker))
    repo = tmp_path / "repo"
    absolute = IDENTITY_FP32.format(name="absolute") + f'default_model_filename: "{tmp_path}/evil.py"'
    write_model(repo, "absolute", absolute, IDENTITY_PY)
    write_model(repo, "onnx_up", 'name: "onnx_up"\nbackend: "onnxruntime"\ndefault_model_filename: "../../m.onnx"',
                IDENTITY_PY)
    write_model(repo, "linked", IDENTITY_FP32.format(name="linked"), IDENTITY_PY)
    (tmp_path / "shared").mkdir()
    os.replace(repo / "linked" / "1" / "model.py", tmp_path / "shared" / "real.py")
    (repo / "linked" / "1" / "model.py").symlink_to(tmp_path / "shared" / "real.py")
    server = RunningServer([repo], wait_ready=False)  # live once every model was tried; some fail: never ready
    try:
        rows = {r["name"]: r for r in json.loads(server.request("POST", "/v2/repository/index", "{}")[2])}
        assert rows["linked"]["state"] == "READY"
        assert "must name a file inside the version folder" in rows["absolute"]["reason"]
        assert "must name a file inside the version folder" in rows["onnx_up"]["reason"]
        assert not marker.exists()
    finally:
        server.stop()
