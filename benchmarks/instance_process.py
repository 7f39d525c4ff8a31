#!/usr/bin/env python3
"""What running a framework instance in its own process costs: a small onnxruntime model (add_sub, FP32 [16], no
batching) served with its instance on a thread in the server (the KIND_CPU default) and in a worker process
(``--backend-config=onnxruntime,instance-process=true``, the KIND_GPU default), driven by ``naiad bench`` over HTTP
at one connection and at eight. CPU time per request is the server's plus its workers' (read from the operating
system; requests counted by the server's statistics), so a busy machine moves it little; rounds alternate the two
modes, and the table gives each one's median. For reference, the same sum and difference as a Python-backend
model.py (whose worker channel the instance process uses): what is left of the difference is the channel's.

    flock /tmp/naiad-bench.lock python benchmarks/instance_process.py [--seconds 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import onnx_graphs  # noqa: E402
from tests.models import write_model  # noqa: E402
from tests.server import free_port  # noqa: E402

from http_add_sub import wait_ready  # noqa: E402 - a sibling script (this folder is not a package)

CONFIG = """
    name: "add_sub"
    platform: "onnxruntime_onnx"
    max_batch_size: 0
    input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 16 ] },
           { name: "INPUT1", data_type: TYPE_FP32, dims: [ 16 ] }]
    output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 16 ] },
            { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 16 ] }]
    instance_group [{ kind: KIND_CPU, count: 1 }]
    parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
"""
PYTHON_ADD_SUB = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                a = r.get_input_tensor_by_name("INPUT0").as_numpy()
                b = r.get_input_tensor_by_name("INPUT1").as_numpy()
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b),
                                                       pb_utils.Tensor("OUTPUT1", a - b)]))
            return out
"""
MODES = ("thread", "process", "model.py")
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _cpu(proc: psutil.Process) -> float:
    try:
        times = proc.cpu_times()
        return times.user + times.system
    except psutil.NoSuchProcess:
        return 0.0


def _success(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/add_sub/stats") as response:
        return json.load(response)["model_stats"][0]["inference_stats"]["success"]["count"]


def measure(repo: Path, mode: str, concurrency: int, seconds: float) -> tuple[float, float]:
    """(requests/s, server + worker CPU µs per request)."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "naiad", "serve", "--model-repository", str(repo / mode), "--http-port", str(port),
         "--http-address", "127.0.0.1", "--grpc-port", str(free_port()), "--allow-metrics=false",
         f"--backend-config=onnxruntime,instance-process={'true' if mode == 'process' else 'false'}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    try:
        wait_ready(f"http://127.0.0.1:{port}", server, 60)
        host = psutil.Process(server.pid)
        processes = [host, *host.children()]
        bench = [sys.executable, "-m", "naiad", "bench", "-m", "add_sub", "-u", f"127.0.0.1:{port}", "-i", "http",
                 "--concurrency-range", str(concurrency), "--no-progress", "-p"]
        subprocess.run([*bench, "500"], capture_output=True, env=ENV)  # warm-up
        before = (_success(port), time.monotonic(), sum(map(_cpu, processes)))
        subprocess.run([*bench, str(int(seconds * 1000))], capture_output=True, env=ENV)
        after = (_success(port), time.monotonic(), sum(map(_cpu, processes)))
        requests = max(after[0] - before[0] - 1, 1)  # (the stats request itself is not an inference)
        return requests / (after[1] - before[1]), (after[2] - before[2]) * 1e6 / requests
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        repo = Path(folder)
        for mode in ("thread", "process"):
            onnx_graphs.write(repo / mode, "add_sub", onnx_graphs.add_sub("TYPE_FP32", [16], batch=False), CONFIG)
        python_config = CONFIG.replace('platform: "onnxruntime_onnx"', 'backend: "python"').replace(
            'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }', "")
        write_model(repo / "model.py", "add_sub", python_config, PYTHON_ADD_SUB)
        print(f"{'connections':>11} {'instance':>9} {'req/s':>8} {'CPU µs/req':>11}")
        for concurrency in (1, 8):
            rows: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
            for _ in range(args.rounds):
                for mode in MODES:
                    rows[mode].append(measure(repo, mode, concurrency, args.seconds))
            for mode in MODES:
                rps = statistics.median(r[0] for r in rows[mode])
                cpu = statistics.median(r[1] for r in rows[mode])
                print(f"{concurrency:>11} {mode:>9} {rps:>8,.0f} {cpu:>11.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
