"""A request whose client went away while it waited in a scheduler's queue is answered CANCELLED without running,
in the default scheduler and the dynamic batcher alike; the others still run."""

from __future__ import annotations

import asyncio

from naiad.backends.base import Execution
from naiad.config import pb
from naiad.core.errors import Code
from naiad.core.request import InferRequest, InferResponse
from naiad.core.stats import ModelStats
from naiad.scheduling.default import DefaultScheduler
from naiad.scheduling.dynamic import DynamicBatcher


class Held:
    """One instance whose executions finish when the test says so; it records what it ran."""

    name = "held_0"

    def __init__(self) -> None:
        self.ran: list[list[str]] = []
        self.release: asyncio.Event | None = None

    async def execute(self, requests: list[InferRequest]) -> Execution:
        self.ran.append([r.id for r in requests])
        assert self.release is not None
        await self.release.wait()
        return Execution([InferResponse(r.model_name, "1", r.id) for r in requests])


async def _run(scheduler_for) -> tuple[list[list[str]], dict[str, tuple[bool | str, Code | None]]]:
    instance = Held()
    instance.release = asyncio.Event()
    scheduler = scheduler_for(instance)
    outcomes: dict[str, tuple[bool | str, Code | None]] = {}

    def done(request: InferRequest, response: InferResponse, failed: bool | str) -> None:
        outcomes[request.id] = (failed, response.error.code if response.error is not None else None)

    requests = [InferRequest("m", id=name) for name in ("running", "gone", "wanted")]
    for request in requests:
        request.batch_size = 1
        scheduler.enqueue(request, done)
    await asyncio.sleep(0.01)  # the first one runs; the others wait
    requests[1].cancelled = True
    instance.release.set()
    for _ in range(100):
        await asyncio.sleep(0.01)
        if len(outcomes) == 3:
            break
    return instance.ran, outcomes


def test_default_scheduler_drops_a_cancelled_request() -> None:
    ran, outcomes = asyncio.run(_run(lambda instance: DefaultScheduler([instance], ModelStats())))
    assert ran == [["running"], ["wanted"]]
    assert outcomes == {"running": (False, None), "gone": ("CANCELED", Code.CANCELLED), "wanted": (False, None)}


def test_dynamic_batcher_drops_a_cancelled_request() -> None:
    config = pb.ModelConfig(name="m", max_batch_size=1, dynamic_batching=pb.ModelDynamicBatching())
    ran, outcomes = asyncio.run(_run(lambda instance: DynamicBatcher(config, [instance], ModelStats())))
    assert ran == [["running"], ["wanted"]]
    assert outcomes == {"running": (False, None), "gone": ("CANCELED", Code.CANCELLED), "wanted": (False, None)}
