"""Triton's SageMaker server: ``/ping``, ``/invocations`` and the multi-model ``/models`` API, with its status
codes and bodies (Triton 2.51's sagemaker_server.cc; a bare 400 for anything it doesn't route), plus naiad's
runtime front door (``/endpoints/...``, see ``runtime.py``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

import orjson

from naiad.core.errors import Code, InferError
from naiad.core.model_view import ModelView
from naiad.core.request import InferResponse
from naiad.frontends.http.codec import OutputOptions
from naiad.frontends.http.options import HttpOptions
from naiad.frontends.http.routes import Router
from naiad.frontends.replies import Deferred, Reply, Streamed, error_reply, later
from naiad.frontends.sagemaker import codec
from naiad.frontends.sagemaker.replies import bare, mismatched, sagemaker_error, target_model
from naiad.frontends.sagemaker.runtime import RuntimeDoor
from naiad.sagemaker.contract import UrlRefused
from naiad.sagemaker.options import SageMakerOptions
from naiad.service import Face

log = logging.getLogger("naiad.sagemaker")

_MODELS = re.compile(r"/models(?:/)?([^/]+)?(/invoke)?")  # Triton's own pattern, quirks included


class SageMakerRouter:
    def __init__(self, service: Face, options: SageMakerOptions, http: HttpOptions | None = None,
                 allowed_hosts: list[str] | None = None) -> None:
        assert service.sagemaker
        self.service = service
        self.options = options
        self.stats = service.sagemaker_stats()
        # generate / generate_stream are the HTTP front end's, as in Triton; its browser guard (--http-allowed-hosts)
        # also fences the multi-model load and unload.
        self.http = Router(service, HttpOptions(allowed_hosts=allowed_hosts or []))
        self.runtime = RuntimeDoor(self)
        self.dashboard: Any = None  # GET /dashboard here when HTTP is off (``http``: the options it would have had)
        if http is not None and http.dashboard:
            from naiad.frontends.dashboard.routes import Dashboard

            self.dashboard = Dashboard(service, http.restricted, "sagemaker")

    def handle(self, method: bytes, path: str, headers: dict[bytes, bytes], body: bytes | bytearray
               ) -> Reply | Deferred | Streamed:
        try:
            return self._route(method, path, headers, body)
        except InferError as exc:
            return error_reply(exc)

    def _route(self, method: bytes, path: str, headers: dict[bytes, bytes], body: bytes | bytearray
               ) -> Reply | Deferred | Streamed:
        if path == "/ping":
            return self._ping(method)
        if path == "/invocations":
            return self._invocations(method, headers, body)
        if path.startswith("/endpoints/"):
            return self.runtime.handle(method, path, headers, body)
        if self.dashboard is not None and path.startswith("/dashboard"):
            page = self.dashboard.handle(method, path, headers)
            if page is not None:
                return page
        match = _MODELS.fullmatch(path)
        if match is None:
            return bare(400)
        key, action = match.group(1) or "", match.group(2) or ""
        if method == b"GET":
            return self._get(key) if key else self._list()
        if method == b"POST":
            if action:
                return self._invoke(key, headers, body)
            refused = self.http.from_browser(headers)  # a multi-model load changes state
            return refused or Deferred(asyncio.ensure_future(self._load(headers, body)), lambda f: f.result())
        if method == b"DELETE":
            refused = self.http.from_browser(headers)
            return refused or Deferred(asyncio.ensure_future(self._unload(key, headers)), lambda f: f.result())
        return bare(400)

    # --- single-model endpoint ---------------------------------------------------------------------------------

    def _ping(self, method: bytes) -> Reply:
        if method != b"GET":
            return Reply(405, orjson.dumps({"error": "Method Not Allowed"}))
        service = self.service
        ok = service.live if self.options.ping_mode == "live" else service.is_ready()
        return bare(200 if ok else 400)

    def _invocations(self, method: bytes, headers: dict[bytes, bytes], body: bytes | bytearray
                     ) -> Reply | Deferred | Streamed:
        name = self.options.default_model
        kind = self.options.inference_type
        if kind != "infer":
            if method != b"POST":
                return Reply(405, orjson.dumps({"error": "Method Not Allowed"}))
            return self.http.generate(name, "", body, kind == "generate_stream")
        if method != b"POST":
            return Reply(405, orjson.dumps({"error": "Method Not Allowed"}))
        # Failures before the model answers keep Triton's HTTP status mapping here (HandleInfer's), but for
        # an unknown default model, which Triton 2.51 answers with 400.
        return self.infer(name, headers, body, _invocations_error)

    # --- inference, shared by /invocations, /models/<m>/invoke and the runtime front door ----------------------

    def infer(self, name: str, headers: dict[bytes, bytes], body: bytes | bytearray, failed: Any,
              started: float | None = None, model: ModelView | None = None) -> Reply | Deferred:
        """Decode, queue and answer one request; ``failed`` turns an error into the route's reply. ``model``: the
        view of ``name`` where it was asked for already (``_infer_later``)."""
        result = self._infer(name, headers, body, failed, started, None, model, False)
        assert result is not None  # (only a target misses)
        return result

    def infer_target(self, name: str, headers: dict[bytes, bytes], body: bytes | bytearray, failed: Any,
                     started: float, resident: ModelView | None = None) -> Reply | Deferred | None:
        """``infer`` for a multi-model endpoint's target model, queued by ``sagemaker_infer`` where it is resident
        (the cache's hit, in the same call). None: a miss, nothing counted: load it (``sagemaker_ensure``) and
        call again with the view it gave (``resident``)."""
        return self._infer(name, headers, body, failed, started, resident, None, True)

    def _infer(self, name: str, headers: dict[bytes, bytes], body: bytes | bytearray, failed: Any,
               started: float | None, resident: ModelView | None, model: ModelView | None, target: bool
               ) -> Reply | Deferred | None:
        if started is None:
            started = time.perf_counter()
        if not target and model is None:
            try:
                model = self.service.view(name)
            except InferError as exc:
                self.stats.invocations += 1
                return self._counted(failed(exc))
            if model is None:  # not known here yet (the model host's, across processes): ask, then go on
                return later(self._infer_later(name, headers, body, failed, started))
        known = resident or model
        try:
            if known is not None and known.decoupled:
                raise InferError("HTTP end point doesn't support models with decoupled transaction policy",
                                 Code.UNSUPPORTED)
            request, options = codec.decode(body, headers, name)
            submitted = time.perf_counter()
            if target:
                queued = self.service.sagemaker_infer(request, resident)  # the cache's hit; marks it used
                if queued is None:
                    return None  # (counted when it comes again, after the load)
                model, future = queued
            else:
                future = self.service.infer(request, model)
                self.service.sagemaker_touch(name)
        except InferError as exc:
            self.stats.invocations += 1
            return self._counted(failed(exc))
        self.stats.invocations += 1
        assert model is not None
        labels, batching = model.labels, model.batching
        return Deferred(future, lambda f: self._reply(f.result(), options, labels, failed, started, submitted,
                                                      batching))

    async def _infer_later(self, name: str, headers: dict[bytes, bytes], body: bytes | bytearray, failed: Any,
                           started: float) -> Reply | Deferred:
        try:
            model = await self.service.model(name)
        except InferError as exc:
            self.stats.invocations += 1
            return self._counted(failed(exc))
        return self.infer(name, headers, body, failed, started, model)

    def _reply(self, response: InferResponse, options: OutputOptions, labels: dict[str, list[str]],
               failed: Any, started: float, submitted: float, batching: bool = True) -> Reply:
        answered = time.perf_counter()
        if response.error is not None:
            reply = failed(response.error)
        else:
            try:
                body, content_type = codec.encode(response, options, labels if options.classification else None,
                                                  batching)
                reply = Reply(200, body, content_type)
            except InferError as exc:
                reply = failed(exc)
        in_model = answered - submitted
        self.stats.model_latency.add(in_model)
        self.stats.overhead_latency.add(time.perf_counter() - started - in_model)
        return self._counted(reply)

    def _counted(self, reply: Reply) -> Reply:
        if 400 <= reply.status < 500:
            self.stats.errors_4xx += 1
        elif reply.status >= 500:
            self.stats.errors_5xx += 1
        return reply

    # --- multi-model endpoint ----------------------------------------------------------------------------------

    def _list(self) -> Deferred:
        return later(self._list_later())

    async def _list_later(self) -> Reply:
        rows = []
        for resident in await self.service.sagemaker_models():
            # Triton appends an empty object for a model that isn't ready.
            rows.append({"modelName": resident["key"], "modelUrl": resident["url"]} if resident["ready"] else {})
        return Reply(200, orjson.dumps({"models": rows}))

    def _get(self, key: str) -> Deferred:
        return later(self._get_later(key))

    async def _get_later(self, key: str) -> Reply:
        resident = await self.service.sagemaker_model(key)
        if resident is None:
            return bare(404)
        return Reply(200, orjson.dumps({"modelName": resident["key"], "modelUrl": resident["url"]}))

    async def _load(self, headers: dict[bytes, bytes], body: bytes | bytearray) -> Reply:
        key, url = "", ""
        if body:
            try:
                doc = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                return bare_json(400, f"failed to parse the request JSON buffer: {exc}")
            if isinstance(doc, dict):
                if "model_name" in doc:
                    if not isinstance(doc["model_name"], str):
                        return bare_json(400, "attempt to access JSON non-string as string")
                    key = doc["model_name"]
                if "url" in doc:
                    if not isinstance(doc["url"], str):
                        return bare_json(400, "attempt to access JSON non-string as string")
                    url = doc["url"]
        target = target_model(headers) or key
        log.info("Loading SageMaker TargetModel: %s", target)
        try:
            await self.service.sagemaker_load(key, url, target)
        except UrlRefused as exc:
            log.error("%s", exc.message)
            return bare(400)
        except InferError as exc:
            if exc.code == Code.ALREADY_EXISTS:
                return Reply(409, orjson.dumps({"error": exc.message}))
            return sagemaker_error(exc)
        return bare(200)

    async def _unload(self, key: str, headers: dict[bytes, bytes]) -> Reply:
        resident = await self.service.sagemaker_model(key)
        if resident is None:
            return bare(404)
        refused = mismatched(headers, resident, "UNLOAD")
        if refused is not None:
            return refused
        log.info("Unloading SageMaker TargetModel: %s", resident["target"])
        try:
            await self.service.sagemaker_unload(key)
        except InferError as exc:
            return Reply(400, orjson.dumps({"error": exc.message}))
        return bare(200)

    def _invoke(self, key: str, headers: dict[bytes, bytes], body: bytes | bytearray) -> Deferred:
        return later(self._invoke_later(key, headers, body))

    async def _invoke_later(self, key: str, headers: dict[bytes, bytes], body: bytes | bytearray
                            ) -> Reply | Deferred:
        """The model loaded under ``key``, whatever the header says (which may only repeat its name)."""
        resident = await self.service.sagemaker_model(key)
        if resident is None:
            return bare(404)
        refused = mismatched(headers, resident, "INVOKE")
        if refused is not None:
            return self._counted(refused)
        log.info("Invoking SageMaker TargetModel: %s", resident["target"])
        return self.infer(resident["target"], headers, body, sagemaker_error)


def _invocations_error(error: InferError) -> Reply:
    if error.code == Code.NOT_FOUND and error.message.endswith("is not found"):
        return Reply(400, orjson.dumps({"error": error.message}))
    return error_reply(error)


def bare_json(status: int, message: str) -> Reply:
    return Reply(status, orjson.dumps({"error": message}))

