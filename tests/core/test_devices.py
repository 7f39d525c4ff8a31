"""The device layer: out-of-memory texts of the frameworks, NVML's units and CUDA's device order (against a stand-in
for the ``pynvml`` module: the bindings are a third party's, the conversions ours), and the simulated source."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from naiad.core.devices import Nvml, Simulated, out_of_memory
from tests import simulated_gpus


def test_out_of_memory_texts() -> None:
    for text in (
        "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.11 GiB total capacity)",
        "OutOfMemoryError: CUDA out of memory.",
        "CUDA driver error: CUDA_ERROR_OUT_OF_MEMORY",
        "cudaMalloc failed: out of memory",
        "CUDA error: cudaErrorMemoryAllocation",
        ("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while running Conv node. "
         "Failed to allocate memory for requested buffer of size 4194304"),
        "[TRT] [E] 2: [allocator.cpp::allocate::20] Error Code 2: OutOfMemory (no further information)",
        "Requested amount of GPU memory (1073741824 bytes) could not be allocated",
    ):
        assert out_of_memory(text), text
    for text in ("ValueError: bad weights file", "CUDA error: device-side assert triggered",
                 "an illegal memory access was encountered", "MemoryError"):
        assert not out_of_memory(text), text


class _NotSupported(Exception):
    pass


def _nvml(uuids: list[str]) -> Any:
    """What pynvml answers for ``uuids``: 40 GB used of 80, 35 % busy, 250.5 W of 700 W, 1.5 MJ; no process list."""
    def unsupported(handle: int) -> Any:
        raise _NotSupported("Not Supported")

    return SimpleNamespace(
        nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: len(uuids), nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=lambda h: uuids[h], nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=80 * 10**9, used=40 * 10**9 + h, free=0),
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=35, memory=10),
        nvmlDeviceGetPowerUsage=lambda h: 250_500, nvmlDeviceGetPowerManagementLimit=lambda h: 700_000,
        nvmlDeviceGetTotalEnergyConsumption=lambda h: 1_500_000_000,
        nvmlDeviceGetComputeRunningProcesses=unsupported)


def test_nvml_readings_in_triton_units_and_cuda_order(monkeypatch: pytest.MonkeyPatch) -> None:
    uuids = ["GPU-aaaa-0", "GPU-bbbb-1", "GPU-cccc-2"]
    monkeypatch.setitem(sys.modules, "pynvml", _nvml(uuids))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,GPU-aaaa")
    gpus = Nvml.open()
    assert gpus is not None and gpus.count() == 2
    first = gpus.reading(0)
    assert (first.uuid, first.name, first.memory_used) == ("GPU-cccc-2", "NVIDIA H100 80GB HBM3", 40 * 10**9 + 2)
    assert (first.utilization, first.power_usage, first.power_limit, first.energy) == (0.35, 250.5, 700.0, 1.5e6)
    assert gpus.reading(1).uuid == "GPU-aaaa-0"
    assert gpus.processes(0) is None  # not reported: callers fall back to the device's growth
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert Nvml.open() is None  # CUDA sees no device

    def failing() -> None:
        raise _NotSupported("Driver Not Loaded")

    monkeypatch.setitem(sys.modules, "pynvml", SimpleNamespace(nvmlInit=failing))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert Nvml.open() is None


def test_simulated_memory_is_given_back_when_its_process_exits(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    simulated_gpus.write(path, [{"uuid": "GPU-0", "memory_total": 1000, "memory_used": 100}])
    script = ("import sys, time; from pathlib import Path; from tests.simulated_gpus import allocate; "
              "allocate(Path(sys.argv[1]), 0, 300); print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", script, str(path)],
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        gpus = Simulated(path)
        assert gpus.memory(0) == (400, 1000)
        assert gpus.processes(0) == {holder.pid: 300}
        with pytest.raises(RuntimeError, match="CUDA out of memory. Tried to allocate 700 bytes"):
            simulated_gpus.allocate(path, 0, 700)
    finally:
        holder.kill()
        holder.wait()
    assert Simulated(path).memory(0) == (100, 1000)
