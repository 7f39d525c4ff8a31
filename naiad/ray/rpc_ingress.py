"""The ingress's gRPC side: a method per RPC of Triton's ``inference.GRPCInferenceService``, as Ray's gRPC proxy
calls them (the method's name is the RPC's; the request arrives as its bytes, see ``naiad.ray.rpc``).

An RPC about a model (ModelInfer, ModelReady, ModelMetadata, ModelConfig, RepositoryModelLoad, and each request
of a ModelStreamInfer stream) goes, as its bytes, to a replica holding the model: Ray's multiplexing, with the
model's name read from the request as the multiplexed model id, as for HTTP. So a client sends no Ray metadata.
Server-wide RPCs are answered here by naiad's handlers over the ingress's service (no model loaded), and
ModelStatistics from every replica's figures.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb

from naiad.core.errors import InferError, internal, invalid
from naiad.frontends.grpc.codec import stream_error
from naiad.frontends.grpc.inference import UNPARSABLE, UNPARSABLE_MESSAGE, wants_grpc_errors
from naiad.frontends.grpc.ordering import OrderedStream, Slot
from naiad.frontends.grpc.status import fail
from naiad.ray.routing import AUTOMATIC, lost
from naiad.ray.rpc import RPC, STREAM, Encoded, answer, field_text, local_table, status_code
from naiad.service import Face

log = logging.getLogger("naiad.ray")

# The RPCs a model's replica answers, and the request field that names the model.
FORWARDED = {"ModelReady": 1, "ModelMetadata": 1, "ModelConfig": 1, "ModelInfer": 1, "RepositoryModelLoad": 2}
_HERE = ("ServerLive", "ServerReady", "ServerMetadata", "RepositoryIndex", "SystemSharedMemoryStatus",
         "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister", "CudaSharedMemoryStatus",
         "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister", "TraceSetting", "LogSettings")
TRAILERS = ("x-naiad-replica", "x-naiad-residency")  # as the HTTP path's headers: which replica, hit or load
_INTERNAL = int(grpc.StatusCode.INTERNAL.value[0])


class RpcIngress:
    """Mixed into the ingress (``Ingress``), which provides ``reach`` and ``summed``."""

    def __init__(self, service: Face) -> None:
        self.rpc_local = local_table(service)

    async def reach(self, name: str, method: str, args: tuple) -> Any:
        raise NotImplementedError

    async def summed(self, name: str, version: str) -> dict[str, Any]:
        raise NotImplementedError

    async def answer_here(self, rpc: str, request: bytes, grpc_context: Any) -> Encoded:
        return Encoded(await answer(self.rpc_local[rpc], request, grpc_context))

    async def forward_rpc(self, rpc: str, request: bytes, grpc_context: Any) -> Encoded:
        name = field_text(request, FORWARDED[rpc])
        if not name:  # bytes that don't parse, or no model named: naiad's answer to that, given here
            return await self.answer_here(rpc, request, grpc_context)
        try:
            status, details, body, replica, residency = await self.reach(name, RPC, (rpc, request))
        except InferError as exc:
            fail(grpc_context, exc)
            return Encoded(b"")
        if status:
            grpc_context.set_code(status_code(status))
            grpc_context.set_details(details)
        grpc_context.set_trailing_metadata([(TRAILERS[0], replica.decode()), (TRAILERS[1], residency.decode())])
        return Encoded(body)

    async def ModelStatistics(self, request: bytes, grpc_context: Any) -> Encoded:
        message = self.rpc_local["ModelStatistics"].request_deserializer(request)
        if message is UNPARSABLE:
            return await self.answer_here("ModelStatistics", request, grpc_context)
        try:
            stats = await self.summed(message.name, message.version)
        except InferError as exc:
            fail(grpc_context, exc)
            return Encoded(b"")
        return Encoded(json_format.ParseDict(stats, pb.ModelStatisticsResponse()).SerializeToString())

    async def RepositoryModelUnload(self, request: bytes, grpc_context: Any) -> Encoded:
        fail(grpc_context, invalid(AUTOMATIC.format("unloading")))
        return Encoded(b"")

    async def ModelStreamInfer(self, requests: AsyncIterator[bytes], grpc_context: Any
                               ) -> AsyncIterator[Encoded]:
        relay = _Relay(self.reach, wants_grpc_errors(grpc_context))
        reader = asyncio.ensure_future(relay.read(requests))
        try:
            while True:
                item = await relay.outbox.get()
                if item is None:
                    break
                if isinstance(item, tuple):  # the stream ends with this status (Ray's proxy sends what was set)
                    grpc_context.set_code(status_code(item[0]))
                    grpc_context.set_details(item[1])
                    raise _Ended(item[1])
                yield Encoded(item)
        finally:
            reader.cancel()
            for task in list(relay.tasks):
                task.cancel()


class _Ended(Exception):
    """Ends a stream with the status set on its context: a generator's end can't carry one through Ray."""


def _here(rpc: str) -> Callable[..., Any]:
    async def method(self: RpcIngress, request: bytes, grpc_context: Any) -> Encoded:
        return await self.answer_here(rpc, request, grpc_context)
    method.__name__ = method.__qualname__ = rpc
    return method


def _forwarded(rpc: str) -> Callable[..., Any]:
    async def method(self: RpcIngress, request: bytes, grpc_context: Any) -> Encoded:
        return await self.forward_rpc(rpc, request, grpc_context)
    method.__name__ = method.__qualname__ = rpc
    return method


for _rpc in _HERE:
    setattr(RpcIngress, _rpc, _here(_rpc))
for _rpc in FORWARDED:
    setattr(RpcIngress, _rpc, _forwarded(_rpc))


class _Relay(OrderedStream):
    """One ModelStreamInfer stream: each request goes to a replica holding its model (a streamed call answering
    first whether the model is decoupled, then the encoded responses); a decoupled model's responses leave as they
    come, the others' in request order, as ``naiad serve`` sends them."""

    def __init__(self, reach: Callable[[str, str, tuple], Any], grpc_errors: bool) -> None:
        super().__init__()
        self.reach = reach
        self.grpc_errors = grpc_errors

    async def read(self, requests: AsyncIterator[bytes]) -> None:
        try:
            async for data in requests:
                name = field_text(data, 1)
                if name is None:  # the stream ends there, as Triton's does
                    self.outbox.put_nowait((_INTERNAL, UNPARSABLE_MESSAGE))
                    return
                self.start(self._run(name, data, self.slot()))
        finally:
            self.done_reading()

    async def _run(self, name: str, data: bytes, slot: Slot) -> None:
        ordered: Slot | None = slot
        try:
            decoupled, items = await self.reach(name, STREAM, (data, self.grpc_errors))
            if decoupled:  # out of the order: its responses leave as they come
                ordered = None
                self.complete(slot)
            async for item in items:
                self.emit(item, ordered)
        except Exception as exc:
            error = exc if isinstance(exc, InferError) else lost(exc, name)
            if not isinstance(error, InferError):
                log.exception("stream request for model '%s' failed", name)
                error = internal(f"{type(exc).__name__}: {exc}")
            self.emit(stream_error(error, pb.ModelInferRequest(id=field_text(data, 3) or "")).SerializeToString(),
                       ordered)
        if ordered is not None:
            self.complete(ordered)
