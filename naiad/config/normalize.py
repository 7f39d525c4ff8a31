"""Fill a ModelConfig the way Triton does before validating it (model_config_utils' normalization).

Backend-specific auto-complete (a Python model's ``auto_complete_config``, ONNX graph inspection)
runs between ``detect_backend`` and ``fill_defaults``.
"""

from __future__ import annotations

from pathlib import Path

from naiad.config import ModelConfig
from naiad.config.scheduling import fill_batching, fill_instance_groups

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


def detect_backend(config: ModelConfig, version_dirs: list[Path]) -> None:
    """With neither backend nor platform set, Triton looks for a known model file in the versions."""
    if config.platform and not config.backend and config.platform in PLATFORM_BACKENDS:
        config.backend = PLATFORM_BACKENDS[config.platform]
        return
    if config.backend and not config.platform and config.backend in BACKEND_PLATFORMS:
        config.platform = BACKEND_PLATFORMS[config.backend]
    if config.backend or config.platform:
        return
    for backend, filename in DEFAULT_FILENAMES.items():
        if any((d / filename).exists() for d in version_dirs):
            config.backend = backend
            config.platform = BACKEND_PLATFORMS.get(backend, "")
            return


def fill_defaults(config: ModelConfig, model_name: str) -> None:
    if not config.name:
        config.name = model_name
    if not config.default_model_filename and config.backend == "python":
        config.default_model_filename = DEFAULT_FILENAMES["python"]
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    if config.platform != "ensemble":
        fill_instance_groups(config)
        if not config.HasField("optimization"):
            config.optimization.input_pinned_memory.enable = True
            config.optimization.output_pinned_memory.enable = True
    fill_batching(config)
