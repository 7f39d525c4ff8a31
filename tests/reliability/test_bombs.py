"""Decompression bombs (issue 19, item 2): a 0.9 MB gzip or deflate body that inflates to 900 MiB. Before, it cost
the server +1.8 GB over HTTP, +1.8 GB on the lean gRPC engine and +3.4 GB on grpcio, and the HTTP JSON-error path
kept failed bodies alive through an exception cycle. Now a body inflates to at most --http-max-input-size (HTTP: 400)
or --grpc-max-decompressed-size (gRPC: RESOURCE_EXHAUSTED), and the server serves on."""

from __future__ import annotations

import asyncio
import gzip
import http.client
import time
import zlib
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb

from tests.reliability.bombs import MIB, CompressedGrpc, Memory, bomb
from tests.server import EXAMPLES, RunningServer

BOMB_MIB = 900
BOUND = 300 * MIB  # the most a bomb may add to the server's peak; the limits are 64 MiB
INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module", params=("lean", "grpcio"))
def server(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    running = RunningServer([EXAMPLES], "--grpc-engine", request.param, "--allow-metrics=false")
    running.engine = request.param  # type: ignore[attr-defined]
    yield running
    running.stop()


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    return {encoding: bomb(encoding, BOMB_MIB) for encoding in ("gzip", "deflate")}


def _add_sub_json() -> bytes:
    return (b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[4],"data":[1,2,3,4]},'
            b'{"name":"INPUT1","datatype":"FP32","shape":[4],"data":[1,1,1,1]}]}')


def _post(server: RunningServer, body: bytes, encoding: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    try:
        conn.request("POST", "/v2/models/add_sub/infer", body, {"Content-Encoding": encoding,
                                                                 "Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _serves(server: RunningServer) -> None:
    """add_sub still answers correctly over HTTP and gRPC."""
    a = np.arange(4, dtype=np.float32)
    with httpclient.InferenceServerClient(server.url) as client:
        inputs = [httpclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(a)
        assert client.infer("add_sub", inputs).as_numpy("OUTPUT0").tolist() == (a + a).tolist()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        inputs = [grpcclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(a)
        assert client.infer("add_sub", inputs).as_numpy("OUTPUT0").tolist() == (a + a).tolist()


HTTP_ONLY = pytest.mark.parametrize("server", ["lean"], indirect=True)  # HTTP doesn't depend on the gRPC engine


@HTTP_ONLY
@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_an_http_bomb_is_refused_having_cost_at_most_the_limit(server: RunningServer, bombs: dict[str, bytes],
                                                               encoding: str) -> None:
    memory = Memory(server.proc.pid)
    before = memory.rss()
    memory.reset_peak()
    status, body = _post(server, bombs[encoding], encoding)
    added = memory.peak() - before
    assert status == 400, body
    assert b"exceeds the maximum allowed value of 67108864 bytes" in body, body
    assert added < BOUND, f"+{added / MIB:.0f} MiB"
    # A compressed body within the limit still works.
    packed = gzip.compress(_add_sub_json()) if encoding == "gzip" else zlib.compress(_add_sub_json())
    status, body = _post(server, packed, encoding)
    assert status == 200, body
    _serves(server)


@HTTP_ONLY
def test_failed_http_bodies_are_not_kept(server: RunningServer) -> None:
    """Bodies that inflate (within the limit) to something that is not JSON: each is freed once answered. The
    exception that reported them used to keep its traceback, whose frames held the body, in a reference cycle
    that only a full garbage collection (which an idle server doesn't run) would free."""
    memory = Memory(server.proc.pid)
    body = bomb("gzip", 48)
    before = memory.rss()
    for _ in range(4):
        status, answer = _post(server, body, "gzip")
        assert status in (400, 500) and b"failed to parse the request JSON buffer" in answer, (status, answer)
    time.sleep(0.5)
    held = memory.rss() - before
    assert held < 100 * MIB, f"4 failed 48 MiB bodies still hold +{held / MIB:.0f} MiB"


def _infer_message() -> bytes:
    a = np.arange(4, dtype=np.float32).tobytes()
    return pb.ModelInferRequest(
        model_name="add_sub",
        inputs=[pb.ModelInferRequest.InferInputTensor(name=n, datatype="FP32", shape=[4]) for n in ("INPUT0", "INPUT1")],
        raw_input_contents=[a, a]).SerializeToString()


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_grpc_bomb_ends_its_call_resource_exhausted(server: RunningServer, bombs: dict[str, bytes],
                                                     encoding: str) -> None:
    memory = Memory(server.proc.pid)
    before = memory.rss()

    async def calls() -> list:
        client = await CompressedGrpc.connect("127.0.0.1", server.grpc_port, INFER, encoding)
        try:
            refused = await asyncio.wait_for(client.send(bombs[encoding]), 60)
            # The same connection serves on: a compressed message within the limit, and a plain one.
            packed = _infer_message()
            packed = zlib.compress(packed, wbits=31 if encoding == "gzip" else 15)
            small = await asyncio.wait_for(client.send(packed), 30)
            plain = await asyncio.wait_for(client.send(_infer_message(), compressed=False), 30)
            return [refused, small, plain]
        finally:
            client.close()

    memory.reset_peak()
    refused, small, plain = asyncio.run(calls())
    added = memory.peak() - before
    ok, _, _, error = refused
    assert not ok and error.startswith("grpc-status 8:"), error  # RESOURCE_EXHAUSTED
    assert "Decompressed message larger than max" in error, error
    assert small[0] and plain[0], (small, plain)
    assert added < BOUND, f"+{added / MIB:.0f} MiB on {server.engine}"  # type: ignore[attr-defined]
    _serves(server)
