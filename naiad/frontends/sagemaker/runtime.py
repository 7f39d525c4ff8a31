"""The SageMaker Runtime front door: what the platform does in front of the container, so unmodified boto3
(``sagemaker-runtime``'s ``invoke_endpoint`` / ``invoke_endpoint_with_response_stream``, pointed at this port
with ``endpoint_url``) talks to naiad directly.

``POST /endpoints/<name>/invocations`` runs the request as the container route would (``/invocations`` on a
single-model endpoint, ``/models/<key>/invoke`` on a multi-model one, loading the target model's archive on
demand) and answers in the runtime service's shape: the model's body and content type on success; a model's
failure as ``ModelError`` (424, with the container's status and message); the caller's mistakes as
``ValidationError`` (400). ``.../invocations-response-stream`` sends the answer as AWS event stream
``PayloadPart`` events.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import TYPE_CHECKING, Any, AsyncIterator

import orjson

from naiad.core.errors import Code, InferError
from naiad.core.model_view import ModelView
from naiad.frontends.replies import Deferred, Reply, Streamed, error_reply, later
from naiad.frontends.sagemaker.replies import sagemaker_error, target_model
from naiad.sagemaker.contract import ArchiveError

if TYPE_CHECKING:
    from naiad.frontends.sagemaker.routes import SageMakerRouter

log = logging.getLogger("naiad.sagemaker")
_logged = [0.0, 0]  # the current second, and the model errors logged in it


def _log_model_error(status: int, endpoint: str, text: str) -> None:
    """The model error boto3's caller is sent to the log for; at most 10 lines a second, so a client repeating a
    bad request can't flood the log."""
    now = time.monotonic()
    if now - _logged[0] >= 1.0:
        _logged[0], _logged[1] = now, 0
    _logged[1] += 1
    if _logged[1] <= 10:
        log.log(logging.WARNING if status >= 500 else logging.INFO, "invocation%s answered ModelError: the model "
                "answered %d: %s", f" of endpoint '{endpoint}'" if endpoint else "", status, text)
    elif _logged[1] == 11:
        log.warning("more invocations answered ModelError this second; not logged")

_PATH = re.compile(r"/endpoints/([a-zA-Z0-9](?:-*[a-zA-Z0-9])*)/(invocations|invocations-response-stream)")
_VARIANT = [(b"x-Amzn-Invoked-Production-Variant", b"AllTraffic")]
_ERROR_TYPE = b"x-amzn-ErrorType"


def service_error(status: int, code: str, message: str, error_code: str = "", **members: object) -> Reply:
    """An error as the runtime service sends it: botocore reads the code from ``x-amzn-ErrorType``; the body
    carries SageMaker's ``ErrorCode`` and ``Message`` (and a ModelError's own members)."""
    body = {"ErrorCode": error_code or code, "Message": message, **members}
    return Reply(status, orjson.dumps(body),
                 headers=[(_ERROR_TYPE, f"{code}:http://internal.amazon.com/coral/com.amazon.sagemaker/".encode())])


def validation_error(message: str, error_code: str = "VALIDATION_ERROR") -> Reply:
    return service_error(400, "ValidationError", message, error_code)


class RuntimeDoor:
    def __init__(self, router: SageMakerRouter) -> None:
        self.router = router
        self.options = router.options
        self.service = router.service

    def handle(self, method: bytes, path: str, headers: dict[bytes, bytes], body: bytes | bytearray
               ) -> Reply | Deferred | Streamed:
        match = _PATH.fullmatch(path)
        if match is None:
            return service_error(404, "UnknownOperationException", f"no operation at {path}")
        if method != b"POST":
            return service_error(405, "UnknownOperationException", f"{method.decode()} {path} is not an operation")
        endpoint, operation = match.groups()
        target = target_model(headers)
        stream = operation == "invocations-response-stream"
        if self.options.multi_model:
            if not target:
                return validation_error(f"Request is missing a target model header: endpoint {endpoint} is a "
                                        "multi-model endpoint", "TARGET_MODEL_HEADER_MISSING")
        elif target:
            return validation_error(f"Endpoint {endpoint} is not a multi-model endpoint and does not support target "
                                    "model header.", "TARGET_MODEL_HEADER_NOT_SUPPORTED")
        started = time.perf_counter()
        if not self.options.multi_model:
            return self._run(self.options.default_model, headers, body, stream, endpoint, started, error_reply)
        if not stream:
            # The hot path: the target resident, queued in one call (the cache's hit); no task, no wait.
            hit = self._hit(target, headers, body, endpoint, started)
            if hit is not None:
                return hit
        return Deferred(asyncio.ensure_future(self._load_then_run(target, headers, body, stream, endpoint, started)),
                        lambda f: f.result())

    async def _load_then_run(self, target: str, headers: dict[bytes, bytes], body: bytes | bytearray, stream: bool,
                             endpoint: str, started: float) -> Reply | Streamed:
        try:
            resident = await self.service.sagemaker_ensure(target)
        except InferError as exc:
            return self._load_failed(target, exc, endpoint)
        result = self._run(target, headers, body, stream, endpoint, started, sagemaker_error, resident)
        assert result is not None  # (queued with the view its load gave: no miss)
        if not isinstance(result, Deferred):
            return result
        try:
            await asyncio.wait([asyncio.ensure_future(result.future)])  # (an Answer is wrapped in a task)
        except asyncio.CancelledError:
            result.future.cancel()  # the client went away: so does its request
            raise
        return result.finish(result.future)

    def _load_failed(self, target: str, error: InferError, endpoint: str) -> Reply:
        """A target model that could not be made ready: its archive is the caller's (ValidationError) unless
        the store could not be reached; the model's own load failure is the container's answer (ModelError)."""
        stats = self.router.stats
        stats.invocations += 1
        if isinstance(error, ArchiveError) and error.code == Code.UNAVAILABLE:
            stats.errors_5xx += 1
            return service_error(503, "ServiceUnavailable", f"Could not fetch TargetModel '{target}': {error.message}",
                                 "SERVICE_UNAVAILABLE")
        if isinstance(error, ArchiveError) or error.code == Code.NOT_FOUND:
            stats.errors_4xx += 1
            return validation_error(f"Failed to download model data for TargetModel '{target}': {error.message}")
        stats.errors_4xx += 1  # a 424, whatever the container said
        return self._model_error(sagemaker_error(error), endpoint)

    def _run(self, name: str, headers: dict[bytes, bytes], body: bytes | bytearray, stream: bool, endpoint: str,
             started: float, failed, resident: ModelView | None = None) -> Reply | Deferred | Streamed:
        """``resident``: a multi-model target's view, as ``sagemaker_ensure`` gave it."""
        if stream:
            return self._stream(name, headers, body, endpoint, resident)
        if resident is not None:
            result = self.router.infer_target(name, headers, body, failed, started, resident)
            assert result is not None  # (queued with the view its load gave: no miss)
        else:
            result = self.router.infer(name, headers, body, failed, started)
        return self._answered(result, endpoint)

    def _hit(self, target: str, headers: dict[bytes, bytes], body: bytes | bytearray, endpoint: str,
             started: float) -> Reply | Deferred | None:
        """A multi-model target queued where it is resident, in one call (None: a miss, nothing done)."""
        result = self.router.infer_target(target, headers, body, sagemaker_error, started)
        return None if result is None else self._answered(result, endpoint)

    def _answered(self, result: Reply | Deferred, endpoint: str) -> Reply | Deferred:
        if isinstance(result, Deferred):
            return Deferred(result.future, lambda f: self._answer(result.finish(f), endpoint))
        return self._answer(result, endpoint)

    def _answer(self, reply: Reply, endpoint: str) -> Reply:
        if reply.status < 300:
            return Reply(reply.status, reply.body, reply.content_type, _VARIANT)
        return self._model_error(reply, endpoint)

    @staticmethod
    def _model_error(reply: Reply, endpoint: str) -> Reply:
        """A container's failure, as the runtime service reports it to the caller."""
        original = reply.body if isinstance(reply.body, bytes) else b"".join(reply.body)
        text = original.decode("utf-8", "replace")
        side = "client" if reply.status < 500 else "server"
        message = (f"Received {side} error ({reply.status}) from primary with message \"{text}\". "
                   "See the naiad server log for more information.")
        _log_model_error(reply.status, endpoint, text)  # which the message promises, at default verbosity
        error_code = "CLIENT_ERROR_FROM_MODEL" if reply.status < 500 else "SERVER_ERROR_FROM_MODEL"
        return service_error(424, "ModelError", message, error_code, OriginalStatusCode=reply.status,
                             OriginalMessage=text,
                             LogStreamArn=f"naiad:endpoint/{endpoint}" if endpoint else "naiad")

    # --- response streams --------------------------------------------------------------------------------------

    async def _stream_later(self, name: str, headers: dict[bytes, bytes], body: bytes | bytearray, endpoint: str
                            ) -> Reply | Deferred | Streamed:
        try:
            model = await self.router.service.model(name)
        except InferError as exc:
            return self._model_error(sagemaker_error(exc), endpoint)
        return self._stream(name, headers, body, endpoint, None, model)

    def _stream(self, name: str, headers: dict[bytes, bytes], body: bytes | bytearray, endpoint: str,
                resident: ModelView | None = None, known: ModelView | None = None) -> Reply | Deferred | Streamed:
        """``known``: the view of ``name`` where it was asked for already (``_stream_later``)."""
        from naiad.frontends.sagemaker import eventstream  # only response streams frame events

        service = self.router.service
        model = resident or known
        if model is None:
            try:
                model = service.view(name)
            except InferError as exc:
                return self._model_error(sagemaker_error(exc), endpoint)
            if model is None:  # not known here yet (the model host's, across processes): ask, then go on
                return later(self._stream_later(name, headers, body, endpoint))
        if model.decoupled or self.options.inference_type == "generate_stream":
            try:
                started = self.router.http.generate(name, "", body, True)
            except InferError as exc:
                return self._model_error(sagemaker_error(exc), endpoint)

            def begin(future: asyncio.Future) -> Any:  # Reply | Streamed: the protocol takes either
                inner = started.finish(future)  # refused before inference: a JSON error reply
                if not isinstance(inner, Streamed):
                    return self._model_error(inner, endpoint)
                return Streamed(_parts(inner.chunks), eventstream.CONTENT_TYPE,
                                [*_VARIANT, (b"X-Amzn-SageMaker-Content-Type", inner.content_type)])

            return Deferred(started.future, begin)
        if resident is not None:
            result = self.router.infer_target(name, headers, body, sagemaker_error, time.perf_counter(), resident)
            assert result is not None  # (queued with the view its load gave: no miss)
        else:
            result = self.router.infer(name, headers, body, sagemaker_error, None, model)
        if not isinstance(result, Deferred):
            return self._model_error(result, endpoint)

        def finish(future: asyncio.Future) -> Reply:
            reply = result.finish(future)
            if reply.status >= 300:
                return self._model_error(reply, endpoint)
            data = reply.body if isinstance(reply.body, bytes) else b"".join(bytes(c) for c in reply.body)
            return Reply(200, eventstream.payload_part(data), eventstream.CONTENT_TYPE,
                         [*_VARIANT, (b"X-Amzn-SageMaker-Content-Type", reply.content_type)])

        return Deferred(result.future, finish)


async def _parts(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    from naiad.frontends.sagemaker import eventstream

    async for chunk in chunks:
        yield eventstream.payload_part(chunk)

