"""ModelStreamInfer with tritonclient.grpc's streaming API (sync callbacks and asyncio), against a running
server, and the stream's handling of many responses per request (decoupled models) in process."""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from naiad.core.request import InferRequest, InferResponse
from naiad.frontends.grpc import server as grpc_server_module
from naiad.frontends.grpc.options import GrpcOptions
from naiad.repository.manager import ModelRepository, RepositoryOptions
from naiad.repository.model import ModelVersion
from naiad.service import Service
from tests.frontends.grpc.conftest import write_grpc_models
from tests.server import RunningServer, free_port


def _mode(mode: int, cls=grpcclient) -> list:
    tensor = cls.InferInput("MODE", [1], "INT32")
    tensor.set_data_from_numpy(np.array([mode], dtype=np.int32))
    return [tensor]


def _final(result) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


def test_stream_in_request_order_with_inline_errors(grpc_server: RunningServer) -> None:
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(grpc_server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer("fail", _mode(0), request_id="a")
        client.async_stream_infer("fail", _mode(1), request_id="b")  # the model answers with an error
        client.async_stream_infer("missing", _mode(0), request_id="c")  # refused before it reaches a model
        client.async_stream_infer("fail", _mode(2), request_id="d")  # execute() raises
        wrong_shape = grpcclient.InferInput("MODE", [2], "INT32")
        wrong_shape.set_data_from_numpy(np.array([1, 2], dtype=np.int32))
        client.async_stream_infer("fail", [wrong_shape], request_id="e")  # refused by the model's signature
        client.async_stream_infer("fail", _mode(5), request_id="f")
        got = [answers.get(timeout=30) for _ in range(6)]
        client.stop_stream()
    result, error = got[0]
    assert error is None and result.get_response().id == "a" and _final(result)
    assert result.as_numpy("OUT").tolist() == [0]
    # A model error keeps the request's identity and the final flag.
    result, error = got[1]
    assert isinstance(error, InferenceServerException) and error.message() == "error on purpose"
    assert result is None
    assert isinstance(got[2][1], InferenceServerException)
    assert got[2][1].message() == "Request for unknown model: 'missing' is not found"
    assert "raised on purpose" in got[3][1].message()
    assert got[4][1].message() == ("[request id: e] unexpected shape for input 'MODE' for model 'fail'. Expected [1], "
                                   "got [2]. ")
    result, error = got[5]
    assert error is None and result.get_response().id == "f" and result.as_numpy("OUT").tolist() == [5]


def test_stream_raw_messages(grpc_server: RunningServer) -> None:
    """The wire fields Triton sets on stream responses, read from the generated stub."""
    def request(model: str, mode: int, id: str, version: str = "") -> service_pb2.ModelInferRequest:
        message = service_pb2.ModelInferRequest(model_name=model, id=id, model_version=version)
        message.inputs.add(name="MODE", datatype="INT32", shape=[1]).contents.int_contents.append(mode)
        return message

    with grpc.insecure_channel(grpc_server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        responses = list(stub.ModelStreamInfer(iter([request("fail", 1, "x"), request("fail", 0, "y", "1"),
                                                     request("nope", 0, "z")])))
    failed, ok, refused = responses
    assert failed.error_message == "error on purpose"
    assert (failed.infer_response.id, failed.infer_response.model_name, failed.infer_response.model_version) == (
        "x", "fail", "")
    assert failed.infer_response.parameters["triton_final_response"].bool_param
    assert ok.error_message == "" and ok.infer_response.model_version == "1"
    assert ok.infer_response.parameters["triton_final_response"].bool_param
    assert refused.error_message == "Request for unknown model: 'nope' is not found"
    assert refused.infer_response.id == "z" and not refused.infer_response.parameters


def test_aio_stream(grpc_server: RunningServer) -> None:
    async def main() -> None:
        async with aioclient.InferenceServerClient(grpc_server.grpc_url) as client:
            async def requests() -> AsyncIterator[dict]:
                for i in range(5):
                    x = np.full(4, i, dtype=np.float32)
                    inputs = []
                    for name in ("INPUT0", "INPUT1"):
                        tensor = aioclient.InferInput(name, [4], "FP32")
                        tensor.set_data_from_numpy(x)
                        inputs.append(tensor)
                    yield {"model_name": "add_sub", "inputs": inputs, "request_id": str(i)}

            seen = []
            async for result, error in client.stream_infer(inputs_iterator=requests()):
                assert error is None
                seen.append(result.get_response().id)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full(4, 2 * int(seen[-1])))
                if len(seen) == 5:
                    break
            assert seen == ["0", "1", "2", "3", "4"]

    asyncio.run(main())


# --- many responses per request ------------------------------------------------------------------------------------

def test_stream_many_responses_per_request(tmp_path: Path) -> None:
    write_grpc_models(tmp_path)
    repository = ModelRepository(RepositoryOptions(paths=[tmp_path]))

    async def main() -> None:
        repository.load_all()
        service = Service(repository)  # a real decoupled Python model answers three times per request
        service.live = service.accepting = True
        port = free_port()
        server = await grpc_server_module.start(service, GrpcOptions(address="127.0.0.1", port=port))
        try:
            # The generated stub on a grpc.aio channel: tritonclient's aio stream can't ask for empty finals.
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

                async def requests() -> AsyncIterator[service_pb2.ModelInferRequest]:
                    for i, empty_final in enumerate((False, True)):
                        message = service_pb2.ModelInferRequest(model_name="decoupled", id=f"r{i}")
                        message.inputs.add(name="INPUT0", datatype="FP32", shape=[2])
                        message.raw_input_contents.append(np.full(2, 10 * i, dtype=np.float32).tobytes())
                        if empty_final:
                            message.parameters["triton_enable_empty_final_response"].bool_param = True
                        yield message

                got: dict[str, list] = {"r0": [], "r1": []}
                async for response in stub.ModelStreamInfer(requests()):
                    assert response.error_message == ""
                    result = grpcclient.InferResult(response.infer_response)
                    got[response.infer_response.id].append((result.as_numpy("OUTPUT0"), _final(result)))
        finally:
            await server.stop(None)
            repository.unload_all()
        # Three partial responses each; only r1 asked for the flag-only final response.
        assert [final for _, final in got["r0"]] == [False, False, False]
        assert [out.tolist() for out, _ in got["r0"]] == [[0, 0], [1, 1], [2, 2]]
        assert [out.tolist() for out, _ in got["r1"][:3]] == [[10, 10], [11, 11], [12, 12]]
        assert [final for _, final in got["r1"]] == [False, False, False, True]
        assert got["r1"][3][0] is None

    asyncio.run(main())
