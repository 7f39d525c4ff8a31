"""The service face by concern: what a front end may ask, as typed protocols. Each front end depends on the ones
it uses; both faces implement all four (``face.Service`` in one process, ``remote.RemoteService`` in a front-end
process; mypy checks both against ``Face`` at the end of this module).

- ``Inference``: health, server metadata, resolving a model's version, queueing requests and streams, draining;
- ``Models``: a model's readiness, metadata, config and statistics, the repository's index, loads and unloads, and
  the metrics page's reads;
- ``SageMaker``: the multi-model endpoint's residency (loads by key, a target made resident, its invocations)
  and its counters;
- ``Administration``: the shared-memory registry, trace and log settings, the dashboard's feed.

Methods are answered at once (from what this process knows) or are coroutines (what may need the model host:
across processes, each awaits its answer with a deadline). Nothing here blocks an event loop.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Protocol

from naiad.config import ModelConfig
from naiad.core.model_view import ModelView
from naiad.core.request import InferRequest, InferResponse
from naiad.core.shared_memory import SharedMemoryRegistry
from naiad.repository.consent import CodeConsent
from naiad.sagemaker.counters import EndpointStats


class Inference(Protocol):
    accepting: bool  # False while starting and while draining

    @property
    def live(self) -> bool: ...

    @property
    def in_flight(self) -> int: ...

    @property
    def shared_memory(self) -> SharedMemoryRegistry:
        """The regions clients registered, which requests name (found at once)."""
        ...

    def is_ready(self) -> bool: ...

    def server_metadata(self) -> dict[str, Any]: ...

    def view(self, name: str, version: str = "") -> ModelView | None:
        """The version that would serve a request, where it is known without waiting; else None: await
        ``model``."""
        ...

    async def model(self, name: str, version: str = "") -> ModelView: ...

    def infer(self, request: InferRequest, view: ModelView | None = None,
              future: asyncio.Future[InferResponse] | None = None) -> asyncio.Future[InferResponse]: ...

    def stream(self, request: InferRequest, view: ModelView | None = None) -> AsyncIterator[InferResponse]: ...

    async def drain(self, timeout: float) -> bool: ...

    def cut(self, message: str) -> int: ...


class Models(Protocol):
    @property
    def control_mode(self) -> str: ...

    def model_ready(self, name: str, version: str = "") -> bool: ...

    async def model_metadata(self, name: str, version: str = "") -> dict[str, Any]: ...

    async def model_config(self, name: str, version: str = "") -> dict[str, Any]: ...

    async def model_config_message(self, name: str, version: str = "") -> ModelConfig: ...

    async def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]: ...

    async def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]: ...

    async def load_model(self, name: str, config: str | None = None, files: dict[str, bytes] | None = None,
                         consent: CodeConsent | None = None) -> None: ...

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None: ...

    def model_metrics(self, quantiles: list[float] | None = None) -> list[dict[str, Any]]: ...


class SageMaker(Protocol):
    @property
    def sagemaker(self) -> bool: ...

    async def sagemaker_models(self) -> list[dict[str, Any]]: ...

    async def sagemaker_model(self, key: str) -> dict[str, Any] | None: ...

    async def sagemaker_load(self, key: str, url: str, target: str) -> None: ...

    async def sagemaker_unload(self, key: str) -> None: ...

    def sagemaker_infer(self, request: InferRequest, view: ModelView | None = None,
                        future: asyncio.Future[InferResponse] | None = None
                        ) -> tuple[ModelView, asyncio.Future[InferResponse]] | None:
        """A request to a multi-model target, queued where it is resident (None: a miss; await
        ``sagemaker_ensure``, then pass the view it gave)."""
        ...

    async def sagemaker_ensure(self, target: str) -> ModelView: ...

    def sagemaker_touch(self, name: str) -> bool: ...

    def sagemaker_stats(self) -> EndpointStats: ...

    def sagemaker_models_root(self) -> Path: ...

    def sagemaker_metrics(self) -> dict[str, Any]: ...


class Administration(Protocol):
    async def shm_register(self, name: str, key: str, offset: int, byte_size: int) -> None: ...

    async def shm_unregister(self, name: str) -> None: ...

    async def shm_unregister_all(self) -> None: ...

    async def shm_status(self, name: str = "") -> list[dict[str, Any]]: ...

    async def shm_cuda_status(self, name: str = "") -> list[dict[str, Any]]: ...

    async def shm_cuda_register(self, name: str) -> None: ...

    async def trace_settings(self, model: str = "") -> dict[str, Any]: ...

    async def update_trace_settings(self, model: str, changes: dict[str, Any]) -> None: ...

    async def log_settings_values(self) -> dict[str, Any]: ...

    async def update_log_settings(self, changes: dict[str, Any]) -> None: ...

    async def dashboard_feed(self, port: str) -> dict[str, Any]: ...


class Face(Inference, Models, SageMaker, Administration, Protocol):
    """All four: what a server's ports are given (each front end keeps the parts it uses)."""


if TYPE_CHECKING:  # both faces implement every protocol (mypy checks these; nothing runs them)
    from naiad.service.face import Service
    from naiad.service.remote import RemoteService

    def _in_process(service: Service) -> Face:
        return service

    def _remote(service: RemoteService) -> Face:
        return service
