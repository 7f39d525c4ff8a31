"""This host's GPUs as NVML reports them: per CUDA device index its identity, memory, utilization, power and
energy, and the memory each process holds on it. The GPU metrics, ``--model-load-gpu-limit``, the model cache's
device accounting and the dashboard read them here.

NVML (``nvidia-ml-py``) is imported only when first asked for, and a host where it is missing, where the driver
will not initialize or where it lists no device simply has no GPUs: ``devices()`` is None. Indexes are CUDA's:
with ``CUDA_VISIBLE_DEVICES`` set, index i is the i-th device it names (NVML itself numbers every device).

Testing aid: ``NAIAD_SIMULATED_GPUS=<file.json>`` reads the devices from that file instead, for CPU CI (``Simulated``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("naiad.devices")

SIMULATED_ENV = "NAIAD_SIMULATED_GPUS"

# What an allocation failure says: PyTorch ("CUDA out of memory", torch.OutOfMemoryError), the CUDA driver and
# runtime (CUDA_ERROR_OUT_OF_MEMORY, cudaErrorMemoryAllocation, "cudaMalloc failed: out of memory"), onnxruntime's
# arena ("Failed to allocate memory for requested buffer") and TensorRT ("Error Code 2: OutOfMemory", "Requested
# amount of GPU memory ... could not be allocated").
_OUT_OF_MEMORY = re.compile(r"out of memory|out_?of_?memory|failed to allocate memory|cudaErrorMemoryAllocation"
                            r"|memory .{0,40}could not be allocated", re.IGNORECASE)


def out_of_memory(message: str) -> bool:
    """Whether an error's text is a device (or host) allocation failure."""
    return _OUT_OF_MEMORY.search(message) is not None


@dataclass(frozen=True)
class Reading:
    """One device at one moment. A figure the device does not report is None."""

    index: int
    uuid: str
    name: str
    memory_total: int  # bytes
    memory_used: int  # bytes
    utilization: float | None = None  # busy share of the last sample period, 0.0 - 1.0
    power_usage: float | None = None  # watts
    power_limit: float | None = None  # watts (the power management limit)
    energy: float | None = None  # joules since the driver loaded


class Devices:
    """A source of readings: NVML, or a simulated one."""

    def count(self) -> int:
        raise NotImplementedError

    def reading(self, index: int) -> Reading:
        raise NotImplementedError

    def memory(self, index: int) -> tuple[int, int]:
        """(used, total) bytes: the cheap read loads and evictions decide on."""
        reading = self.reading(index)
        return reading.memory_used, reading.memory_total

    def processes(self, index: int) -> dict[int, int] | None:
        """Device memory per process id, or None where the driver does not say (no permission, another pid
        namespace, MIG)."""
        return None

    def readings(self) -> list[Reading]:
        return [self.reading(i) for i in range(self.count())]


class Nvml(Devices):
    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self.nvml = nvml
        self.handles = handles

    @classmethod
    def open(cls) -> Nvml | None:
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            handles = _cuda_visible(pynvml, handles)
        except Exception as exc:  # NVMLError, or a library that does not load: a host without a usable GPU
            log.debug("NVML is not available: %s", exc)
            return None
        return cls(pynvml, handles) if handles else None

    def count(self) -> int:
        return len(self.handles)

    def _get(self, call: str, handle: Any) -> Any:
        try:
            return getattr(self.nvml, call)(handle)
        except Exception:  # NVMLError_NotSupported and friends: this figure is missing, not the device
            return None

    def reading(self, index: int) -> Reading:
        handle = self.handles[index]
        used, total = self.memory(index)
        utilization = self._get("nvmlDeviceGetUtilizationRates", handle)
        power = self._get("nvmlDeviceGetPowerUsage", handle)  # milliwatts
        limit = self._get("nvmlDeviceGetPowerManagementLimit", handle)
        energy = self._get("nvmlDeviceGetTotalEnergyConsumption", handle)  # millijoules
        return Reading(index, _text(self._get("nvmlDeviceGetUUID", handle)),
                       _text(self._get("nvmlDeviceGetName", handle)), total, used,
                       None if utilization is None else utilization.gpu / 100.0,
                       None if power is None else power / 1000.0, None if limit is None else limit / 1000.0,
                       None if energy is None else energy / 1000.0)

    def memory(self, index: int) -> tuple[int, int]:
        info = self._get("nvmlDeviceGetMemoryInfo", self.handles[index])
        return (0, 0) if info is None else (int(info.used), int(info.total))

    def processes(self, index: int) -> dict[int, int] | None:
        running = self._get("nvmlDeviceGetComputeRunningProcesses", self.handles[index])
        if running is None:
            return None
        # usedGpuMemory is None where the driver withholds it (Windows WDDM, some containers).
        return {int(p.pid): int(p.usedGpuMemory) for p in running if p.usedGpuMemory is not None}


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


def _cuda_visible(nvml: Any, handles: list[Any]) -> list[Any]:
    """The devices CUDA numbers, in its order: CUDA_VISIBLE_DEVICES names them by index or UUID (a prefix)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return handles
    chosen: list[Any] = []
    uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in handles]
    for item in (v.strip() for v in visible.split(",")):
        if item.isdigit() and int(item) < len(handles):
            chosen.append(handles[int(item)])
        else:
            match = [h for h, u in zip(handles, uuids) if item and u.startswith(item if item.startswith("GPU-")
                                                                                  else "GPU-" + item)]
            if len(match) != 1:
                break  # CUDA stops at the first entry it cannot resolve (MIG-..., a typo)
            chosen.append(match[0])
    return chosen


class Simulated(Devices):
    """Devices read from a JSON file that tests rewrite while the server runs: a list with one object per device,
    ``{"uuid", "name", "memory_total", "memory_used", "utilization", "power_usage", "power_limit", "energy",
    "processes": {"<pid>": bytes}}``. A device's used memory is ``memory_used`` plus what its live processes hold,
    so memory a model's worker allocated is given back when the process exits, as a driver does."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _devices(self) -> list[dict[str, Any]]:
        try:
            devices = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return []  # being rewritten, or gone: no devices for this read
        return devices if isinstance(devices, list) else []

    def count(self) -> int:
        return len(self._devices())

    def _device(self, index: int) -> dict[str, Any]:
        devices = self._devices()
        return devices[index] if index < len(devices) else {}

    def reading(self, index: int) -> Reading:
        device = self._device(index)
        used, total = self._memory(device)

        def number(key: str) -> float | None:
            value = device.get(key)
            return None if value is None else float(value)

        return Reading(index, str(device.get("uuid", f"GPU-simulated-{index}")), str(device.get("name", "simulated")),
                       total, used, number("utilization"), number("power_usage"), number("power_limit"),
                       number("energy"))

    def memory(self, index: int) -> tuple[int, int]:
        return self._memory(self._device(index))

    def _memory(self, device: dict[str, Any]) -> tuple[int, int]:
        held = sum(self._live(device).values())
        return int(device.get("memory_used", 0)) + held, int(device.get("memory_total", 0))

    def processes(self, index: int) -> dict[int, int] | None:
        return self._live(self._device(index))

    @staticmethod
    def _live(device: dict[str, Any]) -> dict[int, int]:
        held = {}
        for pid, size in (device.get("processes") or {}).items():
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                continue
            except (PermissionError, ValueError):
                pass
            held[int(pid)] = int(size)
        return held


_lock = threading.Lock()
_opened = False
_devices: Devices | None = None


def devices() -> Devices | None:
    """This host's GPUs, opened once; None where there are none (or NVML cannot say)."""
    global _opened, _devices
    with _lock:
        if not _opened:
            simulated = os.environ.get(SIMULATED_ENV)
            _devices = Simulated(Path(simulated)) if simulated else Nvml.open()
            _opened = True
        return _devices
