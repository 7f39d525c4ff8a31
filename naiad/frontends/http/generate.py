"""Triton's generate extension: ``POST /v2/models/<m>/generate`` and ``/generate_stream`` (server-sent
events), as Triton's HTTP server (``GenerateRequestClass``) maps it. The body is a flat JSON object: a key that
names a model input becomes that input, shaped from the model's metadata (batch dimension included); any other
key becomes a request parameter, and so do those of a ``parameters`` object (whose keys may name inputs too).
``id`` is the request's id (and, as in Triton, a parameter as well). Each response is a flat JSON object of the
outputs, single elements as scalars.
"""

from __future__ import annotations

from typing import Any

import json

import numpy as np
import orjson

from naiad.core.datatypes import WIRE_TO_NUMPY
from naiad.core.errors import InferError, internal, invalid
from naiad.core.request import InferRequest, InferResponse

_NESTED = "parameters"  # Triton's one nested mapping schema


class _Object(list):  # type: ignore[type-arg]
    """A JSON object as its members in order, repeats kept: Triton reads a repeated input key as a second
    input of that name, which it refuses."""


def _loads(body: bytes | bytearray) -> Any:
    return json.loads(body, object_pairs_hook=_Object)


def decode_generate(body: bytes | bytearray, model: Any, name: str, version: str) -> InferRequest:
    try:
        doc = _loads(body) if body else _Object()
    except (ValueError, RecursionError) as exc:
        raise invalid(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(doc, _Object):
        raise invalid("the generate request body must be a JSON object")
    request = InferRequest(name, version)
    request_id = next((v for k, v in doc if k == "id"), None)
    if request_id is not None:
        if not isinstance(request_id, str):
            raise internal("Unable to parse 'id': attempt to access JSON non-string as string")
        request.id = request_id
    inputs = {meta["name"]: meta for meta in model.inputs}
    _convert(doc, inputs, request, nested=True)
    return request


def _convert(doc: _Object, inputs: dict[str, dict[str, Any]], request: InferRequest, nested: bool) -> None:
    for key, value in doc:
        if nested and key == _NESTED:
            if key in inputs:
                raise invalid(f"Keyword '{key}' for nested schema also given as input tensor name")
            if not isinstance(value, _Object):
                raise internal(f"Expected JSON object for keyword: '{key}': attempt to access JSON non-object as "
                               "object")
            try:
                _convert(value, inputs, request, nested=False)
            except InferError as exc:  # Triton names the nested keyword it was converting
                raise InferError(f"Converting keyword: '{key}': {exc.message}", exc.code) from None
        elif key in inputs:
            if key in request.inputs:
                raise invalid(f"input '{key}' already exists in request")
            request.inputs[key] = _tensor(key, value, inputs[key])
        else:
            request.parameters[key] = _parameter(key, value)


def _parameter(key: str, value: Any) -> Any:
    if isinstance(value, (str, int, float)):  # bool is an int
        return value
    raise invalid(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")


def _tensor(name: str, value: Any, meta: dict[str, Any]) -> np.ndarray:
    """One input from a JSON scalar or 1-D array, shaped as Triton does: the fixed dimensions of the model's
    metadata shape take what they need from the end, the innermost variable one the rest, others 1."""
    wire = meta["datatype"]
    items = value if isinstance(value, list) else [value]
    count = len(items)
    try:
        if wire == "BYTES":
            if not all(isinstance(i, str) for i in items):
                raise internal(f"Unable to parse 'data' of input '{name}': attempt to access JSON non-string as "
                               "string")
            array = np.empty(count, dtype=np.object_)
            array[:] = [i.encode() for i in items]
        elif wire == "BOOL" and not all(isinstance(i, bool) for i in items):
            raise internal("Unable to parse 'data': attempt to access JSON non-boolean as boolean")
        else:
            dtype = WIRE_TO_NUMPY.get(wire)
            if dtype is None:
                raise invalid(f"input '{name}' has unsupported datatype {wire}")
            array = np.array(items, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise invalid(f"unable to convert input '{name}' to {wire}: {exc}") from None
    if array.ndim != 1:
        raise invalid(f"The schema can not convert input '{name}' to tensor with proper shape")
    shape = list(meta["shape"])
    remaining = count
    for i in range(len(shape) - 1, -1, -1):
        d = shape[i]
        if d != -1:
            if d == 0 or remaining % d:
                raise invalid(f"The schema can not convert input '{name}' to tensor with proper shape")
            remaining //= d
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] == -1:
            shape[i] = remaining
            remaining = 1
    if remaining != 1:
        raise invalid(f"The schema can not convert input '{name}' to tensor with proper shape")
    return array.reshape(shape)


def encode_generate(response: InferResponse) -> bytes:
    doc: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        doc["id"] = response.id
    for key, value in (response.parameters or {}).items():  # as Triton: response parameters are keys too
        if isinstance(value, (str, int, float)):
            doc[key] = value
    for name, array in response.outputs.items():
        doc[name] = _value(array)
    return orjson.dumps(doc)


def _value(array: np.ndarray) -> Any:
    flat = array.ravel()
    if array.dtype == np.object_:
        items: list[Any] = [x.decode("utf-8", "replace") if isinstance(x, (bytes, bytearray)) else str(x)
                            for x in flat]
    else:
        items = flat.tolist()
    return items[0] if len(items) == 1 else items


def sse_event(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


def sse_error(message: str) -> bytes:
    return sse_event(orjson.dumps({"error": message}))
