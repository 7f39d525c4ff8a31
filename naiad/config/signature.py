"""A model's inputs and outputs compiled once from its config, to check each request cheaply.

``Signature.check`` follows the order and wording of Triton's ``InferenceRequest::Normalize``:
requested outputs, input count, batch dimension, then per input datatype, shape and reshape.
"""

from __future__ import annotations

import numpy as np

from naiad.config import ModelConfig, pb
from naiad.core.datatypes import (
    CONFIG_TO_WIRE,
    NUMPY_TO_WIRE,
    WILDCARD,
    WIRE_TO_NUMPY,
    dims_str,
    fixed_size,
    numpy_to_wire,
    wildcard_count,
)
from naiad.core.errors import InferError, invalid, unexpected_input
from naiad.core.request import InferRequest, log_prefix as _log


_BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended to "
    "each input shape. If you want to specify the full shape including the batch dim in your input dims config, "
    "try setting max_batch_size to zero. See the model configuration docs for more info on max_batch_size."
)


class TensorSpec:
    __slots__ = ("name", "datatype", "dims", "fixed", "reshape", "optional", "is_shape_tensor")

    def __init__(self, io: pb.ModelInput | pb.ModelOutput) -> None:
        self.name: str = io.name
        self.datatype: str = CONFIG_TO_WIRE.get(pb.DataType.Name(io.data_type), "")
        self.dims: tuple[int, ...] = tuple(io.dims)
        self.fixed = WILDCARD not in self.dims  # a shape matches by one tuple comparison
        self.reshape: tuple[int, ...] | None = tuple(io.reshape.shape) if io.HasField("reshape") else None
        self.optional: bool = getattr(io, "optional", False)
        self.is_shape_tensor: bool = io.is_shape_tensor


class Signature:
    def __init__(self, config: ModelConfig) -> None:
        self.model_name = config.name
        self.max_batch_size = config.max_batch_size
        self.inputs: dict[str, TensorSpec] = {io.name: TensorSpec(io) for io in config.input}
        self.outputs: dict[str, TensorSpec] = {io.name: TensorSpec(io) for io in config.output}
        self.output_names: list[str] = list(self.outputs)
        self.reshaped_outputs = frozenset(n for n, s in self.outputs.items() if s.reshape is not None)
        self.required_count = sum(1 for s in self.inputs.values() if not s.optional)

    def unexpected_input(self, input_name: str) -> InferError:
        """Triton's words, which clients match, then the inputs the model does take."""
        return unexpected_input(input_name, self.model_name, self.inputs)

    def check(self, request: InferRequest) -> None:
        """Raise Triton's INVALID_ARG for a request this model can't take; set ``batch_size``; apply reshapes."""
        name = self.model_name
        if request.raw_input is not None:
            self._deduce_raw_input(request)
        if request.requested_outputs:
            for out in request.requested_outputs:
                if out not in self.outputs:
                    raise invalid(f"unexpected inference output '{out}' for model '{name}'")
        inputs = request.inputs
        if len(inputs) > len(self.inputs) or len(inputs) < self.required_count:
            raise invalid(self._count_message(request))
        specs = self.inputs
        batch_size = 0
        # Triton keeps a request's inputs in an unordered_map that walks them newest first; checking in
        # the same order reports the same input when several are wrong.
        order = list(reversed(inputs.items()))
        if self.max_batch_size > 0:
            for input_name, array in order:
                spec = specs.get(input_name)
                if spec is None:
                    raise self.unexpected_input(input_name)
                if spec.is_shape_tensor:
                    continue
                if array.ndim == 0:
                    raise invalid(
                        f"{_log(request)}input '{input_name}' has no shape but model requires batch dimension "
                        f"for '{name}'"
                    )
                if batch_size == 0:
                    batch_size = array.shape[0]
                elif array.shape[0] != batch_size:
                    raise invalid(
                        f"{_log(request)}input '{input_name}' batch size does not match other inputs for '{name}'"
                    )
            if batch_size == 0 and order:
                # A zero batch dimension reads as "no batch" to Triton, which then finds no bytes.
                input_name, array = order[0]
                spec = specs[input_name]
                expected = array.dtype.itemsize * fixed_size(spec.dims) if array.dtype != np.object_ else 0
                raise invalid(
                    f"{_log(request)}input byte size mismatch for input '{input_name}' for model '{name}'. "
                    f"Expected {expected}, got 0"
                )
            if batch_size > self.max_batch_size:
                raise invalid(
                    f"{_log(request)}inference request batch-size must be <= {self.max_batch_size} for '{name}'"
                )
        request.batch_size = batch_size
        for input_name, array in order:
            spec = specs.get(input_name)
            if spec is None:
                raise self.unexpected_input(input_name)
            datatype = NUMPY_TO_WIRE.get(array.dtype) or numpy_to_wire(array.dtype)
            if datatype != spec.datatype:
                raise invalid(
                    f"{_log(request)}inference input '{input_name}' data-type is '{datatype}', but model '{name}' "
                    f"expects '{spec.datatype}'"
                )
            shape = array.shape[1:] if batch_size and not spec.is_shape_tensor else array.shape
            dims = spec.dims
            if (shape != dims if spec.fixed else
                    len(shape) != len(dims) or any(c != WILDCARD and c != s for c, s in zip(dims, shape))):
                full = ((WILDCARD,) + dims) if self.max_batch_size > 0 else dims
                note = _BATCH_NOTE if self.max_batch_size > 0 else ""
                raise invalid(
                    f"{_log(request)}unexpected shape for input '{input_name}' for model '{name}'. "
                    f"Expected {dims_str(full)}, got {dims_str(array.shape)}. {note}"
                )
            if spec.reshape is not None:
                inputs[input_name] = array.reshape(self._reshaped(spec, shape, batch_size))

    def _deduce_raw_input(self, request: InferRequest) -> None:
        """Triton's raw-input path: the whole body is the model's only input."""
        raw = request.raw_input or b""
        request.raw_input = None
        if len(self.inputs) != 1:
            raise invalid(
                f"{_log(request)}Raw request must only have 1 input (found 1) to be deduced but got "
                f"{len(self.inputs)} inputs in '{self.model_name}' model configuration"
            )
        spec = next(iter(self.inputs.values()))
        shape = [1] if self.max_batch_size else []
        if wildcard_count(spec.dims) > 1:
            raise invalid(
                f"{_log(request)}The shape of the raw input '{spec.name}' can not be deduced because there are more "
                "than one variable-sized dimension"
            )
        if spec.datatype == "BYTES":
            if wildcard_count(spec.dims) or fixed_size(spec.dims) != 1:
                raise invalid(
                    f"{_log(request)}For BYTE datatype raw input '{spec.name}', the model must have input shape [1]"
                )
            array = np.empty(1, dtype=np.object_)
            array[0] = raw
            request.inputs = {spec.name: array.reshape(shape + list(spec.dims))}
            return
        dtype = WIRE_TO_NUMPY[spec.datatype]
        fixed = fixed_size(spec.dims) * dtype.itemsize
        dims = [len(raw) // fixed if d == WILDCARD and fixed else d for d in spec.dims]
        expected = fixed_size(shape + dims) * dtype.itemsize
        if len(raw) != expected:
            raise invalid(
                f"{_log(request)}input byte size mismatch for input '{spec.name}' for model '{self.model_name}'. "
                f"Expected {expected}, got {len(raw)}"
            )
        request.inputs = {spec.name: np.frombuffer(raw, dtype=dtype).reshape(shape + dims)}

    @staticmethod
    def _reshaped(spec: TensorSpec, shape: tuple[int, ...], batch_size: int) -> tuple[int, ...]:
        variable = [s for c, s in zip(spec.dims, shape) if c == WILDCARD]
        new: list[int] = [batch_size] if batch_size else []
        for dim in spec.reshape or ():
            new.append(variable.pop(0) if dim == WILDCARD else dim)
        return tuple(new)

    def _count_message(self, request: InferRequest) -> str:
        missing = [n for n, s in self.inputs.items() if not s.optional and n not in request.inputs]
        got = "[" + ",".join(f"'{n}'" for n in reversed(request.inputs)) + "]"
        # Triton trims the trailing comma even when there is none, eating the '[' of an empty list.
        missing_str = "[" + ",".join(f"'{n}'" for n in missing) + "]" if missing else "]"
        if len(self.inputs) == self.required_count:
            head = f"expected {len(self.inputs)} inputs"
        else:
            head = f"expected number of inputs between {self.required_count} and {len(self.inputs)}"
        return (
            f"{_log(request)}{head} but got {len(request.inputs)} inputs for model '{self.model_name}'. "
            f"Got input(s) {got}, but missing required input(s) {missing_str}. Please provide all required input(s)."
        )

    def select_outputs(self, outputs: dict[str, np.ndarray], request: InferRequest) -> dict[str, np.ndarray]:
        """Keep the requested outputs, each in its config shape; reject ones the config doesn't declare.

        As Triton's core (``InferenceResponse::AddOutput``), an output the model made in its ``reshape`` shape
        is given back in its ``dims``; other shapes and datatypes pass through as the model made them (Triton
        checks neither: python_backend's examples return outputs in other shapes and datatypes)."""
        name = self.model_name
        specs = self.outputs
        for output_name in outputs:
            if output_name not in specs:
                raise invalid(f"unexpected inference output '{output_name}' for model '{name}'")
        if self.reshaped_outputs:
            # A new dict: the response cache keeps the model's own outputs, and a hit passes here again.
            outputs = {n: self._undo_reshape(specs[n], a) if n in self.reshaped_outputs else a
                       for n, a in outputs.items()}
        requested = request.requested_outputs
        if not requested:
            return outputs
        # The model's order, not the request's, as Triton answers.
        return {n: a for n, a in outputs.items() if n in requested}

    def _undo_reshape(self, spec: TensorSpec, array: np.ndarray) -> np.ndarray:
        """``array`` in the output's config dims if it has the config's reshape shape; else as it is."""
        reshape = spec.reshape or ()
        batching = self.max_batch_size > 0 and array.ndim > 0
        shape = array.shape[1:] if batching else array.shape
        if len(shape) != len(reshape) or any(c != WILDCARD and c != s for c, s in zip(reshape, shape)):
            return array
        variable = [s for c, s in zip(reshape, shape) if c == WILDCARD]
        new: list[int] = [array.shape[0]] if batching else []
        for dim in spec.dims:
            new.append(variable.pop(0) if dim == WILDCARD else dim)
        return array.reshape(new)
