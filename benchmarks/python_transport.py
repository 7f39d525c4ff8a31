"""Round-trip cost of the python backend's worker transport, without HTTP: the server side hands an
identity model one request with a tensor of 16 B, 1 MB and 64 MB and waits for the response, in a loop.

    flock /tmp/naiad-bench.lock taskset -c 1 python benchmarks/python_transport.py

Reports µs per round trip for the worker process (shared memory) and for the in-process instance
(no transport at all), so the difference is the transport's own overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from naiad.backends.base import Execution, VersionContext  # noqa: E402
from naiad.backends.python.backend import PythonBackend  # noqa: E402
from naiad.config.loader import load_config  # noqa: E402
from naiad.config.normalize import fill_defaults  # noqa: E402
from naiad.config.render import config_to_dict  # noqa: E402
from naiad.core.request import InferRequest  # noqa: E402

CONFIG = """
name: "identity"
backend: "python"
input [{ name: "INPUT0", data_type: TYPE_UINT8, dims: [ -1 ] }]
output [{ name: "OUTPUT0", data_type: TYPE_UINT8, dims: [ -1 ] }]
instance_group [{ kind: KIND_CPU, count: 1 }]
"""
MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                for r in requests]
"""


def _load(repo: Path, options: dict[str, str]):
    folder = repo / "identity"
    config, _ = load_config(folder, "")
    fill_defaults(config, "identity")
    ctx = VersionContext("identity", 1, config, json.dumps(config_to_dict(config)), folder, folder / "1", options)
    return PythonBackend().load(ctx)


async def _round_trips(instance, size: int, seconds: float) -> float:
    data = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    count, started = 0, time.perf_counter()
    while True:
        request = InferRequest("identity", inputs={"INPUT0": data})
        result = instance.execute([request])
        execution = result if isinstance(result, Execution) else await result
        out = execution.responses[0].outputs["OUTPUT0"]
        assert out.nbytes == size
        del out, execution
        count += 1
        elapsed = time.perf_counter() - started
        if elapsed >= seconds and count >= 5:
            return elapsed / count * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    sizes = [("16 B", 16), ("1 MB", 1 << 20), ("64 MB", 64 << 20)]
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        (repo / "identity" / "1").mkdir(parents=True)
        (repo / "identity" / "config.pbtxt").write_text(textwrap.dedent(CONFIG))
        (repo / "identity" / "1" / "model.py").write_text(textwrap.dedent(MODEL))
        results = {}
        for mode, options in (("worker", {}), ("in-process", {"in-process": "true"})):
            loaded = _load(repo, options)
            try:
                instance = loaded.instances[0]
                for label, size in sizes:
                    await _round_trips(instance, size, 0.3)  # warm up (arena growth, page faults)
                    results[(mode, label)] = await _round_trips(instance, size, args.seconds)
            finally:
                loaded.unload()
    print(f"{'tensor':>8} {'worker µs':>12} {'in-process µs':>14} {'transport µs':>13}")
    for label, _ in sizes:
        worker, local = results[("worker", label)], results[("in-process", label)]
        print(f"{label:>8} {worker:12.1f} {local:14.1f} {worker - local:13.1f}")


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
