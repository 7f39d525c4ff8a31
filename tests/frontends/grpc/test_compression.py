"""``--grpc-infer-response-compression-level`` on both engines: ModelInfer / ModelStreamInfer responses compressed
with the algorithm grpc picks for the level among those the client accepts (low: gzip; medium, high: deflate when
both are); on lean other RPCs not, as in Triton (grpcio can only set the level for every RPC)."""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb

from naiad.frontends.grpc.options import compression_for
from tests.frontends.grpc.test_http2 import DATA, END_HEADERS, END_STREAM, HEADERS, RawClient, frame
from tests.models import IDENTITY_FP32, IDENTITY_PY, write_model
from tests.server import RunningServer

ZEROS = np.zeros(4096, np.float32)  # 16 KiB that compress to almost nothing


@pytest.mark.parametrize(("level", "accepted", "algorithm"), [
    ("none", "identity,deflate,gzip", None),
    ("low", "identity,deflate,gzip", "gzip"),
    ("medium", "identity, deflate, gzip", "deflate"),
    ("high", "gzip,deflate", "deflate"),
    ("medium", "identity,gzip", "gzip"),
    ("high", "identity,gzip", "gzip"),
    ("low", "deflate", "deflate"),
    ("high", "identity", None),
])
def test_grpcs_choice_by_level(level: str, accepted: str, algorithm: str | None) -> None:
    assert compression_for(level, accepted) == algorithm


@pytest.fixture(scope="module", params=[("grpcio", "low"), ("grpcio", "medium"), ("lean", "low"), ("lean", "high")],
                ids=lambda p: "-".join(p))
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    engine, level = request.param
    repo = tmp_path_factory.mktemp("compression")
    write_model(repo, "identity", IDENTITY_FP32.format(name="identity"), IDENTITY_PY)
    running = RunningServer([repo], "--grpc-engine", engine,
                            f"--grpc-infer-response-compression-level={level.upper()}")
    running.level = level  # type: ignore[attr-defined]
    yield running
    running.stop()


def _call(server: RunningServer, method: str, message: bytes, accepted: str = "identity,deflate,gzip"
          ) -> tuple[dict[str, str], bytes]:
    """One call as a client that accepts these encodings: the response headers and the first message's bytes."""
    raw = RawClient(server.grpc_url)
    try:
        headers = raw.encoder.encode([
            (":method", "POST"), (":scheme", "http"), (":path", f"/inference.GRPCInferenceService/{method}"),
            (":authority", "localhost"), ("content-type", "application/grpc"), ("te", "trailers"),
            ("grpc-accept-encoding", accepted)])
        body = b"\0" + len(message).to_bytes(4, "big") + message
        chunks = [body[i:i + 16384] for i in range(0, len(body), 16384)]  # HTTP/2's default largest frame
        raw.sock.sendall(frame(HEADERS, END_HEADERS, 1, headers) + b"".join(
            frame(DATA, END_STREAM if i == len(chunks) - 1 else 0, 1, chunk) for i, chunk in enumerate(chunks)))
        _, block = raw.until(HEADERS, 1)
        response = dict(raw.decoder.decode(block))
        data = b""
        while len(data) < 5 or len(data) < 5 + int.from_bytes(data[1:5], "big"):
            data += raw.until(DATA, 1)[1]
        return response, data
    finally:
        raw.close()


def _infer_request() -> bytes:
    return pb.ModelInferRequest(
        model_name="identity", inputs=[pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="FP32",
                                                                              shape=[ZEROS.size])],
        raw_input_contents=[ZEROS.tobytes()]).SerializeToString()


def test_infer_responses_are_compressed_by_level(server: RunningServer) -> None:
    headers, data = _call(server, "ModelInfer", _infer_request())
    algorithm = {"low": "gzip", "medium": "deflate", "high": "deflate"}[server.level]  # type: ignore[attr-defined]
    assert headers.get("grpc-encoding") == algorithm
    assert data[0] == 1 and len(data) < ZEROS.nbytes // 4
    message = zlib.decompress(data[5:], 31 if algorithm == "gzip" else 15)
    reply = pb.ModelInferResponse.FromString(message)
    assert reply.raw_output_contents[0] == ZEROS.tobytes()


def test_other_rpcs_are_not_compressed_on_lean(server: RunningServer) -> None:
    headers, data = _call(server, "ServerLive", b"")
    if "lean" in server.proc.args:
        assert "grpc-encoding" not in headers
    assert data[5:] == b"\x08\x01" or zlib.decompress(data[5:], 47) == b"\x08\x01"  # ServerLiveResponse(live=True)


def test_a_message_that_would_grow_goes_uncompressed(server: RunningServer) -> None:
    tensor = pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="FP32", shape=[1])
    headers, data = _call(server, "ModelInfer", pb.ModelInferRequest(
        model_name="identity", inputs=[tensor], raw_input_contents=[b"\x17\x2a\x91\x3c"]).SerializeToString())
    assert "grpc-encoding" in headers and data[0] == 0  # as grpc sends it


def test_tritonclient_reads_compressed_answers(server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        inputs = [grpcclient.InferInput("INPUT0", [ZEROS.size], "FP32")]
        inputs[0].set_data_from_numpy(ZEROS)
        assert (client.infer("identity", inputs).as_numpy("OUTPUT0") == ZEROS).all()
        responses = list(client._client_stub.ModelStreamInfer(iter([pb.ModelInferRequest.FromString(
            _infer_request())] * 2), timeout=10))
        assert [r.infer_response.raw_output_contents[0] == ZEROS.tobytes() for r in responses] == [True, True]
    finally:
        client.close()


@pytest.mark.parametrize(("accepted", "algorithm"), [("identity,gzip", "gzip"), ("identity", None)])
def test_the_algorithm_is_one_the_client_accepts(server: RunningServer, accepted: str, algorithm: str | None) -> None:
    headers, data = _call(server, "ModelInfer", _infer_request(), accepted=accepted)
    assert headers.get("grpc-encoding") == algorithm and data[0] == (algorithm is not None)
