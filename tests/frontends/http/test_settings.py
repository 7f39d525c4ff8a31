"""Trace and logging extensions over HTTP on a live server, driven by tritonclient: the settings as Triton 2.51 shows
and checks them, a trace file with Triton's per-request activities honouring rate and count, and log settings
that change what ``--log-file`` receives."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.server import EXAMPLES, RunningServer

ACTIVITIES = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
              "COMPUTE_END", "REQUEST_END"]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("settings")


@pytest.fixture(scope="module")
def server(files: Path) -> Iterator[RunningServer]:
    running = RunningServer([EXAMPLES], "--trace-config", f"triton,file={files / 'trace.json'}",
                            "--trace-config", "rate=1", "--log-file", str(files / "server.log"))
    yield running
    running.stop()


@pytest.fixture
def client(server: RunningServer) -> Iterator[httpclient.InferenceServerClient]:
    with httpclient.InferenceServerClient(server.url) as c:
        yield c


def _add_sub(client: httpclient.InferenceServerClient | grpcclient.InferenceServerClient, module: object,
             request_id: str) -> None:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(name, [4], "FP32")  # type: ignore[attr-defined]
        tensor.set_data_from_numpy(np.arange(4, dtype=np.float32))
        inputs.append(tensor)
    client.infer("add_sub", inputs, request_id=request_id)


def _error(call: object) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()  # type: ignore[operator]
    return caught.value


def test_trace_settings_as_triton_shows_them(client: httpclient.InferenceServerClient, files: Path) -> None:
    assert client.get_trace_settings() == {
        "trace_level": ["OFF"], "trace_rate": "1", "trace_count": "-1", "log_frequency": "0",
        "trace_file": str(files / "trace.json"), "trace_mode": "triton"}
    updated = client.update_trace_settings("add_sub", {"trace_rate": "5", "trace_count": "10"})
    assert (updated["trace_rate"], updated["trace_count"]) == ("5", "10")
    assert client.get_trace_settings()["trace_rate"] == "1"
    cleared = client.update_trace_settings("add_sub", {"trace_rate": None, "trace_count": None})
    assert (cleared["trace_rate"], cleared["trace_count"]) == ("1", "-1")


@pytest.mark.parametrize("settings, status, message", [
    ({"trace_file": "/tmp/elsewhere.json"}, "501", "trace file location can not be updated through network protocol"),
    ({"trace_level": ["OFF", "TIMESTAMPS"]}, "400", "Expect only one trace level 'OFF' is specified"),
    ({"trace_rate": "fast"}, "400", "Unable to parse 'trace_rate', got: fast"),
    ({"trace_count": "-3"}, "400", "Unable to parse 'trace_count'. Expecting value >= -1, got: -3"),
    ({"trace_rate": 5}, "400", "attempt to access JSON non-string as string"),
    ({"trace_level": "TIMESTAMPS"}, "400", "attempt to access JSON non-array as array"),
])
def test_bad_trace_updates(client: httpclient.InferenceServerClient, settings: dict, status: str,
                           message: str) -> None:
    before = client.get_trace_settings()
    error = _error(lambda: client.update_trace_settings(settings=settings))
    assert (error.status(), error.message()) == (status, message)
    assert client.get_trace_settings() == before


def test_trace_routes(server: RunningServer) -> None:
    assert server.request("GET", "/v2/models/nope/trace/setting")[2] == b'{"error":"Request for unknown model : nope"}'
    assert server.request("GET", "/v2/models/add_sub/versions/1/trace/setting")[0] == 404  # as Triton
    assert server.request("PUT", "/v2/trace/setting")[0] == 405
    status, _, body = server.request("POST", "/v2/trace/setting", "not json")
    assert status == 400 and json.loads(body)["error"].startswith("failed to parse the request JSON buffer")


def test_log_settings(client: httpclient.InferenceServerClient, server: RunningServer, files: Path) -> None:
    assert client.get_log_settings() == {
        "log_file": str(files / "server.log"), "log_info": True, "log_warning": True, "log_error": True,
        "log_verbose_level": 0, "log_format": "default"}
    log = files / "server.log"
    assert "Started HTTPService" in log.read_text()  # --log-file took the log from stderr
    assert "Started HTTPService" not in server.log()
    assert "HTTP request:" not in log.read_text()
    client.update_log_settings({"log_verbose_level": 1, "log_format": "ISO8601"})
    client.get_server_metadata()
    lines = [line for line in log.read_text().splitlines() if "HTTP request:" in line]
    assert lines and lines[-1][:4].isdigit() and lines[-1][10] == "T"  # ISO 8601 from now on
    client.update_log_settings({"log_verbose_level": 0, "log_format": "default"})
    for settings, status, message in [
        ({"log_file": "/tmp/x.log"}, "501", "log file location can not be updated through network protocol"),
        ({"log_format": "xml"}, "400", "invalid argument for --log_format, got: xml"),
        ({"log_info": "yes"}, "400", "attempt to access JSON non-boolean as boolean"),
        ({"log_verbose_level": -1}, "400", "attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ]:
        error = _error(lambda: client.update_log_settings(settings))
        assert (error.status(), error.message()) == (status, message)
    assert client.get_log_settings()["log_verbose_level"] == 0


def test_trace_file_records_every_activity_at_rate_and_count(client: httpclient.InferenceServerClient,
                                                              server: RunningServer, files: Path) -> None:
    client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
    for i in range(3):
        _add_sub(client, httpclient, f"http-{i}")
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc:
        _add_sub(grpc, grpcclient, "grpc-0")
    client.update_trace_settings(settings={"trace_rate": "2", "trace_count": "2"})  # 2 of the next 8 at most
    for i in range(8):
        _add_sub(client, httpclient, f"rated-{i}")
    assert client.get_trace_settings()["trace_count"] == "0"
    client.update_trace_settings(settings={"trace_level": ["OFF"]})
    for i in range(3):
        _add_sub(client, httpclient, f"off-{i}")
    server.stop()
    entries = json.loads((files / "trace.json").read_text())
    headers = [e for e in entries if "model_name" in e]
    assert [h["request_id"] for h in headers] == ["http-0", "http-1", "http-2", "grpc-0", "rated-1", "rated-3"]
    for header in headers:
        assert (header["model_name"], header["model_version"]) == ("add_sub", 1)
        events = [e["timestamps"][0] for e in entries if e["id"] == header["id"] and "timestamps" in e]
        assert [e["name"] for e in events] == ACTIVITIES
        times = [e["ns"] for e in events]
        assert times == sorted(times)
