"""SageMaker's request and response bodies: KServe v2 JSON, or Triton's
``application/vnd.sagemaker-triton.binary+json;json-header-size=N`` (a JSON header of N bytes, then binary
tensors; N=0: the whole body is the raw input of a single-input model).
"""

from __future__ import annotations

from naiad.core.errors import Code, InferError, invalid
from naiad.core.request import InferRequest, InferResponse
from naiad.frontends.http.codec import OutputOptions, decode_request, encode_response

BINARY_JSON = "application/vnd.sagemaker-triton.binary+json;json-header-size="
JSON = b"application/json"


def _leading_int(text: str) -> int:
    """C's atoi, as Triton 2.51 reads the size: optional sign and leading digits, anything after ignored."""
    text = text.lstrip()
    end = 1 if text[:1] in ("+", "-") else 0
    while end < len(text) and text[end].isdigit():
        end += 1
    try:
        return int(text[:end])
    except ValueError:
        return 0


def header_length(headers: dict[bytes, bytes], body_length: int) -> int:
    """The JSON header's length in bytes: the content type's size, else the whole body (Triton's rule:
    an empty body is therefore a raw input)."""
    content_length = body_length
    declared = headers.get(b"content-length")
    if declared is not None:
        content_length = _leading_int(declared.decode("latin-1"))
    content_type = headers.get(b"content-type")
    if content_type is None:
        return content_length
    text = content_type.decode("latin-1")
    position = text.find(BINARY_JSON)
    if position < 0:
        return content_length
    if position != 0:
        raise invalid(f"expect MIME type for binary data starts with '{BINARY_JSON}', got: {text}")
    size_text = text[len(BINARY_JSON):]
    size = _leading_int(size_text)
    if size < 0 or size > content_length:
        raise invalid(f"inference header size should be in range (0, {content_length}), got: {size_text}")
    return size


def decode(body: bytes | bytearray, headers: dict[bytes, bytes], model: str) -> tuple[InferRequest, OutputOptions]:
    length = header_length(headers, len(body))
    try:
        return decode_request(body, None if length == len(body) and length else length, model, "")
    except InferError as exc:
        if exc.message.startswith("failed to parse the request JSON buffer"):
            exc.code = Code.INTERNAL  # Triton's SageMaker route reports every unparsable header as INTERNAL
        raise


def encode(response: InferResponse, options: OutputOptions, labels: dict[str, list[str]] | None,
           batching: bool = True) -> tuple[list | bytes, bytes]:
    """The reply body and its content type: binary outputs make it binary+json with the header's size."""
    header, chunks, length = encode_response(response, options, labels, batching)
    if length is None:
        return header, JSON
    return [header, *chunks], (BINARY_JSON + str(length)).encode()
