"""AWS event stream framing (``application/vnd.amazon.eventstream``): the encoder the runtime service's
``InvokeEndpointWithResponseStream`` answers with. botocore only decodes it, so naiad writes it here; sans-IO.

A message is a 12-byte prelude (total length, headers length, CRC32 of those 8 bytes), the headers
(1-byte name length, name, 1-byte type, value), the payload, and a CRC32 of everything before it.
All integers are big-endian.

The event shapes follow botocore's sagemaker-runtime model: ``PayloadPart`` binds its ``Bytes`` member as the
event payload (``eventpayload``), so the raw chunk is the whole payload; the stream's modeled errors
(``ModelStreamError``, ``InternalStreamFailure``) are ``exception`` messages whose JSON payload holds the
shape's members, which botocore raises as ``EventStreamError`` with the exception type as the code.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping

CONTENT_TYPE = b"application/vnd.amazon.eventstream"

HeaderValue = str | bytes | bool | int

# Limits of the format (name length is one byte, string and byte array lengths two) and of the decoders:
# botocore refuses more than 128 KiB of headers; the AWS C runtime caps a whole message at 16 MiB.
_MAX_NAME = 255
_MAX_VALUE = 32767
_MAX_HEADERS = 128 * 1024
_MAX_MESSAGE = 16 * 1024 * 1024
_OVERHEAD = 12 + 4  # prelude + message CRC
# A PayloadPart larger than this is sent as several consecutive parts; readers concatenate them anyway.
MAX_PART = 8 * 1024 * 1024

# Header value types (the type byte that follows the name).
_TRUE, _FALSE, _INT32, _INT64, _BYTES, _STRING = 0, 1, 4, 5, 6, 7

_PAYLOAD_PART_HEADERS = {
    ":event-type": "PayloadPart",
    ":message-type": "event",
    ":content-type": "application/octet-stream",
}


def _crc(data: bytes, start: int = 0) -> int:
    return zlib.crc32(data, start) & 0xFFFFFFFF


def _encode_header(name: str, value: HeaderValue) -> bytes:
    raw_name = name.encode("utf-8")
    if not 0 < len(raw_name) <= _MAX_NAME:
        raise ValueError(f"event stream header name must be 1 to {_MAX_NAME} bytes: {name!r}")
    head = struct.pack(">B", len(raw_name)) + raw_name
    # bool before int: True is an int too.
    if isinstance(value, bool):
        return head + struct.pack(">B", _TRUE if value else _FALSE)
    if isinstance(value, int):
        if -(2**31) <= value < 2**31:
            return head + struct.pack(">Bi", _INT32, value)
        if -(2**63) <= value < 2**63:
            return head + struct.pack(">Bq", _INT64, value)
        raise ValueError(f"event stream header {name!r}: {value} does not fit in 64 bits")
    if isinstance(value, str):
        kind, raw = _STRING, value.encode("utf-8")
    elif isinstance(value, (bytes, bytearray, memoryview)):
        kind, raw = _BYTES, bytes(value)
    else:
        raise TypeError(f"event stream header {name!r}: unsupported value type {type(value).__name__}")
    if len(raw) > _MAX_VALUE:
        raise ValueError(f"event stream header {name!r}: value longer than {_MAX_VALUE} bytes")
    return head + struct.pack(">BH", kind, len(raw)) + raw


def encode_message(headers: Mapping[str, HeaderValue], payload: bytes | memoryview) -> bytes:
    """One framed message: prelude, headers in the given order, payload, message CRC."""
    encoded = b"".join(_encode_header(name, value) for name, value in headers.items())
    if len(encoded) > _MAX_HEADERS:
        raise ValueError(f"event stream headers take {len(encoded)} bytes, more than {_MAX_HEADERS}")
    total = _OVERHEAD + len(encoded) + len(payload)
    if total > _MAX_MESSAGE:
        raise ValueError(f"event stream message of {total} bytes is over the {_MAX_MESSAGE}-byte limit")
    lengths = struct.pack(">II", total, len(encoded))
    prelude = lengths + struct.pack(">I", _crc(lengths))
    body = prelude + encoded + bytes(payload)
    return body + struct.pack(">I", _crc(body))


def payload_part(data: bytes) -> bytes:
    """A ``PayloadPart`` event carrying ``data`` as its ``Bytes``; over ``MAX_PART`` it becomes several."""
    if len(data) <= MAX_PART:
        return encode_message(_PAYLOAD_PART_HEADERS, data)
    view = memoryview(data)
    return b"".join(
        encode_message(_PAYLOAD_PART_HEADERS, view[start:start + MAX_PART])
        for start in range(0, len(data), MAX_PART)
    )


def _exception(exception_type: str, members: dict[str, str]) -> bytes:
    headers: dict[str, HeaderValue] = {
        ":exception-type": exception_type,
        ":message-type": "exception",
        ":content-type": "application/json",
    }
    return encode_message(headers, json.dumps(members).encode("utf-8"))


def model_stream_error(message: str, error_code: str) -> bytes:
    """The ``ModelStreamError`` event (codes the service documents: ModelInvocationTimeExceeded, StreamBroken)."""
    return _exception("ModelStreamError", {"Message": message, "ErrorCode": error_code})


def internal_stream_failure(message: str) -> bytes:
    """The ``InternalStreamFailure`` event: the stream failed for a reason that is not the model's."""
    return _exception("InternalStreamFailure", {"Message": message})
