"""The grpc.aio server: ``inference.GRPCInferenceService`` and ``grpc.health.v1.Health`` on the server's loop.

grpc.aio runs on whatever loop is current, uvloop included (it polls its completion queue from its own
thread and hands events to the loop). Handlers are registered as generic handlers with the generated
messages' own (de)serializers, so no servicer class sits between grpc and the handlers.

A request message that does not parse gets Triton's answer, INTERNAL "Unable to parse request" (a stream
ends with it). The method table keeps the bare parsers (the lean engine catches their errors itself, at no cost
to its ModelInfer path); grpc.aio would end such a call UNKNOWN and log a traceback, so for it ``handlers``
wraps each parser to hand the handler ``UNPARSABLE`` instead, and each handler to answer it.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2
from tritonclient.grpc import service_pb2 as pb

from naiad.core.errors import InferError
from naiad.core.restricted import Restrictions
from naiad.frontends import ports
from naiad.frontends.connections import Gate
from naiad.frontends.grpc.control import Control, unary_methods
from naiad.frontends.grpc.inference import UNPARSABLE, UNPARSABLE_MESSAGE, Inference
from naiad.frontends.grpc.options import GrpcOptions
from naiad.frontends.grpc.raw_contents import SPLIT, response_tail, split_request
from naiad.frontends.grpc.status import fail
from naiad.service import CodeConsent, Face

log = logging.getLogger("naiad.grpc")

SERVICE_NAME = "inference.GRPCInferenceService"
HEALTH_NAME = "grpc.health.v1.Health"
_METHODS = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name
# Each RPC's restricted-protocol category, as Triton files them (grpc_server.cc); "Check" is grpc.health.v1's.
CATEGORIES = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health", "Check": "health",
    "ServerMetadata": "metadata", "ModelMetadata": "metadata",
    "ModelInfer": "inference", "ModelStreamInfer": "inference",
    "ModelConfig": "model-config", "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository", "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory", "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory", "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory", "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace", "LogSettings": "logging",
}
assert set(_METHODS) <= set(CATEGORIES), f"RPCs without a category: {set(_METHODS) - set(CATEGORIES)}"


def _guarded(handler: Callable[[Any], Any]) -> Callable[[Any, Any], Any]:
    """A control-plane handler as a grpc.aio one: an ``InferError`` becomes the call's status."""
    async def call(request: Any, context: Any) -> Any:
        try:
            result = handler(request)
            if inspect.isawaitable(result):  # model control: loads wait on a thread, the loop keeps serving
                result = await result
            return result
        except InferError as exc:
            fail(context, exc)
            return None
    return call


def _unary(name: str, behaviour: Callable[[Any, Any], Any]) -> grpc.RpcMethodHandler:
    method = _METHODS[name]
    return grpc.unary_unary_rpc_method_handler(
        behaviour,
        request_deserializer=getattr(pb, method.input_type.name).FromString,
        response_serializer=getattr(pb, method.output_type.name).SerializeToString,
    )


class _Metadata:
    __slots__ = ("metadata",)

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.metadata = metadata

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata


def _restricted(handler: grpc.RpcMethodHandler, restrictions: Restrictions, category: str) -> grpc.RpcMethodHandler:
    """The handler behind Triton's check: without the metadata key and value, the call ends UNAVAILABLE."""
    key, value = restrictions.rules[category]
    message = restrictions.refusal(category)

    def allowed(context: Any) -> bool:
        # The first entry of that key decides (std::multimap::find); metadata keys arrive in lower case.
        return next((v for k, v in context.invocation_metadata() if k == key), None) == value

    if handler.stream_stream is not None:
        inner_stream = handler.stream_stream

        async def stream(requests: Any, context: Any) -> Any:
            if not allowed(context):
                context.set_code(grpc.StatusCode.UNAVAILABLE)
                context.set_details(message)
                return
            async for reply in inner_stream(requests, context):
                yield reply

        def refusal(metadata: tuple[tuple[str, str], ...]) -> str | None:
            return None if allowed(_Metadata(metadata)) else message
        # Triton refuses a restricted stream as soon as it opens; the lean engine, which starts a stream's
        # handler only with its first message, asks this at the stream's headers.
        stream.refusal = refusal  # type: ignore[attr-defined]
        return handler._replace(stream_stream=stream)
    inner = handler.unary_unary

    async def unary(request: Any, context: Any) -> Any:
        if not allowed(context):
            context.set_code(grpc.StatusCode.UNAVAILABLE)
            context.set_details(message)
            return None
        return await inner(request, context)
    return handler._replace(unary_unary=unary)


def method_table(service: Face, inference: Inference, restrictions: Restrictions | None = None
                 ) -> dict[str, grpc.RpcMethodHandler]:
    """Every RPC's handler by its HTTP/2 path (``/package.Service/Method``), for either server engine; those in a
    restricted category check the caller's metadata first (handlers are wrapped only when restricted)."""
    keyed = restrictions is not None and restrictions.rule("model-repository") is not None
    control = Control(service, CodeConsent(keyed, "--grpc-restricted-protocol"))
    table = {name: _unary(name, _guarded(fn)) for name, fn in unary_methods(control).items()}
    table["ModelInfer"] = _unary("ModelInfer", inference.ModelInfer)
    table["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
        inference.ModelStreamInfer,
        request_deserializer=pb.ModelInferRequest.FromString,
        response_serializer=pb.ModelStreamInferResponse.SerializeToString,
    )
    missing = set(_METHODS) - set(table)
    assert not missing, f"unhandled RPCs: {missing}"

    async def health_check(request: health_pb2.HealthCheckRequest, context: Any) -> health_pb2.HealthCheckResponse:
        # Triton answers for any service name: SERVING while the server is live.
        status = health_pb2.HealthCheckResponse.SERVING if service.live else health_pb2.HealthCheckResponse.NOT_SERVING
        return health_pb2.HealthCheckResponse(status=status)

    paths = {f"/{SERVICE_NAME}/{name}": handler for name, handler in table.items()}
    paths[f"/{HEALTH_NAME}/Check"] = grpc.unary_unary_rpc_method_handler(
        health_check,
        request_deserializer=health_pb2.HealthCheckRequest.FromString,
        response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
    )
    if restrictions:
        for path, handler in paths.items():
            category = CATEGORIES[path.rsplit("/", 1)[1]]
            if restrictions.rule(category) is not None:
                paths[path] = _restricted(handler, restrictions, category)
    return paths


def _lenient(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception:  # noqa: BLE001 - whatever the parser raises, the bytes are not the message
            return UNPARSABLE
    return deserialize


def answers_unparsable(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """``handler`` for grpc.aio: its parser never raises, and it answers a message that did not parse as Triton does.
    (ModelStreamInfer, the one streaming RPC, ends its stream on ``UNPARSABLE`` itself.)"""
    handler = handler._replace(request_deserializer=_lenient(handler.request_deserializer))
    if handler.unary_unary is None:
        return handler
    inner = handler.unary_unary

    async def unary(request: Any, context: Any) -> Any:
        if request is UNPARSABLE:
            context.set_code(grpc.StatusCode.INTERNAL)
            context.set_details(UNPARSABLE_MESSAGE)
            return None
        return await inner(request, context)
    return handler._replace(unary_unary=unary)


def handlers(paths: dict[str, grpc.RpcMethodHandler]) -> list[grpc.GenericRpcHandler]:
    """The method table as grpc.aio's generic handlers."""
    by_service: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
    for path, handler in paths.items():
        service_name, method = path[1:].split("/")
        by_service.setdefault(service_name, {})[method] = answers_unparsable(handler)
    return [grpc.method_handlers_generic_handler(name, table) for name, table in by_service.items()]


_INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"


class _Split:
    """A ModelInfer message and its tensors' bytes, kept apart (raw_contents.py): the request's views of the bytes
    grpc handed over, or the answer's arrays."""

    __slots__ = ("message", "raw")

    def __init__(self, message: Any, raw: list[Any] | None) -> None:
        self.message = message
        self.raw = raw


def split_infer(inference: Inference) -> grpc.RpcMethodHandler:
    """grpcio's ModelInfer with big tensors kept out of protobuf both ways (the lean engine splits them itself)."""

    def parse(data: bytes) -> _Split:
        if len(data) < SPLIT:
            return _Split(pb.ModelInferRequest.FromString(data), None)
        rest, raw = split_request(memoryview(data))
        return _Split(pb.ModelInferRequest.FromString(rest), raw)

    async def infer(request: _Split, context: Any) -> _Split | None:
        raw: list[bytes | memoryview] = []
        reply = await inference.ModelInfer(request.message, context, request.raw, raw)
        return None if reply is None else _Split(reply, raw)

    def serialize(reply: _Split) -> bytes:
        data = reply.message.SerializeToString()
        return b"".join((data, *response_tail(reply.raw))) if reply.raw else data

    return grpc.unary_unary_rpc_method_handler(infer, request_deserializer=parse, response_serializer=serialize)


async def start(service: Face, options: GrpcOptions, gate: Gate | None = None,
                port: ports.Port | None = None) -> Any:
    """The gRPC server as ``options.engine`` says; either answers ``await stop(grace=None)``. ``gate``: the port's
    admission, its cap lowered to fit the open file limit (default: the flags'). ``port``: the lean engine's
    listening sockets (ports.listen; bound here when not given); grpcio binds the port itself."""
    gate = gate or Gate(options.max_connections, options.max_connections_per_address)
    engine = options.chosen_engine()
    inference = Inference(service, options)
    paths = method_table(service, inference, options.restricted)
    address = f"{options.address}:{options.port}"
    if engine == "lean":
        from naiad.frontends.grpc import lean

        if port is None:
            port = ports.listen("GRPC", options.address, options.port, options.reuse_port)
        server: Any = await lean.start(paths, inference, options, gate, port)
        log.info("Started GRPCInferenceService at %s (lean HTTP/2 engine%s)", address,
                 ", TLS" if options.use_ssl else "")
        return server
    if options.restricted.rule("inference") is None:
        paths[_INFER_PATH] = split_infer(inference)
    # grpc-core counts connections itself: the port's cap as the open file limit lowered it (no per-address cap).
    capped = [("grpc.max_allowed_incoming_connections", gate.limit)] if gate.limit else []
    server = aio.server(options=options.channel_options() + capped)
    server.add_generic_rpc_handlers(handlers(paths))
    try:
        if options.use_ssl:
            cert, key, root = options.tls_files()
            # Without mutual TLS no client certificate is asked for (Triton's GRPC_SSL_DONT_REQUEST_...).
            credentials = grpc.ssl_server_credentials([(key, cert)], root_certificates=root,
                                                      require_client_auth=options.use_ssl_mutual)
            bound = server.add_secure_port(address, credentials)
        else:
            bound = server.add_insecure_port(address)
    except RuntimeError:
        bound = 0
    if bound == 0:
        # grpc says no more than that (Triton assumes a busy port too); with TLS, its log line above tells a bad
        # certificate or key from a busy port.
        raise SystemExit(ports.bind_error("GRPC", options.address, options.port)
                         + (" (or the TLS certificate or key is invalid)" if options.use_ssl else ""))
    await server.start()
    log.info("Started GRPCInferenceService at %s", address)
    return server
