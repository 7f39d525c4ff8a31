"""The dynamic batcher through a live server and tritonclient.http: batches formed from concurrent requests
(and reported in /stats batch_stats), preferred sizes and queue delay, priorities, queue policies (timeouts
REJECT / DELAY, per-request timeout override, max_queue_size), non-ragged shapes, requests with a batch
dimension above 1, and preserve_ordering."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.models import write_model
from tests.server import RunningServer

# Echoes INPUT0 and reports, per request, how many requests its execution held (BATCH) and the order in which
# executions ran (SEQ). A first element of -1 holds the instance for GATE seconds so that others queue behind it.
MODEL = """
    import asyncio
    import numpy as np
    import triton_python_backend_utils as pb_utils

    GATE = {gate}

    class TritonPythonModel:
        def initialize(self, args):
            self.executions = 0

        async def execute(self, requests):
            seq = self.executions
            self.executions += 1
            first = requests[0].inputs()[0].as_numpy().reshape(-1)
            await asyncio.sleep(GATE if first.size and first[0] == -1 else {pause})
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
                rows = x.shape[0]
                out.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUTPUT0", x),
                    pb_utils.Tensor("BATCH", np.full((rows, 1), len(requests), np.int32)),
                    pb_utils.Tensor("SEQ", np.full((rows, 1), seq, np.int32)),
                ]))
            return out
"""


def config(name: str, batching: str, max_batch_size: int = 8, dims: str = "[ 2 ]", ragged: bool = False,
           instances: int = 1) -> str:
    return f"""
        name: "{name}"
        backend: "python"
        max_batch_size: {max_batch_size}
        input [{{ name: "INPUT0", data_type: TYPE_FP32, dims: {dims} {"allow_ragged_batch: true" if ragged else ""} }}]
        output [{{ name: "OUTPUT0", data_type: TYPE_FP32, dims: {dims} }},
                {{ name: "BATCH", data_type: TYPE_INT32, dims: [ 1 ] }},
                {{ name: "SEQ", data_type: TYPE_INT32, dims: [ 1 ] }}]
        dynamic_batching {{ {batching} }}
        instance_group [{{ count: {instances}, kind: KIND_CPU }}]
    """


MODELS = {
    "batcher": (config("batcher", ""), 0.4, 0.05),
    "preferred": (config("preferred", "preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 800000"), 0.4, 0),
    "full": (config("full", "default_queue_policy { max_queue_size: 2 }", max_batch_size=1), 0.5, 0),
    "expire": (config("expire", "default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 100000 }",
                      max_batch_size=1), 0.5, 0),
    "delay": (config("delay", "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 1000 }",
                     max_batch_size=1), 0.3, 0),
    "override": (config("override", "default_queue_policy { default_timeout_microseconds: 60000000 "
                                    "allow_timeout_override: true }", max_batch_size=1), 0.5, 0),
    "priority": (config("priority", "priority_levels: 2 default_priority_level: 2", max_batch_size=1), 0.5, 0),
    "shapes": (config("shapes", "", dims="[ -1 ]"), 0.5, 0),
    "ragged": (config("ragged", "", dims="[ -1 ]", ragged=True), 0.5, 0),
    "rows": (config("rows", "", max_batch_size=4), 0.5, 0),
    "ordered": (config("ordered", "preserve_ordering: true", max_batch_size=1, instances=2), 0.6, 0),
    "unordered": (config("unordered", "", max_batch_size=1, instances=2), 0.6, 0),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo: Path = tmp_path_factory.mktemp("dynamic")
    for name, (cfg, gate, pause) in MODELS.items():
        write_model(repo, name, cfg, MODEL.format(gate=gate, pause=pause))
    running = RunningServer([repo])
    yield running
    running.stop()


def _input(value: float | np.ndarray, rows: int = 1, width: int = 2) -> list[httpclient.InferInput]:
    data = value if isinstance(value, np.ndarray) else np.full((rows, width), value, np.float32)
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return [tensor]


def _stats(server: RunningServer, model: str) -> dict:
    with httpclient.InferenceServerClient(server.url) as client:
        return client.get_inference_statistics(model)["model_stats"][0]


def _batches(stats: dict) -> dict[int, int]:
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}


def _concurrently(server: RunningServer, model: str, calls: list[dict], stagger: float = 0.0) -> list:
    """Send each call ({"value", "rows", "priority", "timeout", ...}) from its own thread; results in call order
    (an InferResult or the InferenceServerException), plus each call's completion time."""
    results: list = [None] * len(calls)
    finished = [0.0] * len(calls)

    def one(i: int, call: dict) -> None:
        with httpclient.InferenceServerClient(server.url) as client:
            try:
                results[i] = client.infer(model, _input(call.get("value", i), call.get("rows", 1),
                                                        call.get("width", 2)),
                                          priority=call.get("priority", 0), timeout=call.get("timeout"))
            except InferenceServerException as exc:
                results[i] = exc
            finished[i] = time.monotonic()

    threads = [threading.Thread(target=one, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
        if stagger:
            time.sleep(stagger)
    for thread in threads:
        thread.join()
    return list(zip(results, finished))


def test_32_concurrent_requests_form_the_batches_stats_report(server: RunningServer) -> None:
    with httpclient.InferenceServerClient(server.url, concurrency=32) as client:
        pending = [client.async_infer("batcher", _input(float(i))) for i in range(32)]
        results = [p.get_result() for p in pending]
    for i, result in enumerate(results):  # every request got its own rows back
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 2), i, np.float32))
    stats = _stats(server, "batcher")
    batches = _batches(stats)
    assert sum(size * count for size, count in batches.items()) == 32
    assert max(batches) <= 8 and max(batches) > 1
    assert stats["inference_count"] == 32
    assert stats["execution_count"] == sum(batches.values()) < 32
    # The batch each request saw in the model is the one /stats counted.
    seen: dict[int, int] = {}
    for result in results:
        seen[int(result.as_numpy("SEQ")[0, 0])] = int(result.as_numpy("BATCH")[0, 0])
    assert sorted(seen.values()) == sorted(size for size, count in batches.items() for _ in range(count))


def test_preferred_size_sends_at_once_and_the_queue_delay_sends_the_rest(server: RunningServer) -> None:
    started = time.monotonic()
    results = _concurrently(server, "preferred", [{"value": i} for i in range(4)])
    assert {int(r.as_numpy("BATCH")[0, 0]) for r, _ in results} == {4}
    assert max(t for _, t in results) - started < 0.75  # did not wait out the 0.8 s delay
    started = time.monotonic()
    results = _concurrently(server, "preferred", [{"value": i} for i in range(3)])
    assert {int(r.as_numpy("BATCH")[0, 0]) for r, _ in results} == {3}
    assert max(t for _, t in results) - started >= 0.75  # held for the delay, hoping for a 4th
    assert _batches(_stats(server, "preferred")) == {3: 1, 4: 1}


def test_max_queue_size_rejects_with_503(server: RunningServer) -> None:
    # One request runs (0.5 s), two may wait, the rest are refused at once.
    results = _concurrently(server, "full", [{"value": -1}] + [{"value": i} for i in range(1, 6)], stagger=0.02)
    errors = [r for r, _ in results if isinstance(r, InferenceServerException)]
    assert len(errors) >= 1  # 3 when all six arrive while the first runs, as they should
    for error in errors:
        assert error.status() == "503"
        assert error.message().endswith("Exceeds maximum queue size")
    stats = _stats(server, "full")
    assert stats["inference_stats"]["success"]["count"] == 6 - len(errors) <= 3
    assert stats["inference_stats"]["fail"]["count"] == 0  # refused at the door: not counted, as in Triton


def test_queue_timeout_rejects_with_503_and_counts_failures(server: RunningServer) -> None:
    results = _concurrently(server, "expire", [{"value": -1}, {"value": 1}, {"value": 2}], stagger=0.02)
    assert isinstance(results[0][0], httpclient.InferResult)
    for result, _ in results[1:]:
        assert isinstance(result, InferenceServerException)
        assert result.status() == "503" and result.message() == "Request timeout expired"
    stats = _stats(server, "expire")["inference_stats"]
    assert stats["success"]["count"] == 1 and stats["fail"]["count"] == 2


def test_delay_action_keeps_expired_requests(server: RunningServer) -> None:
    results = _concurrently(server, "delay", [{"value": -1}, {"value": 1}, {"value": 2}], stagger=0.02)
    assert all(isinstance(r, httpclient.InferResult) for r, _ in results)


def test_request_timeout_overrides_a_longer_default(server: RunningServer) -> None:
    calls = [{"value": -1}, {"value": 1, "timeout": 50_000}, {"value": 2}]
    results = _concurrently(server, "override", calls, stagger=0.02)
    assert isinstance(results[1][0], InferenceServerException)
    assert results[1][0].message() == "Request timeout expired"
    assert isinstance(results[2][0], httpclient.InferResult)  # no timeout of its own: the 60 s default


def test_higher_priority_runs_first(server: RunningServer) -> None:
    calls = [{"value": -1}] + [{"value": i, "priority": 2} for i in range(1, 4)] + [{"value": 9, "priority": 1}]
    results = _concurrently(server, "priority", calls, stagger=0.03)
    order = {int(r.as_numpy("OUTPUT0")[0, 0]): int(r.as_numpy("SEQ")[0, 0]) for r, _ in results}
    assert order[9] == 1  # right after the request holding the instance
    assert sorted(order[i] for i in (1, 2, 3)) == [2, 3, 4]


def test_different_shapes_are_not_mixed_unless_ragged(server: RunningServer) -> None:
    # Queued behind the gate in this order: the batcher takes requests in order and stops at the first whose
    # variable dimension differs, as Triton does.
    calls = [{"value": -1, "width": 1}] + [{"value": i, "width": w} for i, w in enumerate((2, 2, 3, 3, 2), 1)]
    results = _concurrently(server, "shapes", calls, stagger=0.03)
    assert [int(r.as_numpy("BATCH")[0, 0]) for r, _ in results[1:]] == [2, 2, 2, 2, 1]
    results = _concurrently(server, "ragged", calls, stagger=0.03)
    assert [int(r.as_numpy("BATCH")[0, 0]) for r, _ in results[1:]] == [5, 5, 5, 5, 5]


def test_requests_with_several_rows_count_toward_max_batch_size(server: RunningServer) -> None:
    calls = [{"value": -1}] + [{"value": i, "rows": 3} for i in range(1, 4)]
    results = _concurrently(server, "rows", calls, stagger=0.03)
    for result, _ in results[1:]:
        assert result.as_numpy("OUTPUT0").shape == (3, 2)
        assert int(result.as_numpy("BATCH")[0, 0]) == 1  # 3 + 3 > 4: one request per execution
    stats = _stats(server, "rows")
    assert _batches(stats) == {1: 1, 3: 3}
    assert stats["inference_count"] == 10


def test_preserve_ordering_releases_responses_in_batch_order(server: RunningServer) -> None:
    # The first request holds one instance 0.6 s; the second runs at once on the other instance and, unless
    # ordering is preserved, answers at once.
    started = time.monotonic()
    results = _concurrently(server, "unordered", [{"value": -1}, {"value": 1}], stagger=0.05)
    assert results[1][1] - started < 0.4 <= results[0][1] - started
    started = time.monotonic()
    results = _concurrently(server, "ordered", [{"value": -1}, {"value": 1}], stagger=0.05)
    assert results[1][1] - started >= 0.55


def test_priority_and_timeout_over_grpc(server: RunningServer) -> None:
    import tritonclient.grpc as grpcclient

    results: list = [None] * 3

    def one(i: int, value: float, timeout: int | None) -> None:
        tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.full((1, 2), value, np.float32))
        with grpcclient.InferenceServerClient(server.grpc_url) as c:
            try:
                kwargs = {"timeout": timeout} if timeout else {}
                results[i] = c.infer("override", [tensor], priority=1, **kwargs)
            except grpcclient.InferenceServerException as exc:
                results[i] = exc

    threads = [threading.Thread(target=one, args=args) for args in ((0, -1, None), (1, 1, 50_000), (2, 2, None))]
    for thread in threads:
        thread.start()
        time.sleep(0.03)
    for thread in threads:
        thread.join()
    assert isinstance(results[1], grpcclient.InferenceServerException)
    assert results[1].status() == "StatusCode.UNAVAILABLE" and results[1].message() == "Request timeout expired"
    assert isinstance(results[2], grpcclient.InferResult)
