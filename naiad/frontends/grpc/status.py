"""Triton's mapping of its error codes onto gRPC status codes (``GrpcStatusUtil::CodeToStatus``)."""

from __future__ import annotations

from typing import Any

import grpc

from naiad.core.errors import Code, InferError

GRPC_STATUS: dict[Code, grpc.StatusCode] = {
    Code.UNKNOWN: grpc.StatusCode.UNKNOWN,
    Code.INTERNAL: grpc.StatusCode.INTERNAL,
    Code.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Code.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    Code.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Code.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    Code.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Code.CANCELLED: grpc.StatusCode.CANCELLED,
}


def fail(context: Any, error: InferError) -> None:
    """End the call with the error's status; grpc.aio then sends no message body. Cheaper than
    ``context.abort``, which raises through the handler."""
    context.set_code(GRPC_STATUS[error.code])
    context.set_details(error.message)
