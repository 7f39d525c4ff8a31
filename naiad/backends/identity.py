"""Triton's ``identity`` test backend: each ``INPUT<i>`` comes back as ``OUTPUT<i>``.

Its ``execute_delay_ms`` parameter makes every execution take that long, whatever its batch size, while holding
no lock (``time.sleep`` releases the GIL): a simulated accelerator. It runs as a ``ThreadedInstance``, the path
every framework model takes (onnxruntime, torch, TensorRT), so CPU-only CI can measure how well the server keeps
an accelerator busy (batch formation, hand-off, replies) with no framework installed; see
``benchmarks/simulated_accelerator.py``. Triton's QA configs for identity models load unchanged.

Parameters, as Triton's identity backend reads them: ``execute_delay_ms`` (default 0) and
``instance_wise_delay_multiplier`` (when set, the delay is multiplied by the instance's device id, at least 1).
"""

from __future__ import annotations

import time

import numpy as np

from naiad.backends.base import Backend, LoadedVersion, VersionContext
from naiad.backends.parameters import int_param, string_param
from naiad.backends.threaded import ThreadedInstance
from naiad.config import ModelConfig, pb
from naiad.core.errors import invalid


class IdentityBackend(Backend):
    name = "identity"

    def load(self, ctx: VersionContext) -> LoadedVersion:
        return IdentityVersion(ctx)


def _dims(io: pb.ModelInput | pb.ModelOutput) -> list[int]:
    return list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)


def _validate(config: ModelConfig) -> None:
    """Triton's identity ModelState::ValidateModelConfig, with its messages."""
    if len(config.input) != len(config.output):
        raise invalid("model configuration must have equal input/output pairs")
    inputs: dict[str, tuple[int, list[int]]] = {}
    outputs: dict[str, tuple[int, list[int]]] = {}
    for io_in, io_out in zip(config.input, config.output):
        if not io_in.name.startswith("INPUT"):
            raise invalid(f"expected input name to follow INPUT<index> pattern, got '{io_in.name}'")
        if not io_out.name.startswith("OUTPUT"):
            raise invalid(f"expected output name to follow OUTPUT<index> pattern, got '{io_out.name}'")
        inputs[io_in.name.removeprefix("INPUT")] = (io_in.data_type, _dims(io_in))
        outputs[io_out.name.removeprefix("OUTPUT")] = (io_out.data_type, _dims(io_out))
    for index, (data_type, dims) in outputs.items():
        if index not in inputs:
            raise invalid("expected input and output indices to match")
        in_type, in_dims = inputs[index]
        if in_type != data_type:
            raise invalid(f"expected input and output datatype to match, got {pb.DataType.Name(in_type)[5:]} and "
                          f"{pb.DataType.Name(data_type)[5:]}")
        if in_dims != dims:
            raise invalid(f"expected input and output shape to match, got [{','.join(map(str, in_dims))}] and "
                          f"[{','.join(map(str, dims))}]")


class IdentityVersion(LoadedVersion):
    def __init__(self, ctx: VersionContext) -> None:
        config = ctx.config
        _validate(config)
        delay_ms = int_param(config, "execute_delay_ms", 0)
        per_device = string_param(config, "instance_wise_delay_multiplier") is not None
        self.instances = []
        for group in config.instance_group:
            for index in range(group.count):
                device = group.gpus[index % len(group.gpus)] if group.gpus else 0
                delay = delay_ms * max(device, 1) if per_device else delay_ms
                self.instances.append(IdentityInstance(f"{group.name}_{index}", ctx, delay / 1000))


class IdentityInstance(ThreadedInstance):
    def __init__(self, name: str, ctx: VersionContext, delay_s: float) -> None:
        super().__init__(name, ctx.name, ctx.version, ctx.config)
        self.delay_s = delay_s
        self.pairs = [(o.name, "INPUT" + o.name.removeprefix("OUTPUT")) for o in ctx.config.output]

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.delay_s > 0:
            time.sleep(self.delay_s)  # once per execution, as Triton's; the GIL is free meanwhile
        return {out: inputs[inp] for out, inp in self.pairs if inp in inputs}
