"""The default scheduler's path for an idle fast model: a request run within ``enqueue`` (``execute_now``) is
answered at once and counted as any other execution is."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from naiad.backends import threaded
from naiad.backends.base import Execution
from naiad.backends.threaded import ThreadedInstance
from naiad.config.loader import parse_config_text
from naiad.core.errors import invalid
from naiad.core.request import InferRequest, InferResponse
from naiad.core.stats import ModelStats
from naiad.scheduling.default import DefaultScheduler
from naiad.scheduling.rate_limiter import RateLimiter

CONFIG = parse_config_text("""
    name: "double"
    max_batch_size: 8
    input [{ name: "IN", data_type: TYPE_FP32, dims: [ 2 ] }]
    output [{ name: "OUT", data_type: TYPE_FP32, dims: [ 2 ] }]
    instance_group [{ count: 1, rate_limiter { resources [{ name: "R", count: 1 }] } }]
""")


class Double(ThreadedInstance):
    """Doubles its input; fails on a negative one. Keeps what ``execute_now`` returned."""

    def __init__(self) -> None:
        super().__init__("double_0", "double", 1, CONFIG)
        self.now: list[Execution | None] = []

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if (inputs["IN"] < 0).any():
            raise invalid("negative input")
        return {"OUT": inputs["IN"] * 2}

    def execute_now(self, request: InferRequest) -> Execution | None:
        execution = super().execute_now(request)
        self.now.append(execution)
        return execution


def _request(value: float) -> InferRequest:
    request = InferRequest("double", id=str(value), inputs={"IN": np.full((1, 2), value, dtype=np.float32)})
    request.batch_size = 1
    request.arrival_ns = time.perf_counter_ns()
    return request


async def _warm(instance: Double) -> None:
    # Inline only once the instance has seen a few fast runs on its thread.
    for _ in range(threaded._WARMUP_RUNS):
        await instance.execute([_request(1.0)])  # type: ignore[misc]
    assert instance.inline


@pytest.mark.parametrize("limited", [False, True])
def test_an_idle_fast_model_answers_within_enqueue_and_is_counted(monkeypatch: pytest.MonkeyPatch,
                                                                  limited: bool) -> None:
    monkeypatch.setattr(threaded, "INLINE_BELOW_NS", 20_000_000)  # "fast" whatever the box's load
    instance = Double()
    stats = ModelStats()
    limiter = RateLimiter() if limited else None
    if limiter is not None:
        limiter.register(CONFIG, [instance])
    scheduler = DefaultScheduler([instance], stats, limiter)
    answers: list[tuple[InferRequest, InferResponse, bool | str]] = []

    async def main() -> None:
        await _warm(instance)
        # The resource's one unit comes back with each answer: the next request runs inline too.
        for value in (1.0, 2.0, -1.0):
            scheduler.enqueue(_request(value), lambda *answer: answers.append(answer))
            assert len(answers) == len(instance.now)  # answered before enqueue returned

    try:
        asyncio.run(main())
    finally:
        instance.finalize()
    assert all(execution is not None for execution in instance.now) and scheduler.pending == 0
    (first, one, _), (second, two, _), (third, failed, reason) = answers
    np.testing.assert_array_equal(one.outputs["OUT"], [[2.0, 2.0]])
    np.testing.assert_array_equal(two.outputs["OUT"], [[4.0, 4.0]])
    assert reason is True and failed.error is not None and failed.error.message == "negative input"
    # As any execution: two inferences, three executions of batch 1, and the queue time of the two that succeeded
    # ends when their instance started them.
    ran = [e for e in instance.now if e is not None]
    assert (stats.execution_count, stats.inference_count) == (3, 2)
    assert stats.queue.count == 2 and stats.queue.ns == sum(e.started_ns - r.arrival_ns
                                                              for e, r in zip(ran, (first, second)))
    assert stats.compute_infer.count == 2 and stats.compute_infer.ns == ran[0].infer_ns + ran[1].infer_ns
    assert stats.batch[1][1].count == 3
    assert all(e.started_ns >= r.arrival_ns for e, r in zip(ran, (first, second, third)))


def test_a_model_busy_on_its_thread_is_not_run_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threaded, "INLINE_BELOW_NS", 20_000_000)
    release = threading.Event()

    class Held(Double):
        def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            if inputs["IN"][0, 0] == 9.0:
                release.wait(5)
            return super().run(inputs)

    instance = Held()
    scheduler = DefaultScheduler([instance], ModelStats())
    answers: list[InferResponse] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        warm = [loop.create_future() for _ in range(threaded._WARMUP_RUNS)]
        for future in warm:  # on the thread (not inline yet), which learns from them that the model is fast
            instance.submit([_request(1.0)], future.set_result)
        held = loop.create_future()
        instance.submit([_request(9.0)], held.set_result)  # behind them, and held there
        await asyncio.gather(*warm)
        assert instance.inline and not held.done()
        scheduler.enqueue(_request(3.0), lambda _, response, __: answers.append(response))
        assert instance.now == [None] and not answers  # behind the held one, on the thread: not beside it
        release.set()
        await held
        while not answers:
            await asyncio.sleep(0.001)

    try:
        asyncio.run(main())
    finally:
        release.set()
        instance.finalize()
    np.testing.assert_array_equal(answers[0].outputs["OUT"], [[6.0, 6.0]])


def test_a_deep_queue_drained_by_inline_executions_answers_every_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst queued behind a busy instance (a model host back from a stall): each inline execution's completion
    dispatches the next; that must be a loop, not a recursion as deep as the queue (before: RecursionError, answers
    lost)."""
    monkeypatch.setattr(threaded, "INLINE_BELOW_NS", 20_000_000)
    release = threading.Event()

    class Held(Double):
        def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            if inputs["IN"][0, 0] == 0.0:
                release.wait(5)
            return super().run(inputs)

    instance = Held()
    scheduler = DefaultScheduler([instance], ModelStats())
    answers: list[InferResponse] = []
    count = 5000

    async def main() -> None:
        await _warm(instance)
        held = _request(0.0)
        instance.inline = False  # the first runs on the thread and holds the instance while the burst queues
        scheduler.enqueue(held, lambda _, response, __: answers.append(response))
        instance.inline = True
        for value in range(1, count):
            scheduler.enqueue(_request(float(value)), lambda _, response, __: answers.append(response))
        assert len(answers) == 0 and scheduler.pending == count
        release.set()
        while len(answers) < count:
            await asyncio.sleep(0.01)

    try:
        asyncio.run(main())
    finally:
        instance.finalize()
    assert [r.error for r in answers if r.error is not None] == []
    assert sorted(float(r.outputs["OUT"][0, 0]) for r in answers) == [2.0 * v for v in range(count)]
