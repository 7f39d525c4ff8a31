"""A model that misbehaves in every way the chaos model knows (see repo.write_chaos), asked over HTTP (JSON and
binary outputs, classification; directly and as an ensemble's step) and gRPC: each request gets an answer, a
success or an error that says why, and the server stays ready and keeps serving the same model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from tests.reliability.fuzz_grpc import SERVICE
from tests.reliability.repo import CHAOS_MODES, write_chaos
from tests.server import RunningServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = Path(tmp_path_factory.mktemp("chaos"))
    write_chaos(repo)
    running = RunningServer([repo])
    yield running
    running.stop()


@pytest.mark.parametrize("model, outputs", [("chaos", "json"), ("chaos", "binary"), ("chaos", "classification"),
                                           ("chaos_ensemble", "json")])
def test_http_answers_every_misbehaviour(server: RunningServer, model: str, outputs: str) -> None:
    for mode in range(CHAOS_MODES):
        doc: dict = {"inputs": [{"name": "MODE", "datatype": "INT32", "shape": [1], "data": [mode]}]}
        if outputs == "binary":
            doc["parameters"] = {"binary_data_output": True}
        elif outputs == "classification":
            doc["outputs"] = [{"name": "OUT", "parameters": {"classification": 2}}]
        status, _, body = server.request("POST", f"/v2/models/{model}/infer", json.dumps(doc))
        assert status in (200, 400, 500), (mode, status, body[:300])
        if status != 200:
            assert json.loads(body)["error"], (mode, body[:300])
        elif outputs != "binary":
            assert json.loads(body)["outputs"] is not None
    _still_serving(server)


def test_grpc_answers_every_misbehaviour(server: RunningServer) -> None:
    codes = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL}
    with grpc.insecure_channel(server.grpc_url, options=[("grpc.max_receive_message_length", -1)]) as channel:
        call = channel.unary_unary(SERVICE + "ModelInfer", request_serializer=pb.ModelInferRequest.SerializeToString,
                                   response_deserializer=pb.ModelInferResponse.FromString)
        for mode in range(CHAOS_MODES):
            message = pb.ModelInferRequest(model_name="chaos")
            message.inputs.add(name="MODE", datatype="INT32", shape=[1])
            message.raw_input_contents.append(np.array([mode], dtype=np.int32).tobytes())
            try:
                call(message, timeout=30)
            except grpc.RpcError as exc:
                assert exc.code() in codes and exc.details(), (mode, exc.code(), exc.details())
    _still_serving(server)


def _still_serving(server: RunningServer) -> None:
    assert server.request("GET", "/v2/health/ready")[0] == 200
    doc = {"inputs": [{"name": "MODE", "datatype": "INT32", "shape": [1], "data": [0]}]}
    status, _, body = server.request("POST", "/v2/models/chaos/infer", json.dumps(doc))
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [0.0, 1.0, 2.0]
