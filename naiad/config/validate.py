"""Validation with Triton's messages (model_config_utils.cc); every error names the model and the field."""

from __future__ import annotations

from naiad.config import ModelConfig, pb
from naiad.config.normalize import DEFAULT_FILENAMES
from naiad.config.scheduling import validate_batching, validate_instance_groups
from naiad.core.datatypes import WILDCARD, fixed_size, wildcard_count
from naiad.core.errors import InferError, invalid

KNOWN_BACKENDS = set(DEFAULT_FILENAMES) | {"ensemble", "identity"}  # identity: Triton's test backend, no file
KNOWN_PLATFORMS = {
    "onnxruntime_onnx",
    "pytorch_libtorch",
    "tensorrt_plan",
    "tensorflow_savedmodel",
    "tensorflow_graphdef",
    "ensemble",
}


def validate_identity(config: ModelConfig, folder_name: str) -> None:
    """What Triton checks while polling the repository; a model failing here is not served under any version."""
    if config.name != folder_name:
        raise invalid(
            f"unexpected directory name '{folder_name}' for model '{config.name}', directory name must equal model name"
        )
    if config.max_batch_size < 0:
        raise invalid(f"'max_batch_size' must be non-negative value for {config.name}")


def validate(config: ModelConfig, folder_name: str, python_based: bool = False) -> None:
    """``python_based``: the backend is a Python-based one from --backend-directory (the caller looked)."""
    validate_identity(config, folder_name)
    if not config.platform and not config.backend:
        raise invalid(f"must specify 'platform' or 'backend' for '{config.name}'")
    if config.backend and config.backend not in KNOWN_BACKENDS and not python_based:
        raise invalid(
            f"unable to find backend library for backend '{config.backend}', try specifying runtime on the model "
            "configuration."
        )
    if config.platform and config.platform not in KNOWN_PLATFORMS:
        raise invalid(f"unexpected platform type '{config.platform}' for {config.name}")
    if not config.HasField("version_policy"):
        raise invalid(f"must specify 'version policy' for {config.name}")
    for io in config.input:
        _validate_io(io, config, "model input ")
    for io in config.output:
        _validate_io(io, config, "model output ")
    _validate_unique(config)
    validate_batching(config)
    if config.platform != "ensemble":
        validate_instance_groups(config)


def _validate_io(io: pb.ModelInput | pb.ModelOutput, config: ModelConfig, prefix: str) -> None:
    try:
        _check_io(io, config, prefix)
    except InferError as exc:
        # Triton names the model at the end of every tensor error.
        raise invalid(f"{exc.message} for {config.name}") from None


def _check_io(io: pb.ModelInput | pb.ModelOutput, config: ModelConfig, prefix: str) -> None:
    if not io.name:
        raise invalid(f"{prefix}must specify 'name'")
    named = f"{prefix}'{io.name}' "
    if io.data_type == pb.TYPE_INVALID:
        raise invalid(named + "must specify 'data_type'")
    if not io.dims and not io.HasField("reshape") and config.max_batch_size == 0:
        raise invalid(named + "must specify 'dims'")
    for dim in io.dims:
        if dim < 1 and dim != WILDCARD:
            raise invalid(named + f"dimension must be integer >= 1, or {WILDCARD} to indicate a variable-size dimension")
    if io.HasField("reshape"):
        for dim in io.reshape.shape:
            if dim < 1 and dim != WILDCARD:
                raise invalid(
                    named + f"reshape dimensions must be integer >= 1, or {WILDCARD} to indicate a variable-size dimension"
                )
        if not io.reshape.shape and config.max_batch_size == 0:
            raise invalid("cannot have empty reshape for non-batching model as scalar tensors are not supported")
        if fixed_size(io.dims) != fixed_size(io.reshape.shape) or (
            wildcard_count(io.dims) != wildcard_count(io.reshape.shape)
        ):
            raise invalid(named + "has different size for dims and reshape")


def _validate_unique(config: ModelConfig) -> None:
    for kind, items in (("input", config.input), ("output", config.output)):
        seen: set[str] = set()
        for io in items:
            if io.name in seen:
                raise invalid(f"model {kind} '{io.name}' can only be specified once in model '{config.name}'")
            seen.add(io.name)
