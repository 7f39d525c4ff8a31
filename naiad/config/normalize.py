"""Fill a ModelConfig the way Triton does before validating it (model_config_utils' normalization).

Backend-specific auto-complete (a Python model's ``auto_complete_config``, ONNX graph inspection)
runs between ``detect_backend`` and ``fill_defaults``.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from naiad.config import ModelConfig, pb

# Default model file per backend (Triton's kOnnxRuntimeOnnxFilename and friends).
DEFAULT_FILENAMES: dict[str, str] = {
    "python": "model.py",
    "onnxruntime": "model.onnx",
    "pytorch": "model.pt",
    "tensorrt": "model.plan",
    "tensorflow": "model.savedmodel",
    "openvino": "model.xml",
}

# Legacy platform names and the backend each one means.
PLATFORM_BACKENDS: dict[str, str] = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorrt_plan": "tensorrt",
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
}
BACKEND_PLATFORMS: dict[str, str] = {
    "onnxruntime": "onnxruntime_onnx",
    "pytorch": "pytorch_libtorch",
    "tensorrt": "tensorrt_plan",
}

# Backends that opt into Triton's default of two CPU instances (SetDefaultInstanceCount); the others get one,
# since (Triton's note) pytorch and others gain little from more.
_TWO_CPU_INSTANCES = {"onnxruntime", "tensorflow"}
_DEFAULT_CPU_INSTANCE_COUNT = 2


@lru_cache(maxsize=1)
def gpu_ids() -> tuple[int, ...]:
    """The GPUs this host exposes to models; the NVIDIA driver lists one folder per GPU. NAIAD_GPUS
    ("0,1" or "") overrides what the driver says, e.g. to hide GPUs from the server."""
    override = os.environ.get("NAIAD_GPUS")
    if override is not None:
        return tuple(int(g) for g in override.split(",") if g.strip())
    try:
        return tuple(range(len(os.listdir("/proc/driver/nvidia/gpus"))))
    except OSError:
        return ()


def detect_backend(config: ModelConfig, version_dirs: list[Path]) -> None:
    """With neither backend nor platform set, Triton looks for a known model file in the versions."""
    if config.platform == "ensemble":
        return  # composed of other models; no backend of its own
    if config.platform and not config.backend and config.platform in PLATFORM_BACKENDS:
        config.backend = PLATFORM_BACKENDS[config.platform]
    elif config.backend and not config.platform and config.backend in BACKEND_PLATFORMS:
        config.platform = BACKEND_PLATFORMS[config.backend]
    if not config.backend and not config.platform:
        for backend, filename in DEFAULT_FILENAMES.items():
            if any((d / filename).exists() for d in version_dirs):
                config.backend = backend
                config.platform = BACKEND_PLATFORMS.get(backend, "")
                break
    # Framework backends read their file name from the config before auto-complete, as Triton fills it first.
    if config.backend in BACKEND_PLATFORMS and not config.default_model_filename:
        config.default_model_filename = DEFAULT_FILENAMES[config.backend]


def fill_defaults(config: ModelConfig, model_name: str) -> None:
    if not config.name:
        config.name = model_name
    if not config.default_model_filename and config.backend == "python":
        config.default_model_filename = DEFAULT_FILENAMES["python"]
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    if config.platform == "ensemble":
        # Triton's ensemble validation records whether any step is decoupled (none can be here yet).
        config.model_transaction_policy.SetInParent()
    else:
        _fill_instance_groups(config)
        if not config.HasField("optimization"):
            config.optimization.input_pinned_memory.enable = True
            config.optimization.output_pinned_memory.enable = True
    if config.HasField("dynamic_batching"):
        _fill_dynamic_batching(config)


def _fill_instance_groups(config: ModelConfig) -> None:
    if not config.instance_group:
        # A group Triton adds itself is named after the model; unnamed given groups get an index.
        config.instance_group.add(name=config.name)
    gpus = gpu_ids()
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        # KIND_AUTO means GPU when every listed GPU (or any, if none listed) is present, else CPU.
        if group.kind == pb.ModelInstanceGroup.KIND_AUTO:
            usable = gpus and all(g in gpus for g in group.gpus)
            group.kind = pb.ModelInstanceGroup.KIND_GPU if usable else pb.ModelInstanceGroup.KIND_CPU
        if group.count < 1:
            two = group.kind == pb.ModelInstanceGroup.KIND_CPU and config.backend in _TWO_CPU_INSTANCES
            group.count = _DEFAULT_CPU_INSTANCE_COUNT if two else 1
        if group.kind == pb.ModelInstanceGroup.KIND_GPU and not group.gpus:
            group.gpus.extend(gpus)


def _fill_dynamic_batching(config: ModelConfig) -> None:
    batching = config.dynamic_batching
    if not batching.preferred_batch_size and config.max_batch_size > 0:
        batching.preferred_batch_size.append(config.max_batch_size)
