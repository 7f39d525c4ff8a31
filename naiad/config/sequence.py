"""A sequence model's control inputs and implicit state, read (and checked, in Triton's words) from
``sequence_batching``: what the sequence batcher adds to each request the model sees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from naiad.config import ModelConfig, pb
from naiad.core.datatypes import WILDCARD
from naiad.core.errors import invalid

Kind = pb.ModelSequenceBatching.Control
_BOOLEAN_KINDS = (Kind.CONTROL_SEQUENCE_START, Kind.CONTROL_SEQUENCE_END, Kind.CONTROL_SEQUENCE_READY)
_CORRID_TYPES = {
    pb.TYPE_UINT64: np.uint64, pb.TYPE_INT64: np.int64, pb.TYPE_UINT32: np.uint32, pb.TYPE_INT32: np.int32,
    pb.TYPE_STRING: np.object_,
}
_STATE_TYPES = {
    pb.TYPE_BOOL: np.bool_, pb.TYPE_UINT8: np.uint8, pb.TYPE_UINT16: np.uint16, pb.TYPE_UINT32: np.uint32,
    pb.TYPE_UINT64: np.uint64, pb.TYPE_INT8: np.int8, pb.TYPE_INT16: np.int16, pb.TYPE_INT32: np.int32,
    pb.TYPE_INT64: np.int64, pb.TYPE_FP16: np.float16, pb.TYPE_FP32: np.float32, pb.TYPE_FP64: np.float64,
    pb.TYPE_STRING: np.object_,
}


@dataclass
class BooleanControl:
    name: str
    false: np.ndarray  # read-only, shaped for one request
    true: np.ndarray


@dataclass
class StateSpec:
    input_name: str
    output_name: str
    initial: np.ndarray  # the state a sequence starts from, shaped for one request


@dataclass
class SequenceSpec:
    start: BooleanControl | None = None
    end: BooleanControl | None = None
    ready: BooleanControl | None = None
    corrid_name: str = ""
    corrid_dtype: type = np.uint64
    states: list[StateSpec] = field(default_factory=list)
    batched: bool = False

    def corrid(self, value: int | str) -> np.ndarray:
        """The CORRID control for one request; a string id reaches a numeric CORRID as 0."""
        shape = (1, 1) if self.batched else (1,)
        if self.corrid_dtype is np.object_:
            array = np.empty(shape, dtype=np.object_)
            array.flat[0] = value.encode() if isinstance(value, str) else str(value).encode()
            return array
        return np.full(shape, value if isinstance(value, int) else 0, dtype=self.corrid_dtype)


def _kind(kind: int) -> str:
    return Kind.Kind.Name(kind)


def _controls(config: ModelConfig, kind: int) -> list[tuple[str, pb.ModelSequenceBatching.Control]]:
    """The (tensor name, control) pairs of one kind, after Triton's checks common to every kind."""
    name = config.name
    seen: set[str] = set()
    found: list[tuple[str, pb.ModelSequenceBatching.Control]] = []
    for control_input in config.sequence_batching.control_input:
        if not control_input.name:
            raise invalid(f"sequence batching control tensor must have a name for {name}")
        if control_input.name in seen:
            raise invalid(f"sequence batching control tensor '{control_input.name}' is specified for multiple "
                          f"control kinds for {name}")
        seen.add(control_input.name)
        for control in control_input.control:
            if control.kind == kind:
                if found:
                    raise invalid(f"sequence batching specifies multiple {_kind(kind)} tensors for {name}")
                found.append((control_input.name, control))
    return found


def _boolean(config: ModelConfig, kind: int, shape: tuple[int, ...]) -> BooleanControl | None:
    found = _controls(config, kind)
    if not found:
        return None
    tensor, c = found[0]
    where = f"{_kind(kind)} for {config.name}"
    given = [(c.int32_false_true, np.int32, "int32_false_true"), (c.fp32_false_true, np.float32, "fp32_false_true"),
             (c.bool_false_true, np.bool_, "bool_false_true")]
    present = [g for g in given if len(g[0])]
    if not present:
        raise invalid(f"sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
                      f"'bool_false_true' for {where}")
    if len(present) > 1:
        raise invalid(f"sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and "
                      f"'bool_false_true' for {where}")
    values, dtype, label = present[0]
    if len(values) != 2:
        raise invalid(f"sequence batching control '{label}' must have exactly 2 entries for {where}")
    false: np.ndarray
    true: np.ndarray
    false, true = (np.full(shape, v, dtype=dtype) for v in values)
    false.setflags(write=False)
    true.setflags(write=False)
    return BooleanControl(tensor, false, true)


def _initial_state(config: ModelConfig, state: pb.ModelSequenceBatching.State, model_dir: Path | None,
                   batched: bool) -> np.ndarray:
    dtype = _STATE_TYPES.get(state.data_type)
    if dtype is None:
        raise invalid(f"unsupported data type for state '{state.input_name}' of {config.name}")
    dims = [1 if d == WILDCARD else d for d in state.dims]
    shape = ([1] if batched else []) + dims
    if not state.initial_state:
        return np.zeros(shape, dtype=dtype) if dtype is not np.object_ else np.full(shape, b"", dtype=object)
    if len(state.initial_state) > 1:
        raise invalid(f"initial_state field for state input '{state.input_name}' must contain exactly one or zero "
                      f"element. Found '{len(state.initial_state)}' elements.")
    initial = state.initial_state[0]
    if initial.data_type != state.data_type:
        raise invalid(f"The data type used for 'initial_state' field of state '{state.input_name}' does not match "
                      "the state data type.")
    if not initial.name:
        raise invalid(f"Field 'name' must be set when using initial_state for state input '{state.input_name}'.")
    if any(d == WILDCARD for d in initial.dims):
        raise invalid(f"'initial_state' field for state input name '{state.input_name}' contains variable "
                      "dimensions.")
    if len(initial.dims) != len(state.dims) or any(
            s != WILDCARD and s != i for s, i in zip(state.dims, initial.dims)):
        raise invalid(f"'initial_state' dim for input name '{state.input_name}' doesn't match 'state' dim "
                      "description.")
    shape = ([1] if batched else []) + list(initial.dims)
    if initial.WhichOneof("state_data") == "data_file":
        if model_dir is None:  # validating the config alone: the file is read when the model loads
            return np.zeros(shape, dtype=dtype)
        path = model_dir / "initial_state" / initial.data_file
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise invalid(f"failed to read initial_state data file '{initial.data_file}': {exc}") from None
        count = int(np.prod(shape))
        if dtype is np.object_:
            from naiad.core.datatypes import deserialize_bytes

            return deserialize_bytes(raw, count).reshape(shape)
        expected = count * np.dtype(dtype).itemsize
        if len(raw) < expected:
            raise invalid(f"initial_state setting expects {expected} bytes, but the data provided from "
                          f"{initial.data_file}only has {len(raw)} bytes")
        return np.frombuffer(raw[:expected], dtype=dtype).reshape(shape).copy()
    if initial.WhichOneof("state_data") != "zero_data":
        raise invalid(f"initial_state setting expects state'{state.input_name}' to have state_data set")
    return np.zeros(shape, dtype=dtype) if dtype is not np.object_ else np.full(shape, b"", dtype=object)


def sequence_spec(config: ModelConfig, model_dir: Path | None = None) -> SequenceSpec:
    """Read and check ``sequence_batching``; raises Triton's INVALID_ARG messages."""
    name = config.name
    batching = config.sequence_batching
    if config.response_cache.enable:
        raise invalid(f"Response Cache does not currently support model {name} with sequence batching scheduler. "
                      "Please disable the response cache.")
    batched = config.max_batch_size > 0
    shape = (1, 1) if batched else (1,)
    spec = SequenceSpec(batched=batched)
    spec.start = _boolean(config, Kind.CONTROL_SEQUENCE_START, shape)
    spec.end = _boolean(config, Kind.CONTROL_SEQUENCE_END, shape)
    spec.ready = _boolean(config, Kind.CONTROL_SEQUENCE_READY, shape)
    found = _controls(config, Kind.CONTROL_SEQUENCE_CORRID)
    if found:
        tensor, c = found[0]
        if len(c.int32_false_true) or len(c.fp32_false_true) or len(c.bool_false_true):
            raise invalid("sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or "
                          f"'bool_false_true' for CONTROL_SEQUENCE_CORRID for {name}")
        if c.data_type not in _CORRID_TYPES:
            raise invalid(f"unexpected data type for control CONTROL_SEQUENCE_CORRID for {name}. Allowed data types "
                          "are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING")
        spec.corrid_name = tensor
        spec.corrid_dtype = _CORRID_TYPES[c.data_type]
    if batching.HasField("oldest"):
        for size in batching.oldest.preferred_batch_size:
            if size <= 0:
                raise invalid(f"sequence batching preferred batch size must be positive for {name}")
            if size > config.max_batch_size:
                raise invalid(f"sequence batching preferred batch size must be <= max batch size for {name}")
    if batching.HasField("direct"):
        utilization = batching.direct.minimum_slot_utilization
        if utilization < 0.0 or utilization > 1.0:
            raise invalid(f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {name}")
    seen: set[str] = set()
    for state in batching.state:
        if state.input_name in seen:
            raise invalid(f"State input name '{state.input_name}' specified more than once.")
        seen.add(state.input_name)
        spec.states.append(StateSpec(state.input_name, state.output_name,
                                     _initial_state(config, state, model_dir, batched)))
    return spec
