"""gRPC ``ModelInferRequest`` / ``ModelInferResponse``: the one place that reads and writes them.

Inputs come from ``raw_input_contents`` (zero-copy views of the message's bytes) or from the typed
``contents`` fields; outputs always leave in ``raw_output_contents``, BYTES length-prefixed, as Triton does.
Reserved request parameters (``sequence_id``, ``sequence_start/end``, ``priority``, ``timeout``) steer the
request like the HTTP codec's; messages are the ones Triton's gRPC front end gives.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from naiad.core.datatypes import WIRE_TO_NUMPY, serialize_bytes
from naiad.core.errors import InferError, invalid, unexpected_input
from naiad.core.model_view import ModelView
from naiad.core.request import InferRequest, InferResponse, log_prefix
from naiad.core.shared_memory import SharedMemoryRegistry, SharedMemoryUse
from naiad.core.tensors import classify, from_buffer
from naiad.frontends.grpc.raw_contents import SPLIT

_OBJECT = np.dtype(np.object_)
_WIRE_BY_DTYPE = {d: w for w, d in WIRE_TO_NUMPY.items()}
_VERSION = re.compile(r"\s*[+-]?\d+")
# The only "triton_" request parameter Triton lets through.
ENABLE_EMPTY_FINAL = "triton_enable_empty_final_response"


def parse_version(version: str) -> str:
    """The request's version string as the repository takes it ("" = newest), read like Triton's ``std::stol``."""
    if not version:
        return ""
    match = _VERSION.match(version)
    if match is None:
        raise invalid(f"failed to get model version from specified version string '{version}' (details: stol), "
                      "version should be an integral value > 0")
    number = int(match.group())
    if number < 0:
        raise invalid(f"invalid model version specified '{version}' , version should be an integral value > 0")
    return str(number)


class OutputOptions:
    """What the request asked of its outputs beyond their names: classification counts, shared memory."""

    __slots__ = ("classification", "enable_empty_final", "shm")

    def __init__(self) -> None:
        self.classification: dict[str, int] = {}
        self.enable_empty_final = False
        self.shm: SharedMemoryUse | None = None  # set when a tensor names a shared memory region

    def shared_memory(self) -> SharedMemoryUse:
        if self.shm is None:
            self.shm = SharedMemoryUse()
        return self.shm


_NO_OPTIONS = OutputOptions()


def decode_request(message: pb.ModelInferRequest, model: ModelView,
                   shared_memory: SharedMemoryRegistry | None = None,
                   raw: Sequence[bytes | memoryview] | None = None) -> tuple[InferRequest, OutputOptions]:
    """Build the server's request; raise ``InferError`` with Triton's gRPC wording for what it refuses.
    ``shared_memory``: the registered regions tensors may name; ``raw``: the raw_input_contents when they were kept
    out of the message (raw_contents.py)."""
    model_name = message.model_name
    request = InferRequest(model_name, model.version, message.id)
    options = _apply_parameters(request, message.parameters) if message.parameters else None
    if raw is None:
        raw = message.raw_input_contents
    index = 0
    inputs = request.inputs
    buffer: bytes | memoryview
    for io in message.inputs:
        name = io.name
        shm = _shm_parameters(io) if io.parameters else None
        if shm is not None:
            if io.HasField("contents"):
                raise invalid(f"unexpected 'content' provided when using shared memory for input tensor '{name}' "
                              f"for model '{model_name}'")
            if options is None:
                options = OutputOptions()
            buffer = options.shared_memory().input(shared_memory, *shm)
        elif io.HasField("contents"):
            if raw:
                raise invalid(f"contents field must not be specified when using raw_input_contents for '{name}' "
                              f"for model '{model_name}'")
            buffer = _contents_buffer(io, model_name)
        elif index < len(raw):
            # Like Triton, raw contents beyond the last input are ignored.
            buffer = raw[index]
            index += 1
        else:
            raise invalid(f"unable to find data for input tensor '{name}' for model '{model_name}' in request.")
        dtype = WIRE_TO_NUMPY.get(io.datatype)
        if dtype is None:
            expected = model.input_datatypes.get(name)
            if expected is None:
                raise unexpected_input(name, model_name, model.input_datatypes)
            raise invalid(f"{log_prefix(request)}inference input '{name}' data-type is '<invalid>', but model "
                          f"'{model_name}' expects '{expected}'")
        if name in inputs:
            raise invalid(f"{log_prefix(request)}input '{name}' already exists in request")
        inputs[name] = from_buffer(name, buffer, dtype, list(io.shape), request, model_name,
                                   core_bytes_wording=True)
    if message.outputs:
        requested = []
        for out in message.outputs:
            requested.append(out.name)
            if out.parameters:
                if options is None:
                    options = OutputOptions()
                _output_parameters(out, options, shared_memory)
        request.requested_outputs = requested
    return request, options or _NO_OPTIONS


# contents field -> the datatype Triton says it carries, given the input's declared datatype.
def _content_type(field: str, datatype: str) -> str:
    if field == "int_contents":
        return datatype if datatype in ("INT8", "INT16") else "INT32"
    if field == "uint_contents":
        return datatype if datatype in ("UINT8", "UINT16") else "UINT32"
    return _FIELD_TYPES[field]


_FIELD_TYPES = {
    "bool_contents": "BOOL",
    "int64_contents": "INT64",
    "uint64_contents": "UINT64",
    "fp32_contents": "FP32",
    "fp64_contents": "FP64",
    "bytes_contents": "BYTES",
}
_FIELDS = ("bool_contents", "int_contents", "int64_contents", "uint_contents", "uint64_contents", "fp32_contents",
           "fp64_contents", "bytes_contents")
# The protobuf field's own element type, before narrowing to the input's (int8/16 ride in int32s).
_FIELD_DTYPES = {"int_contents": np.int32, "uint_contents": np.uint32}


def _contents_buffer(io: Any, model_name: str) -> bytes:
    """The typed ``contents`` as the raw bytes Triton would build from them (8/16-bit integers truncated)."""
    contents = io.contents
    datatype = io.datatype
    buffer: bytes | None = None
    for field in _FIELDS:
        values = getattr(contents, field)
        if not values:
            continue
        carried = _content_type(field, datatype)
        if buffer:
            raise invalid(f"unexpected explicit tensor data for input tensor '{io.name}' for model '{model_name}', "
                          "binary data was already supplied.")
        if carried != datatype:
            expected = datatype if datatype in WIRE_TO_NUMPY else "<invalid>"
            raise invalid(f"unexpected explicit tensor data for input tensor '{io.name}' for model '{model_name}' "
                          f"of type '{carried}', expected datatype '{expected}'")
        if field == "bytes_contents":
            items = np.empty(len(values), dtype=_OBJECT)
            items[:] = list(values)
            buffer = serialize_bytes(items)
        else:
            array = np.array(values, dtype=_FIELD_DTYPES.get(field, WIRE_TO_NUMPY[carried]))
            buffer = array.astype(WIRE_TO_NUMPY[carried], copy=False).tobytes()
    return buffer if buffer is not None else b""


def _shm_parameters(tensor: Any) -> tuple[str, int, int] | None:
    """A tensor's shared memory region, offset and byte size, or None; Triton's checks and words."""
    params = tensor.parameters
    region = params.get("shared_memory_region")
    if region is not None and region.WhichOneof("parameter_choice") != "string_param":
        raise invalid(f"invalid value type for 'shared_memory_region' parameter for tensor '{tensor.name}', "
                      "expected string_param.")
    values = [0, 0]
    for i, key in enumerate(("shared_memory_offset", "shared_memory_byte_size")):
        param = params.get(key)
        if param is not None:
            if region is None:
                raise invalid(f"'{key}' can not be specified without 'shared_memory_region' parameter for tensor "
                              f"'{tensor.name}'")
            if param.WhichOneof("parameter_choice") != "int64_param":
                raise invalid(f"invalid value type for '{key}' parameter for tensor '{tensor.name}', expected "
                              "int64_param.")
            values[i] = param.int64_param
        elif i == 1 and region is not None:
            raise invalid(f"'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter "
                          f"for tensor '{tensor.name}'")
    return None if region is None else (region.string_param, values[0], values[1])


def _output_parameters(out: Any, options: OutputOptions, shared_memory: SharedMemoryRegistry | None) -> None:
    params = out.parameters
    shm = _shm_parameters(out)
    k = 0
    if "classification" in params:
        param = params["classification"]
        if param.WhichOneof("parameter_choice") != "int64_param":
            raise invalid("invalid value type for 'classification' parameter, expected int64_param")
        k = param.int64_param
        if k <= 0:
            raise invalid("invalid value for 'classification' parameter, expected >= 0")
    if shm is not None and k:
        raise invalid("output can't set both 'shared_memory_region' and 'classification'")
    if shm is not None:
        options.shared_memory().output(shared_memory, out.name, *shm)
    if k:
        options.classification[out.name] = k


def _apply_parameters(request: InferRequest, parameters: Any) -> OutputOptions:
    options = OutputOptions()
    passed: dict[str, Any] = {}
    for key, param in parameters.items():
        kind = param.WhichOneof("parameter_choice")
        if key == "sequence_id":
            if kind == "int64_param":
                request.correlation_id = param.int64_param
            elif kind == "string_param":
                request.correlation_id = param.string_param
            else:
                raise invalid("invalid value type for 'sequence_id' parameter, expected int64_param or string_param.")
        elif key in ("sequence_start", "sequence_end"):
            if kind != "bool_param":
                raise invalid(f"invalid value type for '{key}' parameter, expected bool_param.")
            if param.bool_param:
                request.flags |= 1 if key == "sequence_start" else 2
        elif key == "priority":
            if kind == "int64_param":
                if param.int64_param < 0:
                    raise invalid("invalid value for 'priority', expected value >= 0.")
                request.priority = param.int64_param
            elif kind == "uint64_param":
                request.priority = param.uint64_param
            else:
                raise invalid("invalid value type for 'priority' parameter, expected int64_param or uint64_param.")
        elif key == "timeout":
            if kind != "int64_param":
                raise invalid("invalid value type for 'timeout' parameter, expected int64_param.")
            request.timeout_us = param.int64_param
        elif key.startswith("triton_"):
            if key != ENABLE_EMPTY_FINAL:
                raise invalid("parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
                              f"following keys starting with 'triton_' are allowed: {ENABLE_EMPTY_FINAL}")
            if kind != "bool_param":
                raise invalid(f"invalid value type for '{key}' parameter, expected bool_param.")
            options.enable_empty_final = param.bool_param
        elif kind in ("int64_param", "bool_param", "string_param", "double_param"):
            passed[key] = getattr(param, kind)
        else:
            raise invalid(f"invalid value type for '{key}' parameter, expected int64_param, bool_param, or "
                          "string_param.")
    request.parameters = passed
    return options


_OutputTensor = pb.ModelInferResponse.InferOutputTensor


def encode_response(response: InferResponse, options: OutputOptions, labels: dict[str, list[str]] | None,
                    batching: bool = True, raw_out: list[bytes | memoryview] | None = None) -> pb.ModelInferResponse:
    """A successful response: every output's bytes in ``raw_output_contents``, in the model's output order. With
    ``raw_out``, outputs of SPLIT bytes or more in all go there instead, as buffers over the arrays (the caller
    writes them after the message: raw_contents.py) and the message has no raw_output_contents."""
    tensors = []
    raw: list[Any] = []
    size = 0
    classification = options.classification
    shm = options.shm
    for name, array in response.outputs.items():
        if classification:
            k = classification.get(name)
            if k:
                array = classify(array, k, (labels or {}).get(name), batching)
        if shm is not None and name in shm.outputs:
            shm.write(name, array)  # described, with empty contents, as Triton answers
            datatype = "BYTES" if array.dtype == _OBJECT else _WIRE_BY_DTYPE[array.dtype.newbyteorder("=")]
            tensors.append(_OutputTensor(name=name, datatype=datatype, shape=array.shape))
            raw.append(b"")
        elif array.dtype is _OBJECT or array.dtype == _OBJECT:
            tensors.append(_OutputTensor(name=name, datatype="BYTES", shape=array.shape))
            raw.append(serialize_bytes(array))
        else:
            native = _WIRE_BY_DTYPE.get(array.dtype)
            if native is None:  # a non-native byte order: send it as the wire's little-endian
                array = array.astype(array.dtype.newbyteorder("<"))
                native = _WIRE_BY_DTYPE[array.dtype.newbyteorder("=")]
            tensors.append(_OutputTensor(name=name, datatype=native, shape=array.shape))
            raw.append(array)
            size += array.nbytes
    if raw_out is not None and size >= SPLIT:
        for item in raw:
            if isinstance(item, np.ndarray):
                # Its bytes as a buffer that keeps the array (and its memory) alive; viewed as uint8 first, since
                # some dtypes (ml_dtypes' bfloat16) have no buffer format.
                item = memoryview(np.ascontiguousarray(item).reshape(-1).view(np.uint8))  # type: ignore[arg-type]
            raw_out.append(item)
        raw = []
    else:
        raw = [item.tobytes() if isinstance(item, np.ndarray) else item for item in raw]
    message = pb.ModelInferResponse(model_name=response.model_name, model_version=response.model_version,
                                    id=response.id, outputs=tensors, raw_output_contents=raw)
    if response.parameters:
        set_parameters(message.parameters, response.parameters)
    return message


def set_parameters(target: Any, parameters: dict[str, Any]) -> None:
    """Python values into a protobuf ``map<string, InferParameter>``."""
    for key, value in parameters.items():
        param = target[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int):
            param.int64_param = value
        elif isinstance(value, float):
            param.double_param = value
        else:
            param.string_param = str(value)


def stream_response(response: InferResponse, options: OutputOptions, labels: dict[str, list[str]] | None,
                    message: pb.ModelInferRequest, batching: bool = True) -> pb.ModelStreamInferResponse:
    """One response on ModelStreamInfer: outputs or ``error_message``, always with ``triton_final_response``."""
    error = response.error
    if error is None:
        try:
            infer = encode_response(response, options, labels, batching)
        except InferError as exc:
            error = exc
        else:
            infer.parameters["triton_final_response"].bool_param = response.final
            return pb.ModelStreamInferResponse(infer_response=infer)
    # A failed response names the request as it was sent (its version string, not the resolved one).
    infer = pb.ModelInferResponse(id=message.id, model_name=message.model_name, model_version=message.model_version)
    infer.parameters["triton_final_response"].bool_param = response.final
    return pb.ModelStreamInferResponse(error_message=error.message, infer_response=infer)


def stream_empty_final(message: pb.ModelInferRequest) -> pb.ModelStreamInferResponse:
    """The flag-only last response of a decoupled model, sent when the request asked for it."""
    infer = pb.ModelInferResponse(id=message.id, model_name=message.model_name, model_version=message.model_version)
    infer.parameters["triton_final_response"].bool_param = True
    return pb.ModelStreamInferResponse(infer_response=infer)


def stream_error(error: InferError, message: pb.ModelInferRequest) -> pb.ModelStreamInferResponse:
    """A request refused before it reached the model: only the error and the request's id."""
    return pb.ModelStreamInferResponse(error_message=error.message, infer_response=pb.ModelInferResponse(id=message.id))

