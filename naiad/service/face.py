"""The one face every front end speaks to, and nothing below it: inference and streams, health, metadata and
config, statistics and the metrics page's reads, the repository (index, load, unload), SageMaker's residency, the
shared-memory registry, trace and log settings, and the dashboard's feed.

Front ends decode their wire format into ``InferRequest`` and encode ``InferResponse``; none of them reaches
into the repository, a scheduler or a backend. Arguments and results are plain values (names, versions, dicts
and lists, requests and responses, bytes; a model is a ``ModelView``), so the face can be a function call, as
here, or a channel to a model host in another process (``remote.RemoteService``): both implement the protocols
of ``faces.py`` (inference, models, SageMaker, administration), which front ends depend on.

Two kinds of method, so that nothing a front end calls ever blocks its event loop:
- answered at once, from what this process knows: health (``live``, ``is_ready``, ``model_ready``), server
  metadata, ``view`` (the view of a version where it is known here), and the inference path (``infer``,
  ``stream``: futures); across processes, from what the host pushes, and "not ready" while it has stalled;
- coroutines, for everything that may need the host (metadata, config, statistics, the repository, shared-memory
  registrations, settings, the dashboard's feed): across processes, each awaits its answer with a deadline.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import naiad
from naiad.config import ModelConfig
from naiad.core.errors import Code, InferError, invalid, unavailable
from naiad.core.model_view import ModelView
from naiad.core.request import InferRequest, InferResponse
from naiad.core.settings import LogSettings
from naiad.core.shared_memory import SharedMemoryRegistry
from naiad.core.tracing import Tracer
from naiad.repository.consent import CodeConsent
from naiad.repository.control import ModelControl
from naiad.repository.manager import ModelRepository
from naiad.repository.model import ModelVersion
from naiad.sagemaker.counters import EndpointStats
from naiad.sagemaker.residency import Residency
from naiad.service.dashboard import gpus as gpu_figures
from naiad.service.dashboard import models as dashboard_models
from naiad.service.dashboard import process as process_figures
from naiad.service.dashboard import residency_summary
from naiad.service.watch import Watcher

# What GET /v2 advertises: only what works, in Triton's order. CUDA shared memory is left out: naiad has no CUDA
# path (its endpoints answer as a Triton without a GPU does, so clients' cleanup calls still succeed).
EXTENSIONS = [
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
]


class Draining:
    """What both faces share of a drain: it stops taking requests and waits for those in flight (whoever finishes
    the last sets ``_idle``)."""

    accepting: bool
    _idle: asyncio.Event | None

    @property
    def in_flight(self) -> int:
        raise NotImplementedError

    async def drain(self, timeout: float) -> bool:
        """Stop taking requests and wait for in-flight ones; True if all finished in time."""
        self.accepting = False
        if self.in_flight == 0:
            return True
        self._idle = asyncio.Event()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False


class Service(Draining):
    """The face in one process (and the model host's): every protocol of ``faces.py``, over the repository."""

    def __init__(self, repository: ModelRepository, strict_readiness: bool = True,
                 control: ModelControl | None = None, residency: Residency | None = None) -> None:
        self.repository = repository
        self.residency = residency  # SageMaker's multi-model loads (None unless SageMaker is served)
        repository.core = self
        self.control = control or ModelControl(repository)
        self.strict_readiness = strict_readiness
        self.live = False
        self.accepting = False  # False while starting and while draining on shutdown
        # In flight: each queued request by its future, each decoupled stream's responder by its request; a
        # shutdown past its exit timeout answers what is left (``cut``).
        self._pending: dict[asyncio.Future, InferRequest] = {}
        self._streams: dict[InferRequest, Callable[[InferResponse], None]] = {}
        self._idle: asyncio.Event | None = None
        # Set when the server could not be created (a missing repository with --exit-on-error=false): it then
        # serves, not live and not ready, and answers model requests "Server not ready" as Triton does.
        self.failure: InferError | None = None
        self.server_id = "triton"  # --id: Triton's default name, which clients (tritonclient's examples) check
        self.log_settings = LogSettings()
        self.tracer = Tracer()  # --trace-config; the trace extension changes it
        self.shared_memory = SharedMemoryRegistry()  # regions clients registered, for every front end
        self._watcher: Watcher | None = None  # samples per-second figures while a dashboard polls

    # --- inference ----------------------------------------------------------------------------------------------

    def view(self, name: str, version: str = "") -> ModelView | None:
        """``model``'s answer where it is known without waiting (always, here; across processes, a view kept from
        the host), else None: then await ``model``. Raises ``InferError`` as ``model`` does."""
        self._check_created()
        return self.repository.get(name, version).view

    async def model(self, name: str, version: str = "") -> ModelView:
        """What a front end needs to know of the version that would serve a request (it resolves it before
        decoding, as Triton does); passed back to ``infer`` / ``stream`` to queue the request there."""
        self._check_created()
        return self.repository.get(name, version).view

    def infer(self, request: InferRequest, view: ModelView | None = None,
              future: asyncio.Future[InferResponse] | None = None) -> "asyncio.Future[InferResponse]":
        """Queue a request. Raises ``InferError`` for a request that can't be queued. A decoupled model
        answers only through ``stream``. ``future``: where the answer goes, when the caller made it (the model
        host's links: one resolved synchronously); by default a new asyncio future."""
        if not self.accepting:
            raise unavailable("Server is not ready to accept requests (shutting down)")
        model: ModelVersion = (self.repository.get(request.model_name, request.model_version) if view is None
                               else view.handle)
        if model.decoupled:
            raise InferError(f"model '{model.name}' uses the decoupled transaction policy: its responses can only be "
                             "streamed (gRPC ModelStreamInfer, HTTP generate_stream, BLS exec(decoupled=True))",
                             Code.UNSUPPORTED)
        # Tracing off: straight to the model, one frame fewer per request.
        future = self._submit(request, model, future) if self.tracer.enabled else model.submit(request, future)
        if future.done():  # answered within submit (an inline run): nothing in flight to track
            if self._idle is not None and not self.in_flight:
                self._idle.set()
            return future
        self._pending[future] = request
        future.add_done_callback(self._finished)
        return future

    @property
    def in_flight(self) -> int:
        return len(self._pending) + len(self._streams)

    def _submit(self, request: InferRequest, model: ModelVersion,
                future: asyncio.Future[InferResponse] | None = None) -> "asyncio.Future[InferResponse]":
        """``model.submit``, tracing the request when the tracer samples it (its trace ends with the execution).
        Tracing off costs the one attribute test."""
        trace = None
        if self.tracer.enabled:
            trace = request.trace = self.tracer.sample(model.name, model.version_str, request.id)
            if trace is not None:
                trace.add("QUEUE_START")  # before submit: a free instance may start executing within it
        future = model.submit(request, future)
        if trace is not None:
            future.add_done_callback(lambda _: trace.end())
        return future

    async def stream(self, request: InferRequest, view: ModelView | None = None) -> AsyncIterator[InferResponse]:
        """Responses of one request as they come; the last has ``final`` set. Streaming front ends (gRPC
        ModelStreamInfer, HTTP generate_stream) use this; a non-decoupled model yields exactly one response,
        a decoupled one zero or more and then a final one (which may carry no outputs). Closing the iterator
        early tells the model the client went away."""
        model: ModelVersion = (self.repository.get(request.model_name, request.model_version) if view is None
                               else view.handle)
        if not model.decoupled:
            yield await self.infer(request, model.view)
            return
        if not self.accepting:
            raise unavailable("Server is not ready to accept requests (shutting down)")
        queue: asyncio.Queue[InferResponse] = asyncio.Queue()
        finished = False

        def respond(response: InferResponse) -> None:
            nonlocal finished
            if not finished:
                finished = response.final
                queue.put_nowait(response)

        def executed(future: asyncio.Future) -> None:
            # An execution that failed before the model could answer (or that raised) ends the stream.
            if not future.cancelled() and future.result().error is not None and not finished:
                response = future.result()
                response.final = True
                respond(response)

        request.responder = respond
        future = self._submit(request, model)
        future.add_done_callback(executed)
        self._streams[request] = respond
        try:
            while True:
                response = await queue.get()
                yield response
                if response.final:
                    return
        finally:
            if not finished:
                future.cancel() if not future.done() else model.loaded.cancel(request)
            del self._streams[request]
            if self._idle is not None and not self.in_flight:
                self._idle.set()

    def _finished(self, future: asyncio.Future) -> None:
        del self._pending[future]
        if self._idle is not None and not self.in_flight:
            self._idle.set()

    def cut(self, message: str) -> int:
        """Answer every request still in flight with UNAVAILABLE ``message`` (shutdown past its exit timeout), on
        whatever front end it came; their schedulers drop the queued ones. Returns how many were cut."""
        error = unavailable(message)
        cut = 0
        for future, request in list(self._pending.items()):
            if not future.done():
                request.cancelled = True
                future.set_result(InferResponse(request.model_name, request.model_version, request.id, error=error))
                cut += 1
        for request, respond in list(self._streams.items()):
            request.cancelled = True
            respond(InferResponse(request.model_name, request.model_version, request.id, error=error))
            cut += 1
        return cut

    # --- health and metadata ------------------------------------------------------------------------------------

    def is_ready(self) -> bool:
        if not (self.live and self.accepting):
            return False
        return self.repository.all_ready() if self.strict_readiness else True

    def server_metadata(self) -> dict[str, Any]:
        return {"name": self.server_id, "version": naiad.__version__, "extensions": EXTENSIONS}

    def _check_created(self) -> None:
        if self.failure is not None:
            raise unavailable("Server not ready")

    def model_ready(self, name: str, version: str = "") -> bool:
        self._check_created()
        return self.repository.is_ready(name, version)

    async def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        self._check_created()
        model = self.repository.get(name, version)
        # Triton lists every ready version, or only the one asked for.
        versions = [version] if version else [str(v) for v in sorted(self.repository.entry(name).versions)]
        return {
            "name": name,
            "versions": versions,
            "platform": model.platform,
            "inputs": model.inputs_metadata,
            "outputs": model.outputs_metadata,
        }

    async def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        """The configuration as Triton's JSON (HTTP)."""
        self._check_created()
        return self.repository.get(name, version).config_dict

    async def model_config_message(self, name: str, version: str = "") -> ModelConfig:
        """The configuration as its protobuf message (gRPC); a copy, which the caller may keep."""
        self._check_created()
        config = ModelConfig()
        config.CopyFrom(self.repository.get(name, version).config)
        return config

    async def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        self._check_created()
        if name:
            entry = self.repository.models.get(name)
            if entry is None or not entry.versions:
                raise invalid(f"requested model '{name}' is not available")
            if version:
                model = entry.versions.get(int(version))
                if model is None:
                    raise invalid(f"requested model version is not available for model '{name}'")
                models = [model]
            else:
                models = [entry.versions[v] for v in sorted(entry.versions)]
        else:
            models = [
                m for e in sorted(self.repository.models) for _, m in sorted(self.repository.models[e].versions.items())
            ]
        return {"model_stats": [m.stats.as_dict(m.name, m.version_str) for m in models]}

    async def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        if self.failure is not None:
            raise invalid("Server not ready")  # 400 here, where every other model request is a 503
        return self.repository.index(ready_only, self.control.listed())

    # --- model control ------------------------------------------------------------------------------------------

    async def load_model(self, name: str, config: str | None = None, files: dict[str, bytes] | None = None,
                         consent: CodeConsent | None = None) -> None:
        """Load or reload a model (HTTP/gRPC repository load, a Python model's ``pb_utils.load_model``); only
        in explicit mode, as Triton allows it. Front ends pass their ``consent`` to code from the network."""
        self._check_created()
        await self.control.load(name, config or None, files or None, consent)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self._check_created()
        await self.control.unload(name, unload_dependents)


    @property
    def control_mode(self) -> str:
        """``none``, ``poll`` or ``explicit`` (--model-control-mode)."""
        return self.control.mode

    # --- statistics, as the metrics page reads them -------------------------------------------------------------

    def model_metrics(self, quantiles: list[float] | None = None) -> list[dict[str, Any]]:
        """Every loaded version's counters, in name and version order: what ``nv_inference_*`` reports. With
        ``quantiles``, the summarized durations too (``summaries``: key -> (count, total ns, [ns per quantile]))."""
        rows = []
        for name in sorted(self.repository.models):
            for version, model in sorted(self.repository.models[name].versions.items()):
                s = model.stats
                row: dict[str, Any] = {
                    "model": name, "version": str(version),
                    "success": s.success.count, "inferences": s.inference_count, "executions": s.execution_count,
                    "success_ns": s.success.ns, "queue_ns": s.queue.ns, "compute_input_ns": s.compute_input.ns,
                    "compute_infer_ns": s.compute_infer.ns, "compute_output_ns": s.compute_output.ns,
                    "fail_reasons": dict(s.fail_reasons), "pending": model.scheduler.pending,
                    "load_seconds": model.load_seconds,
                }
                if quantiles is not None:
                    row["summaries"] = {
                        key: (duration.window.count, duration.window.total_ns, duration.window.quantiles(quantiles))
                        for key, duration in s.durations.items() if duration.window is not None}
                rows.append(row)
        return rows

    # --- SageMaker's residency: thin delegations, so its internals may change underneath ------------------------

    @property
    def sagemaker(self) -> bool:
        """Whether SageMaker's residency is served (the multi-model API and the runtime front door need it)."""
        return self.residency is not None

    def _residency(self) -> Residency:
        if self.residency is None:
            raise unavailable("SageMaker is not served")
        return self.residency

    async def sagemaker_models(self) -> list[dict[str, Any]]:
        """The models the multi-model API loaded, in load order: key, url, target (the served name), ready."""
        return [{"key": r.key, "url": r.url, "target": r.target, "ready": self.repository.is_ready(r.target)}
                for r in self._residency().models.values()]

    async def sagemaker_model(self, key: str) -> dict[str, Any] | None:
        """One of them by key, or by the name a client knows it by (None: not loaded)."""
        r = self._residency().find(key)
        return None if r is None else {"key": r.key, "url": r.url, "target": r.target}

    async def sagemaker_load(self, key: str, url: str, target: str) -> None:
        """Register ``url``'s repository under ``key`` and load ``target`` from it (raises ``UrlRefused`` or
        ``InferError``)."""
        await self._residency().load(key, url, target)

    async def sagemaker_unload(self, key: str) -> None:
        await self._residency().unload(key)

    def sagemaker_touch(self, name: str) -> bool:
        """An invocation of ``name``: mark it used now (False: no resident model has that name)."""
        return self._residency().touch(name)

    async def sagemaker_ensure(self, target: str) -> ModelView:
        """Make ``target`` served, downloading and loading its archive on a miss (raises ``ArchiveError`` or
        ``InferError``); its view, for ``sagemaker_infer``."""
        await self._residency().ensure(target)
        return self.repository.get(target).view  # before anything else runs: the model is kept for this request until it is queued

    def sagemaker_infer(self, request: InferRequest, view: ModelView | None = None,
                        future: asyncio.Future[InferResponse] | None = None
                        ) -> tuple[ModelView, asyncio.Future[InferResponse]] | None:
        """A request to a multi-model target (``request.model_name``), queued and marked used in one call: without
        ``view``, where the target is loaded and ready (the cache's hit, counted); None: a miss: await
        ``sagemaker_ensure``, then call again with the view it gave before yielding (nothing can evict the model
        in between here; a front-end process's host loads it again where an eviction came first). The view the
        request is queued to, and its answer; ``future`` as ``infer`` takes it."""
        residency = self._residency()
        name = request.model_name
        if view is None:
            if not residency.hit(name):
                return None
            view = self.repository.get(name).view
        answer = self.infer(request, view, future)
        residency.touch(name)
        return view, answer

    def sagemaker_stats(self) -> EndpointStats:
        """The endpoint's counters (CloudWatch's): plain numbers the SageMaker front end adds its invocations to."""
        return self._residency().stats

    def sagemaker_models_root(self) -> Path:
        """Where the multi-model layout lives (``<root>/<key>/model``)."""
        return self._residency().models_root

    def sagemaker_metrics(self) -> dict[str, Any]:
        """The residency's figures for the metrics page, each loaded model measured again now."""
        residency = self._residency()
        residency.refresh()
        return {"stats": residency.stats, "loaded": len(residency.models),
                "memory": [(r.target, r.memory) for r in residency.models.values()],
                "used": residency.used(), "limit": residency.memory_limit}

    # --- the shared-memory registry: regions clients register, for every front end (requests find them in
    # ``shared_memory``, at once) -----------------------------------------------------------------------------

    async def shm_register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.shared_memory.register(name, key, offset, byte_size)

    async def shm_unregister(self, name: str) -> None:
        self.shared_memory.unregister(name)

    async def shm_unregister_all(self) -> None:
        self.shared_memory.unregister_all()

    async def shm_status(self, name: str = "") -> list[dict[str, Any]]:
        return self.shared_memory.status(name)

    async def shm_cuda_status(self, name: str = "") -> list[dict[str, Any]]:
        return self.shared_memory.cuda_status(name)

    async def shm_cuda_register(self, name: str) -> None:
        self.shared_memory.cuda_register(name)

    # --- trace and log settings ---------------------------------------------------------------------------------

    async def trace_settings(self, model: str = "") -> dict[str, Any]:
        return self.tracer.settings(model)

    async def update_trace_settings(self, model: str, changes: dict[str, Any]) -> None:
        """``changes`` as ``core.settings.trace_changes`` reads them; a None value clears a model's own."""
        self.tracer.update(model, changes)

    async def log_settings_values(self) -> dict[str, Any]:
        return self.log_settings.as_dict()

    async def update_log_settings(self, changes: dict[str, Any]) -> None:
        """``changes`` as ``core.settings.log_changes`` reads them."""
        self.log_settings.update(**changes)

    # --- the dashboard's feed -----------------------------------------------------------------------------------

    async def dashboard_feed(self, port: str) -> dict[str, Any]:
        """The dashboard's document, and a sign a page is watching: per-second figures are sampled while
        feeds are asked for. ``port``: "http" or "sagemaker", which decides the page's buttons (each calls that
        port's own routes)."""
        if self._watcher is None:
            self._watcher = Watcher(self.repository)
        watcher = self._watcher
        watcher.touch()
        mode = self.control.mode
        server: dict[str, Any] = {
            "id": self.server_id, "version": naiad.__version__, "live": self.live, "ready": self.is_ready(),
            **process_figures(), "control_mode": mode, "port": port, "in_flight": self.in_flight,
            "sampling": watcher.watching,
        }
        if self.failure is not None:
            server["failure"] = self.failure.message
        try:
            index = await self.repository_index()
        except InferError:  # the server could not be created: nothing to list
            index = []
        return {
            "time": time.time(),
            "server": server,
            "actions": {
                # KServe's repository extension loads and unloads only in explicit mode, and only the HTTP port
                # has it.
                "repository": port == "http" and mode == "explicit",
                # SageMaker's DELETE /models/<key>, on the SageMaker port.
                "residents": port == "sagemaker" and self.residency is not None,
            },
            "models": dashboard_models(self.repository, index, watcher),
            "mme": residency_summary(self.repository, self.residency),
            "gpus": gpu_figures(),
        }
