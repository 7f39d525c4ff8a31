"""The KServe v2 JSON body and Triton's binary tensor extension: decoding requests, encoding responses.

A request body is a JSON header, optionally followed by raw tensor bytes when the
``Inference-Header-Content-Length`` header says where the JSON ends. Inputs with
``parameters.binary_data_size`` take their bytes from that tail, in order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from naiad.core.datatypes import WIRE_TO_NUMPY, BytesFormatError, deserialize_bytes, element_count, serialize_bytes
from naiad.core.errors import invalid
from naiad.core.request import InferRequest, InferResponse

# Request parameters that steer the server rather than reach the model.
_RESERVED_PARAMETERS = frozenset(
    ("sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output")
)
_OBJECT = np.dtype(np.object_)


class OutputOptions:
    """What the client asked of the outputs: binary or JSON, per output or for all."""

    __slots__ = ("binary_default", "binary", "classification")

    def __init__(self) -> None:
        self.binary_default = False
        self.binary: dict[str, bool] = {}
        self.classification: dict[str, int] = {}


def decode_request(
    body: bytes | bytearray, header_length: int | None, model_name: str, model_version: str
) -> tuple[InferRequest, OutputOptions]:
    if header_length is None:
        header, tail = body, b""
    else:
        if header_length > len(body):
            raise invalid(
                f"Inference-Header-Content-Length {header_length} is larger than the request body of {len(body)} bytes"
            )
        view = memoryview(body)
        header, tail = view[:header_length], view[header_length:]
    try:
        doc = orjson.loads(header)
    except orjson.JSONDecodeError as exc:
        raise invalid(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(doc, dict):
        raise invalid("failed to parse the request JSON buffer: the request must be a JSON object")

    request = InferRequest(model_name, model_version)
    request_id = doc.get("id")
    if request_id is not None:
        request.id = str(request_id)
    options = OutputOptions()
    parameters = doc.get("parameters")
    if parameters:
        _apply_parameters(request, options, parameters)

    inputs = doc.get("inputs")
    if not isinstance(inputs, list):
        raise invalid("Unable to parse 'inputs': attempt to access non-existent or non-array member")
    offset = 0
    for item in inputs:
        name, array, used = _decode_input(item, tail, offset, request, model_name)
        offset += used
        if name in request.inputs:
            raise invalid(f"{_log(request)}input '{name}' already exists in request")
        request.inputs[name] = array
    if offset != len(tail):
        raise invalid(
            f"{_log(request)}unexpected {len(tail) - offset} bytes of binary data after the last input "
            f"(binary_data_size of the inputs add up to {offset} bytes)"
        )

    outputs = doc.get("outputs")
    if outputs:
        if not isinstance(outputs, list):
            raise invalid("Unable to parse 'outputs': expected an array")
        requested = []
        for item in outputs:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise invalid("Unable to parse 'name': attempt to access non-existent or non-string member")
            out_name = item["name"]
            requested.append(out_name)
            out_params = item.get("parameters")
            if out_params:
                if "binary_data" in out_params:
                    options.binary[out_name] = bool(out_params["binary_data"])
                if out_params.get("classification"):
                    options.classification[out_name] = int(out_params["classification"])
        request.requested_outputs = requested
    return request, options


def _log(request: InferRequest) -> str:
    return f"[request id: {request.id or '<id_unknown>'}] "


def _apply_parameters(request: InferRequest, options: OutputOptions, parameters: Any) -> None:
    if not isinstance(parameters, dict):
        raise invalid("Unable to parse 'parameters': expected an object")
    if "binary_data_output" in parameters:
        options.binary_default = bool(parameters["binary_data_output"])
    if "sequence_id" in parameters:
        request.correlation_id = parameters["sequence_id"]
    if parameters.get("sequence_start"):
        request.flags |= 1
    if parameters.get("sequence_end"):
        request.flags |= 2
    if "priority" in parameters:
        request.priority = int(parameters["priority"])
    if "timeout" in parameters:
        request.timeout_us = int(parameters["timeout"])
    request.parameters = {k: v for k, v in parameters.items() if k not in _RESERVED_PARAMETERS}


def _decode_input(
    item: Any, tail: bytes | memoryview, offset: int, request: InferRequest, model_name: str
) -> tuple[str, np.ndarray, int]:
    if not isinstance(item, dict):
        raise invalid("Unable to parse 'inputs': each input must be a JSON object")
    name = item.get("name")
    if not isinstance(name, str):
        raise invalid("Unable to parse 'name': attempt to access non-existent or non-string member")
    datatype = item.get("datatype")
    if not isinstance(datatype, str):
        raise invalid(f"Unable to parse 'datatype' of input '{name}': attempt to access non-existent member")
    dtype = WIRE_TO_NUMPY.get(datatype)
    if dtype is None:
        raise invalid(f"invalid datatype '{datatype}' of input '{name}'")
    shape = item.get("shape")
    if not isinstance(shape, list) or not all(type(d) is int for d in shape):
        raise invalid(f"Unable to parse 'shape' of input '{name}': expected an array of integers")
    if any(d < 0 for d in shape):
        raise invalid(f"{_log(request)}input '{name}' has a negative dimension in shape {shape}")
    count = element_count(shape)
    params = item.get("parameters")
    if params and "binary_data_size" in params:
        size = params["binary_data_size"]
        if type(size) is not int or size < 0:
            raise invalid(f"Unable to parse 'binary_data_size' of input '{name}'")
        if offset + size > len(tail):
            raise invalid(
                f"{_log(request)}unexpected end of binary data for input '{name}': binary_data_size {size} at offset "
                f"{offset} needs {offset + size} bytes, got {len(tail)}"
            )
        chunk = tail[offset : offset + size]
        return name, _from_binary(name, chunk, dtype, shape, count, request, model_name), size
    if params and "shared_memory_region" in params:
        region = params["shared_memory_region"]
        raise invalid(f"Unable to find system shared memory region: '{region}'")
    if "data" not in item:
        raise invalid(f"{_log(request)}input '{name}' has no data: expected 'data' or 'binary_data_size'")
    return name, _from_json(name, item["data"], datatype, dtype, shape, count), 0


def _from_binary(name: str, chunk: memoryview | bytes, dtype: np.dtype, shape: list[int], count: int,
                 request: InferRequest, model_name: str) -> np.ndarray:
    if dtype is _OBJECT:
        try:
            array = deserialize_bytes(chunk)
        except BytesFormatError as exc:
            raise invalid(f"{_log(request)}{exc} for inference input '{name}' for model '{model_name}'") from None
        if array.size != count:
            raise invalid(
                f"{_log(request)}expected {count} string elements for inference input '{name}' for model "
                f"'{model_name}', got {array.size}"
            )
        return array.reshape(shape)
    expected = count * dtype.itemsize
    if len(chunk) != expected:
        raise invalid(
            f"{_log(request)}input byte size mismatch for input '{name}' for model '{model_name}'. Expected "
            f"{expected}, got {len(chunk)}"
        )
    return np.frombuffer(chunk, dtype=dtype).reshape(shape)


def _flatten(data: list) -> list:
    flat: list = []
    stack = [iter(data)]
    while stack:
        for value in stack[-1]:
            if isinstance(value, list):
                stack.append(iter(value))
                break
            flat.append(value)
        else:
            stack.pop()
    return flat


def _from_json(name: str, data: Any, datatype: str, dtype: np.dtype, shape: list[int], count: int) -> np.ndarray:
    if not isinstance(data, list):
        data = [data]
    if dtype is _OBJECT:
        flat = _flatten(data)
        if len(flat) != count:
            raise invalid(
                f"Unable to parse 'data': Shape does not match true shape of 'data' field for input '{name}': "
                f"expected {count} elements, got {len(flat)}"
            )
        array = np.empty(count, dtype=np.object_)
        for i, value in enumerate(flat):
            if isinstance(value, str):
                array[i] = value.encode("utf-8")
            else:
                raise invalid(f"Unable to parse 'data': expected a string for BYTES input '{name}', got {value!r}")
        return array.reshape(shape)
    try:
        array = np.array(data, dtype=dtype)
    except (ValueError, TypeError, OverflowError) as exc:
        raise invalid(f"Unable to parse 'data' of input '{name}' as {datatype}: {exc}") from None
    if array.ndim != 1:
        if array.dtype == _OBJECT:
            raise invalid(f"Unable to parse 'data' of input '{name}': ragged nested arrays")
        array = array.ravel()
    if array.size != count:
        raise invalid(
            f"Unable to parse 'data': Shape does not match true shape of 'data' field for input '{name}': "
            f"expected {count} elements, got {array.size}"
        )
    if datatype == "BOOL" and not all(type(v) is bool for v in _flatten(data)):
        raise invalid(f"Unable to parse 'data' of input '{name}': expected true or false for BOOL")
    return array.reshape(shape)


def encode_response(response: InferResponse, options: OutputOptions, labels: dict[str, list[str]] | None = None
                    ) -> tuple[bytes, list[bytes | memoryview], int | None]:
    """The JSON header, the binary chunks that follow it, and the header length (None when all JSON)."""
    doc: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        doc["id"] = response.id
    if response.parameters:
        doc["parameters"] = response.parameters
    outputs = []
    chunks: list[bytes | memoryview] = []
    binary_default = options.binary_default
    per_output = options.binary
    for name, array in response.outputs.items():
        k = options.classification.get(name)
        if k:
            array = classify(array, k, (labels or {}).get(name))
        datatype = "BYTES" if array.dtype == _OBJECT else _wire_name(array.dtype)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if per_output.get(name, binary_default):
            raw = serialize_bytes(array) if datatype == "BYTES" else _contiguous(array)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        elif datatype == "BYTES":
            entry["data"] = [_to_str(v) for v in array.ravel()]
        elif datatype == "FP16":
            entry["data"] = array.astype(np.float32).ravel()
        else:
            entry["data"] = _contiguous_array(array)
        outputs.append(entry)
    doc["outputs"] = outputs
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    return header, chunks, (len(header) if chunks else None)


_WIRE_BY_DTYPE = {d: w for w, d in WIRE_TO_NUMPY.items()}


def _wire_name(dtype: np.dtype) -> str:
    return _WIRE_BY_DTYPE[dtype]


def _contiguous_array(array: np.ndarray) -> np.ndarray:
    # orjson serializes only C-contiguous, native-endian arrays.
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("=")).ravel()


def _contiguous(array: np.ndarray) -> memoryview:
    return memoryview(np.ascontiguousarray(array)).cast("B")


def _to_str(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", errors="replace")
    return str(value)


def classify(array: np.ndarray, k: int, labels: list[str] | None) -> np.ndarray:
    """Triton's classification extension: the top ``k`` entries per batch row as ``value:index[:label]``."""
    if array.dtype == _OBJECT:
        raise invalid("classification is not supported for BYTES outputs")
    rows = array.reshape(array.shape[0], -1) if array.ndim > 1 else array.reshape(1, -1)
    k = min(k, rows.shape[1])
    out = np.empty((rows.shape[0], k), dtype=np.object_)
    for r, row in enumerate(rows):
        order = np.argsort(-row, kind="stable")[:k]
        for j, idx in enumerate(order):
            value = row[idx]
            text = f"{float(value):f}" if row.dtype.kind == "f" else str(value)
            label = labels[idx] if labels and idx < len(labels) else None
            out[r, j] = (f"{text}:{idx}:{label}" if label else f"{text}:{idx}").encode()
    return out if array.ndim > 1 else out.reshape(k)
