"""Iterative sequences (``sequence_batching { iterative_sequence: true }``) and request rescheduling, as Triton's
IterativeSequencer and python_backend's ``set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)`` have them:
requests need no correlation id, and a rescheduled request runs again in a later execution, keeping its place,
until the model releases it for good. Driven with tritonclient against a running server."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.models import write_model
from tests.server import RunningServer

# Decoupled: IN is how many responses to give; each execution sends one (OUT = how many remain) and reschedules
# the request until none remain. It logs what each execution saw (correlation id, flags).
COUNTDOWN = """
import json, os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.remaining = {}
        self.log = os.path.join(args["model_repository"], "seen")

    def execute(self, requests):
        for request in requests:
            key = request.correlation_id()
            if key not in self.remaining:
                self.remaining[key] = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            self.remaining[key] -= 1
            left = self.remaining[key]
            with open(self.log, "a") as f:
                f.write(json.dumps([key, request.flags()]) + "\\n")
            response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([left], np.int32))])
            sender = request.get_response_sender()
            if left <= 0:
                del self.remaining[key]
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(response)
        return None
"""

# Not decoupled: the first request it ever sees is rescheduled once (a None in execute's list), as Triton's QA
# model request_rescheduling_addsub does; OUT counts the executions the request took.
RESCHEDULES_FIRST = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.first = True
        self.runs = {}

    def execute(self, requests):
        out = []
        for request in requests:
            key = request.correlation_id()
            self.runs[key] = self.runs.get(key, 0) + 1
            if self.first:
                self.first = False
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                out.append(None)
                continue
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value + 100 * self.runs.pop(key))]))
        return out
"""

CONFIG = """
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    {policy}
    input [ {{ name: "IN", data_type: TYPE_INT32, dims: [ 1 ] }} ]
    output [ {{ name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] }} ]
    sequence_batching {{ iterative_sequence: true }}
    instance_group [ {{ kind: KIND_CPU }} ]
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("iterative")
    write_model(root, "countdown", CONFIG.format(name="countdown", policy="model_transaction_policy { decoupled: true }"),
                COUNTDOWN)
    write_model(root, "reschedules_first", CONFIG.format(name="reschedules_first", policy=""), RESCHEDULES_FIRST)
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[RunningServer]:
    running = RunningServer([repo])
    yield running
    running.stop()


def _input(value: int, module: object = grpcclient) -> object:
    tensor = module.InferInput("IN", [1], "INT32")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(np.array([value], np.int32))
    return tensor


def _countdown(server: RunningServer, counts: list[int]) -> dict[str, list[int]]:
    """Stream one countdown request per count (no sequence id) and collect OUT per request id until each ends."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    got: dict[str, list[int]] = {}
    try:
        for index, count in enumerate(counts):
            client.async_stream_infer("countdown", [_input(count)], request_id=str(index))
        for _ in range(sum(counts)):
            result, error = answers.get(timeout=20)
            if error is not None:
                raise error
            got.setdefault(result.get_response().id, []).append(int(result.as_numpy("OUT")[0]))
    finally:
        client.stop_stream()
    return got


def test_a_rescheduled_decoupled_request_runs_until_released_without_a_sequence_id(server: RunningServer,
                                                                                   repo: Path) -> None:
    assert _countdown(server, [3]) == {"0": [2, 1, 0]}  # (before: "must specify a non-zero ... correlation ID")
    seen = [json.loads(line) for line in (repo / "countdown" / "seen").read_text().splitlines()]
    ids = {corrid for corrid, _ in seen}
    assert len(ids) == 1 and 0 not in ids, "the sequence got an id of its own"
    assert [flags for _, flags in seen] == [1, 0, 0], "START first, then neither START nor END once rescheduled"


def test_sequences_that_need_no_id_run_side_by_side_and_end(server: RunningServer) -> None:
    got = _countdown(server, [4, 2, 3])
    assert got == {"0": [3, 2, 1, 0], "1": [1, 0], "2": [2, 1, 0]}
    # Their slots were given back: more still run (one instance, one slot: a sequence that never ended would
    # hold it and these would wait forever).
    assert _countdown(server, [2, 2]) == {"0": [1, 0], "1": [1, 0]}


def test_a_non_decoupled_request_rescheduled_once_answers_after_its_second_execution(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.url, network_timeout=30)
    first = client.infer("reschedules_first", [_input(5, httpclient)])
    assert first.as_numpy("OUT").tolist() == [205], "answered once, after two executions"
    second = client.infer("reschedules_first", [_input(6, httpclient)])
    assert second.as_numpy("OUT").tolist() == [106]
    stats = client.get_inference_statistics("reschedules_first")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 2
    assert stats["execution_count"] == 3


def test_an_explicit_sequence_still_works_on_an_iterative_model(server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        client.infer("reschedules_first", [_input(1)], sequence_id=4242)
    result = client.infer("reschedules_first", [_input(1)], sequence_id=4243, sequence_start=True)
    assert result.as_numpy("OUT").tolist() == [101]
