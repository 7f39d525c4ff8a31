"""Ensembles behind SageMaker endpoints, driven by boto3's ``sagemaker-runtime`` and raw HTTP: a single-model
endpoint whose model is an ensemble, started by ``naiad sagemaker serve`` as the image starts it (Triton loads
the composing models too), with a raw binary request answered in binary+json; and a multi-model archive holding
an ensemble and its models, loaded, served and unloaded as one."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import botocore.exceptions
import numpy as np
import psutil
import pytest

from tests.server import ROOT, RunningServer, free_port

PIPELINE = ROOT / "tests" / "golden_sagemaker_models" / "sm_ensemble_repo"  # sm_ensemble = sm_offset(sm_scale(x))
BINARY_JSON = "application/vnd.sagemaker-triton.binary+json;json-header-size="
DOC = {"inputs": [{"name": "INPUT", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}


def runtime(url: str):  # noqa: ANN201 - boto3 clients have no importable type
    return boto3.client("sagemaker-runtime", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id="local", aws_secret_access_key="local")


class ServeScript:
    """``naiad sagemaker serve`` in a subprocess, as ``docker run IMAGE serve`` starts it (HTTP added through
    SAGEMAKER_TRITON_ADDITIONAL_ARGS, for the repository index)."""

    def __init__(self, model_dir: Path, scratch: Path, env: dict[str, str]) -> None:
        self.port, self.http_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = scratch / "serve.log"
        extra = f"--allow-http=true --http-port={self.http_port} --http-address=127.0.0.1 --sagemaker-port={self.port}"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "naiad", "sagemaker", "serve", "--model-dir", str(model_dir),
             "--models-root", str(scratch / "models"), "--multi-model-repo", str(scratch / "mme")],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "SAGEMAKER_TRITON_ADDITIONAL_ARGS": extra, **env})
        deadline = time.monotonic() + 60
        while not self._pinged():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                text = self.log()
                self.stop()
                raise RuntimeError(f"naiad sagemaker serve did not start:\n{text}")
            time.sleep(0.1)

    def _pinged(self) -> bool:
        import urllib.request

        try:
            return urllib.request.urlopen(f"{self.url}/ping", timeout=5).status == 200
        except OSError:
            return False

    def index(self) -> dict[str, str]:
        import urllib.request

        request = urllib.request.Request(f"http://127.0.0.1:{self.http_port}/v2/repository/index", method="POST")
        rows = json.loads(urllib.request.urlopen(request, timeout=10).read())
        return {row["name"]: row.get("state", "") for row in rows}

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@pytest.fixture(scope="module")
def sme(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeScript]:
    scratch = tmp_path_factory.mktemp("sme-ensemble")
    model_dir = scratch / "model"  # /opt/ml/model: the ensemble and its models, side by side
    shutil.copytree(PIPELINE, model_dir)
    running = ServeScript(model_dir, scratch, {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "sm_ensemble"})
    yield running
    running.stop()


def test_single_model_endpoint_of_an_ensemble_starts_with_its_models(sme: ServeScript) -> None:
    # It refused to start before: "ensemble sm_ensemble contains models that are not available or ambiguous".
    assert sme.index() == {"sm_ensemble": "READY", "sm_offset": "READY", "sm_scale": "READY"}
    answer = runtime(sme.url).invoke_endpoint(EndpointName="local", ContentType="application/json",
                                              Body=json.dumps(DOC))
    assert answer["ContentType"] == "application/json"
    reply = json.loads(answer["Body"].read())
    assert reply["model_name"] == "sm_ensemble"
    assert reply["outputs"][0]["data"] == [3, 5, 7, 9]  # x * 2 + 1


def test_raw_binary_request_is_answered_in_binary_json(sme: ServeScript) -> None:
    data = np.array([0.5, 1, 2, 4], dtype=np.float32)
    answer = runtime(sme.url).invoke_endpoint(EndpointName="local", ContentType=f"{BINARY_JSON}0",
                                              Body=data.tobytes())
    content_type = answer["ContentType"]
    assert content_type.startswith(BINARY_JSON), content_type
    body = answer["Body"].read()
    size = int(content_type[len(BINARY_JSON):])
    header = json.loads(body[:size])
    assert header["outputs"][0]["parameters"] == {"binary_data_size": 16}
    np.testing.assert_array_equal(np.frombuffer(body[size:], dtype=np.float32), data * 2 + 1)


# --- a multi-model archive holding an ensemble and its models ----------------------------------------------------


def _archive(folder: Path, to: Path) -> None:
    with tarfile.open(to, "w:gz") as tar:
        tar.add(folder, arcname=".")  # the archive's top level lands in <root>/<hash>/model


@pytest.fixture(scope="module")
def mme(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    scratch = tmp_path_factory.mktemp("mme-ensemble")
    data = scratch / "data"
    data.mkdir()
    _archive(PIPELINE, data / "pipeline.tar.gz")
    _archive(PIPELINE, data / "pipeline_v2.tar.gz")  # the same composing model names
    (scratch / "empty").mkdir()
    running = RunningServer([scratch / "empty"], "--allow-sagemaker=true", "--allow-grpc=false",
                            "--model-control-mode=explicit", f"--sagemaker-models-root={scratch / 'models'}",
                            f"--sagemaker-model-data-url={data}", env={"SAGEMAKER_MULTI_MODEL": "true"})
    yield running
    running.stop()


def _index(server: RunningServer) -> dict[str, str]:
    rows = json.loads(server.request("POST", "/v2/repository/index")[2])
    return {row["name"]: row.get("state", "") for row in rows}


def _workers(server: RunningServer) -> set[int]:
    return {p.pid for p in psutil.Process(server.proc.pid).children(recursive=True)}


def test_archive_of_an_ensemble_loads_serves_and_unloads_as_one(mme: RunningServer) -> None:
    client = runtime(mme.sagemaker_url)
    answer = client.invoke_endpoint(EndpointName="local", TargetModel="pipeline.tar.gz",
                                    ContentType="application/json", Body=json.dumps(DOC))
    reply = json.loads(answer["Body"].read())
    # Triton names the model by its target-model name: the archive's, not the ensemble folder's.
    assert reply["model_name"] == "pipeline.tar.gz"
    assert reply["outputs"][0]["data"] == [3, 5, 7, 9]
    assert _index(mme) == {"pipeline.tar.gz": "READY", "sm_offset": "READY", "sm_scale": "READY"}
    assert len([m for m in json.loads(mme.sagemaker("GET", "/models")[2])["models"] if m]) == 1

    # Another archive whose composing models have the same names is refused, not wired to these ones.
    with pytest.raises(client.exceptions.ModelError) as raised:
        client.invoke_endpoint(EndpointName="local", TargetModel="pipeline_v2.tar.gz",
                               ContentType="application/json", Body=json.dumps(DOC))
    assert "conflicting mapping for 'sm_offset'" in raised.value.response["OriginalMessage"]
    assert _index(mme)["pipeline.tar.gz"] == "READY"

    before = _workers(mme)
    key = hashlib.md5(b"pipeline.tar.gz").hexdigest()
    assert mme.sagemaker("DELETE", f"/models/{key}")[0] == 200
    # The composing models went with it; their worker processes are gone when DELETE returns.
    assert not any(state == "READY" for state in _index(mme).values())
    assert len(before - _workers(mme)) == 2
    answer = client.invoke_endpoint(EndpointName="local", TargetModel="pipeline_v2.tar.gz",
                                    ContentType="application/json", Body=json.dumps(DOC))
    assert json.loads(answer["Body"].read())["outputs"][0]["data"] == [3, 5, 7, 9]


def test_target_model_header_naming_a_composing_model_is_refused(mme: RunningServer) -> None:
    runtime(mme.sagemaker_url).invoke_endpoint(EndpointName="local", TargetModel="pipeline_v2.tar.gz",
                                               ContentType="application/json", Body=json.dumps(DOC))
    key = hashlib.md5(b"pipeline_v2.tar.gz").hexdigest()
    headers = {"X-Amzn-SageMaker-Target-Model": "sm_scale"}
    status, _, body = mme.sagemaker("POST", f"/models/{key}/invoke", json.dumps(DOC), headers)
    # Triton 2.51 ran sm_scale alone here; later Triton (PR #8923) refuses, and so does naiad.
    assert (status, json.loads(body)) == (400, {"error": "X-Amzn-SageMaker-Target-Model header does not match the "
                                                         "model requested in the URL"})
    assert "SageMaker INVOKE rejected: X-Amzn-SageMaker-Target-Model 'sm_scale'" in mme.log()
    status, _, body = mme.sagemaker("DELETE", f"/models/{key}", headers=headers)
    assert status == 400
    assert _index(mme)["pipeline_v2.tar.gz"] == "READY"  # the refused unload left it serving
    status, _, body = mme.sagemaker("POST", f"/models/{key}/invoke", json.dumps(DOC),
                                    {"X-Amzn-SageMaker-Target-Model": "pipeline_v2.tar.gz"})
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [3, 5, 7, 9]
    with pytest.raises(botocore.exceptions.ClientError):  # and the runtime door still says what is missing
        runtime(mme.sagemaker_url).invoke_endpoint(EndpointName="local", TargetModel="missing.tar.gz",
                                                   Body=json.dumps(DOC))
