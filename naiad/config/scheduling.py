"""Scheduling settings of a config: Triton's defaults and checks (model_config_utils.cc) for instance groups,
``dynamic_batching`` and ``sequence_batching``, in Triton's words.

GPUs are the ones the NVIDIA driver lists (``gpu_ids``); on a host without any, KIND_GPU is answered as a Triton
build with GPU support does there: the load fails, naming the group.
"""

from __future__ import annotations

import os
from functools import lru_cache

from naiad.config import ModelConfig, pb
from naiad.config.sequence import sequence_spec
from naiad.core.devices import SIMULATED_ENV, devices
from naiad.core.errors import internal, invalid

Group = pb.ModelInstanceGroup
SEQUENCE_IDLE_DEFAULT_MICROSECONDS = 1_000_000
MIN_COMPUTE_CAPABILITY = 6.0
# Backends that opt into Triton's default of two CPU instances (SetDefaultInstanceCount); the others get one,
# since (Triton's note) pytorch and others gain little from more.
_TWO_CPU_INSTANCES = {"onnxruntime", "tensorflow"}
_DEFAULT_CPU_INSTANCE_COUNT = 2


@lru_cache(maxsize=1)
def gpu_ids() -> frozenset[int]:
    """The device ids naiad can place instances on, numbered as CUDA numbers them: NVML's devices (following
    CUDA_VISIBLE_DEVICES), or the NVIDIA driver's folder per GPU where NVML can't answer. NAIAD_GPUS ("0,1", or ""
    for none) overrides both, e.g. to keep a server off the GPUs; simulated devices (a testing aid,
    ``naiad.core.devices``) stand in for NVML's."""
    override = os.environ.get("NAIAD_GPUS")
    if override is not None:
        return frozenset(int(g) for g in override.split(",") if g.strip())
    found = devices()
    if found is not None:
        return frozenset(range(found.count()))
    if os.environ.get(SIMULATED_ENV):
        return frozenset()
    try:
        return frozenset(range(len(os.listdir("/proc/driver/nvidia/gpus"))))
    except OSError:
        return frozenset()


def fill_instance_groups(config: ModelConfig) -> None:
    if not config.instance_group:
        # A group Triton adds itself is named after the model; unnamed given groups get an index.
        config.instance_group.add(name=config.name)
    gpus = gpu_ids()
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.kind == Group.KIND_AUTO:
            # KIND_AUTO is a GPU group only when every GPU it names exists (and there is one at all).
            usable = gpus and all(g in gpus for g in group.gpus)
            group.kind = Group.KIND_GPU if usable else Group.KIND_CPU
        if group.count < 1:
            two = group.kind == Group.KIND_CPU and config.backend in _TWO_CPU_INSTANCES
            group.count = _DEFAULT_CPU_INSTANCE_COUNT if two else 1
        if group.kind == Group.KIND_GPU and not group.gpus:
            group.gpus.extend(sorted(gpus))


def gpu_instances(config: ModelConfig) -> dict[int, str]:
    """The GPUs a filled config's instances run on, each with the name of its first instance there (Triton's
    ``<group>_<n>``, as its load refusals name it)."""
    found: dict[int, str] = {}
    for group in config.instance_group:
        if group.kind == Group.KIND_GPU and group.count > 0:
            for gpu in group.gpus:
                found.setdefault(gpu, f"{group.name}_0")
    return found


def fill_batching(config: ModelConfig) -> None:
    if config.HasField("dynamic_batching"):
        batching = config.dynamic_batching
        if not batching.preferred_batch_size and config.max_batch_size > 0:
            batching.preferred_batch_size.append(config.max_batch_size)
    if config.HasField("sequence_batching"):
        batching = config.sequence_batching
        if batching.max_sequence_idle_microseconds == 0:
            batching.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_MICROSECONDS
        if batching.HasField("oldest") and not batching.oldest.preferred_batch_size and config.max_batch_size > 0:
            batching.oldest.preferred_batch_size.append(config.max_batch_size)


def validate_batching(config: ModelConfig) -> None:
    if config.HasField("dynamic_batching"):
        _validate_dynamic_batching(config)
    if config.HasField("sequence_batching"):
        sequence_spec(config)  # raises Triton's messages for controls, states and strategy settings


def _validate_dynamic_batching(config: ModelConfig) -> None:
    name = config.name
    batching = config.dynamic_batching
    for size in batching.preferred_batch_size:
        if size < 1:
            raise invalid(f"dynamic batching preferred size must be positive for {name}")
        if size > config.max_batch_size:
            raise invalid(f"dynamic batching preferred size must be <= max batch size for {name}")
    levels = batching.priority_levels
    if levels:
        if not 1 <= batching.default_priority_level <= levels:
            raise invalid(f"default priority level must be in range [1, {levels}] for {name}")
        for level in batching.priority_queue_policy:
            if not 1 <= level <= levels:
                raise invalid(f"priority queue policy must have priority level in range [1, {levels}] for {name}")
    if batching.preserve_ordering:
        if levels > 1:
            raise invalid(f"Only one priority level is allowed when 'preserve_ordering' is true for {name}")
        policies = [batching.default_queue_policy, *batching.priority_queue_policy.values()]
        for policy in policies:
            if policy.default_timeout_microseconds and policy.timeout_action == pb.ModelQueuePolicy.DELAY:
                raise invalid(f"Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true "
                              f"for {name}")


def validate_instance_groups(config: ModelConfig) -> None:
    name = config.name
    gpus = gpu_ids()
    if not config.instance_group:
        raise invalid(f"must specify one or more 'instance group's for {name}")
    for group in config.instance_group:
        where = f"instance group {group.name} of model {name}"
        if group.count < 1:
            raise invalid(f"{where} must have count >= 1")
        if group.kind == Group.KIND_MODEL:
            if group.gpus:
                raise invalid(f"{where} has kind KIND_MODEL but specifies one or more GPUs")
        elif group.kind == Group.KIND_GPU:
            if not group.gpus:
                if not gpus:
                    raise invalid(f"{where} has kind KIND_GPU but no GPUs are available")
                raise invalid(f"{where} has kind KIND_GPU but specifies no GPUs")
            for gpu in group.gpus:
                if gpu not in gpus:
                    raise invalid(
                        f"{where} specifies invalid or unsupported gpu id {gpu}. GPUs with at least the minimum "
                        f"required CUDA compute compatibility of {MIN_COMPUTE_CAPABILITY:.6f} are: "
                        + ", ".join(str(g) for g in sorted(gpus))
                    )
        elif group.kind == Group.KIND_CPU:
            if group.gpus:
                raise invalid(f"{where} has kind KIND_CPU but specifies one or more GPUs")
        else:
            raise internal(f"{where} has unexpected kind KIND_AUTO")
