"""``triton_python_backend_utils`` for naiad: the API a Triton ``model.py`` imports, backed by NumPy.

Everything an unmodified python_backend model touches lives here. What leaves the model (BLS, response
senders, log lines, custom metrics, model control) goes through ``_host``, which the worker process (or
the in-process backend) installs.
"""

from __future__ import annotations

import enum
import json
import logging
import weakref
from typing import Any

import numpy as np

from naiad.backends.python import dlpack
from naiad.core.datatypes import BF16, NUMPY_TO_WIRE, deserialize_bytes, numpy_to_wire, serialize_bytes

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

# Config enum order (model_config.proto DataType), as the numeric helpers use it.
_TYPE_ORDER = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
               "FP64", "BYTES", "BF16"]
_NUMPY_BY_NAME: dict[str, type] = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
    "FP32": np.float32, "FP64": np.float64, "BYTES": np.object_, "BF16": BF16.type,  # ml_dtypes.bfloat16
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
        # Triton's binding refuses a missing name or array before anything else (pybind11: TypeError).
        if type(name) is not str:
            _need(name, str, "name")
        if type(array) is not np.ndarray:  # (the checks in order; an exact ndarray passes the first two)
            if array is None:
                raise TypeError("Tensor(): incompatible function arguments: the array must not be None")
            if not isinstance(array, np.ndarray):
                if hasattr(array, "__dlpack__"):
                    array = _from_dlpack(array)
                else:
                    raise TritonModelException(
                        f"Tensor '{name}': expected a numpy.ndarray, got {type(array).__name__}"
                    )
        dtype = array.dtype
        if dtype not in NUMPY_TO_WIRE:  # (a subscript for the usual types, where numpy_to_wire is a call)
            if dtype.kind in "SU":
                # Fixed-width strings become BYTES, as Triton's python backend does.
                array = np.array([x.encode() if isinstance(x, str) else bytes(x) for x in array.ravel()],
                                 dtype=np.object_).reshape(array.shape)
            elif numpy_to_wire(dtype) is None:
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
        if self._array.dtype.kind == "V":  # BF16, NumPy has no such type: Triton refuses it, its words and all
            raise TritonModelException("Tensor dtype is BF16 and cannot be converted to NumPy. Use to_dlpack() "
                                       "and from_dlpack() instead.")
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int:
        return _TYPE_ORDER.index(numpy_to_wire(self._array.dtype) or "") + 1

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        if self._array.dtype == np.object_:
            raise TritonModelException("DLPack does not support BYTES tensors")
        array = self._array
        if not array.flags.writeable:
            # a legacy capsule cannot say read-only (NumPy refuses to export one): the consumer gets its own copy
            array = array.copy()
        if dlpack.is_bf16(array.dtype):
            return dlpack.export_bf16(array)
        return array.__dlpack__()

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._array.__dlpack_device__()

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> "Tensor":
        if capsule is None:
            raise TritonModelException("Tensor.from_dlpack(): a DLPack capsule or an object with __dlpack__ is "
                                       "required")
        return Tensor(name, _from_dlpack(capsule))

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={self.shape()}, dtype={self._array.dtype})"


def _from_dlpack(source: Any) -> np.ndarray:
    """An array from a DLPack capsule or an object with ``__dlpack__``, bfloat16 included (as BF16)."""
    if isinstance(source, np.ndarray):
        return source
    # A legacy capsule, the kind a bare capsule is too (Triton's and torch's to_dlpack), whose dtype can be
    # read and, for bfloat16, retyped before NumPy imports it.
    capsule = source.__dlpack__() if hasattr(source, "__dlpack__") else source
    view = dlpack.import_capsule(capsule)
    # wrapped so NumPy's protocol-based importer can consume it
    array = np.from_dlpack(_CapsuleHolder(capsule))
    return array if view is None else array.view(view)


class _CapsuleHolder:
    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU


class _RequestState:
    """What a request shares with its response sender and with the host: the cancelled flag and where
    decoupled responses go. The host fills it in when it builds the request."""

    __slots__ = ("cancelled", "send", "decoupled", "sent", "closed", "response", "requested", "release", "taken")

    def __init__(self, decoupled: bool = False, send: Any = None, requested: list[str] | None = None) -> None:
        self.cancelled = False
        # callable(response | None, flags), set by the host. A decoupled model's responses all go through it; a
        # non-decoupled model's one response too, flagged FINAL, whenever the model sends it.
        self.send: Any = send
        self.decoupled = decoupled
        self.sent = 0
        self.closed = False
        # A non-decoupled model's one response: SENT once it has left through ``send``, or (a host without a
        # sender) held until execute returns.
        self.response: Any = None
        self.requested = requested  # the output names the request asked for (None: all), for the host
        self.release = TRITONSERVER_REQUEST_RELEASE_ALL  # set_release_flags()
        self.taken = False  # the model asked for the response sender: it may answer after execute returns


# A non-decoupled request's response already went out through its sender.
SENT: Any = object()


class InferenceRequest:
    """A request as a model sees it, or one a model builds to call another model (BLS)."""

    __slots__ = ("_inputs", "_request_id", "_correlation_id", "_flags", "_parameters", "_requested_output_names",
                 "_timeout", "_model_name", "_model_version", "_by_name", "_state", "_sender")

    def __init__(
        self,
        model_name: str = "",
        inputs: Any = (),
        requested_output_names: Any = (),
        request_id: str = "",
        correlation_id: int | str = 0,
        flags: int = 0,
        timeout: int = 0,
        model_version: int = -1,
        parameters: dict[str, Any] | str | None = None,
        **_: Any,
    ) -> None:
        # Triton's binding takes none of these as None (pybind11: TypeError), nor a None among the inputs.
        for value, what in ((model_name, "model_name"), (inputs, "inputs"),
                            (requested_output_names, "requested_output_names"), (request_id, "request_id"),
                            (correlation_id, "correlation_id"), (flags, "flags"), (timeout, "timeout"),
                            (model_version, "model_version")):
            if value is None:
                raise TypeError(f"InferenceRequest(): incompatible function arguments: '{what}' must not be None")
        if any(t is None for t in inputs):
            raise TritonModelException("InferenceRequest(): an input tensor is None")
        if not all(isinstance(n, (str, bytes)) for n in requested_output_names):
            raise TypeError("InferenceRequest(): incompatible function arguments: requested_output_names must be a "
                            "list of strings")
        if not isinstance(correlation_id, (int, str)):
            raise TritonModelException("Correlation ID must be integer or string")
        # Triton's binding takes bytes for its string arguments too (python_backend's bls example passes a
        # name read out of a BYTES tensor).
        self._model_name = model_name.decode() if isinstance(model_name, bytes) else model_name
        self._model_version = model_version
        self._inputs = list(inputs or [])
        self._by_name = None
        self._requested_output_names = list(requested_output_names or [])
        self._request_id = request_id.decode() if isinstance(request_id, bytes) else request_id
        self._correlation_id = correlation_id
        self._flags = flags
        self._timeout = timeout
        self._parameters: dict[str, Any] = (json.loads(parameters) if isinstance(parameters, str) else parameters) or {}
        self._state: _RequestState | None = None
        self._sender: Any = None

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
        self._state = None
        self._sender = None
        return self

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = flags

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
        state = self._state
        if state is None:
            return False
        if not state.cancelled:
            _poll()
        return state.cancelled

    def set_release_flags(self, flags: int) -> None:
        """``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` runs the request again in a later execution (a model whose
        config has ``sequence_batching { iterative_sequence: true }``; elsewhere it is released as usual)."""
        if flags != TRITONSERVER_REQUEST_RELEASE_ALL and flags != TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            raise TritonModelException(f"Invalid request release flags: {flags}")
        if self._state is not None:
            self._state.release = flags

    def get_response_sender(self) -> "InferenceResponseSender":
        if self._state is None:
            raise TritonModelException("a response sender exists only for requests the server passed to execute()")
        if self._sender is None:
            self._sender = InferenceResponseSender(self._state)
            self._state.taken = True
        return self._sender

    def get_input_tensor_by_name(self, name: str) -> Tensor | None:
        for tensor in self._inputs:
            if tensor._name == name:
                return tensor
        return None

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on another model and wait: an ``InferenceResponse``, or with ``decoupled=True`` an
        iterator over every response (the last one may carry no outputs)."""
        return _host.exec(self, decoupled)

    def async_exec(self, decoupled: bool = False) -> Any:
        """An awaitable ``exec``: many can be in flight at once from one ``async def execute``."""
        return _host.async_exec(self, decoupled)


class InferenceResponseSender:
    """Sends the responses of one request, from any thread, while or after ``execute`` runs."""

    __slots__ = ("_state",)

    def __init__(self, state: _RequestState) -> None:
        self._state = state

    def send(self, response: "InferenceResponse | None" = None, flags: int = 0) -> None:
        state = self._state
        if flags != TRITONSERVER_RESPONSE_COMPLETE_FINAL and flags != 0:
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero.")
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(
                f"Unable to send response. Expected an InferenceResponse, found type '{type(response)}'.")
        if not state.decoupled:
            if response is not None and state.sent > 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than one response.")
            if response is None and flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL and state.sent == 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send complete final before sending a "
                    "response.")
        if state.closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        if flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            state.closed = True
        if response is not None:
            state.sent += 1
        if state.decoupled:
            state.send(response, flags)
            return
        # A non-decoupled model's one response leaves at once, as Triton's front ends take a request's first
        # response (the model may go on working, or send it after execute returned None); a FINAL flag alone
        # only closes the sender. A host without a sender takes it when execute returns.
        if response is not None:
            if state.send is not None:
                state.response = SENT
                state.send(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                state.response = response

    def is_cancelled(self) -> bool:
        state = self._state
        if not state.cancelled:
            _poll()
        return state.cancelled


class ResponseIterator:
    """The responses of a decoupled BLS request, as they arrive. ``items`` yields them and ends after the final one."""

    def __init__(self, items: Any, cancel: Any = None) -> None:
        self._items = iter(items)
        self._cancel = cancel

    def __iter__(self) -> "ResponseIterator":
        return self

    def __next__(self) -> "InferenceResponse":
        return next(self._items)

    def cancel(self) -> None:
        if self._cancel is not None:
            self._cancel()


class InferenceResponse:
    __slots__ = ("_output_tensors", "_error", "_parameters")

    def __init__(
        self,
        output_tensors: Any = (),
        error: TritonError | str | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        if output_tensors is None:  # as Triton's binding (pybind11)
            raise TypeError("InferenceResponse(): incompatible function arguments: output_tensors must not be None")
        tensors = self._output_tensors = list(output_tensors)
        for tensor in tensors:  # (a loop, not any() over a generator: one call fewer per response)
            if tensor is None:
                raise TritonModelException("InferenceResponse(): an output tensor is None")
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


class LogLevel(enum.IntEnum):
    """Triton's ``pb_utils.LogLevel`` (a binding enum: a bare int is not a level)."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


class Logger:
    """``pb_utils.Logger``: model log lines go to the server's log. Arguments are checked as Triton's binding
    checks them: a message that is not a string, or a level that is not a ``LogLevel``, is a TypeError."""

    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: LogLevel = LogLevel.INFO) -> None:
        _need(message, str, "message")
        if not isinstance(level, LogLevel):
            raise TypeError("log(): incompatible function arguments: the level must be a pb_utils.LogLevel")
        _host.log(int(level), message)

    @staticmethod
    def log_info(message: str) -> None:
        _host.log(int(Logger.INFO), _need(message, str, "message"))

    @staticmethod
    def log_warn(message: str) -> None:
        _host.log(int(Logger.WARNING), _need(message, str, "message"))

    @staticmethod
    def log_error(message: str) -> None:
        _host.log(int(Logger.ERROR), _need(message, str, "message"))

    @staticmethod
    def log_verbose(message: str) -> None:
        _host.log(int(Logger.VERBOSE), _need(message, str, "message"))


def _need(value: Any, kind: type, what: str) -> Any:
    if not isinstance(value, kind):
        raise TypeError(f"incompatible function arguments: '{what}' must be {kind.__name__}, not "
                        f"{type(value).__name__}")
    return value


class MetricFamily:
    """A custom Prometheus metric family, served on the server's /metrics page."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    def __init__(self, name: str, description: str, kind: int) -> None:
        if kind not in (MetricFamily.COUNTER, MetricFamily.GAUGE, MetricFamily.HISTOGRAM):
            raise TritonModelException("Unknown metric kind")
        if not isinstance(name, str) or not name:
            raise TritonModelException("Error when creating MetricFamily: the name must be a non-empty string")
        self._name = name
        self._description = str(description)
        self._kind = int(kind)
        try:
            _host.metric_family(name, self._description, self._kind)
        except TritonModelException as exc:
            raise TritonModelException(f"Error when creating MetricFamily: {exc}") from None

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> "Metric":
        return Metric(self, labels, buckets)


MetricKind = MetricFamily


class Metric:
    """One labelled series of a ``MetricFamily``; every call reaches the server, so instances of a model that
    use the same labels share one series. As in Triton, a metric outlives its family's object only to refuse
    every operation (it holds the family weakly)."""

    __slots__ = ("_family", "_kind", "_key")

    def __init__(self, family: MetricFamily, labels: dict[str, str] | None = None,
                 buckets: list[float] | None = None) -> None:
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            if family._kind != MetricFamily.HISTOGRAM:
                raise TritonModelException("Failed to create metric. Unexpected buckets found.")
            buckets = [float(b) for b in buckets]
            # prometheus-cpp's Histogram refuses bounds that are not strictly increasing (so duplicates too)
            if any(a >= b for a, b in zip(buckets, buckets[1:])):
                raise TritonModelException("Error when creating Metric: Bucket Boundaries must be strictly sorted")
        elif family._kind == MetricFamily.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        self._family = weakref.ref(family)
        self._kind = family._kind
        labels = {str(k): str(v) for k, v in (labels or {}).items()}
        self._key = (family._name, tuple(sorted(labels.items())))
        try:
            _host.metric_new(family._name, labels, buckets)
        except TritonModelException as exc:
            raise TritonModelException(f"Error when creating Metric: {exc}") from None

    def _op(self, op: str, value: float, what: str) -> float:
        if self._family() is None:
            raise TritonModelException(f"Failed to {what}: Invalid metric operation as the corresponding "
                                       "'MetricFamily' has been deleted.")
        try:
            return _host.metric_op(self._key, op, float(value))
        except TritonModelException as exc:
            raise TritonModelException(f"Failed to {what}: {exc}") from None

    def increment(self, value: float) -> None:
        kind = self._kind
        if kind == MetricFamily.HISTOGRAM:
            raise TritonModelException("Failed to increment metric value: increment is not supported for histograms")
        if kind == MetricFamily.COUNTER and value < 0:
            raise TritonModelException("Failed to increment metric value: counters can only increase")
        self._op("increment", value, "increment metric value")

    def set(self, value: float) -> None:
        if self._kind != MetricFamily.GAUGE:
            raise TritonModelException("Failed to set metric value: set is supported for gauges only")
        self._op("set", value, "set metric value")

    def observe(self, value: float) -> None:
        if self._kind != MetricFamily.HISTOGRAM:
            raise TritonModelException("Failed to observe metric value: observe is supported for histograms only")
        self._op("observe", value, "observe metric value")

    def value(self) -> float:
        if self._kind == MetricFamily.HISTOGRAM:
            raise TritonModelException("Failed to get metric value: value is not supported for histograms")
        return self._op("value", 0.0, "get metric value")


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) a model in the server; needs ``--model-control-mode=explicit``."""
    _host.control("load", model_name, config, files or {})


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    _host.control("unload", model_name, "", {"unload_dependents": bool(unload_dependents)})


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    return bool(_host.control("ready", model_name, str(model_version), {}))


class _Host:
    """Where pb_utils calls that leave the model go. This default serves code that runs outside a server
    (unit tests, scripts): log lines go to Python logging, metrics live in this process, BLS is refused.
    The worker process and the in-process backend install their own host."""

    _LEVELS: dict[int, int] = {Logger.INFO: logging.INFO, Logger.WARNING: logging.WARNING,
                               Logger.ERROR: logging.ERROR, Logger.VERBOSE: logging.DEBUG}

    def __init__(self) -> None:
        self.metrics: dict[Any, list[float]] = {}
        self.families: dict[str, tuple[str, int]] = {}

    def log(self, level: int, message: str) -> None:
        _logger.log(self._LEVELS.get(level, logging.INFO), message)

    def exec(self, request: InferenceRequest, decoupled: bool) -> Any:
        raise TritonModelException("BLS requests need a running naiad server")

    def async_exec(self, request: InferenceRequest, decoupled: bool) -> Any:
        raise TritonModelException("BLS requests need a running naiad server")

    def control(self, op: str, name: str, arg: str, extra: dict[str, Any]) -> Any:
        raise TritonModelException("model control needs a running naiad server")

    def metric_family(self, name: str, description: str, kind: int) -> None:
        known = self.families.setdefault(name, (description, kind))
        if known[1] != kind:
            raise TritonModelException(f"metric family '{name}' already exists with a different kind")

    def metric_new(self, family: str, labels: dict[str, str], buckets: list[float] | None) -> None:
        self.metrics.setdefault((family, tuple(sorted(labels.items()))), [0.0])

    def metric_op(self, key: Any, op: str, value: float) -> float:
        cell = self.metrics.setdefault(key, [0.0])
        if op == "increment":
            cell[0] += value
        elif op == "set":
            cell[0] = value
        return cell[0]


_host: Any = _Host()


def _set_host(host: Any) -> None:
    global _host
    _host = host


_model_dir: str | None = None  # set by the worker before it imports the model


def get_model_dir() -> str:
    """The folder of the model version this process serves (for a Python-based backend, the model's version
    folder, not the backend's), as Triton's stub answers it."""
    if _model_dir is None:
        raise TritonModelException("get_model_dir() is available to models running in worker processes")
    return _model_dir


def _poll() -> None:
    """Let the host take in what the server sent while execute runs (a cancellation), if it reads such messages."""
    poll = getattr(_host, "poll", None)
    if poll is not None:
        poll()


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    if type(inference_request) is InferenceRequest:  # the method's loop, without a second call
        for tensor in inference_request._inputs:
            if tensor._name == name:
                return tensor
        return None
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
