"""Simulated GPUs for CPU CI (``NAIAD_SIMULATED_GPUS``, read by ``naiad.core.devices.Simulated``), and a
Python-backend model that holds device memory on one as a framework would: its worker allocates in
``initialize()`` (failing with CUDA's words when the device is full), and the memory goes when the worker exits.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from naiad.core.devices import Simulated

ENV = "NAIAD_SIMULATED_GPUS"


@contextmanager
def _locked(path: Path) -> Iterator[list[dict[str, Any]]]:
    """The device list, read and written back under a lock (workers and the test write it); written whole by a
    rename, so the server never reads half a file."""
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        devices = json.loads(path.read_text()) if path.exists() else []
        yield devices
        scratch = path.with_name(f"{path.name}.{os.getpid()}")
        scratch.write_text(json.dumps(devices))
        os.replace(scratch, path)


def write(path: Path, devices: list[dict[str, Any]]) -> None:
    with _locked(path) as current:
        current[:] = devices


def update(path: Path, index: int, **figures: Any) -> None:
    with _locked(path) as devices:
        devices[index].update(figures)


def allocate(path: Path, index: int, size: int) -> None:
    """This process takes ``size`` bytes of device ``index``; CUDA's error when they are not free."""
    with _locked(path) as devices:
        used, total = Simulated(path).memory(index)
        if used + size > total:
            raise RuntimeError(f"CUDA out of memory. Tried to allocate {size} bytes (GPU {index}; {total} bytes "
                               f"total capacity; {total - used} bytes free)")
        held = devices[index].setdefault("processes", {})
        held[str(os.getpid())] = held.get(str(os.getpid()), 0) + size


def used(path: Path, index: int = 0) -> int:
    return Simulated(path).memory(index)[0]


def gpu_config(name: str, device_bytes: int, execute_bytes: int = 0, gpu: int = 0) -> str:
    return f"""
    name: "{name}"
    backend: "python"
    input [{{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }}]
    output [{{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }}]
    instance_group [{{ kind: KIND_GPU, count: 1, gpus: [ {gpu} ] }}]
    parameters [{{ key: "DEVICE_BYTES", value: {{ string_value: "{device_bytes}" }} }},
                {{ key: "EXECUTE_BYTES", value: {{ string_value: "{execute_bytes}" }} }}]
"""


# Holds DEVICE_BYTES on its GPU while loaded; each execution needs EXECUTE_BYTES more, free at that moment.
GPU_MODEL_PY = """
    import json
    import os
    from pathlib import Path

    import triton_python_backend_utils as pb_utils
    from tests.simulated_gpus import ENV, allocate, used
    from naiad.core.devices import Simulated

    class TritonPythonModel:
        def initialize(self, args):
            parameters = json.loads(args["model_config"])["parameters"]
            self.path = Path(os.environ[ENV])
            self.device = int(args["model_instance_device_id"])
            self.execute_bytes = int(parameters["EXECUTE_BYTES"]["string_value"])
            allocate(self.path, self.device, int(parameters["DEVICE_BYTES"]["string_value"]))

        def execute(self, requests):
            if self.execute_bytes:
                in_use, total = Simulated(self.path).memory(self.device)
                if in_use + self.execute_bytes > total:
                    raise pb_utils.TritonModelException(
                        f"CUDA out of memory. Tried to allocate {self.execute_bytes} bytes")
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                    for r in requests]
"""
