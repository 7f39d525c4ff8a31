"""Triton's pytorch backend (``platform: "pytorch_libtorch"``): a TorchScript ``model.pt`` run with torch.

Config inputs reach ``forward`` by Triton's naming rules: by argument name when every input is named after a
forward argument, else by the ``<name>__<index>`` suffix, else in config order; a single
``Dict[str, Tensor]`` argument receives all inputs by name. Outputs are taken by ``<name>__<index>`` or in
config order. Each instance owns a thread (see ``naiad.backends.threaded``); torch releases the GIL.

A ``KIND_GPU`` instance runs on its own CUDA stream, as in Triton: inputs go to the device from pinned host
buffers without blocking, outputs come back into pinned buffers the same way, and only that stream is waited
for (``naiad.backends.staging``), so instances on one GPU overlap instead of queueing on the default stream.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from naiad.backends.base import Backend, LoadedVersion, VersionContext
from naiad.backends.isolated.version import IsolatedVersion, runs_apart
from naiad.backends.parameters import bool_param, int_param
from naiad.backends.staging import Staging
from naiad.backends.threaded import ThreadedInstance
from naiad.config import ModelConfig, pb
from naiad.core.errors import internal, invalid, unavailable

# Request buffers are often read-only (bytes from the wire); the model only reads them.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

# Config datatype -> torch dtype (Triton's ModelConfigDataTypeToTorchType); TYPE_STRING is List[str].
CONFIG_TO_TORCH: dict[int, torch.dtype] = {
    pb.TYPE_BOOL: torch.bool,
    pb.TYPE_UINT8: torch.uint8,
    pb.TYPE_INT8: torch.int8,
    pb.TYPE_INT16: torch.int16,
    pb.TYPE_INT32: torch.int32,
    pb.TYPE_INT64: torch.int64,
    pb.TYPE_FP16: torch.float16,
    pb.TYPE_FP32: torch.float32,
    pb.TYPE_FP64: torch.float64,
}
TORCH_TO_CONFIG: dict[torch.dtype, str] = {t: pb.DataType.Name(c) for c, t in CONFIG_TO_TORCH.items()}

_NAMED_INDEX = re.compile(r"^.*__(\d+)$")


def _server_type(config_type: str) -> str:
    # Triton prints TYPE_ + the server datatype name; TYPE_STRING is BYTES there.
    return "TYPE_BYTES" if config_type == "TYPE_STRING" else config_type


class TorchBackend(Backend):
    name = "pytorch"

    def load(self, ctx: VersionContext) -> LoadedVersion:
        if runs_apart(ctx):  # in a worker process of its own (a KIND_GPU instance, by default)
            return IsolatedVersion(ctx, self.name)
        return TorchVersion(ctx)


def _model_path(config: ModelConfig, version_dir: Path, instance: str) -> Path:
    path = version_dir / (config.default_model_filename or "model.pt")
    if not path.is_file():
        raise unavailable(f"unable to find '{path}' for model instance '{instance}'")
    return path


def _apply_thread_settings(config: ModelConfig) -> None:
    # Like libtorch's, these settings are process-wide: the last model loaded with them wins.
    intra = int_param(config, "INTRA_OP_THREAD_COUNT", 0)
    if intra > 0:
        torch.set_num_threads(intra)
    inter = int_param(config, "INTER_OP_THREAD_COUNT", 0)
    if inter > 0:
        try:
            torch.set_num_interop_threads(inter)
        except RuntimeError:
            pass  # torch allows it only before the first parallel work; keep what is set


class _Signature:
    """How config inputs and outputs map onto ``forward``'s arguments and results."""

    def __init__(self, config: ModelConfig, module: Any) -> None:
        name = config.name
        if not config.input:
            raise internal("model configuration must contain at least one input, none were specified.")
        if not config.output:
            raise internal("model configuration must contain at least one output, none were specified.")
        arguments = list(module.forward.schema.arguments)
        if arguments and arguments[0].type.kind() == "ClassType":  # the module itself
            arguments = arguments[1:]
        self.dict_input = len(arguments) == 1 and arguments[0].type.kind() == "DictType"
        allowed: list[str] = []
        if not self.dict_input:
            for argument in arguments:
                kind = argument.type.kind()
                if kind == "DictType":
                    raise internal(
                        "Multiple inputs of kind DictType were detected. Only a single input of type "
                        "Dict(str, Tensor) is supported."
                    )
                if kind not in ("TensorType", "ListType"):
                    raise internal(
                        f"An input of type '{argument.type}' was detected in the model. Only a single input of "
                        "type Dict(str, Tensor) or input(s) of type Tensor are supported."
                    )
                allowed.append(argument.name)
            if len(arguments) != len(config.input):
                raise invalid(
                    f"unable to load model '{name}', configuration expects {len(config.input)} inputs, model "
                    f"provides {len(arguments)}"
                )
        names = [io.name for io in config.input]
        self.input_names = names
        if self.dict_input:
            self.input_order = names
        elif all(n in allowed for n in names):
            self.input_order = sorted(names, key=allowed.index)
        elif all(_NAMED_INDEX.match(n) for n in names):
            self.input_order = sorted(names, key=lambda n: int(_NAMED_INDEX.match(n).group(1)))  # type: ignore[union-attr]
        else:
            self.input_order = names
        out_names = [io.name for io in config.output]
        if all(_NAMED_INDEX.match(n) for n in out_names):
            self.output_index = {n: int(_NAMED_INDEX.match(n).group(1)) for n in out_names}  # type: ignore[union-attr]
        else:
            self.output_index = {n: i for i, n in enumerate(out_names)}
        for kind, ios in (("input", config.input), ("output", config.output)):
            for io in ios:
                if io.data_type != pb.TYPE_STRING and io.data_type not in CONFIG_TO_TORCH:
                    raise internal(
                        f"unsupported datatype {pb.DataType.Name(io.data_type)} for {kind} '{io.name}' for model "
                        f"'{name}'"
                    )
                if io.data_type == pb.TYPE_STRING:
                    dims = list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)
                    if len(dims) + (1 if config.max_batch_size > 0 else 0) > 1:
                        raise internal(
                            f"Triton only supports 1 dimensional List of String as {kind} for '{io.name}' for model "
                            f"'{name}'"
                        )
        self.output_types = {io.name: pb.DataType.Name(io.data_type) for io in config.output}


class TorchVersion(LoadedVersion):
    def __init__(self, ctx: VersionContext) -> None:
        self.instances = []
        config = ctx.config
        _apply_thread_settings(config)
        if bool_param(config, "DISABLE_OPTIMIZED_EXECUTION", False):
            torch._C._set_graph_executor_optimize(False)
        profiling = bool_param(config, "ENABLE_JIT_PROFILING", True)
        torch._C._jit_set_profiling_executor(profiling)
        signature: _Signature | None = None
        try:
            for group in config.instance_group:
                for index in range(group.count):
                    name = f"{group.name}_{index}"
                    device = _device(group, index)
                    path = _model_path(config, ctx.version_dir, name)
                    try:
                        module = torch.jit.load(str(path), map_location=device)
                    except Exception as exc:
                        raise internal(f"failed to load model '{ctx.name}': {exc}") from None
                    module.eval()
                    if signature is None:
                        signature = _Signature(config, module)
                    self.instances.append(TorchInstance(name, ctx, module, device, signature))
        except BaseException:
            self.unload()
            raise


def _device(group: pb.ModelInstanceGroup, index: int) -> torch.device:
    if group.kind != pb.ModelInstanceGroup.KIND_GPU:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise unavailable(
            f"instance group {group.name} asks for a GPU, but this torch build has no CUDA support "
            f"(torch {torch.__version__})"
        )
    return torch.device("cuda", group.gpus[index % len(group.gpus)])


class TorchInstance(ThreadedInstance):
    def __init__(self, name: str, ctx: VersionContext, module: Any, device: torch.device,
                 signature: _Signature) -> None:
        super().__init__(name, ctx.name, ctx.version, ctx.config)
        self.module = module
        self.device = device
        self.signature = signature
        self.inference_mode = bool_param(ctx.config, "INFERENCE_MODE", True)
        self._string_inputs = {io.name for io in ctx.config.input if io.data_type == pb.TYPE_STRING}
        # The GPU path: this instance's own stream and its pinned staging buffers (none on the CPU).
        on_gpu = device.type == "cuda"
        self.stream = torch.cuda.Stream(device=device) if on_gpu else None
        self.staging = Staging(pin=True) if on_gpu else None

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        stream = self.stream
        if stream is None:
            return self._run(inputs)
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            try:
                outputs = self._run(inputs)
            except BaseException:
                # Copies from the pinned buffers may still be in flight: wait before the next run reuses them.
                with contextlib.suppress(Exception):
                    stream.synchronize()
                raise
            stream.synchronize()  # this instance's work only: other instances' kernels and copies go on
        # Staged outputs are views of pinned buffers the next execution reuses while this reply is sent.
        return {n: a.copy() if a.dtype != np.object_ else a for n, a in outputs.items()}

    def _run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        sig = self.signature
        tensors = {n: self._to_torch(n, a) for n, a in inputs.items()}
        guard = torch.inference_mode() if self.inference_mode else torch.no_grad()
        try:
            with guard:
                if sig.dict_input:
                    result = self.module(tensors)
                else:
                    result = self.module(*[tensors[n] for n in sig.input_order if n in tensors])
        except Exception as exc:
            raise internal(f"PyTorch execute failure: {exc}") from None
        if isinstance(result, tuple):
            results = list(result)
        elif isinstance(result, torch.Tensor) or _is_string_list(result):
            results = [result]
        else:
            raise internal(
                "PyTorch execute failure: output must be of type Tensor, List[str] or Tuple containing one of "
                "these two types. It should not be a List / Dictionary of Tensors or a Scalar"
            )
        outputs: dict[str, np.ndarray] = {}
        for name in self.output_names:
            index = sig.output_index[name]
            if index >= len(results):
                raise internal(f"output tensor '{name}' is not found")
            outputs[name] = self._to_numpy(name, results[index])
        return outputs

    def _to_torch(self, name: str, array: np.ndarray) -> Any:
        if name in self._string_inputs:
            return [b.decode("utf-8", "surrogateescape") if isinstance(b, bytes) else str(b) for b in array.ravel()]
        if self.staging is not None:
            return self.staging.to_device(name, array, self.device)
        tensor = torch.from_numpy(array)
        return tensor if self.device.type == "cpu" else tensor.to(self.device)

    def _to_numpy(self, name: str, value: Any) -> np.ndarray:
        expected = self.signature.output_types[name]
        if isinstance(value, torch.Tensor):
            provided = TORCH_TO_CONFIG.get(value.dtype, f"TYPE_{str(value.dtype).removeprefix('torch.').upper()}")
            if provided != expected:
                raise invalid(
                    f"configuration expects datatype {_server_type(expected)} for output '{name}', model provides "
                    f"{provided}"
                )
            if value.dim() == 0:
                raise invalid(f"output '{name}' is a scalar which is not supported.")
            if self.staging is not None:
                return self.staging.to_host("output:" + name, value)  # read once the stream is synchronized
            return value.detach().cpu().numpy()
        if _is_string_list(value):
            if expected != "TYPE_STRING":
                raise invalid(
                    f"configuration expects datatype {_server_type(expected)} for output '{name}', model provides "
                    "TYPE_BYTES"
                )
            out = np.empty(len(value), dtype=np.object_)
            out[:] = [s.encode("utf-8", "surrogateescape") for s in value]
            return out
        raise invalid(f"output '{name}' must be of type Tensor or List[str].")

    def finalize(self) -> None:
        super().finalize()
        self.module = None


def _is_string_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)
