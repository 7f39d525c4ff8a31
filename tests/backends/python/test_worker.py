"""Python models in worker processes, driven by tritonclient and raw HTTP against a running server:
isolation, large tensors through shared memory, BLS, decoupled models over generate / generate_stream,
overlapping async executions, cancellation, logging and crash recovery."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.backends.python import models as m
from tests.server import RunningServer

FP32_IO = [("INPUT0", "TYPE_FP32", "[ 4 ]"), ("INPUT1", "TYPE_FP32", "[ 4 ]")]
FP32_OUT = [("OUTPUT0", "TYPE_FP32", "[ 4 ]"), ("OUTPUT1", "TYPE_FP32", "[ 4 ]")]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("pyworker")
    m.write(repo, "add_sub", m.io_config("add_sub", FP32_IO, FP32_OUT), m.ADD_SUB)
    m.write(repo, "pids", m.io_config("pids", [("MODE", "TYPE_INT32", "[ 1 ]")], [("PID", "TYPE_INT64", "[ 1 ]")],
                                      "instance_group [{ kind: KIND_CPU, count: 2 }]"), m.CRASHER)
    m.write(repo, "crasher", m.io_config("crasher", [("MODE", "TYPE_INT32", "[ 1 ]")],
                                         [("PID", "TYPE_INT64", "[ 1 ]")]), m.CRASHER)
    m.write(repo, "repeat", m.io_config("repeat", [("IN", "TYPE_INT32", "[ -1 ]")],
                                        [("OUT", "TYPE_INT32", "[ 1 ]"), ("IDX", "TYPE_UINT32", "[ 1 ]")],
                                        m.DECOUPLED), m.REPEAT)
    m.write(repo, "cancel_watch", m.io_config("cancel_watch", [("IN", "TYPE_INT32", "[ 1 ]")],
                                              [("OUT", "TYPE_INT32", "[ 1 ]")], m.DECOUPLED), m.CANCEL_WATCH)
    m.write(repo, "decoupled_raises", m.io_config("decoupled_raises", [("IN", "TYPE_INT32", "[ 1 ]")],
                                                  [("OUT", "TYPE_INT32", "[ 1 ]")], m.DECOUPLED), m.DECOUPLED_RAISES)
    m.write(repo, "bls_sync", m.io_config("bls_sync", FP32_IO, FP32_OUT), m.BLS_SYNC)
    m.write(repo, "bls_async", m.io_config("bls_async", FP32_IO, FP32_OUT), m.BLS_ASYNC)
    sum_out = [("SUM", "TYPE_INT32", "[ 1 ]"), ("COUNT", "TYPE_INT32", "[ 1 ]")]
    m.write(repo, "bls_decoupled_sync", m.io_config("bls_decoupled_sync", [("IN", "TYPE_INT32", "[ -1 ]")], sum_out),
            m.BLS_DECOUPLED.format(kind="", call="request.exec(decoupled=True)"))
    m.write(repo, "bls_decoupled_async", m.io_config("bls_decoupled_async", [("IN", "TYPE_INT32", "[ -1 ]")],
                                                     sum_out),
            m.BLS_DECOUPLED.format(kind="async ", call="await request.async_exec(decoupled=True)"))
    m.write(repo, "overlap", m.io_config("overlap", [("N", "TYPE_INT32", "[ 1 ]")], [("OK", "TYPE_BOOL", "[ 1 ]")]),
            m.OVERLAP)
    m.write(repo, "overlap_caller", m.io_config("overlap_caller", [("N", "TYPE_INT32", "[ 1 ]")],
                                                [("OK", "TYPE_BOOL", "[ 1 ]")]), m.OVERLAP_CALLER)
    m.write(repo, "big_producer", m.io_config("big_producer", [("N", "TYPE_INT64", "[ 1 ]")],
                                              [("TOTAL", "TYPE_INT64", "[ 1 ]"), ("ECHO_OK", "TYPE_BOOL", "[ 1 ]")]),
            m.BIG_PRODUCER)
    m.write(repo, "big_sum", m.io_config("big_sum", [("DATA", "TYPE_UINT8", "[ -1 ]")],
                                         [("TOTAL", "TYPE_INT64", "[ 1 ]"), ("ECHO", "TYPE_UINT8", "[ -1 ]")]),
            m.BIG_SUM)
    m.write(repo, "huge_output", m.io_config("huge_output", [("IN", "TYPE_INT32", "[ 1 ]")],
                                             [("OUT", "TYPE_UINT8", "[ -1 ]")]), m.HUGE_OUTPUT)
    m.write(repo, "metered", m.io_config("metered", [("IN", "TYPE_INT32", "[ 1 ]")], [("OUT", "TYPE_INT32", "[ 1 ]")],
                                         "instance_group [{ kind: KIND_CPU, count: 2 }]"), m.METERED)
    m.write(repo, "logger", m.io_config("logger", [("IN", "TYPE_INT32", "[ 1 ]")], [("OUT", "TYPE_INT32", "[ 1 ]")]),
            m.LOGGER)
    return repo


@pytest.fixture(scope="module")
def server(repo: Path):
    srv = RunningServer([repo])
    yield srv
    srv.stop()


@pytest.fixture()
def client(server: RunningServer):
    with httpclient.InferenceServerClient(server.url) as c:
        yield c


def _int_input(name: str, values: list[int], dtype: str = "INT32") -> httpclient.InferInput:
    np_type = {"INT32": np.int32, "INT64": np.int64}[dtype]
    tensor = httpclient.InferInput(name, [len(values)], dtype)
    tensor.set_data_from_numpy(np.array(values, np_type))
    return tensor


def _add_sub_inputs() -> tuple[list[httpclient.InferInput], np.ndarray, np.ndarray]:
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 2, dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a, b


def _pid(client: httpclient.InferenceServerClient, model: str) -> int:
    return int(client.infer(model, [_int_input("MODE", [0])]).as_numpy("PID")[0])


# --- isolation and transport --------------------------------------------------------------------------------

def test_each_instance_is_its_own_process(client: httpclient.InferenceServerClient, server: RunningServer) -> None:
    pids = {_pid(client, "pids") for _ in range(4)}
    assert len(pids) == 2 and server.proc.pid not in pids
    for pid in pids:
        assert os.getppid() != pid and Path(f"/proc/{pid}").exists()


def test_add_sub_through_the_worker(client: httpclient.InferenceServerClient) -> None:
    inputs, a, b = _add_sub_inputs()
    result = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_concurrent_requests_each_get_their_own_answer(server: RunningServer) -> None:
    # 48 requests in flight on 16 connections: executions share datagrams both ways, answers must not mix.
    def one(i: int) -> None:
        with httpclient.InferenceServerClient(server.url) as c:
            for j in range(3):
                a = np.full(4, i * 10 + j, dtype=np.float32)
                b = np.arange(4, dtype=np.float32)
                inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
                inputs[0].set_data_from_numpy(a, binary_data=True)
                inputs[1].set_data_from_numpy(b, binary_data=True)
                result = c.infer("add_sub", inputs)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(16)))


def test_256_mb_tensor_crosses_both_ways(client: httpclient.InferenceServerClient) -> None:
    n = 256 * 1024 * 1024
    result = client.infer("big_producer", [_int_input("N", [n], "INT64")])
    assert int(result.as_numpy("TOTAL")[0]) == 3 * n
    assert bool(result.as_numpy("ECHO_OK")[0])


def test_output_larger_than_shared_memory_is_a_clear_error(client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="shared memory"):
        client.infer("huge_output", [_int_input("IN", [1])])
    inputs, a, b = _add_sub_inputs()  # and the server keeps serving
    np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), a + b)


# --- BLS -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("model", ["bls_sync", "bls_async"])
def test_bls(client: httpclient.InferenceServerClient, model: str) -> None:
    inputs, a, b = _add_sub_inputs()
    result = client.infer(model, inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_bls_error_comes_back_as_a_response_error(client: httpclient.InferenceServerClient) -> None:
    inputs, _, _ = _add_sub_inputs()
    with pytest.raises(InferenceServerException, match="unknown model: 'no_such_model'"):
        client.infer("bls_sync", inputs, parameters={"target": "no_such_model"})


@pytest.mark.parametrize("model", ["bls_decoupled_sync", "bls_decoupled_async"])
def test_bls_decoupled(client: httpclient.InferenceServerClient, model: str) -> None:
    result = client.infer(model, [_int_input("IN", [4, 2, 0, 1])])
    assert int(result.as_numpy("SUM")[0]) == 7
    assert int(result.as_numpy("COUNT")[0]) == 4
    empty = client.infer(model, [_int_input("IN", [])])
    assert int(empty.as_numpy("COUNT")[0]) == 0


def test_async_executions_overlap(server: RunningServer) -> None:
    """Sixteen ``async def execute`` calls, each awaiting a BLS call into another async model, all in flight
    at once in one instance each (Triton's server#7888 runs them one after another)."""
    n = 16

    def call(_: int) -> bool:
        with httpclient.InferenceServerClient(server.url) as c:
            return bool(c.infer("overlap_caller", [_int_input("N", [n])]).as_numpy("OK")[0])

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        assert all(pool.map(call, range(n)))


# --- decoupled models ----------------------------------------------------------------------------------------

def _post(server: RunningServer, path: str, body: dict) -> tuple[int, dict[str, str], bytes]:
    return server.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})


def _events(raw: bytes) -> list[dict]:
    return [json.loads(line[len(b"data: "):]) for line in raw.split(b"\n\n") if line.startswith(b"data: ")]


def test_generate_stream_yields_every_response(server: RunningServer) -> None:
    status, headers, body = _post(server, "/v2/models/repeat/generate_stream", {"IN": [4, 2, 0, 1]})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = _events(body)
    assert [e["OUT"] for e in events] == [4, 2, 0, 1]
    assert [e["IDX"] for e in events] == [0, 1, 2, 3]
    assert all(e["model_name"] == "repeat" and e["model_version"] == "1" for e in events)


def test_generate_stream_with_zero_responses(server: RunningServer) -> None:
    status, _, body = _post(server, "/v2/models/repeat/generate_stream", {"IN": []})
    assert status == 200 and _events(body) == []


def test_generate_on_a_decoupled_model_with_one_response(server: RunningServer) -> None:
    status, _, body = _post(server, "/v2/models/repeat/generate", {"IN": [9]})
    assert status == 200 and json.loads(body)["OUT"] == 9
    status, _, body = _post(server, "/v2/models/repeat/generate", {"IN": [1, 2]})
    assert status == 500 and json.loads(body)["error"] == (  # Triton's words
        "generate expects model to produce exactly 1 response, use generate stream for model that generates various "
        "number of responses")


def test_generate_on_a_plain_model(server: RunningServer) -> None:
    status, _, body = _post(server, "/v2/models/add_sub/generate", {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1]})
    assert status == 200
    doc = json.loads(body)
    assert doc["OUTPUT0"] == [2, 3, 4, 5] and doc["OUTPUT1"] == [0, 1, 2, 3]


def test_infer_on_a_decoupled_model_is_refused_like_triton(client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.infer("repeat", [_int_input("IN", [1])])
    assert "HTTP end point doesn't support models with decoupled transaction policy" in str(info.value)
    assert info.value.status() == "501" or "501" in str(info.value.status())


def test_decoupled_execute_that_raises_ends_the_stream_with_its_error(server: RunningServer) -> None:
    status, _, body = _post(server, "/v2/models/decoupled_raises/generate_stream", {"IN": [1]})
    assert status == 500  # as Triton: the first response, an error here, sets the stream's status
    events = _events(body)
    assert len(events) == 1 and "decoupled failure on purpose" in events[0]["error"]


def test_client_going_away_cancels_the_request(server: RunningServer, repo: Path) -> None:
    marker = repo / "cancel_watch" / "cancelled"
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    conn.request("POST", "/v2/models/cancel_watch/generate_stream", json.dumps({"IN": [1]}),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    assert b"data: " in response.fp.readline() + response.fp.readline()  # the first event arrived
    conn.sock.shutdown(2)
    conn.close()
    deadline = time.monotonic() + 10
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert marker.exists(), "the model never saw is_cancelled()"


# --- logs ----------------------------------------------------------------------------------------------------

def test_model_log_lines_reach_the_server_log(client: httpclient.InferenceServerClient, server: RunningServer) -> None:
    client.infer("logger", [_int_input("IN", [1])])
    deadline = time.monotonic() + 5
    while "hello from the model log" not in server.log() and time.monotonic() < deadline:
        time.sleep(0.02)
    log = server.log()
    assert "hello from the model log" in log and "a model warning" in log


# --- crashes -------------------------------------------------------------------------------------------------

def _wait_ready(client: httpclient.InferenceServerClient, model: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not client.is_model_ready(model):
        assert time.monotonic() < deadline, f"{model} did not come back"
        time.sleep(0.02)


@pytest.mark.parametrize("mode,how", [(1, "exited with code 3"), (2, "killed by SIGSEGV")])
def test_crash_fails_the_request_and_the_worker_comes_back(client: httpclient.InferenceServerClient, mode: int,
                                                          how: str) -> None:
    before = _pid(client, "crasher")
    started = time.monotonic()
    with pytest.raises(InferenceServerException, match=f"is not healthy .*{how}"):
        client.infer("crasher", [_int_input("MODE", [mode])])
    assert time.monotonic() - started < 5
    _wait_ready(client, "crasher")
    after = _pid(client, "crasher")
    assert after != before


def test_killed_worker_fails_in_flight_requests_and_others_never_notice(
        client: httpclient.InferenceServerClient, server: RunningServer) -> None:
    pid = _pid(client, "crasher")
    others = {_pid(client, "pids") for _ in range(4)}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        def busy() -> str:
            with httpclient.InferenceServerClient(server.url) as c:
                try:
                    c.infer("crasher", [_int_input("MODE", [3])])
                except InferenceServerException as exc:
                    return str(exc)
            return "answered"
        pending = pool.submit(busy)
        time.sleep(0.3)  # let it reach the model's sleep
        os.kill(pid, signal.SIGKILL)
        assert "killed by SIGKILL" in pending.result(timeout=5)
    # Readiness tells the truth while the replacement starts (a Python process takes far longer to start
    # than this query), then the model serves again from a new process.
    assert not client.is_model_ready("crasher")
    _wait_ready(client, "crasher")
    assert _pid(client, "crasher") != pid
    assert {_pid(client, "pids") for _ in range(4)} == others


# --- decoupled over gRPC ModelStreamInfer (python_backend's simple_grpc_custom_repeat pattern) -----------------

def test_grpc_stream_from_a_decoupled_model(server: RunningServer) -> None:
    import queue

    import tritonclient.grpc as grpcclient

    received: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: received.put((result, error)))
        for request_id, values in (("0", [4, 2, 0, 1]), ("1", [7])):
            tensor = grpcclient.InferInput("IN", [len(values)], "INT32")
            tensor.set_data_from_numpy(np.array(values, np.int32))
            client.async_stream_infer("repeat", [tensor], request_id=request_id,
                                      outputs=[grpcclient.InferRequestedOutput("OUT")])
        got: dict[str, list[int]] = {"0": [], "1": []}
        for _ in range(5):
            result, error = received.get(timeout=10)
            assert error is None
            got[result.get_response().id].append(int(result.as_numpy("OUT")[0]))
            assert result.as_numpy("IDX") is None  # only the requested output comes back
        client.stop_stream()
    assert got == {"0": [4, 2, 0, 1], "1": [7]}




def test_custom_metrics_on_the_metrics_page(server: RunningServer) -> None:
    """Both instances (two processes) add to one series, served on /metrics as Triton names it."""
    with httpclient.InferenceServerClient(server.url) as c:
        for _ in range(6):
            c.infer("metered", [_int_input("IN", [5])])
    conn = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=10)
    conn.request("GET", "/metrics")
    page = conn.getresponse().read().decode()
    conn.close()
    assert 'requests_process_total_ns{model="metered",version="1"} 30' in page.replace(".0\n", "\n") + "\n"
