"""The router writes executions and reads the worker's answers inline (router.py: Request and small Tensor records
as bare tuples, small outputs read in place): what it sends must be what ``Channel.pack`` makes, and what it hands
the scheduler what ``Channel.unpack`` reads, for every kind of tensor, with the execution's phases as before. Driven
directly (the worker's end of the channel in this thread), then through a server and a real client."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from naiad.backends.base import Execution
from naiad.backends.python import messages as M
from naiad.backends.python.router import Router
from naiad.backends.python.shm import Arena
from naiad.backends.python.transport import INLINE_TENSOR, Channel
from naiad.core.datatypes import BF16
from naiad.core.errors import Code
from naiad.core.request import InferRequest
from tests.backends.python import models as m
from tests.server import RunningServer

ARRAYS: dict[str, np.ndarray] = {
    "FP32_1D": np.arange(4, dtype=np.float32),
    "FP32_2D": np.arange(6, dtype=np.float32).reshape(2, 3),
    "FP16_3D": np.arange(24, dtype=np.float16).reshape(2, 3, 4),
    "INT64_0D": np.array(7, dtype=np.int64),
    "EMPTY": np.zeros((0, 3), dtype=np.int32),
    "STRIDED": np.arange(20, dtype=np.float64).reshape(4, 5)[:, ::2],  # not contiguous
    "BIG": np.arange(INLINE_TENSOR // 4 + 1, dtype=np.float32).reshape(-1, 1),  # through shared memory
    "BYTES": np.array([b"one", b"", b"three"], dtype=np.object_),
    "BF16": np.array([1.5, -2.0], dtype=BF16),
}


class _Loop:
    """What the router asks of the event loop here: a turn's end it is told about (the test flushes)."""

    def call_soon(self, callback: object) -> object:
        return callback


@pytest.fixture()
def ends() -> Iterator[tuple[Router, Channel]]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server_end, worker_end = Channel(a, Arena(1 << 20, 1 << 20)), Channel(b, Arena(1 << 20, 1 << 20), blocking=True)
    router = Router("m_0", "m", 1, False, None, lambda: None, lambda requests, done: None)
    router.bind(server_end)
    router.ready = True
    router.loop = _Loop()  # type: ignore[assignment]
    yield router, worker_end
    server_end.close()
    worker_end.close()


def _equal(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype == np.object_:
        assert [bytes(x) for x in got.ravel()] == [bytes(x) for x in want.ravel()]
    else:
        assert got.tobytes() == want.tobytes()


def _execute(router: Router, worker: Channel, requests: list[InferRequest]) -> tuple:
    """Submit one execution; the EXECUTE message the worker reads."""
    finished: list[Execution] = []
    router.submit(requests, finished.append)
    router.flush()
    worker.wait_readable(5)
    (message,) = worker.receive()
    router.finished = finished  # type: ignore[attr-defined]
    return message


def test_inputs_leave_as_channel_pack_writes_them(ends: tuple[Router, Channel]) -> None:
    router, worker = ends
    request = InferRequest("m", "", "id-1", dict(ARRAYS), ["OUT"], {"p": 1})
    request.correlation_id, request.flags, request.timeout_us = 5, 1, 1000
    message = _execute(router, worker, [request])
    execute = M.Execute.of(message)  # type: ignore[attr-defined]
    (wire,) = execute.requests
    got = M.Request.of(wire)  # type: ignore[attr-defined]
    assert (got.id, got.correlation_id, got.flags, got.timeout, got.parameters, got.requested) == (
        "id-1", 5, 1, 1000, {"p": 1}, ["OUT"])
    assert [record[0] for record in got.inputs] == list(ARRAYS)
    packer = Channel(socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET), Arena(1 << 20, 1 << 20))
    try:
        for record, (name, array) in zip(got.inputs, ARRAYS.items()):
            if isinstance(record[3], bytes):  # inline: exactly the record pack makes
                assert record == packer.pack(name, array), name
            else:
                assert name == "BIG"
            unpacked_name, unpacked = worker.unpack(False, *record)
            assert unpacked_name == name
            _equal(unpacked, array)
    finally:
        packer.close()


def test_answers_read_as_channel_unpack_reads_them(ends: tuple[Router, Channel]) -> None:
    router, worker = ends
    requests = [InferRequest("m", "", f"r{i}", {"IN": np.zeros(1, np.float32)}) for i in range(3)]
    message = _execute(router, worker, requests)
    tag = M.Execute.of(message).tag  # type: ignore[attr-defined]
    with worker.lock:
        outputs = [worker.pack(name, array) for name, array in ARRAYS.items()]
    responses = [M.response(None, outputs, {"answer": 42}),
                 M.error_response("INVALID_ARG", "bad input"),  # one request's own error among answers
                 M.response(None, outputs[:1], None)]
    worker.send(M.done(tag, None, responses, 1_000, 2_000_000_000, 500, 0, None))
    router.on_readable()
    (execution,) = router.finished  # type: ignore[attr-defined]
    assert execution.failed is False and not router.pending
    first, second, third = execution.responses
    assert [r.id for r in execution.responses] == ["r0", "r1", "r2"]
    assert (first.model_name, first.model_version, first.parameters) == ("m", "1", {"answer": 42})
    assert list(first.outputs) == list(ARRAYS)
    for name, array in ARRAYS.items():
        _equal(first.outputs[name], array)
    assert second.error is not None and second.error.code is Code.INVALID_ARG and second.error.message == "bad input"
    assert second.outputs == {}
    assert list(third.outputs) == ["FP32_1D"] and third.parameters == {}
    # The phases: the worker's figures, plus the host's own packing and reading; infer at least the worker's.
    assert execution.input_ns >= 1_000 and execution.output_ns >= 500 and execution.infer_ns == 2_000_000_000
    assert execution.started_ns > 0 and execution.rescheduled is None


def test_the_instance_was_busy_until_the_worker_says_so(ends: tuple[Router, Channel]) -> None:
    router, worker = ends
    request = InferRequest("m", "", "", {"IN": np.zeros(1, np.float32)})
    message = _execute(router, worker, [request])
    tag = M.Execute.of(message).tag  # type: ignore[attr-defined]
    submitted = router.pending[tag].submitted
    free = submitted + 10_000_000  # the worker finished the execution before this one 10 ms after the hand-over
    worker.send(M.done(tag, None, [M.response(None, [], None)], 0, 0, 0, free, None))
    router.on_readable()
    (execution,) = router.finished  # type: ignore[attr-defined]
    assert execution.started_ns == free


def test_a_failed_execution_still_fails_every_request(ends: tuple[Router, Channel]) -> None:
    router, worker = ends
    requests = [InferRequest("m", "", f"r{i}", {"IN": np.zeros(1, np.float32)}) for i in range(2)]
    message = _execute(router, worker, requests)
    tag = M.Execute.of(message).tag  # type: ignore[attr-defined]
    worker.send(M.done(tag, M.error("INTERNAL", "boom"), None, 0, 0, 0, 0, None))
    router.on_readable()
    (execution,) = router.finished  # type: ignore[attr-defined]
    assert execution.failed is True
    assert [(r.id, r.error.code, r.error.message) for r in execution.responses] == [  # type: ignore[union-attr]
        ("r0", Code.INTERNAL, "boom"), ("r1", Code.INTERNAL, "boom")]


# --- through a server --------------------------------------------------------------------------------------------

ECHO = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            if pb_utils.get_input_tensor_by_name(r, "FAIL").as_numpy().any():
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("asked to fail")))
                continue
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("MATRIX_OUT", pb_utils.get_input_tensor_by_name(r, "MATRIX").as_numpy() * 2),
                pb_utils.Tensor("TEXT_OUT", pb_utils.get_input_tensor_by_name(r, "TEXT").as_numpy()),
                pb_utils.Tensor("BIG_OUT", pb_utils.get_input_tensor_by_name(r, "BIG").as_numpy() + 1)]))
        return out
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo: Path = tmp_path_factory.mktemp("router")
    config = m.io_config("echo", [("MATRIX", "TYPE_FP16", "[ 2, 3 ]"), ("TEXT", "TYPE_STRING", "[ -1 ]"),
                                  ("BIG", "TYPE_FP32", "[ -1 ]"), ("FAIL", "TYPE_BOOL", "[ 1 ]")],
                         [("MATRIX_OUT", "TYPE_FP16", "[ 2, 3 ]"), ("TEXT_OUT", "TYPE_STRING", "[ -1 ]"),
                          ("BIG_OUT", "TYPE_FP32", "[ -1 ]")],
                         "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 2000 }")
    m.write(repo, "echo", config, ECHO)
    running = RunningServer([repo])
    yield running
    running.stop()


def _ask(url: str, i: int, fail: bool, results: dict[int, object]) -> None:
    client = httpclient.InferenceServerClient(url)
    matrix = np.arange(6, dtype=np.float16).reshape(1, 2, 3) + i
    text = np.array([[f"text {i}".encode(), b""]], dtype=np.object_)
    big = np.arange(INLINE_TENSOR, dtype=np.float32).reshape(1, -1) * i  # 4 x the inline size: shared memory
    inputs = []
    for name, array, datatype in (("MATRIX", matrix, "FP16"), ("TEXT", text, "BYTES"), ("BIG", big, "FP32"),
                                  ("FAIL", np.array([[fail]]), "BOOL")):
        tensor = httpclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=True)
        inputs.append(tensor)
    try:
        result = client.infer("echo", inputs)
    except InferenceServerException as exc:
        results[i] = exc.message()
        return
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("MATRIX_OUT"), matrix * 2)
    assert result.as_numpy("MATRIX_OUT").dtype == np.float16
    assert result.as_numpy("TEXT_OUT").tolist() == text.tolist()
    np.testing.assert_array_equal(result.as_numpy("BIG_OUT"), big + 1)
    results[i] = "ok"


def test_every_kind_of_tensor_and_an_error_among_answers(server: RunningServer) -> None:
    # Concurrent requests, batched by the dynamic batcher into executions with one failing request among others.
    results: dict[int, object] = {}
    threads = [threading.Thread(target=_ask, args=(f"127.0.0.1:{server.http_port}", i, i % 3 == 1, results))
               for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == {i: ("asked to fail" if i % 3 == 1 else "ok") for i in range(12)}
