"""The response sender and cancellation as Triton's python backend has them, driven by tritonclient against a
running server:

* a non-decoupled model that answers through ``get_response_sender().send(..., FINAL)`` and keeps working in
  ``execute`` answers its client at once, not when ``execute`` returns;
* a decoupled model whose ``execute`` returns responses (a user error) answers its client with Triton's error and
  a final flag instead of leaving it waiting;
* ``is_cancelled()`` turns true inside a long synchronous ``execute`` when the client goes away (gRPC cancel,
  HTTP disconnect, a decoupled stream stopped with ``cancel_requests``).
"""

from __future__ import annotations

import queue
import socket
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.backends.python import models as m
from tests.server import RunningServer

# Answers through the sender (FINAL), then keeps execute busy for HOLD seconds.
HOLD = 3.0
SENDS_THEN_WORKS = f"""
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value * 2)])
            sender = request.get_response_sender()
            if int(value[0]) == 1:  # the response first, then the FINAL flag alone
                sender.send(response)
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        time.sleep({HOLD})
        return None
"""

# Returns None and answers from a thread afterwards (value 1: two responses, the second refused, before return).
ANSWERS_AFTER_RETURN = """
import threading, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            if int(value[0]) == 1:
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value + 1)]))
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value + 2)]))  # raises

            def later(sender=sender, value=value):
                time.sleep(0.3)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value * 3)]),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            threading.Thread(target=later, daemon=True).start()
        return None
"""

RETURNS_WHILE_DECOUPLED = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([7], np.int32))]) for _ in requests]
"""

# Loops in a synchronous execute until the request is cancelled (at most 20 s), then records how it ended.
WAITS_FOR_CANCEL = """
import os, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.folder = args["model_repository"]

    def execute(self, requests):
        request = requests[0]
        tag = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not request.is_cancelled():
            time.sleep(0.01)
        with open(os.path.join(self.folder, f"ended-{tag}"), "w") as f:
            f.write("cancelled" if request.is_cancelled() else "timeout")
        error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
        return [pb_utils.InferenceResponse(error=error) for _ in requests]
"""

# Decoupled: streams responses from inside execute until the stream's client cancels it.
STREAMS_UNTIL_CANCELLED = """
import os, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.folder = args["model_repository"]

    def execute(self, requests):
        request = requests[0]
        sender = request.get_response_sender()
        deadline = time.monotonic() + 20
        sent = 0
        while time.monotonic() < deadline and not sender.is_cancelled():
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([sent], np.int32))]))
            sent += 1
            time.sleep(0.02)
        with open(os.path.join(self.folder, "stream-ended"), "w") as f:
            f.write("cancelled" if request.is_cancelled() else "timeout")
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

INT_IO = ([("IN", "TYPE_INT32", "[ 1 ]")], [("OUT", "TYPE_INT32", "[ 1 ]")])


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sender_models")
    m.write(root, "sends_then_works", m.io_config("sends_then_works", *INT_IO), SENDS_THEN_WORKS)
    m.write(root, "answers_after_return", m.io_config("answers_after_return", *INT_IO), ANSWERS_AFTER_RETURN)
    m.write(root, "returns_while_decoupled", m.io_config("returns_while_decoupled", *INT_IO, m.DECOUPLED),
            RETURNS_WHILE_DECOUPLED)
    m.write(root, "waits_for_cancel", m.io_config("waits_for_cancel", *INT_IO), WAITS_FOR_CANCEL)
    m.write(root, "streams_until_cancelled", m.io_config("streams_until_cancelled", *INT_IO, m.DECOUPLED),
            STREAMS_UNTIL_CANCELLED)
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[RunningServer]:
    running = RunningServer([repo])
    yield running
    running.stop()


def _input(value: int, module: object = httpclient) -> object:
    tensor = module.InferInput("IN", [1], "INT32")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(np.array([value], np.int32))
    return tensor


def _ended(repo: Path, name: str, model: str = "waits_for_cancel", timeout: float = 10.0) -> str | None:
    marker = repo / model / name
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if marker.exists() and marker.read_text():
            return marker.read_text()
        time.sleep(0.02)
    return None


# --- a non-decoupled model's response sender ---------------------------------------------------------------------

def _stats(server: RunningServer) -> dict:
    client = httpclient.InferenceServerClient(server.url, network_timeout=30)
    return client.get_inference_statistics("sends_then_works")["model_stats"][0]


def _executed(server: RunningServer, count: int) -> dict:
    """The model's statistics once ``count`` executions have ended (each holds the instance HOLD seconds)."""
    deadline = time.monotonic() + HOLD + 10
    stats = _stats(server)
    while stats["execution_count"] < count and time.monotonic() < deadline:
        time.sleep(0.1)
        stats = _stats(server)
    return stats


@pytest.mark.parametrize("value", [2, 1], ids=["response-with-final", "response-then-final"])
def test_a_response_sent_with_final_reaches_the_client_before_execute_returns(server: RunningServer,
                                                                              value: int) -> None:
    before = _stats(server)["execution_count"]
    client = httpclient.InferenceServerClient(server.url, network_timeout=30)
    started = time.monotonic()
    result = client.infer("sends_then_works", [_input(value)])
    elapsed = time.monotonic() - started
    assert result.as_numpy("OUT").tolist() == [value * 2]
    assert elapsed < HOLD / 2, f"the answer waited {elapsed:.2f} s: until execute returned ({HOLD} s)"
    # The execution still counts once it ends, as in Triton: a success and an execution in the statistics.
    stats = _executed(server, before + 1)
    assert stats["execution_count"] == before + 1
    assert stats["inference_stats"]["success"]["count"] == before + 1
    assert stats["inference_stats"]["fail"]["count"] == 0


def test_the_same_over_grpc(server: RunningServer) -> None:
    before = _executed(server, 0)["execution_count"]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    started = time.monotonic()
    result = client.infer("sends_then_works", [_input(3, grpcclient)], client_timeout=30)
    assert result.as_numpy("OUT").tolist() == [6]
    assert time.monotonic() - started < HOLD / 2
    assert _executed(server, before + 1)["execution_count"] == before + 1


def test_a_response_sent_after_execute_returned_none_is_the_answer(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.url, network_timeout=30)
    assert client.infer("answers_after_return", [_input(5)]).as_numpy("OUT").tolist() == [15]
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    assert grpc.infer("answers_after_return", [_input(6, grpcclient)]).as_numpy("OUT").tolist() == [18]
    stats = client.get_inference_statistics("answers_after_return")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 2 and stats["execution_count"] == 2


def test_a_second_response_is_refused_and_the_first_stands(server: RunningServer) -> None:
    """Triton's front ends take a non-decoupled request's first response; the model's exception (a second
    response) comes too late to change it."""
    client = httpclient.InferenceServerClient(server.url, network_timeout=30)
    assert client.infer("answers_after_return", [_input(1)]).as_numpy("OUT").tolist() == [2]


# --- a decoupled model that returns responses ----------------------------------------------------------------------

def test_a_decoupled_model_returning_responses_answers_an_error_and_ends_the_stream(server: RunningServer) -> None:
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("returns_while_decoupled", [_input(1, grpcclient)],
                                  enable_empty_final_response=True)
        result, error = answers.get(timeout=20)  # (before: nothing ever came)
        assert result is None and isinstance(error, InferenceServerException)
        assert "is using the decoupled mode and the execute function must return None." in error.message()
        assert error.message().startswith("Failed to process the request(s) for model ")
        # It was the request's last answer: the stream has nothing more for it, and still serves.
        client.async_stream_infer("returns_while_decoupled", [_input(2, grpcclient)],
                                  enable_empty_final_response=True)
        _, again = answers.get(timeout=20)
        assert isinstance(again, InferenceServerException)
        assert answers.empty()
    finally:
        client.stop_stream()


def test_the_generate_stream_of_such_a_model_ends_too(server: RunningServer) -> None:
    status, _, body = server.request("POST", "/v2/models/returns_while_decoupled/generate_stream", '{"IN": [1]}',
                                     {"Content-Type": "application/json"})
    assert b"must return None" in body


# --- cancellation inside a running execute --------------------------------------------------------------------------

def test_grpc_cancel_is_seen_inside_a_long_synchronous_execute(server: RunningServer, repo: Path) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    call = client.async_infer("waits_for_cancel", [_input(11, grpcclient)],
                              callback=lambda result, error: answers.put(error))
    time.sleep(0.5)  # the execution is running by now
    call.cancel()
    assert _ended(repo, "ended-11") == "cancelled", "the model never saw is_cancelled() turn true"
    error = answers.get(timeout=10)
    assert isinstance(error, InferenceServerException) and "CANCELLED" in str(error.status())


def test_an_http_client_that_disconnects_is_seen_as_cancelled(server: RunningServer, repo: Path) -> None:
    body = ('{"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [12]}]}').encode()
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        sock.sendall(b"POST /v2/models/waits_for_cancel/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(0.5)
    assert _ended(repo, "ended-12") == "cancelled"
    # The instance is free again: the next request runs (and ends by its own deadline only if never cancelled).
    client = grpcclient.InferenceServerClient(server.grpc_url)
    call = client.async_infer("waits_for_cancel", [_input(13, grpcclient)], callback=lambda *_: None)
    time.sleep(0.3)
    call.cancel()
    assert _ended(repo, "ended-13") == "cancelled"


def test_a_decoupled_stream_stopped_with_cancel_requests_is_seen_inside_execute(server: RunningServer,
                                                                                 repo: Path) -> None:
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=partial(lambda q, result, error: q.put((result, error)), answers))
    client.async_stream_infer("streams_until_cancelled", [_input(0, grpcclient)])
    for _ in range(3):
        result, error = answers.get(timeout=20)
        assert error is None
    client.stop_stream(cancel_requests=True)
    assert _ended(repo, "stream-ended", "streams_until_cancelled") == "cancelled"


def test_in_process_models_answer_the_same_error(repo: Path) -> None:
    running = RunningServer([repo], "--backend-config=python,in-process=true")
    try:
        answers: queue.Queue = queue.Queue()
        client = grpcclient.InferenceServerClient(running.grpc_url)
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            client.async_stream_infer("returns_while_decoupled", [_input(1, grpcclient)])
            _, error = answers.get(timeout=20)
            assert isinstance(error, InferenceServerException)
            assert "is using the decoupled mode and the execute function must return None." in error.message()
        finally:
            client.stop_stream()
        # A non-decoupled model's sender still answers in-process (when execute returns).
        result = client.infer("sends_then_works", [_input(4, grpcclient)], client_timeout=30)
        assert result.as_numpy("OUT").tolist() == [8]
    finally:
        running.stop()
