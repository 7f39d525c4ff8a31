"""Triton's tensorrt backend (``platform: "tensorrt_plan"``): a serialized engine ``model.plan`` run through the
``tensorrt`` Python package, with device buffers from torch's CUDA allocator.

TensorRT runs only on GPUs. On a host without one, or without the ``tensorrt`` package, loading fails with a
message saying which; nothing is imported until a plan is actually loaded. The GPU path follows the
TensorRT 10 tensor API (named I/O tensors, ``execute_async_v3``) and is exercised where a GPU exists.

Each instance has its own execution context and CUDA stream, as in Triton; inputs reach the device from pinned
host buffers without blocking and outputs return into pinned buffers the same way (``naiad.backends.staging``),
and only the instance's stream is waited for.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np

from naiad.backends.base import Backend, LoadedVersion, VersionContext
from naiad.backends.isolated.version import IsolatedVersion, runs_apart
from naiad.backends.threaded import ThreadedInstance
from naiad.config import ModelConfig, pb
from naiad.config.scheduling import gpu_ids
from naiad.core.errors import internal, invalid, unavailable


def _import(name: str, model: str, why: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise unavailable(f"unable to load model '{model}': {why} ({exc})") from None


def _tensorrt(model: str) -> Any:
    return _import("tensorrt", model, "TensorRT plans need the 'tensorrt' package on a host with an NVIDIA GPU")


def _plan_path(config: ModelConfig, version_dir: Path, instance: str) -> Path:
    path = version_dir / (config.default_model_filename or "model.plan")
    if not path.is_file():
        raise unavailable(f"unable to find '{path}' for model instance '{instance}'")
    return path


class TensorRTBackend(Backend):
    name = "tensorrt"

    def auto_complete(self, config: ModelConfig, model_dir: Path, version_dirs: list[Path]) -> ModelConfig:
        if (config.input and config.output) or not version_dirs:
            return config
        # Reading a plan needs the GPU it was built for; without one there is nothing to read it with.
        if not gpu_ids():
            raise invalid(f"unable to auto-complete config for model '{config.name}': TensorRT plans need a GPU")
        trt = _tensorrt(config.name)
        engine = _deserialize(trt, _plan_path(config, version_dirs[-1], config.name), config.name)
        batching = config.max_batch_size > 0
        fill_inputs, fill_outputs = not config.input, not config.output
        for index in range(engine.num_io_tensors):
            name = engine.get_tensor_name(index)
            is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
            if not (fill_inputs if is_input else fill_outputs):
                continue
            dims = list(engine.get_tensor_shape(name))
            target = config.input if is_input else config.output
            io = target.add(name=name, data_type=pb.DataType.Value(_config_type(trt, engine.get_tensor_dtype(name))))
            io.dims.extend(dims[1:] if batching else dims)
        return config

    def load(self, ctx: VersionContext) -> LoadedVersion:
        if runs_apart(ctx):  # in a worker process of its own (a KIND_GPU instance, by default)
            return IsolatedVersion(ctx, self.name)
        return TensorRTVersion(ctx)


def _deserialize(trt: Any, path: Path, model: str) -> Any:
    logger = trt.Logger(trt.Logger.WARNING)
    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(path.read_bytes())
    if engine is None:
        raise internal(f"unable to load model '{model}': unable to create TensorRT engine from '{path}'")
    return engine


def _config_type(trt: Any, dtype: Any) -> str:
    names = {
        trt.float32: "TYPE_FP32", trt.float16: "TYPE_FP16", trt.int8: "TYPE_INT8", trt.int32: "TYPE_INT32",
        trt.bool: "TYPE_BOOL", trt.uint8: "TYPE_UINT8",
    }
    for attr, name in (("int64", "TYPE_INT64"), ("bf16", "TYPE_BF16")):
        if hasattr(trt, attr):
            names[getattr(trt, attr)] = name
    return names.get(dtype, "TYPE_INVALID")


class TensorRTVersion(LoadedVersion):
    def __init__(self, ctx: VersionContext) -> None:
        self.instances = []
        config = ctx.config
        for group in config.instance_group:
            if group.kind != pb.ModelInstanceGroup.KIND_GPU:
                raise invalid(f"unable to load model '{ctx.name}', TensorRT backend supports only GPU device")
        trt = _tensorrt(ctx.name)
        torch = _import("torch", ctx.name, "the TensorRT backend allocates device memory through torch with CUDA")
        if not torch.cuda.is_available():
            raise unavailable(f"unable to load model '{ctx.name}': torch sees no CUDA device")
        try:
            for group in config.instance_group:
                for index in range(group.count):
                    name = f"{group.name}_{index}"
                    device = group.gpus[index % len(group.gpus)]
                    path = _plan_path(config, ctx.version_dir, name)
                    with torch.cuda.device(device):
                        engine = _deserialize(trt, path, ctx.name)
                        self.instances.append(TensorRTInstance(name, ctx, trt, torch, engine, device))
        except BaseException:
            self.unload()
            raise


class TensorRTInstance(ThreadedInstance):
    def __init__(self, name: str, ctx: VersionContext, trt: Any, torch: Any, engine: Any, device: int) -> None:
        super().__init__(name, ctx.name, ctx.version, ctx.config)
        self.torch = torch
        self.engine = engine
        self.device = torch.device("cuda", device)
        self.context = engine.create_execution_context()
        self.stream = torch.cuda.Stream(device=self.device)
        # Imported here, not at the top: the staging buffers need torch, which this backend imports on load.
        from naiad.backends.staging import Staging

        self.staging = Staging(pin=True)
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.engine_inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.engine_outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        configured = {io.name for io in ctx.config.input} | {io.name for io in ctx.config.output}
        missing = [n for n in self.engine_inputs if n not in configured]
        if missing:
            raise invalid(f"unable to load model '{ctx.name}', engine input(s) {missing} are not in the configuration")
        self.output_types = {n: _torch_type(torch, trt, engine.get_tensor_dtype(n)) for n in self.engine_outputs}

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self.torch
        context = self.context
        staging = self.staging
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            keep: list[Any] = []
            for name in self.engine_inputs:
                tensor = staging.to_device(name, np.ascontiguousarray(inputs[name]), self.device)
                keep.append(tensor)
                context.set_input_shape(name, tuple(tensor.shape))
                context.set_tensor_address(name, tensor.data_ptr())
            outputs: dict[str, Any] = {}
            for name in self.engine_outputs:
                shape = tuple(context.get_tensor_shape(name))
                tensor = torch.empty(shape, dtype=self.output_types[name], device=self.device)
                context.set_tensor_address(name, tensor.data_ptr())
                outputs[name] = tensor
            if not context.execute_async_v3(self.stream.cuda_stream):
                self.stream.synchronize()  # the input copies, before the next run reuses their buffers
                raise internal(f"TensorRT execution failed for model '{self.model_name}'")
            host = {n: staging.to_host("output:" + n, outputs[n]) for n in self.output_names if n in outputs}
            self.stream.synchronize()
        # Views of pinned buffers the next execution reuses while this reply is still being sent: copy them out.
        return {n: a.copy() for n, a in host.items()}


def _torch_type(torch: Any, trt: Any, dtype: Any) -> Any:
    table = {trt.float32: torch.float32, trt.float16: torch.float16, trt.int8: torch.int8, trt.int32: torch.int32,
             trt.bool: torch.bool, trt.uint8: torch.uint8}
    if hasattr(trt, "int64"):
        table[trt.int64] = torch.int64
    if dtype not in table:
        raise invalid(f"unsupported TensorRT datatype {dtype}")
    return table[dtype]
