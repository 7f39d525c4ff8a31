"""Seeded gRPC fuzzing (see fuzz_grpc) on both server engines: a few hundred ModelInfer messages that lie, the other
RPCs with odd fields, unparsable protobuf, unknown methods and mixed streams; every call ends in time with the
status Triton gives, and the server stays live, ready and correct."""

from __future__ import annotations

import collections
import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.reliability import fuzz_grpc, http_oracle
from tests.reliability.repo import FUZZ_SERVER_FLAGS, write_fuzz_models
from tests.server import RunningServer

SEED = int(os.environ.get("NAIAD_FUZZ_SEED", "20261125"))
CASES = int(os.environ.get("NAIAD_FUZZ_CASES", "500"))


@pytest.fixture(scope="module", params=("lean", "grpcio"))
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("fuzz_models")
    write_fuzz_models(Path(repo))
    running = RunningServer([repo], *FUZZ_SERVER_FLAGS, "--grpc-engine", request.param)
    running.engine = request.param  # type: ignore[attr-defined]
    with http_oracle.registered_region("127.0.0.1", running.http_port):
        yield running
    running.stop()


def test_grpc_fuzz_answers_every_case_cleanly(server: RunningServer) -> None:
    cases = fuzz_grpc.generate(SEED, CASES)
    outcomes, health = fuzz_grpc.run(server.grpc_url, cases, alive=lambda: server.proc.poll() is None)
    problems = [f"{o.problem}\n    {o.case.describe()}" for o in outcomes if o.problem]
    assert not health, "\n".join(health) + "\n" + server.log()[-3000:]
    assert not problems, f"{len(problems)} of {len(outcomes)} cases (seed {SEED}):\n" + "\n".join(problems[:15])
    codes = collections.Counter(o.code for o in outcomes)
    assert codes[grpc.StatusCode.OK] and codes[grpc.StatusCode.INVALID_ARGUMENT] and codes[grpc.StatusCode.NOT_FOUND]


# Triton answers a message that does not parse with INTERNAL "Unable to parse request", in a stream too (which then
# ends). (grpc.aio on its own would end the call UNKNOWN "Unexpected <class 'DecodeError'>" and log a traceback.)
UNPARSABLE = b"\x0a\xff\xff\xff\x0f\x0a\x04echo"


@pytest.mark.parametrize("method", ["ModelInfer", "ServerLive", "ModelMetadata", "RepositoryModelLoad"])
def test_unparsable_protobuf_is_internal_as_triton_answers(server: RunningServer, method: str) -> None:
    logged = len(server.log())
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary(fuzz_grpc.SERVICE + method, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as info:
            call(UNPARSABLE, timeout=10)
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert info.value.details() == "Unable to parse request"
    assert "Traceback" not in server.log()[logged:]


def test_an_unparsable_stream_message_ends_the_stream_as_triton_does(server: RunningServer) -> None:
    logged = len(server.log())
    with grpc.insecure_channel(server.grpc_url) as channel:
        stream = channel.stream_stream(fuzz_grpc.SERVICE + "ModelStreamInfer", request_serializer=None,
                                       response_deserializer=None)
        with pytest.raises(grpc.RpcError) as info:
            list(stream(iter([UNPARSABLE]), timeout=10))
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert info.value.details() == "Unable to parse request"
    assert "Traceback" not in server.log()[logged:]
