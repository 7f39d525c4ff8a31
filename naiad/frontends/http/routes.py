"""Maps KServe v2 / Triton HTTP routes onto the service. Every handler returns a ``Reply`` or a ``Deferred`` the
protocol completes when the model answers (inference) or the service does (``later``: metadata, config, statistics,
the repository, settings, shared memory: calls that may go to the model host, never waited for on the loop).
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Callable
from urllib.parse import unquote

import orjson

from naiad.core.answer import for_reply
from naiad.core.errors import Code, InferError, internal, invalid
from naiad.core.request import InferRequest, InferResponse
from naiad.frontends.dashboard.routes import Dashboard
from naiad.frontends.http import settings
from naiad.frontends.http.browsers import BrowserGuard
from naiad.frontends.http.codec import OutputOptions, decode_request, encode_response
from naiad.frontends.http.compression import compress, decompress
from naiad.frontends.http.generate import (
    decode_generate,
    encode_generate,
    sse_error,
    sse_event,
)
from naiad.frontends.http.options import HttpOptions
from naiad.frontends.http.shared_memory import route as shared_memory_route
from naiad.frontends.replies import (
    OCTET,
    SSE,
    Deferred,
    Reply,
    Streamed,
    error_reply,
    json_later,
    json_reply,
    later,
    settle,
)
from naiad.frontends.replies import method_not_allowed as _method_not_allowed
from naiad.frontends.replies import not_found as _not_found
from naiad.service import CodeConsent, Face, ModelView, decode_files


class Router:
    def __init__(self, service: Face, options: HttpOptions | None = None,
                 max_input_size: int = 64 * 1024 * 1024) -> None:
        self.service = service
        self.max_input_size = max_input_size  # --http-max-input-size: also what a compressed body may expand to
        options = options or HttpOptions()
        # Both None unless configured: the only per-request cost is the attribute check.
        self.forward = options.header_forward
        self.restricted: dict[str, tuple[bytes, bytes, Reply]] | None = None
        if options.restricted:
            self.restricted = {
                category: (key.lower().encode("latin-1"), value.encode("latin-1"),
                           Reply(403, orjson.dumps({"error": options.restricted.refusal(category)})))
                for category, (key, value) in options.restricted.rules.items()}
        # Routes that change state refuse what a web page made a browser send (browsers.py); infer is not checked.
        self.guard = BrowserGuard(options.allowed_hosts)
        self.consent = CodeConsent(options.restricted.rule("model-repository") is not None, "--http-restricted-api")
        self.dashboard: Any = None  # GET /dashboard (--allow-dashboard), outside /v2: no cost on the routes below
        if options.dashboard:
            self.dashboard = Dashboard(service, options.restricted)

    def handle(self, method: bytes, path: str, headers: dict[bytes, bytes], body: bytes | bytearray
               ) -> Reply | Deferred | Streamed:
        try:
            return self._route(method, path, headers, body)
        except InferError as exc:
            return error_reply(exc)

    def _route(self, method: bytes, path: str, headers: dict[bytes, bytes], body: bytes | bytearray
               ) -> Reply | Deferred | Streamed:
        if "%" in path:
            path = unquote(path)
        parts = path.split("/")[1:]  # a trailing slash leaves an empty part, which no route has
        if not parts or parts[0] != "v2" or "" in parts:
            if parts[:1] == ["dashboard"] and self.dashboard is not None:
                return self.dashboard.handle(method, path, headers) or _not_found()
            return _not_found()
        if self.restricted is not None:
            refused = self._refused(parts, headers)
            if refused is not None:
                return refused
        n = len(parts)
        if parts[1:2] == ["models"] and n >= 3:
            if n == 3 and parts[2] == "stats":
                return self._get(method, lambda: later(json_later(self.service.model_statistics())))
            name = parts[2]
            version = ""
            rest = parts[3:]
            if len(rest) >= 2 and rest[0] == "versions":
                if not rest[1].isdigit():
                    return _not_found()
                version = str(int(rest[1]))
                rest = rest[2:]
            if not rest:
                return self._get(method, lambda: later(json_later(self.service.model_metadata(name, version))))
            if rest == ["trace", "setting"] and not version:  # Triton has no versioned trace settings
                return self._settings(method, headers,
                                      lambda: later(settings.trace(self.service, method, name, body)))
            if len(rest) == 1:
                action = rest[0]
                if action == "infer":
                    if method != b"POST":
                        return _method_not_allowed()
                    return self._infer(name, version, headers, body)
                if action == "generate" or action == "generate_stream":
                    if method != b"POST":
                        return _method_not_allowed()
                    return self.generate(name, version, body, action == "generate_stream")
                if action == "ready":
                    return self._get(method, lambda: _model_ready(self.service.model_ready(name, version)))
                if action == "config":
                    return self._get(method, lambda: later(json_later(self.service.model_config(name, version))))
                if action == "stats":
                    return self._get(method,
                                     lambda: later(json_later(self.service.model_statistics(name, version))))
            return _not_found()
        if n == 1:
            return self._get(method, lambda: json_reply(self.service.server_metadata()))
        if n == 3 and parts[1] == "health":
            if parts[2] == "live":
                return self._get(method, lambda: Reply(200 if self.service.live else 400))
            if parts[2] == "ready":
                return self._get(method, lambda: Reply(200 if self.service.is_ready() else 400))
        if parts[1] == "repository":
            return self._repository(method, parts[2:], headers, body)
        if parts[1:] == ["trace", "setting"]:
            return self._settings(method, headers, lambda: later(settings.trace(self.service, method, "", body)))
        if parts[1:] == ["logging"]:
            return self._settings(method, headers, lambda: later(settings.logging(self.service, method, body)))
        if parts[1] in ("systemsharedmemory", "cudasharedmemory"):
            refused = self.from_browser(headers) if method == b"POST" else None  # register / unregister
            if refused is not None:
                return refused
            return shared_memory_route(self.service, method, parts, body)
        return _not_found()

    def _refused(self, parts: list[str], headers: dict[bytes, bytes]) -> Reply | None:
        """Triton's 403 when the route's category is restricted and the request lacks the header (whose name
        matches in any case, whose value must match exactly); checked before the method, as Triton does."""
        assert self.restricted is not None
        category = _category(parts)
        rule = self.restricted.get(category) if category is not None else None
        if rule is None or headers.get(rule[0]) == rule[1]:
            return None
        return rule[2]

    def from_browser(self, headers: dict[bytes, bytes]) -> Reply | None:
        """403 for a state-changing request a web page made a browser send (a foreign Host or Origin)."""
        reason = self.guard.refusal(headers)
        return None if reason is None else Reply(403, orjson.dumps({"error": reason}))

    def _settings(self, method: bytes, headers: dict[bytes, bytes], produce: Callable[[], Reply | Deferred]
                  ) -> Reply | Deferred:
        """Trace and log settings: read with GET, changed with POST."""
        if method not in (b"GET", b"HEAD", b"POST"):
            return _method_not_allowed()
        if method == b"POST":
            refused = self.from_browser(headers)
            if refused is not None:
                return refused
        return produce()

    @staticmethod
    def _get(method: bytes, produce: Callable[[], Reply | Deferred]) -> Reply | Deferred:
        if method not in (b"GET", b"HEAD"):
            return _method_not_allowed()
        return produce()

    def _infer(self, name: str, version: str, headers: dict[bytes, bytes], body: bytes | bytearray,
               model: ModelView | None = None) -> Reply | Deferred:
        if model is None:
            model = self.service.view(name, version)
            if model is None:  # not known here yet (the model host's, across processes): ask, then go on
                return later(self._infer_later(name, version, headers, body))
        if model.decoupled:
            raise InferError("HTTP end point doesn't support models with decoupled transaction policy",
                             Code.UNSUPPORTED)
        encoding = headers.get(b"content-encoding")
        if encoding is not None:
            body = decompress(body, encoding, self.max_input_size)
        header_length = headers.get(b"inference-header-content-length")
        length: int | None = None
        if header_length is not None:
            try:
                length = int(header_length)
            except ValueError:
                length = 0  # Triton reads an unparsable length as 0: a raw-input request
        request, options = decode_request(body, length, name, version, self.service.shared_memory)
        if self.forward is not None:
            request.parameters.update(self.forward.select(header_pairs(headers)))
        service = self.service
        future = service.infer(request, model, for_reply(service.in_flight))
        accept = headers.get(b"accept-encoding")
        return Deferred(future, lambda f: self._infer_reply(f.result(), options, accept, model))

    async def _infer_later(self, name: str, version: str, headers: dict[bytes, bytes], body: bytes | bytearray
                           ) -> Reply | Deferred:
        return self._infer(name, version, headers, body, await self.service.model(name, version))

    def _infer_reply(self, response: InferResponse, options: OutputOptions, accept: bytes | None,
                     model: ModelView) -> Reply:
        if response.error is not None:
            return error_reply(response.error)
        labels = model.labels if options.classification else None
        try:
            header, chunks, header_length = encode_response(response, options, labels, model.batching)
        except InferError as exc:
            return error_reply(exc)
        if header_length is None:
            reply = Reply(200, header)
        else:
            reply = Reply(200, [header, *chunks], OCTET,
                          [(b"Inference-Header-Content-Length", str(header_length).encode())])
        return compress(reply, accept) if accept else reply

    def generate(self, name: str, version: str, body: bytes | bytearray, stream: bool,
                 model: ModelView | None = None) -> Deferred:
        if model is None:
            model = self.service.view(name, version)
            if model is None:  # (as in ``_infer``)
                return later(self._generate_later(name, version, body, stream))
        request = decode_generate(body, model, name, version)
        if stream:
            return Deferred(asyncio.ensure_future(self._generate_stream(request, model)), lambda f: f.result())
        if not model.decoupled:
            return Deferred(self.service.infer(request, model), lambda f: _generate_reply(f.result()))
        return Deferred(asyncio.ensure_future(self._generate_one(request, model)), lambda f: f.result())

    async def _generate_later(self, name: str, version: str, body: bytes | bytearray, stream: bool) -> Any:
        return await settle(self.generate(name, version, body, stream, await self.service.model(name, version)))

    async def _generate_stream(self, request: InferRequest, model: ModelView) -> Reply | Streamed:
        """As Triton: a request refused before inference is a plain JSON error; otherwise the first response
        sets the status (an error one included) and starts the event stream."""
        responses = self.service.stream(request, model)
        try:
            first = await responses.__anext__()
        except InferError as exc:
            return error_reply(exc)
        except StopAsyncIteration:
            first = None
        status = first.error.http_status if first is not None and first.error is not None else 200
        return Streamed(self._generate_events(first, responses), SSE, status=status)

    @staticmethod
    async def _generate_events(first: InferResponse | None, responses: AsyncIterator[InferResponse]
                               ) -> AsyncIterator[bytes]:
        response = first
        try:
            while response is not None:
                if response.error is not None:
                    yield sse_error(response.error.message)
                    return
                if response.outputs or not response.final:
                    yield sse_event(encode_generate(response))
                response = await responses.__anext__()
        except StopAsyncIteration:
            pass
        except InferError as exc:
            yield sse_error(exc.message)
        finally:
            await responses.aclose()  # type: ignore[attr-defined]  # an async generator: tells the model on early exit

    async def _generate_one(self, request: InferRequest, model: ModelView) -> Reply:
        """``generate`` on a decoupled model: it must answer with exactly one response (plus, maybe, an empty
        final one)."""
        answers = []
        try:
            async for response in self.service.stream(request, model):
                if response.error is not None:
                    return error_reply(response.error)
                if response.outputs or not response.final:
                    answers.append(response)
        except InferError as exc:
            return error_reply(exc)
        if len(answers) != 1:
            return error_reply(InferError(
                "generate expects model to produce exactly 1 response, use generate stream for model that "
                "generates various number of responses", Code.INTERNAL))
        return _generate_reply(answers[0])

    def _repository(self, method: bytes, rest: list[str], headers: dict[bytes, bytes], body: bytes | bytearray
                    ) -> Reply | Deferred:
        if rest == ["index"] and method != b"POST":
            return _method_not_allowed()
        if rest == ["index"]:
            ready_only = False
            if body:
                try:
                    doc = orjson.loads(body)
                except orjson.JSONDecodeError as exc:
                    raise invalid(f"failed to parse the request JSON buffer: {exc}") from None
                ready_only = bool(isinstance(doc, dict) and doc.get("ready"))
            return later(json_later(self.service.repository_index(ready_only)))
        if len(rest) == 3 and rest[0] == "models" and rest[2] in ("load", "unload") and method == b"POST":
            refused = self.from_browser(headers)
            if refused is not None:
                return refused
            # Loads take a while (the model initializes): the reply waits on a task, the loop keeps serving.
            return Deferred(asyncio.ensure_future(self._model_control(rest[1], rest[2], body)), lambda f: f.result())
        return _not_found()

    async def _model_control(self, name: str, action: str, body: bytes | bytearray) -> Reply:
        try:
            parameters: Any = {}
            if body:
                try:
                    doc = orjson.loads(body)
                except orjson.JSONDecodeError as exc:
                    raise internal(f"failed to parse the request JSON buffer: {exc}") from None
                parameters = doc.get("parameters", {}) if isinstance(doc, dict) else {}
                if not isinstance(parameters, dict):
                    raise invalid("expected 'parameters' to be a JSON object")
            if action == "load":
                config = parameters.get("config")
                if config is not None and not isinstance(config, str):
                    raise internal("attempt to access JSON non-string as string")
                await self.service.load_model(name, config, decode_files(parameters, base64_encoded=True),
                                              self.consent)
            else:
                dependents = parameters.get("unload_dependents", False)
                if not isinstance(dependents, bool):
                    raise internal("attempt to access JSON non-boolean as boolean")
                await self.service.unload_model(name, dependents)
        except InferError as exc:
            return error_reply(exc)
        return Reply(200)


def _category(parts: list[str]) -> str | None:
    """The restricted-API category of a path (already split at '/', starting with 'v2'), as Triton's HTTP server
    files its routes; None for a path no route serves, which stays a 404."""
    n = len(parts)
    if n == 1:
        return "metadata"
    kind = parts[1]
    if kind == "health":
        return "health" if n == 3 and parts[2] in ("live", "ready") else None
    if kind == "models":
        if n == 3 and parts[2] == "stats":
            return "statistics"
        rest = parts[3:]
        versioned = len(rest) >= 2 and rest[0] == "versions" and rest[1].isdigit()
        if versioned:
            rest = rest[2:]
        if n < 3:
            return None
        if rest == ["trace", "setting"]:
            return None if versioned else "trace"  # Triton serves a model's trace settings unversioned only
        return _MODEL_CATEGORIES.get(rest[0] if rest else "") if len(rest) < 2 else None
    if kind == "repository":
        rest = parts[2:]
        if rest[:1] != ["index"] and rest[:1] != ["models"]:
            rest = rest[1:]  # /v2/repository/<repository>/...
        return "model-repository" if rest == ["index"] or (
            len(rest) == 3 and rest[0] == "models" and rest[2] in ("load", "unload")) else None
    if kind in ("systemsharedmemory", "cudasharedmemory"):
        rest = parts[2:]
        if len(rest) == 3 and rest[0] == "region":
            rest = rest[2:]
        return "shared-memory" if len(rest) == 1 and rest[0] in ("status", "register", "unregister") else None
    if parts[1:] == ["trace", "setting"]:
        return "trace"
    if parts[1:] == ["logging"]:
        return "logging"
    return None


_MODEL_CATEGORIES = {"": "metadata", "infer": "inference", "generate": "inference", "generate_stream": "inference",
                     "ready": "health", "config": "model-config", "stats": "statistics"}


def header_pairs(headers: dict[bytes, bytes]) -> list[tuple[str, str]]:
    """A request's headers as text, names as the client spelled them where the protocol kept them."""
    raw = getattr(headers, "raw", None)
    return [(name.decode("latin-1"), value.decode("utf-8", "replace"))
            for name, value in (raw if raw is not None else headers.items())]


def _generate_reply(response: InferResponse) -> Reply:
    if response.error is not None:
        return error_reply(response.error)
    return Reply(200, encode_generate(response))


def _model_ready(ready: bool) -> Reply:
    return Reply(200) if ready else Reply(400, orjson.dumps({"error": "Model version not ready"}))

