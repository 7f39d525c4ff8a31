"""The simulated accelerator: Triton's ``identity`` backend with ``execute_delay_ms``, each execution taking that
long whatever its batch size, and a tritonclient load that keeps it fed. Shared by
tests/scheduling/test_overlap.py and benchmarks/simulated_accelerator.py. The same model as a Python-backend
``model.py`` (``backend="python"``: it sleeps once per execute, in its worker process) measures that path.

Its bound is ``instances * max_batch_size / delay``: every execution full, and the next one starting the moment
the previous one ends.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np

WIDTH = 16  # FP32 items per request row; small, so the wire costs little next to the delay


PYTHON_MODEL = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import json

        config = json.loads(args["model_config"])
        self.delay = int(config["parameters"]["execute_delay_ms"]["string_value"]) / 1000

    def execute(self, requests):
        time.sleep(self.delay)  # once per execution, whatever its size
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                for r in requests]
"""


def write_simulated(repo: Path, name: str, max_batch_size: int, instances: int, delay_ms: int,
                    queue_delay_us: int = 0, backend: str = "identity") -> Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    if backend == "python":
        (folder / "1" / "model.py").write_text(PYTHON_MODEL)
    batcher = f"dynamic_batching {{ max_queue_delay_microseconds: {queue_delay_us} }}"
    (folder / "config.pbtxt").write_text(f"""
name: "{name}"
backend: "{backend}"
max_batch_size: {max_batch_size}
{batcher}
instance_group [{{ count: {instances}, kind: KIND_CPU }}]
input [{{ name: "INPUT0", data_type: TYPE_FP32, dims: [ {WIDTH} ] }}]
output [{{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ {WIDTH} ] }}]
parameters {{ key: "execute_delay_ms" value {{ string_value: "{delay_ms}" }} }}
""")
    return folder


def bound(max_batch_size: int, instances: int, delay_ms: float) -> float:
    """Items per second if every execution were full and back to back."""
    return instances * max_batch_size * 1000.0 / delay_ms


async def _drive_grpc(url: str, model: str, concurrency: int, warmup: float, seconds: float) -> tuple[int, int]:
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(url)
    data = np.arange(WIDTH, dtype=np.float32).reshape(1, WIDTH)
    window = [0.0, 0.0]
    counted = [0, 0]  # completed inside the window, wrong answers anywhere

    async def worker() -> None:
        inp = grpcclient.InferInput("INPUT0", [1, WIDTH], "FP32")
        inp.set_data_from_numpy(data)
        while True:
            now = time.monotonic()
            if now >= window[1]:
                return
            result = await client.infer(model, [inp])
            done = time.monotonic()
            if not np.array_equal(result.as_numpy("OUTPUT0"), data):
                counted[1] += 1
            elif window[0] <= done < window[1]:
                counted[0] += 1

    start = time.monotonic()
    window[0], window[1] = start + warmup, start + warmup + seconds
    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await client.close()
    return counted[0], counted[1]


def throughput(url: str, model: str, concurrency: int, seconds: float = 3.0, warmup: float = 1.0) -> float:
    """Items per second answered correctly over ``seconds`` (after ``warmup``), one item per request, with
    ``concurrency`` requests in flight over gRPC (tritonclient's asyncio client)."""
    done, wrong = asyncio.run(_drive_grpc(url, model, concurrency, warmup, seconds))
    assert wrong == 0, f"{wrong} wrong answers from {model}"
    return done / seconds
