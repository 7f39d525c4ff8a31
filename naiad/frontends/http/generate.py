"""Triton's generate extension: ``POST /v2/models/<m>/generate`` and ``/generate_stream`` (server-sent
events). The body is a flat JSON object: each key names a model input (its datatype and shape come from
the model's config; a scalar is one element, a list its elements), ``id`` and ``parameters`` steer the
request. Each response is a flat JSON object of the outputs, single elements as scalars.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from naiad.config import pb
from naiad.core.datatypes import CONFIG_TO_WIRE, WIRE_TO_NUMPY
from naiad.core.errors import invalid
from naiad.core.request import InferRequest, InferResponse

_STEERING = frozenset(("id", "parameters"))


def decode_generate(body: bytes | bytearray, model: Any, name: str, version: str) -> InferRequest:
    try:
        doc = orjson.loads(body) if body else {}
    except orjson.JSONDecodeError as exc:
        raise invalid(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(doc, dict):
        raise invalid("the generate request body must be a JSON object")
    request = InferRequest(name, version, str(doc.get("id", "")))
    parameters = doc.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise invalid("'parameters' of a generate request must be a JSON object")
        request.parameters = dict(parameters)
    configs = {io.name: io for io in model.config.input}
    batching = model.config.max_batch_size > 0
    for key, value in doc.items():
        if key in _STEERING:
            continue
        io = configs.get(key)
        if io is None:
            raise invalid(f"unexpected inference input '{key}' for model '{name}'")
        wire = CONFIG_TO_WIRE.get(pb.DataType.Name(io.data_type), "")
        request.inputs[key] = _tensor(key, value, wire, batching)
    return request


def _tensor(name: str, value: Any, wire: str, batching: bool) -> np.ndarray:
    items = value if isinstance(value, list) else [value]
    try:
        if wire == "BYTES":
            array = np.empty(len(items), dtype=np.object_)
            array[:] = [i.encode() if isinstance(i, str) else orjson.dumps(i) for i in items]
        else:
            array = np.array(items, dtype=WIRE_TO_NUMPY[wire])
    except (TypeError, ValueError, KeyError, OverflowError) as exc:
        raise invalid(f"unable to convert input '{name}' to {wire}: {exc}") from None
    return array.reshape((1, *array.shape)) if batching else array


def encode_generate(response: InferResponse) -> bytes:
    doc: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        doc["id"] = response.id
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
