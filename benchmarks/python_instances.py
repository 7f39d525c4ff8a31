"""A CPU-bound Python model (a pure-Python loop holding the GIL ~20 ms per request) served with
``instance_group { count: 1 }`` and ``count: 2``: with a process per instance, two instances use two cores.

    flock /tmp/naiad-bench.lock python benchmarks/python_instances.py

The server runs unpinned on both cores (that is the point); the load is 4 concurrent clients for
``--seconds`` each. Reports requests/s for each count and the ratio.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.server import RunningServer  # noqa: E402

MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            n = int(r.inputs()[0].as_numpy()[0])
            total = 0
            for i in range(n):  # pure Python: holds the GIL, so only processes run it in parallel
                total += i * i % 7
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([total], np.int64))]))
        return out
"""
CONFIG = """
name: "spin"
backend: "python"
input [{{ name: "N", data_type: TYPE_INT64, dims: [ 1 ] }}]
output [{{ name: "OUT", data_type: TYPE_INT64, dims: [ 1 ] }}]
instance_group [{{ kind: KIND_CPU, count: {count} }}]
"""


def run(count: int, seconds: float, clients: int, n: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "spin"
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(textwrap.dedent(CONFIG.format(count=count)))
        (folder / "1" / "model.py").write_text(textwrap.dedent(MODEL))
        server = RunningServer([Path(tmp)], "--backend-config=python,pipeline-depth=1")
        try:
            def loop(_: int) -> int:
                done = 0
                with httpclient.InferenceServerClient(server.url) as c:
                    tensor = httpclient.InferInput("N", [1], "INT64")
                    tensor.set_data_from_numpy(np.array([n], np.int64))
                    deadline = time.monotonic() + seconds
                    while time.monotonic() < deadline:
                        c.infer("spin", [tensor])
                        done += 1
                return done
            started = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(clients) as pool:
                total = sum(pool.map(loop, range(clients)))
            return total / (time.monotonic() - started)
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--n", type=int, default=300_000, help="loop iterations per request")
    args = parser.parse_args()
    one = run(1, args.seconds, args.clients, args.n)
    two = run(2, args.seconds, args.clients, args.n)
    print(f"count: 1  {one:8.1f} req/s")
    print(f"count: 2  {two:8.1f} req/s  ({two / one:.2f}x)")


if __name__ == "__main__":
    main()
