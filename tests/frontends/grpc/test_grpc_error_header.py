"""``triton_grpc_error: true`` on ModelStreamInfer (Triton 24.08+): a failed inference ends the stream with the
error as the call's gRPC status code, instead of an ``error_message`` inside a stream response. Without the header
the stream carries the error and goes on. Both server engines (the package's ``grpc_server`` fixture)."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.server import RunningServer


def _mode(value: int) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("MODE", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], np.int32))
    return tensor


def _stream(server: RunningServer, headers: dict[str, str] | None) -> tuple[grpcclient.InferenceServerClient,
                                                                             queue.Queue]:
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)), headers=headers)
    return client, answers


@pytest.mark.parametrize("mode, message", [(1, "error on purpose"), (2, "raised on purpose")],
                         ids=["response-error", "execute-raised"])
def test_with_the_header_an_error_is_the_streams_grpc_status(grpc_server: RunningServer, mode: int,
                                                            message: str) -> None:
    client, answers = _stream(grpc_server, {"triton_grpc_error": "true"})
    try:
        client.async_stream_infer("fail", [_mode(0)])
        result, error = answers.get(timeout=20)
        assert error is None and result.as_numpy("OUT").tolist() == [0]
        client.async_stream_infer("fail", [_mode(mode)])
        result, error = answers.get(timeout=20)
        assert result is None and isinstance(error, InferenceServerException)
        assert str(error.status()) == "StatusCode.INTERNAL", "a gRPC status, not a message in the stream"
        assert message in error.message()
        # The stream is closed: nothing more comes on it.
        with pytest.raises(queue.Empty):
            answers.get(timeout=0.5)
    finally:
        client.stop_stream()


def test_without_the_header_the_error_travels_in_the_stream_which_goes_on(grpc_server: RunningServer) -> None:
    client, answers = _stream(grpc_server, None)
    try:
        for mode in (1, 0, 1, 0):
            client.async_stream_infer("fail", [_mode(mode)])
            result, error = answers.get(timeout=20)
            if mode:
                assert isinstance(error, InferenceServerException) and "error on purpose" in error.message()
                assert str(error.status()) != "StatusCode.INTERNAL"  # an in-stream error carries no status
            else:
                assert error is None and result.as_numpy("OUT").tolist() == [0]
    finally:
        client.stop_stream()


def test_header_false_is_the_default_behaviour(grpc_server: RunningServer) -> None:
    client, answers = _stream(grpc_server, {"triton_grpc_error": "false"})
    try:
        client.async_stream_infer("fail", [_mode(1)])
        client.async_stream_infer("fail", [_mode(0)])
        _, error = answers.get(timeout=20)
        assert isinstance(error, InferenceServerException)
        result, error = answers.get(timeout=20)
        assert error is None and result.as_numpy("OUT").tolist() == [0]
    finally:
        client.stop_stream()


def test_an_unknown_model_is_still_answered_in_the_stream(grpc_server: RunningServer) -> None:
    """Triton reports a request it could not issue inside the stream even with the header (its READ step)."""
    client, answers = _stream(grpc_server, {"triton_grpc_error": "true"})
    try:
        client.async_stream_infer("no_such_model", [_mode(0)])
        _, error = answers.get(timeout=20)
        assert isinstance(error, InferenceServerException)
        client.async_stream_infer("fail", [_mode(0)])
        result, error = answers.get(timeout=20)
        assert error is None and result.as_numpy("OUT").tolist() == [0]
    finally:
        client.stop_stream()
