"""The lean gRPC engine's rapid-reset guard (CVE-2023-44487) against the client it must not be mistaken for.

A client whose short deadlines expire while the model works resets every call (grpc sends RST_STREAM CANCEL):
2,000 such calls once ran the guard dry and cost ~7 % of them UNAVAILABLE with the connection. Now only resets of
requests that never fully arrived, or of streams reset within 10 ms of opening, count; the attack itself (open a
call and reset it at once, over and over) still closes its connection with GOAWAY ENHANCE_YOUR_CALM."""

from __future__ import annotations

import collections
import struct
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
from tritonclient.grpc import service_pb2 as pb

from tests.frontends.grpc.test_http2 import DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, RST_STREAM, RawClient, frame
from tests.reliability import procs
from tests.reliability.fuzz_grpc import SERVICE
from tests.reliability.repo import write_slow
from tests.server import RunningServer

ENHANCE_YOUR_CALM, CANCEL = 0xB, 0x8


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = Path(tmp_path_factory.mktemp("reset"))
    write_slow(repo, "slow", 0.05)
    running = RunningServer([repo])
    yield running
    running.stop()


def _message() -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="slow")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
    message.raw_input_contents.append(np.array([1.0], dtype=np.float32).tobytes())
    return message


def _connections_to(port: int) -> set[int]:
    """This process's local ports of established connections to ``port``."""
    return {c.laddr.port for c in psutil.Process().net_connections("tcp")
            if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED}


def test_deadline_resets_keep_the_connection(server: RunningServer) -> None:
    message = _message()
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary(SERVICE + "ModelInfer", request_serializer=pb.ModelInferRequest.SerializeToString,
                                   response_deserializer=pb.ModelInferResponse.FromString)
        call(message, timeout=10)
        before = _connections_to(server.grpc_port)
        codes: collections.Counter[str] = collections.Counter()
        for _ in range(20):  # 2,000 calls, 100 at a time, each giving up after 30 ms of a 50 ms execution
            for future in [call.future(message, timeout=0.03) for _ in range(100)]:
                try:
                    future.result()
                    codes["OK"] += 1
                except grpc.RpcError as exc:
                    codes[exc.code().name] += 1
        assert sum(codes.values()) == 2000 and set(codes) <= {"DEADLINE_EXCEEDED", "OK"}, codes
        assert codes["DEADLINE_EXCEEDED"] >= 1900, codes
        call(message, timeout=10)
        assert before and _connections_to(server.grpc_port) == before  # the same connection, never closed


def test_open_and_reset_flood_is_still_refused(server: RunningServer) -> None:
    """1,500 ModelInfer calls, each sent whole and reset at once, in one write: past the burst of 1,000 the
    connection is closed; the server stays up and its memory where it was."""
    before = procs.snapshot(server.proc.pid)
    raw = RawClient(server.grpc_url)
    try:
        body = _message().SerializeToString()
        body = b"\0" + struct.pack(">I", len(body)) + body
        path = SERVICE + "ModelInfer"
        wire = b"".join(frame(HEADERS, END_HEADERS, sid, raw.request_headers(path))
                        + frame(DATA, END_STREAM, sid, body) + frame(RST_STREAM, 0, sid, struct.pack(">I", CANCEL))
                        for sid in range(1, 3000, 2))
        raw.sock.sendall(wire)
        _, payload = raw.until(GOAWAY)
        assert struct.unpack(">I", payload[4:8])[0] == ENHANCE_YOUR_CALM, payload
    finally:
        raw.close()
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary(SERVICE + "ModelInfer", request_serializer=pb.ModelInferRequest.SerializeToString,
                                   response_deserializer=pb.ModelInferResponse.FromString)
        assert call(_message(), timeout=10).model_name == "slow"
    after = procs.snapshot(server.proc.pid)
    assert after.rss - before.rss < 64 * 2**20, (before.describe(), after.describe())
