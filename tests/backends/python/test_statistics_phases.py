"""``/v2/models/<m>/stats`` phases that mean what Triton's mean, for a Python model behind its worker process:
queue is the time a request waits for the instance (also while it waits in the worker's pipeline behind other
executions), and compute covers the instance's whole work, the round trip to the worker included, so that
perf_analyzer's "overhead" (success minus queue minus compute) stays small. Driven with concurrent tritonclient
requests against a running server."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.backends.python import models as m
from tests.server import RunningServer

WORK_S = 0.05
SLEEPS = f"""
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            time.sleep({WORK_S})
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy())]))
        return out
"""
CONCURRENCY = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo: Path = tmp_path_factory.mktemp("phases")
    m.write(repo, "sleeps", m.io_config("sleeps", [("IN", "TYPE_INT32", "[ 1 ]")], [("OUT", "TYPE_INT32", "[ 1 ]")]),
            SLEEPS)
    running = RunningServer([repo])
    yield running
    running.stop()


def _infer(url: str, value: int) -> int:
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    tensor = httpclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], np.int32))
    return int(client.infer("sleeps", [tensor]).as_numpy("OUT")[0])


def _per_request_ms(stats: dict, phase: str) -> float:
    entry = stats["inference_stats"][phase]
    return entry["ns"] / max(entry["count"], 1) / 1e6


def test_waiting_for_the_instance_is_queue_time_and_the_rest_is_compute(server: RunningServer) -> None:
    rounds = 2
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        for _ in range(rounds):
            assert list(pool.map(lambda v: _infer(server.url, v), range(CONCURRENCY))) == list(range(CONCURRENCY))
    client = httpclient.InferenceServerClient(server.url)
    stats = client.get_inference_statistics("sleeps")["model_stats"][0]
    count = CONCURRENCY * rounds
    assert stats["inference_stats"]["success"]["count"] == count
    queue_ms = _per_request_ms(stats, "queue")
    infer_ms = _per_request_ms(stats, "compute_infer")
    compute_ms = sum(_per_request_ms(stats, p) for p in ("compute_input", "compute_infer", "compute_output"))
    success_ms = _per_request_ms(stats, "success")
    # One instance, CONCURRENCY requests at once, WORK_S each: on average a request waits for several others
    # (ideally (CONCURRENCY - 1) / 2 of them: 175 ms). Before, queue stayed at microseconds.
    assert queue_ms > 2 * WORK_S * 1e3, f"queue {queue_ms:.1f} ms per request"
    assert infer_ms >= WORK_S * 1e3 * 0.9, f"compute infer {infer_ms:.1f} ms per request"
    # What is neither queue nor compute (perf_analyzer's server overhead) is the front end's own small share.
    overhead_ms = success_ms - queue_ms - compute_ms
    assert -1.0 < overhead_ms < 0.2 * WORK_S * 1e3, (
        f"overhead {overhead_ms:.2f} ms (success {success_ms:.1f}, queue {queue_ms:.1f}, compute {compute_ms:.1f})")


def test_an_idle_instance_counts_the_round_trip_as_compute(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    before = client.get_inference_statistics("sleeps")["model_stats"][0]["inference_stats"]
    for value in range(5):
        assert _infer(server.url, value) == value
    after = client.get_inference_statistics("sleeps")["model_stats"][0]["inference_stats"]
    n = after["success"]["count"] - before["success"]["count"]
    assert n == 5

    def delta(phase: str) -> float:
        return (after[phase]["ns"] - before[phase]["ns"]) / n / 1e6

    # One request at a time: nothing waits for the instance, and the request's whole time is compute.
    assert delta("queue") < 0.2 * WORK_S * 1e3
    compute = delta("compute_input") + delta("compute_infer") + delta("compute_output")
    assert delta("success") - delta("queue") - compute < 0.2 * WORK_S * 1e3
