"""``triton_python_backend_utils`` for naiad: the API a Triton ``model.py`` imports, backed by NumPy.

Everything an unmodified python_backend model touches lives here; the backend builds
``InferenceRequest`` objects from core requests with ``InferenceRequest._from_core``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

from naiad.core.datatypes import deserialize_bytes, numpy_to_wire, serialize_bytes

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

# Config enum order (model_config.proto DataType), as the numeric helpers use it.
_TYPE_ORDER = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
               "FP64", "BYTES"]
_NUMPY_BY_NAME: dict[str, type] = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
    "FP32": np.float32, "FP64": np.float64, "BYTES": np.object_,
}
TRITON_STRING_TO_NUMPY: dict[str, type] = {f"TYPE_{w}": t for w, t in _NUMPY_BY_NAME.items() if w != "BYTES"}
TRITON_STRING_TO_NUMPY["TYPE_STRING"] = np.object_

_logger = logging.getLogger("naiad.model")


class TritonError:
    """An error a model attaches to a response; codes are Triton's TRITONSERVER_Error_Code values."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = str(message)
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


class TritonModelException(Exception):
    pass


class Tensor:
    __slots__ = ("_name", "_array")

    def __init__(self, name: str, array: Any) -> None:
        if not isinstance(array, np.ndarray):
            if hasattr(array, "__dlpack__"):
                array = np.from_dlpack(array)
            else:
                raise TritonModelException(
                    f"Tensor '{name}': expected a numpy.ndarray, got {type(array).__name__}"
                )
        if array.dtype.kind in "SU":
            # Fixed-width strings become BYTES, as Triton's python backend does.
            array = np.array([x.encode() if isinstance(x, str) else bytes(x) for x in array.ravel()],
                             dtype=np.object_).reshape(array.shape)
        elif numpy_to_wire(array.dtype) is None:
            raise TritonModelException(f"Tensor '{name}': unsupported numpy dtype {array.dtype}")
        self._name = name
        self._array = array

    @classmethod
    def _wrap(cls, name: str, array: np.ndarray) -> "Tensor":
        # The server's own arrays are already valid: skip the checks on the hot path.
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int:
        return _TYPE_ORDER.index(numpy_to_wire(self._array.dtype)) + 1

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        if self._array.dtype == np.object_:
            raise TritonModelException("DLPack does not support BYTES tensors")
        return self._array.__dlpack__()

    def __dlpack__(self, stream: Any = None) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._array.__dlpack_device__()

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> "Tensor":
        if hasattr(capsule, "__dlpack__"):
            return Tensor(name, np.from_dlpack(capsule))
        # A bare capsule: wrap it so NumPy's protocol-based importer can consume it.
        return Tensor(name, np.from_dlpack(_CapsuleHolder(capsule)))

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={self.shape()}, dtype={self._array.dtype})"


class _CapsuleHolder:
    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU


class InferenceRequest:
    """A request as a model sees it. Built by the server; BLS construction arrives with the worker issue."""

    __slots__ = ("_inputs", "_request_id", "_correlation_id", "_flags", "_parameters", "_requested_output_names",
                 "_timeout", "_model_name", "_model_version", "_by_name")

    def __init__(
        self,
        model_name: str = "",
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None,
        request_id: str = "",
        correlation_id: int | str = 0,
        flags: int = 0,
        timeout: int = 0,
        model_version: int = -1,
        parameters: dict[str, Any] | str | None = None,
        **_: Any,
    ) -> None:
        self._model_name = model_name
        self._model_version = model_version
        self._inputs = list(inputs or [])
        self._by_name = None
        self._requested_output_names = list(requested_output_names or [])
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._flags = flags
        self._timeout = timeout
        if isinstance(parameters, str):
            parameters = json.loads(parameters)
        self._parameters = parameters or {}

    @classmethod
    def _from_core(cls, model_name: str, model_version: int, request: Any, requested: list[str]) -> "InferenceRequest":
        self = cls.__new__(cls)
        self._model_name = model_name
        self._model_version = model_version
        wrap = Tensor._wrap
        self._inputs = [wrap(n, a) for n, a in request.inputs.items()]
        self._by_name = None
        self._requested_output_names = requested
        self._request_id = request.id
        self._correlation_id = request.correlation_id
        self._flags = request.flags
        self._timeout = request.timeout_us
        self._parameters = request.parameters
        return self

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        # Triton hands parameters to Python models as a JSON string.
        return json.dumps(self._parameters)

    def requested_output_names(self) -> list[str]:
        return list(self._requested_output_names)

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def is_cancelled(self) -> bool:
        return False

    def get_input_tensor_by_name(self, name: str) -> Tensor | None:
        for tensor in self._inputs:
            if tensor._name == name:
                return tensor
        return None

    def exec(self, decoupled: bool = False) -> "InferenceResponse":
        raise TritonModelException("BLS requests are not available in this naiad build yet")

    async def async_exec(self, decoupled: bool = False) -> "InferenceResponse":
        raise TritonModelException("BLS requests are not available in this naiad build yet")


class InferenceResponse:
    __slots__ = ("_output_tensors", "_error", "_parameters")

    def __init__(
        self,
        output_tensors: list[Tensor] | None = None,
        error: TritonError | str | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        self._output_tensors = list(output_tensors or [])
        if isinstance(error, str):
            error = TritonError(error)
        self._error = error
        if isinstance(parameters, str):
            parameters = json.loads(parameters)
        self._parameters = parameters or {}

    def output_tensors(self) -> list[Tensor]:
        return self._output_tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return json.dumps(self._parameters)


class Logger:
    """``pb_utils.Logger``: model log lines go to the server's log."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3

    _LEVELS = {INFO: logging.INFO, WARNING: logging.WARNING, ERROR: logging.ERROR, VERBOSE: logging.DEBUG}

    @staticmethod
    def log(message: str, level: int = INFO) -> None:
        _logger.log(Logger._LEVELS.get(level, logging.INFO), message)

    @staticmethod
    def log_info(message: str) -> None:
        _logger.info(message)

    @staticmethod
    def log_warn(message: str) -> None:
        _logger.warning(message)

    @staticmethod
    def log_error(message: str) -> None:
        _logger.error(message)

    @staticmethod
    def log_verbose(message: str) -> None:
        _logger.debug(message)


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    return inference_request.get_input_tensor_by_name(name)


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def _config_entry(model_config: dict[str, Any], key: str, name: str) -> dict[str, Any] | None:
    for entry in model_config.get(key, []):
        if entry["name"] == name:
            return entry
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return _config_entry(model_config, "input", name)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return _config_entry(model_config, "output", name)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


def triton_to_numpy_type(data_type: int) -> type | None:
    if 1 <= data_type <= len(_TYPE_ORDER):
        return _NUMPY_BY_NAME[_TYPE_ORDER[data_type - 1]]
    return None


def numpy_to_triton_type(data_type: Any) -> int | None:
    if data_type in (np.object_, np.bytes_):
        return 13
    wire = numpy_to_wire(np.dtype(data_type))
    return _TYPE_ORDER.index(wire) + 1 if wire else None


def triton_string_to_numpy(triton_type_string: str) -> type:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def serialize_byte_tensor(input_tensor: np.ndarray) -> np.ndarray | None:
    """Length-prefixed bytes of every element, as a 1-D uint8 view (Triton returns it as bytes in an array)."""
    if input_tensor.size == 0:
        return None
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type != np.bytes_:
        raise TritonModelException("cannot serialize bytes tensor: invalid datatype")
    return np.frombuffer(serialize_bytes(input_tensor), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor: Any) -> np.ndarray:
    return deserialize_bytes(bytes(np.asarray(encoded_tensor).tobytes()) if not isinstance(encoded_tensor, bytes)
                             else encoded_tensor)


class ModelConfig:
    """The auto-complete helper passed to ``auto_complete_config``, with Triton's rules and messages."""

    def __init__(self, model_config: dict[str, Any] | str) -> None:
        self._model_config = json.loads(model_config) if isinstance(model_config, str) else model_config

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    def _name(self) -> str:
        return self._model_config.get("name", "")

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = self._model_config.get("max_batch_size", 0)
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config function for model "
                f"'{self._name()}' specified max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but auto-complete-config function for "
                    f"model '{self._name()}' tries to set scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:
        self._add_io("input", input, ["name", "data_type", "dims", "optional"])

    def add_output(self, output: dict[str, Any]) -> None:
        self._add_io("output", output, ["name", "data_type", "dims"])

    def _add_io(self, kind: str, io: dict[str, Any], valid: list[str]) -> None:
        name = self._name()
        for prop in io:
            if prop not in valid:
                allowed = ", ".join(f"'{v}'" for v in valid[:-1]) + f" and '{valid[-1]}'"
                raise ValueError(
                    f"{kind} '{io.get('name', '')}' in auto-complete-config function for model '{name}' contains "
                    f"property other than {allowed}."
                )
        if "name" not in io:
            raise ValueError(f"{kind} in auto-complete-config function for model '{name}' is missing 'name' property.")
        for prop in ("data_type", "dims"):
            if prop not in io:
                raise ValueError(
                    f"{kind} '{io['name']}' in auto-complete-config function for model '{name}' is missing "
                    f"'{prop}' property."
                )
        entries = self._model_config.setdefault(kind, [])
        for current in entries:
            if current["name"] != io["name"]:
                continue
            if current.get("data_type", "TYPE_INVALID") not in ("TYPE_INVALID", io["data_type"]):
                raise ValueError(
                    f"unable to load model '{name}', configuration expects datatype {current['data_type']} for "
                    f"{kind} '{io['name']}', model provides {io['data_type']}"
                )
            if current.get("dims") and list(current["dims"]) != list(io["dims"]):
                raise ValueError(
                    f"model '{name}', tensor '{io['name']}': the model expects dims {list(io['dims'])} but the model "
                    f"configuration specifies dims {list(current['dims'])}"
                )
            if "optional" in current and "optional" in io and current["optional"] != io["optional"]:
                raise ValueError(
                    f"model '{name}', tensor '{io['name']}': the model expects optional {io['optional']} but the "
                    f"model configuration specifies optional {current['optional']}"
                )
            current["data_type"] = io["data_type"]
            current["dims"] = io["dims"]
            if "optional" in io:
                current["optional"] = io["optional"]
            return
        entries.append(io)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    f"model transaction property in auto-complete-config function for model '{self._name()}' "
                    "contains property other than 'decoupled'"
                )
        current = self._model_config.setdefault("model_transaction_policy", {})
        decoupled = transaction_policy_dict.get("decoupled", False)
        if "decoupled" in current and current["decoupled"] != decoupled:
            raise ValueError(
                f"trying to change decoupled property in auto-complete-config for model '{self._name()}', which is "
                f"initially set to '{current['decoupled']}'."
            )
        current["decoupled"] = decoupled


__all__ = [n for n in dir() if not n.startswith("_") and n not in ("annotations", "Any", "json", "logging", "np")]
