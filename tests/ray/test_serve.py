"""``naiad ray serve`` joined to the test's Ray instance, serving the example repository: the same answers as
``naiad serve`` to tritonclient.http, to raw KServe v2 requests (errors included) and to boto3's
sagemaker-runtime."""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
from collections.abc import Iterator

import boto3
import numpy as np
import pytest
import tritonclient.http as httpclient

pytest.importorskip("ray.serve")  # every test here runs on Ray Serve

from tests.ray.conftest import Cluster, wait_for
from tests.server import EXAMPLES, ROOT, RunningServer

ADD_SUB = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                      {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 1, 1, 1]}]}


def request(url: str, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
    connection = http.client.HTTPConnection(url, timeout=60)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        answer = connection.getresponse()
        return answer.status, answer.read(), {k.lower(): v for k, v in answer.getheaders()}
    finally:
        connection.close()


@pytest.fixture(scope="module")
def naiad_serve() -> Iterator[RunningServer]:
    server = RunningServer([EXAMPLES], "--allow-sagemaker=true", "--allow-grpc=false",
                           env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "add_sub"})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def ray_serve(cluster: Cluster) -> Iterator[Cluster]:
    """The command line, as a user runs it against a running cluster."""
    process = subprocess.Popen(
        [sys.executable, "-m", "naiad", "ray", "serve", "--address", cluster.address, "--model-repository",
         str(EXAMPLES), "--http-port", str(cluster.port), "--num-replicas", "1", "--replica-num-cpus", "0.5",
         "--default-model", "add_sub"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        for line in process.stdout:  # the line printed once the application runs
            if line.startswith("naiad on Ray Serve"):
                break
        else:
            raise AssertionError(f"naiad ray serve exited with {process.wait()}")
        wait_for(lambda: request(cluster.url, "GET", "/v2/health/ready")[0] == 200, 30, "the ingress")
        yield cluster
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    from ray import serve

    assert "naiad" not in serve.status().applications  # its application went with it


def test_tritonclient_answers_match_naiad_serve(ray_serve: Cluster, naiad_serve: RunningServer) -> None:
    answers = []
    for url in (ray_serve.url, naiad_serve.url):
        client = httpclient.InferenceServerClient(url)
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("add_sub")
        inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
        inputs[0].set_data_from_numpy(np.array([1, 2, 3, 4], np.float32), binary_data=True)
        inputs[1].set_data_from_numpy(np.array([0.5, 1, 1, 1], np.float32), binary_data=False)
        result = client.infer("add_sub", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
                                                          httpclient.InferRequestedOutput("OUTPUT1")])
        words = httpclient.InferInput("INPUT0", [1, 2], "BYTES")
        words.set_data_from_numpy(np.array([[b"naiad", b"\x00\xffray"]], dtype=np.object_))
        echoed = client.infer("identity_bytes", [words])
        answers.append((result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1"), echoed.as_numpy("OUTPUT0"),
                        client.get_model_metadata("add_sub"), client.get_model_config("identity_bytes")))
        client.close()
    ray_answer, serve_answer = answers
    for ours, theirs in zip(ray_answer, serve_answer):
        if isinstance(ours, np.ndarray):
            assert ours.dtype == theirs.dtype and ours.tolist() == theirs.tolist()
        else:
            assert ours == theirs
    assert ray_answer[0].tolist() == [1.5, 3, 4, 5]


@pytest.mark.parametrize("method, path, body", [
    ("GET", "/v2", None),
    ("POST", "/v2/models/add_sub/infer", json.dumps(ADD_SUB)),
    ("POST", "/v2/models/add_sub/versions/1/infer", json.dumps({**ADD_SUB, "id": "7", "outputs": [
        {"name": "OUTPUT1", "parameters": {"binary_data": True}}]})),
    ("POST", "/v2/models/add_sub/infer", json.dumps({"inputs": ADD_SUB["inputs"][:1]})),  # a missing input
    ("POST", "/v2/models/add_sub/infer", "{not json"),
    ("GET", "/v2/models/add_sub/infer", None),
    ("POST", "/v2/models/missing/infer", json.dumps(ADD_SUB)),
    ("GET", "/v2/models/missing", None),
    ("GET", "/v2/models/add_sub/versions/9", None),
    ("GET", "/v2/models/add_sub/config", None),
    ("GET", "/v2/models/identity_bytes/ready", None),
    ("GET", "/v2/nothing", None),
])
def test_raw_answers_match_naiad_serve(ray_serve: Cluster, naiad_serve: RunningServer, method: str, path: str,
                                       body: str | None) -> None:
    data = body.encode() if body is not None else None
    ours = request(ray_serve.url, method, path, data)
    theirs = request(naiad_serve.url, method, path, data)
    assert ours[:2] == theirs[:2]
    assert ours[2].get("content-type") == theirs[2].get("content-type")


def test_sagemaker_runtime_with_boto3(ray_serve: Cluster, naiad_serve: RunningServer) -> None:
    def runtime(url: str):  # noqa: ANN202 - boto3 clients have no importable type
        return boto3.client("sagemaker-runtime", endpoint_url=url, region_name="us-east-1",
                            aws_access_key_id="local", aws_secret_access_key="local")

    ray_url = f"http://{ray_serve.url}"
    expected = runtime(naiad_serve.sagemaker_url).invoke_endpoint(
        EndpointName="local", ContentType="application/json", Body=json.dumps(ADD_SUB))["Body"].read()
    # Without TargetModel: the default model; with it, the model it names (a multi-model endpoint).
    plain = runtime(ray_url).invoke_endpoint(EndpointName="local", ContentType="application/json",
                                             Body=json.dumps(ADD_SUB))
    targeted = runtime(ray_url).invoke_endpoint(EndpointName="local", ContentType="application/json",
                                                Body=json.dumps(ADD_SUB), TargetModel="add_sub")
    assert plain["Body"].read() == expected == targeted["Body"].read()
    assert targeted["InvokedProductionVariant"] == "AllTraffic"
    import botocore.exceptions

    with pytest.raises(botocore.exceptions.ClientError) as caught:
        runtime(ray_url).invoke_endpoint(EndpointName="local", ContentType="application/json",
                                         Body=json.dumps({"inputs": []}), TargetModel="add_sub")
    assert caught.value.response["Error"]["Code"] == "ModelError"
    # /ping and /invocations, the container's own routes.
    assert request(ray_serve.url, "GET", "/ping")[0] == 200
    status, body, _ = request(ray_serve.url, "POST", "/invocations", json.dumps(ADD_SUB).encode(),
                              {"Content-Type": "application/json"})
    assert (status, body) == (200, expected)


def test_unknown_target_model_names_ray_serves_flag(ray_serve: Cluster) -> None:
    """boto3 naming a model no repository holds: the error says where naiad ray serve looked (--model-repository,
    a flag it has), not --sagemaker-model-data-url (naiad serve's, which it doesn't)."""
    import botocore.exceptions

    runtime = boto3.client("sagemaker-runtime", endpoint_url=f"http://{ray_serve.url}", region_name="us-east-1",
                           aws_access_key_id="local", aws_secret_access_key="local")
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        runtime.invoke_endpoint(EndpointName="local", ContentType="application/json", Body=json.dumps(ADD_SUB),
                                TargetModel="no_such_model")
    message = caught.value.response["Error"]["Message"]
    assert caught.value.response["Error"]["Code"] == "ValidationError"
    assert "no_such_model" in message and f"--model-repository {EXAMPLES}" in message
    assert "--sagemaker-model-data-url" not in message
    import subprocess as run

    flags = run.run([sys.executable, "-m", "naiad", "ray", "serve", "--help"], cwd=ROOT, capture_output=True,
                    text=True, check=True).stdout
    assert "--model-repository" in flags and "--sagemaker-model-data-url" not in flags


def test_dashboard_says_what_to_use_instead(ray_serve: Cluster) -> None:
    for path in ("/dashboard", "/dashboard/"):
        status, body, headers = request(ray_serve.url, "GET", path)
        assert status == 404 and headers["content-type"].startswith("text/plain")
        text = body.decode()
        assert "not served under naiad ray serve" in text
        assert "GET /v2/models/stats" in text and "8265" in text
