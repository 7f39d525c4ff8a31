"""Unmodified boto3 ``sagemaker-runtime`` against naiad's SageMaker port: invoke_endpoint on a single-model and
a multi-model endpoint (archives loaded on demand from a folder and from S3 on a loopback S3 server), errors
as botocore raises them, and invoke_endpoint_with_response_stream."""

from __future__ import annotations

import json
import shutil
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import boto3
import botocore.exceptions
import pytest

from tests.models import write_model
from tests.server import ROOT, RunningServer

MODELS = ROOT / "tests" / "golden_models"
EXAMPLES = ROOT / "examples" / "model_repository"
ADD_SUB = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                      {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 1, 1, 1]}]}

# A decoupled model that answers each request with N responses, for response streams.
REPEAT_CONFIG = """
    name: "repeat"
    backend: "python"
    model_transaction_policy { decoupled: true }
    input [{ name: "N", data_type: TYPE_INT32, dims: [ 1 ] }]
    output [{ name: "I", data_type: TYPE_INT32, dims: [ 1 ] }]
"""
REPEAT_PY = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                sender = request.get_response_sender()
                n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
                for i in range(n):
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([i], np.int32))]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
"""


def runtime(server: RunningServer):  # noqa: ANN201 - boto3 clients have no importable type
    return boto3.client("sagemaker-runtime", endpoint_url=server.sagemaker_url, region_name="us-east-1",
                        aws_access_key_id="local", aws_secret_access_key="local")


def body(answer: dict) -> dict:
    return json.loads(answer["Body"].read())


def archive(folder: Path, to: Path, arcname: str) -> Path:
    """SageMaker's layout: the archive's top level is what lands in <root>/<hash>/model."""
    to.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(to, "w:gz") as tar:
        tar.add(folder, arcname=arcname)
    return to


# --- single-model endpoint ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sme() -> Iterator[RunningServer]:
    running = RunningServer([MODELS], "--allow-sagemaker=true", "--allow-grpc=false", "--model-control-mode=explicit",
                            "--load-model=add_sub", env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "add_sub"})
    yield running
    running.stop()


def test_invoke_endpoint_single_model(sme: RunningServer) -> None:
    answer = runtime(sme).invoke_endpoint(EndpointName="local", ContentType="application/json",
                                          Body=json.dumps(ADD_SUB))
    assert answer["ContentType"] == "application/json"
    assert answer["InvokedProductionVariant"] == "AllTraffic"
    assert body(answer)["outputs"][0]["data"] == [2, 3, 4, 5]


def test_target_model_on_a_single_model_endpoint_is_a_validation_error(sme: RunningServer) -> None:
    with pytest.raises(botocore.exceptions.ClientError) as raised:
        runtime(sme).invoke_endpoint(EndpointName="local", TargetModel="x.tar.gz", Body=json.dumps(ADD_SUB))
    assert raised.value.response["Error"]["Code"] == "ValidationError"
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400


def test_model_failure_is_a_model_error(sme: RunningServer) -> None:
    client = runtime(sme)
    bad = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    with pytest.raises(client.exceptions.ModelError) as raised:
        client.invoke_endpoint(EndpointName="local", ContentType="application/json", Body=json.dumps(bad))
    error = raised.value.response
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 424
    assert error["OriginalStatusCode"] == 400
    assert "INPUT1" in error["OriginalMessage"]
    assert "Received client error (400)" in error["Error"]["Message"]
    # "See the naiad server log for more information": the log, at default verbosity, has it.
    assert "See the naiad server log" in error["Error"]["Message"]
    assert any("answered ModelError" in line and error["OriginalMessage"] in line for line in sme.log().splitlines())


# --- multi-model endpoint, archives on demand --------------------------------------------------------------------


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("model-data")
    archive(EXAMPLES / "add_sub", data / "add_sub.tar.gz", "add_sub")  # a repository of one model
    archive(EXAMPLES / "add_sub", data / "nested" / "flat.tar.gz", ".")  # config.pbtxt at the top
    source = tmp_path_factory.mktemp("repeat")
    write_model(source, "repeat", REPEAT_CONFIG, REPEAT_PY)
    archive(source / "repeat", data / "repeat.tar.gz", "repeat")
    evil = data / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        payload = data / "payload.txt"
        payload.write_text("escaped")
        tar.add(payload, arcname="../../escaped.txt")
    (data / "garbage.tar.gz").write_bytes(b"this is not a tar archive")
    return data


def mme(root: Path, data_url: str, *extra: str, env: dict[str, str] | None = None) -> RunningServer:
    empty = root.parent / "empty"
    empty.mkdir(parents=True, exist_ok=True)
    return RunningServer([empty], "--allow-sagemaker=true", "--allow-grpc=false", "--model-control-mode=explicit",
                         f"--sagemaker-models-root={root}", f"--sagemaker-model-data-url={data_url}", *extra,
                         env={"SAGEMAKER_MULTI_MODEL": "true", **(env or {})})


@pytest.fixture(scope="module")
def endpoint(archives: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = mme(tmp_path_factory.mktemp("mme") / "models", str(archives))
    yield running
    running.stop()


def test_invoke_loads_the_archive_on_demand(endpoint: RunningServer) -> None:
    client = runtime(endpoint)
    answer = client.invoke_endpoint(EndpointName="local", TargetModel="add_sub.tar.gz",
                                    ContentType="application/json", Body=json.dumps(ADD_SUB))
    assert body(answer)["outputs"][0]["data"] == [2, 3, 4, 5]
    answer = client.invoke_endpoint(EndpointName="local", TargetModel="nested/flat.tar.gz",
                                    ContentType="application/json", Body=json.dumps(ADD_SUB))
    assert body(answer)["model_name"] == "nested/flat.tar.gz"
    listed = json.loads(endpoint.sagemaker("GET", "/models")[2])["models"]
    assert len(listed) == 2


def test_concurrent_invokes_share_one_load(endpoint: RunningServer) -> None:
    endpoint.sagemaker("DELETE", "/models/" + __import__("hashlib").md5(b"add_sub.tar.gz").hexdigest())
    results: list[int] = []

    def call() -> None:
        answer = runtime(endpoint).invoke_endpoint(EndpointName="local", TargetModel="add_sub.tar.gz",
                                                   ContentType="application/json", Body=json.dumps(ADD_SUB))
        results.append(answer["ResponseMetadata"]["HTTPStatusCode"])

    threads = [threading.Thread(target=call) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [200] * 6
    assert endpoint.log().count("fetched 'add_sub.tar.gz'") == 2  # the first test's load, and this one


def test_mme_without_target_model_is_a_validation_error(endpoint: RunningServer) -> None:
    with pytest.raises(botocore.exceptions.ClientError) as raised:
        runtime(endpoint).invoke_endpoint(EndpointName="local", Body=json.dumps(ADD_SUB))
    assert raised.value.response["Error"]["Code"] == "ValidationError"


def test_unknown_archive_is_a_validation_error_that_names_it(endpoint: RunningServer) -> None:
    with pytest.raises(botocore.exceptions.ClientError) as raised:
        runtime(endpoint).invoke_endpoint(EndpointName="local", TargetModel="missing.tar.gz",
                                          Body=json.dumps(ADD_SUB))
    assert raised.value.response["Error"]["Code"] == "ValidationError"
    assert "missing.tar.gz" in raised.value.response["Error"]["Message"]


@pytest.mark.parametrize("name", ["evil.tar.gz", "garbage.tar.gz"])
def test_bad_archives_are_refused_and_nothing_escapes(endpoint: RunningServer, archives: Path, name: str) -> None:
    client = runtime(endpoint)
    with pytest.raises(botocore.exceptions.ClientError) as raised:
        client.invoke_endpoint(EndpointName="local", TargetModel=name, Body=json.dumps(ADD_SUB))
    status = raised.value.response["ResponseMetadata"]["HTTPStatusCode"]
    assert 400 <= status < 500, raised.value.response
    assert name in json.dumps(raised.value.response)
    assert not list(archives.parent.parent.rglob("escaped.txt"))
    # Everything else keeps serving.
    answer = client.invoke_endpoint(EndpointName="local", TargetModel="add_sub.tar.gz",
                                    ContentType="application/json", Body=json.dumps(ADD_SUB))
    assert answer["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_response_stream_of_a_decoupled_model(tmp_path: Path) -> None:
    # SageMaker streams only single-model endpoints (the operation takes no TargetModel).
    write_model(tmp_path, "repeat", REPEAT_CONFIG, REPEAT_PY)
    running = RunningServer([tmp_path], "--allow-sagemaker=true", "--allow-grpc=false",
                            "--model-control-mode=explicit", "--load-model=repeat",
                            env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "repeat"})
    try:
        answer = runtime(running).invoke_endpoint_with_response_stream(
            EndpointName="local", ContentType="application/json", Body=json.dumps({"N": 3}))
        parts = [event["PayloadPart"]["Bytes"] for event in answer["Body"]]
        events = [json.loads(part.decode().removeprefix("data: ")) for part in parts]
        assert [e["I"] for e in events] == [0, 1, 2]
    finally:
        running.stop()


def test_metrics_count_hits_and_loads(endpoint: RunningServer) -> None:
    import urllib.request

    page = urllib.request.urlopen(f"http://127.0.0.1:{endpoint.metrics_port}/metrics").read().decode()
    values = {line.split()[0]: float(line.split()[1]) for line in page.splitlines()
              if line.startswith("sagemaker_") and " " in line}
    assert values["sagemaker_loaded_model_count"] >= 1
    assert values["sagemaker_model_cache_hit_total"] >= 1
    assert values["sagemaker_model_loading_time_us_count"] >= 2
    assert values["sagemaker_invocations_total"] >= values["sagemaker_model_cache_hit_total"]


# --- S3 ----------------------------------------------------------------------------------------------------------


def test_archives_from_s3(s3_server, archives: Path, tmp_path: Path) -> None:  # noqa: ANN001 - tests/s3.py fixture
    s3 = s3_server.client()
    s3.create_bucket(Bucket="models")
    s3.upload_file(str(archives / "add_sub.tar.gz"), "models", "prod/add_sub.tar.gz")
    running = mme(tmp_path / "models", "s3://models/prod/", env=s3_server.env())
    try:
        client = runtime(running)
        answer = client.invoke_endpoint(EndpointName="local", TargetModel="add_sub.tar.gz",
                                        ContentType="application/json", Body=json.dumps(ADD_SUB))
        assert body(answer)["outputs"][1]["data"] == [0, 1, 2, 3]
        with pytest.raises(botocore.exceptions.ClientError) as raised:
            client.invoke_endpoint(EndpointName="local", TargetModel="other.tar.gz", Body=json.dumps(ADD_SUB))
        assert raised.value.response["Error"]["Code"] == "ValidationError"
    finally:
        running.stop()


def test_model_repository_from_s3(s3_server, tmp_path: Path) -> None:  # noqa: ANN001
    s3 = s3_server.client()
    s3.create_bucket(Bucket="repo")
    for path in (EXAMPLES / "add_sub").rglob("*"):
        if path.is_file():
            s3.upload_file(str(path), "repo", f"triton/add_sub/{path.relative_to(EXAMPLES / 'add_sub')}")
    running = RunningServer(["s3://repo/triton"], env=s3_server.env())  # type: ignore[list-item]
    try:
        status, _, reply = running.request("POST", "/v2/models/add_sub/infer", json.dumps(ADD_SUB))
        assert status == 200, reply
    finally:
        running.stop()
    shutil.rmtree(tmp_path, ignore_errors=True)
