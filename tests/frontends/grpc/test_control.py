"""Every non-inference RPC through tritonclient.grpc (tritonclient's simple_grpc_health_metadata and
model-control patterns), plus grpc.health.v1, the front-end flags, and the answers Triton gives with no
shared-memory regions, in 'none' model-control mode."""

from __future__ import annotations

import base64
import json
import socket

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.server import EXAMPLES, RunningServer


@pytest.fixture(scope="module")
def client(grpc_server: RunningServer):
    with grpcclient.InferenceServerClient(grpc_server.grpc_url) as c:
        yield c


def _error(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def test_health_and_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("add_sub")
    assert client.is_model_ready("add_sub", "1")
    assert not client.is_model_ready("add_sub", "2")
    assert not client.is_model_ready("nope")
    error = _error(lambda: client.is_model_ready("add_sub", "x"))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"

    server = client.get_server_metadata()
    assert server.name == "triton" and "statistics" in server.extensions  # --id, Triton's default
    meta = client.get_model_metadata("identity_bytes")
    assert (meta.name, list(meta.versions), meta.platform) == ("identity_bytes", ["1"], "python")
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [("INPUT0", "BYTES", [-1, -1])]
    assert client.get_model_metadata("add_sub", as_json=True)["outputs"][1] == {
        "name": "OUTPUT1", "datatype": "FP32", "shape": ["4"]}
    error = _error(lambda: client.get_model_metadata("nope"))
    assert (error.status(), error.message()) == ("StatusCode.NOT_FOUND", "Request for unknown model: 'nope' is not found")


def test_model_config_is_the_http_config(client: grpcclient.InferenceServerClient, grpc_server: RunningServer) -> None:
    config = client.get_model_config("identity_bytes").config
    status, _, body = grpc_server.request("GET", "/v2/models/identity_bytes/config")
    assert status == 200
    http = json.loads(body)
    # The same message behind both: compare through protobuf's own JSON mapping.
    assert json_format.MessageToDict(config, preserving_proto_field_name=True) == json_format.MessageToDict(
        json_format.ParseDict(http, type(config)()), preserving_proto_field_name=True)
    assert config.max_batch_size == 8
    error = _error(lambda: client.get_model_config("add_sub", "3"))
    assert error.status() == "StatusCode.NOT_FOUND"


def test_statistics_match_http(client: grpcclient.InferenceServerClient, grpc_server: RunningServer) -> None:
    x = np.ones(4, dtype=np.float32)
    inputs = [grpcclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(x)
    for _ in range(3):
        client.infer("add_sub", inputs)
    grpc_stats = client.get_inference_statistics("add_sub", as_json=True)
    _, _, body = grpc_server.request("GET", "/v2/models/add_sub/stats")
    http_stats = json.loads(body)
    # protobuf's JSON prints uint64 as strings; the values must be the same.
    assert json_format.MessageToDict(json_format.ParseDict(http_stats, type(client.get_inference_statistics())()),
                                     preserving_proto_field_name=True) == grpc_stats
    stats = grpc_stats["model_stats"][0]
    assert int(stats["inference_stats"]["success"]["count"]) >= 3
    everything = client.get_inference_statistics()
    assert {m.name for m in everything.model_stats} >= {"add_sub", "identity_bytes", "dtypes"}
    error = _error(lambda: client.get_inference_statistics("nope"))
    assert (error.status(), error.message()) == ("StatusCode.INVALID_ARGUMENT", "requested model 'nope' is not available")
    error = _error(lambda: client.get_inference_statistics("add_sub", "9"))
    assert error.message() == "requested model version is not available for model 'add_sub'"


def test_repository(client: grpcclient.InferenceServerClient) -> None:
    index = client.get_model_repository_index()
    rows = {(m.name, m.version, m.state) for m in index.models}
    assert ("add_sub", "1", "READY") in rows and ("dtypes", "1", "READY") in rows
    for call in (lambda: client.load_model("add_sub"), lambda: client.unload_model("add_sub")):
        error = _error(call)
        assert (error.status(), error.message()) == (
            "StatusCode.UNAVAILABLE", "explicit model load / unload is not allowed if polling is enabled")


def test_shared_memory_with_no_regions(client: grpcclient.InferenceServerClient) -> None:
    assert not client.get_system_shared_memory_status().regions
    assert not client.get_cuda_shared_memory_status().regions
    error = _error(lambda: client.get_system_shared_memory_status("r0"))
    assert (error.status(), error.message()) == ("StatusCode.NOT_FOUND",
                                                 "Unable to find system shared memory region: 'r0'")
    error = _error(lambda: client.get_cuda_shared_memory_status("r0"))
    assert error.message() == "Unable to find cuda shared memory region: 'r0'"
    error = _error(lambda: client.register_system_shared_memory("r0", "/naiad-no-such-key", 64))
    assert (error.status(), error.message()) == ("StatusCode.INTERNAL",
                                                 "Unable to open shared memory region: '/naiad-no-such-key'")
    error = _error(lambda: client.register_cuda_shared_memory("r0", base64.b64encode(b"handle"), 0, 64))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    client.unregister_system_shared_memory("r0")
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()


def test_trace_settings(client: grpcclient.InferenceServerClient) -> None:
    settings = client.get_trace_settings(as_json=True)["settings"]
    assert settings["trace_level"] == {"value": ["OFF"]} and settings["trace_rate"] == {"value": ["1000"]}
    updated = client.update_trace_settings("add_sub", {"trace_rate": "5", "trace_count": "10"}, as_json=True)
    assert updated["settings"]["trace_rate"] == {"value": ["5"]}
    assert client.get_trace_settings(as_json=True)["settings"]["trace_rate"] == {"value": ["1000"]}
    # Clearing a model's setting falls back to the global one.
    cleared = client.update_trace_settings("add_sub", {"trace_rate": None}, as_json=True)
    assert cleared["settings"]["trace_rate"] == {"value": ["1000"]}
    assert cleared["settings"]["trace_count"] == {"value": ["10"]}
    for settings, status, message in [
        ({"trace_level": ["TIMESTAMPS"]}, "StatusCode.INVALID_ARGUMENT",
         "Attempting to set invalid trace setting :trace file name is not given"),
        ({"trace_file": "/tmp/t.json"}, "StatusCode.UNIMPLEMENTED",
         "trace file location can not be updated through network protocol"),
        ({"trace_rate": "fast"}, "StatusCode.INVALID_ARGUMENT", "Unable to parse 'trace_rate', got: fast"),
        ({"trace_count": "-3"}, "StatusCode.INVALID_ARGUMENT",
         "Unable to parse 'trace_count'. Expecting value >= -1, got: -3"),
        ({"trace_level": ["OFF", "TENSORS"]}, "StatusCode.INVALID_ARGUMENT",
         "Expect only one trace level 'OFF' is specified"),
    ]:
        error = _error(lambda: client.update_trace_settings(settings=settings))
        assert (error.status(), error.message()) == (status, message)
    error = _error(lambda: client.get_trace_settings("nope"))
    assert error.message() == "Request for unknown model : nope"


def test_log_settings(client: grpcclient.InferenceServerClient) -> None:
    settings = client.get_log_settings(as_json=True)["settings"]
    assert settings["log_info"] == {"bool_param": True}
    assert settings["log_format"] == {"string_param": "default"}
    updated = client.update_log_settings({"log_verbose_level": 1, "log_format": "ISO8601"}, as_json=True)
    assert updated["settings"]["log_verbose_level"] == {"uint32_param": 1}
    assert updated["settings"]["log_format"] == {"string_param": "ISO8601"}
    client.update_log_settings({"log_verbose_level": 0, "log_format": "default"})
    for settings, status, message in [
        ({"log_file": "/tmp/x.log"}, "StatusCode.UNIMPLEMENTED",
         "log file location can not be updated through network protocol"),
        ({"log_format": "xml"}, "StatusCode.INVALID_ARGUMENT", "invalid argument for log_format, got: xml"),
        ({"log_info": None}, "StatusCode.INVALID_ARGUMENT", "expect boolean for 'log_info'"),
    ]:
        error = _error(lambda: client.update_log_settings(settings))
        assert (error.status(), error.message()) == (status, message)


def test_grpc_health_service(grpc_server: RunningServer) -> None:
    with grpc.insecure_channel(grpc_server.grpc_url) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService"):
            assert health.Check(health_pb2.HealthCheckRequest(service=service)).status == \
                health_pb2.HealthCheckResponse.SERVING


def test_front_ends_can_be_turned_off() -> None:
    server = RunningServer([EXAMPLES], "--allow-grpc=false", "--allow-metrics", "false")
    try:
        for port in (server.grpc_port, server.metrics_port):
            with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
                pass
        assert server.request("GET", "/v2/health/ready")[0] == 200
    finally:
        server.stop()
