"""Restricted gRPC protocols (``--grpc-restricted-protocol``) and metadata forwarding
(``--grpc-header-forward-pattern``) on both engines, as Triton 2.51 answers them: UNAVAILABLE with ``This protocol
is restricted, expecting header 'triton-grpc-protocol-<key>'`` unless the call carries that metadata and value."""

from __future__ import annotations

import json
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from naiad.frontends.grpc.server import CATEGORIES
from tests.frontends.echo_parameters import NAME, write_echo_parameters
from tests.server import RunningServer

ADMIN = (("triton-grpc-protocol-admin-key", "secret"),)
INFER = (("triton-grpc-protocol-infer-key", "let-me-in"),)


def _refused(key: str) -> str:
    return f"This protocol is restricted, expecting header 'triton-grpc-protocol-{key}'"


@pytest.fixture(scope="module", params=("grpcio", "lean"))
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("restricted")
    write_echo_parameters(repo)
    running = RunningServer([repo], "--grpc-engine", request.param,
                            "--grpc-restricted-protocol=health,metadata,model-config:admin-key=secret",
                            "--grpc-restricted-protocol=inference:infer-key=let-me-in",
                            "--grpc-header-forward-pattern", "^x-fw")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _request() -> pb.ModelInferRequest:
    return pb.ModelInferRequest(
        model_name=NAME, inputs=[pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="FP32", shape=[1])],
        raw_input_contents=[np.ones(1, np.float32).tobytes()])


RESTRICTED_CALLS = [
    ("ServerLive", pb.ServerLiveRequest(), "admin-key"),
    ("ServerReady", pb.ServerReadyRequest(), "admin-key"),
    ("ModelReady", pb.ModelReadyRequest(name=NAME), "admin-key"),
    ("ServerMetadata", pb.ServerMetadataRequest(), "admin-key"),
    ("ModelMetadata", pb.ModelMetadataRequest(name=NAME), "admin-key"),
    ("ModelConfig", pb.ModelConfigRequest(name=NAME), "admin-key"),
    ("ModelInfer", _request(), "infer-key"),
]


@pytest.mark.parametrize(("rpc", "message", "key"), RESTRICTED_CALLS, ids=[c[0] for c in RESTRICTED_CALLS])
def test_restricted_rpcs_need_their_metadata(stub: service_pb2_grpc.GRPCInferenceServiceStub, rpc: str,
                                             message: object, key: str) -> None:
    call = getattr(stub, rpc)
    for metadata in ((), (("triton-grpc-protocol-" + key, "wrong"),), ((key, "secret"),), INFER if key != "infer-key"
                     else ADMIN):
        with pytest.raises(grpc.RpcError) as caught:
            call(message, metadata=metadata, timeout=10)
        assert (caught.value.code(), caught.value.details()) == (grpc.StatusCode.UNAVAILABLE, _refused(key))
    call(message, metadata=ADMIN if key == "admin-key" else INFER, timeout=10)


def test_unrestricted_rpcs_answer(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    assert stub.ModelStatistics(pb.ModelStatisticsRequest(name=NAME), timeout=10).model_stats
    assert stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=10).models


def test_grpc_health_check_is_health(server: RunningServer) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert (caught.value.code(), caught.value.details()) == (grpc.StatusCode.UNAVAILABLE, _refused("admin-key"))
        assert health.Check(health_pb2.HealthCheckRequest(), metadata=ADMIN, timeout=10).status == \
            health_pb2.HealthCheckResponse.SERVING


def test_a_restricted_stream_ends_unavailable(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.ModelStreamInfer(iter([_request()]), metadata=ADMIN, timeout=10))
    assert (caught.value.code(), caught.value.details()) == (grpc.StatusCode.UNAVAILABLE, _refused("infer-key"))


def test_a_restricted_stream_is_refused_before_any_message(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    """L0_grpc python_unit_test RestrictedProtocolTest.test_stream_infer: the stream ends as it opens, while the
    client has sent nothing (tritonclient's next send then says the stream is no longer valid)."""
    import queue

    outbox: queue.Queue = queue.Queue()  # given no message before the answer came

    def requests():  # type: ignore[no-untyped-def]
        while (item := outbox.get()) is not None:
            yield item

    calls = stub.ModelStreamInfer(requests(), metadata=ADMIN, timeout=10)
    try:
        with pytest.raises(grpc.RpcError) as caught:
            next(calls)
        assert (caught.value.code(), caught.value.details()) == (grpc.StatusCode.UNAVAILABLE, _refused("infer-key"))
    finally:
        outbox.put(None)


def test_forwarded_metadata_reaches_the_model(server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        inputs = [grpcclient.InferInput("INPUT0", [1], "FP32")]
        inputs[0].set_data_from_numpy(np.ones(1, np.float32))
        result = client.infer(NAME, inputs, headers={**dict(INFER), "x-fw-tag": "a", "x-fw-p": "metadata",
                                                       "other": "no"}, parameters={"x-fw-p": 7, "kept": 1})
        # Triton: metadata replaces a request parameter of the same name.
        assert json.loads(result.as_numpy("PARAMETERS")[0]) == {"kept": 1, "x-fw-p": "metadata", "x-fw-tag": "a"}
        responses = list(client._client_stub.ModelStreamInfer(  # every request of the stream gets the metadata
            iter([_request(), _request()]), metadata=INFER + (("x-fw-stream", "s"),), timeout=10))
        seen = [json.loads(r.infer_response.raw_output_contents[0][4:]) for r in responses]
        assert seen == [{"x-fw-stream": "s"}] * 2
    finally:
        client.close()


def test_every_rpc_has_a_category() -> None:
    methods = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name
    assert set(CATEGORIES) == set(methods) | {"Check"}


def test_lean_forwards_on_its_fast_path(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Without a restriction on inference, lean answers ModelInfer from its done-callback path: it forwards too."""
    repo = tmp_path_factory.mktemp("forward")
    write_echo_parameters(repo)
    running = RunningServer([repo], "--grpc-engine", "lean", "--grpc-header-forward-pattern", "tag")
    try:
        client = grpcclient.InferenceServerClient(running.grpc_url)
        inputs = [grpcclient.InferInput("INPUT0", [1], "FP32")]
        inputs[0].set_data_from_numpy(np.ones(1, np.float32))
        result = client.infer(NAME, inputs, headers={"x-tag": "1", "other": "2"})
        assert json.loads(result.as_numpy("PARAMETERS")[0]) == {"x-tag": "1"}
        client.close()
    finally:
        running.stop()
