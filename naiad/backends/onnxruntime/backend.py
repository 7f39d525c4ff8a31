"""Triton's onnxruntime backend: ``model.onnx`` (a file, or a folder holding ``model.onnx`` and its external
data) served through onnxruntime, with Triton's auto-complete and load-time checks of the config against
the graph. Each instance owns a session and a thread (see ``naiad.backends.threaded``).

An instance whose session runs on the CUDA provider executes through I/O binding, as Triton's backend does: its
inputs are bound where they are, in host memory (page-locked staging buffers where torch is installed to allocate
them, ``naiad.backends.staging``, so the provider's copies to the device don't block), its outputs are bound to
host memory, which the provider fills on its own stream within the run. Each instance's session has its own
provider and with it its own stream, so instances on one GPU overlap.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from naiad.backends.base import Backend, LoadedVersion, VersionContext
from naiad.backends.isolated.version import IsolatedVersion, runs_apart
from naiad.backends.onnxruntime import session as sessions
from naiad.backends.threaded import ThreadedInstance
from naiad.config import ModelConfig, pb
from naiad.core.datatypes import BF16, dims_str
from naiad.core.errors import invalid

log = logging.getLogger("naiad.backends.onnxruntime")

# onnxruntime's type strings -> config datatypes (Triton's OnnxDataTypeToModelConfigDataType).
ORT_TO_CONFIG: dict[str, str] = {
    "tensor(bool)": "TYPE_BOOL",
    "tensor(uint8)": "TYPE_UINT8",
    "tensor(uint16)": "TYPE_UINT16",
    "tensor(uint32)": "TYPE_UINT32",
    "tensor(uint64)": "TYPE_UINT64",
    "tensor(int8)": "TYPE_INT8",
    "tensor(int16)": "TYPE_INT16",
    "tensor(int32)": "TYPE_INT32",
    "tensor(int64)": "TYPE_INT64",
    "tensor(bfloat16)": "TYPE_BF16",
    "tensor(float16)": "TYPE_FP16",
    "tensor(float)": "TYPE_FP32",
    "tensor(double)": "TYPE_FP64",
    "tensor(string)": "TYPE_STRING",
}

# Triton's core passes every backend default-max-batch-size=4 unless --backend-config changes it.
DEFAULT_MAX_BATCH_SIZE = 4


class TensorInfo:
    __slots__ = ("data_type", "dims", "name")

    def __init__(self, arg: Any) -> None:
        self.name: str = arg.name
        self.data_type: str = ORT_TO_CONFIG.get(arg.type, "TYPE_INVALID")
        # Symbolic or unknown dimensions read as -1, as onnxruntime's C API reports them.
        self.dims: list[int] = [d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or [])]


def _provided(data_type: str) -> str:
    # Triton prints the model's side as TYPE_ + the server datatype name (STRING shows as BYTES).
    return "TYPE_BYTES" if data_type == "TYPE_STRING" else data_type


class OnnxBackend(Backend):
    name = "onnxruntime"

    def auto_complete(self, config: ModelConfig, model_dir: Path, version_dirs: list[Path]) -> ModelConfig:
        """Fill inputs, outputs and max_batch_size from the graph when the config leaves inputs or outputs out."""
        if config.input and config.output:
            return config
        if not version_dirs:
            return config
        path = sessions.model_path(config, version_dirs[-1], config.name)
        session = sessions.create_session(path, ort.SessionOptions(), ["CPUExecutionProvider"])
        inputs = [TensorInfo(a) for a in session.get_inputs()]
        outputs = [TensorInfo(a) for a in session.get_outputs()]
        _auto_complete_max_batch(config, inputs + outputs)
        if not config.input:
            _auto_complete_io(config, config.input, inputs)
        if not config.output:
            _auto_complete_io(config, config.output, outputs)
        return config

    def load(self, ctx: VersionContext) -> LoadedVersion:
        if runs_apart(ctx):  # in a worker process of its own (a KIND_GPU instance, by default)
            return IsolatedVersion(ctx, self.name)
        return OnnxVersion(ctx)


def _auto_complete_max_batch(config: ModelConfig, infos: list[TensorInfo]) -> None:
    can_batch = all(info.dims and info.dims[0] == -1 for info in infos)
    if can_batch:
        if config.max_batch_size == 0:
            config.max_batch_size = DEFAULT_MAX_BATCH_SIZE
            log.warning(
                "autofilled max_batch_size to %d for model '%s' since batching is supported but no max_batch_size "
                "is specified in model configuration. Must specify max_batch_size to utilize autofill with a "
                "larger max batch size", DEFAULT_MAX_BATCH_SIZE, config.name,
            )
        if config.max_batch_size > 1 and not config.HasField("sequence_batching") and not config.HasField(
            "dynamic_batching"
        ):
            config.dynamic_batching.SetInParent()
    elif config.max_batch_size != 0:
        raise invalid(
            f"autofill failed for model '{config.name}': model does not support batching while non-zero "
            "max_batch_size is specified"
        )


def _auto_complete_io(config: ModelConfig, target: Any, infos: list[TensorInfo]) -> None:
    for info in infos:
        io = target.add(name=info.name, data_type=pb.DataType.Value(info.data_type))
        dims = info.dims[1:] if config.max_batch_size > 0 else info.dims
        if dims:
            io.dims.extend(dims)
        else:
            # A scalar is configured as [1]; with batching, reshaped to the model's scalar per batch item.
            io.dims.append(1)
            if config.max_batch_size > 0:
                io.reshape.SetInParent()


def _compare_dims(model: str, tensor: str, model_shape: list[int], dims: list[int], max_batch_size: int,
                  exact: bool) -> None:
    """Triton's CompareDimsSupported: the config's shape must be one the graph accepts (outputs: exactly)."""
    if max_batch_size > 0:
        if not model_shape or model_shape[0] != -1:
            raise invalid(
                f"model '{model}', tensor '{tensor}': for the model to support batching the shape should have at "
                f"least 1 dimension and the first dimension must be -1; but shape expected by the model is "
                f"{dims_str(model_shape)}"
            )
        full = [-1] + dims
        ok = len(model_shape) == len(full) and all(
            m == f for m, f in zip(model_shape, full) if exact or m != -1
        )
        if not ok:
            raise invalid(
                f"model '{model}', tensor '{tensor}': the model expects {len(model_shape)} dimensions (shape "
                f"{dims_str(model_shape)}) but the model configuration specifies {len(full)} dimensions (an "
                f"initial batch dimension because max_batch_size > 0 followed by the explicit tensor shape, "
                f"making complete shape {dims_str(full)})"
            )
        return
    ok = len(model_shape) == len(dims) and all(m == d for m, d in zip(model_shape, dims) if exact or m != -1)
    if not ok:
        raise invalid(
            f"model '{model}', tensor '{tensor}': the model expects {len(model_shape)} dimensions (shape "
            f"{dims_str(model_shape)}) but the model configuration specifies {len(dims)} dimensions (shape "
            f"{dims_str(dims)})"
        )


def validate_against_graph(config: ModelConfig, session: ort.InferenceSession) -> None:
    """Triton's ValidateInputs / ValidateOutputs: names, datatypes and shapes of the config vs the graph."""
    name = config.name
    inputs = {a.name: TensorInfo(a) for a in session.get_inputs()}
    outputs = {a.name: TensorInfo(a) for a in session.get_outputs()}
    if len(inputs) != len(config.input):
        raise invalid(
            f"unable to load model '{name}', configuration expects {len(config.input)} inputs, model provides "
            f"{len(inputs)}"
        )
    for kind, ios, infos in (("input", config.input, inputs), ("output", config.output, outputs)):
        for io in ios:
            info = infos.get(io.name)
            if info is None:
                allowed = ", ".join(sorted(infos))
                raise invalid(f"unexpected inference {kind} '{io.name}', allowed {kind}s are: {allowed}")
            if kind == "input" and io.optional and config.max_batch_size != 0:
                raise invalid(
                    f"unable to load model '{name}', optional input '{io.name}' is not supported for models that "
                    "support batching"
                )
            data_type = pb.DataType.Name(io.data_type)
            if data_type != info.data_type:
                raise invalid(
                    f"unable to load model '{name}', configuration expects datatype {data_type} for {kind} "
                    f"'{io.name}', model provides {_provided(info.data_type)}"
                )
            dims = list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)
            if info.dims:
                _compare_dims(name, io.name, info.dims, dims, config.max_batch_size, exact=kind == "output")
            elif any(d != 1 for d in dims):
                raise invalid(
                    f"unable to load model '{name}', scalar tensor '{io.name}', should only provide 1 in the model "
                    f"configuration when the model doesn't support batching. Model configuration provided: "
                    f"{dims_str(dims)}."
                )


class OnnxVersion(LoadedVersion):
    def __init__(self, ctx: VersionContext) -> None:
        self.instances = []
        config = ctx.config
        options = sessions.session_options(config)
        try:
            for group in config.instance_group:
                for index in range(group.count):
                    name = f"{group.name}_{index}"
                    device = group.gpus[index % len(group.gpus)] if group.gpus else 0
                    path = sessions.model_path(config, ctx.version_dir, name)
                    chosen = sessions.providers(config, group.kind, device)
                    session = sessions.create_session(path, options, chosen)
                    if not self.instances:
                        validate_against_graph(config, session)
                    self.instances.append(OnnxInstance(name, ctx, session))
        except BaseException:
            self.unload()
            raise


_ONNX_BFLOAT16 = 16  # onnx.TensorProto.BFLOAT16 (onnx itself is not needed at run time)


class OnnxInstance(ThreadedInstance):
    def __init__(self, name: str, ctx: VersionContext, session: ort.InferenceSession) -> None:
        super().__init__(name, ctx.name, ctx.version, ctx.config)
        self.session = session
        self._run_options = sessions.run_options(ctx.config)
        self._string_inputs = {io.name for io in ctx.config.input if io.data_type == pb.TYPE_STRING}
        self._string_outputs = {io.name for io in ctx.config.output if io.data_type == pb.TYPE_STRING}
        self._bf16 = any(io.data_type == pb.TYPE_BF16 for io in (*ctx.config.input, *ctx.config.output))
        # The CUDA provider's path: I/O binding, from pinned staging buffers where torch can allocate them.
        self.bound = "CUDAExecutionProvider" in session.get_providers() and not self._string_inputs
        self.staging = _pinned_staging() if self.bound else None
        # onnxruntime's Python ``run`` re-checks what the signature has (input names) and what can't happen here
        # (OrtValue inputs, graph capture) before calling its compiled session, ~1 µs a call; only its provider
        # fallback matters, and on the CPU provider alone there is none: there the compiled session is called
        # directly (a missing input is then refused in onnxruntime's C++ words, as Triton's are).
        self._session_run = session.run
        compiled = getattr(session, "_sess", None)
        if compiled is not None and session.get_providers() == ["CPUExecutionProvider"]:
            self._session_run = compiled.run

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._bf16:
            return self._run_bf16(inputs)
        if self.bound:
            return self._run_bound(inputs)
        if self._string_inputs:
            inputs = {n: _to_ort_strings(n, a) if n in self._string_inputs else a for n, a in inputs.items()}
        try:
            results = self._session_run(self.output_names, inputs, self._run_options)
        except Exception as exc:
            raise sessions.ort_error(exc) from None
        if self._string_outputs:
            return self._outputs(results)
        return dict(zip(self.output_names, results))  # (``_outputs`` with nothing to convert, without its call)

    def _run_bound(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One run through I/O binding; the run returns once the provider's stream is done with the buffers."""
        binding = self.session.io_binding()
        staging = self.staging
        if staging is not None:
            import torch  # there: staging buffers are only made where it is
        for name, array in inputs.items():
            array = np.ascontiguousarray(array)
            if staging is None:
                binding.bind_cpu_input(name, array)
                continue
            source = torch.from_numpy(array)
            host = staging.buffer(name, source.dtype, tuple(source.shape))
            host.copy_(source)
            binding.bind_input(name, "cpu", 0, array.dtype, list(array.shape), host.data_ptr())
        for name in self.output_names:
            binding.bind_output(name, "cpu")
        try:
            self.session.run_with_iobinding(binding, self._run_options)
            results = binding.copy_outputs_to_cpu()
        except Exception as exc:
            raise sessions.ort_error(exc) from None
        return self._outputs(results)

    def _outputs(self, results: list[Any]) -> dict[str, np.ndarray]:
        """A run's results by output name, BYTES outputs as object arrays of bytes."""
        outputs = dict(zip(self.output_names, results))
        for name in self._string_outputs:
            outputs[name] = _from_ort_strings(outputs[name])
        return outputs

    def _run_bf16(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """onnxruntime's NumPy binding knows no bfloat16: such tensors go in as OrtValues over their 2-byte
        words and come out copied from the output's buffer."""
        try:
            values = {n: ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                          np.ascontiguousarray(a).view(np.uint16), _ONNX_BFLOAT16)
                      if a.dtype == BF16 else ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a))
                      for n, a in inputs.items()}
            results = self.session.run_with_ort_values(self.output_names, values, self._run_options)
        except Exception as exc:
            raise sessions.ort_error(exc) from None
        outputs = {}
        for name, value in zip(self.output_names, results):
            if value.data_type() == "tensor(bfloat16)":
                shape = value.shape()
                count = int(np.prod(shape, dtype=np.int64))
                if not count:
                    outputs[name] = np.empty(shape, BF16)
                    continue
                words = (ctypes.c_uint16 * count).from_address(value.data_ptr())
                outputs[name] = np.ctypeslib.as_array(words).copy().view(BF16).reshape(shape)
            else:
                outputs[name] = value.numpy()
        return outputs

    def finalize(self) -> None:
        super().finalize()
        self._session_run = None  # type: ignore[assignment]
        self.session = None  # type: ignore[assignment]  # drop the session (and its memory) with the instance


def _pinned_staging() -> Any:
    """Page-locked staging buffers through torch, where torch with CUDA is installed; else None (inputs are then
    bound from pageable memory, which the provider copies through a staging buffer of its own)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from naiad.backends.staging import Staging

    return Staging(pin=True)


def _to_ort_strings(name: str, array: np.ndarray) -> np.ndarray:
    """onnxruntime's Python binding takes text, not bytes; string tensors must therefore be UTF-8."""
    flat = array.ravel()
    out = np.empty(flat.shape, dtype=np.object_)
    try:
        out[:] = [b.decode("utf-8") if isinstance(b, (bytes, bytearray)) else b for b in flat]
    except UnicodeDecodeError as exc:
        raise invalid(f"input '{name}': onnxruntime string tensors must hold UTF-8 text: {exc}") from None
    return out.reshape(array.shape)


def _from_ort_strings(array: np.ndarray) -> np.ndarray:
    flat = array.ravel()
    out = np.empty(flat.shape, dtype=np.object_)
    out[:] = [s.encode("utf-8") if isinstance(s, str) else s for s in flat]
    return out.reshape(array.shape)

