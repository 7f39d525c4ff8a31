"""ThreadedInstance: a batch of requests runs once on the instance's own thread and is split back per request."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from naiad.backends.base import Execution
from naiad.backends.threaded import ThreadedInstance
from naiad.config.loader import parse_config_text
from naiad.core.errors import invalid
from naiad.core.request import InferRequest

CONFIG = parse_config_text("""
    name: "double"
    max_batch_size: 8
    input [{ name: "IN", data_type: TYPE_FP32, dims: [ 2 ] }]
    output [{ name: "OUT", data_type: TYPE_FP32, dims: [ 2 ] }]
""")


class Double(ThreadedInstance):
    def __init__(self) -> None:
        super().__init__("double_0", "double", 1, CONFIG)
        self.calls: list[tuple[str, tuple[int, ...]]] = []

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls.append((threading.current_thread().name, inputs["IN"].shape))
        if (inputs["IN"] < 0).any():
            raise invalid("negative input")
        return {"OUT": inputs["IN"] * 2}


def _request(rows: int, start: float) -> InferRequest:
    request = InferRequest("double", id=f"r{rows}", inputs={"IN": np.full((rows, 2), start, dtype=np.float32)})
    request.batch_size = rows
    return request


def _execute(instance: Double, requests: list[InferRequest]) -> Execution:
    async def main() -> Execution:
        result = instance.execute(requests)
        assert not isinstance(result, Execution)  # the work happens off the event loop
        return await result

    try:
        return asyncio.run(main())
    finally:
        instance.finalize()


def test_batch_runs_once_and_splits() -> None:
    instance = Double()
    requests = [_request(1, 1.0), _request(3, 2.0), _request(2, 3.0)]
    result = _execute(instance, requests)
    assert len(instance.calls) == 1
    thread, shape = instance.calls[0]
    assert thread.startswith("naiad-double_0") and shape == (6, 2)
    assert not result.failed and result.infer_ns > 0
    for request, response in zip(requests, result.responses):
        assert response.id == request.id and response.error is None
        np.testing.assert_array_equal(response.outputs["OUT"], request.inputs["IN"] * 2)


def test_failed_batch_fails_every_request() -> None:
    instance = Double()
    result = _execute(instance, [_request(1, 1.0), _request(2, -1.0)])
    assert result.failed
    assert [r.error.message for r in result.responses] == ["negative input", "negative input"]


def test_fast_models_run_inline_until_a_slow_call(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from naiad.backends import threaded

    # A threshold far above a loaded CI box's jitter: "fast" must not depend on how busy the machine is.
    monkeypatch.setattr(threaded, "INLINE_BELOW_NS", 20_000_000)

    class Sleepy(Double):
        delay = 0.0

        def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            time.sleep(self.delay)
            return super().run(inputs)

    instance = Sleepy()

    async def main() -> None:
        for _ in range(threaded._WARMUP_RUNS):
            result = instance.execute([_request(1, 1.0)])
            assert not isinstance(result, Execution)
            await result
        assert instance.inline
        result = instance.execute([_request(1, 1.0)])
        assert isinstance(result, Execution)  # answered on the loop: no thread hop
        assert instance.calls[-1][0] == threading.current_thread().name
        instance.delay = threaded.INLINE_BELOW_NS * 8 / 1e9  # one slow call sends the next ones to the thread
        instance.execute([_request(1, 1.0)])
        assert not instance.inline
        pending = instance.execute([_request(1, 1.0)])
        assert not isinstance(pending, Execution)
        await pending

    try:
        asyncio.run(main())
    finally:
        instance.finalize()
