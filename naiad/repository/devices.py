"""What loaded models hold on the GPUs, and ``--model-load-gpu-limit``.

The limit has Triton's meaning: a load onto a device whose used memory is above the fraction is refused. Triton
checks each GPU instance after creating it (so that a load cannot take the memory the limit keeps free); naiad
checks before a version loads, which spares a load that would be refused, and again after, in Triton's words.

A model's device memory is measured, not declared: per device, what its own processes hold there where the
driver reports memory per process (a Python model's workers; instances that run in processes of their own), else
how much the device's used memory grew while it loaded (instances inside the server, whose process the models
share), split among the loads that ran beside it.
"""

from __future__ import annotations

from naiad.config import ModelConfig
from naiad.config.scheduling import gpu_instances
from naiad.core.devices import Devices, devices
from naiad.core.errors import unavailable


def parse_gpu_limits(values: list[str]) -> dict[int, float]:
    """``--model-load-gpu-limit <device_id>:<fraction>`` (repeatable); ``ValueError`` in Triton's words."""
    limits: dict[int, float] = {}
    for value in values:
        device, sep, fraction = value.partition(":")
        if not sep:
            raise ValueError("Cannot parse pair option due to incorrect number of inputs.--<pair option> argument "
                             f"requires format <first>:<second>. Found: {value}")
        try:
            index, share = int(device), float(fraction)
        except ValueError:
            raise ValueError(f"invalid --model-load-gpu-limit '{value}': expected <device_id>:<fraction>") from None
        if index < 0:
            raise ValueError(f"expects device ID >= 0, got {index}")
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"expects limit fraction to be in range [0.0, 1.0], got {share:f}")
        limits[index] = share
    return limits


def check_gpu_limit(config: ModelConfig, limits: dict[int, float]) -> None:
    """Refuse (UNAVAILABLE, Triton's text) when a GPU the config's instances use has more memory in use than its
    limit allows. Reads the devices only when a limit is set."""
    if not limits:
        return
    on = {gpu: name for gpu, name in gpu_instances(config).items() if gpu in limits}
    source = devices() if on else None
    if source is None:
        return
    for gpu, instance in sorted(on.items()):
        if gpu >= source.count():
            continue
        used, total = source.memory(gpu)
        if used > total * limits[gpu]:
            raise unavailable(f"can not create model '{instance}': memory limit set for GPU {gpu} has exceeded, "
                              "model loading is rejected.")


def capacity(source: Devices, gpu: int, limits: dict[int, float]) -> int:
    """The bytes loads may fill the device up to: its limit's share, else all of it."""
    _, total = source.memory(gpu)
    return int(total * limits.get(gpu, 1.0))


def used_memory(gpus: set[int] | frozenset[int]) -> dict[int, int]:
    """Each device's used memory now (devices that do not exist are left out)."""
    source = devices()
    if source is None:
        return {}
    count = source.count()
    return {gpu: source.memory(gpu)[0] for gpu in gpus if gpu < count}


def processes(gpus: set[int] | frozenset[int]) -> dict[int, dict[int, int] | None]:
    """Each device's memory per process (None for a device whose driver does not say), read once for
    ``held_by`` calls that share it."""
    source = devices()
    if source is None:
        return {}
    count = source.count()
    return {gpu: source.processes(gpu) for gpu in gpus if gpu < count}


def held_by(pids: list[int], gpus: set[int] | frozenset[int],
            snapshot: dict[int, dict[int, int] | None] | None = None) -> dict[int, int] | None:
    """What ``pids`` hold on each of ``gpus`` (per ``snapshot``, else read now), or None where the driver does not
    report memory per process (or none of the pids shows up on any of them: their memory is the server's, or
    not reported)."""
    if not pids:
        return None
    if snapshot is None:
        snapshot = processes(gpus)
    wanted = set(pids)
    held: dict[int, int] = {}
    seen = False
    for gpu in gpus:
        if gpu not in snapshot:
            continue  # no such device
        on_device = snapshot[gpu]
        if on_device is None:
            return None
        mine = [size for pid, size in on_device.items() if pid in wanted]
        seen = seen or bool(mine)
        held[gpu] = sum(mine)
    return held if seen else None
