"""KServe v2 gRPC (``inference.GRPCInferenceService``) through Ray Serve's gRPC proxy: the pieces the ingress and
the model replicas share.

Ray's proxy serves the services its ``grpc_servicer_functions`` register and calls, for each RPC, the application's
ingress method of the RPC's name. ``add_inference_service`` registers Triton's service with requests kept as their
bytes: the ingress reads the model's name from them (``field_text``, no parse) and forwards the bytes to a replica
holding the model (Ray's multiplexing, as for HTTP), where naiad's own gRPC handlers (``local_table``, the ones
``naiad serve --grpc-port`` runs) parse the message once and encode the answer, which crosses back as bytes.
Kept free of Ray imports (Ray's proxy imports this module to start its gRPC server).
"""

from __future__ import annotations

from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as pb

from naiad.core.errors import InferError
from naiad.frontends.grpc.inference import Inference
from naiad.frontends.grpc.server import answers_unparsable, method_table
from naiad.frontends.grpc.status import GRPC_STATUS
from naiad.service import Face

SERVICE = "inference.GRPCInferenceService"
SERVICER = "naiad.ray.rpc.add_inference_service"  # gRPCOptions.grpc_servicer_functions
RPC = "rpc"  # the model replica's method for a unary RPC
STREAM = "stream"  # and for one request of a ModelStreamInfer stream
_METHODS = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods

# A unary RPC's answer from a replica: status code (grpc.StatusCode's number, 0 for OK), details, the encoded response
# message, the replica's id and the model's residency there (as the HTTP path's x-naiad-* headers say).
RpcWire = tuple[int, str, bytes, bytes, bytes]
_CODES = {code.value[0]: code for code in grpc.StatusCode}


def add_inference_service(servicer: Any, server: Any) -> None:
    """Ray's servicer function: every RPC of Triton's service, its requests left as bytes (no deserializer). Ray's
    proxy replaces the behaviours below with its own routing, keeping each RPC's streaming kind."""
    def unused(*_: Any) -> None:
        raise NotImplementedError  # pragma: no cover - Ray's proxy replaces it

    handlers = {method.name: (grpc.stream_stream_rpc_method_handler(unused) if method.client_streaming
                              else grpc.unary_unary_rpc_method_handler(unused)) for method in _METHODS}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


def status_number(error: InferError) -> int:
    return int(GRPC_STATUS[error.code].value[0])


def status_code(number: int) -> grpc.StatusCode:
    return _CODES[number]


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def field_text(data: bytes, number: int) -> str | None:
    """The string field ``number`` of a serialized message ("" when absent; the last one when repeated, as a parser
    takes it), or None where the bytes are not a message. Fields are skipped by their lengths: a tensor's contents
    cost nothing to pass over."""
    found = ""
    pos, end = 0, len(data)
    try:
        while pos < end:
            tag, pos = _varint(data, pos)
            kind = tag & 7
            if kind == 2:
                size, pos = _varint(data, pos)
                if pos + size > end:
                    return None
                if tag >> 3 == number:
                    found = data[pos:pos + size].decode()
                pos += size
            elif kind == 0:
                pos = _varint(data, pos)[1]
            elif kind == 1:
                pos += 8
            elif kind == 5:
                pos += 4
            else:
                return None
    except (IndexError, UnicodeDecodeError):
        return None
    return found if pos == end else None


class Call:
    """A gRPC call's context as naiad's handlers use it, for a call that reached them through Ray: the client's
    metadata in, the status out."""

    __slots__ = ("message", "metadata", "status")

    def __init__(self, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self.metadata = metadata
        self.status = 0
        self.message = ""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    def set_code(self, code: grpc.StatusCode) -> None:
        self.status = int(code.value[0])

    def set_details(self, details: str) -> None:
        self.message = details


class Encoded:
    """An encoded response message where Ray wants a message: Ray's replica calls ``SerializeToString``."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def SerializeToString(self) -> bytes:
        return self.data


def local_table(service: Face) -> dict[str, grpc.RpcMethodHandler]:
    """naiad's gRPC handlers over ``service``, by RPC name, each answering a message that does not parse as Triton
    does."""
    paths = method_table(service, Inference(service))
    prefix = f"/{SERVICE}/"
    return {path[len(prefix):]: answers_unparsable(handler) for path, handler in paths.items()
            if path.startswith(prefix)}


async def answer(handler: grpc.RpcMethodHandler, data: bytes, context: Any) -> bytes:
    """A unary RPC's encoded answer (b"" when it failed: the status is on ``context``)."""
    reply = await handler.unary_unary(handler.request_deserializer(data), context)
    return b"" if reply is None else handler.response_serializer(reply)
