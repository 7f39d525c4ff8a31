"""KServe v2 gRPC through Ray Serve's gRPC proxy: an unmodified tritonclient.grpc client, no Ray metadata, gets
the answers ``naiad serve --grpc-port`` gives (errors and their status codes included), each model's requests
answered by the replica holding it (Ray's multiplexing, keyed by the request's model name)."""

from __future__ import annotations

import json
import queue
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

pytest.importorskip("ray.serve")  # every test here runs on Ray Serve

import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from naiad.ray.application import INGRESS, build
from naiad.ray.options import RayServeOptions
from naiad.ray.statistics import PUSH_INTERVAL_S
from tests.models import write_model
from tests.ray.conftest import APP, Cluster, wait_for
from tests.ray.test_routing import copies
from tests.ray.test_serve import ADD_SUB, request
from tests.server import RunningServer

MODELS = ["m0", "m1"]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = copies(tmp_path_factory.mktemp("grpc") / "repo", MODELS)
    write_model(root, "decoupled", """
        name: "decoupled"
        backend: "python"
        model_transaction_policy { decoupled: true }
        input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
        output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
    """, """
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            # Three responses per request (the input, plus 0, 1, 2), then only the "complete" flag.
            def execute(self, requests):
                for r in requests:
                    x = r.inputs()[0].as_numpy()
                    sender = r.get_response_sender()
                    for i in range(3):
                        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + i)]))
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return None
    """)
    write_model(root, "fail", """
        name: "fail"
        backend: "python"
        input [ { name: "MODE", data_type: TYPE_INT32, dims: [ 1 ] } ]
        output [ { name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 1 ] } ]
    """, """
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                return [pb_utils.InferenceResponse([], error=pb_utils.TritonError("error on purpose"))
                        for r in requests]
    """)
    return root


@pytest.fixture(scope="module")
def ray_grpc(cluster: Cluster, repository: Path) -> Iterator[str]:
    """The application on two replicas, each holding up to two models."""
    from ray import serve

    options = RayServeOptions(model_repositories=[str(repository)], min_replicas=2, max_replicas=2,
                              max_models_per_replica=2, replica_num_cpus=0.5)
    serve.run(build(options), name=APP, route_prefix="/")
    yield cluster.grpc_url
    serve.delete(APP)


@pytest.fixture(scope="module")
def naiad_grpc(repository: Path) -> Iterator[str]:
    server = RunningServer([repository])
    yield server.grpc_url
    server.stop()


def add_sub() -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput("INPUT0", [4], "FP32"), grpcclient.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(np.array([1, 2, 3, 4], np.float32))
    inputs[1].set_data_from_numpy(np.array([0.5, 1, 1, 1], np.float32))
    return inputs


def test_tritonclient_answers_match_naiad_serve(ray_grpc: str, naiad_grpc: str) -> None:
    answers = []
    for url in (ray_grpc, naiad_grpc):
        client = grpcclient.InferenceServerClient(url)
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("m0") and client.is_model_ready("m1", "1")
        results = {name: client.infer(name, add_sub(), request_id="r7") for name in MODELS}
        answers.append((
            {name: (r.as_numpy("OUTPUT0").tolist(), r.as_numpy("OUTPUT1").tolist(), r.get_response(as_json=True))
             for name, r in results.items()},
            client.get_model_metadata("m0", as_json=True), client.get_model_config("m1", as_json=True),
            client.get_server_metadata(as_json=True),
            sorted(row["name"] for row in client.get_model_repository_index(as_json=True)["models"]),
        ))
        client.close()
    ray_answer, serve_answer = answers
    assert ray_answer == serve_answer
    outputs = ray_answer[0]
    assert outputs["m0"][:2] == outputs["m1"][:2] == ([1.5, 3, 4, 5], [0.5, 1, 2, 3])
    assert outputs["m1"][2]["model_name"] == "m1" and outputs["m1"][2]["id"] == "r7"


def test_each_model_answered_by_the_replica_holding_it(ray_grpc: str) -> None:
    """The replica and residency of each answer (the HTTP path's x-naiad-* headers, as trailing metadata): after
    its first request, every request for a model reaches the replica that loaded it."""
    channel = grpc.insecure_channel(ray_grpc)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    replicas: dict[str, set[str]] = defaultdict(set)
    residencies = []
    request = pb.ModelInferRequest()
    for name, values in (("INPUT0", [1, 2, 3, 4]), ("INPUT1", [0.5, 1, 1, 1])):
        request.inputs.add(name=name, datatype="FP32", shape=[4])
        request.raw_input_contents.append(np.array(values, np.float32).tobytes())
    try:
        for i in range(12):
            request.model_name = MODELS[i % 2]
            reply, call = stub.ModelInfer.with_call(request, timeout=60)
            assert reply.model_name == request.model_name
            trailers = dict(call.trailing_metadata())
            replicas[request.model_name].add(trailers["x-naiad-replica"])
            residencies.append(trailers["x-naiad-residency"])
    finally:
        channel.close()
    assert all(len(held) == 1 for held in replicas.values()), replicas
    assert residencies[2:] == ["hit"] * 10  # each model loaded at most once, by its first request


@pytest.mark.parametrize("call", [
    lambda c: c.infer("missing", add_sub()),
    lambda c: c.infer("m0", add_sub()[:1]),  # a missing input
    lambda c: c.infer("m0", add_sub(), model_version="9"),
    lambda c: c.infer("decoupled", add_sub()[:1]),  # decoupled over ModelInfer
    lambda c: c.infer("", add_sub()),
    lambda c: c.get_model_metadata("missing"),
    lambda c: c.get_model_config("m1", "3"),
    lambda c: c.is_model_ready("missing"),
], ids=["unknown-model", "missing-input", "unknown-version", "decoupled", "no-model-name", "metadata-unknown",
        "config-unknown-version", "ready-unknown"])
def test_errors_match_naiad_serve(ray_grpc: str, naiad_grpc: str, call: Callable[[Any], Any]) -> None:
    answers = []
    for url in (ray_grpc, naiad_grpc):
        client = grpcclient.InferenceServerClient(url)
        try:
            answers.append(("answer", call(client)))
        except InferenceServerException as exc:
            answers.append((str(exc.status()), exc.message()))
        finally:
            client.close()
    assert answers[0] == answers[1]
    assert answers[0] == ("answer", False) or answers[0][0].startswith("StatusCode.")


def test_unknown_names_keep_nothing_in_the_ingress(cluster: Cluster, ray_grpc: str, naiad_grpc: str) -> None:
    """A client trying many model names no repository has, over HTTP, gRPC and a gRPC stream: each gets the
    answer naiad serve gives, and the ingress holds handles only for the repository's models it served."""
    from ray import serve

    names = [f"probe-{i}" for i in range(30)]
    stream_answers = []
    for url in (ray_grpc, naiad_grpc):
        channel = grpc.insecure_channel(url)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            with pytest.raises(grpc.RpcError) as caught:
                stub.ModelInfer(pb.ModelInferRequest(model_name=names[0]), timeout=60)
            assert (caught.value.code(), caught.value.details()) == (
                grpc.StatusCode.NOT_FOUND, "Request for unknown model: 'probe-0' is not found")
            requests = [pb.ModelInferRequest(model_name=name, id=name) for name in names[-3:]]
            stream_answers.append([(r.error_message, r.infer_response.id)
                                   for r in stub.ModelStreamInfer(iter(requests), timeout=60)])
        finally:
            channel.close()
    assert stream_answers[0] == stream_answers[1]
    assert stream_answers[0][0] == ("Request for unknown model: 'probe-27' is not found", "probe-27")
    client = grpcclient.InferenceServerClient(ray_grpc)
    try:
        for name in names:
            assert client.is_model_ready(name) is False
            with pytest.raises(InferenceServerException, match=f"Request for unknown model: '{name}' is not found"):
                client.infer(name, add_sub())
        assert client.is_model_ready("m1")  # (not an inference: the statistics test's counts stay as they are)
    finally:
        client.close()
    for name in names:
        status, body, _ = request(cluster.url, "POST", f"/v2/models/{name}/infer", json.dumps(ADD_SUB).encode())
        assert (status, json.loads(body)) == (404, {"error": f"Request for unknown model: '{name}' is not found"})
    cached = serve.get_deployment_handle(INGRESS, APP).cached_models.remote().result(timeout_s=30)
    assert "m1" in cached and not set(names) & set(cached)


def test_statistics_and_model_control(ray_grpc: str) -> None:
    """ModelStatistics sums every replica's figures (as GET /v2/models/stats does); a load makes the model resident
    on a replica; an unload is refused, since Ray's residency unloads."""
    client = grpcclient.InferenceServerClient(ray_grpc)
    try:
        def count(name: str) -> int:
            try:
                [row] = client.get_inference_statistics(name, as_json=True)["model_stats"]
            except InferenceServerException:
                return 0  # no replica has pushed figures for it yet
            return int(row["inference_stats"]["success"].get("count", 0))

        def settled() -> bool:
            # Earlier tests' requests reach the board with the replicas' next push: equal over more than a push
            # interval, nothing is still on its way.
            first = {name: count(name) for name in MODELS}
            time.sleep(PUSH_INTERVAL_S * 1.5)
            return first == {name: count(name) for name in MODELS}

        wait_for(settled, 20, "steady statistics")
        before = {name: count(name) for name in MODELS}
        for name, times in zip(MODELS, (3, 2)):
            for _ in range(times):
                client.infer(name, add_sub())
        wait_for(lambda: {name: count(name) for name in MODELS} == {"m0": before["m0"] + 3, "m1": before["m1"] + 2},
                 15, "every replica's statistics")
        everything = client.get_inference_statistics(as_json=True)["model_stats"]
        assert {"m0", "m1"} <= {row["name"] for row in everything}
        with pytest.raises(InferenceServerException) as caught:
            client.get_inference_statistics("nothing")
        assert (str(caught.value.status()), caught.value.message()) == (
            "StatusCode.INVALID_ARGUMENT", "requested model 'nothing' is not available")
        client.load_model("decoupled")
        with pytest.raises(InferenceServerException) as caught:
            client.unload_model("m0")
        assert str(caught.value.status()) == "StatusCode.INVALID_ARGUMENT"
        assert "explicit unloading is not available on Ray Serve" in caught.value.message()
    finally:
        client.close()


def _stream_answers(url: str, headers: dict[str, str] | None = None) -> list[tuple[str, object]]:
    """One stream: m0 and the decoupled model, then (once their four answers came) m1, m0 missing an input and a
    model that fails; each answer as (request id, outputs) or ("error", (status, message)), in arrival order."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)), headers=headers)
    single = grpcclient.InferInput("INPUT0", [2], "FP32")
    single.set_data_from_numpy(np.array([10, 20], np.float32))
    mode = grpcclient.InferInput("MODE", [1], "INT32")
    mode.set_data_from_numpy(np.array([1], np.int32))
    seen: list[tuple[str, object]] = []

    def take(count: int) -> None:
        for _ in range(count):
            result, error = answers.get(timeout=60)
            if error is not None:
                seen.append(("error", (str(error.status()), error.message())))
            else:
                seen.append((result.get_response().id, result.as_numpy("OUTPUT0").tolist()))

    try:
        client.async_stream_infer("m0", add_sub(), request_id="a")
        client.async_stream_infer("decoupled", [single], request_id="b")
        take(4)
        client.async_stream_infer("m1", add_sub(), request_id="c")  # its answer needs the model: it comes later
        client.async_stream_infer("m0", add_sub()[:1], request_id="d")  # than this refusal, yet goes first
        client.async_stream_infer("fail", [mode], request_id="e")
        take(3)
        with pytest.raises(queue.Empty):
            answers.get(timeout=0.5)
        return seen
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.parametrize("headers", [None, {"triton_grpc_error": "true"}], ids=["in-stream-errors", "grpc-errors"])
def test_stream_matches_naiad_serve(ray_grpc: str, naiad_grpc: str, headers: dict[str, str] | None) -> None:
    """ModelStreamInfer, requests for several models on one stream: each goes to its model's replica; the
    non-decoupled answers keep the request order, the decoupled model's come as they come; a refused request is
    an answer in the stream, and so is a failed inference, or with ``triton_grpc_error`` it is the stream's end,
    with the error's status."""
    ours, theirs = _stream_answers(ray_grpc, headers), _stream_answers(naiad_grpc, headers)

    def ordered(answers: list) -> list:
        return [a for a in answers if a[0] != "b"]

    assert ordered(ours) == ordered(theirs)
    assert sorted(a[1] for a in ours if a[0] == "b") == sorted(a[1] for a in theirs if a[0] == "b") == [
        [10, 20], [11, 21], [12, 22]]
    assert [a[0] for a in ordered(ours)] == ["a", "c", "error", "error"]
    assert "INPUT1" in ours[-2][1][1] and "error on purpose" in ours[-1][1][1]
    # An error in the stream carries no status; with the header, the failed inference is the stream's status.
    assert [status for _, (status, _) in ours[-2:]] == ["None", "StatusCode.INTERNAL" if headers else "None"]
