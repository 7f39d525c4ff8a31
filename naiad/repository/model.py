"""One loaded model version: its config, signature, scheduler and statistics."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from naiad.backends.base import LoadedVersion
from naiad.config import ModelConfig
from naiad.config.signature import Signature
from naiad.core.datatypes import CONFIG_TO_WIRE
from naiad.core.errors import InferError
from naiad.core.request import InferRequest, InferResponse
from naiad.core.stats import ModelStats
from naiad.scheduling.default import DefaultScheduler


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
                 loaded: LoadedVersion, labels: dict[str, list[str]]) -> None:
        self.name = name
        self.version = version
        self.version_str = str(version)
        self.config = config
        self.config_dict = config_dict
        self.loaded = loaded
        self.labels = labels  # output name -> class labels, for the classification extension
        self.signature = Signature(config)
        self.stats = ModelStats()
        self.scheduler = DefaultScheduler(loaded.instances, self.stats)
        self.platform = config.platform or config.backend
        batching = config.max_batch_size > 0
        self.inputs_metadata = _io_metadata(config.input, batching)
        self.outputs_metadata = _io_metadata(config.output, batching)
        self.load_seconds = 0.0
        self.decoupled = config.model_transaction_policy.decoupled

    @property
    def ready(self) -> bool:
        return self.loaded.ready

    def submit(self, request: InferRequest) -> "asyncio.Future[InferResponse]":
        """Check the request and queue it; the future resolves to a response (its ``error`` may be set).

        For a decoupled model the future only says the execution ended (its response matters only if it
        carries an error); the responses themselves go to ``request.responder``. Cancelling the future
        tells the model the client went away."""
        request.arrival_ns = time.perf_counter_ns()
        # A request rejected here never reached the model: Triton leaves it out of the statistics.
        self.signature.check(request)
        future: asyncio.Future[InferResponse] = asyncio.get_running_loop().create_future()
        request.model_version = self.version_str
        if self.decoupled and request.responder is not None:
            request.responder = self._checked_responder(request, request.responder)
        self.scheduler.enqueue(request, lambda req, resp, failed: self._complete(req, resp, failed, future))
        future.add_done_callback(lambda f: f.cancelled() and self.loaded.cancel(request))
        return future

    def _checked_responder(self, request: InferRequest, sink: Callable[[InferResponse], None]
                           ) -> Callable[[InferResponse], None]:
        def respond(response: InferResponse) -> None:
            if response.error is None:
                try:
                    response.outputs = self.signature.select_outputs(response.outputs, request)
                except InferError as exc:
                    response.outputs = {}
                    response.error = exc
            response.model_version = self.version_str
            sink(response)
        return respond

    def _complete(self, request: InferRequest, response: InferResponse, failed: bool, future: asyncio.Future) -> None:
        if response.error is None:
            try:
                response.outputs = self.signature.select_outputs(response.outputs, request)
            except InferError as exc:
                response.outputs = {}
                response.error = exc
                failed = True
        elapsed = time.perf_counter_ns() - request.arrival_ns
        (self.stats.fail if failed else self.stats.success).add(elapsed)
        response.model_version = self.version_str
        if not future.done():
            future.set_result(response)

    def unload(self) -> None:
        self.loaded.unload()
