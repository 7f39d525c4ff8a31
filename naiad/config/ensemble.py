"""Ensemble configs checked with Triton's rules and messages.

``validate_scheduling`` is what Triton checks on the ensemble's own config (ValidateEnsembleSchedulingConfig):
every step complete, every ensemble output reachable from the inputs, no unused tensor. ``validate_mapping``
runs once the composing models are loaded (ValidateEnsembleConfig): the maps name real inputs and outputs,
and every ensemble tensor has one datatype and a compatible shape wherever it is used.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from naiad.config import ModelConfig, pb
from naiad.core.datatypes import WILDCARD
from naiad.core.errors import invalid

ENSEMBLE_PLATFORM = "ensemble"


def dependencies(config: ModelConfig) -> list[tuple[str, int]]:
    """(model name, required version or -1) of each step, in step order."""
    return [(s.model_name, s.model_version) for s in config.ensemble_scheduling.step]


@dataclass
class _Node:
    name: str
    written: bool = False
    ready: bool = False
    prev: list[_Node] = field(default_factory=list)
    next: list[_Node] = field(default_factory=list)


def validate_scheduling(config: ModelConfig) -> None:
    name = config.name
    if config.platform != ENSEMBLE_PLATFORM:
        raise invalid(
            f"ensemble scheduling cannot be set for model '{name}' whose platform is not {ENSEMBLE_PLATFORM}"
        )
    if config.instance_group:
        raise invalid(f"instance group should not be specified for ensemble '{name}'")
    if config.HasField("optimization"):
        raise invalid(f"optimization should not be specified for ensemble '{name}'")
    if config.model_warmup:
        raise invalid(f"model_warmup can not be specified for ensemble '{name}'")
    steps = config.ensemble_scheduling.step
    if not steps:
        raise invalid(f"must specify 'step' for ensemble '{name}'")
    nodes: dict[str, _Node] = {}
    for index, step in enumerate(steps):
        where = f"in step {index} of ensemble '{name}'"
        if not step.model_name:
            raise invalid(f"must specify 'model_name' {where}")
        if not step.input_map:
            raise invalid(f"must specify 'input_map' {where}")
        if not step.output_map:
            raise invalid(f"must specify 'output_map' {where}")
        produced: list[_Node] = []
        for tensor in step.output_map.values():
            node = nodes.setdefault(tensor, _Node(tensor))
            if node.written:
                raise invalid(
                    f"ensemble tensor '{tensor}' can appear in an output map only once for ensemble '{name}' "
                    f"step {index}"
                )
            node.written = True
            produced.append(node)
        for tensor in step.input_map.values():
            source = nodes.setdefault(tensor, _Node(tensor))
            for out in produced:
                out.prev.append(source)
                source.next.append(out)
    ready: deque[_Node] = deque()
    for io in config.input:
        if (given := nodes.get(io.name)) is None:
            raise invalid(f"ensemble input '{io.name}' for ensemble {name}' is not used")
        given.ready = True
        ready.append(given)
    while ready:
        node = ready.popleft()
        for nxt in node.next:
            if not nxt.ready and all(p.ready for p in nxt.prev):
                nxt.ready = True
                ready.append(nxt)
    outputs: set[str] = set()
    for io in config.output:
        if (produced_by := nodes.get(io.name)) is None:
            raise invalid(f"ensemble output '{io.name}' for ensemble {name}' is not used")
        if not produced_by.ready:
            raise invalid(_not_written(produced_by, name))
        outputs.add(io.name)
    for tensor, node in nodes.items():
        if tensor not in outputs and (not node.ready or not node.next):
            raise invalid(f"ensemble tensor '{tensor}' is unused in ensemble '{name}'")


def _not_written(node: _Node, ensemble: str) -> str:
    message = f"output '{node.name}' for ensemble '{ensemble}' is not written"
    last, seen, prev = node, set(), node.prev
    while prev:
        candidates, prev = prev, []
        for p in candidates:
            if not p.ready and p.name not in seen:
                seen.add(p.name)
                last, prev = p, p.prev
                break
    if last is not node:
        message += f": at least one of its depending tensors, '{last.name}', is not connected"
    return message


class _Tensor:
    __slots__ = ("data_type", "dims", "full_dims", "model")

    def __init__(self, model: str, batching: bool, data_type: int, dims: list[int]) -> None:
        self.model = model
        self.data_type = data_type
        self.dims = list(dims)
        self.full_dims = ([WILDCARD] if batching else []) + self.dims


def _dims_match(a: list[int], b: list[int]) -> bool:
    return len(a) == len(b) and all(x == y or x == WILDCARD or y == WILDCARD for x, y in zip(a, b))


def _consistent(seen: _Tensor, new: _Tensor, prefix: str) -> None:
    if seen.data_type != new.data_type:
        raise invalid(
            f"{prefix}inconsistent data type: {pb.DataType.Name(seen.data_type)} is inferred from model "
            f"{seen.model} while {pb.DataType.Name(new.data_type)} is inferred from model {new.model}"
        )
    # A tensor shared by a batching and a non-batching model matches when the full shapes agree.
    if not _dims_match(seen.dims, new.dims) and not _dims_match(seen.full_dims, new.full_dims):
        raise invalid(
            f"{prefix}inconsistent shape: {_dims(seen.full_dims)} is inferred from model {seen.model} while "
            f"{_dims(new.full_dims)} is inferred from model {new.model}"
        )


def _dims(dims: list[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def validate_mapping(config: ModelConfig, step_configs: list[ModelConfig]) -> None:
    """Check each step against its loaded model's config; ``step_configs`` follows the step order."""
    name = config.name
    batching = config.max_batch_size > 0
    tensors: dict[str, _Tensor] = {}
    for ios in (config.input, config.output):
        for io in ios:
            dims = list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)
            tensors[io.name] = _Tensor(name, batching, io.data_type, dims)
    for step, model in zip(config.ensemble_scheduling.step, step_configs):
        step_name = step.model_name
        if model.max_batch_size != 0 and model.max_batch_size < config.max_batch_size:
            raise invalid(
                f"ensemble {name} allows maximum batch size {config.max_batch_size}, but it contains model "
                f"{step_name} which only allows maximum batch size to be {model.max_batch_size}"
            )
        step_batching = model.max_batch_size > 0
        inputs = {io.name: io for io in model.input}
        for model_input, tensor in step.input_map.items():
            if model_input not in inputs:
                raise invalid(
                    f"in ensemble {name}, ensemble tensor {tensor} is mapping to non-existing input {model_input} "
                    f"in model {step_name}"
                )
        for io in model.input:
            mapped = [t for i, t in step.input_map.items() if i == io.name]
            if not mapped:
                if io.optional:
                    continue
                raise invalid(
                    f"in ensemble {name}, input {io.name} in model {step_name} is not mapped to any ensemble tensors"
                )
            _check(tensors, mapped[0], _Tensor(step_name, step_batching, io.data_type, list(io.dims)), name)
        outputs = {io.name: io for io in model.output}
        for model_output, tensor in step.output_map.items():
            io = outputs.get(model_output)
            if io is None:
                raise invalid(
                    f"in ensemble {name}, ensemble tensor {tensor} is mapped from non-existing output "
                    f"{model_output} in model {step_name}"
                )
            _check(tensors, tensor, _Tensor(step_name, step_batching, io.data_type, list(io.dims)), name)


def _check(tensors: dict[str, _Tensor], tensor: str, new: _Tensor, ensemble: str) -> None:
    seen = tensors.get(tensor)
    if seen is None:
        tensors[tensor] = new
    else:
        _consistent(seen, new, f"in ensemble {ensemble}, ensemble tensor {tensor}: ")
