"""naiad bench's Python API against a live naiad: what it says it sent is what the server counted, its numbers
are consistent, and each way of sending (HTTP, gRPC, gRPC streaming, system shared memory, request rate) works."""

from __future__ import annotations

import pytest

from naiad.bench.api import LoadResult, Options, Target, ceiling, measure
from naiad.bench.control import Control
from tests.server import RunningServer

# Short windows, any spread accepted as stable; spare windows in case a busy machine stalls one.
FAST = {"measurement_interval_ms": 150, "stability_percentage": 1000, "max_trials": 6, "processes": 1}


def _url(server: RunningServer, protocol: str) -> str:
    return server.grpc_url if protocol == "grpc" else server.url


def _success(server: RunningServer, protocol: str, model: str) -> int:
    control = Control(_url(server, protocol), protocol)
    try:
        return control.stats(model)[model]["success_count"]
    finally:
        control.close()


def _check_consistent(result: LoadResult) -> None:
    lat = result.latency_us
    assert result.requests > 0 and result.errors == 0 and result.error is None
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p95"] <= lat["p99"] <= lat["max"]
    assert lat["avg"] <= lat["max"]
    assert result.throughput == pytest.approx(result.requests / result.duration_s)
    # The server counted the measured windows' requests too, to within those in flight at the window edges and
    # those completed while /stats was being read there (perf_analyzer's figures share that imprecision).
    assert abs(result.server_requests - result.requests) <= max(2 * (result.concurrency or 4), 0.05 * result.requests)
    assert set(result.server) >= {"queue", "compute_input", "compute_infer", "compute_output", "overhead"}


@pytest.mark.parametrize("protocol,client", [("http", ""), ("grpc", "lean"), ("grpc", "grpcio")])
def test_sent_equals_server_success_count(bench_server: RunningServer, protocol: str, client: str) -> None:
    before = _success(bench_server, protocol, "add_sub")
    result = measure(Target(_url(bench_server, protocol), "add_sub", protocol=protocol), concurrency=3,
                     options=Options(grpc_client=client or "lean"), **FAST)
    after = _success(bench_server, protocol, "add_sub")
    assert result.completed_total == after - before
    assert result.errors_total == 0
    assert result.stable
    _check_consistent(result)


def test_request_rate_is_an_open_loop_schedule(bench_server: RunningServer) -> None:
    before = _success(bench_server, "http", "add_sub")
    result = measure(Target(bench_server.url, "add_sub"), request_rate=100, measurement_interval_ms=300,
                     stability_percentage=1000, max_trials=3, processes=1)
    after = _success(bench_server, "http", "add_sub")
    assert result.completed_total == after - before
    assert result.request_rate == 100 and result.concurrency is None
    # A schedule of 100/s never sends more than that, however fast the server answers.
    assert result.send_rate <= 100 * 1.15
    _check_consistent(result)


def test_grpc_streaming_counts_every_response_of_a_decoupled_model(bench_server: RunningServer) -> None:
    before = _success(bench_server, "grpc", "triple")
    result = measure(Target(bench_server.grpc_url, "triple", protocol="grpc"), concurrency=2,
                     options=Options(streaming=True), **FAST)
    after = _success(bench_server, "grpc", "triple")
    assert result.completed_total == after - before
    assert result.perf is not None and result.perf.client.response_count == 3 * result.requests
    _check_consistent(result)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_system_shared_memory(bench_server: RunningServer, protocol: str) -> None:
    before = _success(bench_server, protocol, "add_sub")
    result = measure(Target(_url(bench_server, protocol), "add_sub", protocol=protocol), concurrency=2,
                     options=Options(shared_memory="system"), **FAST)
    assert result.completed_total == _success(bench_server, protocol, "add_sub") - before
    _check_consistent(result)
    # The session's region is unregistered when it ends.
    status, _, body = bench_server.request("GET", "/v2/systemsharedmemory/status")
    assert status == 200 and b"naiad_bench" not in body


def test_json_input_data_and_zero(bench_server: RunningServer, tmp_path) -> None:
    data = tmp_path / "data.json"
    data.write_text('{"data": [{"INPUT0": [1, 2, 3, 4], "INPUT1": {"content": [1, 1, 1, 1], "shape": [4]}},'
                    ' {"INPUT0": {"b64": "AACAPwAAAEAAAEBAAACAQA=="}, "INPUT1": [0, 0, 0, 0]}]}')
    for input_data in (str(data), "zero"):
        result = measure(Target(bench_server.url, "add_sub", input_data=input_data), concurrency=1, **FAST)
        _check_consistent(result)


def test_unknown_model_is_the_servers_error(bench_server: RunningServer) -> None:
    with pytest.raises(Exception, match="nope"):
        measure(Target(bench_server.url, "nope"), concurrency=1, **FAST)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_generator_ceiling(bench_server: RunningServer, protocol: str) -> None:
    assert ceiling(_url(bench_server, protocol), protocol, concurrency=4, seconds=0.3, processes=1) > 0


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_failed_requests_are_counted_with_the_servers_message(bench_server: RunningServer, protocol: str,
                                                              tmp_path) -> None:
    data = tmp_path / "wrong.json"
    data.write_text('{"data": [{"INPUT0": {"content": [1, 2, 3, 4, 5], "shape": [5]}, "INPUT1": [1, 2, 3, 4]}]}')
    result = measure(Target(_url(bench_server, protocol), "add_sub", protocol=protocol, input_data=str(data)),
                     concurrency=1, measurement_interval_ms=100, max_trials=3, processes=1)
    assert result.completed_total == 0 and result.errors_total > 0 and not result.stable
    assert result.error is not None and "unexpected shape for input 'INPUT0'" in result.error
