"""Errors as Triton classifies them; every front end maps the code to its own status."""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Code(enum.Enum):
    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"


# Triton's HTTP mapping (http_server.cc): anything without a direct match is 400.
HTTP_STATUS: dict[Code, int] = {
    Code.INTERNAL: 500,
    Code.NOT_FOUND: 404,
    Code.UNAVAILABLE: 503,
    Code.UNSUPPORTED: 501,
    Code.UNKNOWN: 400,
    Code.INVALID_ARG: 400,
    Code.ALREADY_EXISTS: 400,
    Code.CANCELLED: 400,
}


# How Triton spells each code when it prefixes a message with it (Status::AsString).
STATUS_NAMES: dict[Code, str] = {
    Code.UNKNOWN: "Unknown",
    Code.INTERNAL: "Internal",
    Code.NOT_FOUND: "Not found",
    Code.INVALID_ARG: "Invalid argument",
    Code.UNAVAILABLE: "Unavailable",
    Code.UNSUPPORTED: "Unsupported",
    Code.ALREADY_EXISTS: "Already exists",
    Code.CANCELLED: "Cancelled",
}


class InferError(Exception):
    """A failure that is an answer: it carries Triton's error code and message."""

    def __init__(self, message: str, code: Code = Code.INVALID_ARG) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.code]

    def __repr__(self) -> str:
        return f"InferError({self.code.name}: {self.message!r})"


def invalid(message: str) -> InferError:
    return InferError(message, Code.INVALID_ARG)


def not_found(message: str) -> InferError:
    return InferError(message, Code.NOT_FOUND)


def unavailable(message: str) -> InferError:
    return InferError(message, Code.UNAVAILABLE)


def internal(message: str) -> InferError:
    return InferError(message, Code.INTERNAL)


def unexpected_input(name: str, model_name: str, inputs: Iterable[str]) -> InferError:
    """Triton's words for an input the model doesn't take, which clients match, then the inputs it does take."""
    expected = ", ".join(f"'{n}'" for n in inputs) or "none"
    return invalid(f"unexpected inference input '{name}' for model '{model_name}' (the model's inputs: {expected})")
