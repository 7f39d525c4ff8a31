"""10x overload of a slow model: 40 clients against a model that takes 4 requests per 0.2 s execution.

With ``max_queue_size`` the excess is refused at once with Triton's UNAVAILABLE "Exceeds maximum queue size"
(HTTP 503 / gRPC UNAVAILABLE) and what is admitted waits no longer than the queue allows; with a queue timeout,
requests waiting longer get UNAVAILABLE "Request timeout expired", also when 400 calls share one gRPC connection
(the stream limit must not move the queue into the client, out of the policy's sight); without either, every
request is answered, later. Either way nothing hangs, memory stays put and the server stays healthy.
benchmarks/reliability/overload.py runs it longer and reports latencies."""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from tests.frontends.grpc.test_http2 import END_HEADERS, HEADERS, RST_STREAM, RawClient, frame
from tests.reliability import http_oracle, procs
from tests.reliability.fuzz_grpc import SERVICE
from tests.reliability.load import Load, fp32_body, percentile
from tests.reliability.repo import write_echo_pid, write_slow
from tests.server import RunningServer

DELAY = 0.2
QUEUE = 4
CLIENTS = 40
FULL = "Exceeds maximum queue size"
REFUSED_STREAM = 0x7
TIMEOUT = 1.0  # the "timed" model's queue policy: requests waiting longer are rejected
STREAMS = 400  # concurrent calls on one gRPC connection: more than a 100-stream limit, which hid 300 in the client


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = Path(tmp_path_factory.mktemp("overload"))
    write_slow(repo, "limited", DELAY, max_queue_size=QUEUE)
    write_slow(repo, "unlimited", DELAY)
    write_slow(repo, "timed", DELAY, queue_timeout_us=int(TIMEOUT * 1e6))
    write_echo_pid(repo, "echo")  # for the health check
    running = RunningServer([repo])
    yield running
    running.stop()


def _overload(server: RunningServer, model: str, seconds: float = 2.0) -> list:
    load = Load(server.http_port, [model], CLIENTS, timeout=15,
                body=lambda n: fp32_body([float(n)], [1, 1])).start()
    time.sleep(seconds)
    return load.stop()


def test_bounded_queue_refuses_the_excess_cleanly(server: RunningServer) -> None:
    before = procs.snapshot(server.proc.pid)
    results = _overload(server, "limited")
    statuses = collections.Counter(r.status for r in results)
    assert set(statuses) == {200, 503}, statuses
    refused = [r for r in results if r.status == 503]
    assert all(r.error.endswith(FULL) for r in refused), {r.error for r in refused}
    served = [r.seconds for r in results if r.status == 200]
    # Admitted requests wait behind at most a full queue and the batch executing: (4 + 4) / 4 executions.
    assert max(served) < (QUEUE / 4 + 2) * DELAY + 2.0, percentile(served, 0.99)
    after = procs.snapshot(server.proc.pid)
    assert after.rss - before.rss < 64 * 2**20, (before.describe(), after.describe())
    assert http_oracle.healthy("127.0.0.1", server.http_port) is None


def test_bounded_queue_refuses_grpc_with_unavailable(server: RunningServer) -> None:
    message = pb.ModelInferRequest(model_name="limited")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
    message.raw_input_contents.append(np.array([1.0], dtype=np.float32).tobytes())
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary(SERVICE + "ModelInfer", request_serializer=pb.ModelInferRequest.SerializeToString,
                                   response_deserializer=pb.ModelInferResponse.FromString)
        futures = [call.future(message, timeout=15) for _ in range(CLIENTS)]
        outcomes = []
        for future in futures:
            try:
                future.result()
                outcomes.append((grpc.StatusCode.OK, ""))
            except grpc.RpcError as exc:
                outcomes.append((exc.code(), exc.details()))
    codes = collections.Counter(code for code, _ in outcomes)
    assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, codes
    assert all(details.endswith(FULL) for code, details in outcomes if code == grpc.StatusCode.UNAVAILABLE)


def _grpc_burst(server: RunningServer, model: str, calls: int) -> list[tuple[grpc.StatusCode, str, float]]:
    """``calls`` ModelInfer calls at once on one connection: each one's code, details and latency."""
    message = pb.ModelInferRequest(model_name=model)
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
    message.raw_input_contents.append(np.array([1.0], dtype=np.float32).tobytes())
    outcomes: list[tuple[grpc.StatusCode, str, float]] = []
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary(SERVICE + "ModelInfer", request_serializer=pb.ModelInferRequest.SerializeToString,
                                   response_deserializer=pb.ModelInferResponse.FromString)
        call(message, timeout=15)  # connected, so the burst's latencies are the server's
        ended: dict[int, float] = {}
        started = time.monotonic()
        futures = [call.future(message, timeout=30) for _ in range(calls)]
        for i, future in enumerate(futures):
            future.add_done_callback(lambda _, i=i: ended.setdefault(i, time.monotonic()))
        for i, future in enumerate(futures):
            try:
                future.result()
                outcome = (grpc.StatusCode.OK, "")
            except grpc.RpcError as exc:
                outcome = (exc.code(), exc.details())
            outcomes.append((*outcome, ended.get(i, time.monotonic()) - started))
    return outcomes


@pytest.mark.parametrize("model", ["timed", "limited"])
def test_queue_policy_bounds_latency_of_many_streams_on_one_connection(server: RunningServer, model: str) -> None:
    before = procs.snapshot(server.proc.pid)
    outcomes = _grpc_burst(server, model, STREAMS)
    codes = collections.Counter(code for code, _, _ in outcomes)
    assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, codes
    why = "Request timeout expired" if model == "timed" else FULL
    assert all(details.endswith(why) for code, details, _ in outcomes if code == grpc.StatusCode.UNAVAILABLE)
    served = max(seconds for code, _, seconds in outcomes if code == grpc.StatusCode.OK)
    # Admitted calls waited at most the policy's bound, plus the batch they ran in (with a 100-stream limit, the
    # timed model's took 3.2 s: the client held 300 calls back, where no timeout applied).
    bound = TIMEOUT if model == "timed" else (QUEUE / 4 + 1) * DELAY
    assert served < bound + 2 * DELAY + 0.6, served
    after = procs.snapshot(server.proc.pid)
    assert after.rss - before.rss < 64 * 2**20, (before.describe(), after.describe())


def test_streams_up_to_the_limit_left_idle_hold_little_memory(server: RunningServer) -> None:
    """10 connections, each opening 1,000 ModelStreamInfer streams (the default stream limit) and sending nothing:
    a task per stream held ~10 KiB each (+107 MiB); handlers now start with the first message (+38 MiB)."""
    before = procs.snapshot(server.proc.pid)
    clients = [RawClient(server.grpc_url) for _ in range(10)]
    try:
        for client in clients:
            block = client.request_headers(SERVICE + "ModelStreamInfer")
            client.sock.sendall(b"".join(frame(HEADERS, END_HEADERS, 1 + 2 * i, block) for i in range(1000)))
        # One more stream than the limit: its refusal shows the 1,000 before it were all read.
        for client in clients:
            client.sock.sendall(frame(HEADERS, END_HEADERS, 2001, client.request_headers(SERVICE + "ModelStreamInfer")))
            _, payload = client.until(RST_STREAM, 2001)
            assert int.from_bytes(payload, "big") == REFUSED_STREAM
        after = procs.snapshot(server.proc.pid)
    finally:
        for client in clients:
            client.close()
    assert after.rss - before.rss < 64 * 2**20, (before.describe(), after.describe())
    assert http_oracle.healthy("127.0.0.1", server.http_port) is None


def test_unbounded_queue_answers_everything(server: RunningServer) -> None:
    results = _overload(server, "unlimited")
    assert collections.Counter(r.status for r in results) == {200: len(results)}
    # Closed-loop clients: the queue never holds more than one request per client.
    assert max(r.seconds for r in results) < (CLIENTS / 4 + 1) * DELAY + 2.0
    assert http_oracle.healthy("127.0.0.1", server.http_port) is None


def test_requests_abandoned_at_their_deadline_are_not_run(server: RunningServer) -> None:
    # 100 gRPC calls that give up after 50 ms: run anyway, they would keep the model busy for 5 s.
    message = pb.ModelInferRequest(model_name="unlimited")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
    message.raw_input_contents.append(np.array([2.0], dtype=np.float32).tobytes())
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary(SERVICE + "ModelInfer", request_serializer=pb.ModelInferRequest.SerializeToString,
                                   response_deserializer=pb.ModelInferResponse.FromString)
        futures = [call.future(message, timeout=0.05) for _ in range(100)]
        codes = collections.Counter()
        for future in futures:
            try:
                future.result()
                codes["OK"] += 1
            except grpc.RpcError as exc:
                codes[exc.code().name] += 1
        assert codes["DEADLINE_EXCEEDED"] >= 90, codes
        started = time.monotonic()
        reply = call(message, timeout=30)
    assert np.frombuffer(reply.raw_output_contents[0], dtype=np.float32).tolist() == [2.0]
    assert time.monotonic() - started < 2.0
