"""Python model instances that run inside the server process (``--backend-config=python,in-process=true``):
no isolation and one GIL for everything, but no transport either; kept for comparisons and debugging."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from typing import Any, Awaitable

from naiad.backends.base import Core, Execution, ExecuteResult, Instance, VersionContext
from naiad.backends.python import metrics, pb_utils
from naiad.backends.python.runner import check_response, check_result, execute_failed, initialize
from naiad.core.errors import InferError, internal
from naiad.core.request import InferRequest, InferResponse

_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}
_log = logging.getLogger("naiad.model")


class InProcessHost:
    """pb_utils' host inside the server: metrics straight into the registry, BLS only as ``async_exec``
    (a blocking ``exec`` on the event loop thread would wait for itself)."""

    def __init__(self, core: Core | None) -> None:
        self.core = core

    def log(self, level: int, message: str) -> None:
        _log.log(_LEVELS.get(level, logging.INFO), message)

    def exec(self, request: pb_utils.InferenceRequest, decoupled: bool) -> Any:
        raise pb_utils.TritonModelException(
            "blocking BLS exec() is not available to models running in-process; use async_exec() or run the model "
            "in a worker process (the default)")

    async def async_exec(self, request: pb_utils.InferenceRequest, decoupled: bool) -> Any:
        if self.core is None:
            raise pb_utils.TritonModelException("BLS requests need a running naiad server")
        core_request = InferRequest(
            request._model_name, str(request._model_version) if request._model_version >= 0 else "",
            request._request_id, {t._name: t._array for t in request._inputs},
            request._requested_output_names or None, dict(request._parameters))
        core_request.correlation_id = request._correlation_id
        core_request.flags = request._flags
        core_request.timeout_us = request._timeout
        responses = []
        try:
            if decoupled:
                async for response in self.core.stream(core_request):
                    responses.append(_to_pb(response))
                return pb_utils.ResponseIterator(responses)
            return _to_pb(await self.core.infer(core_request))
        except InferError as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(exc.message))

    def control(self, op: str, name: str, arg: str, extra: dict[str, Any]) -> Any:
        if op == "ready" and self.core is not None and hasattr(self.core, "model_ready"):
            return self.core.model_ready(name, arg)  # type: ignore[attr-defined]
        raise pb_utils.TritonModelException(f"model {op} is not available to in-process models")

    def metric_family(self, name: str, description: str, kind: int) -> None:
        try:
            metrics.REGISTRY.family(name, description, kind, owner="in-process")
        except metrics.MetricError as exc:
            raise pb_utils.TritonModelException(str(exc)) from None

    def metric_new(self, family: str, labels: dict[str, str], buckets: list[float] | None) -> None:
        metrics.REGISTRY.metric(family, labels, buckets)

    def metric_op(self, key: Any, op: str, value: float) -> float:
        if op == "value":
            return metrics.REGISTRY.value(key)
        metrics.REGISTRY.apply(key, op, value)
        return 0.0


def _to_pb(response: InferResponse) -> pb_utils.InferenceResponse:
    if response.error is not None:
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(response.error.message))
    out = pb_utils.InferenceResponse([pb_utils.Tensor._wrap(n, a) for n, a in response.outputs.items()])
    out._parameters = response.parameters
    return out


class InProcessInstance(Instance):
    def __init__(self, ctx: VersionContext, model: Any, args: dict[str, str]) -> None:
        self.name = args["model_instance_name"]
        self.model_name = ctx.name
        self.version = ctx.version
        self.version_str = str(ctx.version)
        self.output_names = [o.name for o in ctx.config.output]
        self.decoupled = ctx.config.model_transaction_policy.decoupled
        self.model = model
        pb_utils._set_host(InProcessHost(ctx.core))
        initialize(model, args, ctx.name)
        self._execute = model.execute

    def execute(self, requests: list[InferRequest]) -> ExecuteResult:
        t0 = time.perf_counter_ns()
        from_core = pb_utils.InferenceRequest._from_core
        pb_requests = [
            from_core(self.model_name, self.version, r, r.requested_outputs or self.output_names) for r in requests
        ]
        for pb_request, request in zip(pb_requests, requests):
            # A non-decoupled model's sender keeps its one response for execute's end (no sender: nothing answers
            # a request early in-process, where execute holds the event loop anyway).
            pb_request._state = pb_utils._RequestState(self.decoupled,
                                                       self._sender(request) if self.decoupled else None)
        t1 = time.perf_counter_ns()
        try:
            result = self._execute(pb_requests)
        except Exception as exc:
            return self._failed(requests, exc, t1 - t0, time.perf_counter_ns() - t1)
        if inspect.isawaitable(result):
            return self._finish_async(result, requests, pb_requests, t0, t1)
        t2 = time.perf_counter_ns()
        if self.decoupled and result is not None:
            return self._returned_while_decoupled(requests, t1 - t0, t2 - t1)
        responses = self._convert(result, requests, pb_requests)
        return Execution(responses, t1 - t0, t2 - t1, time.perf_counter_ns() - t2)

    def _sender(self, request: InferRequest) -> Any:
        def send(response: Any, flags: int) -> None:
            if response is None:
                out = InferResponse(self.model_name, self.version_str, request.id)
            else:
                out = self._convert_one(check_response(response, self.name), request)
            out.final = bool(flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            if request.responder is not None:
                loop = asyncio.get_event_loop()
                loop.call_soon_threadsafe(request.responder, out)
        return send

    async def _finish_async(self, pending: Awaitable[Any], requests: list[InferRequest], pb_requests: list,
                            t0: int, t1: int) -> Execution:
        try:
            result = await pending
        except Exception as exc:
            return self._failed(requests, exc, t1 - t0, time.perf_counter_ns() - t1)
        t2 = time.perf_counter_ns()
        if self.decoupled and result is not None:
            return self._returned_while_decoupled(requests, t1 - t0, t2 - t1)
        responses = self._convert(result, requests, pb_requests)
        return Execution(responses, t1 - t0, t2 - t1, time.perf_counter_ns() - t2)

    def _failed(self, requests: list[InferRequest], exc: BaseException | InferError, input_ns: int,
                infer_ns: int) -> Execution:
        error = exc if isinstance(exc, InferError) else execute_failed(self.name, exc)
        if self.decoupled:
            for request in requests:
                response = self._error_response(request, error)
                if request.responder is not None:
                    request.responder(response)
        return Execution([self._error_response(r, error) for r in requests], input_ns, infer_ns, 0, failed=True)

    def _error_response(self, request: InferRequest, error: InferError | None) -> InferResponse:
        return InferResponse(self.model_name, self.version_str, request.id, error=error)

    def _returned_while_decoupled(self, requests: list[InferRequest], input_ns: int, infer_ns: int) -> Execution:
        """Triton's error for a decoupled execute that returned responses: every request's final answer."""
        return self._failed(requests, internal(
            f"Failed to process the request(s) for model '{self.name}', message: Python model '{self.name}' is using "
            "the decoupled mode and the execute function must return None."), input_ns, infer_ns)

    def _convert(self, result: Any, requests: list[InferRequest], pb_requests: list) -> list[InferResponse]:
        if self.decoupled:
            return [self._error_response(r, None) for r in requests]
        if result is None and all(p._state.response is not None for p in pb_requests):
            result = [p._state.response for p in pb_requests]
        checked = check_result(result, len(requests), self.name)
        return [self._convert_one(c, r) for c, r in zip(checked, requests)]

    def _convert_one(self, checked: Any, request: InferRequest) -> InferResponse:
        if isinstance(checked, InferError):
            return self._error_response(request, checked)
        outputs = {t._name: t._array for t in checked._output_tensors}
        return InferResponse(self.model_name, self.version_str, request.id, outputs, checked._parameters)

    def finalize(self) -> None:
        fin = getattr(self.model, "finalize", None)
        if fin is not None:
            fin()

