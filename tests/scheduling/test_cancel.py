"""A request whose client went away while it waited in a scheduler's queue is answered CANCELLED without running,
in the default scheduler, the dynamic batcher and the sequence batcher alike (which, as Triton's, also ends the
sequence); the others still run. An ensemble request whose client goes away cancels its steps in flight and starts
no more."""

from __future__ import annotations

import asyncio
import textwrap

import numpy as np
import pytest

from naiad.backends.base import Execution, LoadedVersion
from naiad.config import pb
from naiad.config.loader import parse_config_text
from naiad.config.sequence import SequenceSpec
from naiad.core.errors import Code, InferError
from naiad.core.request import InferRequest, InferResponse
from naiad.core.stats import ModelStats
from naiad.repository.model import ModelVersion
from naiad.scheduling.default import DefaultScheduler
from naiad.scheduling.dynamic import DynamicBatcher
from naiad.scheduling.ensemble import EnsembleVersion
from naiad.scheduling.execution import now_ns
from naiad.scheduling.sequence import SequenceBatcher


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


# --- the sequence batcher: Triton force-ends a sequence whose next request was cancelled -------------------------

START, END = 1, 2


def _sequence_batcher(instance: Held) -> SequenceBatcher:
    # One lane of one slot: a second sequence waits in the backlog.
    direct = pb.ModelSequenceBatching(direct=pb.ModelSequenceBatching.StrategyDirect())
    config = pb.ModelConfig(name="m", max_batch_size=1, sequence_batching=direct)
    return SequenceBatcher(config, [instance], ModelStats(), spec=SequenceSpec())


def _in_sequence(name: str, corrid: int, flags: int) -> InferRequest:
    request = InferRequest("m", id=name)
    request.correlation_id = corrid
    request.flags = flags
    request.arrival_ns = now_ns()
    return request


async def _sequences(steps: list[tuple[str, int, int]], cancelled: set[str]
                     ) -> tuple[SequenceBatcher, list[list[str]], dict[str, tuple[bool | str, Code | None]]]:
    """Enqueue ``steps`` while the first runs, cancel ``cancelled``, then let everything finish."""
    instance = Held()
    instance.release = asyncio.Event()
    batcher = _sequence_batcher(instance)
    outcomes: dict[str, tuple[bool | str, Code | None]] = {}

    def done(request: InferRequest, response: InferResponse, failed: bool | str) -> None:
        outcomes[request.id] = (failed, response.error.code if response.error is not None else None)

    requests = {}
    for name, corrid, flags in steps:
        requests[name] = _in_sequence(name, corrid, flags)
        batcher.enqueue(requests[name], done)
        await asyncio.sleep(0.01)  # the first one runs; the others wait
    for name in cancelled:
        requests[name].cancelled = True
    instance.release.set()
    for _ in range(100):
        await asyncio.sleep(0.01)
        if len(outcomes) == len(steps):
            break
    return batcher, instance.ran, outcomes


def test_a_cancelled_request_ends_its_sequence_and_the_slot_goes_to_the_backlog() -> None:
    async def scenario() -> None:
        batcher, ran, outcomes = await _sequences(
            [("a1", 1, START), ("a2", 1, 0), ("a3", 1, 0), ("b1", 2, START | END)], {"a2"})
        # a1 had run; a2 and the request queued behind it never do; the freed slot serves sequence 2 at once.
        assert ran == [["a1"], ["b1"]]
        assert outcomes == {"a1": (False, None), "a2": ("CANCELED", Code.CANCELLED),
                            "a3": ("CANCELED", Code.CANCELLED), "b1": (False, None)}
        assert batcher.pending == 0
        # Sequence 1 is over: going on with it without START is refused, in Triton's words.
        with pytest.raises(InferError, match="must specify the START flag on the first request of the sequence"):
            batcher.enqueue(_in_sequence("a4", 1, 0), lambda *_: None)
        batcher.stop()

    asyncio.run(scenario())


def test_a_backlogged_sequence_with_a_cancelled_request_is_dropped_whole() -> None:
    async def scenario() -> None:
        batcher, ran, outcomes = await _sequences(
            [("a1", 1, START | END), ("b1", 2, START), ("b2", 2, END), ("c1", 3, START | END)], {"b2"})
        assert ran == [["a1"], ["c1"]]
        assert outcomes == {"a1": (False, None), "b1": ("CANCELED", Code.CANCELLED),
                            "b2": ("CANCELED", Code.CANCELLED), "c1": (False, None)}
        assert batcher.pending == 0
        batcher.stop()

    asyncio.run(scenario())


# --- ensembles: a request whose client goes away cancels its steps -------------------------------------------------

STEP_CONFIG = """
    name: "step"
    backend: "python"
    input [{ name: "X", data_type: TYPE_FP32, dims: [ 2 ] }]
    output [{ name: "Y", data_type: TYPE_FP32, dims: [ 2 ] }]
"""
# Two steps one after the other, both on "step".
ENSEMBLE_CONFIG = """
    name: "ens"
    platform: "ensemble"
    input [{ name: "IN", data_type: TYPE_FP32, dims: [ 2 ] }]
    output [{ name: "OUT", data_type: TYPE_FP32, dims: [ 2 ] }]
    ensemble_scheduling { step [
        { model_name: "step", model_version: -1,
          input_map { key: "X" value: "IN" }, output_map { key: "Y" value: "MID" } },
        { model_name: "step", model_version: -1,
          input_map { key: "X" value: "MID" }, output_map { key: "Y" value: "OUT" } }
    ] }
"""


class HeldStep(Held):
    """``Held`` answering with its input as "Y"."""

    async def execute(self, requests: list[InferRequest]) -> Execution:
        self.ran.append([r.id for r in requests])
        assert self.release is not None
        await self.release.wait()
        return Execution([InferResponse(r.model_name, "1", r.id, {"Y": r.inputs["X"]}) for r in requests])


class HeldVersion(LoadedVersion):
    """One ``HeldStep`` instance; remembers which requests it was told were cancelled (a running one's model would
    see ``is_cancelled()``)."""

    def __init__(self) -> None:
        self.instance = HeldStep()
        self.instances = [self.instance]
        self.told: list[str] = []

    def cancel(self, request: InferRequest) -> None:
        self.told.append(request.id)


def test_an_ensemble_whose_client_goes_away_cancels_its_steps() -> None:
    async def scenario() -> None:
        step_version = HeldVersion()
        step_version.instance.release = asyncio.Event()
        step = ModelVersion("step", 1, parse_config_text(textwrap.dedent(STEP_CONFIG)), {}, step_version, {})
        ensemble = ModelVersion("ens", 1, parse_config_text(textwrap.dedent(ENSEMBLE_CONFIG)), {}, EnsembleVersion(),
                                {}, resolve=lambda name, version: step)
        futures = {}
        for name in ("running", "queued", "kept"):  # the first request's first step runs; the others' wait
            request = InferRequest("ens", id=name, inputs={"IN": np.ones(2, np.float32)})
            futures[name] = ensemble.submit(request)
            await asyncio.sleep(0.01)
        assert step_version.instance.ran == [["running"]]
        futures["running"].cancel()  # its first step is running
        futures["queued"].cancel()  # its first step waits in the step model's queue
        await asyncio.sleep(0.01)
        assert sorted(step_version.told) == ["queued", "running"]
        step_version.instance.release.set()
        response = await asyncio.wait_for(futures["kept"], 10)
        assert response.error is None and response.outputs["OUT"].tolist() == [1.0, 1.0]
        await asyncio.sleep(0.01)
        # "running" never got to its second step; "queued" never ran at all; "kept" ran both.
        assert step_version.instance.ran == [["running"], ["kept"], ["kept"]]
        assert ensemble.stats.fail_reasons["CANCELED"] == 2 and ensemble.stats.success.count == 1
        assert step.stats.fail_reasons["CANCELED"] == 1  # the queued step, dropped by the step's scheduler
        assert ensemble.in_flight == 0 and step.in_flight == 0

    asyncio.run(scenario())
