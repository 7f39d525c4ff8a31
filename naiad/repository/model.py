"""One loaded model version: its config, signature, scheduler and statistics."""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from pathlib import Path
from typing import Any, Awaitable, Callable

from naiad.backends.base import LoadedVersion
from naiad.config import ModelConfig
from naiad.config.ensemble import ENSEMBLE_PLATFORM
from naiad.config.sequence import sequence_spec
from naiad.config.signature import Signature
from naiad.core.datatypes import CONFIG_TO_WIRE
from naiad.core.devices import out_of_memory
from naiad.core.errors import InferError
from naiad.core.model_view import ModelView
from naiad.core.request import InferRequest, InferResponse
from naiad.core.stats import ModelStats
from naiad.scheduling.cache import ResponseCache
from naiad.scheduling.default import DefaultScheduler
from naiad.scheduling.dynamic import DynamicBatcher
from naiad.scheduling.ensemble import EnsembleScheduler, Resolve
from naiad.scheduling.rate_limiter import RateLimiter
from naiad.scheduling.sequence import SequenceBatcher

Scheduler = DefaultScheduler | DynamicBatcher | SequenceBatcher | EnsembleScheduler

log = logging.getLogger("naiad.repository")


def make_scheduler(config: ModelConfig, loaded: LoadedVersion, stats: ModelStats,
                   limiter: RateLimiter | None, model_dir: Path | None = None,
                   resolve: Resolve | None = None) -> Scheduler:
    """Triton's choice: the sequence batcher, else the dynamic batcher, else the default scheduler; an ensemble
    runs its steps on the composing models that ``resolve`` finds."""
    if config.platform == ENSEMBLE_PLATFORM and resolve is not None:
        return EnsembleScheduler(config, resolve, stats, loaded)
    if config.HasField("sequence_batching"):
        return SequenceBatcher(config, loaded.instances, stats, limiter, sequence_spec(config, model_dir))
    if config.HasField("dynamic_batching"):
        return DynamicBatcher(config, loaded.instances, stats, limiter)
    return DefaultScheduler(loaded.instances, stats, limiter)


def _io_metadata(ios: Any, batching: bool) -> list[dict[str, Any]]:
    from naiad.config import pb

    return [
        {
            "name": io.name,
            "datatype": CONFIG_TO_WIRE.get(pb.DataType.Name(io.data_type), ""),
            "shape": ([-1] if batching else []) + list(io.dims),
        }
        for io in ios
    ]


class ModelVersion:
    def __init__(self, name: str, version: int, config: ModelConfig, config_dict: dict[str, Any],
                 loaded: LoadedVersion, labels: dict[str, list[str]], cache: ResponseCache | None = None,
                 limiter: RateLimiter | None = None, model_dir: Path | None = None,
                 resolve: Resolve | None = None) -> None:
        self.name = name
        self.version = version
        self.version_str = str(version)
        self.config = config
        self.config_dict = config_dict
        self.loaded = loaded
        self.labels = labels  # output name -> class labels, for the classification extension
        self.signature = signature = Signature(config)
        # What ``_complete`` checks before selecting a response's outputs (most requests need no selection).
        self._config_outputs = signature.outputs.keys()
        self._reshapes = bool(signature.reshaped_outputs)
        self.stats = ModelStats()
        self.limiter = limiter
        if limiter is not None:
            limiter.register(config, loaded.instances)
        self.scheduler: Scheduler = make_scheduler(config, loaded, self.stats, limiter, model_dir, resolve)
        # Both the server (--cache-config) and the model (response_cache.enable) must ask for the cache.
        self.cache = cache if config.response_cache.enable else None
        self.platform = config.platform or config.backend
        self.batching = batching = config.max_batch_size > 0
        self.inputs_metadata = _io_metadata(config.input, batching)
        self.outputs_metadata = _io_metadata(config.output, batching)
        self.load_seconds = 0.0
        self.decoupled = config.model_transaction_policy.decoupled
        # What the service hands front ends in its place, built once: resolving a request costs no allocation.
        self.view = ModelView(name, self.version_str, self.platform, self.decoupled, batching, labels,
                              self.inputs_metadata, self.outputs_metadata,
                              {n: spec.datatype for n, spec in self.signature.inputs.items()}, self)
        # A backend whose non-decoupled models may answer before their execution ends (a Python model's response
        # sender, used with FINAL inside execute): its requests get a responder that resolves their future then.
        self._early = not self.decoupled and bool(getattr(loaded, "answers_early", False))
        self.in_flight = 0  # queued or executing requests: an unload waits for them before finalize()
        # Set by a model cache that holds this version: unloads another model to free memory, True when one went.
        # An execution that fails out of memory then runs once more (``_retry``).
        self.free_memory: Callable[[], Awaitable[bool]] | None = None
        self._drained: asyncio.Event | None = None
        # The loop requests come on, kept: on Python 3.11 each get_running_loop() is a getpid() system call.
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def ready(self) -> bool:
        return self.loaded.ready

    def submit(self, request: InferRequest, future: asyncio.Future[InferResponse] | None = None
               ) -> "asyncio.Future[InferResponse]":
        """Check the request and queue it; the future resolves to a response (its ``error`` may be set).

        For a decoupled model the future only says the execution ended (its response matters only if it
        carries an error); the responses themselves go to ``request.responder``. Cancelling the future
        tells the model the client went away. ``future``: one the caller made (the model host's links pass
        one that answers synchronously); by default a new one on the running loop."""
        request.arrival_ns = time.perf_counter_ns()
        try:
            if request.checked is not self:  # (checked already by a front-end process against this version)
                self.signature.check(request)
        except InferError as exc:
            # Never reached the model, but a client's request failed: counted (reason OTHER, as Triton's core
            # counts its own refusals), so the statistics, the metrics and the dashboard show it. Triton 2.51 leaves
            # these out of the statistics entirely.
            self.stats.record_refusal(time.perf_counter_ns() - request.arrival_ns, exc.message)
            raise
        if future is None:
            loop = self._loop
            if loop is None or loop.is_closed():
                loop = self._loop = asyncio.get_running_loop()
            future = loop.create_future()
        request.model_version = self.version_str
        if self.cache is not None and self._cached(request, future):
            return future
        if self.decoupled and request.responder is not None:
            request.responder = self._checked_responder(request, request.responder)
        elif self._early:
            request.responder = lambda response: self._answer_early(request, response, future)
        self.in_flight += 1
        try:
            # A positional partial (called from C): no closure and no frame of its own per request.
            self.scheduler.enqueue(request, partial(self._complete, future))
        except BaseException:
            self.in_flight -= 1
            if self._early:
                request.responder = None  # (it refers to the request: no cycle to outlive it)
            raise
        if not future.done():  # (answered already by an inline run: nothing left to cancel, no callback)
            future.add_done_callback(lambda f: self._cancel(request) if f.cancelled() else None)
        return future

    def _cancel(self, request: InferRequest) -> None:
        """The client went away: a queued request is dropped by its scheduler, a running one sees
        ``is_cancelled()``."""
        request.cancelled = True
        self.loaded.cancel(request)

    def _answer_early(self, request: InferRequest, response: InferResponse, future: asyncio.Future) -> None:
        """The client's answer before the execution ends; the statistics wait for it (``_complete``)."""
        if future.done():
            return
        if response.error is None:
            selected = self._selected(response, request)
            if selected is not None:
                response.outputs = selected
        response.model_version = self.version_str
        future.set_result(response)

    def _checked_responder(self, request: InferRequest, sink: Callable[[InferResponse], None]
                           ) -> Callable[[InferResponse], None]:
        def respond(response: InferResponse) -> None:
            if response.error is None:
                selected = self._selected(response, request)
                if selected is not None:
                    response.outputs = selected
            response.model_version = self.version_str
            sink(response)
        return respond

    def _selected(self, response: InferResponse, request: InferRequest) -> dict[str, Any] | None:
        """The outputs the request asked for; None when the model's outputs don't match its config, in which
        case the response now carries that error instead."""
        try:
            return self.signature.select_outputs(response.outputs, request)
        except InferError as exc:
            response.outputs = {}
            response.error = exc
            return None

    def _cached(self, request: InferRequest, future: asyncio.Future) -> bool:
        """Answer from the response cache if it holds this request; on a miss remember where to store it."""
        assert self.cache is not None
        started = time.perf_counter_ns()
        key = self.cache.key(request, self.name, self.version_str)
        outputs = self.cache.lookup(key)
        ended = time.perf_counter_ns()
        if outputs is None:
            request.cache_key = key
            request.cache_ns = ended - started
            return False
        stats = self.stats
        # Triton counts a hit as a success with its queue time, but neither an inference nor an execution.
        stats.cache_hit.add(ended - started)
        stats.queue.add(started - request.arrival_ns)
        stats.success.add(ended - request.arrival_ns)
        response = InferResponse(self.name, self.version_str, request.id, self.signature.select_outputs(
            dict(outputs), request))
        future.set_result(response)
        return True

    def _complete(self, future: asyncio.Future, request: InferRequest, response: InferResponse,
                  failed: bool | str, retried: bool = False) -> None:
        if (failed and self.free_memory is not None and not retried and response.error is not None
                and not self.decoupled and not future.done() and out_of_memory(response.error.message)):
            asyncio.ensure_future(self._retry(request, response, failed, future))
            return  # still in flight: an unload waits for the second try
        self.in_flight -= 1
        if self._drained is not None and self.in_flight == 0:
            self._drained.set()
        if self._early:
            # The early responder refers to the request: dropped now, the request (and the shared memory its
            # inputs may view) goes when its last user does, not at the next garbage collection.
            request.responder = None
        done = future.done()  # (nothing below until set_result changes it)
        answered = done and not future.cancelled()  # early, by _answer_early: outputs already selected
        if response.error is None and not answered:
            outputs = response.outputs
            if request.requested_outputs or self._reshapes or outputs.keys() != self._config_outputs:
                try:  # (``_selected``, inline: this runs for every request)
                    selected = self.signature.select_outputs(outputs, request)
                except InferError as exc:
                    response.outputs = {}
                    response.error = exc
                    selected = None
            else:  # all asked for, and the model made exactly the config's outputs: selecting would keep them all
                selected = outputs
            if selected is None:
                failed = "OTHER"
            else:
                if request.cache_key is not None and not failed:
                    self._store(request, response)
                response.outputs = selected
        elapsed = time.perf_counter_ns() - request.arrival_ns
        if failed:
            self.stats.record_failure(elapsed, failed if isinstance(failed, str) else "BACKEND")
        else:
            self.stats.success.add(elapsed)
        response.model_version = self.version_str
        if not done:
            future.set_result(response)

    async def _retry(self, request: InferRequest, response: InferResponse, failed: bool | str,
                     future: asyncio.Future) -> None:
        """The execution ran out of memory: the cache unloads its least valuable other model and the request runs
        once more (server issue 3583 asks Triton for this). The first failure is not counted; the client sees
        the second outcome, or the first one when nothing could be unloaded."""
        try:
            freed = self.free_memory is not None and await self.free_memory()
        except Exception:
            log.exception("freeing memory for '%s' failed", self.name)
            freed = False
        if not freed or future.done() or request.cancelled or not self.loaded.ready:
            self._complete(future, request, response, failed, True)
            return
        log.warning("'%s' version %s ran out of memory; running the request again after an unload", self.name,
                    self.version_str)
        try:
            self.scheduler.enqueue(request, lambda req, resp, again: self._complete(future, req, resp, again, True))
        except InferError:  # stopped meanwhile (an unload): the first answer stands
            self._complete(future, request, response, failed, True)

    def _store(self, request: InferRequest, response: InferResponse) -> None:
        assert self.cache is not None and request.cache_key is not None
        started = time.perf_counter_ns()
        self.cache.insert(request.cache_key, response.outputs)
        self.stats.cache_miss.add(request.cache_ns + time.perf_counter_ns() - started)

    async def drain(self) -> None:
        """Wait until every request already queued on this version has finished."""
        if self.in_flight:
            self._drained = asyncio.Event()
            await self._drained.wait()

    def unload(self, deadline: float | None = None) -> None:
        self.scheduler.stop()
        if self.limiter is not None:
            self.limiter.unregister(self.loaded.instances)
        self.loaded.unload(deadline)
