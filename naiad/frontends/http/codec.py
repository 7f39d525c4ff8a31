"""The KServe v2 JSON body and Triton's binary tensor extension: decoding requests, encoding responses.

A request body is a JSON header, optionally followed by raw tensor bytes when the
``Inference-Header-Content-Length`` header says where the JSON ends. Inputs with
``parameters.binary_data_size`` take their bytes from that tail, in order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from naiad.core.datatypes import BF16, WIRE_TO_NUMPY, element_count, serialize_bytes
from naiad.core.errors import internal, invalid
from naiad.core.request import InferRequest, InferResponse
from naiad.core.request import log_prefix as _log
from naiad.core.shared_memory import SharedMemoryRegistry, SharedMemoryUse
from naiad.core.tensors import bad_shape, classify, from_buffer
from naiad.frontends.http import floats

# Request parameters that steer the server rather than reach the model.
_RESERVED_PARAMETERS = frozenset(
    ("sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output")
)
_OBJECT = np.dtype(np.object_)
_SMALL = 256  # elements: a JSON output this small is written from a list (encode_response)


class OutputOptions:
    """What the client asked of the outputs: binary or JSON, per output or for all, or into shared memory."""

    __slots__ = ("binary", "binary_default", "classification", "shm")

    def __init__(self) -> None:
        self.binary_default = False
        self.binary: dict[str, bool] = {}
        self.classification: dict[str, int] = {}
        self.shm: SharedMemoryUse | None = None  # set when a tensor names a shared memory region

    def shared_memory(self) -> SharedMemoryUse:
        if self.shm is None:
            self.shm = SharedMemoryUse()
        return self.shm


def decode_request(
    body: bytes | bytearray, header_length: int | None, model_name: str, model_version: str,
    shared_memory: SharedMemoryRegistry | None = None,
) -> tuple[InferRequest, OutputOptions]:
    """``header_length`` None: the body is all JSON; 0: the body is one raw input with no JSON at all.
    ``shared_memory``: the registered regions tensors may name."""
    request = InferRequest(model_name, model_version)
    options = OutputOptions()
    header: bytes | bytearray | memoryview
    tail: bytes | memoryview
    if header_length is None:
        header, tail = body, b""
    else:
        if header_length < 0 or header_length > len(body):
            raise invalid(f"inference header size should be in range (0, {len(body)}), got: {header_length}")
        if header_length == 0:
            request.raw_input = bytes(body)
            options.binary_default = True  # Triton answers a raw request in binary (EVBufferToRawInput)
            return request, options
        view = memoryview(body)
        header, tail = view[:header_length], view[header_length:]
    if not header:
        request.raw_input = b""
        options.binary_default = True
        return request, options
    doc = _parse_json(header)
    if not isinstance(doc, dict):
        raise internal("Unable to parse 'inputs': attempt to access non-existing object member 'inputs'")

    request_id = doc.get("id")
    if request_id is not None:
        if not isinstance(request_id, str):
            raise internal("Unable to parse 'id': attempt to access JSON non-string as string")
        request.id = request_id
    if "parameters" in doc:
        _apply_parameters(request, options, doc["parameters"])

    inputs = _member(doc, "inputs", list, "array")
    # First every input takes its share of the binary tail (Triton reports short bodies before
    # anything else), then the shares are checked against the declared shapes.
    pending: list[tuple[str, str, np.dtype, list[int], Any]] = []
    offset = 0
    for item in inputs:
        name, datatype, dtype, shape, source, used = _parse_input(item, tail, offset, model_name, options,
                                                                  shared_memory)
        offset += used
        pending.append((name, datatype, dtype, shape, source))
    if offset != len(tail):
        raise invalid(f"unexpected additional input data for model '{model_name}'")
    for name, datatype, dtype, shape, source in pending:
        count = element_count(shape)
        if isinstance(source, _Binary):
            array = from_buffer(name, source.chunk, dtype, shape, request, model_name,
                                core_bytes_wording=source.__class__ is _Mapped)
        else:
            array = _from_json(source, dtype, count)
            if len(shape) != 1:  # (one dimension: the flat array has it already)
                try:
                    array = array.reshape(shape)
                except ValueError:  # a shape NumPy can't make, e.g. [0, 2^63-1] (see tensors.reshaped)
                    raise bad_shape(name, shape, request, model_name) from None
        if name in request.inputs:
            raise invalid(f"{_log(request)}input '{name}' already exists in request")
        request.inputs[name] = array

    if "outputs" in doc:
        outputs = _member(doc, "outputs", list, "array")
        requested = []
        for item in outputs:
            out_name = _member(item, "name", str, "string")
            requested.append(out_name)
            out_params = _object(item.get("parameters"))
            shm = "shared_memory_region" in out_params
            if shm:
                _check_shm_output(out_params)
            # A listed output is binary only if it says so; binary_data_output covers unlisted requests.
            options.binary[out_name] = _boolean(out_params.get("binary_data", False), "binary_data")
            if out_params:
                if "classification" in out_params:
                    k = out_params["classification"]
                    if type(k) is not int or k < 0:
                        raise internal("Unable to set 'classification': attempt to access JSON "
                                       "non-unsigned-integer as unsigned-integer")
                    if k:
                        options.classification[out_name] = k
                if shm:
                    region, shm_offset, shm_size = _shm_parameters(out_params)
                    options.shared_memory().output(shared_memory, out_name, region, shm_offset, shm_size)
        if requested:
            request.requested_outputs = requested
    return request, options


def _parse_json(header: bytes | bytearray | memoryview) -> Any:
    try:
        return orjson.loads(header)
    except orjson.JSONDecodeError as exc:
        # Only the text: the exception itself, kept past this block, would hold its traceback, whose frame holds
        # the exception and ``header`` (a reference cycle that pins the body until a full garbage collection).
        error = str(exc)
    # Triton's parser reads the header as a C string: a NUL (binary data the header length reached
    # into) ends the document.
    text = header if isinstance(header, (bytes, bytearray)) else bytes(header)  # one copy at most
    nul = text.find(b"\0")
    if nul > 0:
        try:
            return orjson.loads(memoryview(text)[:nul])
        except orjson.JSONDecodeError:
            pass
    if "UTF-8" in error:
        raise invalid(f"failed to parse the request JSON buffer: {error}") from None
    raise internal(f"failed to parse the request JSON buffer: {error}") from None


class _Binary:
    __slots__ = ("chunk",)

    def __init__(self, chunk: bytes | memoryview) -> None:
        self.chunk = chunk


class _Mapped(_Binary):
    """An input's bytes in a registered shared memory region: Triton's core checks them, in its own words."""

    __slots__ = ()


_ONE_SOURCE = ("Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
               "'shared_memory_region' in 'parameters'. ")


def _member(doc: Any, key: str, kind: type, kind_name: str) -> Any:
    """``doc[key]`` of the given JSON kind, or Triton's rapidjson-worded error (INTERNAL, as Triton answers)."""
    if not isinstance(doc, dict) or key not in doc:
        raise internal(f"Unable to parse '{key}': attempt to access non-existing object member '{key}'")
    value = doc[key]
    if not isinstance(value, kind):
        raise internal(f"Unable to parse '{key}': attempt to access JSON non-{kind_name} as {kind_name}")
    return value


def _object(value: Any) -> dict[str, Any]:
    """A tensor's ``parameters``: Triton looks members up only in an object, so anything else has none."""
    return value if isinstance(value, dict) else {}


def _boolean(value: Any, key: str) -> bool:
    if type(value) is not bool:
        raise internal(f"Unable to parse '{key}': attempt to access JSON non-boolean as boolean")
    return value


def _apply_parameters(request: InferRequest, options: OutputOptions, parameters: Any) -> None:
    if not isinstance(parameters, dict):
        raise internal("failed to get request params.: attempt to get members for non-object")
    for key in parameters:
        if key.startswith("triton_"):
            raise invalid("parameter keys starting with 'triton_' are reserved for Triton usage and should not be "
                          "specified.")
    if "binary_data_output" in parameters:
        options.binary_default = _boolean(parameters["binary_data_output"], "binary_data_output")
    if "sequence_id" in parameters:
        sequence_id = parameters["sequence_id"]
        if not (isinstance(sequence_id, str) or (type(sequence_id) is int and sequence_id >= 0)):
            raise internal("Unable to parse 'sequence_id': expected an unsigned integer or a string")
        request.correlation_id = sequence_id
    if "sequence_start" in parameters and _boolean(parameters["sequence_start"], "sequence_start"):
        request.flags |= 1
    if "sequence_end" in parameters and _boolean(parameters["sequence_end"], "sequence_end"):
        request.flags |= 2
    if "priority" in parameters:
        request.priority = _unsigned(parameters["priority"], "priority")
    if "timeout" in parameters:
        request.timeout_us = _unsigned(parameters["timeout"], "timeout")
    request.parameters = {k: v for k, v in parameters.items() if k not in _RESERVED_PARAMETERS}


def _unsigned(value: Any, key: str) -> int:
    if type(value) is not int or value < 0:
        raise internal(f"Unable to parse '{key}': attempt to access JSON non-unsigned-integer as unsigned-integer")
    return value


def _parse_input(item: Any, tail: bytes | memoryview, offset: int, model_name: str, options: OutputOptions,
                 shared_memory: SharedMemoryRegistry | None) -> tuple[str, str, np.dtype, list[int], Any, int]:
    if type(item) is dict and "data" in item and "parameters" not in item:
        # The common JSON input: the checks below in their order, without the lookups of the general case.
        name, datatype, shape = item.get("name"), item.get("datatype"), item.get("shape")
        if type(name) is str and type(datatype) is str and type(shape) is list:
            for dim in shape:
                if type(dim) is not int or dim < 0:
                    raise internal("Unable to parse 'shape': attempt to access JSON non-unsigned-integer as "
                                   "unsigned-integer")
            dtype = WIRE_TO_NUMPY.get(datatype)
            if dtype is not None and datatype != "FP16" and datatype != "BF16":
                return name, datatype, dtype, shape, item["data"], 0
    if not isinstance(item, dict):
        raise invalid(_ONE_SOURCE + "But no field is set")
    name = _member(item, "name", str, "string")
    datatype = _member(item, "datatype", str, "string")
    shape = _member(item, "shape", list, "array")
    for dim in shape:
        if type(dim) is not int or dim < 0:
            raise internal("Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer")
    dtype = WIRE_TO_NUMPY.get(datatype)
    if dtype is None:
        raise invalid(f"invalid datatype for input {name}")
    params = _object(item.get("parameters"))
    sources = []
    if "data" in item:
        sources.append("'data'")
    if params and "binary_data_size" in params:
        sources.append("'binary_data_size'")
    if params and "shared_memory_region" in params:
        sources.append("'shared_memory_region'")
    if len(sources) != 1:
        raise invalid(_ONE_SOURCE + ("But set " + " ".join(sources) if sources else "But no field is set"))
    if "data" in item:
        if params:
            _shm_parameters(params)  # Triton parses them beside 'data' too
        if datatype == "FP16" or datatype == "BF16":
            raise invalid(f"receiving {datatype} data via JSON is not supported. Please use the binary data "
                          f"format for input {name}")
        return name, datatype, dtype, shape, item["data"], 0
    if "shared_memory_region" in params:
        region, shm_offset, shm_size = _shm_parameters(params)
        view = options.shared_memory().input(shared_memory, region, shm_offset, shm_size)
        return name, datatype, dtype, shape, _Mapped(view), 0
    size = params["binary_data_size"]
    if type(size) is not int or size < 0:
        raise internal("Unable to parse 'binary_data_size': attempt to access JSON non-unsigned-integer as "
                       "unsigned-integer")
    if offset + size > len(tail):
        raise invalid(f"unexpected size for input '{name}', expecting {offset + size - len(tail)} additional bytes "
                      f"for model '{model_name}'")
    return name, datatype, dtype, shape, _Binary(tail[offset : offset + size]), size


def _shm_parameters(params: dict[str, Any]) -> tuple[str, int, int]:
    """A tensor's region, offset and byte size (0 when not given, as Triton reads them)."""
    region = params.get("shared_memory_region", "")
    if not isinstance(region, str):
        raise internal("Unable to parse 'shared_memory_region': attempt to access JSON non-string as string")
    sizes = [0, 0]
    for i, key in enumerate(("shared_memory_offset", "shared_memory_byte_size")):
        if key in params:
            value = params[key]
            if type(value) is not int or value < 0:
                raise internal(f"Unable to parse '{key}': attempt to access JSON non-unsigned-integer as "
                               "unsigned-integer")
            sizes[i] = value
    return region, sizes[0], sizes[1]


def _check_shm_output(params: dict[str, Any]) -> None:
    """What a shared-memory output can't also ask for, checked before anything else about it."""
    if "classification" in params:
        raise invalid("Output can't set both 'shared_memory_region' and 'classification'")
    if "binary_data" in params:
        binary = params["binary_data"]
        if type(binary) is not bool:
            raise internal("Unable to set 'binary_data': attempt to access JSON non-boolean as boolean")
        if binary:
            raise invalid("Output can't set both 'shared_memory_region' and 'binary_data'")


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


# JSON value types each kind of tensor takes: floats take numbers, integers take integers (wrapping
# like a C cast, as Triton does), booleans take booleans. bool is checked apart because it is an int.
_ACCEPTED_TYPES: dict[str, set[type]] = {"f": {int, float}, "i": {int}, "u": {int}, "b": {bool}}
_KIND_ERRORS = {
    "f": "Unable to parse 'data': attempt to access JSON non-number as double",
    "i": "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer",
    "u": "Unable to parse 'data': attempt to access JSON non-unsigned-integer as unsigned-integer",
    "b": "Unable to parse 'data': attempt to access JSON non-boolean as boolean",
}
_SHAPE_MISMATCH = "Unable to parse 'data': Shape does not match true shape of 'data' field"
_INT64 = np.dtype(np.int64)


def _from_json(data: Any, dtype: np.dtype, count: int) -> np.ndarray:
    """The flat array of ``count`` elements that ``data`` holds (the caller gives it the request's shape)."""
    if not isinstance(data, list):
        raise internal("Unable to parse 'data': attempt to access JSON non-array as array")
    # One pass at C speed tells which JSON types are present; nested data is walked flat, as Triton does.
    types = set(map(type, data))
    flat = data
    if list in types:
        flat = _flatten(data)
        types = set(map(type, flat))
    if len(flat) != count:
        raise internal(_SHAPE_MISMATCH)
    if dtype is _OBJECT:
        if types - {str}:
            raise internal("Unable to parse JSON bytes array: attempt to access JSON non-string as string")
        array = np.empty(count, dtype=np.object_)
        array[:] = [value.encode("utf-8") for value in flat]
        return array
    kind = dtype.kind
    if not types <= _ACCEPTED_TYPES[kind]:
        raise internal(_KIND_ERRORS[kind])
    try:
        if kind == "u" and flat and min(flat) < 0:
            raise internal(_KIND_ERRORS["u"])
        if kind in "iu" and dtype.itemsize < 8:
            array = np.array(flat, dtype=_INT64).astype(dtype)
        else:
            array = np.array(flat, dtype=dtype)
    except OverflowError:
        raise internal(_KIND_ERRORS[kind]) from None
    return array


def encode_response(response: InferResponse, options: OutputOptions, labels: dict[str, list[str]] | None = None,
                    batching: bool = True) -> tuple[bytes, list[bytes | memoryview], int | None]:
    """The JSON header, the binary chunks that follow it, and the header length (None when all JSON).
    ``batching``: the model's max_batch_size > 0 (classification then ranks each batch row)."""
    # Triton's key order: the id (when there is one) comes first.
    doc: dict[str, Any] = {"id": response.id} if response.id else {}
    doc["model_name"] = response.model_name
    doc["model_version"] = response.model_version
    if response.parameters:
        doc["parameters"] = _parameters(response.parameters)
    outputs = []
    chunks: list[bytes | memoryview] = []
    binary_default = options.binary_default
    per_output = options.binary
    shm = options.shm
    for name, array in response.outputs.items():
        k = options.classification.get(name)
        if k:
            array = classify(array, k, (labels or {}).get(name), batching)
        datatype = "BYTES" if array.dtype == _OBJECT else _wire_name(array.dtype)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if shm is not None and name in shm.outputs:
            shm.write(name, array)  # the response then only describes it, as Triton's does
        elif per_output.get(name, binary_default):
            raw = serialize_bytes(array) if datatype == "BYTES" else _contiguous(array)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        elif datatype == "BYTES":
            entry["data"] = [_to_str(v) for v in array.ravel()]
        elif datatype == "FP32" or datatype == "FP64":
            # Triton's float text (RapidJSON's Grisu2 and layout, FP32 through double), which no JSON library
            # writes: pre-written, so the document's bytes don't depend on orjson's version.
            entry["data"] = orjson.Fragment(floats.array_json(array))
        elif datatype == "FP16" or datatype == "BF16":
            raise invalid(f"sending {datatype} data via JSON is not supported. Please use the binary data format "
                          "for output")
        elif array.size <= _SMALL:
            # A small tensor as a list of Python ints or bools, which orjson writes exactly as it writes the
            # array, at a fraction of the array path's NumPy calls.
            entry["data"] = array.ravel().tolist()
        else:
            entry["data"] = _contiguous_array(array)
        outputs.append(entry)
    doc["outputs"] = outputs
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    return header, chunks, (len(header) if chunks else None)


def _parameters(parameters: dict[str, Any]) -> dict[str, Any]:
    """Response parameters, floats in Triton's text (as its writer gives every double)."""
    if float not in set(map(type, parameters.values())):
        return parameters
    return {key: orjson.Fragment(floats.text(value).encode()) if type(value) is float else value
            for key, value in parameters.items()}


_WIRE_BY_DTYPE = {d: w for w, d in WIRE_TO_NUMPY.items()}


def _wire_name(dtype: np.dtype) -> str:
    return _WIRE_BY_DTYPE[dtype]


def _contiguous_array(array: np.ndarray) -> np.ndarray:
    # orjson serializes only C-contiguous, native-endian arrays (ints and bools here: floats are pre-written).
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("=")).ravel()


def _contiguous(array: np.ndarray) -> memoryview:
    array = np.ascontiguousarray(array)
    if array.dtype == BF16:
        array = array.view(np.uint16)  # the buffer protocol has no format for bfloat16; the bytes are the same
    return memoryview(array).cast("B")  # type: ignore[arg-type]  # numpy arrays are buffers


def _to_str(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", errors="replace")
    return str(value)
