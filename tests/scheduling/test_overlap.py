"""Overlap: while a framework instance (a ``ThreadedInstance``) runs one batch, the dynamic batcher hands it the
next one, which starts the moment the first ends, and the loop answers the first meanwhile.

In-process: only a full batch goes to a busy instance (a partial one waits for an idle instance, so batches are
no smaller than without overlap); the wait behind the running batch is queue time, not compute time; a held batch
whose clients all left does not run. Live: the simulated accelerator (Triton's identity backend with
``execute_delay_ms``), driven by tritonclient over gRPC, reaches 0.9 of ``max_batch_size / delay`` with one
instance, and two instances reach 1.7 times one; the same model as a Python-backend model.py (whose worker
process also takes the next full batch while it runs one) reaches 0.9 too.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from naiad.backends.identity import IdentityBackend
from naiad.backends.threaded import ThreadedInstance
from naiad.config import ModelConfig
from naiad.config.loader import parse_config_text
from naiad.config.scheduling import fill_batching
from naiad.core.errors import Code
from naiad.core.request import InferRequest, InferResponse
from naiad.core.stats import ModelStats
from naiad.scheduling.dynamic import DynamicBatcher
from naiad.scheduling.execution import InstancePool
from naiad.scheduling.rate_limiter import RateLimiter
from tests.server import RunningServer
from tests.simulated import bound, throughput, write_simulated


def _config(max_batch: int, preferred: str = "") -> ModelConfig:
    config = parse_config_text(f"""
        name: "gate"
        max_batch_size: {max_batch}
        dynamic_batching {{ {preferred} }}
        input [{{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }}]
        output [{{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }}]
    """)
    fill_batching(config)  # preferred sizes default to max_batch_size, as the repository fills them
    return config


class Gate(ThreadedInstance):
    """Runs a batch once ``opened`` is set (or after ``delay``), recording its size."""

    def __init__(self, config: ModelConfig, delay: float = 0.0) -> None:
        super().__init__("gate_0", "gate", 1, config)
        self.delay = delay
        self.opened = threading.Event()
        self.sizes: list[int] = []

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.sizes.append(len(inputs["IN"]))
        if self.delay:
            time.sleep(self.delay)
        else:
            assert self.opened.wait(10)
        return {"OUT": inputs["IN"]}


class Client:
    """Enqueues requests into a batcher and collects their outcomes."""

    def __init__(self, batcher: DynamicBatcher) -> None:
        self.batcher = batcher
        self.outcomes: dict[str, tuple[bool | str, Code | None]] = {}
        self.requests: list[InferRequest] = []

    def send(self, count: int) -> list[InferRequest]:
        sent = []
        for _ in range(count):
            request = InferRequest("gate", id=str(len(self.requests)),
                                   inputs={"IN": np.full((1, 1), len(self.requests), np.float32)})
            request.batch_size = 1
            self.requests.append(request)
            self.batcher.enqueue(request, self._done)
            sent.append(request)
        return sent

    def _done(self, request: InferRequest, response: InferResponse, failed: bool | str) -> None:
        self.outcomes[request.id] = (failed, response.error.code if response.error is not None else None)

    async def all_answered(self) -> None:
        for _ in range(1000):
            if len(self.outcomes) == len(self.requests):
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{len(self.requests) - len(self.outcomes)} requests never answered")


def _run(main) -> None:  # type: ignore[no-untyped-def]
    asyncio.run(main())


def test_a_full_batch_goes_to_the_busy_instance_and_runs_right_after() -> None:
    instance = Gate(_config(4))
    stats = ModelStats()

    async def main() -> None:
        client = Client(DynamicBatcher(_config(4), [instance], stats))
        client.send(4)
        await asyncio.sleep(0.05)  # the first batch is running, held at the gate
        client.send(5)
        await asyncio.sleep(0.05)
        # The next full batch is already with the instance, behind the running one; the ninth request waits.
        assert client.batcher._queue.size == 1 and client.batcher.pending == 3
        instance.opened.set()
        await client.all_answered()
        assert instance.sizes == [4, 4, 1]
        assert all(outcome == (False, None) for outcome in client.outcomes.values())
        assert stats.execution_count == 3 and stats.inference_count == 9

    try:
        _run(main)
    finally:
        instance.finalize()


def test_a_partial_batch_waits_for_an_idle_instance() -> None:
    # Preferred sizes 2 and 4: a batch of 2 would be sent at once to an idle instance, but it could still grow.
    instance = Gate(_config(4, "preferred_batch_size: [ 2, 4 ]"))

    async def main() -> None:
        client = Client(DynamicBatcher(_config(4, "preferred_batch_size: [ 2, 4 ]"), [instance], ModelStats()))
        client.send(4)
        await asyncio.sleep(0.05)
        client.send(2)
        await asyncio.sleep(0.02)
        client.send(1)
        await asyncio.sleep(0.05)
        assert client.batcher._queue.size == 3  # nothing went to the busy instance
        instance.opened.set()
        await client.all_answered()
        # As without overlap: the idle instance takes the preferred 2 at once, the last one follows alone.
        assert instance.sizes == [4, 2, 1]

    try:
        _run(main)
    finally:
        instance.finalize()


def test_the_wait_behind_the_running_batch_is_queue_time() -> None:
    delay = 0.1
    instance = Gate(_config(4), delay)
    stats = ModelStats()

    async def main() -> None:
        client = Client(DynamicBatcher(_config(4), [instance], stats))
        client.send(8)  # two full batches: one runs, the other waits on the instance's thread
        await client.all_answered()
        assert instance.sizes == [4, 4]
        # Each request computed ~delay; the second batch's four also waited ~delay in the queue.
        assert stats.compute_infer.count == 8 and stats.queue.count == 8
        assert stats.compute_infer.ns < 8 * delay * 1.5e9
        assert stats.queue.ns > 4 * delay * 0.8e9

    try:
        _run(main)
    finally:
        instance.finalize()


def test_a_held_batch_whose_clients_left_does_not_run() -> None:
    instance = Gate(_config(2))
    stats = ModelStats()

    async def main() -> None:
        client = Client(DynamicBatcher(_config(2), [instance], stats))
        client.send(2)
        await asyncio.sleep(0.05)
        for request in client.send(2):  # handed to the busy instance, then their clients go away
            request.cancelled = True
        await asyncio.sleep(0.05)
        assert client.batcher._queue.size == 0
        instance.opened.set()
        await client.all_answered()
        assert instance.sizes == [2]
        assert client.outcomes == {"0": (False, None), "1": (False, None), "2": ("CANCELED", Code.CANCELLED),
                                   "3": ("CANCELED", Code.CANCELLED)}
        assert stats.execution_count == 1

    try:
        _run(main)
    finally:
        instance.finalize()


def test_overlap_needs_depth_and_no_rate_limiter() -> None:
    config = _config(4)
    threaded = Gate(config)
    try:
        pool = InstancePool([threaded], overlap=True)
        assert pool.take() is threaded and list(pool.room) == [threaded]
        assert pool.take_busy() is threaded and not pool.room and pool.busy == 2
        pool.give(threaded)
        assert list(pool.room) == [threaded] and not pool  # still busy with the second
        pool.give(threaded)
        assert not pool.room and pool and pool.busy == 0
        # Under the rate limiter an execution holds its resources while it runs: one per instance, as in Triton.
        limited = InstancePool([threaded], RateLimiter(), overlap=True)
        limited._limiter.register(config, [threaded])  # type: ignore[union-attr]
        assert limited.take() is threaded and not limited.room
        # The default scheduler's pool (overlap off) never lends a busy instance either.
        assert not (plain := InstancePool([threaded])).room and plain.take() is threaded and not plain.room
    finally:
        threaded.finalize()


def test_identity_backend_checks_its_config_as_triton_does(tmp_path: Path) -> None:
    from naiad.backends.base import VersionContext
    from naiad.core.errors import InferError

    def load(io: str) -> None:
        config = parse_config_text(f'name: "m" backend: "identity" instance_group [{{ count: 1 }}] {io}')
        ctx = VersionContext("m", 1, config, "{}", tmp_path, tmp_path)
        IdentityBackend().load(ctx).unload()

    load('input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 2 ] }] '
         'output [{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 2 ] }]')
    with pytest.raises(InferError, match="expected input name to follow INPUT<index> pattern, got 'X'"):
        load('input [{ name: "X" data_type: TYPE_INT32 dims: [ 2 ] }] '
             'output [{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 2 ] }]')
    with pytest.raises(InferError, match="expected input and output datatype to match, got INT32 and FP32"):
        load('input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 2 ] }] '
             'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] }]')
    with pytest.raises(InferError, match="must have equal input/output pairs"):
        load('input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 2 ] }]')


# --- the simulated accelerator, live -----------------------------------------------------------------------------

DELAY_MS = 50  # long next to a loaded 2-core box's scheduling jitter (a few ms), short enough for a quick test
BATCH = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    repo = tmp_path_factory.mktemp("simulated")
    write_simulated(repo, "sim_1", BATCH, 1, DELAY_MS)
    write_simulated(repo, "sim_2", BATCH, 2, DELAY_MS)
    write_simulated(repo, "sim_python", BATCH, 1, DELAY_MS, backend="python")
    running = RunningServer([repo])
    yield running  # type: ignore[misc]
    running.stop()


def test_simulated_accelerator_reaches_its_bound_and_two_instances_double_it(server: RunningServer) -> None:
    # Four batches' worth of requests in flight per instance: one running, one held, two on their way.
    one = throughput(server.grpc_url, "sim_1", 4 * BATCH, seconds=3)
    two = throughput(server.grpc_url, "sim_2", 8 * BATCH, seconds=3)
    limit = bound(BATCH, 1, DELAY_MS)
    assert one >= 0.9 * limit, f"one instance: {one:.0f} items/s, {one / limit:.2f} of {limit:.0f}"
    assert two >= 1.7 * one, f"two instances: {two:.0f} items/s, {two / one:.2f} times one ({one:.0f})"


def test_a_python_model_keeps_it_busy_too(server: RunningServer) -> None:
    items = throughput(server.grpc_url, "sim_python", 4 * BATCH, seconds=3)
    limit = bound(BATCH, 1, DELAY_MS)
    assert items >= 0.9 * limit, f"python model: {items:.0f} items/s, {items / limit:.2f} of {limit:.0f}"
