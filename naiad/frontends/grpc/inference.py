"""ModelInfer and ModelStreamInfer over the service.

ModelInfer is the hot path: decode, queue, await the model's future, encode; errors set the call's
status instead of raising through grpc. ModelStreamInfer goes through ``Service.stream`` so decoupled
models can answer a request many times: responses of non-decoupled models leave in request order (as
Triton sends them), a decoupled model's as they come. A stream opened with the ``triton_grpc_error: true`` header
(Triton 24.08's opt-in) ends at the first failed inference with that error as the call's gRPC status, instead
of carrying it in a response message.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as pb

from naiad.core.answer import for_reply
from naiad.core.errors import Code, InferError, internal
from naiad.frontends.grpc.codec import (
    OutputOptions,
    decode_request,
    encode_response,
    parse_version,
    stream_empty_final,
    stream_error,
    stream_response,
)
from naiad.frontends.grpc.options import GrpcOptions
from naiad.frontends.grpc.ordering import OrderedStream, Slot
from naiad.frontends.grpc.status import fail
from naiad.service import Face, ModelView
from naiad.service import Inference as InferenceFace

log = logging.getLogger("naiad.grpc")

_DECOUPLED_INFER = "ModelInfer RPC doesn't support models with decoupled transaction policy"
# Triton's answer (INTERNAL) to a request message that does not parse; ``UNPARSABLE`` stands for such a message
# where the server engine hands it to a handler (grpc.aio, see server.py) rather than answering it itself.
UNPARSABLE_MESSAGE = "Unable to parse request"
UNPARSABLE: Any = object()
GRPC_ERROR_HEADER = "triton_grpc_error"


def wants_grpc_errors(context: Any) -> bool:
    """Whether the stream's client asked for errors as gRPC status codes (the header's value "true")."""
    for key, value in context.invocation_metadata() or ():
        if key == GRPC_ERROR_HEADER:
            return str(value).strip().lower() == "true"
    return False


class _Failure:
    """The error that ends a ``triton_grpc_error`` stream, in the stream's response order."""

    __slots__ = ("error",)

    def __init__(self, error: InferError) -> None:
        self.error = error


class Inference:
    def __init__(self, service: Face, options: GrpcOptions | None = None) -> None:
        self.service = service
        # None unless configured: the only per-request cost is the attribute check.
        self.forward = (options or GrpcOptions()).header_forward

    def forwarded(self, metadata: Any) -> dict[str, str]:
        """The call's metadata that ``--grpc-header-forward-pattern`` passes to the model. ``metadata`` is the lean
        engine's header dict or a grpc context; either way, only what grpc shows an application counts: no
        pseudo-headers or grpc's own, and no binary (``-bin``) values."""
        pairs = metadata.items() if isinstance(metadata, dict) else metadata.invocation_metadata()
        return self.forward.select(  # type: ignore[union-attr]
            (k, v) for k, v in pairs
            if not (k.startswith((":", "grpc-")) or k.endswith("-bin") or k in ("te", "content-type")))

    def view(self, message: pb.ModelInferRequest) -> ModelView | None:
        """The view of the version the request names, where known now (else await ``model``); raises ``InferError``."""
        version = message.model_version
        return self.service.view(message.model_name, parse_version(version) if version else "")

    async def model(self, message: pb.ModelInferRequest) -> ModelView:
        version = message.model_version
        return await self.service.model(message.model_name, parse_version(version) if version else "")

    def begin(self, message: pb.ModelInferRequest, model: ModelView, metadata: Any = None,
              raw: list[memoryview] | None = None, answer: bool = False) -> tuple[Any, ModelView, OutputOptions]:
        """Decode and queue a ModelInfer request for ``model``'s version (raises ``InferError``): the half every
        server engine shares. ``metadata`` (see ``forwarded``) is read only when headers are forwarded; ``raw``: the
        raw_input_contents kept out of the message (raw_contents.py). ``answer``: the caller answers from the
        future's callback (not by awaiting it), so the future is ``core.answer.for_reply``'s, as the HTTP front
        end's replies are."""
        service = self.service
        if model.decoupled:
            raise InferError(_DECOUPLED_INFER, Code.UNSUPPORTED)
        request, options = decode_request(message, model, service.shared_memory, raw)
        if self.forward is not None and metadata is not None:
            request.parameters.update(self.forwarded(metadata))
        return service.infer(request, model, for_reply(service.in_flight) if answer else None), model, options

    @staticmethod
    def finish(response: Any, model: ModelView, options: OutputOptions,
               raw_out: list[bytes | memoryview] | None = None) -> pb.ModelInferResponse:
        """The model's answer as the RPC's message (raises ``InferError``); with ``raw_out``, big outputs' bytes go
        there instead (``encode_response``)."""
        if response.error is not None:
            raise response.error
        return encode_response(response, options, model.labels if options.classification else None, model.batching,
                               raw_out)

    async def ModelInfer(self, message: pb.ModelInferRequest, context: Any, raw: list[memoryview] | None = None,
                         raw_out: list[bytes | memoryview] | None = None) -> pb.ModelInferResponse | None:
        """``raw`` / ``raw_out``: a big request's and answer's tensors, kept out of the messages (raw_contents.py)."""
        try:
            future, model, options = self.begin(message, self.view(message) or await self.model(message), context,
                                                raw)
            # A model that answers inline has already resolved the future: skip the suspension.
            response = future.result() if future.done() else await future
            return self.finish(response, model, options, raw_out)
        except InferError as exc:
            fail(context, exc)
            return None
        except Exception as exc:  # noqa: BLE001 - a bug costs this call, answered as the lean engine answers it
            log.exception("ModelInfer failed")
            fail(context, internal(f"{type(exc).__name__}: {exc}"))
            return None

    async def ModelStreamInfer(self, messages: AsyncIterator[pb.ModelInferRequest], context: Any
                               ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        stream = _Stream(self.service, self.forwarded(context) if self.forward is not None else None,
                         wants_grpc_errors(context))
        reader = asyncio.ensure_future(stream.read(messages))
        try:
            while True:
                item = await stream.outbox.get()
                if item is None:
                    break
                if item is UNPARSABLE:  # the stream ends there, as Triton's does
                    context.set_code(grpc.StatusCode.INTERNAL)
                    context.set_details(UNPARSABLE_MESSAGE)
                    return
                if type(item) is _Failure:  # triton_grpc_error: the stream ends with the error as its status
                    fail(context, item.error)
                    return
                yield item
            if reader.done() and not reader.cancelled() and reader.exception() is not None:
                raise reader.exception()  # type: ignore[misc]
        finally:
            # The client went away or the stream ended: stop reading and abandon what is still running.
            reader.cancel()
            for task in list(stream.tasks):
                task.cancel()


class _Stream(OrderedStream):
    """One ModelStreamInfer call: the reader queues requests, each request's responses go to ``outbox``."""

    def __init__(self, service: InferenceFace, forwarded: dict[str, str] | None = None, grpc_errors: bool = False) -> None:
        super().__init__()
        self.service = service
        self.forwarded = forwarded  # the stream's forwarded metadata, given to each of its requests
        self.grpc_errors = grpc_errors  # triton_grpc_error: a failed inference ends the stream

    async def read(self, messages: AsyncIterator[pb.ModelInferRequest]) -> None:
        try:
            async for message in messages:
                if message is UNPARSABLE:
                    self.outbox.put_nowait(UNPARSABLE)
                    return
                self._start(message)
        finally:
            self.done_reading()

    def _start(self, message: pb.ModelInferRequest, model: ModelView | None = None,
               reserved: Slot | None = None) -> None:
        """Decode and run one request of the stream; ``reserved``: the slot its answer takes (its place in the
        stream's order), kept while its view was asked for (``_start_later``)."""
        decoupled = False
        try:
            if model is None:
                model = self.service.view(message.model_name, parse_version(message.model_version))
                if model is None:  # not known here yet (the model host's, across processes): ask, in order
                    self.start(self._start_later(message, self.slot()))
                    return
            decoupled = model.decoupled
            request, options = decode_request(message, model, self.service.shared_memory)
            if self.forwarded:
                request.parameters.update(self.forwarded)
        except Exception as exc:  # noqa: BLE001 - InferError, or a bug: either costs this request, not the stream
            if not isinstance(exc, InferError):
                log.exception("stream request failed")
                exc = internal(f"{type(exc).__name__}: {exc}")
            refused = reserved or self.slot()
            refused.items.append(stream_error(exc, message))
            self.complete(refused)
            return
        if reserved is not None and decoupled:
            self.complete(reserved)  # (a decoupled model's responses go as they come: no place held)
            reserved = None
        slot = None if decoupled else (reserved or self.slot())
        self.start(self._run(message, model, request, options, decoupled, slot))

    async def _start_later(self, message: pb.ModelInferRequest, reserved: Slot) -> None:
        try:
            model = await self.service.model(message.model_name, parse_version(message.model_version))
        except InferError as exc:
            reserved.items.append(stream_error(exc, message))
            self.complete(reserved)
            return
        self._start(message, model, reserved)

    async def _run(self, message: pb.ModelInferRequest, model: ModelView, request: Any, options: OutputOptions,
                   decoupled: bool, slot: Slot | None) -> None:
        labels = model.labels if options.classification else None
        try:
            async for response in self.service.stream(request, model):
                if decoupled and response.final and response.error is None and not response.outputs:
                    # Only the "complete" flag: Triton sends it only to clients that asked for it.
                    if options.enable_empty_final:
                        self.emit(stream_empty_final(message), slot)
                    continue
                if response.error is not None and self.grpc_errors:
                    self.emit(_Failure(response.error), slot)
                    continue  # the stream ends when it is this one's turn: what follows is never sent
                self.emit(stream_response(response, options, labels, message, model.batching), slot)
        except InferError as exc:
            # Refused when queued (e.g. the model's signature check): answered like a decode error.
            self.emit(stream_error(exc, message), slot)
        except Exception as exc:  # a bug must cost one answer, not the whole stream
            log.exception("stream request failed")
            self.emit(stream_error(internal(f"{type(exc).__name__}: {exc}"), message), slot)
        if slot is not None:
            self.complete(slot)
