"""One loaded model version: its config, signature, scheduler and statistics."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from naiad.backends.base import LoadedVersion
from naiad.config import ModelConfig
from naiad.config.signature import Signature
from naiad.core.datatypes import CONFIG_TO_WIRE
from naiad.core.errors import InferError
from naiad.core.request import InferRequest, InferResponse
from naiad.core.stats import ModelStats
from naiad.config.ensemble import ENSEMBLE_PLATFORM
from naiad.scheduling.default import DefaultScheduler
from naiad.scheduling.ensemble import EnsembleScheduler, Resolve


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
                 loaded: LoadedVersion, labels: dict[str, list[str]], resolve: Resolve | None = None) -> None:
        self.name = name
        self.version = version
        self.version_str = str(version)
        self.config = config
        self.config_dict = config_dict
        self.loaded = loaded
        self.labels = labels  # output name -> class labels, for the classification extension
        self.signature = Signature(config)
        self.stats = ModelStats()
        self.scheduler: DefaultScheduler | EnsembleScheduler
        if config.platform == ENSEMBLE_PLATFORM and resolve is not None:
            # An ensemble runs its steps on the composing models that ``resolve`` finds.
            self.scheduler = EnsembleScheduler(config, resolve, self.stats)
        else:
            self.scheduler = DefaultScheduler(loaded.instances, self.stats)
        self.platform = config.platform or config.backend
        batching = config.max_batch_size > 0
        self.inputs_metadata = _io_metadata(config.input, batching)
        self.outputs_metadata = _io_metadata(config.output, batching)
        self.load_seconds = 0.0

    def submit(self, request: InferRequest) -> "asyncio.Future[InferResponse]":
        """Check the request and queue it; the future resolves to a response (its ``error`` may be set)."""
        request.arrival_ns = time.perf_counter_ns()
        # A request rejected here never reached the model: Triton leaves it out of the statistics.
        self.signature.check(request)
        future: asyncio.Future[InferResponse] = asyncio.get_running_loop().create_future()
        request.model_version = self.version_str
        self.scheduler.enqueue(request, lambda req, resp, failed: self._complete(req, resp, failed, future))
        return future

    def _complete(self, request: InferRequest, response: InferResponse, failed: bool, future: asyncio.Future) -> None:
        reason = "BACKEND"
        if response.error is None:
            try:
                response.outputs = self.signature.select_outputs(response.outputs, request)
            except InferError as exc:
                response.outputs = {}
                response.error = exc
                failed = True
                reason = "OTHER"
        elapsed = time.perf_counter_ns() - request.arrival_ns
        if failed:
            self.stats.record_failure(elapsed, reason)
        else:
            self.stats.success.add(elapsed)
        response.model_version = self.version_str
        if not future.done():
            future.set_result(response)

    def unload(self) -> None:
        self.loaded.unload()
